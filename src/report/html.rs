//! Self-contained HTML pages: the run report (`retrace report`) and the comparison page
//! (`compare --html`). One file, inline CSS and JavaScript drawing SVG (and one canvas for the
//! timeline); no network fetches, no external fonts or scripts.
//!
//! Rust computes everything the page shows (downsampled so 100,000 requests stay a few MB): CDF
//! points, percentile tables, the timeline rows (at most [`TIMELINE_ROWS`] requests: an even
//! stride plus the slowest, each with its TTFT and runs of ITL gaps grouped by threshold
//! class; above that, also a detail window of [`DETAIL_ROWS`] consecutive requests around the worst
//! TTFT), time series in at most [`SERIES_BINS`] bins, length histograms and the server-side
//! breakdown. The data goes in a `<script type="application/json">` block; the script draws it
//! and, only after every chart rendered without an exception, sets `data-rendered` on `<body>`
//! and adds `#render-ok` (a script error sets `data-render-error` instead), which the browser test
//! checks. This module does not read files or compute comparisons.

use super::compare::{Comparison, Verdict};
use super::load::{Metric, Requests, Run};
use super::render::{label, num, verdict};
use super::weighted::Weighted;
use serde_json::{json, Value};

/// Most requests drawn in the timeline.
pub const TIMELINE_ROWS: usize = 1500;
/// Requests in the detail window of a large run's timeline.
pub const DETAIL_ROWS: usize = 300;
/// Most ITL runs kept per timeline row (the rest merge into the last run).
const RUNS_PER_ROW: usize = 120;
/// Most bins of a time series.
pub const SERIES_BINS: usize = 300;
const CDF_POINTS: usize = 200;
const HIST_BINS: usize = 40;

fn r3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

fn cdf_json(w: &Weighted) -> Value {
    Value::Array(
        w.cdf_points(CDF_POINTS)
            .into_iter()
            .map(|(x, y)| json!([r3(x), r3(y)]))
            .collect(),
    )
}

fn class_of(ms: f64, t: (f64, f64)) -> u8 {
    if ms < t.0 {
        0
    } else if ms < t.1 {
        1
    } else {
        2
    }
}

/// Timeline rows: `[start_s, ttft_ms|null, ok, [dur_ms, class, dur_ms, class, ...], e2el_ms]`.
fn rows_of(q: &Requests, idx: &[usize], t: (f64, f64)) -> Vec<Value> {
    idx.iter()
        .map(|&i| {
            let mut runs: Vec<(f64, u8)> = Vec::new();
            for &g in &q.itls_s[i] {
                let ms = g * 1e3;
                let c = class_of(ms, t);
                let full = runs.len() >= RUNS_PER_ROW;
                match runs.last_mut() {
                    Some((d, lc)) if *lc == c || full => {
                        *d += ms;
                        *lc = (*lc).max(c);
                    }
                    _ => runs.push((ms, c)),
                }
            }
            let flat: Vec<Value> = runs
                .iter()
                .flat_map(|(d, c)| [json!(r3(*d)), json!(c)])
                .collect();
            let ttft = q.ttft_s[i].map(|v| r3(v * 1e3));
            let end = (q.end_s(i) - q.start_s[i]) * 1e3;
            json!([r3(q.start_s[i]), ttft, q.ok(i), flat, r3(end)])
        })
        .collect()
}

/// The whole-run timeline (every request, or an even stride plus the slowest by E2EL when there
/// are more than [`TIMELINE_ROWS`]) and, for large runs, a detail window: every request of the
/// [`DETAIL_ROWS`] around the one with the worst TTFT.
fn timeline(run: &Run, t: (f64, f64)) -> Option<Value> {
    let q = run.requests.as_ref()?;
    let n = q.len();
    if n == 0 {
        return None;
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| q.start_s[a].total_cmp(&q.start_s[b]));
    let mut idx: Vec<usize> = if n <= TIMELINE_ROWS {
        order.clone()
    } else {
        let slow_budget = TIMELINE_ROWS / 10;
        let mut by_e2el: Vec<usize> = (0..n).collect();
        by_e2el.sort_by(|&a, &b| {
            q.latency_s[b]
                .unwrap_or(0.0)
                .total_cmp(&q.latency_s[a].unwrap_or(0.0))
        });
        let mut keep = vec![false; n];
        for &i in by_e2el.iter().take(slow_budget) {
            keep[i] = true;
        }
        let stride = n as f64 / (TIMELINE_ROWS - slow_budget) as f64;
        for k in 0..TIMELINE_ROWS - slow_budget {
            keep[order[((k as f64 * stride) as usize).min(n - 1)]] = true;
        }
        (0..n).filter(|&i| keep[i]).collect()
    };
    idx.sort_by(|&a, &b| q.start_s[a].total_cmp(&q.start_s[b]));
    let detail = (n > TIMELINE_ROWS).then(|| {
        let worst = (0..n)
            .max_by(|&a, &b| {
                q.ttft_s[a]
                    .unwrap_or(0.0)
                    .total_cmp(&q.ttft_s[b].unwrap_or(0.0))
            })
            .unwrap_or(0);
        let pos = order.iter().position(|&i| i == worst).unwrap_or(0);
        let lo = pos.saturating_sub(DETAIL_ROWS / 2).min(n - DETAIL_ROWS.min(n));
        let win = &order[lo..(lo + DETAIL_ROWS).min(n)];
        json!({"rows": rows_of(q, win, t), "shown": win.len(), "total": n,
               "from_s": r3(q.start_s[win[0]]), "worst_ttft_ms": q.ttft_s[worst].map(|v| r3(v * 1e3))})
    });
    Some(json!({"rows": rows_of(q, &idx, t), "shown": idx.len(), "total": n, "detail": detail}))
}

