use super::*;

/// The run's distributions as HdrHistograms.
#[derive(Debug, Clone)]
pub struct Histograms {
    /// name → histogram; units in the name (`ttft_us`, `drift_abs_ns`, ...).
    pub(crate) by_name: BTreeMap<String, Histogram<u64>>,
}

impl Default for Histograms {
    /// Empty: `ttft_us`, `tpot_us`, `itl_us`, `e2el_us` (up to an hour), `drift_abs_ns`,
    /// `client_queue_ns` (up to an hour).
    fn default() -> Histograms {
        const HOUR_US: u64 = 3_600_000_000;
        const HOUR_NS: u64 = 3_600_000_000_000;
        let hist = |high| Histogram::new_with_bounds(1, high, 3).expect("valid static bounds");
        let mut h = BTreeMap::new();
        for name in ["ttft_us", "tpot_us", "itl_us", "e2el_us"] {
            h.insert(name.to_string(), hist(HOUR_US));
        }
        for name in ["drift_abs_ns", "client_queue_ns"] {
            h.insert(name.to_string(), hist(HOUR_NS));
        }
        Histograms { by_name: h }
    }
}

impl Histograms {
    /// The histograms of `samples` (see [`Histograms::record`]).
    pub fn from_samples(samples: &[Sample]) -> Histograms {
        let mut h = Histograms::default();
        for s in samples {
            h.record(&s.scalars, &s.itls_ns);
        }
        h
    }

    /// Adds one request: its drift and client queue always, its latencies when it succeeded.
    pub(crate) fn record(&mut self, s: &Scalars, itls_ns: &[u64]) {
        let h = &mut self.by_name;
        fn rec(h: &mut BTreeMap<String, Histogram<u64>>, name: &str, v: u64) {
            if let Some(hist) = h.get_mut(name) {
                hist.saturating_record(v.max(1));
            }
        }
        rec(h, "drift_abs_ns", s.drift_ns().unsigned_abs());
        rec(h, "client_queue_ns", s.client_queue_ns());
        if !s.ok() || s.non_streamed {
            return;
        }
        if let Some(t) = s.ttft_ns {
            rec(h, "ttft_us", t / 1000);
        }
        if let Some(e) = s.e2el_ns {
            rec(h, "e2el_us", e / 1000);
        }
        if let Some(t) = s.tpot_s() {
            rec(h, "tpot_us", (t * 1e6).round() as u64);
        }
        if let Some(hist) = h.get_mut("itl_us") {
            // One lookup per request, not per token.
            for &i in itls_ns {
                hist.saturating_record((i / 1000).max(1));
            }
        }
    }

    /// name → base64 of the V2 serialisation.
    pub(crate) fn encode(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let mut ser = V2Serializer::new();
        for (name, h) in &self.by_name {
            let mut buf = Vec::new();
            if ser.serialize(h, &mut buf).is_ok() {
                out.insert(
                    name.clone(),
                    base64::engine::general_purpose::STANDARD.encode(&buf),
                );
            }
        }
        out
    }

    /// Decodes one histogram written by [`Histograms::encode`].
    pub fn decode(b64: &str) -> Result<Histogram<u64>, String> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map_err(|e| format!("histogram is not base64: {e}"))?;
        Deserializer::new()
            .deserialize(&mut bytes.as_slice())
            .map_err(|e| format!("histogram is not HdrHistogram V2: {e:?}"))
    }
}
