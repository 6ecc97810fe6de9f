//! AIPerf 0.13's synthesis transforms, request by request (pure). The meanings, and where
//! retrace departs from AIPerf on purpose, are in docs/synth.md.
//!
//! Order: `--scale-lengths`, then the prefix/prompt multipliers, the prefix-root multiplier,
//! `--max-isl` (drop), `--max-osl` (cap), `--speedup`.

use super::WhatIfError;
use crate::trace::{HashScheme, Request, Trace};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;

/// The transforms; [`Default`] changes nothing.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Transforms {
    pub(crate) speedup: f64,
    pub(crate) prefix_len: f64,
    pub(crate) prefix_root: u32,
    pub(crate) prompt_len: f64,
    pub(crate) scale_lengths: Option<f64>,
    pub(crate) max_isl: Option<u64>,
    pub(crate) max_osl: Option<u64>,
    pub(crate) seed: u64,
}

impl Default for Transforms {
    fn default() -> Self {
        Transforms {
            speedup: 1.0,
            prefix_len: 1.0,
            prefix_root: 1,
            prompt_len: 1.0,
            scale_lengths: None,
            max_isl: None,
            max_osl: None,
            seed: 0,
        }
    }
}

/// What the transforms left out or changed, for the summary line.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Applied {
    pub(crate) dropped_max_isl: u64,
    pub(crate) capped_max_osl: u64,
}

fn positive(name: &str, v: f64) -> Result<(), WhatIfError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(WhatIfError::Option(format!(
            "{name} must be a positive number, got {v}"
        )))
    }
}

/// Applies the transforms to the trace's workload requests in place.
pub(crate) fn apply(trace: &mut Trace, t: &Transforms) -> Result<Applied, WhatIfError> {
    positive("--speedup", t.speedup)?;
    positive("--prefix-len-multiplier", t.prefix_len)?;
    positive("--prompt-len-multiplier", t.prompt_len)?;
    if t.prefix_root == 0 {
        return Err(WhatIfError::Option(
            "--prefix-root-multiplier must be at least 1".into(),
        ));
    }
    trace.drop_auxiliary();
    within_reader_limit(trace, t)?;
    if let Some(x) = t.scale_lengths {
        scale_lengths(trace, x)?;
    }
    if t.prefix_len != 1.0 || t.prompt_len != 1.0 {
        multiply(trace, t.prefix_len, t.prompt_len);
    }
    if t.prefix_root > 1 {
        spread_roots(trace, t.prefix_root, t.seed);
    }
    let mut out = Applied::default();
    if let Some(n) = t.max_isl {
        let before = trace.requests.len();
        trace.requests.retain(|r| r.input_tokens <= n);
        out.dropped_max_isl = (before - trace.requests.len()) as u64;
    }
    if let Some(n) = t.max_osl {
        for r in trace.requests.iter_mut().filter(|r| r.output_tokens > n) {
            r.output_tokens = n;
            out.capped_max_osl += 1;
        }
    }
    if t.speedup != 1.0 {
        let last = trace
            .requests
            .iter()
            .map(|r| r.arrival_us)
            .max()
            .unwrap_or(0);
        let span_us = last as f64 / t.speedup;
        if span_us > super::MAX_SPAN_US as f64 {
            return Err(WhatIfError::Option(format!(
                "--speedup {}: the output would span {:.0} days (more than {})",
                t.speedup,
                span_us / 86_400e6,
                super::MAX_SPAN_US / 86_400_000_000
            )));
        }
        let div = |v: u64| (v as f64 / t.speedup).round() as u64;
        for r in &mut trace.requests {
            r.arrival_us = div(r.arrival_us);
            if let Some(th) = r.session.as_mut().and_then(|s| s.think_us.as_mut()) {
                *th = div(*th);
            }
        }
    }
    Ok(out)
}

/// Most tokens a prompt may have after the transforms: every trace reader's limit.
const MAX_PROMPT_TOKENS: f64 = 1e7;

/// Refuses multipliers that would make the longest prompt longer than any reader accepts (before
/// anything is allocated for it).
fn within_reader_limit(trace: &Trace, t: &Transforms) -> Result<(), WhatIfError> {
    let longest = trace
        .requests
        .iter()
        .map(|r| r.input_tokens)
        .max()
        .unwrap_or(0) as f64;
    let flags = [
        ("--prefix-len-multiplier", t.prefix_len),
        ("--prompt-len-multiplier", t.prompt_len),
        ("--scale-lengths", t.scale_lengths.unwrap_or(1.0)),
    ];
    for (name, x) in flags {
        if longest * x > MAX_PROMPT_TOKENS {
            return Err(WhatIfError::Option(format!(
                "{name} {x} makes the longest prompt ({longest} tokens) {:.3e} tokens; \
                 at most 10^7 tokens per prompt (every trace reader's limit)",
                longest * x
            )));
        }
    }
    Ok(())
}

