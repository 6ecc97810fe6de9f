use super::*;

/// The server's own per-request report (vLLM's `metrics`, llama.cpp's `timings`), ms.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ServerTimes {
    pub queue_ms: Option<f64>,
    pub ttft_ms: Option<f64>,
    /// The prompt's length as the server counted it (`usage.prompt_tokens`), when it said.
    pub prompt_tokens: Option<u64>,
    /// Prompt tokens the server took from its prefix cache (llama.cpp's `cache_n`).
    pub cached_tokens: Option<u64>,
}

/// Client TTFT − server queue − server TTFT (any one unit): the time neither server figure
/// covers. A server that reports no queue time (llama.cpp) has its queue wait in it.
pub(crate) fn unattributed(client_ttft: f64, queue: Option<f64>, server_ttft: f64) -> f64 {
    client_ttft - queue.unwrap_or(0.0) - server_ttft
}

/// The per-request prefix-cache hits the server reported (`cached_tokens`), over the requests
/// that reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub(crate) struct ServerCache {
    pub(crate) requests: u64,
    pub(crate) cached_tokens: u64,
    /// Their prompt tokens (the server's count where it said, else what was sent).
    pub(crate) prompt_tokens: u64,
}

impl ServerCache {
    pub(crate) fn hit_rate(&self) -> Option<f64> {
        (self.prompt_tokens > 0).then(|| self.cached_tokens as f64 / self.prompt_tokens as f64)
    }
}

/// Why a request failed. [`Failure::as_str`] is its name in result files and error counts
/// (`errors_by_kind`, the `errors` array).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Failure {
    /// The server answered with this non-2xx status (`http_<status>`).
    Http(u16),
    /// The TCP connect or TLS handshake failed.
    Connect,
    /// The connection broke mid-response, or the framing was bad.
    Reset,
    /// An SSE message that is not a JSON object.
    MalformedStream,
    /// The server sent an error object in the stream.
    StreamError,
    /// The stream ended without a content message.
    NoContent,
    /// No byte for the idle timeout.
    TimeoutIdle,
    /// The request exceeded the total timeout.
    TimeoutTotal,
    /// The replayer itself could not run the request.
    Local,
    /// Cut where the client cancelled it in the recording (after the recorded events, or at
    /// the recorded end when none came): the replay did what was recorded, the target did not
    /// fail.
    CancelledAsRecorded,
    /// The run was interrupted (SIGINT, SIGTERM) before the request ended: cut in flight, or
    /// released and not sent.
    Interrupted,
}

impl Failure {
    /// The wire name: `http_503`, `connect`, `reset`, `malformed_stream`, `stream_error`,
    /// `no_content`, `timeout_idle`, `timeout_total`, `local`, `cancelled_as_recorded`,
    /// `interrupted`.
    pub(crate) fn as_str(&self) -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed(match self {
            Failure::Http(status) => return format!("http_{status}").into(),
            Failure::Connect => "connect",
            Failure::Reset => "reset",
            Failure::MalformedStream => "malformed_stream",
            Failure::StreamError => "stream_error",
            Failure::NoContent => "no_content",
            Failure::TimeoutIdle => "timeout_idle",
            Failure::TimeoutTotal => "timeout_total",
            Failure::Local => "local",
            Failure::CancelledAsRecorded => "cancelled_as_recorded",
            Failure::Interrupted => "interrupted",
        })
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.as_str())
    }
}

/// One finished request: its [`Scalars`] (read and written through it: `sample.ttft_ns`), its
/// ITL values and its error's text.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    pub scalars: Scalars,
    pub itls_ns: Vec<u64>,
    /// Human-readable detail of the error (first bytes of an error body, the I/O error).
    pub error_detail: Option<String>,
}

impl std::ops::Deref for Sample {
    type Target = Scalars;
    fn deref(&self) -> &Scalars {
        &self.scalars
    }
}

impl std::ops::DerefMut for Sample {
    fn deref_mut(&mut self) -> &mut Scalars {
        &mut self.scalars
    }
}

/// A finished request's fixed-size part (a [`Sample`] less its ITL values and error detail),
/// kept for the requests of a run up to its bound: the per-request figures vLLM's statistics are
/// computed from. Times are ns offsets from the run's t0.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Scalars {
    pub input_tokens: u64,
    /// Output tokens (usage chunk, else counted); 0 for a failure without output.
    pub output_tokens: u64,
    /// When the schedule wanted the request sent.
    pub intended_ns: u64,
    /// When the dispatcher released it (dispatch drift = dispatched − intended).
    pub dispatched_ns: u64,
    /// Time spent waiting for a `--max-concurrency` slot after the release (0 without a limit):
    /// the client queue.
    pub slot_wait_ns: u64,
    /// When it was handed to the connection (after any slot wait). vLLM's latencies start here.
    /// 0 when the request failed before it could be sent.
    pub sent_ns: u64,
    /// First content message, from `sent_ns`.
    pub ttft_ns: Option<u64>,
    /// End-to-end latency from `sent_ns`.
    pub e2el_ns: Option<u64>,
    /// When the request finished (last byte, or failure).
    pub end_ns: u64,
    /// Why it failed; `None` = success (or no content: see [`Scalars::ok`]).
    pub error: Option<Failure>,
    pub server: ServerTimes,
    /// The response came whole, not as a stream: its first "token" is its end. It stays out of
    /// TTFT, TPOT, ITL and E2EL (vLLM, which always streams, has no such requests) and is
    /// reported apart, E2EL only ([`Summary::non_streamed_e2el`]).
    pub non_streamed: bool,
}

impl Scalars {
    pub(crate) fn ok(&self) -> bool {
        self.error.is_none() && self.ttft_ns.is_some()
    }
    /// Send drift: how late the request was actually sent, less the time it waited for a
    /// concurrency slot (sent − slot wait − intended; negative = early). It is the dispatcher's
    /// lateness plus the hand-over to the request's task and the request's serialisation. A
    /// request that failed before it was sent counts its dispatch drift.
    pub(crate) fn drift_ns(&self) -> i64 {
        if self.sent_ns >= self.dispatched_ns && self.sent_ns > 0 {
            self.sent_ns.saturating_sub(self.slot_wait_ns) as i64 - self.intended_ns as i64
        } else {
            self.dispatch_drift_ns()
        }
    }
    /// The dispatcher's own lateness: release − intended.
    pub(crate) fn dispatch_drift_ns(&self) -> i64 {
        self.dispatched_ns as i64 - self.intended_ns as i64
    }
    /// Client queue: time waiting for a concurrency slot.
    pub(crate) fn client_queue_ns(&self) -> u64 {
        self.slot_wait_ns
    }
    /// TPOT in seconds, per vLLM (only when more than one output token).
    pub(crate) fn tpot_s(&self) -> Option<f64> {
        let (t, e) = (self.ttft_ns?, self.e2el_ns?);
        (self.output_tokens > 1)
            .then(|| (ns_to_s(e) - ns_to_s(t)) / (self.output_tokens - 1) as f64)
    }
}
