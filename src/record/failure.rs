//! Why an exchange failed on the proxy's side, one type for both engines: [`Failure::as_str`] is
//! the wire name of trace records and `/metrics`, [`Failure::status`] what a client gets before
//! the response head.

/// A transport failure of one exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
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
}

impl Failure {
    /// The kinds `/metrics` counts, in its order.
    pub(crate) const COUNTED: [Failure; 10] = [
        Failure::UpstreamConnect,
        Failure::TimeoutConnect,
        Failure::TimeoutHeaders,
        Failure::UpstreamClosed,
        Failure::UpstreamReset,
        Failure::TimeoutIdle,
        Failure::TimeoutTotal,
        Failure::UpstreamFraming,
        Failure::ClientBody,
        Failure::Other,
    ];

    /// The wire name (trace records, metrics labels, JSON error `type`).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Failure::UpstreamConnect => "upstream_connect",
            Failure::TimeoutConnect => "timeout_connect",
            Failure::TimeoutHeaders => "timeout_headers",
            Failure::UpstreamClosed => "upstream_closed",
            Failure::UpstreamReset => "upstream_reset",
            Failure::TimeoutIdle => "timeout_idle",
            Failure::TimeoutTotal => "timeout_total",
            Failure::UpstreamFraming => "upstream_framing",
            Failure::ClientBody => "client_body",
            Failure::Other => "other",
            Failure::DrainDeadline => "drain_deadline",
            Failure::BodyUnsent => "request_body_unsent",
        }
    }

    /// Status and reason phrase for a failure before the response head.
    pub(crate) fn status(self) -> (u16, &'static str) {
        match self {
            Failure::TimeoutConnect | Failure::TimeoutHeaders => (504, "Gateway Timeout"),
            Failure::ClientBody | Failure::Other => (400, "Bad Request"),
            _ => (502, "Bad Gateway"),
        }
    }

    /// Whether the proxy logs it as an upstream failure (the client's own faults and the
    /// upstream's silence are not worth a warning per request).
    pub(crate) fn is_upstream_fault(self) -> bool {
        !matches!(
            self,
            Failure::ClientBody
                | Failure::TimeoutHeaders
                | Failure::DrainDeadline
                | Failure::BodyUnsent
        )
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_the_kind() {
        assert_eq!(Failure::TimeoutConnect.status().0, 504);
        assert_eq!(Failure::TimeoutHeaders.status().0, 504);
        assert_eq!(Failure::UpstreamConnect.status().0, 502);
        assert_eq!(Failure::UpstreamClosed.status().0, 502);
        assert_eq!(Failure::ClientBody.status().0, 400);
        let names: Vec<&str> = Failure::COUNTED.iter().map(|f| f.as_str()).collect();
        assert_eq!(names.last(), Some(&"other"));
        assert_eq!(names.len(), 10);
    }
}