/// Time series: completions/s, output tokens/s, in-flight requests, client queue depth.
fn series(run: &Run) -> Option<Value> {
    let q = run.requests.as_ref()?;
    let n = q.len();
    if n == 0 {
        return None;
    }
    let t_end = (0..n).map(|i| q.end_s(i)).fold(0.0, f64::max);
    if t_end <= 0.0 {
        return None;
    }
    // bins of at least 0.25 s, at most SERIES_BINS of them
    let bins = SERIES_BINS.min(((t_end / 0.25).ceil() as usize).max(4));
    let w = t_end / bins as f64;
    let bin = |t: f64| ((t / w) as usize).min(bins - 1);
    let mut done = vec![0f64; bins];
    let mut toks = vec![0f64; bins];
    for i in 0..n {
        if q.ok(i) {
            done[bin(q.end_s(i))] += 1.0;
            let mut t = q.start_s[i] + q.ttft_s[i].unwrap_or(0.0);
            toks[bin(t)] += 1.0;
            for g in &q.itls_s[i] {
                t += g;
                toks[bin(t)] += 1.0;
            }
        }
    }
    // Peak level of a set of intervals within each bin.
    let peak = |iv: &mut Vec<(f64, i64)>| -> Vec<f64> {
        iv.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut out = vec![0f64; bins];
        let mut level = 0i64;
        let mut cur_bin = 0usize;
        for &(t, d) in iv.iter() {
            let b = bin(t.max(0.0));
            while cur_bin < b {
                cur_bin += 1;
                out[cur_bin] = out[cur_bin].max(level as f64);
            }
            level += d;
            out[b] = out[b].max(level as f64);
        }
        out
    };
    let mut inflight: Vec<(f64, i64)> = Vec::with_capacity(2 * n);
    let mut queued: Vec<(f64, i64)> = Vec::new();
    let mut server_queued: Vec<(f64, i64)> = Vec::new();
    for i in 0..n {
        // vLLM reports how long a request queued, not when: placed at its send time.
        if let Some(sq) = q.server_queue_s[i].filter(|v| *v > 0.0) {
            server_queued.push((q.start_s[i], 1));
            server_queued.push((q.start_s[i] + sq, -1));
        }
        inflight.push((q.start_s[i], 1));
        inflight.push((q.end_s(i), -1));
        if let Some(cq) = q.client_queue_s[i].filter(|v| *v > 0.0) {
            queued.push((q.start_s[i] - cq, 1));
            queued.push((q.start_s[i], -1));
        }
    }
    let conc = peak(&mut inflight);
    let qd = peak(&mut queued);
    let sqd = peak(&mut server_queued);
    let times: Vec<f64> = (0..bins).map(|b| r3((b as f64 + 0.5) * w)).collect();
    let per_s = |v: Vec<f64>| -> Vec<f64> { v.into_iter().map(|x| r3(x / w)).collect() };
    // `--scrape-metrics`: the server's own gauges, as [t, value] points (nulls dropped).
    let scraped = |col: &str| -> Value {
        let Some(s) = &run.server_series else {
            return Value::Null;
        };
        let (Some(t), Some(v)) = (s["t"].as_array(), s[col].as_array()) else {
            return Value::Null;
        };
        let pts: Vec<[f64; 2]> = t
            .iter()
            .zip(v)
            .filter_map(|(t, v)| Some([r3(t.as_f64()?), v.as_f64()?]))
            .take(SERIES_BINS * 4)
            .collect();
        if pts.is_empty() {
            Value::Null
        } else {
            json!(pts)
        }
    };
    Some(json!({
        "server_running": scraped("running"),
        "server_waiting": scraped("waiting"),
        "server_kv": scraped("kv_cache_usage"),
        "t": times,
        "completions": per_s(done),
        "tokens": per_s(toks),
        "concurrency": conc,
        "queue": if queued.is_empty() { Value::Null } else { json!(qd) },
        "server_queue": if server_queued.is_empty() { Value::Null } else { json!(sqd) },
    }))
}

fn histogram(v: &[f64]) -> Option<Value> {
    if v.is_empty() {
        return None;
    }
    let max = v.iter().copied().fold(0.0, f64::max).max(1.0);
    let w = (max / HIST_BINS as f64).ceil().max(1.0);
    let mut counts = vec![0u64; HIST_BINS];
    for &x in v {
        counts[((x / w) as usize).min(HIST_BINS - 1)] += 1;
    }
    Some(json!({"width": w, "counts": counts}))
}

fn lengths(run: &Run) -> (Vec<f64>, Vec<f64>) {
    super::workload::lengths(run).unwrap_or_default()
}

