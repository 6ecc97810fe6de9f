//! The simulated KV cache with automatic prefix caching, following vLLM's block manager: full
//! prompt blocks registered under their chained hash, the longest registered leading run reused
//! (the block holding the last prompt token always recomputed), unreferenced cached blocks
//! evicted least-recently-released first (docs/mock.md, "Prefix cache"). This module does no
//! timing and knows nothing of requests.

use std::collections::{BTreeMap, HashMap};

/// Hashes u64 keys with one multiply instead of SipHash: the engine's own ids (not chosen by a
/// client) and block hashes (xxh3 outputs, already mixed).
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A map keyed by u64 with [`IdHasher`].
pub(crate) type IdMap<V> = HashMap<u64, V, std::hash::BuildHasherDefault<IdHasher>>;

#[derive(Debug, Clone, Default)]
struct Block {
    hash: Option<u64>,
    refs: u32,
    /// Position in the LRU list while `refs == 0` and `hash` is set.
    lru_tick: u64,
}

/// The blocks a sequence holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Alloc {
    pub(crate) blocks: Vec<u32>,
    /// Prompt tokens whose KV came from the cache (whole blocks).
    pub(crate) hit_tokens: u32,
}

#[derive(Debug)]
pub(crate) struct PrefixCache {
    block_size: u32,
    blocks: Vec<Block>,
    free: Vec<u32>,
    by_hash: IdMap<u32>,
    lru: BTreeMap<u64, u32>,
    tick: u64,
    in_use: usize,
}

impl PrefixCache {
    pub(crate) fn new(total_blocks: usize, block_size: u32) -> Self {
        PrefixCache {
            block_size: block_size.max(1),
            blocks: vec![Block::default(); total_blocks],
            free: (0..total_blocks as u32).rev().collect(),
            by_hash: IdMap::default(),
            lru: BTreeMap::new(),
            tick: 0,
            in_use: 0,
        }
    }

    /// Fraction of blocks referenced by running sequences (vLLM's `kv_cache_usage_perc`, 0..1).
    pub(crate) fn usage(&self) -> f64 {
        self.in_use as f64 / self.blocks.len().max(1) as f64
    }

    /// Blocks needed for `tokens` tokens.
    pub(crate) fn blocks_for(&self, tokens: u32) -> usize {
        tokens.div_ceil(self.block_size) as usize
    }

    /// Leading blocks of `hashes` that would hit, under the last-block rule for a prompt of
    /// `prompt_len` tokens.
    fn matched_blocks(&self, hashes: &[u64], prompt_len: u32) -> usize {
        let cap = (prompt_len.saturating_sub(1) / self.block_size) as usize;
        hashes
            .iter()
            .take(cap)
            .take_while(|h| self.by_hash.contains_key(h))
            .count()
    }

    /// Takes the cached prefix of `hashes` plus fresh blocks up to `need_blocks` in all, or
    /// returns `None` (changing nothing) when capacity does not allow it.
    pub(crate) fn acquire(
        &mut self,
        hashes: &[u64],
        prompt_len: u32,
        need_blocks: usize,
    ) -> Option<Alloc> {
        let matched = self.matched_blocks(hashes, prompt_len).min(need_blocks);
        let matched_idle = hashes[..matched]
            .iter()
            .filter(|h| self.blocks[self.by_hash[*h] as usize].refs == 0)
            .count();
        let fresh = need_blocks - matched;
        if self.free.len() + self.lru.len() - matched_idle < fresh {
            return None;
        }
        let mut out = Vec::with_capacity(need_blocks);
        for h in &hashes[..matched] {
            let id = self.by_hash[h];
            self.take_ref(id);
            out.push(id);
        }
        for _ in 0..fresh {
            let id = match self.free.pop() {
                Some(id) => id,
                None => {
                    let (_, id) = self.lru.pop_first()?;
                    if let Some(h) = self.blocks[id as usize].hash.take() {
                        self.by_hash.remove(&h);
                    }
                    id
                }
            };
            self.take_ref(id);
            out.push(id);
        }
        Some(Alloc {
            blocks: out,
            hit_tokens: matched as u32 * self.block_size,
        })
    }

    fn take_ref(&mut self, id: u32) {
        let b = &mut self.blocks[id as usize];
        if b.refs == 0 {
            self.in_use += 1;
            if b.hash.is_some() {
                self.lru.remove(&b.lru_tick);
            }
        }
        b.refs += 1;
    }

    /// Registers a computed full block under its chained hash. When another block already holds
    /// that hash (two sequences computed the same prefix concurrently), the first one stays.
    pub(crate) fn register(&mut self, id: u32, hash: u64) {
        if self.by_hash.contains_key(&hash) || self.blocks[id as usize].hash.is_some() {
            return;
        }
        self.blocks[id as usize].hash = Some(hash);
        self.by_hash.insert(hash, id);
    }

