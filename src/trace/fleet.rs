//! Recordings from a fleet of proxies merged into one trace (pure).
//!
//! Each proxy replica writes its own files; their arrivals are offsets from each file's own t0,
//! whose wall-clock time the header holds. Merging puts every record on the earliest t0's
//! clock, in arrival order, reading the files side by side (each is already in arrival order). Hash ids stay comparable only when every file hashed the same
//! way: the same block size, the same scheme and, for HMAC, the same key (its public
//! [`KEY_ID`]). Anything else is refused, naming the files.

use super::detect::ImportOptions;
use super::rows::ImportReport;
use super::stream::TraceStream;
use super::{HashScheme, Request, TraceError, TraceHeader};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::PathBuf;

/// Header meta key naming the HMAC key a recording used (see `BlockHasher::key_id`).
pub(crate) const KEY_ID: &str = "hash_key_id";

fn refuse(path: &str, msg: String) -> TraceError {
    TraceError::File {
        path: path.to_string(),
        msg,
    }
}

/// What makes two files' hash ids the same ids.
fn hashing(h: &TraceHeader) -> (u32, HashScheme, bool, Option<&String>) {
    (
        h.block_size,
        h.hash_scheme,
        h.partial_tail_block,
        h.meta.get(KEY_ID),
    )
}

/// The hashing fields in which `h` differs from `first`, each named with both values.
fn differences(h: &TraceHeader, first: &TraceHeader) -> Vec<String> {
    let (b, sc, tail, k) = hashing(h);
    let (b0, sc0, tail0, k0) = hashing(first);
    let key = |k: Option<&String>| k.map_or("none", String::as_str).to_string();
    let mut out = Vec::new();
    if b != b0 {
        out.push(format!("block_size {b} vs {b0}"));
    }
    if sc != sc0 {
        out.push(format!("hash_scheme {sc:?} vs {sc0:?}"));
    }
    if tail != tail0 {
        out.push(format!("partial_tail_block {tail} vs {tail0}"));
    }
    if k != k0 {
        out.push(format!("hash key {} vs {}", key(k), key(k0)));
    }
    out
}

/// Checks that `inputs` can be merged by wall clock; returns the earliest t0.
fn check(inputs: &[(String, TraceStream)]) -> Result<i64, TraceError> {
    let Some((first_path, first)) = inputs.first() else {
        return Err(refuse("-", "no input to merge".into()));
    };
    for (path, s) in inputs {
        if s.header.t0_unix_us.is_none() {
            return Err(refuse(
                path,
                "has no wall-clock start (t0): only recordings can be merged by wall clock".into(),
            ));
        }
        if hashing(&s.header) != hashing(&first.header) {
            let differs = differences(&s.header, &first.header).join(", ");
            return Err(refuse(
                path,
                format!(
                    "hashes blocks differently from {first_path} ({differs}): its hash ids cannot be merged"
                ),
            ));
        }
    }
    Ok(inputs
        .iter()
        .filter_map(|(_, s)| s.header.t0_unix_us)
        .min()
        .unwrap_or(0))
}

/// One input of the merge: its records shifted onto the earliest t0's clock.
struct Input {
    path: String,
    stream: TraceStream,
    shift: u64,
    dense: bool,
}

impl Input {
    fn next(&mut self) -> Option<Result<Request, TraceError>> {
        let mut r = match self.stream.next()? {
            Ok(r) => r,
            Err(e) => return Some(Err(e)),
        };
        if self.dense && !r.hash_ids.is_empty() {
            return Some(Err(refuse(
                &self.path,
                "has dense imported hash ids, which mean nothing across files".into(),
            )));
        }
        r.arrival_us = r.arrival_us.saturating_add(self.shift);
        Some(Ok(r))
    }
}

/// The inputs' records merged by arrival, holding one record per input read so far: ties go to
/// the earlier input, each input keeps its own order. An input whose earliest arrival is known
/// is not read until the merge reaches it (a recorder's rotated files are read one or two at a
/// time, not all at once).
struct Merged {
    inputs: Vec<Input>,
    heads: BinaryHeap<Reverse<(u64, usize)>>,
    pending: Vec<Option<Request>>,
    /// Inputs not read yet: their heap entry is their earliest arrival.
    unread: Vec<bool>,
    failed: Option<TraceError>,
}

impl Merged {
    /// Input `i` joins the merge: by its earliest arrival when known, else by its first record.
    fn join(&mut self, i: usize) {
        let inp = &self.inputs[i];
        match inp.stream.earliest {
            Some(e) => {
                self.unread[i] = true;
                self.heads.push(Reverse((e.saturating_add(inp.shift), i)));
            }
            None => self.pull(i),
        }
    }

