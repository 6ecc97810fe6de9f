//! `synth --fit`: a model learned from a trace, and new traces sampled from it (pure).
//!
//! What is learned (docs/synth.md has the reasoning and the measured fit):
//! - per request, a row: input and output length, endpoint, model and parameters, its number of
//!   blocks, and its cached path (the leading blocks an earlier request had) in steps: each the
//!   part one earlier request accessed last, with its depth, its reuse distance (distinct blocks
//!   accessed since) and how deep that request went. Rows are drawn whole, so lengths stay joint
//!   with the node they hang from;
//! - arrivals: the inter-arrival gaps and the rows of each window of the input's span (the hours
//!   of the day when it spans a day): rate over time, burst shape, reuse as it was then; the
//!   gaps' gamma shape, reported;
//! - sessions (when every request has one): whole sessions, their turns' offsets, think times and
//!   the sharing inside them; blocks that several sessions share stay shared.
//!
//! Sampling builds a new prefix tree: a request walks down from the root, each step starting at
//! the child whose reuse distance is the step's and following the request that accessed it last,
//! then adds fresh blocks. Every id is new (a counter), so nothing in the output maps back to the
//! input.

use super::WhatIfError;
use crate::trace::{HashScheme, Request, Session, Trace, TraceHeader};
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};

/// Windows the input's span is cut into for the rate profile (fewer for short traces).
const WINDOWS: usize = 100;
/// Gaps per window at least (short traces get fewer, longer windows).
const GAPS_PER_WINDOW: usize = 100;
/// Children compared for the depth their last request went to (the nearest by recency: more
/// trade recency for depth and leave the cache too cold, docs/synth.md).
const CANDIDATES: usize = 2;
const HOUR_US: u64 = 3_600_000_000;
/// From this span on, the windows are the hours of the day.
const DAY_US: u64 = 24 * HOUR_US;

/// One request of the input as the model keeps it.
#[derive(Debug, Clone)]
struct Row {
    /// Lengths, endpoint, model, parameters; no ids, response, body or session.
    proto: Request,
    blocks: u32,
    /// The leading blocks an earlier request had (its cached path), cut where the request that
    /// last accessed them changes. The last step's end is the request's hit.
    steps: Vec<Step>,
}

/// A piece of a cached path that one earlier request accessed last.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Step {
    /// Its last depth.
    end: u32,
    /// The reuse distance of its last block (distinct blocks accessed since).
    distance: u64,
    /// How many blocks that earlier request had below `end`.
    below: u32,
}

/// A session: its turns' rows, offsets from its first turn, think times, and block labels.
#[derive(Debug, Clone)]
struct SessionT {
    turns: Vec<Turn>,
}

#[derive(Debug, Clone)]
struct Turn {
    proto: Request,
    offset_us: u64,
    think_us: Option<u64>,
    /// `Ok(i)`: the session's own i-th block; `Err(j)`: the j-th block several sessions share.
    labels: Vec<Result<u32, u32>>,
}

/// The learned model.
#[derive(Debug, Clone)]
pub(crate) struct Model {
    block_size: u32,
    partial_tail_block: bool,
    rows: Vec<Row>,
    sessions: Vec<SessionT>,
    shared_blocks: u32,
    /// Gaps (µs) between successive arrivals (session starts in session mode), by window.
    windows: Vec<Vec<u64>>,
    /// The rows of each window (by arrival).
    window_rows: Vec<Vec<u32>>,
    /// The windows are the hours of the day (the input spans a day or more).
    daily: bool,
    /// Mean arrival rate of requests.
    pub(crate) rate_rps: f64,
    /// Gamma shape of the gaps by moments (1 = Poisson, below 1 bursty).
    pub(crate) gamma_shape: f64,
    pub(crate) requests: u64,
}

impl Model {
    pub(crate) fn session_count(&self) -> usize {
        self.sessions.len()
    }
}

/// The size of the output.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Size {
    pub(crate) requests: Option<u64>,
    pub(crate) duration_us: Option<u64>,
    pub(crate) rate: Option<f64>,
    pub(crate) scale_users: f64,
}

/// Learns the model from the trace's workload.
pub(crate) fn fit(trace: &Trace) -> Result<Model, WhatIfError> {
    let reqs: Vec<&Request> = trace.requests.iter().filter(|r| r.is_workload()).collect();
    if reqs.len() < 2 {
        return Err(WhatIfError::Fit(
            "the input has fewer than 2 workload requests".into(),
        ));
    }
    let span = reqs[reqs.len() - 1].arrival_us - reqs[0].arrival_us;
    let session_mode = reqs.iter().all(|r| r.session.is_some());
    let sessions = if session_mode {
        sessions_of(&reqs)
    } else {
        (Vec::new(), 0)
    };
    let starts: Vec<u64> = if session_mode {
        let mut s: Vec<u64> = sessions_first_arrivals(&reqs);
        s.sort_unstable();
        s
    } else {
        reqs.iter().map(|r| r.arrival_us).collect()
    };
    let daily = span >= DAY_US;
    let (windows, of) = windows_of(&starts, span, daily);
    let mut window_rows = vec![Vec::new(); windows.len()];
    if !session_mode {
        for (i, k) in of.into_iter().enumerate() {
            window_rows[k].push(i as u32);
        }
    }
    let all: Vec<u64> = windows.iter().flatten().copied().collect();
    let rate_rps = if span > 0 {
        (reqs.len() - 1) as f64 / (span as f64 / 1e6)
    } else {
        0.0
    };
    Ok(Model {
        block_size: trace.header.block_size,
        partial_tail_block: trace.header.partial_tail_block,
        rows: rows_of(&reqs),
        shared_blocks: sessions.1,
        sessions: sessions.0,
        windows,
        window_rows,
        daily,
        rate_rps,
        gamma_shape: gamma_shape(&all),
        requests: reqs.len() as u64,
    })
}