/// Every input length and the block size times `x`, ids kept (the hand method of fitting a
/// trace to a small server: lengths ÷16, blocks of 32 instead of 512).
fn scale_lengths(trace: &mut Trace, x: f64) -> Result<(), WhatIfError> {
    positive("--scale-lengths", x)?;
    let old = trace.header.block_size;
    let bs = f64::from(old) * x;
    if (bs - bs.round()).abs() > 1e-9 || bs.round() < 1.0 || bs > f64::from(u32::MAX) {
        return Err(WhatIfError::Option(format!(
            "--scale-lengths {x}: the block size {old} × {x} = {bs} is not a whole number of tokens; \
             pick X so that it is, or use --prefix-len-multiplier and --prompt-len-multiplier"
        )));
    }
    trace.header.block_size = bs.round() as u32;
    for r in &mut trace.requests {
        let n = r.hash_ids.len() as u64;
        let want = (r.input_tokens as f64 * x).round() as u64;
        r.input_tokens = if r.input_tokens == 0 {
            0
        } else if n == 0 && trace.header.partial_tail_block {
            want.max(1)
        } else {
            clamp_to_blocks(&trace.header, n, want)
        };
    }
    Ok(())
}

/// `want` moved into the range of lengths that have exactly `n` ids under the header's rule.
fn clamp_to_blocks(h: &crate::trace::TraceHeader, n: u64, want: u64) -> u64 {
    let b = u64::from(h.block_size.max(1));
    if h.partial_tail_block {
        want.clamp((n.saturating_sub(1)) * b + 1, n * b)
    } else {
        want.clamp(n * b, n * b + b - 1)
    }
}

/// AIPerf's prefix and prompt multipliers. A request's prefix is its leading ids that occur more
/// than once in the trace; the rest of its tokens are its unique prompt.
fn multiply(trace: &mut Trace, prefix_mult: f64, prompt_mult: f64) {
    let mut count: HashMap<u64, u32> = HashMap::new();
    for h in trace.requests.iter().flat_map(|r| &r.hash_ids) {
        let c = count.entry(*h).or_default();
        *c = c.saturating_add(1);
    }
    let header = trace.header.clone();
    let bs = u64::from(header.block_size.max(1));
    let mut ids = Ids::default();
    for r in &mut trace.requests {
        if r.hash_ids.is_empty() {
            r.input_tokens = (r.input_tokens as f64 * prompt_mult) as u64;
            continue;
        }
        let n = r.hash_ids.iter().take_while(|h| count[*h] > 1).count();
        let prefix_tokens = (n as u64 * bs).min(r.input_tokens);
        // a whole-prompt shared prefix may end in a partial block: keep its shortfall
        let short = n as u64 * bs - prefix_tokens;
        let prompt_tokens = r.input_tokens - prefix_tokens;
        let prefix = &r.hash_ids[..n];
        let mut new: Vec<u64> = if prefix_mult > 1.0 {
            let whole = prefix_mult as u64;
            let target = (n as f64 * prefix_mult).ceil() as u64;
            let mut v: Vec<u64> = prefix
                .iter()
                .flat_map(|&h| (0..whole).map(move |j| (h, j)))
                .map(|k| ids.keyed(k))
                .collect();
            // the fractional part's blocks follow the prefix they extend, shared like it
            let last = prefix.last().copied();
            for j in 0..target.saturating_sub(v.len() as u64) {
                v.push(match last {
                    Some(h) => ids.keyed((h, whole + j)),
                    None => ids.fresh(),
                });
            }
            v
        } else if prefix_mult < 1.0 && n > 0 {
            let keep = ((n as f64 * prefix_mult) as usize).max(1);
            prefix[..keep].iter().map(|&h| ids.keyed((h, 0))).collect()
        } else {
            prefix.iter().map(|&h| ids.keyed((h, 0))).collect()
        };
        let new_prefix_tokens = if new.len() == n {
            prefix_tokens
        } else {
            (new.len() as u64 * bs).saturating_sub(short)
        };
        let new_prompt = (prompt_tokens as f64 * prompt_mult) as u64;
        r.input_tokens = new_prefix_tokens + new_prompt;
        let total = header.blocks_for(r.input_tokens) as usize;
        new.truncate(total);
        while new.len() < total {
            new.push(ids.fresh());
        }
        r.hash_ids = new;
    }
    trace.header.hash_scheme = HashScheme::Dense;
}