    fn pull(&mut self, i: usize) {
        match self.inputs[i].next() {
            Some(Ok(r)) => {
                self.heads.push(Reverse((r.arrival_us, i)));
                self.pending[i] = Some(r);
            }
            Some(Err(e)) => self.failed = self.failed.take().or(Some(e)),
            None => {}
        }
    }
}

impl Iterator for Merged {
    type Item = Result<Request, TraceError>;
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(e) = self.failed.take() {
                self.heads.clear();
                return Some(Err(e));
            }
            let Reverse((_, i)) = self.heads.pop()?;
            if std::mem::take(&mut self.unread[i]) {
                // Its time has come: read its first record and queue it by its arrival.
                self.pull(i);
                continue;
            }
            let r = self.pending[i].take();
            self.pull(i);
            return r.map(Ok);
        }
    }
}

/// The input files' names as commands print them: joined by spaces.
pub(crate) fn names(paths: &[PathBuf]) -> String {
    let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    names.join(" ")
}

/// Opens one trace file as a stream, or several recordings merged by wall clock (each file once:
/// one given twice, under any name, is refused).
pub(crate) fn open_all(paths: &[PathBuf], opts: &ImportOptions) -> Result<TraceStream, TraceError> {
    if let [one] = paths {
        return super::stream::open(one, opts);
    }
    if let Some((earlier, later)) = crate::sys::fileid::first_repeat(paths) {
        let msg = format!(
            "given twice (the same file as {}): each recording counts once",
            paths[earlier].display()
        );
        return Err(refuse(&paths[later].display().to_string(), msg));
    }
    let inputs = paths
        .iter()
        .map(|p| Ok((p.display().to_string(), super::stream::open(p, opts)?)))
        .collect::<Result<Vec<_>, TraceError>>()?;
    merge(inputs)
}

