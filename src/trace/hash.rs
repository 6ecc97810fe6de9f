//! Chained block hashes of a prompt's tokens (Mooncake-style `hash_ids`).
//!
//! A prompt of token ids is cut into blocks of `block_size` tokens; block `i` gets
//! `hash_i = H(hash_{i-1}, tokens of block i)` with `hash_{-1} = 0`, so two prompts share `hash_i`
//! exactly when they share all tokens up to the end of block `i`. `H` is xxh3-64 (seeded with the
//! previous hash) by default, or HMAC-SHA256 keyed by a user secret (truncated to 64 bits) so a
//! shared trace cannot be matched against guessed low-entropy prompts. Tokens are hashed as
//! little-endian `u32`s. This module does not tokenize and does not compact ids (see
//! [`compact_ids`]).

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::collections::HashMap;

/// What the values in a trace's `hash_ids` mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HashScheme {
    /// Dense ids 0..N-1 (or 1..N) in order of first appearance, as imported from public traces.
    Dense,
    /// Chained xxh3-64.
    Xxh3,
    /// Chained HMAC-SHA256, truncated to the first 8 bytes (little-endian).
    HmacSha256,
}

/// Computes chained block hashes.
#[derive(Clone)]
pub enum BlockHasher {
    Xxh3,
    Hmac(Box<Hmac<Sha256>>),
}

impl std::fmt::Debug for BlockHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BlockHasher::Xxh3 => f.write_str("BlockHasher::Xxh3"),
            BlockHasher::Hmac(_) => f.write_str("BlockHasher::Hmac(<key>)"),
        }
    }
}

impl BlockHasher {
    pub fn xxh3() -> Self {
        BlockHasher::Xxh3
    }

    /// HMAC-SHA256 keyed by `key` (any length).
    pub fn hmac(key: &[u8]) -> Self {
        // new_from_slice accepts keys of any length for HMAC.
        let mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
        BlockHasher::Hmac(Box::new(mac))
    }

    pub(crate) fn scheme(&self) -> HashScheme {
        match self {
            BlockHasher::Xxh3 => HashScheme::Xxh3,
            BlockHasher::Hmac(_) => HashScheme::HmacSha256,
        }
    }

    /// A public name of the HMAC key (16 hex digits of HMAC(key, "retrace key id")): equal for
    /// recordings made with the same key, and saying nothing of the key; `None` for xxh3.
    pub(crate) fn key_id(&self) -> Option<String> {
        match self {
            BlockHasher::Xxh3 => None,
            BlockHasher::Hmac(mac) => {
                let mut m = (**mac).clone();
                m.update(b"retrace key id");
                let out = m.finalize().into_bytes();
                Some(out[..8].iter().map(|b| format!("{b:02x}")).collect())
            }
        }
    }

    /// The hash of one block given the previous block's hash.
    pub(crate) fn block(&self, prev: u64, tokens: &[u32]) -> u64 {
        match self {
            BlockHasher::Xxh3 => {
                let mut buf = Vec::with_capacity(tokens.len() * 4);
                for t in tokens {
                    buf.extend_from_slice(&t.to_le_bytes());
                }
                xxhash_rust::xxh3::xxh3_64_with_seed(&buf, prev)
            }
            BlockHasher::Hmac(mac) => {
                let mut m = (**mac).clone();
                m.update(&prev.to_le_bytes());
                for t in tokens {
                    m.update(&t.to_le_bytes());
                }
                let out = m.finalize().into_bytes();
                let mut b = [0u8; 8];
                b.copy_from_slice(&out[..8]);
                u64::from_le_bytes(b)
            }
        }
    }

    /// Chained hashes of `tokens` in blocks of `block_size`. With `partial_tail` the trailing
    /// partial block gets a hash too (ceil); otherwise it is dropped (floor).
    pub fn chain(&self, tokens: &[u32], block_size: usize, partial_tail: bool) -> Vec<u64> {
        let bs = block_size.max(1);
        let mut out = Vec::with_capacity(tokens.len().div_ceil(bs));
        let mut prev = 0u64;
        for block in tokens.chunks(bs) {
            if block.len() < bs && !partial_tail {
                break;
            }
            prev = self.block(prev, block);
            out.push(prev);
        }
        out
    }
}

/// Maps arbitrary ids to dense ids 0..N-1 in order of first appearance (as Mooncake exports do).
#[derive(Debug, Default)]
pub(crate) struct IdCompactor {
    map: HashMap<u64, u64>,
}

impl IdCompactor {
    pub(crate) fn new() -> Self {
        Self::default()
    }
    pub(crate) fn id(&mut self, raw: u64) -> u64 {
        let next = self.map.len() as u64;
        *self.map.entry(raw).or_insert(next)
    }
    /// [`Self::id`] while fewer than `max` ids are held; `None` for a new id past them.
    pub(crate) fn id_within(&mut self, raw: u64, max: usize) -> Option<u64> {
        if self.map.len() >= max && !self.map.contains_key(&raw) {
            return None;
        }
        Some(self.id(raw))
    }
}

/// Compacts every request's ids, in order, to 0..N-1 by first appearance.
#[cfg(test)]
pub(crate) fn compact_ids<'a>(lists: impl IntoIterator<Item = &'a [u64]>) -> Vec<Vec<u64>> {
    let mut c = IdCompactor::new();
    lists
        .into_iter()
        .map(|l| l.iter().map(|&h| c.id(h)).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_prefix_shares_hashes_and_diverges_after() {
        let h = BlockHasher::xxh3();
        let a: Vec<u32> = (0..40).collect();
        let mut b = a.clone();
        b[33] = 999;
        let ha = h.chain(&a, 16, true);
        let hb = h.chain(&b, 16, true);
        assert_eq!(ha.len(), 3);
        assert_eq!(ha[..2], hb[..2]);
        assert_ne!(ha[2], hb[2]);
        // floor drops the 8-token tail
        assert_eq!(h.chain(&a, 16, false), ha[..2].to_vec());
    }

    #[test]
    fn same_block_at_other_position_hashes_differently() {
        let h = BlockHasher::xxh3();
        let blk: Vec<u32> = vec![7; 4];
        let mut two = blk.clone();
        two.extend(&blk);
        let hs = h.chain(&two, 4, true);
        assert_ne!(hs[0], hs[1], "chaining must make position matter");
    }

    #[test]
    fn hmac_depends_on_key() {
        let toks: Vec<u32> = (0..32).collect();
        let a = BlockHasher::hmac(b"k1").chain(&toks, 16, true);
        let b = BlockHasher::hmac(b"k2").chain(&toks, 16, true);
        let a2 = BlockHasher::hmac(b"k1").chain(&toks, 16, true);
        assert_eq!(a, a2);
        assert_ne!(a, b);
        assert_ne!(a, BlockHasher::xxh3().chain(&toks, 16, true));
    }

    #[test]
    fn compaction_is_first_appearance_order() {
        let lists: Vec<Vec<u64>> = vec![vec![900, 5, 77], vec![900, 5, 12], vec![3]];
        let c = compact_ids(lists.iter().map(|v| v.as_slice()));
        assert_eq!(c, vec![vec![0, 1, 2], vec![0, 1, 3], vec![4]]);
    }
}
