//! `--scrape-metrics`: the server's Prometheus `/metrics` read before, every second during, and
//! after a replay, and what they say about the run.
//!
//! A tokio task GETs the URL once when started (before t0: the "before" point), then at
//! t0 + 1 s, t0 + 2 s, ... until told to stop, then once more (the "after" point). Each exposition
//! is parsed by [`crate::prom`] and reduced to a [`Point`] by [`read_point`] (pure): requests
//! running and waiting, KV-cache usage, prefix-cache hits and queries, prompt and generation
//! tokens, under vLLM's names (V1, then V0's `gpu_` names) or SGLang's where they exist. Counters
//! are summed over label sets (data-parallel engines), KV usage is averaged. [`summarize`]
//! (pure) turns the points into the report: counter deltas after − before (null when a counter is
//! missing, a scrape failed or a counter went backwards, i.e. the server restarted), the achieved
//! prefix-cache hit rate beside the theoretical one (computed by the caller with
//! [`crate::trace::stats::vllm_prefix_cache`]), peaks, and the time series for the result file.
//! A failed scrape is counted and skipped; it never fails the run. Only `http://` URLs.

use super::pool::Pool;
use crate::prom;
use hyper::{HeaderMap, Uri};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Time between scrapes during the run.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// One scrape, reduced to what the report uses. `None` = the server does not expose it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Point {
    /// Seconds from the replay's t0 (negative before it).
    pub t_s: f64,
    pub running: Option<f64>,
    pub waiting: Option<f64>,
    /// KV-cache usage, as the server reports it (vLLM: a fraction 0..1).
    pub kv_usage: Option<f64>,
    pub hits: Option<f64>,
    pub queries: Option<f64>,
    pub prompt_tokens: Option<f64>,
    pub generation_tokens: Option<f64>,
}

fn first_sum(p: &prom::Parsed, names: &[&str]) -> Option<f64> {
    names.iter().find_map(|n| p.sum(n))
}

/// Reads the metrics the report uses from one exposition (pure).
pub fn read_point(p: &prom::Parsed, t_s: f64) -> Point {
    Point {
        t_s,
        running: first_sum(p, &["vllm:num_requests_running", "sglang:num_running_reqs"]),
        waiting: first_sum(p, &["vllm:num_requests_waiting", "sglang:num_queue_reqs"]),
        kv_usage: [
            "vllm:kv_cache_usage_perc",
            "vllm:gpu_cache_usage_perc",
            "sglang:token_usage",
        ]
        .iter()
        .find_map(|n| p.mean(n)),
        hits: first_sum(
            p,
            &[
                "vllm:prefix_cache_hits_total",
                "vllm:gpu_prefix_cache_hits_total",
            ],
        ),
        queries: first_sum(
            p,
            &[
                "vllm:prefix_cache_queries_total",
                "vllm:gpu_prefix_cache_queries_total",
            ],
        ),
        prompt_tokens: first_sum(
            p,
            &["vllm:prompt_tokens_total", "sglang:prompt_tokens_total"],
        ),
        generation_tokens: first_sum(
            p,
            &[
                "vllm:generation_tokens_total",
                "sglang:generation_tokens_total",
            ],
        ),
    }
}

/// Everything the scraper saw.
#[derive(Debug, Clone, Default)]
pub struct Series {
    pub url: String,
    /// Successful scrapes in time order; the first is "before", the last "after" when
    /// `before_ok` / `after_ok`.
    pub points: Vec<Point>,
    pub before_ok: bool,
    pub after_ok: bool,
    pub failed: u64,
    pub last_error: Option<String>,
    /// Lines of the expositions the parser skipped (summed over scrapes).
    pub bad_lines: u64,
}

/// The theoretical prefix-cache counters for what was sent (tokens).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Theory {
    pub hits: u64,
    pub queries: u64,
    pub server_block_size: u32,
}

fn delta(before: Option<f64>, after: Option<f64>) -> Option<f64> {
    let (b, a) = (before?, after?);
    (a >= b).then_some(a - b)
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    let (a, b) = (a?, b?);
    (b > 0.0).then(|| a / b)
}

