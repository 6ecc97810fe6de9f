//! A run's per-request data as compare, report and merge use it ([`Requests`]): index-aligned
//! arrays in seconds from the first send, made from a result file's [`Columns`] (or, in
//! `report`, from a trace or an AIPerf export).

use super::read::Columns;

/// Index-aligned per-request arrays, times in seconds (vLLM's layout). Start times are shifted
/// so the first request starts at 0.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Requests {
    pub(crate) input_lens: Vec<u64>,
    pub(crate) output_lens: Vec<u64>,
    pub(crate) start_s: Vec<f64>,
    /// When the schedule wanted each request sent (retrace only), same origin as `start_s`.
    pub(crate) intended_s: Option<Vec<f64>>,
    pub(crate) ttft_s: Vec<Option<f64>>,
    pub(crate) latency_s: Vec<Option<f64>>,
    pub(crate) itls_s: Vec<Vec<f64>>,
    /// `""` on success.
    pub(crate) errors: Vec<String>,
    pub(crate) client_queue_s: Vec<Option<f64>>,
    pub(crate) server_queue_s: Vec<Option<f64>>,
    pub(crate) server_ttft_s: Vec<Option<f64>>,
    /// Prompt lengths as the server counted them (retrace results), where it said.
    pub server_input_lens: Vec<Option<u64>>,
    /// Requests answered whole, not streamed (retrace results' `non_streamed`, a recording's
    /// responses without events): kept out of TTFT, TPOT, ITL and E2EL, as the result's own
    /// statistics keep them. Empty when every request streamed (or the file does not say).
    pub non_streamed: Vec<bool>,
}

impl Requests {
    pub fn len(&self) -> usize {
        self.start_s.len()
    }
    pub fn is_empty(&self) -> bool {
        self.start_s.is_empty()
    }
    /// Succeeded with a first token.
    pub fn ok(&self, i: usize) -> bool {
        self.errors[i].is_empty() && self.ttft_s[i].is_some()
    }

    /// When request `i` ended, s (start + E2EL; start + TTFT or start for failures).
    pub(crate) fn end_s(&self, i: usize) -> f64 {
        self.start_s[i] + self.latency_s[i].or(self.ttft_s[i]).unwrap_or(0.0)
    }
}

impl Requests {
    /// A result's per-request arrays: times from the first send (or the first intended send,
    /// when earlier), 0 as "no first token" (vLLM's and ours).
    pub(crate) fn from_columns(c: &Columns) -> Requests {
        let t0 = c
            .start_times
            .iter()
            .flatten()
            .copied()
            .fold(f64::INFINITY, f64::min);
        let t0 = if t0.is_finite() { t0 } else { 0.0 };
        // retrace's start times and intended times share t0; shift both by the same origin.
        let origin = match &c.intended_times {
            Some(v) => v.iter().flatten().copied().fold(t0, f64::min),
            None => t0,
        };
        let pos = |v: &Option<f64>| v.filter(|x| *x > 0.0);
        Requests {
            input_lens: c.input_lens.clone(),
            output_lens: c.output_lens.clone(),
            start_s: c
                .start_times
                .iter()
                .map(|v| v.map_or(0.0, |x| x - origin))
                .collect(),
            intended_s: c
                .intended_times
                .as_ref()
                .map(|v| v.iter().map(|x| x.unwrap_or(0.0) - origin).collect()),
            ttft_s: c.ttfts.iter().map(pos).collect(),
            latency_s: c.latencies.iter().map(pos).collect(),
            itls_s: c.itls.clone(),
            errors: c.errors.clone(),
            client_queue_s: c.client_queue_times.clone(),
            server_queue_s: c.server_queue_times.clone(),
            server_ttft_s: c.server_ttfts.clone(),
            server_input_lens: c
                .server_input_lens
                .iter()
                .map(|v| v.filter(|x| *x >= 1.0).map(|x| x as u64))
                .collect(),
            non_streamed: c.non_streamed.clone(),
        }
    }
}
