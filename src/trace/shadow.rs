//! Shadow copies: what a recording proxy with `--shadow` measured of the copy of a request it
//! sent to each shadow target, kept in the primary's own record so the pairs are exact. The
//! header names the targets (meta `shadow.K`: `candidate URL` or `control URL`).

use super::Response;
use std::collections::BTreeMap;

/// Most shadow targets a recording has: four candidates and a control.
pub const MAX_SHADOWS: usize = 5;

/// The header meta key naming shadow target `k`.
pub fn meta_key(k: usize) -> String {
    format!("shadow.{k}")
}

/// A shadow target's part in the comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The server under test.
    Candidate,
    /// A second copy of the primary's build: the noise floor (Diffy's secondary).
    Control,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Candidate => "candidate",
            Role::Control => "control",
        }
    }
}

/// A recording's shadow targets, by index, read from its header's meta.
pub fn targets(meta: &BTreeMap<String, String>) -> Vec<(Role, String)> {
    (0..MAX_SHADOWS)
        .map_while(|k| meta.get(&meta_key(k)))
        .map(|v| {
            let (role, url) = v.split_once(' ').unwrap_or(("candidate", v));
            let role = match role {
                "control" => Role::Control,
                _ => Role::Candidate,
            };
            (role, url.to_string())
        })
        .collect()
}

/// The meta value of a target.
pub fn meta_value(role: Role, url: &str) -> String {
    format!("{} {url}", role.as_str())
}

/// One copy of a request, as its shadow answered it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShadowCopy {
    /// The target's index (the header's `shadow.K`).
    pub target: u8,
    /// µs from the primary's arrival to the copy's send.
    pub sent_us: u64,
    /// µs from the primary's arrival to the moment its request was whole and the copy was
    /// offered (at most `sent_us`; 0 in recordings before format 1.7): the origin `compare
    /// --shadow` times the primary's TTFT and E2EL from, as the copy's are from its send, so
    /// that the client's upload of the body counts on neither side.
    pub ready_us: u64,
    /// Why there is no measurement: the copy was not sent (`in_flight`, `bytes`,
    /// `body_over_cap`), or its measurement was given up (`budget`).
    pub skipped: Option<String>,
    /// The shadow's response, timed as the primary's is: offsets are µs from the copy's send.
    pub response: Option<Box<Response>>,
    /// Generated tokens (the shadow's usage, else its events' tokens).
    pub output_tokens: u64,
    /// Output agreement, for a deterministic request (temperature 0 or a seed) whose outputs
    /// were both read whole.
    pub agreement: Option<Agreement>,
}

/// How far two outputs agree. Lengths are bytes of the generated text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Agreement {
    /// xxh3 of the primary's output text.
    pub primary_hash: u64,
    /// xxh3 of the shadow's output text.
    pub shadow_hash: u64,
    /// Bytes from the start on which both agree.
    pub prefix: u64,
    pub primary_len: u64,
    pub shadow_len: u64,
}

impl Agreement {
    /// Measures two output texts.
    pub fn of(primary: &[u8], shadow: &[u8]) -> Agreement {
        let prefix = primary
            .iter()
            .zip(shadow)
            .take_while(|(a, b)| a == b)
            .count();
        Agreement {
            primary_hash: xxhash_rust::xxh3::xxh3_64(primary),
            shadow_hash: xxhash_rust::xxh3::xxh3_64(shadow),
            prefix: prefix as u64,
            primary_len: primary.len() as u64,
            shadow_len: shadow.len() as u64,
        }
    }

    /// Both outputs are the same text.
    pub fn identical(&self) -> bool {
        self.primary_len == self.shadow_len && self.prefix == self.primary_len
    }

    /// The agreeing prefix as a fraction of the longer output (1 when both are empty).
    pub fn prefix_fraction(&self) -> f64 {
        match self.primary_len.max(self.shadow_len) {
            0 => 1.0,
            n => self.prefix as f64 / n as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agreement_counts_the_common_prefix_of_the_longer_output() {
        let a = Agreement::of(b"hello world", b"hello there");
        assert_eq!((a.prefix, a.primary_len, a.shadow_len), (6, 11, 11));
        assert!(!a.identical());
        assert!((a.prefix_fraction() - 6.0 / 11.0).abs() < 1e-12);
        let same = Agreement::of(b"abc", b"abc");
        assert!(same.identical());
        assert_eq!(same.primary_hash, same.shadow_hash);
        assert_eq!(Agreement::of(b"", b"").prefix_fraction(), 1.0);
        assert_eq!(Agreement::of(b"ab", b"abcd").prefix_fraction(), 0.5);
    }

    #[test]
    fn targets_are_read_in_order_from_the_meta() {
        let mut m = BTreeMap::new();
        m.insert(meta_key(0), meta_value(Role::Candidate, "http://a:1"));
        m.insert(meta_key(1), meta_value(Role::Control, "http://b:2"));
        m.insert(meta_key(3), meta_value(Role::Control, "http://skipped:3"));
        let t = targets(&m);
        assert_eq!(
            t,
            vec![
                (Role::Candidate, "http://a:1".to_string()),
                (Role::Control, "http://b:2".to_string())
            ]
        );
    }
}
