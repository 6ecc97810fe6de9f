//! `--scrape-metrics`: the server's Prometheus `/metrics` read before, every second during, and
//! after a replay, and what they say about the run.
//!
//! [`before`] GETs the URL once, before the replay opens its warm connections (retried once
//! after a failure); [`start`] then spawns a task that GETs it at t0 + 1 s, t0 + 2 s, ... until
//! told to stop, then once more (the "after" point). Each exposition is parsed by [`crate::wire::prom`]
//! and reduced to a [`Point`] by [`read_point`] (pure) under its server [`Family`]'s names
//! ([`FAMILIES`]: vLLM, SGLang, llama.cpp): requests running and waiting, KV-cache usage,
//! prefix-cache hits and queries, prompt and generation tokens, the server's TTFT histogram.
//! Counters are summed over label sets (data-parallel engines), KV usage is averaged.
//! [`summarize`] (pure) turns the points into the report: the family (or the names seen when no
//! family is known), counter deltas after − before (null when a counter is missing, a scrape
//! failed or a counter went backwards, i.e. the server restarted), the achieved prefix-cache hit
//! rate beside the theoretical one (computed by the caller with
//! [`crate::trace::stats::vllm_prefix_cache`]), peaks, and the time series for the result file.
//! A failed scrape is counted and skipped; it never fails the run. Only `http://` URLs.

use crate::replay::http::pool::Pool;
use crate::wire::prom;
use hyper::{HeaderMap, Uri};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Time between scrapes during the run.
pub(crate) const INTERVAL: Duration = Duration::from_secs(1);

/// One scrape, reduced to what the report uses. `None` = the server does not expose it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Point {
    /// Seconds from the replay's t0 (negative before it).
    pub(crate) t_s: f64,
    pub(crate) running: Option<f64>,
    pub(crate) waiting: Option<f64>,
    /// KV-cache usage, as the server reports it (vLLM: a fraction 0..1).
    pub(crate) kv_usage: Option<f64>,
    pub(crate) hits: Option<f64>,
    pub(crate) queries: Option<f64>,
    pub(crate) prompt_tokens: Option<f64>,
    pub(crate) generation_tokens: Option<f64>,
    /// The server's TTFT histogram: `_sum` (s) and `_count`.
    pub(crate) ttft_sum: Option<f64>,
    pub(crate) ttft_count: Option<f64>,
    /// The KV block size the server publishes (vLLM's `vllm:cache_config_info{block_size}`).
    pub(crate) block_size: Option<u32>,
}

/// Largest published block size believed (a larger label is not a block size).
const MAX_BLOCK: u32 = 1 << 16;

/// The block size in `vllm:cache_config_info`'s `block_size` label, when it is a sane one.
fn published_block_size(p: &prom::Parsed) -> Option<u32> {
    p.family("vllm:cache_config_info")
        .find_map(|s| s.label("block_size")?.parse::<u32>().ok())
        .filter(|b| (1..=MAX_BLOCK).contains(b))
}

/// A figure's names in one family: alternatives tried in order, each the sum of its names (all
/// present). Empty: the family does not expose it.
type Names = &'static [&'static [&'static str]];

/// One server family's metric names for the figures the report uses (the table in
/// docs/result-format.md).
pub(crate) struct Family {
    pub(crate) name: &'static str,
    /// Every metric of the family starts with it; the first family with a sample so named is
    /// the server's.
    prefix: &'static str,
    running: Names,
    waiting: Names,
    /// Averaged over label sets, not summed.
    kv_usage: &'static [&'static str],
    hits: Names,
    queries: Names,
    prompt_tokens: Names,
    generation_tokens: Names,
    /// A histogram's base name (`_sum`, `_count`).
    ttft: Option<&'static str>,
}