fn proto(r: &Request) -> Request {
    Request {
        endpoint: r.endpoint.clone(),
        model: r.model.clone(),
        params: r.params.clone(),
        input_tokens: r.input_tokens,
        output_tokens: r.output_tokens,
        ..Default::default()
    }
}

/// Rows in arrival order. A request's hit is its leading ids seen before (inspect's rule); its
/// steps cut them where the request that last accessed them changes.
fn rows_of(reqs: &[&Request]) -> Vec<Row> {
    // per id, the time of its last access and the request that made it
    let mut last: HashMap<u64, (u64, usize)> = HashMap::new();
    let mut rec = Recency::default();
    let mut out = Vec::with_capacity(reqs.len());
    for (i, r) in reqs.iter().enumerate() {
        let ids = &r.hash_ids;
        let hit: Vec<(u64, usize)> = ids.iter().map_while(|h| last.get(h).copied()).collect();
        let steps = (0..hit.len())
            .filter(|&d| hit.get(d + 1).is_none_or(|n| n.1 != hit[d].1))
            .map(|d| Step {
                end: d as u32 + 1,
                distance: rec.distance(hit[d].0),
                below: reqs[hit[d].1].hash_ids.len().saturating_sub(d + 1) as u32,
            })
            .collect();
        out.push(Row {
            proto: proto(r),
            blocks: ids.len() as u32,
            steps,
        });
        for h in ids {
            let e = last.entry(*h).or_insert((0, i));
            *e = (rec.access(e.0), i);
        }
    }
    out
}

/// Block accesses in order, each block marked at its latest access (a Fenwick tree over access
/// times): the reuse distance of a block is the number of distinct blocks accessed since it was,
/// what decides whether an LRU cache still holds it.
#[derive(Default)]
struct Recency {
    tree: Vec<u32>,
    total: u64,
    now: u64,
}

impl Recency {
    fn add(&mut self, t: u64, up: bool) {
        let mut i = t as usize;
        while i < self.tree.len() {
            if up {
                self.tree[i] += 1;
            } else {
                self.tree[i] -= 1;
            }
            i += i & i.wrapping_neg();
        }
    }

    fn prefix(&self, t: u64) -> u64 {
        let (mut i, mut s) = (t as usize, 0u64);
        while i > 0 {
            s += u64::from(self.tree[i]);
            i -= i & i.wrapping_neg();
        }
        s
    }

    /// A block last accessed at `old` (0: never) is accessed now; returns the new time.
    fn access(&mut self, old: u64) -> u64 {
        if old > 0 {
            self.add(old, false);
            self.total -= 1;
        }
        self.now += 1;
        if self.now as usize >= self.tree.len() {
            self.grow();
        }
        self.add(self.now, true);
        self.total += 1;
        self.now
    }

    /// Twice the times (a power of two). Every mark is below the old length L, so of the new
    /// entries only L's range (0, L] holds any: all of them.
    fn grow(&mut self) {
        let old = self.tree.len();
        self.tree.resize((old * 2).max(1024), 0);
        if old > 0 {
            self.tree[old] = self.total as u32;
        }
    }

    /// Distinct blocks accessed after time `t`.
    fn distance(&self, t: u64) -> u64 {
        self.total - self.prefix(t)
    }

    /// The latest time whose distance is at least `d` (`None`: fewer blocks than that so far).
    fn latest_at_distance(&self, d: u64) -> Option<u64> {
        let budget = self.total.checked_sub(d)?;
        let (mut pos, mut rem) = (0usize, budget);
        let mut step = self.tree.len().next_power_of_two() / 2;
        while step > 0 {
            let next = pos + step;
            if next < self.tree.len() && u64::from(self.tree[next]) <= rem {
                pos = next;
                rem -= u64::from(self.tree[next]);
            }
            step /= 2;
        }
        Some(pos as u64)
    }
}

fn sessions_first_arrivals(reqs: &[&Request]) -> Vec<u64> {
    let mut first: BTreeMap<&str, u64> = BTreeMap::new();
    for r in reqs {
        let id = r.session.as_ref().map_or("", |s| s.id.as_str());
        let e = first.entry(id).or_insert(r.arrival_us);
        *e = (*e).min(r.arrival_us);
    }
    first.into_values().collect()
}