/// New dense ids: one per key (a prefix id and its piece), or fresh (unique blocks).
#[derive(Default)]
struct Ids {
    keyed: HashMap<(u64, u64), u64>,
    next: u64,
}

impl Ids {
    fn fresh(&mut self) -> u64 {
        self.next += 1;
        self.next - 1
    }
    fn keyed(&mut self, k: (u64, u64)) -> u64 {
        if let Some(&v) = self.keyed.get(&k) {
            return v;
        }
        let v = self.fresh();
        self.keyed.insert(k, v);
        v
    }
}

/// Each request (each session, all its turns together) goes to one of `k` copies of the prefix
/// tree, chosen uniformly; copy 0 keeps its ids, copy `c` gets ids no other copy has.
fn spread_roots(trace: &mut Trace, k: u32, seed: u64) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let scheme = trace.header.hash_scheme;
    let stride = crate::trace::shape::stride(trace);
    let mut session_copy: HashMap<String, u64> = HashMap::new();
    for r in &mut trace.requests {
        let copy = match &r.session {
            Some(s) => *session_copy
                .entry(s.id.clone())
                .or_insert_with(|| rng.random_range(0..u64::from(k))),
            None => rng.random_range(0..u64::from(k)),
        };
        if copy > 0 {
            recopy(r, scheme, copy, stride);
        }
    }
}