/// vLLM (V1, then V0's `gpu_` names), SGLang, llama.cpp.
pub(crate) const FAMILIES: [Family; 3] = [
    Family {
        name: "vLLM",
        prefix: "vllm:",
        running: &[&["vllm:num_requests_running"]],
        waiting: &[&["vllm:num_requests_waiting"]],
        kv_usage: &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
        hits: &[
            &["vllm:prefix_cache_hits_total"],
            &["vllm:gpu_prefix_cache_hits_total"],
        ],
        queries: &[
            &["vllm:prefix_cache_queries_total"],
            &["vllm:gpu_prefix_cache_queries_total"],
        ],
        prompt_tokens: &[&["vllm:prompt_tokens_total"]],
        generation_tokens: &[&["vllm:generation_tokens_total"]],
        ttft: Some("vllm:time_to_first_token_seconds"),
    },
    Family {
        name: "SGLang",
        prefix: "sglang:",
        running: &[&["sglang:num_running_reqs"]],
        waiting: &[&["sglang:num_queue_reqs"]],
        kv_usage: &["sglang:token_usage"],
        hits: &[&["sglang:cached_tokens_total"]],
        queries: &[&["sglang:prompt_tokens_total"]],
        prompt_tokens: &[&["sglang:prompt_tokens_total"]],
        generation_tokens: &[&["sglang:generation_tokens_total"]],
        ttft: Some("sglang:time_to_first_token_seconds"),
    },
    Family {
        name: "llama.cpp",
        prefix: "llamacpp:",
        running: &[&["llamacpp:requests_processing"]],
        waiting: &[&["llamacpp:requests_deferred"]],
        kv_usage: &[],
        hits: &[&["llamacpp:prompt_tokens_cached_total"]],
        // `prompt_tokens_total` leaves the cached tokens out
        queries: &[&[
            "llamacpp:prompt_tokens_total",
            "llamacpp:prompt_tokens_cached_total",
        ]],
        prompt_tokens: &[&[
            "llamacpp:prompt_tokens_total",
            "llamacpp:prompt_tokens_cached_total",
        ]],
        generation_tokens: &[&["llamacpp:tokens_predicted_total"]],
        ttft: None,
    },
];

impl Family {
    /// The summary's figures this family has no metric for.
    fn unexposed(&self) -> Vec<&'static str> {
        [
            ("kv_cache_usage", self.kv_usage.is_empty()),
            ("mean_server_ttft_ms", self.ttft.is_none()),
        ]
        .iter()
        .filter(|(_, missing)| *missing)
        .map(|(k, _)| *k)
        .collect()
    }
}

fn read(p: &prom::Parsed, names: Names) -> Option<f64> {
    names
        .iter()
        .find_map(|sum| sum.iter().map(|n| p.sum(n)).sum::<Option<f64>>())
}

/// The family of an exposition: the first of [`FAMILIES`] with a sample under its prefix.
pub(crate) fn family(p: &prom::Parsed) -> Option<&'static Family> {
    FAMILIES
        .iter()
        .find(|f| p.samples.iter().any(|s| s.name.starts_with(f.prefix)))
}

/// Reads the metrics the report uses from one exposition, under its family's names (pure).
pub(crate) fn read_point(p: &prom::Parsed, t_s: f64) -> Point {
    let Some(f) = family(p) else {
        return Point {
            t_s,
            ..Default::default()
        };
    };
    let hist = |suffix: &str| f.ttft.and_then(|h| p.sum(&format!("{h}{suffix}")));
    Point {
        t_s,
        running: read(p, f.running),
        waiting: read(p, f.waiting),
        kv_usage: f.kv_usage.iter().find_map(|n| p.mean(n)),
        hits: read(p, f.hits),
        queries: read(p, f.queries),
        prompt_tokens: read(p, f.prompt_tokens),
        generation_tokens: read(p, f.generation_tokens),
        ttft_sum: hist("_sum"),
        ttft_count: hist("_count"),
        block_size: published_block_size(p),
    }
}

/// The first `n` distinct sample names of an exposition (for "no family known").
fn names_seen(p: &prom::Parsed, n: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for s in &p.samples {
        if out.len() == n {
            break;
        }
        if !out.contains(&s.name) {
            out.push(s.name.clone());
        }
    }
    out
}

