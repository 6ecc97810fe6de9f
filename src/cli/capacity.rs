//! `retrace capacity`'s command line and its [`CapacityOptions`]; the target, prompt and
//! request flags are replay's own ([`super::replay`]).

use super::replay::{base_config, scrape_url, PromptArgs, RequestArgs, TargetArgs};
use super::values::parse_duration_us;
use crate::capacity::{search, slo, CapacityOptions};
use anyhow::{anyhow, bail};
use std::path::PathBuf;
use std::time::Duration;

/// The end of `capacity --help` (and of `-h`).
const EXAMPLES: &str = "\
Examples:
  # the most load a server takes with p99 TTFT within 500 ms: a search
  retrace capacity traces/mooncake_conversation_1k.jsonl \\
    --target http://127.0.0.1:8000 --slo \"p99_ttft_ms<=500\" --step 20s \\
    --result-json cap.json
  # three speeds instead of a search, against the embedded simulated engine
  retrace capacity traces/mooncake_conversation_1k.jsonl --speeds 1,2,4 \\
    --step 4s --warmup 1s --slo \"p99_ttft_ms<=2000\" --result-json cap.json";

/// The most speeds `--speeds` takes (one search never runs more steps).
const MAX_SPEEDS: usize = search::MAX_STEPS;

/// `--step`, `--warmup`: at most a day each.
const MAX_STRETCH: Duration = Duration::from_secs(86_400);

/// How many times a trace's own load a server takes within an SLO: steps of the trace at scaled
/// speeds, searched.
///
/// Each step replays the trace with its timing scaled by a factor (as replay's --speed) for
/// --warmup (not measured) plus --step of wall-clock time, then drains. A trace too short for a
/// factor is repeated back to back, each copy with its own hash ids (its prefix reuse kept,
/// none shared across copies). Without --speeds the search doubles from 1× while the SLO holds,
/// halves while it does not, then bisects to --precision; the two boundary speeds are run
/// --repeats times. A step is given up as soon as its SLO is lost for good (enough requests
/// missed a pP bound, or failed, that the rest cannot save it). Exit status: 0 done (the answer
/// may be "at least" --max-speed), 2 error (a target that died: the steps done are in
/// --result-json), 7 the SLO was not met at any speed tried, 130 / 143 interrupted.
#[derive(Debug, clap::Args)]
#[command(after_help = EXAMPLES)]
pub struct CapacityArgs {
    /// Trace file (any format `retrace inspect` reads); several recordings are merged by wall
    /// clock.
    #[arg(required = true, num_args = 1..)]
    pub(crate) trace: Vec<PathBuf>,
    #[command(flatten)]
    pub(crate) target: TargetArgs,
    /// The SLO every step is judged by, in compare's rule grammar with values:
    /// `p99_ttft_ms<=500,p99_itl_ms<=80,failure_rate<=0.01`.
    ///
    /// vLLM's goodput terms (`ttft:500`, `tpot:MS`, `e2el:MS`) read as `p99_M_ms<=MS` and set the
    /// goodput objective.
    #[arg(long, value_name = "RULES", help_heading = "Search")]
    pub(crate) slo: String,
    /// Run these speeds, each once, instead of searching (e.g. `0.5,1,2,4`).
    #[arg(long, value_name = "LIST", help_heading = "Search")]
    pub(crate) speeds: Option<String>,
    /// Measured wall-clock time of each step, after its warm-up.
    #[arg(long, value_name = "D", default_value = "60s", help_heading = "Search")]
    pub(crate) step: String,
    /// Wall-clock time each step runs before it is measured (its requests are sent, not
    /// measured).
    #[arg(long, value_name = "D", default_value = "10s", help_heading = "Search")]
    pub(crate) warmup: String,
    /// The search ends when the speeds met and not met are this close, relative.
    #[arg(
        long,
        value_name = "F",
        default_value_t = 0.05,
        help_heading = "Search",
        hide_short_help = true
    )]
    pub(crate) precision: f64,
    /// Runs of each boundary speed; a speed meets the SLO when more than half of its runs do.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 2,
        help_heading = "Search",
        hide_short_help = true
    )]
    pub(crate) repeats: u32,
    /// The highest speed the search tries; met there, the answer is "at least".
    #[arg(
        long,
        value_name = "X",
        default_value_t = 64.0,
        help_heading = "Search",
        hide_short_help = true
    )]
    pub(crate) max_speed: f64,
    /// The lowest speed the search tries; not met there, the SLO is never met (exit 7).
    #[arg(
        long,
        value_name = "X",
        default_value_t = 0.125,
        help_heading = "Search",
        hide_short_help = true
    )]
    pub(crate) min_speed: f64,
    /// Cap on requests in flight, as replay's.
    #[arg(
        long,
        value_name = "C",
        help_heading = "Target",
        hide_short_help = true
    )]
    pub(crate) max_concurrency: Option<usize>,
    /// Read the server's Prometheus metrics during each step, as replay's (default URL: the
    /// target's /metrics), and say why the capacity is where it is (queue, KV cache, batch).
    #[arg(long, value_name = "URL", num_args = 0..=1, require_equals = true, help_heading = "Server metrics", hide_short_help = true)]
    pub(crate) scrape_metrics: Option<Option<String>>,
    /// Empty the target's prefix cache before each step (vLLM's `POST /reset_prefix_cache`).
    #[arg(long, help_heading = "Target", hide_short_help = true)]
    pub(crate) reset_prefix_cache: bool,
    /// Write the steps (each with its full replay result) and the answer to this JSON file.
    #[arg(long, value_name = "FILE", help_heading = "Results")]
    pub(crate) result_json: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) prompts: PromptArgs,
    #[command(flatten)]
    pub(crate) requests: RequestArgs,
}

