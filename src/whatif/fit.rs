//! `synth --fit`: a model learned from a trace, and new traces sampled from it (pure).
//!
//! What is learned (docs/synth.md has the reasoning and the measured fit):
//! - per request, a row: input and output length, endpoint, model and parameters, its number of
//!   blocks, how many leading blocks an earlier request had (its depth in the prefix tree where it
//!   leaves the cached path) and how many distinct blocks were accessed since that tree node was
//!   (its reuse distance). Rows are drawn whole, so lengths stay joint with the node
//!   they hang from;
//! - arrivals: the inter-arrival gaps of each window of the input's span (rate over time and
//!   burst shape), and their gamma shape, reported;
//! - sessions (when every request has one): whole sessions, their turns' offsets, think times and
//!   the sharing inside them; blocks that several sessions share stay shared.
//!
//! Sampling builds a new prefix tree: a request hangs from the node of its row's depth accessed
//! most recently but at least its row's reuse distance ago, shares that path and adds fresh
//! blocks. Every id is
//! new (a counter), so nothing in the output maps back to the input.

use super::WhatIfError;
use crate::trace::{HashScheme, Request, Session, Trace, TraceHeader};
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};

/// Windows the input's span is cut into for the rate profile (fewer for short traces).
const WINDOWS: usize = 100;
/// Gaps per window at least (short traces get fewer, longer windows).
const GAPS_PER_WINDOW: usize = 100;

/// One request of the input as the model keeps it.
#[derive(Debug, Clone)]
struct Row {
    /// Lengths, endpoint, model, parameters; no ids, response, body or session.
    proto: Request,
    blocks: u32,
    /// Leading blocks an earlier request had.
    hit: u32,
    /// Distinct blocks accessed since the node at depth `hit` was (its reuse distance).
    lag: u64,
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
pub struct Model {
    block_size: u32,
    partial_tail_block: bool,
    rows: Vec<Row>,
    sessions: Vec<SessionT>,
    shared_blocks: u32,
    /// Gaps (µs) between successive arrivals (session starts in session mode), by window.
    windows: Vec<Vec<u64>>,
    /// Mean arrival rate of requests.
    pub rate_rps: f64,
    /// Gamma shape of the gaps by moments (1 = Poisson, below 1 bursty).
    pub gamma_shape: f64,
    pub requests: u64,
}

impl Model {
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }
}

/// The size of the output.
#[derive(Debug, Clone, PartialEq)]
pub struct Size {
    pub requests: Option<u64>,
    pub duration_us: Option<u64>,
    pub rate: Option<f64>,
    pub scale_users: f64,
}