    /// vLLM's `reset_prefix_cache`: forgets every cached block, when no running sequence holds
    /// one (true); else changes nothing (false), as vLLM does.
    pub(crate) fn reset(&mut self) -> bool {
        if self.in_use > 0 {
            return false;
        }
        for b in &mut self.blocks {
            b.hash = None;
        }
        self.by_hash.clear();
        self.lru.clear();
        self.free = (0..self.blocks.len() as u32).rev().collect();
        true
    }

    /// Drops one reference to each block; unreferenced cached blocks become evictable (LRU).
    pub(crate) fn release(&mut self, blocks: &[u32]) {
        for &id in blocks {
            let b = &mut self.blocks[id as usize];
            if b.refs == 0 {
                continue;
            }
            b.refs -= 1;
            if b.refs == 0 {
                self.in_use -= 1;
                if b.hash.is_some() {
                    self.tick += 1;
                    b.lru_tick = self.tick;
                    self.lru.insert(self.tick, id);
                } else {
                    self.free.push(id);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::hash::BlockHasher;

    fn hashes(tokens: &[u32], bs: usize) -> Vec<u64> {
        BlockHasher::xxh3().chain(tokens, bs, false)
    }

    /// Runs one request to completion: acquire, register every full prompt block, release.
    fn run(c: &mut PrefixCache, tokens: &[u32]) -> u32 {
        let bs = c.block_size as usize;
        let h = hashes(tokens, bs);
        let need = c.blocks_for(tokens.len() as u32);
        let a = c.acquire(&h, tokens.len() as u32, need).unwrap();
        for (i, hh) in h.iter().enumerate() {
            c.register(a.blocks[i], *hh);
        }
        c.release(&a.blocks);
        a.hit_tokens
    }

    #[test]
    fn a_reset_forgets_every_cached_block_unless_one_is_in_use() {
        let mut c = PrefixCache::new(8, 4);
        let p: Vec<u32> = (0..12).collect();
        run(&mut c, &p);
        assert_eq!(run(&mut c, &p), 8, "cached");
        assert!(c.reset());
        assert_eq!(run(&mut c, &p), 0, "forgotten");
        let h = hashes(&p, 4);
        let held = c.acquire(&h, 12, 3).unwrap();
        assert!(!c.reset(), "a running sequence holds blocks");
        c.release(&held.blocks);
        assert!(c.reset());
    }

    /// vLLM's rule: hits = min(floor(P/B)*B, floor((L-1)/B)*B).
    #[test]
    fn hit_rule_table() {
        let b = 16u32;
        // (first prompt len, second prompt len, shared prefix P)
        for (l1, l2, p) in [
            (64, 64, 64),
            (65, 65, 65),
            (33, 40, 33),
            (100, 100, 20),
            (16, 16, 16),
            (17, 17, 17),
            (1, 1, 1),
            (48, 80, 48),
            (80, 48, 48),
        ] {
            let mut c = PrefixCache::new(64, b);
            let first: Vec<u32> = (0..l1).collect();
            let mut second: Vec<u32> = (0..l2).collect();
            for t in second.iter_mut().skip(p as usize) {
                *t += 10_000;
            }
            assert_eq!(run(&mut c, &first), 0);
            let want = ((p / b) * b).min(((l2 - 1) / b) * b);
            assert_eq!(run(&mut c, &second), want, "l1={l1} l2={l2} p={p}");
        }
    }

    #[test]
    fn lru_eviction_under_capacity() {
        let mut c = PrefixCache::new(4, 4);
        let a: Vec<u32> = (0..9).collect(); // 3 blocks, 2 full
        let b: Vec<u32> = (100..109).collect();
        run(&mut c, &a);
        run(&mut c, &b); // needs 3 blocks: 1 free + evicts a's oldest cached block
        assert_eq!(
            run(&mut c, &a),
            0,
            "a's first block was evicted, so nothing chains"
        );
        assert!(c.acquire(&[], 0, 5).is_none());
        assert_eq!(c.in_use, 0);
    }

    #[test]
    fn in_use_blocks_are_never_evicted() {
        let mut c = PrefixCache::new(3, 4);
        let h = hashes(&[1, 2, 3, 4, 5, 6, 7, 8], 4);
        let held = c.acquire(&h, 8, 2).unwrap();
        c.register(held.blocks[0], h[0]);
        c.register(held.blocks[1], h[1]);
        assert!(c.acquire(&[], 0, 2).is_none());
        let one = c.acquire(&[], 0, 1).unwrap();
        assert_eq!(c.usage(), 1.0);
        c.release(&one.blocks);
        c.release(&held.blocks);
        assert_eq!(c.usage(), 0.0);
        // a concurrent sequence sharing the registered block hits it while it is held
        let again = c.acquire(&h, 9, 3).unwrap();
        assert_eq!(again.hit_tokens, 8);
    }
}