/// Sessions in order of first arrival, with block labels; and the count of shared blocks.
fn sessions_of(reqs: &[&Request]) -> (Vec<SessionT>, u32) {
    let mut by: BTreeMap<&str, Vec<&Request>> = BTreeMap::new();
    for r in reqs {
        let id = r.session.as_ref().map_or("", |s| s.id.as_str());
        by.entry(id).or_default().push(r);
    }
    let mut owners: HashMap<u64, (&str, bool)> = HashMap::new();
    for (id, turns) in &by {
        for h in turns.iter().flat_map(|r| &r.hash_ids) {
            let e = owners.entry(*h).or_insert((id, false));
            e.1 |= e.0 != *id;
        }
    }
    let mut shared: HashMap<u64, u32> = HashMap::new();
    let mut list: Vec<(u64, SessionT)> = Vec::new();
    for turns in by.values() {
        let first = turns.iter().map(|r| r.arrival_us).min().unwrap_or(0);
        let mut local: HashMap<u64, u32> = HashMap::new();
        let mut out = Vec::new();
        for r in turns {
            let labels = r
                .hash_ids
                .iter()
                .map(|h| {
                    if owners.get(h).is_some_and(|o| o.1) {
                        let n = shared.len() as u32;
                        Err(*shared.entry(*h).or_insert(n))
                    } else {
                        let n = local.len() as u32;
                        Ok(*local.entry(*h).or_insert(n))
                    }
                })
                .collect();
            out.push(Turn {
                proto: proto(r),
                offset_us: r.arrival_us - first,
                think_us: r.session.as_ref().and_then(|s| s.think_us),
                labels,
            });
        }
        list.push((first, SessionT { turns: out }));
    }
    list.sort_by_key(|(f, _)| *f);
    (
        list.into_iter().map(|(_, s)| s).collect(),
        shared.len() as u32,
    )
}

/// Gaps between successive `times`, grouped by the window they start in: one of up to
/// [`WINDOWS`] equal parts of the span, or with `daily` the hour of the day; and each time's
/// window.
fn windows_of(times: &[u64], span: u64, daily: bool) -> (Vec<Vec<u64>>, Vec<usize>) {
    let gaps = times.len().saturating_sub(1);
    let n = match daily {
        true => 24,
        false => (gaps / GAPS_PER_WINDOW).clamp(1, WINDOWS),
    };
    let t0 = times.first().copied().unwrap_or(0);
    let w = (span / n as u64).max(1);
    let of: Vec<usize> = times
        .iter()
        .map(|t| match daily {
            true => ((t - t0) / HOUR_US % 24) as usize,
            false => (((t - t0) / w) as usize).min(n - 1),
        })
        .collect();
    let mut out = vec![Vec::new(); n];
    for (i, p) in times.windows(2).enumerate() {
        out[of[i]].push(p[1] - p[0]);
    }
    (out, of)
}

fn gamma_shape(gaps: &[u64]) -> f64 {
    let n = gaps.len() as f64;
    if n < 2.0 {
        return 1.0;
    }
    let mean = gaps.iter().map(|&g| g as f64).sum::<f64>() / n;
    let var = gaps.iter().map(|&g| (g as f64 - mean).powi(2)).sum::<f64>() / (n - 1.0);
    if var > 0.0 {
        mean * mean / var
    } else {
        f64::INFINITY
    }
}

/// How many requests, over which span, at which rate.
struct Plan {
    requests: u64,
    until_us: Option<u64>,
    /// Multiplies every sampled gap.
    gap_scale: f64,
    /// Multiplies every reuse distance (more users interleave).
    lag_scale: f64,
}

fn plan(m: &Model, s: &Size) -> Result<Plan, WhatIfError> {
    if !(s.scale_users.is_finite() && s.scale_users > 0.0) {
        return Err(WhatIfError::Option(format!(
            "--scale-users must be a positive number, got {}",
            s.scale_users
        )));
    }
    if let Some(r) = s.rate.filter(|r| !(r.is_finite() && *r > 0.0)) {
        return Err(WhatIfError::Option(format!(
            "--rate must be a positive number, got {r}"
        )));
    }
    let base = match (s.rate, s.requests, s.duration_us) {
        (Some(r), _, _) => r,
        (None, Some(n), Some(d)) if d > 0 => n as f64 / (d as f64 / 1e6) / s.scale_users,
        _ => m.rate_rps,
    };
    if !(base.is_finite() && base > 0.0) {
        return Err(WhatIfError::Fit(
            "the input's arrivals span no time, so it has no rate: give --rate".into(),
        ));
    }
    let rate = base * s.scale_users;
    let requests = match (s.requests, s.duration_us) {
        (Some(n), _) => n,
        (None, Some(d)) => (rate * d as f64 / 1e6).round() as u64,
        (None, None) => (m.requests as f64 * s.scale_users).round() as u64,
    };
    if requests > MAX_REQUESTS {
        return Err(WhatIfError::Option(format!(
            "{}: {requests} requests, more than the {MAX_REQUESTS} synth --fit writes",
            size_flags(s)
        )));
    }
    let max_s = super::MAX_SPAN_US as f64 / 1e6;
    let span_s = match s.duration_us {
        Some(d) => d as f64 / 1e6,
        None => requests as f64 / rate,
    };
    if span_s.is_nan() || span_s > max_s {
        return Err(WhatIfError::Option(format!(
            "{requests} requests at {rate} req/s would span {:.0} days (more than {}): check --rate, --duration and --scale-users",
            span_s / 86_400.0,
            max_s / 86_400.0
        )));
    }
    // given only a duration, the duration ends the output (its rate varies): this only bounds it
    let requests = match (s.requests, s.duration_us) {
        (None, Some(_)) => requests * 2 + 1000,
        _ => requests,
    };
    let gap_scale = if m.rate_rps > 0.0 {
        m.rate_rps / rate
    } else {
        1.0
    };
    Ok(Plan {
        requests,
        until_us: s.duration_us,
        gap_scale,
        lag_scale: s.scale_users,
    })
}

