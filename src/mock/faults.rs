//! Injected faults: which misbehaviour a request gets, decided by seeded rates (request `n` gets
//! kind `k` when `xxh3(n, k; seed) / 2^64 < rate_k`) or forced by the `x-mock-fault` header
//! (docs/mock.md, "Faults"). This module only decides; the API and the engine carry them out.

/// The request header that forces faults on one request.
pub(crate) const FAULT_HEADER: &str = "x-mock-fault";

/// Fault rates and shapes (flags).
#[derive(Debug, Clone, PartialEq)]
pub struct FaultConfig {
    /// Fraction of requests answered with an error status.
    pub status_rate: f64,
    /// Statuses drawn from (uniformly, seeded).
    pub status_codes: Vec<u16>,
    /// Fraction of requests that stall before their first token.
    pub stall_first_rate: f64,
    /// Fraction of requests that stall mid-stream.
    pub stall_mid_rate: f64,
    /// Stall length.
    pub stall_ms: f64,
    /// Tokens sent before a mid-stream stall.
    pub stall_after_tokens: u32,
    /// Fraction of requests whose connection is reset.
    pub reset_rate: f64,
    /// Tokens sent before the reset.
    pub reset_after_tokens: u32,
    /// Fraction of requests whose response headers are delayed.
    pub slow_headers_rate: f64,
    pub slow_headers_ms: f64,
}

impl Default for FaultConfig {
    /// No faults; the shapes `retrace mock` defaults to.
    fn default() -> Self {
        FaultConfig {
            status_rate: 0.0,
            status_codes: vec![429, 500, 503],
            stall_first_rate: 0.0,
            stall_mid_rate: 0.0,
            stall_ms: 1000.0,
            stall_after_tokens: 8,
            reset_rate: 0.0,
            reset_after_tokens: 4,
            slow_headers_rate: 0.0,
            slow_headers_ms: 1000.0,
        }
    }
}

/// The faults one request gets.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FaultPlan {
    pub(crate) status: Option<u16>,
    pub(crate) stall_first_ms: Option<f64>,
    /// (tokens before the stall, stall ms)
    pub(crate) stall_mid: Option<(u32, f64)>,
    pub(crate) reset_after: Option<u32>,
    pub(crate) slow_headers_ms: Option<f64>,
}

impl FaultPlan {
    /// Number of distinct faults in the plan (for the injected-faults counter).
    pub(crate) fn count(&self) -> u64 {
        [
            self.status.is_some(),
            self.stall_first_ms.is_some(),
            self.stall_mid.is_some(),
            self.reset_after.is_some(),
            self.slow_headers_ms.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count() as u64
    }
}

fn unit(seed: u64, n: u64, kind: u8) -> f64 {
    let mut b = [0u8; 9];
    b[..8].copy_from_slice(&n.to_le_bytes());
    b[8] = kind;
    (xxhash_rust::xxh3::xxh3_64_with_seed(&b, seed) >> 11) as f64 / (1u64 << 53) as f64
}

impl FaultConfig {
    /// The seeded plan for request number `n`.
    pub(crate) fn plan(&self, seed: u64, n: u64) -> FaultPlan {
        let hit = |kind: u8, rate: f64| rate > 0.0 && unit(seed, n, kind) < rate;
        let mut p = FaultPlan::default();
        if hit(1, self.status_rate) {
            let codes = if self.status_codes.is_empty() {
                &[500][..]
            } else {
                &self.status_codes[..]
            };
            let i = (unit(seed, n, 2) * codes.len() as f64) as usize;
            p.status = Some(codes[i.min(codes.len() - 1)]);
        }
        p.stall_first_ms = hit(3, self.stall_first_rate).then_some(self.stall_ms);
        p.stall_mid =
            hit(4, self.stall_mid_rate).then_some((self.stall_after_tokens, self.stall_ms));
        p.reset_after = hit(5, self.reset_rate).then_some(self.reset_after_tokens);
        p.slow_headers_ms = hit(6, self.slow_headers_rate).then_some(self.slow_headers_ms);
        p
    }
}

/// An `x-mock-fault` header the mock cannot follow (answered with 400).
#[derive(Debug, thiserror::Error)]
#[error("{FAULT_HEADER}: {0}")]
pub(crate) struct BadFaultHeader(pub String);

fn ms(v: &str, what: &str) -> Result<f64, BadFaultHeader> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && *x >= 0.0 && *x <= 3_600_000.0)
        .ok_or_else(|| BadFaultHeader(format!("`{what}` wants milliseconds, got `{v}`")))
}