/// Merges recordings (path, stream) by wall clock into one stream in arrival order, reading
/// each input as it goes (memory: one record per input).
pub(crate) fn merge(inputs: Vec<(String, TraceStream)>) -> Result<TraceStream, TraceError> {
    let t0 = check(&inputs)?;
    let mut header = inputs[0].1.header.clone();
    header.t0_unix_us = Some(t0);
    header.source = format!("merge of {} recordings", inputs.len());
    header.meta.remove("file_seq");
    let names: Vec<&str> = inputs.iter().map(|(p, _)| p.as_str()).collect();
    header.meta.insert("merged_from".into(), names.join(" "));
    let mut report = ImportReport::default();
    for (_, s) in &inputs {
        report.rows += s.report.rows;
        report.skipped += s.report.skipped;
        report.reordered += s.report.reordered;
    }
    let inputs: Vec<Input> = inputs
        .into_iter()
        .map(|(path, stream)| Input {
            shift: (stream.header.t0_unix_us.unwrap_or(t0) - t0).max(0) as u64,
            dense: stream.header.hash_scheme == HashScheme::Dense,
            path,
            stream,
        })
        .collect();
    let mut merged = Merged {
        pending: (0..inputs.len()).map(|_| None).collect(),
        unread: vec![false; inputs.len()],
        inputs,
        heads: BinaryHeap::new(),
        failed: None,
    };
    for i in 0..merged.inputs.len() {
        merged.join(i);
    }
    Ok(TraceStream::new(header, report, Box::new(merged)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::stream::in_memory;
    use crate::trace::Trace;

    fn merge(traces: Vec<(String, Trace)>) -> Result<Trace, TraceError> {
        let inputs = traces
            .into_iter()
            .map(|(p, t)| (p, in_memory(t, ImportReport::default())))
            .collect();
        super::merge(inputs)?.collect_trace().map(|(t, _)| t)
    }

    fn rec(t0: i64, arrivals: &[u64], scheme: HashScheme, key: Option<&str>) -> Trace {
        let mut header = TraceHeader::imported(16, true, "record");
        header.hash_scheme = scheme;
        header.t0_unix_us = Some(t0);
        if let Some(k) = key {
            header.meta.insert(KEY_ID.into(), k.into());
        }
        let requests = arrivals
            .iter()
            .map(|&a| Request {
                arrival_us: a,
                hash_ids: vec![a],
                ..Default::default()
            })
            .collect();
        Trace { header, requests }
    }

    #[test]
    fn recordings_merge_by_wall_clock() {
        let a = rec(1_000_000, &[0, 500, 900], HashScheme::Xxh3, None);
        let b = rec(1_000_300, &[0, 400], HashScheme::Xxh3, None);
        let m = merge(vec![("a".into(), a), ("b".into(), b)]).unwrap();
        let got: Vec<u64> = m.requests.iter().map(|r| r.arrival_us).collect();
        assert_eq!(got, [0, 300, 500, 700, 900]);
        assert_eq!(m.header.t0_unix_us, Some(1_000_000));
        assert_eq!(m.header.meta["merged_from"], "a b");
    }

    #[test]
    fn different_hashing_is_refused_naming_the_file() {
        let e = |x: Trace, y: Trace| {
            merge(vec![("a.trace.zst".into(), x), ("b.trace.zst".into(), y)])
                .unwrap_err()
                .to_string()
        };
        let k1 = || rec(0, &[1], HashScheme::HmacSha256, Some("k1"));
        let msg = e(k1(), rec(0, &[1], HashScheme::HmacSha256, Some("k2")));
        assert!(
            msg.starts_with("b.trace.zst:") && msg.contains("a.trace.zst") && msg.contains("k2"),
            "{msg}"
        );
        let msg = e(k1(), rec(0, &[1], HashScheme::Xxh3, None));
        assert!(msg.contains("Xxh3"), "{msg}");
        let mut bs = k1();
        bs.header.block_size = 512;
        let msg = e(k1(), bs);
        assert!(
            msg.contains("(block_size 512 vs 16)"),
            "only the field that differs: {msg}"
        );
        let mut floor = k1();
        floor.header.partial_tail_block = false;
        let msg = e(k1(), floor);
        assert!(msg.contains("(partial_tail_block false vs true)"), "{msg}");
        let mut dense = rec(0, &[1], HashScheme::Dense, None);
        assert!(e(dense.clone(), dense.clone()).contains("dense"));
        assert!(e(dense.clone(), k1()).contains("differently"));
        dense.header.t0_unix_us = None;
        assert!(e(k1(), dense).contains("wall-clock"));
        assert!(merge(vec![("a".into(), k1()), ("b".into(), k1())]).is_ok());
    }

    #[test]
    fn the_streamed_merge_equals_a_stable_sort_of_all_records() {
        let inputs = [
            rec(1_000_000, &[0, 0, 10, 10, 40, 700], HashScheme::Xxh3, None),
            rec(1_000_010, &[0, 0, 30, 690], HashScheme::Xxh3, None),
            rec(999_990, &[], HashScheme::Xxh3, None),
            rec(1_000_000, &[10, 20, 20, 2_000], HashScheme::Xxh3, None),
        ];
        let t0 = 999_990;
        let mut expected: Vec<(u64, u64)> = Vec::new();
        for (i, t) in inputs.iter().enumerate() {
            let shift = (t.header.t0_unix_us.unwrap() - t0) as u64;
            expected.extend(t.requests.iter().map(|r| (r.arrival_us + shift, i as u64)));
        }
        expected.sort_by_key(|e| e.0);
        let mut tagged = inputs.to_vec();
        for (i, t) in tagged.iter_mut().enumerate() {
            for r in &mut t.requests {
                r.output_tokens = i as u64;
            }
        }
        let named = tagged.into_iter().map(|t| (String::new(), t)).collect();
        let m = merge(named).unwrap();
        let got: Vec<(u64, u64)> = m
            .requests
            .iter()
            .map(|r| (r.arrival_us, r.output_tokens))
            .collect();
        assert_eq!(got, expected);
        assert_eq!(m.header.t0_unix_us, Some(t0));
    }

    /// A later file is not read until the merge reaches its earliest arrival.
    #[test]
    fn a_later_recording_is_read_only_when_its_time_comes() {
        use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
        use std::sync::Arc;
        let reads = Arc::new(AtomicUsize::new(0));
        let counted = |t: Trace, reads: Arc<AtomicUsize>| {
            let mut s = in_memory(t, ImportReport::default());
            let earliest = s.earliest;
            let (header, report) = (s.header.clone(), s.report.clone());
            let it = std::iter::from_fn(move || {
                reads.fetch_add(1, Relaxed);
                s.next()
            });
            let mut s = TraceStream::new(header, report, Box::new(it));
            s.earliest = earliest;
            s
        };
        let a = rec(1_000_000, &[0, 10, 20, 30], HashScheme::Xxh3, None);
        let b = rec(1_000_000, &[25, 40], HashScheme::Xxh3, None);
        let a = in_memory(a, ImportReport::default());
        let b = counted(b, reads.clone());
        let mut m = super::merge(vec![("a".into(), a), ("b".into(), b)]).unwrap();
        let mut arrivals = Vec::new();
        for _ in 0..3 {
            arrivals.push(m.next().unwrap().unwrap().arrival_us);
        }
        assert_eq!(arrivals, [0, 10, 20]);
        assert_eq!(reads.load(Relaxed), 0, "b was read before its time");
        let rest: Vec<u64> = m.map(|r| r.unwrap().arrival_us).collect();
        assert_eq!(rest, [25, 30, 40]);
        assert!(reads.load(Relaxed) >= 2);
    }
}