/// The flags that set the output's size, as given (for messages).
fn size_flags(s: &Size) -> String {
    let mut f = Vec::new();
    if let Some(n) = s.requests {
        f.push(format!("--requests {n}"));
    }
    if let Some(d) = s.duration_us {
        f.push(format!("--duration {}s", d as f64 / 1e6));
    }
    if let Some(r) = s.rate {
        f.push(format!("--rate {r}"));
    }
    if s.scale_users != 1.0 || f.is_empty() {
        f.push(format!("--scale-users {}", s.scale_users));
    }
    f.join(" ")
}

/// Most requests `synth --fit` writes (10^8).
pub(crate) const MAX_REQUESTS: u64 = 100_000_000;
/// Most hash ids of the turns of sessions in flight the sampler holds (session mode; 16 Mi, 128
/// MiB of ids); a sample that passes it ends the output with an error.
pub(crate) const MAX_HELD_IDS: u64 = 1 << 24;

/// Most block accesses one generated prefix tree records (request mode; 4 Mi, at most about
/// 80 bytes each). A request that would pass it starts a new tree with fresh ids, as a cache
/// emptied: only reuse across that cut is lost, and a reuse distance past 4 Mi blocks is past
/// every real KV cache.
pub(crate) const MAX_TREE_ACCESSES: u64 = 1 << 22;

/// A sampled trace: its header, and its requests made one at a time in arrival order (nothing
/// else kept but the generated prefix tree, or the turns of the sessions in flight).
pub(crate) struct FittedSample<'m> {
    pub(crate) header: TraceHeader,
    requests: Sampler<'m>,
}

enum Sampler<'m> {
    Requests(Box<Requests<'m>>),
    Sessions(Box<Sessions<'m>>),
}

impl Iterator for FittedSample<'_> {
    type Item = Result<Request, WhatIfError>;
    fn next(&mut self) -> Option<Self::Item> {
        match &mut self.requests {
            Sampler::Requests(s) => s.next(),
            Sampler::Sessions(s) => s.next(),
        }
    }
}

/// Samples a new trace from the model.
pub(crate) fn sample<'m>(
    m: &'m Model,
    s: &Size,
    seed: u64,
) -> Result<FittedSample<'m>, WhatIfError> {
    let p = plan(m, s)?;
    let rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut header =
        TraceHeader::imported(m.block_size, m.partial_tail_block, "retrace synth --fit");
    header.hash_scheme = HashScheme::Dense;
    let requests = match m.sessions.is_empty() {
        true => Sampler::Requests(Box::new(Requests::new(m, p, rng))),
        false => Sampler::Sessions(Box::new(Sessions::new(m, p, rng))),
    };
    Ok(FittedSample { header, requests })
}

/// The error of a sample that passed [`MAX_HELD_IDS`] after all.
fn too_many_ids() -> WhatIfError {
    WhatIfError::Option(format!(
        "the sampled requests passed {MAX_HELD_IDS} hash ids held in memory: ask for fewer (--requests, --duration)"
    ))
}

/// A sample dealt without replacement, shuffled anew each time it runs out.
struct Deck<T> {
    items: Vec<T>,
    dealt: usize,
}

impl<T: Copy> Deck<T> {
    fn new(items: Vec<T>) -> Deck<T> {
        let dealt = items.len();
        Deck { items, dealt }
    }

    fn shuffle(&mut self, rng: &mut impl Rng) {
        use rand::seq::SliceRandom;
        self.items.shuffle(rng);
        self.dealt = 0;
    }

    fn left(&self) -> usize {
        self.items.len() - self.dealt
    }

    fn draw(&mut self, rng: &mut impl Rng) -> Option<T> {
        if self.left() == 0 {
            self.shuffle(rng);
        }
        let x = self.items.get(self.dealt).copied();
        self.dealt += 1;
        x
    }
}

impl Deck<u32> {
    /// Shuffles the deck with `first` at its top.
    fn open_with(&mut self, first: u32, rng: &mut impl Rng) {
        self.shuffle(rng);
        if let Some(i) = self.items.iter().position(|&x| x == first) {
            self.items.swap(0, i);
        }
    }
}

/// Arrival offsets. Windows of the span: in order, each window's gaps shuffled and dealt whole
/// before the next (the span starts over when the output is longer); at 1× the gaps are the
/// input's own and every window keeps its rate. Hours of the day: each gap drawn from the deck
/// of the hour it starts in (an hour without arrivals in the input is skipped). Gaps are scaled
/// to the output's rate.
struct Clock {
    t_us: f64,
    decks: Vec<Deck<u64>>,
    window: usize,
}