/// Everything the scraper saw.
#[derive(Debug, Clone, Default)]
pub(crate) struct Series {
    pub(crate) url: String,
    /// Successful scrapes in time order; the first is "before", the last "after" when
    /// `before_ok` / `after_ok`.
    pub(crate) points: Vec<Point>,
    pub(crate) before_ok: bool,
    pub(crate) after_ok: bool,
    pub(crate) failed: u64,
    pub(crate) last_error: Option<String>,
    /// Lines of the expositions the parser skipped (summed over scrapes).
    pub(crate) bad_lines: u64,
    /// The server's family, from the first scrape that showed one.
    pub(crate) family: Option<&'static Family>,
    /// While no family is known: a few metric names the last successful scrape held.
    pub(crate) seen: Vec<String>,
}

impl std::fmt::Debug for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// The theoretical prefix-cache counters for what was sent (tokens).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Theory {
    pub(crate) hits: u64,
    pub(crate) queries: u64,
    pub(crate) server_block_size: u32,
    /// The hits at each of [`crate::trace::stats::SERVER_BLOCKS`] (none without a theory).
    pub(crate) hits_at: Option<[u64; crate::trace::stats::SERVER_BLOCKS.len()]>,
    /// The plan had more distinct id prefixes than are kept ([`crate::trace::stats::PREFIX_NODES`]):
    /// the hits are a lower bound.
    pub(crate) lower_bound: bool,
}

fn delta(before: Option<f64>, after: Option<f64>) -> Option<f64> {
    let (b, a) = (before?, after?);
    (a >= b).then_some(a - b)
}

/// A counter's growth from `before` to `p`: absent before but present later counts from 0 (a
/// labelled counter appears on first use, as SGLang's `cached_tokens_total`).
fn grew(before: Option<&Point>, p: Option<&Point>, f: fn(&Point) -> Option<f64>) -> Option<f64> {
    let after = p.and_then(f)?;
    delta(Some(f(before?).unwrap_or(0.0)), Some(after))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    let (a, b) = (a?, b?);
    (b > 0.0).then(|| a / b)
}

fn peak(points: &[Point], f: impl Fn(&Point) -> Option<f64>) -> Option<f64> {
    points.iter().filter_map(f).reduce(f64::max)
}

/// The server block size theory is judged at, its theoretical hits, and where the size came
/// from: the one the server publishes when theory was counted at it (`"server"`), else
/// `--server-block-size` (`"flag"`).
fn server_block(s: &Series, theory: &Theory) -> (u32, u64, &'static str) {
    let published = s.points.iter().find_map(|p| p.block_size);
    let at = |b: u32| {
        let k = crate::trace::stats::SERVER_BLOCKS
            .iter()
            .position(|&x| x == u64::from(b))?;
        Some(theory.hits_at?[k])
    };
    match published {
        Some(b) if b == theory.server_block_size => (b, theory.hits, "server"),
        Some(b) => match at(b) {
            Some(h) => (b, h, "server"),
            None => (theory.server_block_size, theory.hits, "flag"),
        },
        None => (theory.server_block_size, theory.hits, "flag"),
    }
}

