//! Each finished request folded in as it completes: the workload's statistics
//! ([`Collector`]: running aggregates, and per request its fixed-size scalars and ITL values up
//! to their bounds), side requests apart, the first failure messages, and with `--detailed` its [`RequestRow`]: kept for the result's
//! inline arrays, or appended to the sidecar file when the run measures more than
//! [`sidecar::THRESHOLD`] requests. No [`Sample`] is held past its arrival.

use crate::metrics::{Collector, Sample};
use crate::replay::outcome::{self, Auxiliary, FirstError, RecordedOutcomes};
use crate::replay::plan::body::Tag;
use crate::replay::step::Watch;
use crate::result::sidecar;
use crate::result::{arrays, RequestRow};
use serde_json::{Map, Value};

/// Where `--detailed` rows go.
pub(crate) enum Detail {
    Off,
    /// By workload index, for the result's inline arrays.
    Inline(Vec<Option<RequestRow>>),
    File(sidecar::Writer),
}

/// What the run keeps of its finished requests.
pub(crate) struct Collect {
    pub(crate) work: Collector,
    /// Side requests (`--include-aux`).
    pub(crate) aux: Auxiliary,
    pub(crate) first_errors: Vec<FirstError>,
    /// RecordedOutcomes against replayed outcomes, when the trace holds recorded responses (each
    /// request's recorded failure kind is in its tag).
    pub(crate) recorded: Option<RecordedOutcomes>,
    /// Workload requests measured.
    measured: usize,
    detail: Detail,
    /// `capacity`'s step: which requests are measured, and when the step is lost.
    pub(crate) watch: Option<Watch>,
}

/// The per-request arrays of a finished run: inline, or the sidecar's file name.
#[derive(Debug, Default)]
pub(crate) struct Arrays {
    pub(crate) inline: Option<Map<String, Value>>,
    pub(crate) file: Option<String>,
}

impl Collect {
    /// For `measured` workload requests (their index is in each sample's [`Tag`]); `recorded`:
    /// the trace holds recorded responses; `detail` for the workload's requests, folded into
    /// `work`.
    pub(crate) fn new(recorded: bool, measured: usize, detail: Detail, work: Collector) -> Collect {
        let detail = match detail {
            Detail::Inline(_) => Detail::Inline(vec![None; measured]),
            d => d,
        };
        Collect {
            work,
            aux: Auxiliary::default(),
            first_errors: Vec::new(),
            recorded: recorded.then(RecordedOutcomes::default),
            measured,
            detail,
            watch: None,
        }
    }

    /// Folds in the sample of the request tagged `tag`; true when it loses the step's objective
    /// ([`Watch::lose`]), so the run is to be given up.
    pub(crate) fn add(&mut self, tag: Tag, s: Sample) -> bool {
        let Some(w) = tag.work else {
            self.aux.add(&s.scalars);
            return false;
        };
        if self.watch.as_mut().is_some_and(|x| !x.measures(&s)) {
            return false;
        }
        let lost = self.watch.as_mut().is_some_and(|x| x.lose(&s));
        outcome::note_error(&mut self.first_errors, &s);
        if let Some(r) = &mut self.recorded {
            r.add(tag.recorded.as_deref(), &s.scalars);
        }
        self.work.add(w, &s);
        let rec = self.recorded.is_some().then_some(tag.recorded);
        match &mut self.detail {
            Detail::Off => {}
            Detail::Inline(rows) => {
                if let Some(r) = rows.get_mut(w) {
                    *r = Some(RequestRow::of(&s, rec));
                }
            }
            Detail::File(f) => f.write(w, &RequestRow::of(&s, rec)),
        }
        lost
    }