impl Clock {
    fn new(m: &Model) -> Clock {
        Clock {
            t_us: 0.0,
            decks: m.windows.iter().map(|w| Deck::new(w.clone())).collect(),
            window: usize::MAX,
        }
    }

    /// The next arrival and its window.
    fn next(&mut self, m: &Model, p: &Plan, rng: &mut impl Rng) -> (u64, usize) {
        let n = self.decks.len();
        let next = match m.daily {
            true => self.hour_of_day(),
            false if self.window < n && self.decks[self.window].left() > 0 => Some(self.window),
            false => {
                let from = self.window.wrapping_add(1) % n;
                let mut next = (0..n).map(|d| (from + d) % n);
                next.find(|&w| !self.decks[w].items.is_empty())
            }
        };
        let at = self.t_us.round() as u64;
        let Some(w) = next else {
            self.t_us += 1e6 / m.rate_rps.max(1e-9) * p.gap_scale;
            return (at, 0);
        };
        self.window = w;
        let gap = self.decks[w].draw(rng).unwrap_or(0) as f64;
        self.t_us += gap * p.gap_scale;
        (at, w)
    }

    /// The hour of the day now, moving the clock on to the next hour with gaps when this one
    /// has none.
    fn hour_of_day(&mut self) -> Option<usize> {
        let now = self.t_us as u64 / HOUR_US;
        let k = (0..24).find(|k| !self.decks[((now + k) % 24) as usize].items.is_empty())?;
        if k > 0 {
            self.t_us = ((now + k) * HOUR_US) as f64;
        }
        Some(((now + k) % 24) as usize)
    }
}

/// A node of the generated prefix tree; node 0 is the root above every first block.
#[derive(Default)]
struct Node {
    parent: usize,
    depth: u32,
    /// The time of its last access (0: none, the root).
    last: u64,
    /// The deepest depth in its subtree.
    height: u32,
    /// The number of blocks of the request that last accessed it.
    reach: u32,
    /// Children by the time of their last access.
    kids: Kids,
}

/// A node's children by the time of their last access. Most nodes have one (a request's own
/// blocks form a chain), held inline: a map costs a few hundred bytes.
#[derive(Default)]
enum Kids {
    #[default]
    None,
    One(u64, usize),
    Many(BTreeMap<u64, usize>),
}

impl Kids {
    fn insert(&mut self, t: u64, child: usize) {
        *self = match std::mem::take(self) {
            Kids::None => Kids::One(t, child),
            Kids::One(t0, c0) => Kids::Many(BTreeMap::from([(t0, c0), (t, child)])),
            Kids::Many(mut m) => {
                m.insert(t, child);
                Kids::Many(m)
            }
        };
    }

    fn remove(&mut self, t: u64) {
        match self {
            Kids::One(t0, _) if *t0 == t => *self = Kids::None,
            Kids::Many(m) => {
                m.remove(&t);
            }
            _ => {}
        }
    }

    fn get(&self, t: u64) -> Option<usize> {
        self.range(t..=t).next()
    }

    /// The children last accessed within `times`, oldest first.
    fn range(
        &self,
        times: impl std::ops::RangeBounds<u64>,
    ) -> impl DoubleEndedIterator<Item = usize> + '_ {
        let one = match self {
            Kids::One(t, c) if times.contains(t) => Some(*c),
            _ => None,
        };
        let many = match self {
            Kids::Many(m) => Some(m.range(times)),
            _ => None,
        };
        one.into_iter()
            .chain(many.into_iter().flatten().map(|(_, &c)| c))
    }
}

/// The generated prefix tree and its block accesses.
struct Tree {
    nodes: Vec<Node>,
    rec: Recency,
}

impl Default for Tree {
    fn default() -> Tree {
        Tree {
            nodes: vec![Node::default()],
            rec: Recency::default(),
        }
    }
}

impl Tree {
    /// The child of `node` that starts `step`, its subtree reaching depth `h`. Of the
    /// [`CANDIDATES`] accessed most recently but at least `distance` blocks ago (else those
    /// accessed soonest after) whose last request reached the step's end, the one whose last
    /// request went nearest `step.below` blocks below it; failing that, any reaching `h`, by
    /// recency; else the deepest.
    fn child(&self, node: usize, step: Step, h: u32, distance: u64) -> Option<usize> {
        let kids = &self.nodes[node].kids;
        let t = self.rec.latest_at_distance(distance).unwrap_or(0);
        let deep = |c: &&usize| self.nodes[**c].height >= h;
        let whole = |c: &&usize| deep(c) && self.nodes[**c].reach >= step.end;
        let off = |c: &usize| (self.nodes[*c].reach.saturating_sub(step.end)).abs_diff(step.below);
        let older = || kids.range(..=t).rev();
        let newer = || kids.range(t + 1..);
        let best = |it: &mut dyn Iterator<Item = usize>| -> Option<usize> {
            it.filter(|c| whole(&c)).take(CANDIDATES).min_by_key(off)
        };
        best(&mut older())
            .or_else(|| best(&mut newer()))
            .or_else(|| older().find(|c| deep(&c)))
            .or_else(|| newer().find(|c| deep(&c)))
            .or_else(|| kids.range(..).max_by_key(|&c| self.nodes[c].height))
    }