fn count(v: &str, what: &str) -> Result<u32, BadFaultHeader> {
    v.trim()
        .parse::<u32>()
        .map_err(|_| BadFaultHeader(format!("`{what}` wants a token count, got `{v}`")))
}

/// Parses the `x-mock-fault` header.
pub(crate) fn parse_header(value: &str) -> Result<FaultPlan, BadFaultHeader> {
    let mut p = FaultPlan::default();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (k, v) = item.split_once('=').unwrap_or((item, ""));
        match k.trim() {
            "none" => {}
            "status" => {
                let code = v.trim().parse::<u16>().ok();
                let code = code.filter(|c| (400..=599).contains(c));
                let bad = || BadFaultHeader(format!("`status` wants 400..599, got `{v}`"));
                p.status = Some(code.ok_or_else(bad)?);
            }
            "stall-first" => p.stall_first_ms = Some(ms(v, k)?),
            "stall-mid" => {
                let (n, d) = v.split_once(':').ok_or_else(|| {
                    BadFaultHeader(format!("`stall-mid` wants TOKENS:MS, got `{v}`"))
                })?;
                p.stall_mid = Some((count(n, k)?, ms(d, k)?));
            }
            "reset-after" => p.reset_after = Some(count(v, k)?),
            "slow-headers" => p.slow_headers_ms = Some(ms(v, k)?),
            other => {
                return Err(BadFaultHeader(format!(
                    "unknown fault `{other}` (status, stall-first, stall-mid, reset-after, slow-headers, none)"
                )))
            }
        }
    }
    Ok(p)
}

/// vLLM-style error type name for a status.
pub(crate) fn error_type(status: u16) -> &'static str {
    match status {
        400 => "BadRequestError",
        401 => "AuthenticationError",
        404 => "NotFoundError",
        429 => "RateLimitError",
        500 => "InternalServerError",
        503 => "ServiceUnavailableError",
        _ => "Error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_parses_every_kind() {
        let p = parse_header(
            "status=503, stall-first=200,stall-mid=5:300.5,reset-after=3,slow-headers=50",
        )
        .unwrap();
        assert_eq!(p.status, Some(503));
        assert_eq!(p.stall_first_ms, Some(200.0));
        assert_eq!(p.stall_mid, Some((5, 300.5)));
        assert_eq!(p.reset_after, Some(3));
        assert_eq!(p.slow_headers_ms, Some(50.0));
        assert_eq!(p.count(), 5);
        assert_eq!(parse_header("none").unwrap(), FaultPlan::default());
        assert!(parse_header("status=200").is_err());
        assert!(parse_header("stall-mid=5").is_err());
        assert!(parse_header("explode")
            .unwrap_err()
            .to_string()
            .contains("explode"));
        assert!(parse_header("stall-first=-1").is_err());
    }

    #[test]
    fn seeded_rates_are_deterministic_and_near_the_rate() {
        let c = FaultConfig {
            status_rate: 0.2,
            reset_rate: 0.1,
            ..Default::default()
        };
        let a: Vec<FaultPlan> = (0..2000).map(|n| c.plan(7, n)).collect();
        let b: Vec<FaultPlan> = (0..2000).map(|n| c.plan(7, n)).collect();
        assert_eq!(a, b);
        let statuses = a.iter().filter(|p| p.status.is_some()).count();
        assert!((300..500).contains(&statuses), "{statuses}");
        for code in [429, 500, 503] {
            assert!(a.iter().any(|p| p.status == Some(code)));
        }
        let resets = a.iter().filter(|p| p.reset_after.is_some()).count();
        assert!((130..270).contains(&resets), "{resets}");
        assert_eq!(FaultConfig::default().plan(7, 3), FaultPlan::default());
        let other: Vec<FaultPlan> = (0..2000).map(|n| c.plan(8, n)).collect();
        assert_ne!(a, other);
    }
}