/// Client TTFT split into server queue, server TTFT and unattributed time (mean and median of
/// each component over requests with a server TTFT; a server that reports no queue time has
/// its queue wait in the unattributed part: [`crate::metrics::unattributed`]).
fn breakdown(run: &Run) -> Option<Value> {
    let q = run.requests.as_ref()?;
    let mut parts: [Vec<f64>; 4] = Default::default();
    for i in 0..q.len() {
        if !q.ok(i) {
            continue;
        }
        let (Some(t), Some(st)) = (q.ttft_s[i], q.server_ttft_s[i]) else {
            continue;
        };
        let sq = q.server_queue_s[i];
        parts[0].push(sq.unwrap_or(0.0) * 1e3);
        parts[1].push(st * 1e3);
        parts[2].push(crate::metrics::unattributed(t, sq, st) * 1e3);
        parts[3].push(t * 1e3);
    }
    if parts[0].is_empty() {
        return None;
    }
    let stats: Vec<Value> = parts
        .iter()
        .map(|p| {
            let w = Weighted::from_samples(p);
            let qd = w.quad();
            json!([r3(qd.mean), r3(qd.p50), r3(qd.p90), r3(qd.p99)])
        })
        .collect();
    Some(
        json!({"n": parts[0].len(), "queue": stats[0], "server_ttft": stats[1], "unattributed": stats[2], "client_ttft": stats[3]}),
    )
}

/// A metric's row from the file's own statistics (`mean_ttft_ms`, ...), without samples.
fn file_stats_row(run: &Run, m: Metric) -> Option<Value> {
    let k = |s: &str| run.scalar(&format!("{s}_{}_ms", m.key())).map(r3);
    let n = run.scalar(&format!("count_{}", m.key()));
    Some(json!([
        m.label(),
        n,
        k("mean")?,
        k("median"),
        k("p90"),
        k("p99"),
        k("max")
    ]))
}

fn percentile_table(run: &Run) -> (Value, Value) {
    let mut rows = Vec::new();
    let mut cdfs = Vec::new();
    for m in Metric::ALL {
        let Some(w) = run.dist(m) else {
            rows.extend(file_stats_row(run, m)); // an aggregate (AIPerf's): no CDF
            continue;
        };
        let qd = w.quad();
        let approx = run.samples_ms(m).is_none();
        rows.push(json!([
            format!("{}{}", m.label(), if approx { " ~" } else { "" }),
            w.n(),
            r3(qd.mean),
            r3(qd.p50),
            r3(qd.p90),
            r3(qd.p99),
            r3(w.percentile(100.0))
        ]));
        cdfs.push(json!({"key": m.key(), "label": m.label(), "pts": cdf_json(&w)}));
    }
    (Value::Array(rows), Value::Array(cdfs))
}

fn summary(run: &Run) -> Value {
    let mut out = Vec::new();
    for (k, label) in [
        ("completed", "completed"),
        ("failed", "failed"),
        ("duration", "duration (s)"),
        ("request_throughput", "request throughput (req/s)"),
        ("output_throughput", "output throughput (tok/s)"),
        ("total_token_throughput", "total token throughput (tok/s)"),
        ("max_concurrent_requests", "max concurrent requests"),
        ("request_goodput", "request goodput (req/s)"),
        ("server_reported", "requests with server metrics"),
    ] {
        if let Some(v) = run.scalar(k) {
            out.push(json!([label, num(v)]));
        }
    }
    for k in [
        "model_id",
        "target",
        "trace",
        "date",
        "valid",
        "invalid_reason",
        "source",
    ] {
        if let Some(v) = run.info.get(k) {
            out.push(json!([k, v]));
        }
    }
    // --sessions / --probe-request-rate / --scrape-metrics summaries, one row per leaf
    for (k, v) in &run.sections {
        let shown = match v {
            Value::Number(n) => n.as_f64().map_or_else(|| v.clone(), |f| json!(num(f))),
            _ => v.clone(),
        };
        out.push(json!([k, shown]));
    }
    Value::Array(out)
}

/// The report page for one run.
pub fn report_page(run: &Run, thresholds: (f64, f64)) -> String {
    let (pct, cdfs) = percentile_table(run);
    let (isl, osl) = lengths(run);
    let data = json!({
        "page": "report",
        "title": format!("retrace report: {}", run.label()),
        "subtitle": format!("{} · {}", run.kind.as_str(), run.path.display()),
        "thresholds": [thresholds.0, thresholds.1],
        "summary": summary(run),
        "percentiles": pct,
        "cdfs": cdfs,
        "timeline": timeline(run, thresholds),
        "series": series(run),
        "isl": histogram(&isl),
        "osl": histogram(&osl),
        "breakdown": breakdown(run),
    });
    page(&data)
}