fn peak(points: &[Point], f: impl Fn(&Point) -> Option<f64>) -> Option<f64> {
    points.iter().filter_map(f).reduce(f64::max)
}

/// The run's server-side report: the result file's `server_metrics` object (pure).
pub fn summarize(s: &Series, theory: &Theory) -> Value {
    let (before, after) = match (s.points.first(), s.points.last()) {
        (Some(b), Some(a)) if s.before_ok && s.after_ok => (Some(b), Some(a)),
        _ => (None, None),
    };
    let d = |f: fn(&Point) -> Option<f64>| delta(before.and_then(f), after.and_then(f));
    let (hits, queries) = (d(|p| p.hits), d(|p| p.queries));
    let th_rate = (theory.queries > 0).then(|| theory.hits as f64 / theory.queries as f64);
    let base_hits = before.and_then(|p| p.hits);
    let base_queries = before.and_then(|p| p.queries);
    let col = |f: &dyn Fn(&Point) -> Option<f64>| -> Value {
        json!(s.points.iter().map(f).collect::<Vec<_>>())
    };
    json!({
        "url": s.url,
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
            "server_block_size": theory.server_block_size,
            "theoretical_hits": theory.hits,
            "theoretical_queries": theory.queries,
            "theoretical_hit_rate": th_rate,
        },
        "prompt_tokens": d(|p| p.prompt_tokens),
        "generation_tokens": d(|p| p.generation_tokens),
        "peak_running": peak(&s.points, |p| p.running),
        "peak_waiting": peak(&s.points, |p| p.waiting),
        "peak_kv_cache_usage": peak(&s.points, |p| p.kv_usage),
        "series": {
            "t": col(&|p| Some(p.t_s)),
            "running": col(&|p| p.running),
            "waiting": col(&|p| p.waiting),
            "kv_cache_usage": col(&|p| p.kv_usage),
            "prefix_cache_hits": col(&|p| delta(base_hits, p.hits)),
            "prefix_cache_queries": col(&|p| delta(base_queries, p.queries)),
        },
    })
}

/// Where to scrape.
pub struct ScrapeTarget {
    pub url: String,
    pool: Pool,
    uri: Uri,
    headers: HeaderMap,
}

impl ScrapeTarget {
    /// `url` = `http://host:port/path`; `headers` go with every GET (the target's, when the URL is
    /// the target's own `/metrics`).
    pub async fn new(
        url: &str,
        headers: HeaderMap,
        ca: Option<&std::path::Path>,
    ) -> Result<ScrapeTarget, String> {
        let uri: Uri = url
            .parse()
            .map_err(|e| format!("--scrape-metrics {url:?} is not a URL: {e}"))?;
        let target = super::target::Target::parse_as(url, HeaderMap::new(), "--scrape-metrics")?;
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
    pub async fn get(&self) -> Result<String, String> {
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
pub struct Scraper {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<(ScrapeTarget, Series)>,
    /// The replay's t0 the series is timed against.
    pub t0: Instant,
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

/// Scrapes once now ("before"), then every [`INTERVAL`] from t0 until [`Scraper::finish`].
/// `t0` = `None`: t0 is set `lead` after the "before" scrape returns (the caller passes
/// [`Scraper::t0`] on to the driver), so a slow first scrape cannot eat into the schedule.
pub async fn start(target: ScrapeTarget, t0: Option<Instant>, lead: Duration) -> Scraper {
    let mut series = Series {
        url: target.url.clone(),
        ..Default::default()
    };
    let taken = Instant::now();
    let probe_t0 = t0.unwrap_or(taken);
    series.before_ok = scrape_into(&target, probe_t0, &mut series).await;
    let t0 = t0.unwrap_or_else(|| Instant::now() + lead);
    if let Some(p) = series.points.first_mut() {
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
    pub async fn finish(self) -> Series {
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
        let sg = prom::parse("sglang:num_running_reqs{tp=\"0\"} 7\nsglang:num_queue_reqs 2\nsglang:token_usage 0.25\n");
        let p = read_point(&sg, 0.0);
        assert_eq!(
            (p.running, p.waiting, p.kv_usage, p.hits),
            (Some(7.0), Some(2.0), Some(0.25), None)
        );
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