    /// The child of `node` the same request accessed right after it, if any.
    fn next_of_same_request(&self, node: usize) -> Option<usize> {
        let last = self.nodes[node].last;
        (node != 0).then(|| self.nodes[node].kids.get(last + 1))?
    }

    fn touch(&mut self, node: usize) {
        let (parent, last) = (self.nodes[node].parent, self.nodes[node].last);
        let now = self.rec.access(last);
        let kids = &mut self.nodes[parent].kids;
        kids.remove(last);
        kids.insert(now, node);
        self.nodes[node].last = now;
    }

    /// A new child of `parent`; its ancestors' heights are left to [`Tree::raise`].
    fn add(&mut self, parent: usize) -> usize {
        let n = self.nodes.len();
        let depth = self.nodes[parent].depth + 1;
        self.nodes.push(Node {
            parent,
            depth,
            height: depth,
            ..Default::default()
        });
        self.touch(n);
        n
    }

    /// The heights above `node` raised to its depth, once for a whole chain of new blocks (a
    /// walk per block would be quadratic in a request's length).
    fn raise(&mut self, node: usize) {
        let depth = self.nodes[node].depth;
        let mut up = self.nodes[node].parent;
        while up != 0 && self.nodes[up].height < depth {
            self.nodes[up].height = depth;
            up = self.nodes[up].parent;
        }
    }

    /// Ids of a request of `blocks` blocks whose cached path follows `steps` (see [`Row`]): level
    /// by level from the root, each step starting at a child whose reuse distance is the step's
    /// and whose last request went as deep, then following that request; then fresh blocks. Ids
    /// are the node numbers: a counter, nothing of the input's.
    fn request(&mut self, blocks: u32, steps: &[Step]) -> Vec<u64> {
        let h = steps.last().map_or(0, |s| s.end);
        let mut path: Vec<usize> = Vec::new();
        'steps: for &step in steps {
            let Step { end, distance, .. } = step;
            let start = path.len() as u32 + 1;
            while (path.len() as u32) < end {
                let at = path.last().copied().unwrap_or(0);
                let level = path.len() as u32 + 1;
                // the levels above the step's end were accessed just before it
                let d = distance + u64::from(end - level);
                let same = (level > start)
                    .then(|| self.next_of_same_request(at))
                    .flatten()
                    .filter(|&c| self.nodes[c].height >= h);
                match same.or_else(|| self.child(at, step, h, d)) {
                    Some(c) => path.push(c),
                    None => break 'steps,
                }
            }
        }
        for &n in &path {
            self.touch(n);
        }
        let shared = path.len();
        while (path.len() as u32) < blocks {
            let at = path.last().copied().unwrap_or(0);
            path.push(self.add(at));
        }
        if path.len() > shared {
            self.raise(path[path.len() - 1]);
        }
        for &n in &path {
            self.nodes[n].reach = blocks;
        }
        path.iter().map(|&n| n as u64).collect()
    }
}

/// Request mode: each request's arrival from the clock (in order), a row of its window, and
/// ids from the generated tree.
struct Requests<'m> {
    m: &'m Model,
    p: Plan,
    rng: rand_chacha::ChaCha8Rng,
    clock: Clock,
    rows: Vec<Deck<u32>>,
    tree: Tree,
    /// Most block accesses of one tree ([`MAX_TREE_ACCESSES`]).
    tree_cap: u64,
    /// The ids of the trees before this one: this tree's ids start after them.
    base: u64,
    made: u64,
}

impl<'m> Requests<'m> {
    fn new(m: &'m Model, p: Plan, mut rng: rand_chacha::ChaCha8Rng) -> Requests<'m> {
        let mut rows: Vec<Deck<u32>> = m.window_rows.iter().map(|v| Deck::new(v.clone())).collect();
        // the input's first request opens the output: it is the one that found no tree before it
        if let Some(d) = rows.first_mut() {
            d.open_with(0, &mut rng);
        }
        Requests {
            m,
            p,
            rng,
            clock: Clock::new(m),
            rows,
            tree: Tree::default(),
            tree_cap: MAX_TREE_ACCESSES,
            base: 0,
            made: 0,
        }
    }

    fn next(&mut self) -> Option<Result<Request, WhatIfError>> {
        let (m, p, rng) = (self.m, &self.p, &mut self.rng);
        if self.made >= p.requests {
            return None;
        }
        let (at, w) = self.clock.next(m, p, rng);
        if p.until_us.is_some_and(|u| at > u) {
            self.made = p.requests;
            return None;
        }
        // a row of the window: lengths and reuse as they were at this point of the span
        let i = self.rows.get_mut(w).and_then(|d| d.draw(rng));
        let row = &m.rows[i.map_or_else(|| rng.random_range(0..m.rows.len()), |i| i as usize)];
        if self.tree.rec.now > 0 && self.tree.rec.now + u64::from(row.blocks) > self.tree_cap {
            self.base += self.tree.nodes.len() as u64;
            self.tree = Tree::default();
        }
        let steps: Vec<Step> = row
            .steps
            .iter()
            .map(|&s| Step {
                distance: (s.distance as f64 * p.lag_scale).round() as u64,
                ..s
            })
            .collect();
        let mut r = row.proto.clone();
        r.arrival_us = at;
        let base = self.base;
        r.hash_ids = (self.tree.request(row.blocks, &steps).into_iter())
            .map(|id| base + id)
            .collect();
        self.made += 1;
        Some(Ok(r))
    }
}

/// A generated session turn waiting for its arrival: ordered by arrival, then by generation.
struct Waiting {
    key: (u64, u64),
    req: Request,
}

impl PartialEq for Waiting {
    fn eq(&self, o: &Self) -> bool {
        self.key == o.key
    }
}
impl Eq for Waiting {}
impl PartialOrd for Waiting {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Waiting {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.key.cmp(&o.key)
    }
}

/// Session mode: whole sessions drawn at session starts (in order); their turns wait in a heap
/// until no session yet to start can come before them (a turn is never before its session's
/// start), so they leave in arrival order, ties in the order made. Sessions are made until
/// `p.requests` turns are, and the first `p.requests` by arrival written.
struct Sessions<'m> {
    m: &'m Model,
    p: Plan,
    rng: rand_chacha::ChaCha8Rng,
    clock: Clock,
    /// A session start gap is the request gap times the mean turns per session.
    turns_per: f64,
    /// The input gives no session start times (all at t0): Poisson starts at its rate.
    starts_only: bool,
    next_id: u64,
    shared: Vec<u64>,
    copy: u64,
    made: u64,
    written: u64,
    /// The start of the next session, drawn; `None` once no more are made.
    next_start: Option<u64>,
    done: bool,
    waiting: std::collections::BinaryHeap<std::cmp::Reverse<Waiting>>,
    /// Hash ids of the waiting turns.
    held: u64,
}

