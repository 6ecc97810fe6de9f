//! Why an exchange failed on the proxy's side, one type for both engines: [`ProxyFailure::as_str`] is
//! the wire name of trace records and `/metrics`, [`ProxyFailure::status`] what a client gets before
//! the response head.

/// A transport failure of one exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProxyFailure {
    /// Dialing the upstream failed.
    UpstreamConnect,
    /// Dialing the upstream timed out.
    TimeoutConnect,
    /// No response head within the response-header (or total) timeout.
    TimeoutHeaders,
    /// The upstream closed, refused the request or sent a bad head before the response head.
    UpstreamClosed,
    /// The upstream failed after the response head.
    UpstreamReset,
    /// No data from the upstream within the idle timeout.
    TimeoutIdle,
    /// The total timeout cut the response.
    TimeoutTotal,
    /// The upstream's chunked framing was invalid after the response head; what came before it
    /// was forwarded.
    UpstreamFraming,
    /// The client's request body was malformed or broke off.
    ClientBody,
    /// Anything else (e.g. a target that cannot be forwarded).
    Other,
    /// The proxy drained and cut an upgraded tunnel (not counted as an upstream error).
    DrainDeadline,
    /// The upstream answered before the whole request body was sent to it (and stopped
    /// reading); the answer was forwarded. Not counted as an upstream error.
    BodyUnsent,
    /// A shadow's response ran past `--capture-max`: the copy was cut there.
    CaptureMax,
    /// A shadow copy was cut because the shadows' byte budget was spent.
    ShadowBudget,
}

impl ProxyFailure {
    /// The kinds `/metrics` counts, in its order.
    pub(crate) const COUNTED: [ProxyFailure; 10] = [
        ProxyFailure::UpstreamConnect,
        ProxyFailure::TimeoutConnect,
        ProxyFailure::TimeoutHeaders,
        ProxyFailure::UpstreamClosed,
        ProxyFailure::UpstreamReset,
        ProxyFailure::TimeoutIdle,
        ProxyFailure::TimeoutTotal,
        ProxyFailure::UpstreamFraming,
        ProxyFailure::ClientBody,
        ProxyFailure::Other,
    ];

    /// The wire name (trace records, metrics labels, JSON error `type`).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ProxyFailure::UpstreamConnect => "upstream_connect",
            ProxyFailure::TimeoutConnect => "timeout_connect",
            ProxyFailure::TimeoutHeaders => "timeout_headers",
            ProxyFailure::UpstreamClosed => "upstream_closed",
            ProxyFailure::UpstreamReset => "upstream_reset",
            ProxyFailure::TimeoutIdle => "timeout_idle",
            ProxyFailure::TimeoutTotal => "timeout_total",
            ProxyFailure::UpstreamFraming => "upstream_framing",
            ProxyFailure::ClientBody => "client_body",
            ProxyFailure::Other => "other",
            ProxyFailure::DrainDeadline => "drain_deadline",
            ProxyFailure::BodyUnsent => "request_body_unsent",
            ProxyFailure::CaptureMax => "capture_max",
            ProxyFailure::ShadowBudget => "shadow_budget",
        }
    }

    /// Status and reason phrase for a failure before the response head.
    pub(crate) fn status(self) -> (u16, &'static str) {
        match self {
            ProxyFailure::TimeoutConnect | ProxyFailure::TimeoutHeaders => (504, "Gateway Timeout"),
            ProxyFailure::ClientBody | ProxyFailure::Other => (400, "Bad Request"),
            _ => (502, "Bad Gateway"),
        }
    }

    /// Whether the proxy logs it as an upstream failure (the client's own faults and the
    /// upstream's silence are not worth a warning per request).
    pub(crate) fn is_upstream_fault(self) -> bool {
        !matches!(
            self,
            ProxyFailure::ClientBody
                | ProxyFailure::TimeoutHeaders
                | ProxyFailure::DrainDeadline
                | ProxyFailure::BodyUnsent
        )
    }
}

impl std::fmt::Display for ProxyFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_the_kind() {
        assert_eq!(ProxyFailure::TimeoutConnect.status().0, 504);
        assert_eq!(ProxyFailure::TimeoutHeaders.status().0, 504);
        assert_eq!(ProxyFailure::UpstreamConnect.status().0, 502);
        assert_eq!(ProxyFailure::UpstreamClosed.status().0, 502);
        assert_eq!(ProxyFailure::ClientBody.status().0, 400);
        let names: Vec<&str> = ProxyFailure::COUNTED.iter().map(|f| f.as_str()).collect();
        assert_eq!(names.last(), Some(&"other"));
        assert_eq!(names.len(), 10);
    }
}
