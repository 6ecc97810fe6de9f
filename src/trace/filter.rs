//! Filters applied while converting: time window, first N rows, 1-in-K sampling, speed factor.
//!
//! Applied in that order, to arrival offsets (µs from t0). The window keeps arrivals in
//! `[start, end)` and shifts them so the first kept arrival keeps its offset from `start`; the
//! speed factor divides every offset (2 = twice as fast; recorded per-request response timings are
//! left as they were measured). Pure; no I/O.

use super::Trace;

/// Conversion filters. `None`/`1` means "keep everything".
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Filters {
    /// `[start, end)` in µs of trace time.
    pub(crate) window_us: Option<(u64, u64)>,
    /// Keep only the first N requests (after the window).
    pub(crate) head: Option<usize>,
    /// Keep every K-th request (1 keeps all).
    pub(crate) sample_every: usize,
    /// Divide arrival offsets by this.
    pub(crate) speed: f64,
}

impl Default for Filters {
    fn default() -> Self {
        Filters {
            window_us: None,
            head: None,
            sample_every: 1,
            speed: 1.0,
        }
    }
}

/// Re-blocks hash ids to a block size `new_bs` that is a whole multiple of the trace's.
///
/// Chained ids identify whole prefixes, so the id of a coarse block is the id of the last fine
/// block it contains (every `k`-th id, `k = new_bs / old_bs`); with a partial tail (ceil) the last
/// fine id closes the trailing partial coarse block. Two requests therefore share coarse block `j`
/// exactly when they shared the fine prefix up to its end.
pub fn reblock(trace: &mut Trace, new_bs: u32) -> Result<(), String> {
    let rb = Reblock::new(&trace.header, new_bs)?;
    for r in &mut trace.requests {
        rb.apply(r);
    }
    trace.header.block_size = new_bs;
    Ok(())
}

/// [`reblock`] one request at a time.
pub(crate) struct Reblock {
    /// Fine blocks per coarse block (1: nothing to do), and whether tails are partial.
    k: usize,
    tail: bool,
}

impl Reblock {
    pub(crate) fn new(header: &super::TraceHeader, new_bs: u32) -> Result<Reblock, String> {
        let old = header.block_size;
        if new_bs != old && (old == 0 || new_bs == 0 || new_bs % old != 0) {
            return Err(format!(
                "block size {new_bs} is not a whole multiple of the trace's {old} tokens"
            ));
        }
        let k = if new_bs == old {
            1
        } else {
            (new_bs / old) as usize
        };
        Ok(Reblock {
            k,
            tail: header.partial_tail_block,
        })
    }

    pub(crate) fn apply(&self, r: &mut super::Request) {
        if self.k > 1 {
            r.hash_ids = self.ids(&r.hash_ids);
        }
    }

    /// The coarse ids of fine ids `h`.
    fn ids(&self, h: &[u64]) -> Vec<u64> {
        let k = self.k;
        let mut out: Vec<u64> = h.iter().skip(k - 1).step_by(k).copied().collect();
        if self.tail && h.len() % k != 0 {
            out.extend(h.last().copied());
        }
        out
    }
}

/// Re-chunks hash ids to `new_bs` tokens per block, any size (`inspect --block-size`).
///
/// A whole multiple of the trace's block size is exact ([`reblock`]). Otherwise the ids are
/// first split to blocks of `g = gcd(old, new_bs)` tokens: piece `j` of id `h` becomes the id of
/// `(h, j)`, exact for prompts that share `h` (chained ids: they share every token up to its
/// end); prompts whose ids differ at a position are taken to differ from that block's first
/// token (ids say nothing finer, so sharing is a lower bound), and tokens past the last id (a
/// floor trace's unhashed tail) as unique. The pieces are then merged by [`reblock`]. A piece's
/// id is derived from `(h, j)` alone ([`Rechunk`]: no table, whatever the trace's size).
#[cfg(test)]
pub(crate) fn rechunk(trace: &mut Trace, new_bs: u32) -> Result<(), String> {
    let mut rc = Rechunk::new(&trace.header, new_bs)?;
    for r in &mut trace.requests {
        r.hash_ids = rc.ids(r.input_tokens, &r.hash_ids);
    }
    trace.header = rc.header(&trace.header);
    Ok(())
}