impl<'m> Sessions<'m> {
    fn new(m: &'m Model, p: Plan, rng: rand_chacha::ChaCha8Rng) -> Sessions<'m> {
        Sessions {
            m,
            p,
            rng,
            clock: Clock::new(m),
            turns_per: m.requests as f64 / m.sessions.len() as f64,
            starts_only: m.windows.iter().all(|w| w.iter().all(|&g| g == 0)),
            next_id: u64::from(m.shared_blocks),
            shared: (0..u64::from(m.shared_blocks)).collect(),
            copy: 0,
            made: 0,
            written: 0,
            next_start: None,
            done: false,
            waiting: Default::default(),
            held: 0,
        }
    }

    /// Draws the next session's start, unless enough turns are made or it is past the end.
    fn draw_start(&mut self) {
        if self.done || self.next_start.is_some() {
            return;
        }
        if self.made >= self.p.requests {
            self.done = true;
            return;
        }
        let start = if self.starts_only {
            let rate = self.m.rate_rps / self.turns_per / self.p.gap_scale;
            let t = self.clock.t_us as u64;
            let u: f64 = self.rng.random_range(f64::EPSILON..1.0);
            self.clock.t_us += -u.ln() * 1e6 / rate.max(1e-12);
            t
        } else {
            self.clock.next(self.m, &self.p, &mut self.rng).0
        };
        match self.p.until_us.is_some_and(|u| start > u) {
            true => self.done = true,
            false => self.next_start = Some(start),
        }
    }

    /// A whole session from `start`, its turns put to wait.
    fn make_session(&mut self, start: u64) {
        let m = self.m;
        let s = &m.sessions[self.rng.random_range(0..m.sessions.len())];
        let locals = s
            .turns
            .iter()
            .flat_map(|t| &t.labels)
            .filter_map(|l| l.ok())
            .max()
            .map_or(0, |x| u64::from(x) + 1);
        let base = self.next_id;
        self.next_id += locals;
        for (turn, t) in s.turns.iter().enumerate() {
            let mut r = t.proto.clone();
            r.arrival_us = start + t.offset_us;
            r.session = Some(Session {
                id: format!("s{}", self.copy),
                turn: turn as u32,
                think_us: t.think_us,
            });
            r.hash_ids = t
                .labels
                .iter()
                .map(|l| match l {
                    Ok(i) => base + u64::from(*i),
                    Err(j) => self.shared[*j as usize],
                })
                .collect();
            self.held += r.hash_ids.len() as u64;
            let key = (r.arrival_us, self.made);
            self.waiting
                .push(std::cmp::Reverse(Waiting { key, req: r }));
            self.made += 1;
        }
        self.copy += 1;
    }

    fn next(&mut self) -> Option<Result<Request, WhatIfError>> {
        loop {
            if self.written >= self.p.requests {
                return None;
            }
            self.draw_start();
            if self.held > MAX_HELD_IDS {
                self.written = self.p.requests;
                return Some(Err(too_many_ids()));
            }
            let due = self.waiting.peek().map(|w| w.0.key.0);
            match (due, self.next_start) {
                (Some(at), Some(start)) if at <= start => break,
                (_, Some(start)) => {
                    self.next_start = None;
                    self.make_session(start);
                }
                (Some(_), None) => break,
                (None, None) => return None,
            }
        }
        let std::cmp::Reverse(w) = self.waiting.pop()?;
        self.held -= w.req.hash_ids.len() as u64;
        if self.p.until_us.is_some_and(|u| w.req.arrival_us > u) {
            self.written = self.p.requests;
            return None;
        }
        self.written += 1;
        Some(Ok(w.req))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(t: u64, isl: u64, ids: &[u64]) -> Request {
        Request {
            arrival_us: t,
            input_tokens: isl,
            output_tokens: 7,
            hash_ids: ids.to_vec(),
            ..Default::default()
        }
    }

    fn step(end: u32, distance: u64, below: u32) -> Step {
        Step {
            end,
            distance,
            below,
        }
    }

    #[test]
    fn rows_know_their_steps_and_reuse_distances() {
        let reqs = [
            req(0, 30, &[1, 2]),
            req(1, 30, &[5, 6]),
            req(2, 50, &[1, 2, 3]),
            req(3, 40, &[1, 9]),
            req(4, 40, &[1, 2, 3, 4]),
        ];
        let refs: Vec<&Request> = reqs.iter().collect();
        let steps: Vec<Vec<Step>> = rows_of(&refs).into_iter().map(|r| r.steps).collect();
        // request 3 hangs from block 2 of request 1, with 5 and 6 accessed since; request 4
        // from block 1 of request 3, with 2 and 3 since; request 5 has block 1 of request 4
        // (9 since, which went 1 block deeper) and blocks 2, 3 of request 3 (1 and 9 since)
        // (request 3 went 2 blocks below block 1)
        assert_eq!(
            steps,
            [
                vec![],
                vec![],
                vec![step(2, 2, 0)],
                vec![step(1, 2, 2)],
                vec![step(1, 1, 1), step(3, 2, 0)],
            ]
        );
    }

    #[test]
    fn the_tree_shares_paths_and_mints_new_ids() {
        let mut t = Tree::default();
        let a = t.request(3, &[]);
        let b = t.request(2, &[]);
        // a's first two blocks, 3 distinct blocks ago (a's third and b's two since)
        let c = t.request(4, &[step(2, 3, 1)]);
        assert_eq!(c[..2], a[..2]);
        assert_ne!(c[2], a[2]);
        assert!(b.iter().all(|x| !a.contains(x)));
        // nothing at depth 5 yet: the deepest path there is is used
        let d = t.request(6, &[step(5, 0, 0)]);
        assert_eq!(d[..4], c[..]);
        // two steps: d's first two blocks, then the older of the two third blocks under them,
        // the one whose last request ended there: a's
        let e = t.request(3, &[step(2, 0, 4), step(3, 20, 0)]);
        assert_eq!(e[..], a[..]);
    }

    #[test]
    fn sizes_follow_the_flags() {
        let t = Trace {
            header: TraceHeader::imported(16, true, "t"),
            requests: (0..101).map(|i| req(i * 10_000, 16, &[i])).collect(),
        };
        let m = fit(&t).unwrap();
        assert!((m.rate_rps - 100.0).abs() < 1e-9);
        let size = |requests, duration_us, rate| Size {
            requests,
            duration_us,
            rate,
            scale_users: 1.0,
        };
        assert_eq!(plan(&m, &size(None, None, None)).unwrap().requests, 101);
        // arrivals at 0, 10 ms, ... 10 s; at 5 req/s every 200 ms
        let n = |s: Size| sample(&m, &s, 1).unwrap().count();
        assert_eq!(n(size(None, Some(10_000_000), None)), 1001);
        assert_eq!(n(size(None, Some(10_000_000), Some(5.0))), 51);
        let p = plan(&m, &size(Some(50), Some(1_000_000), None)).unwrap();
        assert!((p.gap_scale - 2.0).abs() < 1e-9);
        let out: Vec<Request> = sample(&m, &size(Some(400), None, None), 1)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(out.len(), 400);
        // the input's rate is kept (its gaps are all 10 ms), so the span grows
        assert_eq!(out[399].arrival_us - out[0].arrival_us, 3_990_000);
    }

    #[test]
    fn a_tree_past_its_cap_starts_anew_with_fresh_ids() {
        // every request shares the first two blocks of the one before it
        let t = Trace {
            header: TraceHeader::imported(16, true, "t"),
            requests: (0..40)
                .map(|i| req(i * 1000, 64, &[0, 1, 100 + 2 * i, 101 + 2 * i]))
                .collect(),
        };
        let m = fit(&t).unwrap();
        let size = Size {
            requests: Some(200),
            duration_us: None,
            rate: None,
            scale_users: 1.0,
        };
        let rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let mut s = Requests::new(&m, plan(&m, &size).unwrap(), rng);
        s.tree_cap = 40;
        let (mut cuts, mut seen_before_cut) = (0, std::collections::HashSet::new());
        let mut this_tree = std::collections::HashSet::new();
        let mut base = 0;
        while let Some(r) = s.next() {
            let r = r.unwrap();
            assert!(s.tree.rec.now <= 40, "{} accesses held", s.tree.rec.now);
            if s.base != base {
                cuts += 1;
                base = s.base;
                seen_before_cut.extend(this_tree.drain());
            }
            assert!(r.hash_ids.iter().all(|h| !seen_before_cut.contains(h)));
            this_tree.extend(r.hash_ids.iter().copied());
        }
        assert!(cuts >= 10, "{cuts} cuts");
        // reuse goes on within each tree
        assert!(this_tree.len() < 40);
    }
}
