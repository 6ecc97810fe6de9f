// Draws the page's data block (#retrace-data, built by src/report/html.rs) as SVG charts and a
// canvas timeline, with hover read-outs and a zoomable time axis. Fetches nothing.
(function () {
'use strict';
var NS = 'http://www.w3.org/2000/svg';
// Series colours: a chart never gives two of its series the same one.
var COLORS = ['#2e86c1', '#e67e22', '#7f8c8d', '#8e44ad', '#27ae60', '#d4ac0d', '#16a085', '#e84393'];
// vLLM's --plot-timeline colours: TTFT, then inter-token gaps below / between / above the thresholds.
var TTFT_COLOR = '#636efa', CLS = ['#109618', '#ff7f0e', '#d62728'], FAILED = '#95a5a6';

function h(tag, attrs, parent, text) {
  var e = document.createElement(tag);
  for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
  if (text != null) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
function s(tag, attrs, parent, text) {
  var e = document.createElementNS(NS, tag);
  for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
  if (text != null) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
function fmt(v) {
  if (v == null) return '-';
  var a = Math.abs(v);
  if (a === 0) return '0';
  var t = a >= 1000 ? v.toFixed(0) : a >= 100 ? v.toFixed(1) : a >= 1 ? v.toFixed(2) : a >= 0.001 ? v.toFixed(4) : v.toPrecision(3);
  return t.indexOf('.') >= 0 && t.indexOf('e') < 0 ? t.replace(/0+$/, '').replace(/\.$/, '') : t;
}
function ticks(lo, hi, n) {
  if (!(hi > lo)) hi = lo + 1;
  var span = hi - lo, step = Math.pow(10, Math.floor(Math.log10(span / n))), err = span / n / step;
  if (err >= 7.5) step *= 10; else if (err >= 3.5) step *= 5; else if (err >= 1.5) step *= 2;
  var out = [];
  for (var v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
  return out;
}
function section(app, id, title) { var sec = h('section', {id: id}, app); h('h2', {}, sec, title); return sec; }
function card(parent, id) { return h('div', {'class': 'card', id: id}, parent); }
function colorOf(se, i) { return se.color || COLORS[i % COLORS.length]; }

// Shifts an SVG text sideways so that it stays inside an svg of width W.
function keepInside(t, W) {
  var b = t.getBBox(), dx = 0;
  if (b.x + b.width > W - 1) dx = W - 1 - b.x - b.width;
  if (b.x + dx < 1) dx = 1 - b.x;
  if (dx) t.setAttribute('x', +t.getAttribute('x') + dx);
  return t;
}
// Legend items [name, colour] from (x, y) rightwards, wrapping before maxX; returns the y below it.
function svgLegend(svg, items, x, y, maxX) {
  var cx = x;
  items.forEach(function (it) {
    var g = s('g', {}, svg);
    s('rect', {x: 0, y: -9, width: 10, height: 10, fill: it[1]}, g);
    var w = 14 + s('text', {x: 14, y: 0}, g, it[0]).getComputedTextLength() + 14;
    if (cx > x && cx + w > maxX) { cx = x; y += 15; }
    g.setAttribute('transform', 'translate(' + cx + ',' + y + ')');
    cx += w;
  });
  return y + 6;
}
function noData(svg, W, H, why) {
  keepInside(s('text', {x: W / 2, y: H / 2, 'text-anchor': 'middle', 'class': 'no-data'}, svg, 'no data' + (why ? ': ' + why : '')), W);
  return svg;
}
// Index of the point of pts (sorted by x) nearest to x.
function nearest(pts, x) {
  var lo = 0, hi = pts.length - 1;
  while (hi - lo > 1) { var m = (lo + hi) >> 1; if (pts[m][0] < x) lo = m; else hi = m; }
  return Math.abs(pts[lo][0] - x) <= Math.abs(pts[hi][0] - x) ? lo : hi;
}
// Calls move(x) with the pointer's x inside svg while it hovers the plot box, leave() after.
function hoverBox(svg, x, y, w, hgt, move, leave) {
  var r = s('rect', {x: x, y: y, width: w, height: hgt, fill: 'transparent', 'class': 'hover'}, svg);
  r.addEventListener('mousemove', function (e) { move(e.clientX - svg.getBoundingClientRect().left); });
  r.addEventListener('mouseleave', leave);
}

// series [{name, color, pts:[[x, y]], dash}]; opts {xlabel, ylabel, logx, ymax, cdf, unit}
function lineChart(parent, id, title, series, opts) {
  var W = 440, H = 270, L = 56, R = 16, B = 38, T = 24;
  var c = card(parent, id);
  var svg = s('svg', {width: W, height: H, 'class': 'chart'}, c);
  s('text', {x: L, y: 14, 'class': 'title'}, svg, title);
  var readout = h('div', {'class': 'readout'}, c);
  var xs = [], ys = [];
  series.forEach(function (se) {
    se.pts = se.pts.filter(function (p) { return isFinite(p[0]) && isFinite(p[1]); });
    se.pts.forEach(function (p) { xs.push(p[0]); ys.push(p[1]); });
  });
  if (!xs.length) return noData(svg, W, H);
  var xmin = Math.min.apply(null, xs), xmax = Math.max.apply(null, xs), ytop = Math.max.apply(null, ys);
  if (opts.cdf && !(xmax > xmin)) return noData(svg, W, H, 'every value is ' + fmt(xmin) + ' ' + opts.unit);
  if (!opts.cdf && !(ytop > 0) && Math.min.apply(null, ys) === 0) return noData(svg, W, H, 'every value is 0');
  if (series.length > 1) T = svgLegend(svg, series.map(function (se, i) { return [se.name, colorOf(se, i)]; }), L, 32, W - R) + 6;
  var ymax = opts.ymax != null ? opts.ymax : ytop;
  if (!(ymax > 0)) ymax = 1;
  var logx = opts.logx && xmin > 0 && xmax / xmin > 50;
  var fx = logx ? function (v) { return Math.log10(Math.max(v, xmin)); } : function (v) { return v; };
  var a = fx(xmin), b = fx(xmax);
  if (!(b > a)) b = a + 1;
  var X = function (v) { return L + (fx(v) - a) / (b - a) * (W - L - R); };
  var Y = function (v) { return H - B - v / ymax * (H - T - B); };
  var ax = s('g', {'class': 'axis'}, svg);
  ticks(0, ymax, 4).forEach(function (v) {
    s('line', {x1: L, y1: Y(v), x2: W - R, y2: Y(v), 'class': 'grid-line'}, ax);
    s('text', {x: L - 6, y: Y(v) + 4, 'text-anchor': 'end'}, ax, fmt(v));
  });
  s('line', {x1: L, y1: H - B, x2: W - R, y2: H - B}, ax);
  s('line', {x1: L, y1: T, x2: L, y2: H - B}, ax);
  var xt = ticks(xmin, xmax, 5);
  if (logx) {
    xt = [];
    for (var e = Math.floor(a); e <= Math.ceil(b); e++) { var v = Math.pow(10, e); if (v >= xmin * 0.999 && v <= xmax * 1.001) xt.push(v); }
    if (xt.length < 2) xt = [xmin, xmax];
  }
  xt.forEach(function (v) {
    s('line', {x1: X(v), y1: H - B, x2: X(v), y2: H - B + 4}, ax);
    keepInside(s('text', {x: X(v), y: H - B + 15, 'text-anchor': 'middle'}, ax, fmt(v)), W);
  });
  if (opts.xlabel) s('text', {x: (L + W - R) / 2, y: H - 6, 'text-anchor': 'middle'}, svg, opts.xlabel + (logx ? ' (log)' : ''));
  if (opts.ylabel) s('text', {x: 12, y: (T + H - B) / 2, transform: 'rotate(-90 12 ' + ((T + H - B) / 2) + ')', 'text-anchor': 'middle'}, svg, opts.ylabel);
  series.forEach(function (se, i) {
    var d = se.pts.map(function (p, j) { return (j ? 'L' : 'M') + X(p[0]).toFixed(1) + ',' + Y(p[1]).toFixed(1); }).join('');
    s('path', {d: d, fill: 'none', stroke: colorOf(se, i), 'stroke-width': 1.6, 'stroke-dasharray': se.dash ? '4 3' : 'none', 'class': 'mark'}, svg);
  });
  var guide = s('line', {y1: T, y2: H - B, 'class': 'guide', visibility: 'hidden'}, svg);
  var dots = series.map(function (se, i) { return s('circle', {r: 3, fill: colorOf(se, i), visibility: 'hidden'}, svg); });
  hoverBox(svg, L, T, W - L - R, H - T - B, function (px) {
    var x = logx ? Math.pow(10, a + (px - L) / (W - L - R) * (b - a)) : a + (px - L) / (W - L - R) * (b - a);
    var parts = [];
    series.forEach(function (se, i) {
      if (!se.pts.length) return;
      var p = se.pts[nearest(se.pts, x)];
      dots[i].setAttribute('cx', X(p[0])); dots[i].setAttribute('cy', Y(p[1])); dots[i].setAttribute('visibility', 'visible');
      var name = series.length > 1 ? se.name + ' ' : '';
      parts.push(opts.cdf ? name + 'p' + fmt(p[1] * 100) + ' = ' + fmt(p[0]) + ' ' + opts.unit
                          : name + fmt(p[1]) + ' at ' + fmt(p[0]) + ' ' + opts.unit);
    });
    guide.setAttribute('x1', px); guide.setAttribute('x2', px); guide.setAttribute('visibility', 'visible');
    readout.textContent = parts.join(' · ');
  }, function () {
    guide.setAttribute('visibility', 'hidden');
    dots.forEach(function (d) { d.setAttribute('visibility', 'hidden'); });
  });
  return svg;
}

function cdfChart(parent, id, title, series, unit, xlabel) {
  return lineChart(parent, id, title, series, {xlabel: xlabel || unit, ylabel: 'fraction', logx: true, ymax: 1, cdf: true, unit: unit});
}

function barChart(parent, id, title, hist, xlabel, ylabel) {
  var W = 440, H = 250, L = 56, R = 16, T = 24, B = 38;
  var c = card(parent, id);
  var svg = s('svg', {width: W, height: H, 'class': 'chart'}, c);
  s('text', {x: L, y: 14, 'class': 'title'}, svg, title);
  var readout = h('div', {'class': 'readout'}, c);
  var n = hist.counts.length, ymax = Math.max.apply(null, hist.counts) || 1, bw = (W - L - R) / n;
  var Y = function (v) { return H - B - v / ymax * (H - T - B); };
  var ax = s('g', {'class': 'axis'}, svg);
  ticks(0, ymax, 4).forEach(function (v) {
    s('line', {x1: L, y1: Y(v), x2: W - R, y2: Y(v), 'class': 'grid-line'}, ax);
    s('text', {x: L - 6, y: Y(v) + 4, 'text-anchor': 'end'}, ax, fmt(v));
  });
  s('line', {x1: L, y1: H - B, x2: W - R, y2: H - B}, ax);
  s('line', {x1: L, y1: T, x2: L, y2: H - B}, ax);
  hist.counts.forEach(function (v, i) {
    s('rect', {x: L + i * bw + 0.5, y: Y(v), width: Math.max(bw - 1, 0.5), height: H - B - Y(v), fill: COLORS[0], 'class': 'mark'}, svg);
  });
  ticks(0, n * hist.width, 5).forEach(function (v) {
    keepInside(s('text', {x: L + v / hist.width * bw, y: H - B + 15, 'text-anchor': 'middle'}, ax, fmt(v)), W);
  });
  s('text', {x: (L + W - R) / 2, y: H - 6, 'text-anchor': 'middle'}, svg, xlabel);
  s('text', {x: 12, y: (T + H - B) / 2, transform: 'rotate(-90 12 ' + ((T + H - B) / 2) + ')', 'text-anchor': 'middle'}, svg, ylabel);
  hoverBox(svg, L, T, W - L - R, H - T - B, function (px) {
    var i = Math.max(0, Math.min(n - 1, Math.floor((px - L) / bw)));
    readout.textContent = fmt(i * hist.width) + '-' + fmt((i + 1) * hist.width) + ' ' + xlabel + ': ' + hist.counts[i] + ' requests';
  }, function () {});
  return svg;
}

function table(parent, id, head, rows, clsCol) {
  var t = h('table', {id: id}, h('div', {'class': 'tw'}, parent));
  var tr = h('tr', {}, t);
  head.forEach(function (x) { h('th', {}, tr, x); });
  rows.forEach(function (r) {
    var tr = h('tr', {}, t);
    r.forEach(function (x, i) {
      var td = h('td', {}, tr, typeof x === 'number' ? fmt(x) : (x == null ? '-' : String(x)));
      if (i === clsCol && (x === 'worse' || x === 'better')) td.className = x;
    });
  });
  return t;
}

function legend(parent, items) {
  var lg = h('div', {'class': 'legend'}, parent);
  items.forEach(function (x) {
    var sp = h('span', {}, lg);
    h('span', {'class': 'sw', style: 'background:' + x[1]}, sp);
    sp.appendChild(document.createTextNode(x[0]));
  });
}

// The floating tooltip of the timeline: lines at the pointer, or hidden (lines null).
function tip(lines, cx, cy) {
  var t = document.getElementById('tip') || h('div', {id: 'tip'}, document.body);
  t.hidden = !lines;
  if (!lines) return;
  t.textContent = '';
  lines.forEach(function (l) { h('div', {}, t, l); });
  var w = t.offsetWidth, ht = t.offsetHeight;
  t.style.left = Math.max(0, cx + 14 + w > window.innerWidth ? cx - 14 - w : cx + 14) + 'px';
  t.style.top = Math.max(0, cy + 14 + ht > window.innerHeight ? cy - 14 - ht : cy + 14) + 'px';
}

// Rows: [index, start_s, ttft_ms, ok, [dur_ms, class, ...], e2el_ms, input_tokens, output_tokens, error].
function timeline(parent, id, tl, th, note) {
  var c = card(parent, id), rows = tl.rows;
  var W = Math.max(360, Math.min(1400, parent.clientWidth || 1000)), L = 64, R = 16, T = 6, B = 34;
  var end = function (r) { return r[1] + r[5] / 1000; };
  var full = [Infinity, -Infinity];
  rows.forEach(function (r) { full[0] = Math.min(full[0], r[1]); full[1] = Math.max(full[1], end(r)); });
  if (!(full[1] > full[0])) full = [full[0] || 0, (full[0] || 0) + 1];
  var view = full.slice(), vis = rows;
  var rh0 = Math.max(1, Math.min(14, 1000 / rows.length)), plotH = rh0 * rows.length, H = T + plotH + B, rh = rh0;
  var bar = h('div', {'class': 'tl-bar'}, c);
  var box = h('div', {'class': 'tl-box', style: 'width:' + W + 'px;height:' + H + 'px'}, c);
  var dpr = window.devicePixelRatio || 1;
  var cv = h('canvas', {width: W * dpr, height: H * dpr, style: 'width:' + W + 'px;height:' + H + 'px', 'data-rows': rows.length}, box);
  var g = cv.getContext('2d');
  g.scale(dpr, dpr);
  var svg = s('svg', {width: W, height: H, 'class': 'chart'}, box);
  var ax = s('g', {'class': 'axis'}, svg);
  var sel = s('rect', {y: T, height: plotH, fill: 'rgba(46,134,193,.15)', visibility: 'hidden'}, svg);
  var X = function (t) { return L + (t - view[0]) / (view[1] - view[0]) * (W - L - R); };
  var tAt = function (x) { return view[0] + (x - L) / (W - L - R) * (view[1] - view[0]); };

  function drawRow(r, y) {
    var hh = rh >= 4 ? rh - 1 : rh;
    var span = function (a, b, col) { var x0 = X(a); g.fillStyle = col; g.fillRect(x0, y, Math.max(1, X(b) - x0), hh); };
    if (!r[3]) return span(r[1], end(r), FAILED);
    var t = r[1] + (r[2] || 0) / 1000;
    span(r[1], t, TTFT_COLOR);
    for (var k = 0; k < r[4].length; k += 2) { var d = r[4][k] / 1000; span(t, t + d, CLS[r[4][k + 1]]); t += d; }
  }
  function draw() {
    vis = rows.filter(function (r) { return r[1] <= view[1] && end(r) >= view[0]; });
    rh = Math.min(14, Math.max(rh0, plotH / Math.max(1, vis.length)));
    g.clearRect(0, 0, W, H);
    g.save(); g.beginPath(); g.rect(L, 0, W - L - R, H); g.clip();
    vis.forEach(function (r, k) { drawRow(r, T + k * rh); });
    g.restore();
    ax.textContent = '';
    s('line', {x1: L, y1: T + plotH, x2: W - R, y2: T + plotH}, ax);
    ticks(view[0], view[1], Math.max(3, Math.floor(W / 140))).forEach(function (v) {
      s('line', {x1: X(v), y1: T + plotH, x2: X(v), y2: T + plotH + 4}, ax);
      keepInside(s('text', {x: X(v), y: T + plotH + 15, 'text-anchor': 'middle'}, ax, fmt(v)), W);
    });
    s('text', {x: (L + W - R) / 2, y: H - 4, 'text-anchor': 'middle'}, ax, 'time since the run started (s)');
    if (rh >= 10) vis.forEach(function (r, k) { s('text', {x: L - 4, y: T + k * rh + rh / 2 + 3, 'text-anchor': 'end', 'class': 'rid'}, ax, '#' + r[0]); });
    svg.setAttribute('data-geom', JSON.stringify({L: L, R: W - R, T: T, rh: rh, a: view[0], b: view[1], ids: vis.map(function (r) { return r[0]; })}));
    status.textContent = 'showing ' + fmt(view[0]) + '-' + fmt(view[1]) + ' s: ' + vis.length + ' of ' + rows.length + ' rows' + (rh >= 10 ? '' : ' (zoom in for request ids)');
  }
  function setView(a, b) {
    var w = Math.min(full[1] - full[0], Math.max(b - a, (full[1] - full[0]) / 1e4));
    a = Math.max(full[0], Math.min(a, full[1] - w));
    view = [a, a + w];
    draw();
  }
  function zoom(f, t) { if (t == null) t = (view[0] + view[1]) / 2; setView(t - (t - view[0]) * f, t + (view[1] - t) * f); }
  function pan(f) { var w = view[1] - view[0]; setView(view[0] + f * w, view[1] + f * w); }
  [['+', function () { zoom(0.5); }], ['-', function () { zoom(2); }], ['<', function () { pan(-0.25); }],
   ['>', function () { pan(0.25); }], ['reset', function () { setView(full[0], full[1]); }]].forEach(function (b) {
    h('button', {type: 'button', title: {'+': 'zoom in', '-': 'zoom out', '<': 'earlier', '>': 'later', reset: 'whole run'}[b[0]]}, bar, b[0]).addEventListener('click', b[1]);
  });
  var status = h('span', {}, bar);

  function px(e) { var b = svg.getBoundingClientRect(); return [e.clientX - b.left, e.clientY - b.top]; }
  function hover(e) {
    var p = px(e), k = Math.floor((p[1] - T) / rh), r = p[0] >= L && p[0] <= W - R && k >= 0 ? vis[k] : null;
    if (!r || X(r[1]) - 3 > p[0] || X(end(r)) + 3 < p[0]) return tip(null);
    var err = r[8] == null ? null : (tl.errors || [])[r[8]];
    tip(['request #' + r[0], 'sent ' + fmt(r[1]) + ' s', 'TTFT ' + fmt(r[2]) + ' ms', 'E2EL ' + fmt(r[5]) + ' ms',
         'tokens ' + r[6] + ' in, ' + r[7] + ' out', err ? 'error: ' + err : (r[3] ? 'ok' : 'failed')], e.clientX, e.clientY);
  }
  var drag = null;
  svg.addEventListener('mousedown', function (e) { drag = {x: px(e)[0], view: view.slice(), pan: e.shiftKey}; e.preventDefault(); });
  svg.addEventListener('mousemove', function (e) { if (!drag) hover(e); });
  svg.addEventListener('mouseleave', function () { tip(null); });
  window.addEventListener('mousemove', function (e) {
    if (!drag) return;
    var x = px(e)[0];
    if (drag.pan) { var dt = (x - drag.x) / (W - L - R) * (drag.view[1] - drag.view[0]); setView(drag.view[0] - dt, drag.view[1] - dt); return; }
    sel.setAttribute('x', Math.min(x, drag.x)); sel.setAttribute('width', Math.abs(x - drag.x)); sel.setAttribute('visibility', 'visible');
  });
  window.addEventListener('mouseup', function (e) {
    if (!drag) return;
    var x = px(e)[0], d = drag;
    drag = null;
    sel.setAttribute('visibility', 'hidden');
    if (!d.pan && Math.abs(x - d.x) > 3) setView(tAt(Math.min(x, d.x)), tAt(Math.max(x, d.x)));
  });
  svg.addEventListener('dblclick', function () { setView(full[0], full[1]); });
  svg.addEventListener('wheel', function (e) {
    if (!e.ctrlKey && !e.metaKey) return;
    e.preventDefault();
    zoom(e.deltaY > 0 ? 1.25 : 0.8, tAt(px(e)[0]));
  }, {passive: false});
  draw();
  legend(c, [['TTFT', TTFT_COLOR], ['ITL < ' + th[0] + ' ms', CLS[0]], [th[0] + ' ms \u2264 ITL < ' + th[1] + ' ms', CLS[1]],
             ['ITL \u2265 ' + th[1] + ' ms', CLS[2]], ['failed', FAILED]]);
  h('div', {'class': 'sub'}, c, note + ' Hover a row for its request; drag across the chart to zoom in, Shift+drag to pan, Ctrl+wheel to zoom, double-click to reset.');
}

function breakdown(parent, B) {
  var c = card(parent, 'chart-breakdown'), W = 560, H = 96, L = 70;
  var svg = s('svg', {width: W, height: H, 'class': 'chart'}, c);
  var parts = [['server queue', B.queue, COLORS[0]], ['server TTFT', B.server_ttft, COLORS[1]], ['unattributed', B.unattributed, COLORS[2]]];
  var totals = [0, 1].map(function (j) { return fmt(B.client_ttft[j]) + ' ms'; });
  var probe = s('text', {x: 0, y: -20}, svg, totals[0].length > totals[1].length ? totals[0] : totals[1]);
  var span = W - L - probe.getComputedTextLength() - 12;
  svg.removeChild(probe);
  var sum = function (j) { return parts.reduce(function (acc, p) { return acc + Math.max(0, p[1][j]); }, 0); };
  var tot = Math.max(B.client_ttft[0], B.client_ttft[1], sum(0), sum(1), 1e-9);
  ['mean', 'median'].forEach(function (lbl, j) {
    var y = 12 + j * 40, x = L;
    s('text', {x: 4, y: y + 14}, svg, lbl);
    parts.forEach(function (p) {
      var w = Math.max(0, p[1][j]) / tot * span;
      s('title', {}, s('rect', {x: x, y: y, width: w, height: 20, fill: p[2], 'class': 'mark'}, svg), p[0] + ': ' + fmt(p[1][j]) + ' ms');
      x += w;
    });
    keepInside(s('text', {x: x + 4, y: y + 14}, svg, totals[j]), W);
  });
  legend(c, parts.map(function (p) { return [p[0], p[2]]; }));
  return svg;
}

// The answer first: the verdict and one card per headline figure.
function headline(app, D) {
  var sec = section(app, 'headline', 'Headline');
  h('div', {'class': 'verdict ' + D.verdict.state, id: 'verdict-line'}, sec, D.verdict.text);
  var cs = h('div', {'class': 'cards'}, sec);
  D.cards.forEach(function (c) {
    var k = h('div', {'class': 'hcard', id: 'card-' + c.id}, cs);
    h('div', {'class': 'hl'}, k, c.label);
    h('div', {'class': 'hv'}, k, c.value);
    if (c.sub) h('div', {'class': 'hs'}, k, c.sub);
  });
}

function report(app, D) {
  headline(app, D);
  var S = D.series, z = function (a) { return S.t.map(function (t, i) { return [t, a[i]]; }); };
  if (D.timeline || (S && S.ttft_p50.length)) {
    var lt = section(app, 'latency-over-time', 'Latency over time');
    if (S && S.ttft_p50.length) lineChart(h('div', {'class': 'grid'}, lt), 'chart-ttft-over-time', 'TTFT by send time (per bin)',
      [{name: 'p50', pts: S.ttft_p50}, {name: 'p99', pts: S.ttft_p99}], {xlabel: 's', ylabel: 'ms', unit: 's'});
    if (D.timeline) {
      var T = D.timeline;
      timeline(lt, 'chart-timeline', T, D.thresholds, 'One row per request (' + T.shown + ' of ' + T.total + ' shown' + (T.shown < T.total ? ': an even sample plus the slowest by E2EL' : '') + ').');
      if (T.detail) {
        h('h2', {}, lt, 'Timeline detail: the ' + T.detail.shown + ' consecutive requests around the worst TTFT (' + fmt(T.detail.worst_ttft_ms) + ' ms)');
        timeline(lt, 'chart-timeline-detail', T.detail, D.thresholds, 'Every request in this window, from ' + fmt(T.detail.from_s) + ' s.');
      }
    }
  }
  if (S) {
    var se = section(app, 'over-time', 'Throughput and concurrency over time'), g2 = h('div', {'class': 'grid'}, se);
    lineChart(g2, 'chart-throughput', 'Throughput', [{name: 'output tok/s', pts: z(S.tokens)}], {xlabel: 's', ylabel: 'tokens/s', unit: 's'});
    lineChart(g2, 'chart-completions', 'Completions', [{name: 'req/s', pts: z(S.completions)}], {xlabel: 's', ylabel: 'requests/s', unit: 's'});
    var cs = [{name: 'in flight', pts: z(S.concurrency), color: COLORS[0]}];
    if (S.queue) cs.push({name: 'client queue', pts: z(S.queue), color: COLORS[1]});
    if (S.server_queue) cs.push({name: 'server queue*', pts: z(S.server_queue), color: COLORS[3]});
    if (S.server_running) cs.push({name: 'server running', pts: S.server_running, color: COLORS[4], dash: true});
    if (S.server_waiting) cs.push({name: 'server waiting', pts: S.server_waiting, color: COLORS[6], dash: true});
    lineChart(g2, 'chart-concurrency', 'Concurrency and queue depth (peak per bin)', cs, {xlabel: 's', ylabel: 'requests', unit: 's'});
    if (S.server_kv) lineChart(g2, 'chart-server-kv', 'Server KV-cache usage (scraped)', [{name: 'KV usage', pts: S.server_kv}], {xlabel: 's', ylabel: 'fraction', unit: 's'});
    if (S.server_queue) h('div', {'class': 'sub'}, se, '* server queue depth from each request\'s reported queue time, placed at its send time (the server does not say when it queued).');
    if (S.server_running || S.server_waiting) h('div', {'class': 'sub'}, se, 'Dashed: the server\'s own /metrics gauges, scraped every second (--scrape-metrics).');
  }
  var lat = section(app, 'latency', 'Distributions');
  table(lat, 'table-percentiles', D.percentile_head, D.percentiles);
  h('div', {'class': 'sub'}, lat, 'Latency from the actual send time, as vllm bench serve measures it; std is the population std. ~: from the stored histogram (0.1% precision).');
  if (D.intended.length) {
    h('h3', {}, lat, 'From the intended send time (free of coordinated omission) and send drift');
    table(lat, 'table-intended', D.percentile_head, D.intended);
  }
  var g = h('div', {'class': 'grid'}, lat);
  D.cdfs.forEach(function (c) { cdfChart(g, 'chart-cdf-' + c.key, c.label + ' CDF', [{name: c.label, pts: c.pts}], 'ms'); });
  if (D.isl || D.osl) {
    var g3 = h('div', {'class': 'grid'}, section(app, 'lengths', 'Lengths'));
    if (D.isl) barChart(g3, 'chart-isl', 'Input lengths (ISL)', D.isl, 'tokens', 'requests');
    if (D.osl) barChart(g3, 'chart-osl', 'Output lengths (OSL)', D.osl, 'tokens', 'requests');
  }
  if (D.breakdown) {
    var bd = section(app, 'breakdown', 'Server-side breakdown of client TTFT'), B = D.breakdown;
    breakdown(bd, B);
    table(bd, 'table-breakdown', ['component (ms, ' + B.n + ' requests)', 'mean', 'p50', 'p90', 'p99'],
      [['server queue'].concat(B.queue), ['server TTFT'].concat(B.server_ttft),
       ['unattributed (client TTFT - queue - server TTFT)'].concat(B.unattributed), ['client TTFT'].concat(B.client_ttft)]);
    h('div', {'class': 'sub'}, bd, 'Unattributed time is inside the server but covered by neither metric (e.g. waiting for the engine loop), plus client and network overhead.');
  }
  (D.shadows || []).forEach(function (sh, k) { shadowBeside(app, sh, k, D.thresholds); });
  var det = h('details', {id: 'details'}, h('section', {id: 'raw'}, app));
  h('summary', {}, det, 'Every figure of the input (' + D.summary.length + ')');
  table(det, 'table-summary', ['figure', 'value', 'key'], D.summary);
}

// A shadow beside its primary (the target of a replay): both sides' CDFs, the paired change,
// its timeline.
function shadowBeside(app, sh, k, th) {
  var p = sh.primary, sec = section(app, 'shadow-' + k, sh.name + ' beside the ' + p);
  h('div', {'class': 'sub'}, sec, sh.pairs + ' requests both completed (the pairs). ' +
    sh.deltas.map(function (d) { return 'Median ' + d.label + ' change ' + (d.median >= 0 ? '+' : '') + fmt(d.median) + ' ms'; }).join('; ') +
    (sh.deltas.length ? ' (shadow − ' + p + ', per request; retrace compare --shadow judges it).' : ''));
  var g = h('div', {'class': 'grid'}, sec);
  sh.cdfs.forEach(function (c) {
    cdfChart(g, 'chart-shadow-' + k + '-cdf-' + c.key, c.label + ' CDF', [{name: p, pts: c.base}, {name: 'shadow', pts: c.cand}], 'ms');
  });
  sh.deltas.forEach(function (d) {
    cdfChart(g, 'chart-shadow-' + k + '-delta-' + d.key, 'Paired ' + d.label + ' change CDF (' + d.n + ' pairs)', [{name: 'shadow − ' + p, pts: d.pts}], 'ms');
  });
  if (sh.timeline) timeline(sec, 'chart-shadow-' + k + '-timeline', sh.timeline, th, 'The shadow\'s answers, one row per ' + (p === 'primary' ? 'copy' : 'request') + ' sent, on the ' + p + '\'s clock (' + sh.timeline.shown + ' of ' + sh.timeline.total + ' shown).');
}

function compare(app, D) {
  var V = D.verdict, vs = section(app, 'verdict', 'Verdict');
  var state = V.gate === 'fail' ? 'invalid' : V.gate === 'not_judged' ? 'unknown' : (V.gate === 'pass' ? 'valid' : 'plain');
  h('div', {'class': 'verdict ' + state, id: 'verdict-line'}, vs, V.line);
  if (!V.rules.length) h('div', {'class': 'sub', id: 'gate'}, vs, 'No --fail-on rules: no gate.');
  else {
    var gl = h('ul', {id: 'gate'}, vs);
    V.rules.forEach(function (r) { h('li', {'class': r[0] ? 'worse' : (r[1] ? '' : 'better')}, gl, r[2]); });
  }
  var t = section(app, 'metrics', 'Metrics');
  table(t, 'table-compare', ['metric', 'baseline', 'candidate', 'change', 'rel', 'interval of change', 'verdict'], D.rows, 6);
  (D.notes || []).forEach(function (n) { h('div', {'class': 'note'}, t, n); });
  var cd = section(app, 'cdfs', 'Distributions');
  if (!D.cdfs.length) h('div', {'class': 'sub'}, cd, 'no data: a side has neither per-request samples nor histograms');
  var g = h('div', {'class': 'grid'}, cd);
  D.cdfs.forEach(function (c) {
    var se = [{name: 'baseline', pts: c.base}, {name: 'candidate', pts: c.cand}];
    if (c.noise) se.push({name: 'noise', pts: c.noise, dash: true, color: COLORS[2]});
    cdfChart(g, 'chart-cdf-' + c.key, c.label + ' CDF', se, 'ms');
  });
  if (D.lengths && D.lengths.length) {
    var g4 = h('div', {'class': 'grid'}, section(app, 'workload', 'Workload'));
    D.lengths.forEach(function (c) { cdfChart(g4, 'chart-cdf-' + c.key, c.label + ' CDF', [{name: 'baseline', pts: c.base}, {name: 'candidate', pts: c.cand}], 'tokens'); });
  }
  if (D.paired) {
    var p = section(app, 'paired', 'Paired per-request TTFT (' + D.paired.n + ' requests)');
    h('div', {'class': 'sub'}, p, D.paired.text);
    cdfChart(p, 'chart-paired', 'candidate / baseline TTFT ratio CDF', [{name: 'ratio', pts: D.paired.pts}], '', 'ratio');
  }
  h('pre', {}, section(app, 'text', 'Text report'), D.text);
}

// A capacity search: latency and throughput against offered load, the SLO's bounds and the
// knee (the answer's offered rate) as dashed lines named in the legend.
function capacity(app, D) {
  h('div', {'class': 'note', id: 'capacity-answer'}, section(app, 'answer', 'Answer'), D.answer);
  var g = h('div', {'class': 'grid'}, section(app, 'curves', 'Against offered load'));
  var xs = [], top = {};
  function span(series, key) {
    top[key] = 0;
    series.forEach(function (se) { se.pts.forEach(function (p) { xs.push(p[0]); top[key] = Math.max(top[key], p[1]); }); });
  }
  span(D.latency, 'lat'); span(D.throughput, 'tput');
  var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
  function marks(series, key) {
    var out = series.slice();
    if (key === 'lat') D.slo_lines.forEach(function (l, i) {
      out.push({name: l.name, pts: [[x0, l.y], [x1, l.y]], dash: true, color: COLORS[(3 + i) % COLORS.length]});
      top[key] = Math.max(top[key], l.y);
    });
    if (D.knee != null) out.push({name: 'capacity', pts: [[D.knee, 0], [D.knee, top[key]]], dash: true, color: '#c0392b'});
    return out;
  }
  lineChart(g, 'chart-capacity-latency', 'Latency against offered load', marks(D.latency, 'lat'), {xlabel: 'offered requests/s', ylabel: 'ms', unit: 'req/s'});
  lineChart(g, 'chart-capacity-throughput', 'Throughput against offered load', marks(D.throughput, 'tput'), {xlabel: 'offered requests/s', ylabel: 'requests/s', unit: 'req/s'});
  table(section(app, 'steps', 'Steps, in the order they ran'), 'table-capacity-steps',
    ['factor', 'offered req/s', 'achieved req/s', 'output tok/s', 'p50 TTFT ms', 'p99 TTFT ms', 'p99 ITL ms', 'failed', 'SLO'], D.steps);
}

function fail(e) {
  var m = String(e && e.message || e);
  document.body.setAttribute('data-render-error', m);
  (document.getElementById('render-error') || h('div', {id: 'render-error'}, document.body)).textContent = 'report script error: ' + m;
}
window.addEventListener('error', function (ev) { fail(ev.error || ev.message); });
try {
  var D = JSON.parse(document.getElementById('retrace-data').textContent), app = document.getElementById('app');
  h('h1', {}, app, D.title);
  h('div', {'class': 'sub'}, app, D.subtitle);
  if (D.page === 'compare') compare(app, D); else if (D.page === 'capacity') capacity(app, D); else report(app, D);
  var n = document.querySelectorAll('.chart').length;
  document.body.setAttribute('data-rendered', String(n));
  h('div', {id: 'render-ok', hidden: 'hidden'}, document.body, 'rendered ' + n + ' charts');
} catch (e) { fail(e); }
})();
