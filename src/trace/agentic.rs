//! Agentic session traces (kv-cache-tester / WEKA style): one JSON object per session.
//!
//! `{"id", "block_size", "requests": [{"t", "type": "s"|"n", "model", "in", "out", "hash_ids",
//! "think_time", ...}]}`; `t` is seconds from the session start, hash ids are local to the session
//! (they restart in every file) and a trailing partial block is dropped (floor). A file may hold
//! one session object, a JSON array of them, or one per line. Each session's ids are remapped to
//! trace-wide dense ids (distinct between sessions); every session starts at t0 (the format has
//! no session start times); each request keeps its session id, turn and think time.

use super::rows::{check_ids, ImportReport, ReadOptions, MAX_TOKENS};

/// Longest think time accepted (30 days); a longer one would stall a session-ordered replay.
const MAX_THINK_S: f64 = 30.0 * 86_400.0;
use super::{Obj, Params, Request, Session, Trace, TraceError, TraceHeader};
use serde::Deserialize;
use std::collections::HashMap;

#[derive(Deserialize)]
struct SessionIn {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    block_size: Option<u32>,
    requests: Vec<Obj<ReqIn>>,
}

#[derive(Deserialize)]
struct ReqIn {
    t: f64,
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(rename = "in")]
    input: u64,
    out: u64,
    #[serde(default)]
    hash_ids: Vec<u64>,
    #[serde(default)]
    think_time: Option<f64>,
}

fn err(path: &str, msg: String) -> TraceError {
    TraceError::File {
        path: path.to_string(),
        msg,
    }
}

/// Reads a session trace file.
pub(crate) fn read(
    path: &str,
    data: &[u8],
    opts: &ReadOptions,
) -> Result<(Trace, ImportReport), TraceError> {
    let text = std::str::from_utf8(data).map_err(|_| err(path, "not UTF-8 text".into()))?;
    let sessions = sessions_in(path, text)?;
    let mut rep = ImportReport::default();
    let mut reqs = Vec::new();
    let mut block_size = None;
    let mut next_id = 0u64;
    for (n, (line, s)) in sessions.into_iter().enumerate() {
        let s = match s {
            Ok(s) => s,
            Err(m) if opts.skip_bad => {
                rep.bad_row(line, m);
                continue;
            }
            Err(m) => return Err(super::rows::row_error(path, line, m, opts)),
        };
        let bs = opts.block_size.or(s.block_size).unwrap_or(64);
        if *block_size.get_or_insert(bs) != bs {
            return Err(err(
                path,
                format!(
                    "sessions use different block sizes ({} and {bs})",
                    block_size.unwrap()
                ),
            ));
        }
        let sid = s.id.clone().unwrap_or_else(|| format!("session-{n}"));
        let mut local: HashMap<u64, u64> = HashMap::new();
        for (turn, Obj(r)) in s.requests.into_iter().enumerate() {
            let bad = problem(turn, &r, bs);
            if let Some(m) = bad {
                if opts.skip_bad {
                    rep.bad_row(line, format!("session {sid}: {m}"));
                    continue;
                }
                return Err(err(path, format!("session {sid}: {m}")));
            }
            let hash_ids = r
                .hash_ids
                .iter()
                .map(|h| {
                    *local.entry(*h).or_insert_with(|| {
                        next_id += 1;
                        next_id - 1
                    })
                })
                .collect();
            let think = r.think_time.map(|x| (x * 1e6).round() as u64);
            reqs.push(Request {
                arrival_us: (r.t * 1e6).round() as u64,
                session: Some(Session {
                    id: sid.clone(),
                    turn: turn as u32,
                    think_us: think,
                }),
                model: r.model,
                params: Params {
                    stream: r.kind.as_deref().map(|k| k == "s"),
                    ..Default::default()
                },
                input_tokens: r.input,
                output_tokens: r.out,
                hash_ids,
                ..Default::default()
            });
        }
    }
    rep.rows = reqs.len() as u64;
    rep.reordered = reqs
        .windows(2)
        .filter(|w| w[0].arrival_us > w[1].arrival_us)
        .count() as u64;
    reqs.sort_by_key(|r| r.arrival_us);
    Ok((
        Trace {
            header: TraceHeader::imported(
                block_size.unwrap_or(64),
                false,
                format!("sessions:{path}"),
            ),
            requests: reqs,
        },
        rep,
    ))
}

/// A session as read, or why it could not be, with the line it starts on.
type SessionAt = (u64, Result<SessionIn, String>);

