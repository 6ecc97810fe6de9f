//! The `inspect` command: streams a trace through [`crate::trace::stats::StatsAcc`], renders text
//! or JSON.
//!
//! The JSON form is `{"file", "format_note", "import": {...}, "stats": TraceStats}` as documented
//! in `docs/inspect-json.md`; a test holds it to that schema.

use crate::trace::import::ImportOptions;
use crate::trace::stats::{Dist, StatsAcc, StatsOptions, TraceStats, MAX_CACHE_BLOCKS};
use anyhow::Result;
use serde_json::json;
use std::fmt::Write as _;
use std::path::PathBuf;

/// What `inspect` reads and reports.
#[derive(Debug, Clone, Default)]
pub struct InspectOptions {
    /// Trace files; several are merged by wall clock as they are read.
    pub(crate) files: Vec<PathBuf>,
    pub(crate) import: ImportOptions,
    /// JSON (docs/inspect-json.md) instead of text.
    pub(crate) json: bool,
    /// The simulated LRU cache and the block size of the prefix statistics.
    pub(crate) stats: StatsOptions,
}

/// Runs `inspect`, returning what to print.
pub fn run(opts: &InspectOptions) -> Result<String> {
    if opts.stats.block_size == Some(0) {
        anyhow::bail!("--block-size must be at least 1");
    }
    if let Some(n) = opts.stats.cache_blocks.filter(|&n| n > MAX_CACHE_BLOCKS) {
        anyhow::bail!(
            "--cache-blocks {n}: at most {MAX_CACHE_BLOCKS} blocks (the simulated LRU cache is held in memory)"
        );
    }
    let stream = crate::trace::fleet::open_all(&opts.files, &opts.import)?;
    let name = crate::trace::fleet::names(&opts.files);
    let mut acc = StatsAcc::new(&stream.header, &opts.stats);
    let (header, rep) = (stream.header.clone(), stream.report.clone());
    let mut copies = Copies::new(&header);
    for r in stream {
        let r = r?;
        copies.push(&r);
        acc.push(&r);
    }
    let stats = acc.finish();
    if opts.json {
        let v = json!({
            "file": name,
            "source": header.source,
            "hash_scheme": header.hash_scheme,
            "import": {
                "rows": rep.rows,
                "skipped": rep.skipped,
                "reordered": rep.reordered,
                "damage": rep.damage,
            },
            "stats": stats,
        });
        return Ok(serde_json::to_string_pretty(&v)? + "\n");
    }
    let mut s = String::new();
    writeln!(s, "{name}  ({})", header.source)?;
    if rep.skipped > 0 {
        writeln!(s, "skipped {} malformed rows", rep.skipped)?;
    }
    // A recording is written in completion order: records out of arrival order are expected.
    if rep.reordered > 0 && !header.in_completion_order() {
        writeln!(s, "{} rows were out of time order (sorted)", rep.reordered)?;
    }
    if let Some(d) = &rep.damage {
        writeln!(s, "damaged file: {d}")?;
    }
    s.push_str(&render(&stats));
    for line in copies.lines() {
        writeln!(s, "{line}")?;
    }
    Ok(s)
}

/// A shadowed recording's copies, counted per target (`record --shadow`).
struct Copies {
    targets: Vec<(crate::trace::shadow::Role, String)>,
    /// Per target: copies, skipped, failed (a copy sent that did not complete).
    counts: Vec<[u64; 3]>,
}

impl Copies {
    fn new(header: &crate::trace::TraceHeader) -> Copies {
        let targets = crate::trace::shadow::targets(&header.meta);
        let counts = vec![[0; 3]; targets.len()];
        Copies { targets, counts }
    }

    fn push(&mut self, r: &crate::trace::Request) {
        for c in &r.shadows {
            let Some(n) = self.counts.get_mut(usize::from(c.target)) else {
                continue;
            };
            n[0] += 1;
            match (&c.skipped, c.response.as_deref()) {
                (Some(_), _) | (None, None) => n[1] += 1,
                (None, Some(resp)) if !resp.completed() => n[2] += 1,
                _ => {}
            }
        }
    }

    fn lines(&self) -> Vec<String> {
        let per = self.targets.iter().zip(&self.counts).enumerate();
        let mut v: Vec<String> = per
            .map(|(k, ((role, url), [n, skipped, failed]))| {
                format!(
                    "  shadow {k} ({} {url}): {n} copies, {skipped} skipped, {failed} failed",
                    role.as_str()
                )
            })
            .collect();
        if !v.is_empty() {
            v.insert(
                0,
                "shadow copies (judge them with `retrace compare --shadow`):".into(),
            );
        }
        v
    }
}

fn dist_row(s: &mut String, name: &str, d: &Dist, unit: &str) {
    let _ = writeln!(
        s,
        "{:<22} mean {:>10.1}  p50 {:>9.1}  p90 {:>9.1}  p99 {:>9.1}  max {:>9.1} {unit}",
        name, d.mean, d.p50, d.p90, d.p99, d.max
    );
}