/// The run's server-side report: the result file's `server_metrics` object (pure).
pub(crate) fn summarize(s: &Series, theory: &Theory) -> Value {
    let (before, after) = match (s.points.first(), s.points.last()) {
        (Some(b), Some(a)) if s.before_ok && s.after_ok => (Some(b), Some(a)),
        _ => (None, None),
    };
    let d = |f: fn(&Point) -> Option<f64>| grew(before, after, f);
    let (hits, queries) = (d(|p| p.hits), d(|p| p.queries));
    let (block, theory_hits, source) = server_block(s, theory);
    let th_rate = (theory.queries > 0).then(|| theory_hits as f64 / theory.queries as f64);
    let ttft_ms = ratio(d(|p| p.ttft_sum), d(|p| p.ttft_count)).map(|s| s * 1e3);
    let first = s.points.first().filter(|_| s.before_ok);
    let col = |f: &dyn Fn(&Point) -> Option<f64>| -> Value {
        json!(s.points.iter().map(f).collect::<Vec<_>>())
    };
    let since = |f: fn(&Point) -> Option<f64>| col(&|p| grew(first, Some(p), f));
    json!({
        "url": s.url,
        "family": s.family.map(|f| f.name),
        "unexposed": s.family.map(Family::unexposed),
        "seen_names": s.family.is_none().then_some(&s.seen),
        "interval_s": INTERVAL.as_secs_f64(),
        "scrapes": s.points.len(),
        "failed_scrapes": s.failed,
        "last_error": s.last_error,
        "bad_lines": s.bad_lines,
        "before_ok": s.before_ok,
        "after_ok": s.after_ok,
        "prefix_cache": {
            "hits": hits,
            "queries": queries,
            "hit_rate": ratio(hits, queries),
            "server_block_size": block,
            "server_block_size_from": source,
            "theoretical_hits": theory_hits,
            "theoretical_queries": theory.queries,
            "theoretical_hit_rate": th_rate,
            "theoretical_lower_bound": theory.lower_bound,
        },
        "prompt_tokens": d(|p| p.prompt_tokens),
        "generation_tokens": d(|p| p.generation_tokens),
        "peak_running": peak(&s.points, |p| p.running),
        "peak_waiting": peak(&s.points, |p| p.waiting),
        "peak_kv_cache_usage": peak(&s.points, |p| p.kv_usage),
        "mean_server_ttft_ms": ttft_ms,
        "series": {
            "t": col(&|p| Some(p.t_s)),
            "running": col(&|p| p.running),
            "waiting": col(&|p| p.waiting),
            "kv_cache_usage": col(&|p| p.kv_usage),
            "prefix_cache_hits": since(|p| p.hits),
            "prefix_cache_queries": since(|p| p.queries),
        },
    })
}

/// Where to scrape.
pub(crate) struct ScrapeTarget {
    pub(crate) url: String,
    pool: Pool,
    uri: Uri,
    headers: HeaderMap,
}

impl ScrapeTarget {
    /// `url` = `http://host:port/path`; `headers` go with every GET (the target's, when the URL is
    /// the target's own `/metrics`).
    pub(crate) async fn new(
        url: &str,
        headers: HeaderMap,
        ca: Option<&std::path::Path>,
    ) -> Result<ScrapeTarget, String> {
        let uri: Uri = url
            .parse()
            .map_err(|e| format!("--scrape-metrics {url:?} is not a URL: {e}"))?;
        let target = crate::replay::http::target::Target::parse_as(
            url,
            HeaderMap::new(),
            "--scrape-metrics",
        )?;
        let path: Uri = uri
            .path_and_query()
            .map_or("/metrics", |p| {
                if p.as_str() == "/" {
                    "/metrics"
                } else {
                    p.as_str()
                }
            })
            .parse()
            .map_err(|e| format!("--scrape-metrics {url}: {e}"))?;
        let pool = Pool::new(&target, ca)
            .await
            .map_err(|e| format!("--scrape-metrics {url}: {e}"))?;
        Ok(ScrapeTarget {
            url: url.to_string(),
            pool,
            uri: path,
            headers,
        })
    }

    /// One GET; the body as text.
    pub(crate) async fn get(&self) -> Result<String, String> {
        let path = self.uri.path_and_query().map_or("/metrics", |p| p.as_str());
        let (status, body) = self
            .pool
            .get(path, &self.headers, Duration::from_secs(5), 64 << 20)
            .await?;
        if !(200..300).contains(&status) {
            return Err(format!("HTTP {status}"));
        }
        String::from_utf8(body).map_err(|_| "the body is not UTF-8".to_string())
    }
}

/// A running scraper (see the module docs).
pub(crate) struct Scraper {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<(ScrapeTarget, Series)>,
    /// The replay's t0 the series is timed against.
    pub(crate) t0: Instant,
}

fn t_s(t0: Instant) -> f64 {
    let now = Instant::now();
    if now >= t0 {
        (now - t0).as_secs_f64()
    } else {
        -(t0 - now).as_secs_f64()
    }
}

async fn scrape_into(target: &ScrapeTarget, t0: Instant, s: &mut Series) -> bool {
    let t = t_s(t0);
    match target.get().await {
        Ok(text) => {
            let p = prom::parse(&text);
            s.bad_lines += p.bad_lines.len() as u64;
            s.family = s.family.or_else(|| family(&p));
            if s.family.is_none() {
                s.seen = names_seen(&p, 5);
            }
            s.points.push(read_point(&p, t));
            true
        }
        Err(e) => {
            s.failed += 1;
            s.last_error = Some(e);
            false
        }
    }
}

