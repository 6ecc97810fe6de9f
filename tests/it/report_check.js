// Checks a rendered report or compare page from inside it (appended after the page's own script by
// tests/it/compare.rs and tools/bench/report_screenshots.sh): the answer first (the report's
// headline, the compare page's verdict, with every headline card above the fold), every SVG label
// inside its chart, each series of a chart in its own colour, no chart empty without saying "no
// data", no clipped text block, and hovering a timeline bar (whole run,
// then zoomed in) shows that request's TTFT. Leaves the hover shown for screenshots. Writes one
// line per finding into the hidden pre#retrace-check: "ok ..." or "FAIL ...".
(function () {
'use strict';
var out = [];
function ok(m) { out.push('ok ' + m); }
function bad(m) { out.push('FAIL ' + m); }
function name(el) { var c = el.closest('[id]'); return c ? '#' + c.id : el.tagName; }
function at(el, x, y, type, extra) {
  var b = el.getBoundingClientRect(), o = {bubbles: true, clientX: b.left + x, clientY: b.top + y};
  for (var k in extra || {}) o[k] = extra[k];
  el.dispatchEvent(new MouseEvent(type, o));
}

function inside(b, box) { return b.left >= box.left - 0.5 && b.right <= box.right + 0.5 && b.top >= box.top - 0.5 && b.bottom <= box.bottom + 0.5; }
function overlaps(b, box) { return b.left < box.right && b.right > box.left && b.top < box.bottom && b.bottom > box.top; }

// Every label inside its chart and outside its plot area (legends off the curves); no text block clipped.
function labelsInside() {
  var n = 0;
  document.querySelectorAll('svg.chart').forEach(function (svg) {
    var box = svg.getBoundingClientRect(), plot = svg.querySelector('.hover');
    svg.querySelectorAll('text').forEach(function (t) {
      var b = t.getBoundingClientRect();
      n++;
      if (b.width > 0 && !inside(b, box)) bad('label "' + t.textContent + '" of ' + name(svg) + ' overflows its chart');
      if (plot && overlaps(b, plot.getBoundingClientRect())) bad('label "' + t.textContent + '" of ' + name(svg) + ' lies on the plotted data');
    });
  });
  ok(n + ' chart labels checked');
  document.querySelectorAll('pre, .card, .sub, .note').forEach(function (e) {
    if (e.scrollWidth > e.clientWidth + 1) bad(name(e) + ' ' + e.tagName + ' is clipped: ' + e.scrollWidth + ' > ' + e.clientWidth + ' px');
  });
  if (document.documentElement.scrollWidth > window.innerWidth + 1) bad('the page scrolls sideways: ' + document.documentElement.scrollWidth + ' px');
}

// A chart shows data when a curve is drawn off its axes (not a line along the bottom or the left
// edge of the plot), a bar or box is drawn (legend swatches are 10 px), or its timeline canvas has
// rows; otherwise it must say "no data".
function noEmptyChart() {
  document.querySelectorAll('svg.chart').forEach(function (svg) {
    var cv = svg.parentNode.querySelector('canvas'), hv = svg.querySelector('.hover');
    var plot = (hv || svg).getBoundingClientRect();
    var drawn = (cv && +cv.getAttribute('data-rows') > 0) || Array.prototype.some.call(svg.querySelectorAll('path, rect'), function (e) {
      var b = e.getBoundingClientRect();
      if (e.tagName === 'rect') return !e.classList.contains('hover') && (b.width > 12 || b.height > 12);
      var onLeft = b.width < 2 && Math.abs(b.left - plot.left) < 1.5, onBottom = b.height < 2 && Math.abs(b.bottom - plot.bottom) < 1.5;
      return (b.width >= 2 || b.height >= 2) && !onLeft && !onBottom;
    });
    var said = Array.prototype.filter.call(svg.querySelectorAll('text'), function (t) { return t.textContent.indexOf('no data') === 0; })[0];
    if (said) ok(name(svg) + ' says "' + said.textContent + '"');
    else if (!drawn) bad(name(svg) + ' is empty without saying "no data"');
  });
  ok('empty charts say "no data"');
}

// Hovers row k of the timeline in its current view; true when the tooltip names it with its TTFT.
function hoverRow(svg, rows, k, what) {
  var g = JSON.parse(svg.getAttribute('data-geom')), id = g.ids[k];
  var r = rows.filter(function (r) { return r[0] === id; })[0];
  var mid = Math.max(g.a, Math.min(g.b, r[1] + r[5] / 2000));
  // mouse events carry whole pixels: the first one inside the row (rows may be 1 px tall)
  var top = svg.getBoundingClientRect().top, y = Math.ceil(top + g.T + k * g.rh) - top;
  at(svg, g.L + (mid - g.a) / (g.b - g.a) * (g.R - g.L), y, 'mousemove');
  var tip = document.getElementById('tip'), text = tip && !tip.hidden ? tip.textContent : '';
  var m = /TTFT ([0-9.]+) ms/.exec(text);
  if (text.indexOf('request #' + id + 'sent') !== 0 || !m || Math.abs(+m[1] - r[2]) > Math.max(0.01, r[2] * 0.005))
    return bad(what + ': hovering request #' + id + ' (TTFT ' + r[2] + ' ms) showed "' + text + '"');
  ok(what + ': hovering request #' + id + ' shows TTFT ' + m[1] + ' ms');
}

// Drags across the timeline from x0 to x1 (client px from its left), Shift held to pan.
function drag(svg, x0, x1, y, shift) {
  at(svg, x0, y, 'mousedown', {shiftKey: shift});
  at(svg, x1, y, 'mousemove', {shiftKey: shift});
  at(svg, x1, y, 'mouseup', {shiftKey: shift});
  return JSON.parse(svg.getAttribute('data-geom'));
}

function timelineHover(D) {
  var svg = document.querySelector('#chart-timeline svg');
  if (!D.timeline || !svg) return;
  var rows = D.timeline.rows, g = JSON.parse(svg.getAttribute('data-geom'));
  var k = g.ids.length >> 1;
  while (k < g.ids.length - 1 && rows[k][2] == null) k++;
  hoverRow(svg, rows, k, 'whole run');
  // zoom into the 60 px around that request by dragging across it
  var r = rows[k], x = g.L + (r[1] + r[5] / 2000 - g.a) / (g.b - g.a) * (g.R - g.L);
  var z = drag(svg, x - 30, x + 30, g.T + 2, false);
  if (!(z.b - z.a < g.b - g.a)) return bad('dragging across the timeline did not zoom in');
  var p = drag(svg, x, x < (g.L + g.R) / 2 ? x - 40 : x + 40, g.T + 2, true);
  if (p.a === z.a || Math.abs((p.b - p.a) - (z.b - z.a)) > 1e-9 * (g.b - g.a)) bad('Shift+drag did not pan the zoomed timeline');
  else ok('Shift+drag pans the zoomed timeline');
  svg.dispatchEvent(new MouseEvent('dblclick', {bubbles: true}));
  var back = JSON.parse(svg.getAttribute('data-geom'));
  if (back.a !== g.a || back.b !== g.b) bad('double-click did not reset the timeline'); else ok('double-click resets the timeline');
  z = drag(svg, x - 30, x + 30, g.T + 2, false);
  var ids = svg.querySelectorAll('.rid').length;
  if (z.rh >= 10 && ids !== z.ids.length) bad('zoomed timeline: ' + ids + ' request ids for ' + z.ids.length + ' rows');
  else ok('zoomed to ' + z.ids.length + ' rows, ' + ids + ' request ids shown');
  hoverRow(svg, rows, z.ids.indexOf(r[0]), 'zoomed');
}

// The page's first section is its answer (#headline, #verdict or #answer), right under the title,
// and every headline card lies wholly within the first window height.
function answerFirst() {
  var first = document.querySelector('#app > section');
  var want = {report: 'headline', compare: 'verdict', capacity: 'answer'}[D.page] || 'headline';
  if (!first || first.id !== want) return bad('the first section is ' + (first ? '#' + first.id : 'missing') + ', not #' + want);
  var before = Array.prototype.filter.call(document.getElementById('app').children, function (e) { return e.tagName !== 'SECTION' && e.compareDocumentPosition(first) & 4; });
  if (before.some(function (e) { return e.tagName !== 'H1' && !e.classList.contains('sub'); })) bad('#' + want + ' has more than the title above it');
  var cards = document.querySelectorAll('#headline .hcard'), below = [];
  cards.forEach(function (c) { var b = c.getBoundingClientRect(); if (!(b.height > 0) || b.bottom > window.innerHeight) below.push(c.id); });
  if (below.length) return bad('headline cards below the fold (' + window.innerHeight + ' px): ' + below.join(', '));
  ok('#' + want + ' first' + (cards.length ? ', ' + cards.length + ' headline cards above the fold' : ''));
}

// Each chart draws its series in distinct colours.
function distinctColours() {
  document.querySelectorAll('svg.chart').forEach(function (svg) {
    var seen = {};
    svg.querySelectorAll('path.mark').forEach(function (p) {
      var c = p.getAttribute('stroke');
      if (seen[c]) bad(name(svg) + ': two series drawn in ' + c);
      seen[c] = true;
    });
  });
  ok('each chart\'s series in distinct colours');
}

function cdfHover() {
  var r = document.querySelector('[id^="chart-cdf-"] .hover');
  if (!r) return;
  var b = r.getBoundingClientRect();
  at(r, b.width * 0.6, b.height / 2, 'mousemove');
  var text = r.closest('.card').querySelector('.readout').textContent;
  if (/p[0-9.]+ = [0-9.]+/.test(text)) ok('CDF hover reads "' + text + '"'); else bad('CDF hover read-out is "' + text + '"');
}

try {
  var D = JSON.parse(document.getElementById('retrace-data').textContent);
  answerFirst();
  distinctColours();
  labelsInside();
  noEmptyChart();
  cdfHover();
  timelineHover(D);
} catch (e) {
  bad('check script: ' + e.message);
}
var pre = document.createElement('pre');
pre.id = 'retrace-check';
pre.setAttribute('data-height', String(document.documentElement.scrollHeight));
pre.textContent = out.join('\n');
pre.style.display = 'none';
document.body.appendChild(pre);
})();