fn recopy(r: &mut Request, scheme: HashScheme, copy: u64, stride: u64) {
    for h in &mut r.hash_ids {
        *h = crate::trace::shape::distinct_id(scheme, *h, copy, stride);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::TraceHeader;

    fn req(isl: u64, ids: &[u64]) -> Request {
        Request {
            input_tokens: isl,
            output_tokens: 20,
            hash_ids: ids.to_vec(),
            ..Default::default()
        }
    }

    fn trace(bs: u32, reqs: Vec<Request>) -> Trace {
        Trace {
            header: TraceHeader::imported(bs, true, "t"),
            requests: reqs,
        }
    }

    /// AIPerf 0.13's own cases (tests/.../test_synthesizer.py): prefix ×2 on a one-block shared
    /// prefix gives 3 blocks of 1536 tokens; fractional multipliers give ceil(n·X) prefix blocks.
    #[test]
    fn prefix_multiplier_matches_aiperf_cases() {
        let mut t = trace(512, vec![req(1024, &[1, 2]), req(1024, &[1, 3])]);
        multiply(&mut t, 2.0, 1.0);
        for r in &t.requests {
            assert_eq!((r.hash_ids.len(), r.input_tokens), (3, 1536));
        }
        assert_eq!(t.requests[0].hash_ids[..2], t.requests[1].hash_ids[..2]);
        for (m, n, want) in [(1.1, 10, 11), (1.5, 10, 15), (2.3, 4, 10), (1.01, 3, 4)] {
            let shared: Vec<u64> = (0..n).collect();
            let mk = |u: u64| {
                let mut ids = shared.clone();
                ids.push(u);
                req((n + 1) * 512, &ids)
            };
            let mut t = trace(512, vec![mk(100), mk(200)]);
            multiply(&mut t, m, 1.0);
            for r in &t.requests {
                assert_eq!(r.hash_ids.len() as u64, want + 1, "{m} {n}");
                assert_eq!(r.input_tokens, r.hash_ids.len() as u64 * 512);
            }
            // unlike AIPerf, the fractional blocks are shared as the prefix they extend is
            let (a, b) = (&t.requests[0].hash_ids, &t.requests[1].hash_ids);
            assert_eq!(a[..want as usize], b[..want as usize]);
        }
    }

    #[test]
    fn a_multiplier_past_the_readers_limit_is_refused_before_any_allocation() {
        let mut t = trace(512, vec![req(1024, &[1, 2]), req(1024, &[1, 3])]);
        let huge = Transforms {
            prefix_len: 1e9,
            ..Default::default()
        };
        let err = apply(&mut t, &huge).unwrap_err().to_string();
        assert!(err.contains("--prefix-len-multiplier 1000000000"), "{err}");
        assert_eq!(t.requests[0].hash_ids, [1, 2], "the trace is untouched");
        let fine = Transforms {
            prompt_len: 1000.0,
            ..Default::default()
        };
        assert!(apply(&mut t, &fine).is_ok());
    }

    #[test]
    fn squeeze_keeps_leading_blocks_and_prompt_multiplier_scales_the_rest() {
        let mut t = trace(
            100,
            vec![req(450, &[1, 2, 3, 4, 5]), req(420, &[1, 2, 3, 4, 9])],
        );
        multiply(&mut t, 0.5, 2.0);
        // 4 shared blocks → 2; unique 50 and 20 tokens → 100 and 40
        assert_eq!(t.requests[0].input_tokens, 300);
        assert_eq!(t.requests[1].input_tokens, 240);
        assert_eq!(t.requests[0].hash_ids.len(), 3);
        assert_eq!(t.requests[1].hash_ids.len(), 3);
        assert_eq!(t.requests[0].hash_ids[..2], t.requests[1].hash_ids[..2]);
        assert_ne!(t.requests[0].hash_ids[2], t.requests[1].hash_ids[2]);
    }

    /// Two identical requests whose last block is partial: AIPerf 0.13 raises (prefix longer than
    /// the prompt); the partial block stays partial here.
    #[test]
    fn a_wholly_shared_prompt_keeps_its_partial_block() {
        let mut t = trace(512, vec![req(1000, &[1, 2]), req(1000, &[1, 2])]);
        multiply(&mut t, 2.0, 1.0);
        assert_eq!(t.requests[0].input_tokens, 4 * 512 - 24);
        assert_eq!(t.requests[0].hash_ids.len(), 4);
    }

    #[test]
    fn scale_lengths_keeps_ids_and_scales_the_block() {
        let mut t = trace(512, vec![req(1000, &[1, 2]), req(513, &[1, 3])]);
        let ids: Vec<_> = t.requests.iter().map(|r| r.hash_ids.clone()).collect();
        scale_lengths(&mut t, 1.0 / 16.0).unwrap();
        assert_eq!(t.header.block_size, 32);
        assert_eq!(t.requests[0].input_tokens, 63);
        // 513/16 rounds to 32, one block; clamped up to keep its two ids
        assert_eq!(t.requests[1].input_tokens, 33);
        let after: Vec<_> = t.requests.iter().map(|r| r.hash_ids.clone()).collect();
        assert_eq!(ids, after);
        let e = scale_lengths(&mut t, 0.3).unwrap_err().to_string();
        assert!(e.contains("whole number"), "{e}");
    }

    #[test]
    fn roots_spread_sessions_whole_and_max_isl_drops_max_osl_caps() {
        let mut reqs = Vec::new();
        for s in 0..40 {
            for turn in 0..3 {
                let mut r = req(1024 + 10 * turn, &[1, 2, 100 + s * 3 + turn]);
                r.session = Some(crate::trace::Session {
                    id: format!("s{s}"),
                    turn: turn as u32,
                    think_us: Some(2_000_000),
                });
                r.output_tokens = 100 * (turn + 1);
                r.arrival_us = 1_000_000 * (s * 3 + turn);
                reqs.push(r);
            }
        }
        let mut t = trace(512, reqs);
        let got = apply(
            &mut t,
            &Transforms {
                prefix_root: 4,
                max_isl: Some(1035),
                max_osl: Some(150),
                speedup: 2.0,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(got.dropped_max_isl, 40);
        assert_eq!(got.capped_max_osl, 40);
        let roots: std::collections::BTreeSet<u64> =
            t.requests.iter().map(|r| r.hash_ids[0]).collect();
        assert_eq!(roots.len(), 4);
        for w in t.requests.chunks(2) {
            assert_eq!(
                w[0].hash_ids[0], w[1].hash_ids[0],
                "a session stays in one copy"
            );
        }
        assert_eq!(t.requests[1].arrival_us, 500_000);
        assert_eq!(
            t.requests[1].session.as_ref().unwrap().think_us,
            Some(1_000_000)
        );
        assert!(t.requests.iter().all(|r| r.output_tokens <= 150));
    }

    #[test]
    fn defaults_change_nothing() {
        let mut t = trace(512, vec![req(1000, &[1, 2]), req(513, &[1, 3])]);
        let before = t.clone();
        apply(&mut t, &Transforms::default()).unwrap();
        assert_eq!(t, before);
    }
}