/// The comparison page.
pub fn compare_page(cmp: &Comparison, base: &Run, cand: &Run, noise: &[Run]) -> String {
    let rows: Vec<Value> = cmp
        .rows
        .iter()
        .map(|r| {
            let v = match r.verdict {
                Verdict::Worse => "worse",
                v => verdict(v, false),
            };
            json!([
                label(r),
                r.baseline.map(num),
                r.candidate.map(num),
                r.abs_change.map(num),
                r.rel_change.map(|x| format!("{:+.1}%", x * 100.0)),
                r.ci.map(|(a, b)| format!("[{}, {}]", num(a), num(b))),
                v
            ])
        })
        .collect();
    let mut cdfs = Vec::new();
    for m in Metric::ALL {
        let (Some(b), Some(c)) = (base.dist(m), cand.dist(m)) else {
            continue;
        };
        cdfs.push(json!({
            "key": m.key(),
            "label": m.label(),
            "base": cdf_json(&b),
            "cand": cdf_json(&c),
            "noise": noise.first().and_then(|n| n.dist(m)).map(|w| cdf_json(&w)),
        }));
    }
    let mut lens = Vec::new();
    let ((bi, bo), (ci, co)) = (lengths(base), lengths(cand));
    for (key, label, b, c) in [
        ("isl", "input length", bi, ci),
        ("osl", "output length", bo, co),
    ] {
        if b.is_empty() || c.is_empty() {
            continue;
        }
        lens.push(json!({"key": key, "label": label,
            "base": cdf_json(&Weighted::from_samples(&b)), "cand": cdf_json(&Weighted::from_samples(&c))}));
    }
    let paired = cmp.paired.as_ref().map(|p| {
        json!({
            "n": p.n,
            "text": format!("geometric mean ratio {:.3} ({:.0}% CI {:.3}..{:.3}); p10 {:.3}, p50 {:.3}, p90 {:.3}; {:.1}% >10% slower, {:.1}% >10% faster",
                p.geo_mean_ratio, cmp.confidence * 100.0, p.ci.0, p.ci.1, p.p10, p.p50, p.p90, p.slower_10pct * 100.0, p.faster_10pct * 100.0),
            "pts": p.cdf.iter().map(|(x, y)| json!([r3(*x * 1000.0) / 1000.0, r3(*y)])).collect::<Vec<_>>(),
        })
    });
    let text = super::render::render(cmp, &[], super::render::Format::Text);
    let data = json!({
        "page": "compare",
        "title": format!("retrace compare: {} vs {}", base.label(), cand.label()),
        "subtitle": format!("baseline {} · candidate {}{}", base.path.display(), cand.path.display(),
            noise.iter().map(|n| format!(" · noise {}", n.path.display())).collect::<String>()),
        "rows": rows,
        "cdfs": cdfs,
        "paired": paired,
        "lengths": lens,
        "text": text,
        "notes": cmp.notes,
    });
    page(&data)
}

fn page(data: &Value) -> String {
    // `</` inside the JSON would end the script element.
    let json = data.to_string().replace("</", "<\\/");
    let title = data["title"]
        .as_str()
        .unwrap_or("retrace")
        .replace('&', "&amp;")
        .replace('<', "&lt;");
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>\n<style>{CSS}</style></head>\n<body><div id=\"app\"></div>\n<script id=\"retrace-data\" type=\"application/json\">{json}</script>\n<script>{JS}</script>\n</body></html>\n"
    )
}