/// The file's sessions, each with the line it starts on: a JSON array of them, one object, or
/// one object per line (the first malformed one ends the list).
fn sessions_in(path: &str, text: &str) -> Result<Vec<SessionAt>, TraceError> {
    let trimmed = text.trim_start();
    Ok(if trimmed.starts_with('[') {
        match serde_json::from_str::<Vec<Obj<SessionIn>>>(trimmed) {
            Ok(v) => v.into_iter().map(|s| (1, Ok(s.0))).collect(),
            Err(e) => return Err(err(path, format!("line {}: {e}", e.line()))),
        }
    } else {
        // One object (possibly spread over lines) or one object per line.
        let mut out = Vec::new();
        let mut de = serde_json::Deserializer::from_str(text).into_iter::<Obj<SessionIn>>();
        loop {
            let at = de.byte_offset();
            let line = text[..at].matches('\n').count() as u64 + 1;
            match de.next() {
                None => break,
                Some(Ok(s)) => out.push((line, Ok(s.0))),
                Some(Err(e)) => {
                    out.push((e.line() as u64, Err(e.to_string())));
                    break;
                }
            }
        }
        out
    })
}

/// What is wrong with request `turn` of a session of block size `bs`, if anything: a time, a
/// token count, its hash ids or a think time out of range.
fn problem(turn: usize, r: &ReqIn, bs: u32) -> Option<String> {
    // The header says whole blocks only (`partial_tail_block: false`).
    let blocks = super::blocks(r.input, bs, false);
    if !(r.t.is_finite() && r.t >= 0.0 && r.t < 1e9) {
        Some(format!("request {turn}: t {} is negative or absurd", r.t))
    } else if r.input > MAX_TOKENS || r.out > MAX_TOKENS {
        Some(format!("request {turn}: token count over {MAX_TOKENS}"))
    } else if let Err(e) = check_ids(r.hash_ids.len(), blocks, r.input) {
        Some(format!("request {turn}: {e}"))
    } else {
        r.think_time
            .filter(|x| !(x.is_finite() && (0.0..=MAX_THINK_S).contains(x)))
            .map(|x| format!("request {turn}: think_time {x} s is negative or longer than 30 days"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_get_distinct_ids_and_keep_turns() {
        let one = r#"{"id":"a","block_size":64,"requests":[{"t":0,"type":"s","in":130,"out":5,"hash_ids":[1,2],"think_time":0},{"t":2.5,"type":"n","in":200,"out":5,"hash_ids":[1,2,3],"think_time":1.5}]}"#;
        let data = format!("{one}\n{}", one.replace("\"a\"", "\"b\""));
        let (t, rep) = read("s.jsonl", data.as_bytes(), &ReadOptions::default()).unwrap();
        assert_eq!(rep.rows, 4);
        assert!(!t.header.partial_tail_block);
        let a: Vec<_> = t
            .requests
            .iter()
            .filter(|r| r.session.as_ref().unwrap().id == "a")
            .collect();
        let b: Vec<_> = t
            .requests
            .iter()
            .filter(|r| r.session.as_ref().unwrap().id == "b")
            .collect();
        assert_eq!(a[1].hash_ids[..2], a[0].hash_ids[..]);
        assert!(a[0].hash_ids.iter().all(|h| !b[0].hash_ids.contains(h)));
        assert_eq!(a[1].session.as_ref().unwrap().think_us, Some(1_500_000));
        assert_eq!(a[1].params.stream, Some(false));
        assert_eq!(a[1].arrival_us, 2_500_000);
    }

    #[test]
    fn malformed_session_names_line() {
        let e = read(
            "s.json",
            b"{\"requests\": [{\"t\": \"x\"}]}",
            &ReadOptions::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("s.json:"), "{e}");
    }

    /// serde would read `["a", 64, [[0, null, null, 10, 5]]]` as a session and its request,
    /// field by field: sessions and requests must be JSON objects.
    #[test]
    fn arrays_are_not_sessions_or_requests() {
        for bad in [
            &br#"[["a", 64, [{"t":0,"in":10,"out":5}]]]"#[..],
            br#"{"requests": [[0, null, null, 10, 5]]}"#,
        ] {
            let e = read("s.json", bad, &ReadOptions::default())
                .unwrap_err()
                .to_string();
            assert!(e.contains("expected an object"), "{e}");
        }
    }

    #[test]
    fn a_turn_with_more_hash_ids_than_its_whole_blocks_allow_is_refused() {
        // 100 tokens at block size 64: one whole block, so at most 2 * 1 + 16 ids.
        let turn = |n: u64| {
            let ids: Vec<String> = (0..n).map(|k| k.to_string()).collect();
            format!(
                r#"{{"id":"a","block_size":64,"requests":[{{"t":0,"in":100,"out":5,"hash_ids":[{}]}}]}}"#,
                ids.join(",")
            )
        };
        assert!(read("s.json", turn(18).as_bytes(), &ReadOptions::default()).is_ok());
        let e = read("s.json", turn(19).as_bytes(), &ReadOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("session a: request 0: 19 hash ids for input length 100 (at most 18)"),
            "{e}"
        );
        let skip = ReadOptions {
            skip_bad: true,
            ..Default::default()
        };
        let (t, rep) = read("s.json", turn(19).as_bytes(), &skip).unwrap();
        assert_eq!((t.requests.len(), rep.skipped), (0, 1));
    }
}