/// The "before" point and where to scrape next.
pub(crate) struct Before {
    target: ScrapeTarget,
    series: Series,
    taken: Instant,
}

/// Takes the "before" point now, retried once after a failure (a timeout or an error). The
/// caller does it before opening the replay's warm connections, which can keep a server with
/// few HTTP threads (llama.cpp: 8 by default) from answering in time.
pub(crate) async fn before(target: ScrapeTarget) -> Before {
    let mut series = Series {
        url: target.url.clone(),
        ..Default::default()
    };
    let taken = Instant::now();
    series.before_ok = scrape_into(&target, taken, &mut series).await
        || scrape_into(&target, taken, &mut series).await;
    Before {
        target,
        series,
        taken,
    }
}

/// Scrapes every [`INTERVAL`] from t0 until [`Scraper::finish`], after the [`before`] point.
/// `t0` = `None`: t0 is set `lead` from now (the caller passes [`Scraper::t0`] on to the
/// driver).
pub(crate) fn start(b: Before, t0: Option<Instant>, lead: Duration) -> Scraper {
    let Before {
        target,
        mut series,
        taken,
    } = b;
    let t0 = t0.unwrap_or_else(|| Instant::now() + lead);
    if let Some(p) = series.points.first_mut().filter(|_| series.before_ok) {
        p.t_s = -(t0.saturating_duration_since(taken)).as_secs_f64();
    }
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(async move {
        let mut k = 1u32;
        loop {
            let at = tokio::time::Instant::from_std(t0 + INTERVAL * k);
            tokio::select! {
                _ = tokio::time::sleep_until(at) => {}
                _ = stopped.changed() => break,
            }
            scrape_into(&target, t0, &mut series).await;
            k += 1;
        }
        (target, series)
    });
    Scraper { stop, task, t0 }
}