const CSS: &str = r#"
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,sans-serif;margin:0 24px 40px;color:#222;background:#fff}
h1{font-size:20px;margin:18px 0 2px}h2{font-size:16px;margin:22px 0 6px;border-bottom:1px solid #ddd}
.sub{color:#666;font-size:12px;margin-bottom:8px}
table{border-collapse:collapse;font-size:13px}td,th{padding:2px 10px;border-bottom:1px solid #eee;text-align:right}
td:first-child,th:first-child{text-align:left}
.worse{color:#c0392b;font-weight:600}.better{color:#1e8449;font-weight:600}
.grid{display:flex;flex-wrap:wrap;gap:18px}.card{flex:0 0 auto}
svg text{font-size:11px;fill:#444}.axis line,.axis path{stroke:#999}
.note{color:#7d6608;background:#fef9e7;padding:4px 8px;margin:4px 0}
pre{font-size:12px;background:#f7f7f7;padding:8px;overflow:auto}
.legend span{display:inline-block;margin-right:12px}.sw{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}
#render-error{color:#fff;background:#c0392b;padding:8px}
"#;

const JS: &str = r#"
(function(){
'use strict';
var NS='http://www.w3.org/2000/svg';
var COLORS=['#2e86c1','#e67e22','#7f8c8d','#8e44ad'];
var CLS=['#27ae60','#f1c40f','#e74c3c'];
function h(tag,attrs,parent,text){var e=document.createElement(tag);for(var k in attrs||{})e.setAttribute(k,attrs[k]);if(text!=null)e.textContent=text;if(parent)parent.appendChild(e);return e;}
function s(tag,attrs,parent,text){var e=document.createElementNS(NS,tag);for(var k in attrs||{})e.setAttribute(k,attrs[k]);if(text!=null)e.textContent=text;if(parent)parent.appendChild(e);return e;}
function fmt(v){if(v==null)return '-';var a=Math.abs(v);if(a===0)return '0';var t=a>=1000?v.toFixed(0):a>=100?v.toFixed(1):a>=1?v.toFixed(2):a>=0.001?v.toFixed(4):v.toPrecision(3);return t.indexOf('.')>=0&&t.indexOf('e')<0?t.replace(/0+$/,'').replace(/\.$/,''):t;}
function ticks(lo,hi,n){if(!(hi>lo)){hi=lo+1;}var span=hi-lo,step=Math.pow(10,Math.floor(Math.log10(span/n))),err=span/n/step;if(err>=7.5)step*=10;else if(err>=3.5)step*=5;else if(err>=1.5)step*=2;var out=[];for(var v=Math.ceil(lo/step)*step;v<=hi+step*1e-9;v+=step)out.push(v);return out;}
function section(app,id,title){var sec=h('section',{id:id},app);h('h2',{},sec,title);return sec;}
function card(parent,id){return h('div',{'class':'card',id:id},parent);}
// series: [{name,color,pts:[[x,y]],dash}] ; opts: {w,h,xlabel,ylabel,logx,ymax}
function lineChart(parent,id,title,series,opts){
  opts=opts||{};var W=opts.w||440,H=opts.h||260,L=56,R=12,T=22,B=38;
  var c=card(parent,id);var svg=s('svg',{width:W,height:H,'class':'chart','viewBox':'0 0 '+W+' '+H},c);
  s('text',{x:L,y:14,'font-weight':'600'},svg,title);
  var xs=[],ys=[];series.forEach(function(se){se.pts.forEach(function(p){if(isFinite(p[0]))xs.push(p[0]);if(isFinite(p[1]))ys.push(p[1]);});});
  if(!xs.length){s('text',{x:L,y:H/2},svg,'no data');return svg;}
  var xmin=Math.min.apply(null,xs),xmax=Math.max.apply(null,xs),ymin=0,ymax=opts.ymax!=null?opts.ymax:Math.max.apply(null,ys);
  if(!(ymax>ymin))ymax=ymin+1;
  var logx=opts.logx&&xmin>0&&xmax/xmin>50;
  var fx=logx?function(v){return Math.log10(Math.max(v,xmin));}:function(v){return v;};
  var a=fx(xmin),b=fx(xmax);if(!(b>a))b=a+1;
  var X=function(v){return L+(fx(v)-a)/(b-a)*(W-L-R);},Y=function(v){return H-B-(v-ymin)/(ymax-ymin)*(H-T-B);};
  var ax=s('g',{'class':'axis'},svg);
  s('line',{x1:L,y1:H-B,x2:W-R,y2:H-B},ax);s('line',{x1:L,y1:T,x2:L,y2:H-B},ax);
  var xt=logx?(function(){var o=[];for(var e=Math.floor(a);e<=Math.ceil(b);e++){var v=Math.pow(10,e);if(v>=xmin*0.999&&v<=xmax*1.001)o.push(v);}return o.length>=2?o:[xmin,xmax];})():ticks(xmin,xmax,5);
  xt.forEach(function(v){s('line',{x1:X(v),y1:H-B,x2:X(v),y2:H-B+4},ax);s('text',{x:X(v),y:H-B+15,'text-anchor':'middle'},ax,fmt(v));});
  ticks(ymin,ymax,4).forEach(function(v){s('line',{x1:L-4,y1:Y(v),x2:L,y2:Y(v)},ax);s('line',{x1:L,y1:Y(v),x2:W-R,y2:Y(v),stroke:'#f0f0f0'},ax);s('text',{x:L-6,y:Y(v)+4,'text-anchor':'end'},ax,fmt(v));});
  if(opts.xlabel)s('text',{x:(L+W-R)/2,y:H-6,'text-anchor':'middle'},svg,opts.xlabel+(logx?' (log)':''));
  if(opts.ylabel)s('text',{x:12,y:(T+H-B)/2,transform:'rotate(-90 12 '+((T+H-B)/2)+')','text-anchor':'middle'},svg,opts.ylabel);
  series.forEach(function(se,i){
    var d='';se.pts.forEach(function(p,j){if(isFinite(p[0])&&isFinite(p[1]))d+=(d?'L':'M')+X(p[0]).toFixed(1)+','+Y(p[1]).toFixed(1);});
    var path=s('path',{d:d,fill:'none',stroke:se.color||COLORS[i%4],'stroke-width':1.6},svg);if(se.dash)path.setAttribute('stroke-dasharray','4 3');
  });
  if(series.length>1){series.forEach(function(se,i){var y=T+4+i*14;s('rect',{x:W-R-110,y:y-8,width:10,height:10,fill:se.color||COLORS[i%4]},svg);s('text',{x:W-R-96,y:y+1},svg,se.name);});}
  return svg;
}
function barChart(parent,id,title,hist,xlabel){
  var W=440,H=240,L=56,R=12,T=22,B=38;var c=card(parent,id);
  var svg=s('svg',{width:W,height:H,'class':'chart'},c);s('text',{x:L,y:14,'font-weight':'600'},svg,title);
  var n=hist.counts.length,ymax=Math.max.apply(null,hist.counts)||1,bw=(W-L-R)/n;
  var ax=s('g',{'class':'axis'},svg);s('line',{x1:L,y1:H-B,x2:W-R,y2:H-B},ax);s('line',{x1:L,y1:T,x2:L,y2:H-B},ax);
  hist.counts.forEach(function(v,i){var bh=v/ymax*(H-T-B);s('rect',{x:L+i*bw+0.5,y:H-B-bh,width:Math.max(bw-1,0.5),height:bh,fill:COLORS[0]},svg);});
  ticks(0,n*hist.width,5).forEach(function(v){var x=L+v/hist.width*bw;s('text',{x:x,y:H-B+15,'text-anchor':'middle'},ax,fmt(v));});
  ticks(0,ymax,4).forEach(function(v){var y=H-B-v/ymax*(H-T-B);s('text',{x:L-6,y:y+4,'text-anchor':'end'},ax,fmt(v));});
  s('text',{x:(L+W-R)/2,y:H-6,'text-anchor':'middle'},svg,xlabel);
  return svg;
}
function table(parent,id,head,rows,clsCol){
  var t=h('table',{id:id},parent);var tr=h('tr',{},t);head.forEach(function(x){h('th',{},tr,x);});
  rows.forEach(function(r){var tr=h('tr',{},t);r.forEach(function(x,i){var td=h('td',{},tr,typeof x==='number'?fmt(x):(x==null?'-':String(x)));if(i===clsCol&&(x==='worse'||x==='better'))td.className=x;});});
  return t;
}
function timeline(parent,id,tl,th,note){
  var c=card(parent,id);var rows=tl.rows;
  var t0=rows.length?rows[0][0]:0,tmax=0;rows.forEach(function(r){t0=Math.min(t0,r[0]);tmax=Math.max(tmax,r[0]+r[4]/1000);});tmax-=t0;if(!(tmax>0))tmax=1;
  var W=Math.min(1200,Math.max(700,(window.innerWidth||1000)-60)),L=56,R=12,T=8,B=30;
  var rh=rows.length>600?1:(rows.length>300?2:(rows.length>100?3:5));var H=T+B+rows.length*rh;
  var cv=h('canvas',{width:W,height:H,'data-rows':rows.length},c);var g=cv.getContext('2d');
  g.fillStyle='#fff';g.fillRect(0,0,W,H);
  var X=function(t){return L+(t-t0)/tmax*(W-L-R);};
  rows.forEach(function(r,i){
    var y=T+i*rh,t=r[0];
    if(!r[2]){g.fillStyle='#95a5a6';g.fillRect(X(t),y,Math.max(1,X(t+r[4]/1000)-X(t)),rh);return;}
    var ttft=r[1]||0;g.fillStyle=CLS[ttft<th[0]?0:(ttft<th[1]?1:2)];g.fillRect(X(t),y,Math.max(1,X(t+ttft/1000)-X(t)),rh);
    t+=ttft/1000;var seg=r[3];
    for(var k=0;k<seg.length;k+=2){var d=seg[k]/1000;g.fillStyle=CLS[seg[k+1]];g.globalAlpha=0.6;g.fillRect(X(t),y,Math.max(0.5,X(t+d)-X(t)),rh);g.globalAlpha=1;t+=d;}
  });
  g.strokeStyle='#999';g.beginPath();g.moveTo(L,H-B);g.lineTo(W-R,H-B);g.stroke();g.fillStyle='#444';g.font='11px sans-serif';g.textAlign='center';
  ticks(t0,t0+tmax,8).forEach(function(v){g.fillText(fmt(v),X(v),H-B+14);});g.fillText('time since first request (s)',(L+W-R)/2,H-4);
  var lg=h('div',{'class':'legend'},c);
  [['< '+th[0]+' ms',CLS[0]],[th[0]+'-'+th[1]+' ms',CLS[1]],['>= '+th[1]+' ms',CLS[2]],['failed','#95a5a6']].forEach(function(x){var sp=h('span',{},lg);h('span',{'class':'sw',style:'background:'+x[1]},sp);sp.appendChild(document.createTextNode(x[0]));});
  h('div',{'class':'sub'},c,note+' Solid: TTFT; lighter: inter-token gaps, coloured by the thresholds.');
}
function report(app,D){
  var sum=section(app,'summary','Summary');table(sum,'table-summary',['',''],D.summary);
  var lat=section(app,'latency','Latency');
  table(lat,'table-percentiles',['metric (ms)','n','mean','p50','p90','p99','max'],D.percentiles);
  var g=h('div',{'class':'grid'},lat);
  D.cdfs.forEach(function(c){lineChart(g,'chart-cdf-'+c.key,c.label+' CDF',[{name:c.label,pts:c.pts}],{xlabel:'ms',ylabel:'fraction',logx:true,ymax:1});});
  if(D.timeline){var tl=section(app,'timeline','Timeline');var T=D.timeline;
    timeline(tl,'chart-timeline',T,D.thresholds,'One row per request ('+T.shown+' of '+T.total+' shown'+(T.shown<T.total?': an even sample plus the slowest by E2EL':'')+').');
    if(T.detail){h('h2',{},tl,'Timeline detail: the '+T.detail.shown+' consecutive requests around the worst TTFT ('+fmt(T.detail.worst_ttft_ms)+' ms)');
      timeline(tl,'chart-timeline-detail',T.detail,D.thresholds,'Every request in this window, from '+fmt(T.detail.from_s)+' s.');}}
  if(D.series){var se=section(app,'over-time','Over time');var g2=h('div',{'class':'grid'},se);var S=D.series;
    var z=function(a){return S.t.map(function(t,i){return [t,a[i]];});};
    lineChart(g2,'chart-throughput','Throughput',[{name:'output tok/s',pts:z(S.tokens)}],{xlabel:'s',ylabel:'tokens/s'});
    lineChart(g2,'chart-completions','Completions',[{name:'req/s',pts:z(S.completions)}],{xlabel:'s',ylabel:'requests/s'});
    var cs=[{name:'in flight',pts:z(S.concurrency)}];if(S.queue)cs.push({name:'client queue',pts:z(S.queue),color:COLORS[1]});if(S.server_queue)cs.push({name:'server queue*',pts:z(S.server_queue),color:COLORS[3]});
    if(S.server_running)cs.push({name:'server running',pts:S.server_running,color:COLORS[2],dash:true});if(S.server_waiting)cs.push({name:'server waiting',pts:S.server_waiting,color:COLORS[3],dash:true});
    lineChart(g2,'chart-concurrency','Concurrency and queue depth (peak per bin)',cs,{xlabel:'s',ylabel:'requests'});
    if(S.server_kv)lineChart(g2,'chart-server-kv','Server KV-cache usage (scraped)',[{name:'KV usage',pts:S.server_kv}],{xlabel:'s',ylabel:'fraction'});
    if(S.server_queue)h('div',{'class':'sub'},se,'* server queue depth from each request\'s reported queue time, placed at its send time (the server does not say when it queued).');
    if(S.server_running||S.server_waiting)h('div',{'class':'sub'},se,'Dashed: the server\'s own /metrics gauges, scraped every second (--scrape-metrics).');}
  if(D.isl||D.osl){var ln=section(app,'lengths','Lengths');var g3=h('div',{'class':'grid'},ln);
    if(D.isl)barChart(g3,'chart-isl','Input lengths (ISL)',D.isl,'tokens');if(D.osl)barChart(g3,'chart-osl','Output lengths (OSL)',D.osl,'tokens');}
  if(D.breakdown){var bd=section(app,'breakdown','Server-side breakdown of client TTFT');var B=D.breakdown;
    var c=card(bd,'chart-breakdown');var W=560,H=120,L=70;var svg=s('svg',{width:W,height:H,'class':'chart'},c);
    var parts=[['server queue',B.queue,COLORS[0]],['server TTFT',B.server_ttft,COLORS[1]],['unattributed',B.unattributed,COLORS[2]]];
    var tot=Math.max(B.client_ttft[0],B.client_ttft[1],1e-9);
    ['mean','median'].forEach(function(lbl,j){var y=16+j*40,x=L;s('text',{x:4,y:y+14},svg,lbl);parts.forEach(function(p){var w=Math.max(0,p[1][j])/tot*(W-L-20);s('rect',{x:x,y:y,width:w,height:20,fill:p[2]},svg);x+=w;});s('text',{x:x+4,y:y+14},svg,fmt(B.client_ttft[j])+' ms');});
    var lg=h('div',{'class':'legend'},c);parts.forEach(function(p){var sp=h('span',{},lg);h('span',{'class':'sw',style:'background:'+p[2]},sp);sp.appendChild(document.createTextNode(p[0]));});
    table(bd,'table-breakdown',['component (ms, '+B.n+' requests)','mean','p50','p90','p99'],[['server queue'].concat(B.queue),['server TTFT'].concat(B.server_ttft),['unattributed (client TTFT - queue - server TTFT)'].concat(B.unattributed),['client TTFT'].concat(B.client_ttft)]);
    h('div',{'class':'sub'},bd,'Unattributed time is inside the server but covered by neither metric (e.g. waiting for the engine loop), plus client and network overhead.');}
}
function compare(app,D){
  var t=section(app,'metrics','Metrics');table(t,'table-compare',['metric','baseline','candidate','change','rel','interval of change','verdict'],D.rows,6);
  (D.notes||[]).forEach(function(n){h('div',{'class':'note'},t,n);});
  var cd=section(app,'cdfs','Distributions');var g=h('div',{'class':'grid'},cd);
  if(!D.cdfs.length)h('div',{'class':'sub'},cd,'no data: a side has neither per-request samples nor histograms');
  D.cdfs.forEach(function(c){var se=[{name:'baseline',pts:c.base},{name:'candidate',pts:c.cand}];if(c.noise)se.push({name:'noise',pts:c.noise,dash:true,color:COLORS[2]});
    lineChart(g,'chart-cdf-'+c.key,c.label+' CDF',se,{xlabel:'ms',ylabel:'fraction',logx:true,ymax:1});});
  if(D.lengths&&D.lengths.length){var wl=section(app,'workload','Workload');var g4=h('div',{'class':'grid'},wl);
    D.lengths.forEach(function(c){lineChart(g4,'chart-cdf-'+c.key,c.label+' CDF',[{name:'baseline',pts:c.base},{name:'candidate',pts:c.cand}],{xlabel:'tokens',ylabel:'fraction',logx:true,ymax:1});});}
  if(D.paired){var p=section(app,'paired','Paired per-request TTFT ('+D.paired.n+' requests)');h('div',{'class':'sub'},p,D.paired.text);
    lineChart(p,'chart-paired','candidate / baseline TTFT ratio CDF',[{name:'ratio',pts:D.paired.pts}],{xlabel:'ratio',ylabel:'fraction',logx:true,ymax:1});}
  var tx=section(app,'text','Text report');h('pre',{},tx,D.text);
}
function fail(e){document.body.setAttribute('data-render-error',String(e&&e.message||e));var d=document.getElementById('render-error')||h('div',{id:'render-error'},document.body);d.textContent='report script error: '+(e&&e.message||e);}
window.addEventListener('error',function(ev){fail(ev.error||ev.message);});
try{
  var D=JSON.parse(document.getElementById('retrace-data').textContent);var app=document.getElementById('app');
  h('h1',{},app,D.title);h('div',{'class':'sub'},app,D.subtitle);
  if(D.page==='compare')compare(app,D);else report(app,D);
  var n=document.querySelectorAll('.chart,canvas').length;
  document.body.setAttribute('data-rendered',String(n));h('div',{id:'render-ok',hidden:'hidden'},document.body,'rendered '+n+' charts');
}catch(e){fail(e);}
})();
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::compare::tests::synth_run;

    #[test]
    fn report_page_is_self_contained_and_carries_the_charts() {
        let run = synth_run(300, 80.0, 1);
        let p = report_page(&run, (25.0, 50.0));
        assert!(p.starts_with("<!DOCTYPE html>"));
        for needle in [
            "\"timeline\":{",
            "\"series\":{",
            "\"isl\":{",
            "chart-timeline",
        ] {
            assert!(p.contains(needle), "missing {needle}");
        }
        // No fetches: the only URL is the SVG namespace name.
        for forbidden in [
            "https://",
            "src=",
            "href=",
            "url(",
            "@import",
            "fetch(",
            "XMLHttpRequest",
        ] {
            assert!(!p.contains(forbidden), "page contains {forbidden}");
        }
        assert_eq!(p.matches("http://").count(), 1);
        assert!(p.contains("'http://www.w3.org/2000/svg'"));
    }

    /// A recording's length histograms count what compare's workload counts: side requests left
    /// out, output lengths of the requests that succeeded only.
    #[test]
    fn recording_length_histograms_leave_out_side_requests_and_failures() {
        use crate::trace::{Endpoint, Request, Response, Trace, TraceHeader};
        let req = |input: u64, output: u64, status: u16, method: Option<&str>| Request {
            method: method.map(str::to_string),
            endpoint: Endpoint::Completions,
            input_tokens: input,
            output_tokens: output,
            response: Some(Box::new(Response {
                status,
                ..Default::default()
            })),
            ..Default::default()
        };
        let mut run = synth_run(1, 80.0, 1);
        run.requests = None;
        run.trace = Some(Trace {
            header: TraceHeader::imported(16, false, "test"),
            requests: vec![
                req(10, 5, 200, None),
                req(20, 7, 500, None),
                req(0, 0, 200, Some("GET")),
            ],
        });
        let (isl, osl) = lengths(&run);
        assert_eq!((isl, osl), (vec![10.0, 20.0], vec![5.0]));
    }

    /// Scraped server gauges (`--scrape-metrics`) join the queue-depth chart; nulls are dropped.
    #[test]
    fn scraped_server_gauges_join_the_queue_chart() {
        let mut run = synth_run(50, 80.0, 1);
        assert!(report_page(&run, (25.0, 50.0)).contains("\"server_running\":null"));
        run.server_series = Some(json!({
            "t": [-0.02, 1.0, 2.0],
            "running": [0.0, 4.0, null],
            "waiting": [0.0, 1.0, 0.0],
            "kv_cache_usage": [0.0, 0.5, 0.25],
        }));
        let p = report_page(&run, (25.0, 50.0));
        assert!(
            p.contains("\"server_running\":[[-0.02,0.0],[1.0,4.0]]"),
            "nulls dropped"
        );
        assert!(p.contains("\"server_waiting\":[[-0.02,0.0],[1.0,1.0],[2.0,0.0]]"));
        assert!(p.contains("\"server_kv\":[[-0.02,0.0],[1.0,0.5],[2.0,0.25]]"));
        assert!(p.contains("chart-server-kv"));
    }

    #[test]
    fn timeline_is_downsampled_with_the_slowest_kept() {
        let mut run = synth_run(20_000, 80.0, 2);
        let q = run.requests.as_mut().unwrap();
        q.latency_s[12_345] = Some(99.0);
        let tl = timeline(&run, (25.0, 50.0)).unwrap();
        let rows = tl["rows"].as_array().unwrap();
        assert!(rows.len() <= TIMELINE_ROWS && rows.len() > TIMELINE_ROWS / 2);
        assert_eq!(tl["total"], 20_000);
        // the 99 s request is kept (E2EL 99,000 ms)
        assert!(rows.iter().any(|r| r[4].as_f64() == Some(99_000.0)));
        // the detail window holds consecutive requests around the worst TTFT
        run.requests.as_mut().unwrap().ttft_s[777] = Some(5.0);
        let tl = timeline(&run, (25.0, 50.0)).unwrap();
        let d = &tl["detail"];
        assert_eq!(d["shown"], DETAIL_ROWS);
        assert_eq!(d["worst_ttft_ms"], 5000.0);
        let rows = d["rows"].as_array().unwrap();
        assert!(rows.iter().any(|r| r[1].as_f64() == Some(5000.0)));
    }

    #[test]
    fn script_end_tag_in_data_is_escaped() {
        let p = page(&json!({"title": "x</script><b>", "page": "report"}));
        assert_eq!(p.matches("</script>").count(), 2);
    }
}
