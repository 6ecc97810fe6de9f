//! Recordings from a fleet of proxies merged into one trace (pure).
//!
//! Each proxy replica writes its own files; their arrivals are offsets from each file's own t0,
//! whose wall-clock time the header holds. Merging puts every record on the earliest t0's
//! clock and sorts by arrival. Hash ids stay comparable only when every file hashed the same
//! way: the same block size, the same scheme and, for HMAC, the same key (its public
//! [`KEY_ID`]). Anything else is refused, naming the files.

use super::{HashScheme, Trace, TraceError};

/// Header meta key naming the HMAC key a recording used (see `BlockHasher::key_id`).
pub const KEY_ID: &str = "hash_key_id";

fn refuse(path: &str, msg: String) -> TraceError {
    TraceError::File {
        path: path.to_string(),
        msg,
    }
}

/// What makes two files' hash ids the same ids.
fn hashing(t: &Trace) -> (u32, HashScheme, bool, Option<&String>) {
    let h = &t.header;
    (
        h.block_size,
        h.hash_scheme,
        h.partial_tail_block,
        h.meta.get(KEY_ID),
    )
}

/// Merges `traces` (path, trace) by wall clock into one trace in arrival order.
pub fn merge(traces: Vec<(String, Trace)>) -> Result<Trace, TraceError> {
    let Some((first_path, first)) = traces.first() else {
        return Err(refuse("-", "no input to merge".into()));
    };
    for (path, t) in &traces {
        let Some(_) = t.header.t0_unix_us else {
            return Err(refuse(
                path,
                "has no wall-clock start (t0): only recordings can be merged by wall clock".into(),
            ));
        };
        if t.header.hash_scheme == HashScheme::Dense
            && !t.requests.iter().all(|r| r.hash_ids.is_empty())
        {
            return Err(refuse(
                path,
                "has dense imported hash ids, which mean nothing across files".into(),
            ));
        }
        if hashing(t) != hashing(first) {
            let (b, s, _, k) = hashing(t);
            let (b0, s0, _, k0) = hashing(first);
            return Err(refuse(
                path,
                format!(
                    "hashes blocks differently from {first_path} (block size {b} vs {b0}, {s:?} vs {s0:?}, key {} vs {}): its hash ids cannot be merged",
                    k.map_or("none", String::as_str),
                    k0.map_or("none", String::as_str)
                ),
            ));
        }
    }
    let t0 = traces
        .iter()
        .filter_map(|(_, t)| t.header.t0_unix_us)
        .min()
        .unwrap_or(0);
    let mut header = first.header.clone();
    header.t0_unix_us = Some(t0);
    header.source = format!("merge of {} recordings", traces.len());
    header.meta.remove("file_seq");
    header.meta.insert(
        "merged_from".into(),
        traces
            .iter()
            .map(|(p, _)| p.as_str())
            .collect::<Vec<_>>()
            .join(" "),
    );
    let mut requests = Vec::with_capacity(traces.iter().map(|(_, t)| t.requests.len()).sum());
    for (_, t) in traces {
        let shift = (t.header.t0_unix_us.unwrap_or(t0) - t0).max(0) as u64;
        requests.extend(t.requests.into_iter().map(|mut r| {
            r.arrival_us = r.arrival_us.saturating_add(shift);
            r
        }));
    }
    let mut out = Trace { header, requests };
    out.sort_by_arrival();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Request, TraceHeader};

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
        assert!(e(k1(), bs).contains("block size 512 vs 16"));
        let mut dense = rec(0, &[1], HashScheme::Dense, None);
        assert!(e(dense.clone(), k1()).contains("dense"));
        dense.header.t0_unix_us = None;
        assert!(e(k1(), dense).contains("wall-clock"));
        assert!(merge(vec![("a".into(), k1()), ("b".into(), k1())]).is_ok());
    }
}