impl Scraper {
    /// Stops the periodic scrapes and takes the "after" point.
    pub(crate) async fn finish(self) -> Series {
        let _ = self.stop.send(true);
        match self.task.await {
            Ok((target, mut series)) => {
                series.after_ok = scrape_into(&target, self.t0, &mut series).await;
                series
            }
            Err(e) => Series {
                failed: 1,
                last_error: Some(format!("scraper task: {e}")),
                ..Default::default()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pt(t: f64, hits: f64, queries: f64, running: f64) -> Point {
        Point {
            t_s: t,
            running: Some(running),
            waiting: Some(0.0),
            kv_usage: Some(running / 10.0),
            hits: Some(hits),
            queries: Some(queries),
            prompt_tokens: Some(queries),
            generation_tokens: None,
            ..Default::default()
        }
    }

    #[test]
    fn reads_vllm_v1_v0_and_sglang_names() {
        let v1 = prom::parse(include_str!(
            "../../fixtures/vllm/metrics_prefix_cache_before_after.txt"
        ));
        // the fixture holds three scrapes: sums add them, but the names resolve
        let p = read_point(&v1, 1.0);
        assert_eq!(p.hits, Some(1920.0));
        assert_eq!(p.queries, Some(33.0 + 2081.0 + 4129.0));
        assert_eq!(p.running, None);
        let v0 = prom::parse(
            "vllm:gpu_prefix_cache_hits_total{e=\"0\"} 5\nvllm:gpu_prefix_cache_queries_total 9\nvllm:gpu_cache_usage_perc 0.5\nvllm:num_requests_running 3\nvllm:num_requests_waiting 1\n",
        );
        let p = read_point(&v0, 0.0);
        assert_eq!(
            (p.hits, p.queries, p.kv_usage, p.running, p.waiting),
            (Some(5.0), Some(9.0), Some(0.5), Some(3.0), Some(1.0))
        );
        let sg = prom::parse("sglang:num_running_reqs{tp=\"0\"} 7\nsglang:num_queue_reqs 2\nsglang:token_usage 0.25\nsglang:prompt_tokens_total 100\nsglang:cached_tokens_total{cache_source=\"device\"} 30\nsglang:cached_tokens_total{cache_source=\"host\"} 10\nsglang:time_to_first_token_seconds_sum 0.5\nsglang:time_to_first_token_seconds_count 4\n");
        assert_eq!(family(&sg).map(|f| f.name), Some("SGLang"));
        let p = read_point(&sg, 0.0);
        assert_eq!(
            (p.running, p.waiting, p.kv_usage, p.hits, p.queries),
            (Some(7.0), Some(2.0), Some(0.25), Some(40.0), Some(100.0))
        );
        assert_eq!((p.ttft_sum, p.ttft_count), (Some(0.5), Some(4.0)));
        assert_eq!(family(&v1).map(|f| f.name), Some("vLLM"));
    }

    /// A real llama-server's /metrics (fixtures/llamacpp: 3 requests, the second a repeat).
    #[test]
    fn reads_llamacpp_names() {
        let p = prom::parse(include_str!("../../fixtures/llamacpp/metrics.txt"));
        assert!(p.bad_lines.is_empty());
        assert_eq!(family(&p).map(|f| f.name), Some("llama.cpp"));
        let pt = read_point(&p, 0.0);
        assert_eq!(pt.hits, Some(47.0));
        assert_eq!(pt.queries, Some(61.0 + 47.0), "processed + cached");
        assert_eq!(pt.prompt_tokens, Some(108.0), "48 + 48 + 12 sent");
        assert_eq!(pt.generation_tokens, Some(11.0));
        assert_eq!((pt.running, pt.waiting), (Some(0.0), Some(0.0)));
        assert_eq!((pt.kv_usage, pt.ttft_sum), (None, None));
        let s = Series {
            points: vec![
                Point {
                    hits: Some(0.0),
                    queries: Some(0.0),
                    ..pt.clone()
                },
                pt,
            ],
            before_ok: true,
            after_ok: true,
            family: family(&p),
            ..Default::default()
        };
        let v = summarize(&s, &Theory::default());
        assert_eq!(v["family"], "llama.cpp");
        assert_eq!(
            v["unexposed"],
            json!(["kv_cache_usage", "mean_server_ttft_ms"])
        );
        assert_eq!(v["seen_names"], Value::Null);
        assert_eq!(v["prefix_cache"]["hits"], 47.0);
    }

    /// Names of no known family: every figure is null and a few of the names are kept.
    #[test]
    fn unknown_names_are_listed() {
        let p = prom::parse("process_cpu_seconds_total 3\nhttp_requests_total{code=\"200\"} 5\nhttp_requests_total{code=\"500\"} 1\ntgi_queue_size 0\n");
        assert!(family(&p).is_none());
        let pt = read_point(&p, 0.0);
        assert_eq!(pt, Point::default());
        assert_eq!(
            names_seen(&p, 5),
            [
                "process_cpu_seconds_total",
                "http_requests_total",
                "tgi_queue_size"
            ]
        );
        assert_eq!(names_seen(&p, 2).len(), 2);
        let s = Series {
            points: vec![pt.clone(), pt],
            before_ok: true,
            after_ok: true,
            seen: names_seen(&p, 5),
            ..Default::default()
        };
        let v = summarize(&s, &Theory::default());
        assert_eq!(v["family"], Value::Null);
        assert_eq!(v["seen_names"][2], "tgi_queue_size");
        assert_eq!(v["prefix_cache"]["hit_rate"], Value::Null);
    }

    /// A labelled counter appears on first use: absent before, present after counts from 0.
    #[test]
    fn a_counter_absent_before_counts_from_zero() {
        let before = Point {
            queries: Some(10.0),
            ..Default::default()
        };
        let after = Point {
            hits: Some(4.0),
            queries: Some(30.0),
            ttft_sum: Some(0.3),
            ttft_count: Some(3.0),
            ..Default::default()
        };
        let s = Series {
            points: vec![before, after],
            before_ok: true,
            after_ok: true,
            ..Default::default()
        };
        let v = summarize(&s, &Theory::default());
        assert_eq!(v["prefix_cache"]["hits"], 4.0);
        assert_eq!(v["prefix_cache"]["queries"], 20.0);
        assert_eq!(v["prefix_cache"]["hit_rate"], 0.2);
        assert_eq!(v["series"]["prefix_cache_hits"], json!([null, 4.0]));
        assert!((v["mean_server_ttft_ms"].as_f64().unwrap() - 100.0).abs() < 1e-9);
    }

    #[test]
    fn summary_takes_deltas_and_keeps_the_series() {
        let s = Series {
            url: "http://x/metrics".into(),
            points: vec![
                pt(-0.01, 100.0, 1000.0, 0.0),
                pt(1.0, 150.0, 1500.0, 4.0),
                pt(2.0, 400.0, 2000.0, 2.0),
            ],
            before_ok: true,
            after_ok: true,
            ..Default::default()
        };
        let th = Theory {
            hits: 320,
            queries: 1000,
            server_block_size: 16,
            lower_bound: false,
            hits_at: None,
        };
        let v = summarize(&s, &th);
        let pc = &v["prefix_cache"];
        assert_eq!(pc["hits"], 300.0);
        assert_eq!(pc["queries"], 1000.0);
        assert_eq!(pc["hit_rate"], 0.3);
        assert_eq!(pc["theoretical_hit_rate"], 0.32);
        assert_eq!(pc["server_block_size"], 16);
        assert_eq!(v["peak_running"], 4.0);
        assert_eq!(v["generation_tokens"], Value::Null);
        assert_eq!(v["series"]["prefix_cache_hits"], json!([0.0, 50.0, 300.0]));
        assert_eq!(v["series"]["running"], json!([0.0, 4.0, 2.0]));
        assert_eq!(v["series"]["t"][0], -0.01);
    }

    /// vLLM on CPU runs 128-token blocks while `--server-block-size` defaults to 16: the block
    /// size the server publishes is the one theory is judged at.
    #[test]
    fn theory_is_judged_at_the_block_size_the_server_publishes() {
        let text = "vllm:cache_config_info{block_size=\"128\",enable_prefix_caching=\"True\"} 1.0\nvllm:num_requests_running 0\n";
        let p = prom::parse(text);
        assert_eq!(read_point(&p, 0.0).block_size, Some(128));
        let mut at = [0u64; crate::trace::stats::SERVER_BLOCKS.len()];
        at[4] = 256; // SERVER_BLOCKS[4] is 128
        let th = Theory {
            hits: 320,
            queries: 1000,
            server_block_size: 16,
            lower_bound: false,
            hits_at: Some(at),
        };
        let mut s = Series {
            points: vec![read_point(&p, -0.01), read_point(&p, 1.0)],
            before_ok: true,
            after_ok: true,
            ..Default::default()
        };
        let pc = summarize(&s, &th)["prefix_cache"].clone();
        assert_eq!(pc["server_block_size"], 128);
        assert_eq!(pc["server_block_size_from"], "server");
        assert_eq!(pc["theoretical_hits"], 256);
        // A server that does not say: the flag's.
        s.points.iter_mut().for_each(|p| p.block_size = None);
        let pc = summarize(&s, &th)["prefix_cache"].clone();
        assert_eq!(
            (
                pc["server_block_size"].clone(),
                pc["theoretical_hits"].clone()
            ),
            (json!(16), json!(320))
        );
        assert_eq!(pc["server_block_size_from"], "flag");
        let absurd = prom::parse("vllm:cache_config_info{block_size=\"99999999\"} 1\n");
        assert_eq!(read_point(&absurd, 0.0).block_size, None);
    }

    #[test]
    fn missing_before_or_a_restart_gives_null_deltas() {
        let mut s = Series {
            points: vec![pt(0.0, 100.0, 1000.0, 0.0), pt(1.0, 5.0, 50.0, 1.0)],
            before_ok: true,
            after_ok: true,
            ..Default::default()
        };
        let v = summarize(&s, &Theory::default());
        assert_eq!(v["prefix_cache"]["hits"], Value::Null, "counter went back");
        assert_eq!(v["prefix_cache"]["theoretical_hit_rate"], Value::Null);
        s.points[1] = pt(1.0, 200.0, 2000.0, 1.0);
        s.before_ok = false;
        let v = summarize(&s, &Theory::default());
        assert_eq!(v["prefix_cache"]["hit_rate"], Value::Null);
    }
}
