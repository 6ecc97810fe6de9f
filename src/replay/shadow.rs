//! `replay --target A --shadow B`: one plan replayed against each target at the same instants.
//!
//! Each side is a whole replay of its own (its plan, body builder, connections, dispatcher and
//! result), made from the same configuration, so each side builds the same bodies (the model
//! name aside) and each send is due at the same `t0 + offset / speed`. Text prompts are made and
//! fitted by the target's tokenizer on every side ([`TextFrom`]). The sides prepare apart
//! and then meet ([`Meet`]): the last to be ready sets the shared t0. A setup error of any side
//! ends them all.

use super::*;
use crate::result::{control_result_path, shadow_result_path};
use std::sync::OnceLock;

/// A candidate a replay also sends every planned request to.
#[derive(Debug, Clone)]
pub struct ShadowTarget {
    pub(crate) url: String,
    /// `--shadow-model` (else `--model`, else the shadow's first listed model).
    pub(crate) model: Option<String>,
    /// The shadow's own headers: its key from `--shadow-api-key-env`, nothing of the target's.
    pub(crate) headers: HeaderMap,
    /// `--shadow-control`: the target's own build, whose changes are the noise band.
    pub(crate) control: bool,
}

/// The server whose tokenizer makes and fits a shadow side's text prompts: the replay's target,
/// so that each side is sent the target's text, not its own tokenizer's.
#[derive(Debug, Clone)]
pub(crate) struct TextFrom {
    pub(crate) url: String,
    pub(crate) headers: HeaderMap,
    /// `--model`, else the target's first listed model.
    pub(crate) model: Option<String>,
}

/// A shadow side's outcome, with the name the console and `compare --shadow` give it.
pub struct ShadowSide {
    /// `shadow K` (1-based, in `--shadow` order) or `control`.
    pub name: String,
    pub url: String,
    pub outcome: Outcome,
}

/// Where the sides of a replay agree on t0.
#[derive(Debug)]
pub(crate) struct Meet {
    ready: tokio::sync::Barrier,
    t0: OnceLock<Instant>,
}

impl Meet {
    fn new(sides: usize) -> Meet {
        Meet {
            ready: tokio::sync::Barrier::new(sides),
            t0: OnceLock::new(),
        }
    }

    /// Waits until every side is ready; the shared t0, [`driver::START_LEAD`] after the last
    /// arrival.
    pub(crate) async fn t0(&self) -> Instant {
        self.ready.wait().await;
        *self.t0.get_or_init(|| Instant::now() + driver::START_LEAD)
    }
}

/// The sides' configurations: the target's first, then each shadow's. Without `--start-at` they
/// share a [`Meet`].
fn sides(cfg: &Config) -> Vec<Config> {
    let meet = cfg
        .start_at
        .is_none()
        .then(|| Arc::new(Meet::new(cfg.shadows.len() + 1)));
    let primary = Config {
        shadows: Vec::new(),
        meet: meet.clone(),
        ..cfg.clone()
    };
    let mut out = vec![primary.clone()];
    let text_from = cfg.target.clone().map(|url| TextFrom {
        url,
        headers: cfg.headers.clone(),
        model: cfg.model.clone(),
    });
    for (k, s) in cfg.shadows.iter().enumerate() {
        let result_json = cfg.result_json.as_deref().map(|p| match s.control {
            true => control_result_path(p),
            false => shadow_result_path(p, k + 1),
        });
        out.push(Config {
            target: Some(s.url.clone()),
            target_flag: if s.control {
                "--shadow-control"
            } else {
                "--shadow"
            },
            model: s.model.clone().or_else(|| cfg.model.clone()),
            headers: s.headers.clone(),
            text_from: text_from.clone(),
            result_json,
            // An explicit URL is the target's; a shadow's own /metrics otherwise.
            scrape_metrics: cfg.scrape_metrics.as_ref().map(|_| None),
            progress: false,
            ..primary.clone()
        });
    }
    out
}

/// Runs every side; the target's outcome, with each shadow's in [`Outcome::shadows`].
pub(crate) async fn replay_sides(cfg: Config, halt: Arc<driver::Halt>) -> anyhow::Result<Outcome> {
    let mut set = tokio::task::JoinSet::new();
    for (k, side) in sides(&cfg).into_iter().enumerate() {
        let halt = halt.clone();
        set.spawn(async move { (k, replay_with(side, halt).await) });
    }
    let mut outs: Vec<Option<Outcome>> = (0..=cfg.shadows.len()).map(|_| None).collect();
    while let Some(joined) = set.join_next().await {
        let (k, out) = joined.context("a replay side stopped")?;
        match out {
            Ok(o) => outs[k] = Some(o),
            Err(e) => {
                set.abort_all();
                return Err(e);
            }
        }
    }
    let mut outs = outs.into_iter().flatten();
    let mut primary = outs
        .next()
        .context("the target's side ended without a result")?;
    primary.shadows = (cfg.shadows.iter().enumerate())
        .zip(outs)
        .map(|((k, s), outcome)| ShadowSide {
            name: match s.control {
                true => "control".to_string(),
                false => format!("shadow {}", k + 1),
            },
            url: s.url.clone(),
            outcome,
        })
        .collect();
    Ok(primary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_sides_share_the_t0_the_last_one_sets() {
        let meet = Arc::new(Meet::new(2));
        let early = tokio::spawn({
            let m = meet.clone();
            async move { m.t0().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let before_last = Instant::now();
        let t0 = meet.t0().await;
        assert_eq!(early.await.unwrap(), t0);
        assert!(
            t0 >= before_last + driver::START_LEAD,
            "set by the last to arrive"
        );
    }
}