    /// Ends the per-request arrays: inline, or the sidecar written and renamed (an error when
    /// it could not be, or when it lacks a request). `whole`: every planned request was
    /// measured; else (a halted run) the arrays hold the requests measured, in schedule order.
    pub(crate) fn finish(&mut self, whole: bool) -> anyhow::Result<Arrays> {
        let n = match whole {
            true => self.measured,
            false => self.work.requests() as usize,
        };
        Ok(match std::mem::replace(&mut self.detail, Detail::Off) {
            Detail::Off => Arrays::default(),
            Detail::Inline(rows) if !whole => Arrays {
                inline: Some(arrays(rows.into_iter().flatten())),
                file: None,
            },
            Detail::Inline(rows) => Arrays {
                inline: Some(arrays(rows.into_iter().map(|r| {
                    r.unwrap_or_else(|| RequestRow::of(&Sample::default(), None))
                }))),
                file: None,
            },
            Detail::File(f) => {
                anyhow::ensure!(
                    f.rows() == n,
                    "the per-request file holds {} of {n} requests",
                    f.rows()
                );
                let name = f.finish().map_err(|e| {
                    anyhow::anyhow!("--detailed: cannot write the per-request file: {e}")
                })?;
                Arrays {
                    inline: None,
                    file: Some(name),
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{Failure, Scalars, Slo, SCALAR_BOUND};
    use serde_json::json;

    fn collector(itl_bound: usize) -> Collector {
        Collector::new(itl_bound, SCALAR_BOUND, Slo::default())
    }

    fn tag(work: Option<usize>, recorded: Option<String>) -> Tag {
        Tag { work, recorded }
    }

    fn sample(i: u64, err: Option<Failure>) -> Sample {
        Sample {
            scalars: Scalars {
                input_tokens: 10 + i,
                output_tokens: 3,
                intended_ns: i * 1_000_000,
                dispatched_ns: i * 1_000_000,
                sent_ns: i * 1_000_000 + 500,
                ttft_ns: err.is_none().then_some(20_000_000 + i),
                e2el_ns: err.is_none().then_some(40_000_000 + i),
                end_ns: i * 1_000_000 + 40_000_000,
                error: err,
                ..Default::default()
            },
            itls_ns: if err.is_none() {
                vec![10_000_000, 10_000_000 + i]
            } else {
                Vec::new()
            },
            ..Default::default()
        }
    }

    #[test]
    fn auxiliary_samples_are_split_off_and_counted() {
        let mut c = Collect::new(false, 2, Detail::Off, collector(100));
        let work = [Some(0), None, None, Some(1)];
        for (slot, err) in [None, None, Some(Failure::Http(404)), None]
            .into_iter()
            .enumerate()
        {
            c.add(tag(work[slot], None), sample(slot as u64, err));
        }
        assert_eq!(c.work.requests(), 2);
        let v = c.aux.to_json().unwrap();
        assert_eq!((v["sent"].clone(), v["ok"].clone()), (json!(2), json!(1)));
        assert_eq!(v["errors"]["http_404"], 1);
        assert_eq!(outcome::Auxiliary::default().to_json(), None);
    }

    /// Rows streamed to the sidecar in the order requests finished read back as the arrays the
    /// inline result holds, every request in it.
    #[test]
    fn sidecar_rows_read_back_equal_to_inline_arrays() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.requests.jsonl");
        let n = 500;
        let samples: Vec<Sample> = (0..n)
            .map(|i| sample(i, (i % 9 == 4).then_some(Failure::Reset)))
            .collect();
        let rec: Vec<Option<String>> = (0..n)
            .map(|i| (i % 5 == 0).then(|| "http_500".into()))
            .collect();
        let m = n as usize;
        let mut inline = Collect::new(true, m, Detail::Inline(Vec::new()), collector(1 << 20));
        let file = Detail::File(sidecar::Writer::create(&path).unwrap());
        let mut streamed = Collect::new(true, m, file, collector(1 << 20));
        for (slot, s) in samples.iter().enumerate() {
            inline.add(tag(Some(slot), rec[slot].clone()), s.clone());
        }
        for (slot, s) in samples.iter().enumerate().rev() {
            streamed.add(tag(Some(slot), rec[slot].clone()), s.clone());
        }
        let want = inline.finish(true).unwrap().inline.unwrap();
        let name = streamed.finish(true).unwrap().file.unwrap();
        assert_eq!(name, "run.requests.jsonl");
        let got = sidecar::read(&path, n as usize).unwrap();
        assert_eq!(got, want);
        assert_eq!(got["ttfts"].as_array().unwrap().len(), n as usize);
        assert_eq!(got["recorded_errors"][5], json!("http_500"));
        assert_eq!(
            inline.work.summary(1.0, &[99.0]),
            streamed.work.summary(1.0, &[99.0])
        );
    }

    /// A halted run measures some of its requests, with gaps between their indices (a session
    /// run's turns not yet released): its arrays, inline or in the sidecar (renumbered), hold
    /// the requests measured in schedule order, and the sidecar leaves no partial file.
    #[test]
    fn a_halted_runs_arrays_hold_the_requests_measured_in_schedule_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.requests.jsonl");
        let n = 300;
        let measured: Vec<usize> = (0..n).filter(|i| i % 3 != 1 && *i < 250).collect();
        let mut inline = Collect::new(false, n, Detail::Inline(Vec::new()), collector(1 << 20));
        let file = Detail::File(sidecar::Writer::create(&path).unwrap());
        let mut streamed = Collect::new(false, n, file, collector(1 << 20));
        for &i in measured.iter().rev() {
            let err = (i % 7 == 0).then_some(Failure::Interrupted);
            inline.add(tag(Some(i), None), sample(i as u64, err));
            streamed.add(tag(Some(i), None), sample(i as u64, err));
        }
        let want = inline.finish(false).unwrap().inline.unwrap();
        let name = streamed.finish(false).unwrap().file.unwrap();
        assert_eq!(name, "run.requests.jsonl");
        let got = sidecar::read(&path, measured.len()).unwrap();
        assert_eq!(got, want);
        let lens: Vec<u64> = measured.iter().map(|&i| 10 + i as u64).collect();
        assert_eq!(got["input_lens"], json!(lens));
        assert_eq!(got["errors"][0], json!("interrupted"));
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "{left:?}");
        // Measured without gaps, the file is kept as written.
        let path = dir.path().join("prefix.requests.jsonl");
        let file = Detail::File(sidecar::Writer::create(&path).unwrap());
        let mut c = Collect::new(false, n, file, collector(1 << 20));
        for i in (0..40).rev() {
            c.add(tag(Some(i), None), sample(i as u64, None));
        }
        let written = std::fs::read(dir.path().join("prefix.requests.jsonl.partial")).unwrap();
        c.finish(false).unwrap();
        let kept = std::fs::read(&path).unwrap();
        assert!(kept.len() >= written.len() && kept.starts_with(&written));
        assert_eq!(
            sidecar::read(&path, 40).unwrap()["input_lens"][39],
            json!(49)
        );
    }

    /// A run far larger than the sidecar threshold and the request and ITL bounds: the sidecar
    /// holds every request with all its ITL values, while what the run holds for its samples
    /// is a fixed figure, nothing per request (counted in bytes, not RSS).
    #[test]
    fn a_run_far_past_the_threshold_streams_every_request_and_holds_a_bounded_part() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.requests.jsonl");
        let n = 2 * sidecar::THRESHOLD + 1;
        let file = Detail::File(sidecar::Writer::create(&path).unwrap());
        let work = Collector::new(100_000, 1_000, Slo::default());
        let mut c = Collect::new(false, n, file, work);
        for slot in 0..n {
            c.add(tag(Some(slot), None), sample(slot as u64, None));
        }
        let per_request = std::mem::size_of::<crate::metrics::Scalars>();
        let held = c.work.retained_bytes();
        // The in-flight peak's buckets (at most 2^20 of 8 bytes) and the peaks' seconds.
        assert!(held <= (8 << 20) + (64 << 10), "{held} bytes");
        assert!(held * 10 < n * per_request, "{held} bytes for {n} requests");
        let sum = c.work.summary(1.0, &[99.0]);
        assert!(sum.itl_from_histogram && sum.scalars_from_histogram);
        assert_eq!((sum.itl.count, sum.completed), (2 * n, n as u64));
        c.finish(true).unwrap();
        let got = sidecar::read(&path, n).unwrap();
        let itls = got["itls"].as_array().unwrap();
        assert_eq!(itls.len(), n);
        assert!(itls.iter().all(|x| x.as_array().map(Vec::len) == Some(2)));
        assert_eq!(
            itls[n - 1][1],
            json!((10_000_000 + n as u64 - 1) as f64 / 1e9)
        );
    }

    /// A damaged or incomplete sidecar is an error naming the file and the line.
    #[test]
    fn a_damaged_sidecar_names_its_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.requests.jsonl");
        let row = |i: usize| format!("{{\"index\":{i},\"ttfts\":0.1}}\n");
        for (body, n, want) in [
            (format!("{}{{\"index\":1,", row(0)), 2, "line 2: not JSON"),
            (
                format!("{}{}", row(0), row(0)),
                2,
                "line 2: index 0 given twice",
            ),
            (format!("{}{}", row(0), row(7)), 2, "line 2: index 7"),
            (format!("{}[1]\n", row(0)), 2, "line 2: not a JSON object"),
            (
                format!("{}{{\"ttfts\":1}}\n", row(0)),
                2,
                "line 2: no `index`",
            ),
            (
                format!("{}{}", row(0), row(2)),
                3,
                "holds 2 of the result's 3",
            ),
            (row(0), 1_000_000, "cannot hold"),
        ] {
            std::fs::write(&path, body).unwrap();
            let e = sidecar::read(&path, n).unwrap_err().to_string();
            assert!(e.contains("r.requests.jsonl") && e.contains(want), "{e}");
        }
        let e = sidecar::read(&dir.path().join("none.jsonl"), 1).unwrap_err();
        assert!(e.to_string().contains("none.jsonl"), "{e}");
    }
}