impl CapacityArgs {
    /// The options the command line asks for; every error names its flag.
    pub(crate) fn options(self) -> anyhow::Result<CapacityOptions> {
        let a = self;
        let mut replay = base_config(a.trace.clone(), &a.target, &a.prompts, &a.requests)?;
        if a.max_concurrency == Some(0) {
            bail!("--max-concurrency 0: must be at least 1");
        }
        replay.max_concurrency = a.max_concurrency;
        if let Some(Some(u)) = &a.scrape_metrics {
            scrape_url(u)?;
        }
        replay.scrape_metrics = a.scrape_metrics.clone();
        let plan = match &a.speeds {
            Some(list) => search::Plan::Ladder(speeds(list)?),
            None => search_plan(&a)?,
        };
        Ok(CapacityOptions {
            replay,
            slo: slo::parse(&a.slo).map_err(anyhow::Error::msg)?,
            plan,
            warmup: stretch("--warmup", &a.warmup, Duration::ZERO)?,
            step: stretch("--step", &a.step, Duration::from_secs(1))?,
            reset_prefix_cache: a.reset_prefix_cache,
            result_json: a.result_json,
        })
    }
}

fn speed(flag: &str, v: f64) -> anyhow::Result<f64> {
    if !(v.is_finite() && (1e-6..=1e6).contains(&v)) {
        bail!("{flag} {v}: give a factor between 0.000001 and 1000000");
    }
    Ok(v)
}

fn search_plan(a: &CapacityArgs) -> anyhow::Result<search::Plan> {
    let (min, max) = (
        speed("--min-speed", a.min_speed)?,
        speed("--max-speed", a.max_speed)?,
    );
    if min > max {
        bail!("--min-speed {min} is above --max-speed {max}");
    }
    if !(a.precision.is_finite() && a.precision > 0.0 && a.precision <= 1.0) {
        bail!(
            "--precision {}: give a fraction in (0, 1], like 0.05",
            a.precision
        );
    }
    if !(1..=9).contains(&a.repeats) {
        bail!("--repeats {}: give 1 to 9", a.repeats);
    }
    Ok(search::Plan::Search {
        min,
        max,
        precision: a.precision,
        repeats: a.repeats,
    })
}

fn speeds(list: &str) -> anyhow::Result<Vec<f64>> {
    let items = list.split(',').map(str::trim).filter(|s| !s.is_empty());
    let count = items.clone().count();
    if count == 0 || count > MAX_SPEEDS {
        bail!("--speeds: give 1 to {MAX_SPEEDS} factors, like 0.5,1,2,4 ({count} given)");
    }
    let mut out = Vec::with_capacity(count);
    for s in items {
        let v: f64 = s
            .parse()
            .map_err(|_| anyhow!("--speeds: `{s}` is not a number"))?;
        out.push(speed("--speeds", v)?);
    }
    Ok(out)
}

fn stretch(flag: &str, v: &str, least: Duration) -> anyhow::Result<Duration> {
    let d = Duration::from_micros(parse_duration_us(v).map_err(|e| anyhow!("{flag}: {e}"))?);
    if d < least || d > MAX_STRETCH {
        bail!(
            "{flag} {v}: give {} s to {} s",
            least.as_secs(),
            MAX_STRETCH.as_secs()
        );
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(args: &[&str]) -> anyhow::Result<CapacityOptions> {
        let mut v = vec![
            "retrace",
            "capacity",
            "t.jsonl",
            "--slo",
            "p99_ttft_ms<=500",
        ];
        v.extend_from_slice(args);
        match <crate::cli::Cli as clap::Parser>::parse_from(v).command {
            crate::cli::Command::Capacity(a) => a.options(),
            _ => unreachable!("capacity"),
        }
    }

    #[test]
    fn errors_name_the_flag() {
        for (args, flag) in [
            (vec!["--speeds", "1,x"], "--speeds"),
            (vec!["--speeds", ""], "--speeds"),
            (vec!["--step", "0s"], "--step"),
            (vec!["--warmup", "2d"], "--warmup"),
            (vec!["--precision", "0"], "--precision"),
            (vec!["--repeats", "0"], "--repeats"),
            (vec!["--min-speed", "8", "--max-speed", "4"], "--min-speed"),
            (vec!["--max-concurrency", "0"], "--max-concurrency"),
            (vec!["--block-size", "0"], "--block-size"),
        ] {
            let e = options(&args)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains(flag), "{args:?}: {e:?} should name {flag}");
        }
        let many = vec!["1"; MAX_SPEEDS + 1].join(",");
        let e = options(&["--speeds", &many]).err().unwrap().to_string();
        assert!(e.contains("give 1 to"), "{e}");
    }

    #[test]
    fn defaults_are_a_search_of_60_s_steps_after_10_s() {
        let o = options(&["--target", "http://127.0.0.1:9"]).unwrap();
        assert_eq!(
            (o.warmup, o.step),
            (Duration::from_secs(10), Duration::from_secs(60))
        );
        assert_eq!(
            o.plan,
            search::Plan::Search {
                min: 0.125,
                max: 64.0,
                precision: 0.05,
                repeats: 2
            }
        );
        assert_eq!(o.replay.target.as_deref(), Some("http://127.0.0.1:9"));
        let l = options(&["--speeds", "0.5, 1,2"]).unwrap();
        assert_eq!(l.plan, search::Plan::Ladder(vec![0.5, 1.0, 2.0]));
    }
}