/// [`rechunk`] one request at a time. Piece `j` of id `h` is `xxh3(h)` seeded with `j`, an
/// unhashed tail's pieces `xxh3(n)` seeded with `u64::MAX` for a counter `n`: computed, never
/// stored, so memory holds one request's pieces (distinct pairs collide with probability about
/// pairs² / 2^65, a few in 10^10 at a billion ids).
pub(crate) struct Rechunk {
    #[cfg(test)]
    new_bs: u32,
    /// Set when `new_bs` is not a whole multiple: the gcd-sized pieces and their ids.
    split: Option<Split>,
    merge: Reblock,
}

struct Split {
    pieces: super::TraceHeader,
    k: u64,
    /// Tail pieces so far.
    tails: u64,
}

impl Rechunk {
    pub(crate) fn new(header: &super::TraceHeader, new_bs: u32) -> Result<Rechunk, String> {
        let old = header.block_size;
        if new_bs == 0 || old == 0 {
            return Err("block size must be at least 1".into());
        }
        if new_bs % old == 0 {
            let merge = Reblock::new(header, new_bs)?;
            return Ok(Rechunk {
                #[cfg(test)]
                new_bs,
                split: None,
                merge,
            });
        }
        let g = gcd(old, new_bs);
        let mut pieces = header.clone();
        pieces.block_size = g;
        let merge = Reblock::new(&pieces, new_bs)?;
        let split = Split {
            pieces,
            k: u64::from(old / g),
            tails: 0,
        };
        Ok(Rechunk {
            #[cfg(test)]
            new_bs,
            split: Some(split),
            merge,
        })
    }

    /// The ids at `new_bs` of a prompt of `input_tokens` with ids `h`.
    pub(crate) fn ids(&mut self, input_tokens: u64, h: &[u64]) -> Vec<u64> {
        let Some(sp) = &mut self.split else {
            return if self.merge.k > 1 {
                self.merge.ids(h)
            } else {
                h.to_vec()
            };
        };
        let n = sp.pieces.blocks_for(input_tokens);
        let mut fine = Vec::with_capacity(n.min(1 << 20) as usize);
        use xxhash_rust::xxh3::xxh3_64_with_seed as xxh3;
        for i in 0..n {
            let id = match h.get((i / sp.k) as usize) {
                Some(&id) => xxh3(&id.to_le_bytes(), i % sp.k),
                None => {
                    sp.tails += 1;
                    xxh3(&sp.tails.to_le_bytes(), u64::MAX)
                }
            };
            fine.push(id);
        }
        self.merge.ids(&fine)
    }

    /// The header of the re-chunked trace.
    #[cfg(test)]
    pub(crate) fn header(&self, old: &super::TraceHeader) -> super::TraceHeader {
        let mut h = old.clone();
        h.block_size = self.new_bs;
        if self.split.is_some() {
            h.hash_scheme = super::HashScheme::Xxh3;
        }
        h
    }
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Applies the filters in place.
#[cfg(test)]
pub(crate) fn apply(trace: &mut Trace, f: &Filters) -> Result<(), String> {
    let mut run = Filtering::new(f)?;
    let reqs = std::mem::take(&mut trace.requests);
    trace.requests = reqs.into_iter().filter_map(|r| run.keep(r)).collect();
    Ok(())
}

/// [`apply`] one request at a time, in arrival order.
pub(crate) struct Filtering {
    f: Filters,
    /// Requests inside the window so far.
    seen: usize,
}

impl Filtering {
    pub(crate) fn new(f: &Filters) -> Result<Filtering, String> {
        if !(f.speed.is_finite() && f.speed > 0.0) {
            return Err(format!("speed {} must be a positive number", f.speed));
        }
        if f.sample_every == 0 {
            return Err("sample interval must be at least 1".into());
        }
        Ok(Filtering {
            f: f.clone(),
            seen: 0,
        })
    }