/// Learns the model from the trace's workload.
pub fn fit(trace: &Trace) -> Result<Model, WhatIfError> {
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
    let windows = windows_of(&starts, span);
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

/// Rows in arrival order. A request's hit is its leading ids seen before (inspect's rule), its
/// reuse distance that of the last of them.
fn rows_of(reqs: &[&Request]) -> Vec<Row> {
    // per id, the time of its last access
    let mut last: HashMap<u64, u64> = HashMap::new();
    let mut rec = Recency::default();
    let mut out = Vec::with_capacity(reqs.len());
    for r in reqs {
        let hit = r
            .hash_ids
            .iter()
            .take_while(|h| last.contains_key(h))
            .count();
        let lag = match hit {
            0 => 0,
            n => rec.distance(last[&r.hash_ids[n - 1]]),
        };
        out.push(Row {
            proto: proto(r),
            blocks: r.hash_ids.len() as u32,
            hit: hit as u32,
            lag,
        });
        for h in &r.hash_ids {
            let t = last.entry(*h).or_insert(0);
            *t = rec.access(*t);
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
    marks: Vec<bool>,
    total: u64,
    now: u64,
}

impl Recency {
    fn add(&mut self, t: u64, up: bool) {
        self.marks[t as usize] = up;
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

    fn grow(&mut self) {
        let n = (self.tree.len() * 2).max(1024);
        self.marks.resize(n, false);
        self.tree = vec![0; n];
        let marked: Vec<u64> = (1..n as u64).filter(|&t| self.marks[t as usize]).collect();
        for t in marked {
            self.add(t, true);
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

/// Gaps between successive `times`, grouped by the window of the span they start in.
fn windows_of(times: &[u64], span: u64) -> Vec<Vec<u64>> {
    let gaps = times.len().saturating_sub(1);
    let n = (gaps / GAPS_PER_WINDOW).clamp(1, WINDOWS);
    let t0 = times.first().copied().unwrap_or(0);
    let w = (span / n as u64).max(1);
    let mut out = vec![Vec::new(); n];
    for p in times.windows(2) {
        let k = (((p[0] - t0) / w) as usize).min(n - 1);
        out[k].push(p[1] - p[0]);
    }
    out
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
    if requests > 100_000_000 {
        return Err(WhatIfError::Option(format!(
            "{requests} requests is more than the 10^8 synth writes"
        )));
    }
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

/// Samples a new trace from the model.
pub fn sample(m: &Model, s: &Size, seed: u64) -> Result<Trace, WhatIfError> {
    let p = plan(m, s)?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut header =
        TraceHeader::imported(m.block_size, m.partial_tail_block, "retrace synth --fit");
    header.hash_scheme = HashScheme::Dense;
    let requests = if m.sessions.is_empty() {
        sample_requests(m, &p, &mut rng)
    } else {
        sample_sessions(m, &p, &mut rng)
    };
    let mut t = Trace { header, requests };
    t.sort_by_arrival();
    Ok(t)
}

/// Arrival offsets: the windows of the input's span in order, each window's gaps shuffled and
/// dealt whole before the next (the span starts over when the output is longer), scaled to the
/// output's rate. At 1× the gaps are the input's own and every window keeps its rate.
struct Clock {
    t_us: f64,
    decks: Vec<Vec<u64>>,
    window: usize,
    dealt: usize,
}

impl Clock {
    fn new(m: &Model) -> Clock {
        Clock {
            t_us: 0.0,
            decks: m.windows.clone(),
            window: usize::MAX,
            dealt: 0,
        }
    }

    fn next(&mut self, m: &Model, p: &Plan, rng: &mut impl Rng) -> u64 {
        use rand::seq::SliceRandom;
        let at = self.t_us.round() as u64;
        let n = self.decks.len();
        if self.window >= n || self.dealt >= self.decks[self.window].len() {
            let from = self.window.wrapping_add(1) % n;
            match (0..n)
                .map(|d| (from + d) % n)
                .find(|&w| !self.decks[w].is_empty())
            {
                Some(w) => {
                    self.window = w;
                    self.decks[w].shuffle(rng);
                    self.dealt = 0;
                }
                None => {
                    self.t_us += 1e6 / m.rate_rps.max(1e-9) * p.gap_scale;
                    return at;
                }
            }
        }
        let gap = self.decks[self.window][self.dealt] as f64;
        self.dealt += 1;
        self.t_us += gap * p.gap_scale;
        at
    }
}

/// The generated prefix tree: per depth, nodes by the time of their last access.
#[derive(Default)]
struct Tree {
    /// node → (parent, id, depth, last access)
    nodes: Vec<(usize, u64, u32, u64)>,
    by_depth: Vec<BTreeMap<u64, usize>>,
    rec: Recency,
}

impl Tree {
    /// The node at `depth` accessed most recently but at least `distance` blocks ago, else the
    /// least recently accessed one.
    fn near(&self, depth: u32, distance: u64) -> Option<usize> {
        let m = self.by_depth.get(depth as usize - 1)?;
        match self.rec.latest_at_distance(distance) {
            Some(t) => m.range(..=t).next_back().or_else(|| m.range(t..).next()),
            None => m.iter().next(),
        }
        .map(|(_, &n)| n)
    }

    fn path(&self, mut node: usize) -> Vec<usize> {
        let mut v = Vec::new();
        while node != usize::MAX {
            v.push(node);
            node = self.nodes[node].0;
        }
        v.reverse();
        v
    }

    fn touch(&mut self, node: usize) {
        let (_, _, d, last) = self.nodes[node];
        let now = self.rec.access(last);
        let m = &mut self.by_depth[d as usize - 1];
        m.remove(&last);
        m.insert(now, node);
        self.nodes[node].3 = now;
    }

    fn add(&mut self, parent: usize, depth: u32) -> usize {
        let n = self.nodes.len();
        // ids are the node numbers: a counter, nothing of the input's
        self.nodes.push((parent, n as u64, depth, 0));
        if self.by_depth.len() < depth as usize {
            self.by_depth.resize_with(depth as usize, BTreeMap::new);
        }
        self.touch(n);
        n
    }

    /// Ids of a request of `blocks` blocks hanging from a node at depth `hit` last accessed
    /// about `distance` distinct blocks ago.
    fn request(&mut self, blocks: u32, hit: u32, distance: u64) -> Vec<u64> {
        let mut path = Vec::new();
        if hit > 0 {
            // the deepest depth at or above `hit` that exists
            let d = hit.min(self.by_depth.len() as u32);
            if let Some(n) = (1..=d).rev().find_map(|d| self.near(d, distance)) {
                path = self.path(n);
            }
        }
        for &n in &path {
            self.touch(n);
        }
        let mut parent = path.last().copied().unwrap_or(usize::MAX);
        for d in path.len() as u32 + 1..=blocks {
            parent = self.add(parent, d);
            path.push(parent);
        }
        path.iter().map(|&n| self.nodes[n].1).collect()
    }
}

fn sample_requests(m: &Model, p: &Plan, rng: &mut impl Rng) -> Vec<Request> {
    let mut clock = Clock::new(m);
    let mut tree = Tree::default();
    let mut out = Vec::with_capacity(p.requests.min(1 << 24) as usize);
    for _ in 0..p.requests {
        let at = clock.next(m, p, rng);
        if p.until_us.is_some_and(|u| at > u) {
            break;
        }
        let row = &m.rows[rng.random_range(0..m.rows.len())];
        let lag = (row.lag as f64 * p.lag_scale).round() as u64;
        let mut r = row.proto.clone();
        r.arrival_us = at;
        r.hash_ids = tree.request(row.blocks, row.hit, lag);
        out.push(r);
    }
    out
}

fn sample_sessions(m: &Model, p: &Plan, rng: &mut impl Rng) -> Vec<Request> {
    let mut clock = Clock::new(m);
    // a session start gap is the request gap times the mean turns per session
    let turns_per = m.requests as f64 / m.sessions.len() as f64;
    let starts_only = m.windows.iter().all(|w| w.iter().all(|&g| g == 0));
    let mut next_id = 0u64;
    let shared: Vec<u64> = (0..u64::from(m.shared_blocks)).collect();
    next_id += u64::from(m.shared_blocks);
    let mut out: Vec<Request> = Vec::new();
    let mut copy = 0u64;
    while (out.len() as u64) < p.requests {
        let start = if starts_only {
            // the input gives no session start times (all at t0): Poisson starts at its rate
            let rate = m.rate_rps / turns_per / p.gap_scale;
            let t = clock.t_us as u64;
            let u: f64 = rng.random_range(f64::EPSILON..1.0);
            clock.t_us += -u.ln() * 1e6 / rate.max(1e-12);
            t
        } else {
            clock.next(m, p, rng)
        };
        if p.until_us.is_some_and(|u| start > u) {
            break;
        }
        let s = &m.sessions[rng.random_range(0..m.sessions.len())];
        let locals = s
            .turns
            .iter()
            .flat_map(|t| &t.labels)
            .filter_map(|l| l.ok())
            .max()
            .map_or(0, |x| u64::from(x) + 1);
        let base = next_id;
        next_id += locals;
        for (turn, t) in s.turns.iter().enumerate() {
            let mut r = t.proto.clone();
            r.arrival_us = start + t.offset_us;
            r.session = Some(Session {
                id: format!("s{copy}"),
                turn: turn as u32,
                think_us: t.think_us,
            });
            r.hash_ids = t
                .labels
                .iter()
                .map(|l| match l {
                    Ok(i) => base + u64::from(*i),
                    Err(j) => shared[*j as usize],
                })
                .collect();
            out.push(r);
        }
        copy += 1;
    }
    out.sort_by_key(|r| r.arrival_us);
    out.truncate(p.requests as usize);
    if let Some(u) = p.until_us {
        out.retain(|r| r.arrival_us <= u);
    }
    out
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

    #[test]
    fn rows_know_their_depth_and_reuse_distance() {
        let reqs = [
            req(0, 30, &[1, 2]),
            req(1, 30, &[5, 6]),
            req(2, 50, &[1, 2, 3]),
            req(3, 40, &[1, 9]),
        ];
        let refs: Vec<&Request> = reqs.iter().collect();
        let rows = rows_of(&refs);
        let got: Vec<(u32, u32, u64)> = rows.iter().map(|r| (r.blocks, r.hit, r.lag)).collect();
        // request 3 hangs from block 2, with 5 and 6 accessed since; request 4 from block 1,
        // with 2 and 3 accessed since
        assert_eq!(got, [(2, 0, 0), (2, 0, 0), (3, 2, 2), (2, 1, 2)]);
    }

    #[test]
    fn the_tree_shares_paths_and_mints_new_ids() {
        let mut t = Tree::default();
        let a = t.request(3, 0, 0);
        let b = t.request(2, 0, 0);
        let c = t.request(4, 2, 2);
        assert_eq!(c[..2], a[..2]);
        assert_ne!(c[2], a[2]);
        assert!(b.iter().all(|x| !a.contains(x)));
        // nothing at depth 5 yet: the deepest node above is used
        let d = t.request(6, 5, 0);
        assert_eq!(d[..4], c[..]);
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
        assert_eq!(
            plan(&m, &size(None, Some(10_000_000), None))
                .unwrap()
                .requests,
            1000
        );
        assert_eq!(
            plan(&m, &size(None, Some(10_000_000), Some(5.0)))
                .unwrap()
                .requests,
            50
        );
        let p = plan(&m, &size(Some(50), Some(1_000_000), None)).unwrap();
        assert!((p.gap_scale - 2.0).abs() < 1e-9);
        let out = sample(&m, &size(Some(400), None, None), 1).unwrap();
        assert_eq!(out.requests.len(), 400);
        // the input's rate is kept, so the span grows
        // the input's rate is kept (its gaps are all 10 ms), so the span grows
        assert_eq!(out.span_us(), 3_990_000);
    }
}