/// Renders stats as text.
pub(crate) fn render(st: &TraceStats) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{:<22} {}", "requests", st.requests);
    let _ = writeln!(s, "{:<22} {:.1} s", "duration", st.duration_s);
    let _ = writeln!(
        s,
        "{:<22} mean {:.2} req/s, peak {} req/s (1 s window)",
        "arrival rate", st.mean_rate_rps, st.peak_rate_rps
    );
    dist_row(&mut s, "input length (ISL)", &st.isl, "tokens");
    dist_row(&mut s, "output length (OSL)", &st.osl, "tokens");
    let r = &st.reuse;
    if r.block_references > 0 {
        let _ = writeln!(
            s,
            "{:<22} {} distinct of {} references ({} tokens per block)",
            "prefix blocks", r.distinct_blocks, r.block_references, r.block_size
        );
        let _ = writeln!(
            s,
            "{:<22} {:.1} % of block references seen before (unbounded cache)",
            "block reuse",
            r.block_reuse * 100.0
        );
        let _ = writeln!(
            s,
            "{:<22} {:.1} % mean per-request leading-prefix hit rate",
            "prefix hit rate",
            r.mean_prefix_hit_rate * 100.0
        );
        if let (Some(n), Some(h)) = (r.lru_blocks, r.lru_hit_rate) {
            let _ = writeln!(
                s,
                "{:<22} {:.1} % with an LRU cache of {n} blocks",
                "",
                h * 100.0
            );
        }
    } else {
        let _ = writeln!(s, "{:<22} none (trace has no hash ids)", "prefix blocks");
    }
    if st.sessions > 0 {
        let t = st.turns.clone().unwrap_or_default();
        let _ = writeln!(
            s,
            "{:<22} {} (turns: mean {:.1}, max {})",
            "sessions", st.sessions, t.mean, t.max
        );
    }
    let mix = |m: &std::collections::BTreeMap<String, u64>| {
        m.iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(s, "{:<22} {}", "endpoints", mix(&st.endpoints));
    if !st.models.is_empty() {
        let _ = writeln!(s, "{:<22} {}", "models", mix(&st.models));
    }
    if !st.auxiliary.is_empty() {
        let n: u64 = st.auxiliary.values().sum();
        let _ = writeln!(
            s,
            "{:<22} {n} side requests, left out of the figures above: {}",
            "auxiliary",
            mix(&st.auxiliary)
        );
    }
    if let Some(rec) = &st.recorded {
        let _ = writeln!(
            s,
            "recorded responses: {} ({} cancelled); latency of the {} that completed (no cancel, no error, status below 400):",
            rec.responses, rec.cancelled, rec.completed
        );
        dist_row(&mut s, "  TTFT", &rec.ttft_ms, "ms");
        dist_row(&mut s, "  ITL", &rec.itl_ms, "ms");
        dist_row(&mut s, "  E2E", &rec.e2e_ms, "ms");
        if let Some(d) = &rec.non_streamed_e2e_ms {
            dist_row(&mut s, "  E2E non-streamed", d, "ms");
        }
        if !rec.errors.is_empty() {
            let _ = writeln!(s, "  errors: {}", mix(&rec.errors));
        }
        if rec.past_capture_cap > 0 {
            let _ = writeln!(
                s,
                "  past the capture cap: {} (events counted and timed, one token each, unread)",
                rec.past_capture_cap
            );
        }
    }
    if !st.approximate.is_empty() {
        let fpr = r.false_positive_rate.map_or(String::new(), |f| {
            format!("; prefix figures may over-count by {:.3} %", f * 100.0)
        });
        let _ = writeln!(
            s,
            "{:<22} {} (a trace this large is summarised in bounded memory: docs/inspect-json.md{fpr})",
            "estimated",
            st.approximate.join(", ")
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::native::{TraceWriter, WriteOptions};
    use crate::trace::{Request, TraceHeader};

    /// Two frames, the second's record arriving before the first's, under `header`.
    fn two_frames_out_of_order(path: &std::path::Path, header: &TraceHeader) {
        let f = std::fs::File::create(path).unwrap();
        let mut w = TraceWriter::new(f, header, WriteOptions::default()).unwrap();
        for at in [2_000_000, 1_000_000] {
            let r = Request {
                arrival_us: at,
                input_tokens: 10,
                output_tokens: 2,
                hash_ids: vec![at],
                ..Default::default()
            };
            w.push(&r).unwrap();
            w.flush_frame().unwrap();
        }
        w.finish().unwrap();
    }

    fn inspect(path: &std::path::Path) -> String {
        run(&InspectOptions {
            files: vec![path.to_path_buf()],
            ..Default::default()
        })
        .unwrap()
    }

    /// A recording is written in completion order, so records out of arrival order are expected
    /// and not called a problem; another trace out of order still says it was sorted.
    #[test]
    fn records_out_of_order_are_named_only_when_not_a_recording() {
        let dir = tempfile::tempdir().unwrap();
        let mut header = TraceHeader::imported(16, true, "record --upstream http://u");
        header
            .meta
            .insert("record_order".into(), crate::trace::COMPLETION_ORDER.into());
        let rec = dir.path().join("rec.trace.zst");
        two_frames_out_of_order(&rec, &header);
        let said = inspect(&rec);
        let requests = |s: &str| {
            s.lines()
                .any(|l| l.split_whitespace().eq(["requests", "2"]))
        };
        assert!(requests(&said), "{said}");
        assert!(!said.contains("out of time order"), "{said}");
        let other = dir.path().join("other.trace.zst");
        two_frames_out_of_order(&other, &TraceHeader::imported(16, true, "t"));
        let said = inspect(&other);
        assert!(
            said.contains("1 rows were out of time order (sorted)"),
            "{said}"
        );
    }
}