    /// True once `--head` is reached: no later request is kept.
    pub(crate) fn done(&self) -> bool {
        self.f.head.is_some_and(|n| self.seen >= n)
    }

    /// The request as kept, or `None`.
    pub(crate) fn keep(&mut self, mut r: super::Request) -> Option<super::Request> {
        if let Some((a, b)) = self.f.window_us {
            if r.arrival_us < a || r.arrival_us >= b {
                return None;
            }
            r.arrival_us -= a;
        }
        if self.done() {
            return None;
        }
        let k = self.seen;
        self.seen += 1;
        if k % self.f.sample_every != 0 {
            return None;
        }
        if self.f.speed != 1.0 {
            r.arrival_us = (r.arrival_us as f64 / self.f.speed).round() as u64;
        }
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Request, TraceHeader};

    #[test]
    fn filters_in_order() {
        let mut t = Trace {
            header: TraceHeader::imported(512, true, "t"),
            requests: (0..10)
                .map(|k| Request {
                    arrival_us: k * 1_000_000,
                    ..Default::default()
                })
                .collect(),
        };
        apply(
            &mut t,
            &Filters {
                window_us: Some((2_000_000, 8_000_000)),
                head: Some(5),
                sample_every: 2,
                speed: 2.0,
            },
        )
        .unwrap();
        let at: Vec<u64> = t.requests.iter().map(|r| r.arrival_us).collect();
        assert_eq!(at, vec![0, 1_000_000, 2_000_000]);
    }

    #[test]
    fn reblock_keeps_prefix_identity() {
        use crate::trace::hash::BlockHasher;
        let h = BlockHasher::xxh3();
        let a: Vec<u32> = (0..100).collect();
        let mut b = a.clone();
        b[70] = 7777; // differs inside coarse block 2 (tokens 64..96)
        let mut t = Trace {
            header: TraceHeader::imported(16, true, "t"),
            requests: [&a, &b]
                .iter()
                .map(|p| Request {
                    input_tokens: p.len() as u64,
                    hash_ids: h.chain(p, 16, true),
                    ..Default::default()
                })
                .collect(),
        };
        reblock(&mut t, 32).unwrap();
        let (ra, rb) = (&t.requests[0].hash_ids, &t.requests[1].hash_ids);
        // ceil(100/32) = 4 coarse blocks, and they equal the 32-token chain's structure
        assert_eq!(ra.len(), 4);
        assert_eq!(ra[..2], rb[..2]);
        assert_ne!(ra[2], rb[2]);
        assert_ne!(ra[3], rb[3]);
        assert!(reblock(&mut t, 48).is_err());
    }

    /// Split then merged back, a re-chunk is the identity on the sharing structure; a split keeps
    /// every shared id's pieces shared and a 3/2 re-chunk goes through 16-token pieces.
    #[test]
    fn rechunk_splits_ids_and_keeps_their_sharing() {
        let mut t = Trace {
            header: TraceHeader::imported(32, true, "t"),
            requests: vec![
                Request {
                    input_tokens: 70,
                    hash_ids: vec![1, 2, 3],
                    ..Default::default()
                },
                Request {
                    input_tokens: 64,
                    hash_ids: vec![1, 4],
                    ..Default::default()
                },
            ],
        };
        let mut fine = t.clone();
        rechunk(&mut fine, 16).unwrap();
        let (a, b) = (&fine.requests[0].hash_ids, &fine.requests[1].hash_ids);
        assert_eq!((a.len(), b.len()), (5, 4));
        assert_eq!(a[..2], b[..2]);
        assert_ne!(a[2], b[2]);
        rechunk(&mut t, 48).unwrap();
        assert_eq!(t.header.block_size, 48);
        let (a, b) = (&t.requests[0].hash_ids, &t.requests[1].hash_ids);
        // 70 tokens: ceil(70/48) = 2 blocks; 64 tokens: 2; the first 48 tokens (ids 1 and half of
        // 2 or 4) differ from token 32 on
        assert_eq!((a.len(), b.len()), (2, 2));
        assert_ne!(a[0], b[0]);
        assert!(rechunk(&mut t, 0).is_err());
    }
}
