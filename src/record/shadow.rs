//! `record --shadow`: a copy of each workload request to up to four candidate servers (and a
//! control), timed as the primary's response is, its measurement joined to the primary's record
//! (docs/shadow.md). Isolation is the contract:
//! - a copy is offered when the client's request body is complete, spawned on the shadow
//!   thread (its own runtime and connection pools), and never awaited by the client's exchange;
//! - what copies hold is bounded in count (`--shadow-max-in-flight`) and in bytes
//!   ([`MAX_BYTES`]: request bodies, captured responses, and primaries waiting for their copies);
//!   past either, a copy is skipped and counted, or its measurement given up;
//! - a copy obeys the header, idle and total timeouts ([`COPY_TOTAL`] without `--total-timeout`)
//!   and `--capture-max`, and is cut at the drain deadline.

use super::common::{chain, classify};
use super::counters::{ProxyCounters, ShadowCounters, Skip};
use super::extract::{Captured, Exchange};
use super::failure::ProxyFailure;
use super::tap::lock;
use super::upstream::{self, Connector, UpstreamOptions};
use super::writer::Recorder;
use crate::trace::shadow::Role;
use crate::trace::{Endpoint, EndpointKind};
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::Uri;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Bytes all copies may hold at once: request bodies, captured responses, and the records of
/// primaries that ended before their copies.
pub(crate) const MAX_BYTES: u64 = 256 << 20;
/// The default of `--shadow-max-in-flight`.
pub(crate) const DEFAULT_MAX_IN_FLIGHT: usize = 256;
/// Most `--shadow` targets (a `--shadow-control` comes on top).
pub(crate) const MAX_CANDIDATES: usize = 4;
/// A copy's longest life when `--total-timeout` is not given.
pub(crate) const COPY_TOTAL: Duration = Duration::from_secs(600);

/// A secret that never shows in `Debug` output.
#[derive(Clone)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// What `--shadow` and its companions ask for.
#[derive(Debug, Clone)]
pub struct ShadowConfig {
    /// Targets in index order: the candidates, then the control if any.
    pub targets: Vec<(Role, Uri)>,
    /// `--shadow-model`: the copy's `model`.
    pub model: Option<String>,
    /// The key sent to shadows (from `--shadow-api-key-env`); the client's never is.
    pub api_key: Option<Secret>,
    /// `--shadow-fraction`: the share of workload requests mirrored, chosen by body hash.
    pub fraction: f64,
    pub max_in_flight: usize,
}

impl ShadowConfig {
    /// Candidates `shadows` (and a `control`), checked as `--upstream` is, and refused when one
    /// is the upstream itself.
    pub fn new(shadows: &[String], control: Option<&str>, upstream: &Uri) -> anyhow::Result<Self> {
        if shadows.is_empty() {
            anyhow::bail!("--shadow-control needs at least one --shadow candidate");
        }
        if shadows.len() > MAX_CANDIDATES {
            anyhow::bail!(
                "--shadow is given {} times (at most {MAX_CANDIDATES})",
                shadows.len()
            );
        }
        let mut targets = Vec::with_capacity(shadows.len() + 1);
        let given = shadows
            .iter()
            .map(|s| (Role::Candidate, "--shadow", s.as_str()));
        let control = control.map(|s| (Role::Control, "--shadow-control", s));
        for (role, flag, s) in given.chain(control) {
            let u = super::parse_url(flag, s)?;
            if same_target(&u, upstream) {
                anyhow::bail!("{flag} {}: this is the --upstream itself", redact(&u));
            }
            if targets.iter().any(|(_, t)| same_target(t, &u)) {
                anyhow::bail!("{flag} {}: given twice", redact(&u));
            }
            targets.push((role, u));
        }
        Ok(ShadowConfig {
            targets,
            model: None,
            api_key: None,
            fraction: 1.0,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
        })
    }

    /// Refuses a target that is the proxy's own listening address.
    pub(crate) fn refuse_self(&self, listen: std::net::SocketAddr) -> anyhow::Result<()> {
        for (role, u) in &self.targets {
            let port = u.port_u16().unwrap_or(match u.scheme_str() {
                Some("https") => 443,
                _ => 80,
            });
            let host = u.host().unwrap_or("").trim_matches(['[', ']']);
            let local = match host.parse::<std::net::IpAddr>() {
                Ok(ip) => ip.is_loopback() || ip.is_unspecified() || ip == listen.ip(),
                Err(_) => host.eq_ignore_ascii_case("localhost"),
            };
            if local && port == listen.port() {
                let flag = match role {
                    Role::Candidate => "--shadow",
                    Role::Control => "--shadow-control",
                };
                anyhow::bail!("{flag} {}: this is the proxy itself", redact(u));
            }
        }
        Ok(())
    }
}

/// A URL as shown (credentials never).
pub(crate) fn redact(u: &Uri) -> String {
    crate::sys::userinfo::redact(&u.to_string())
}

fn same_target(a: &Uri, b: &Uri) -> bool {
    let host = |u: &Uri| u.authority().map(|a| a.as_str().to_ascii_lowercase());
    a.scheme_str() == b.scheme_str()
        && host(a) == host(b)
        && a.path().trim_end_matches('/') == b.path().trim_end_matches('/')
}

/// One shadow target: where, and its own pooling client.
struct Target {
    scheme: http::uri::Scheme,
    authority: http::uri::Authority,
    base_path: String,
    client: Client<Connector, Full<Bytes>>,
}

/// The timeouts and caps of a copy.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) headers: Duration,
    pub(crate) idle: Duration,
    pub(crate) total: Duration,
    pub(crate) capture_max: usize,
}

/// The shadow side of a recording proxy, shared by every I/O thread.
pub(crate) struct Shadower {
    targets: Vec<Target>,
    model: Option<String>,
    auth: Option<HeaderValue>,
    via: HeaderValue,
    /// A body is mirrored when its hash is below this.
    select_below: u64,
    max_in_flight: u64,
    limits: Limits,
    counters: Arc<ProxyCounters>,
    rt: tokio::runtime::Handle,
    cut: watch::Sender<bool>,
    draining: AtomicBool,
}

/// The shadow thread's runtime: the caller keeps it and shuts it down ([`Shadower::drain`]).
pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    use anyhow::Context as _;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("retrace-shadow")
        // Under CPU saturation forwarding wins and the copies fall behind: their figures then
        // read slow, and so do a control's, whose noise band covers it.
        .on_thread_start(crate::sys::thread_timing::lower_priority)
        .enable_all()
        .build()
        .context("starting the shadow thread")
}

impl Shadower {
    pub(crate) fn new(
        cfg: &ShadowConfig,
        opts: &UpstreamOptions,
        limits: Limits,
        via: HeaderValue,
        counters: Arc<ProxyCounters>,
        rt: tokio::runtime::Handle,
    ) -> anyhow::Result<Arc<Shadower>> {
        use anyhow::Context as _;
        let mut targets = Vec::with_capacity(cfg.targets.len());
        for (_, u) in &cfg.targets {
            let o = UpstreamOptions {
                https: u.scheme_str() == Some("https"),
                http2: false,
                ..opts.clone()
            };
            // hyper-util's client spawns its connection tasks where it is first used: on the
            // shadow thread, since every request is sent from there.
            let _rt = rt.enter();
            targets.push(Target {
                scheme: u.scheme().cloned().unwrap_or(http::uri::Scheme::HTTP),
                authority: u.authority().cloned().context("--shadow has no host")?,
                base_path: u.path().trim_end_matches('/').to_string(),
                client: upstream::build(&o)?,
            });
        }
        let auth = match &cfg.api_key {
            Some(k) => {
                let mut v = HeaderValue::from_str(&format!("Bearer {}", k.0))
                    .context("--shadow-api-key-env: the key is not a valid header value")?;
                v.set_sensitive(true);
                Some(v)
            }
            None => None,
        };
        let _ = counters.shadows.set(
            (0..targets.len())
                .map(|_| ShadowCounters::default())
                .collect(),
        );
        let f = cfg.fraction.clamp(0.0, 1.0);
        Ok(Arc::new(Shadower {
            targets,
            model: cfg.model.clone(),
            auth,
            via,
            select_below: if f >= 1.0 {
                u64::MAX
            } else {
                (f * u64::MAX as f64) as u64
            },
            max_in_flight: cfg.max_in_flight as u64,
            limits,
            counters,
            rt,
            cut: watch::channel(false).0,
            draining: AtomicBool::new(false),
        }))
    }

    fn counters(&self, k: usize) -> Option<&ShadowCounters> {
        self.counters.shadows.get().and_then(|v| v.get(k))
    }

    fn skip(&self, k: usize, why: Skip) {
        if let Some(c) = self.counters(k) {
            c.skipped[why as usize].fetch_add(1, Relaxed);
        }
    }

    /// Whether a request is mirrored: a workload `POST` whose body hash falls in the fraction.
    fn selected(&self, method: &str, path: &str, body: &[u8]) -> bool {
        if !method.eq_ignore_ascii_case("POST") {
            return false;
        }
        if Endpoint::from_path(path).kind() == EndpointKind::Auxiliary {
            return false;
        }
        self.select_below == u64::MAX || xxhash_rust::xxh3::xxh3_64(body) < self.select_below
    }

    /// Takes `n` bytes of the budget.
    fn take_bytes(&self, n: u64) -> bool {
        let before = self.counters.shadow_bytes.fetch_add(n, Relaxed);
        if before.saturating_add(n) > MAX_BYTES {
            self.counters.shadow_bytes.fetch_sub(n, Relaxed);
            return false;
        }
        true
    }

    fn give_bytes(&self, n: u64) {
        self.counters.shadow_bytes.fetch_sub(n, Relaxed);
    }

    /// A slot for one more copy of `n` body bytes, or why not.
    fn reserve(&self, n: u64) -> Result<(), Skip> {
        if self.draining.load(Relaxed) {
            return Err(Skip::Draining);
        }
        if self.counters.shadow_in_flight.fetch_add(1, Relaxed) >= self.max_in_flight {
            self.counters.shadow_in_flight.fetch_sub(1, Relaxed);
            return Err(Skip::InFlight);
        }
        if !self.take_bytes(n) {
            self.counters.shadow_in_flight.fetch_sub(1, Relaxed);
            return Err(Skip::Bytes);
        }
        Ok(())
    }

    /// Mirrors a request whose body just completed, if it is selected: a copy to each target
    /// (or a skip, counted). The returned ticket joins the copies to the primary's record.
    pub(crate) fn offer(
        self: &Arc<Self>,
        method: &str,
        path: &str,
        body: &Captured,
    ) -> Option<Ticket> {
        if !self.selected(method, path, &body.data) {
            return None;
        }
        let join = Arc::new(Join::new(self.clone(), self.targets.len()));
        let bytes = (!body.truncated).then(|| Bytes::copy_from_slice(&body.data));
        for k in 0..self.targets.len() {
            let got = match &bytes {
                None => Err(Skip::BodyOverCap),
                Some(b) => self.reserve(b.len() as u64).map(|()| b.clone()),
            };
            match got {
                Ok(b) => {
                    if let Some(c) = self.counters(k) {
                        c.mirrored.fetch_add(1, Relaxed);
                    }
                    join.add_bytes(b.len() as u64);
                    let guard = CopyGuard {
                        join: join.clone(),
                        k,
                        done: false,
                    };
                    let path = path.to_string();
                    self.rt.spawn(copy(self.clone(), k, path, b, guard));
                }
                Err(why) => {
                    self.skip(k, why);
                    join.done(k, Copy::Skipped(why));
                }
            }
        }
        Some(Ticket(join))
    }

    /// The copy's body: the client's, with `model` replaced when `--shadow-model` is given.
    fn body(&self, b: Bytes) -> Bytes {
        let Some(m) = &self.model else { return b };
        let Ok(mut v) = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&b)
        else {
            return b;
        };
        v.insert("model".into(), serde_json::Value::String(m.clone()));
        serde_json::to_vec(&v).map_or(b, Bytes::from)
    }

    /// Sends one copy and reads its response to the end, noting it into `ex` as the primary's
    /// is noted (capture, frame times, status).
    async fn exchange(
        &self,
        k: usize,
        path: &str,
        body: Bytes,
        ex: &mut Exchange,
        join: &Join,
    ) -> Result<(), ProxyFailure> {
        let t = &self.targets[k];
        let uri = Uri::builder()
            .scheme(t.scheme.clone())
            .authority(t.authority.clone())
            .path_and_query(format!("{}{}", t.base_path, no_query(path)))
            .build()
            .map_err(|_| ProxyFailure::Other)?;
        let mut req = http::Request::post(uri)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::VIA, self.via.clone())
            .body(Full::new(body))
            .map_err(|_| ProxyFailure::Other)?;
        if let Some(a) = &self.auth {
            req.headers_mut().insert(header::AUTHORIZATION, a.clone());
        }
        let start = tokio::time::Instant::from_std(ex.arrival);
        let total = start + self.limits.total;
        let mut cut = self.cut.subscribe();
        let head = tokio::time::timeout_at(
            (start + self.limits.headers).min(total),
            t.client.request(req),
        );
        let resp = tokio::select! {
            _ = cut.wait_for(|c| *c) => return Err(ProxyFailure::DrainDeadline),
            r = head => match r {
                Err(_) => return Err(ProxyFailure::TimeoutHeaders),
                Ok(Err(e)) => return Err(classify(e.is_connect(), false, &e)),
                Ok(Ok(r)) => r,
            },
        };
        ex.status = resp.status().as_u16();
        ex.headers_after = Some(ex.arrival.elapsed());
        if let Some(v) = resp.headers().get(header::CONTENT_TYPE) {
            ex.content_type.push_str(v.to_str().unwrap_or(""));
        }
        let mut body = resp.into_body();
        let max = self.limits.capture_max;
        loop {
            let next = tokio::time::timeout(self.limits.idle, body.frame());
            let frame = tokio::select! {
                _ = cut.wait_for(|c| *c) => return Err(ProxyFailure::DrainDeadline),
                _ = tokio::time::sleep_until(total) => return Err(ProxyFailure::TimeoutTotal),
                f = next => f.map_err(|_| ProxyFailure::TimeoutIdle)?,
            };
            let data = match frame {
                None => return Ok(()),
                Some(Err(e)) => return Err(body_failure(&e)),
                Some(Ok(f)) => match f.into_data() {
                    Ok(d) => d,
                    Err(_) => continue,
                },
            };
            let before = ex.captured_bytes();
            ex.note_response(ex.arrival.elapsed(), &data, max);
            if ex.response_len > max as u64 {
                return Err(ProxyFailure::CaptureMax);
            }
            let grew = ex.captured_bytes().saturating_sub(before);
            if !self.take_bytes(grew) || !join.add_bytes(grew) {
                return Err(ProxyFailure::ShadowBudget);
            }
        }
    }

    /// Waits for copies in flight until `deadline`, then cuts the rest (`drain_deadline`); new
    /// requests are no longer mirrored. Returns whether every copy ended by itself.
    pub(crate) async fn drain(&self, deadline: tokio::time::Instant) -> bool {
        self.draining.store(true, Relaxed);
        while self.counters.shadow_in_flight.load(Relaxed) > 0
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let all = self.counters.shadow_in_flight.load(Relaxed) == 0;
        let _ = self.cut.send(true);
        let grace = tokio::time::Instant::now() + Duration::from_secs(1);
        while self.counters.shadow_in_flight.load(Relaxed) > 0
            && tokio::time::Instant::now() < grace
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        all
    }
}

/// A request path without its query (keys ride there in some APIs; a copy never carries one).
fn no_query(path: &str) -> &str {
    path.split('?').next().unwrap_or(path)
}

/// The failure kind of a response body that broke off.
fn body_failure(e: &hyper::Error) -> ProxyFailure {
    let framing = e.is_parse()
        || chain(e).any(|s| {
            s.downcast_ref::<std::io::Error>().is_some_and(|io| {
                use std::io::ErrorKind::{InvalidData, InvalidInput};
                matches!(io.kind(), InvalidData | InvalidInput)
            })
        });
    match framing {
        true => ProxyFailure::UpstreamFraming,
        false => ProxyFailure::UpstreamReset,
    }
}

/// One copy, sent and read on the shadow thread.
async fn copy(sh: Arc<Shadower>, k: usize, path: String, body: Bytes, mut guard: CopyGuard) {
    let sent = Instant::now();
    let mut ex = Box::new(Exchange::new(sent, "POST".into(), String::new()));
    let body = sh.body(body);
    let r = sh.exchange(k, &path, body, &mut ex, &guard.join).await;
    ex.error = r.err();
    ex.end = Some(sent.elapsed());
    let failed = ex.error.is_some() || ex.status >= 400;
    if let (true, Some(c)) = (failed, sh.counters(k)) {
        c.failed.fetch_add(1, Relaxed);
    }
    guard.finish(Copy::Done(ex));
}

/// What became of one copy.
#[derive(Debug)]
pub(crate) enum Copy {
    Skipped(Skip),
    /// Sent and read (or cut): the copy's own exchange, `arrival` its send instant.
    Done(Box<Exchange>),
}

/// Ends a copy exactly once: by [`CopyGuard::finish`], or cut when its task is dropped (the
/// shadow runtime shut down past the drain deadline).
struct CopyGuard {
    join: Arc<Join>,
    k: usize,
    done: bool,
}

impl CopyGuard {
    fn finish(&mut self, c: Copy) {
        self.done = true;
        self.join
            .shadower
            .counters
            .shadow_in_flight
            .fetch_sub(1, Relaxed);
        self.join.done(self.k, c);
    }
}

impl Drop for CopyGuard {
    fn drop(&mut self) {
        if !self.done {
            let mut ex = Box::new(Exchange::new(Instant::now(), "POST".into(), String::new()));
            ex.error = Some(ProxyFailure::DrainDeadline);
            self.finish(Copy::Done(ex));
        }
    }
}

/// The copies of one request and its primary exchange, met whichever ends last.
pub(crate) struct Join {
    shadower: Arc<Shadower>,
    /// When the request was whole and its copies offered.
    offered: Instant,
    st: Mutex<JoinState>,
}

impl std::fmt::Debug for Join {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Join")
    }
}

struct JoinState {
    copies: Vec<Option<Copy>>,
    left: usize,
    primary: Option<(Box<Exchange>, Recorder)>,
    /// Budget bytes this request holds, given back when its record is handed over.
    bytes: u64,
    /// The record went out without the copies still running (the byte budget).
    handed_over: bool,
}

impl Join {
    fn new(shadower: Arc<Shadower>, n: usize) -> Join {
        Join {
            shadower,
            offered: Instant::now(),
            st: Mutex::new(JoinState {
                copies: (0..n).map(|_| None).collect(),
                left: n,
                primary: None,
                bytes: 0,
                handed_over: false,
            }),
        }
    }

    /// Counts `n` budget bytes as this request's; false (the bytes given back) once its record
    /// went out without this copy.
    fn add_bytes(&self, n: u64) -> bool {
        let mut st = lock(&self.st);
        if st.handed_over {
            drop(st);
            self.shadower.give_bytes(n);
            return false;
        }
        st.bytes += n;
        true
    }

    /// Copy `k` ended.
    fn done(&self, k: usize, c: Copy) {
        let mut st = lock(&self.st);
        if st.handed_over {
            return;
        }
        if let Some(slot) = st.copies.get_mut(k) {
            *slot = Some(c);
        }
        st.left = st.left.saturating_sub(1);
        if st.left == 0 {
            if let Some((ex, rec)) = st.primary.take() {
                self.hand_over(&mut st, ex, &rec);
            }
        }
    }

    /// Puts the copies into the primary's exchange and queues it for the writer.
    fn hand_over(&self, st: &mut JoinState, mut ex: Box<Exchange>, rec: &Recorder) {
        let copies = std::mem::take(&mut st.copies);
        ex.shadows = copies
            .into_iter()
            .enumerate()
            .map(|(k, c)| (k as u8, c.unwrap_or(Copy::Skipped(Skip::Budget))))
            .collect();
        ex.shadows_offered = Some(self.offered);
        st.handed_over = true;
        self.shadower.give_bytes(std::mem::take(&mut st.bytes));
        rec.submit(ex);
    }
}

/// The handle a mirrored request's capture carries to its end ([`Ticket::park`]).
#[derive(Debug)]
pub(crate) struct Ticket(Arc<Join>);

impl Ticket {
    /// The primary exchange ended: queued now if its copies have all ended, else when the last
    /// does. A primary that would take the byte budget past its bound is queued now, its copies
    /// still running given up (`budget`).
    pub(crate) fn park(self, ex: Box<Exchange>, rec: &Recorder) {
        let j = &self.0;
        let mut st = lock(&j.st);
        if st.left == 0 {
            j.hand_over(&mut st, ex, rec);
            return;
        }
        let held = ex.captured_bytes();
        if j.shadower.take_bytes(held) {
            st.bytes += held;
            st.primary = Some((ex, rec.clone()));
            return;
        }
        for (k, c) in st.copies.iter().enumerate() {
            if c.is_none() {
                j.shadower.skip(k, Skip::Budget);
            }
        }
        j.hand_over(&mut st, ex, rec);
    }
}

/// Marks the request body of `pending` complete and offers it to the shadows.
pub(crate) fn request_done(
    shadow: Option<&Arc<Shadower>>,
    pending: &mut super::tap::Pending,
    cap: &Mutex<Captured>,
) {
    let mut c = lock(cap);
    match (shadow, pending.exchange()) {
        (Some(_), Some(ex)) => body_complete(shadow, &ex.method, &ex.path, &mut c),
        _ => c.complete = true,
    }
}

/// Marks a request body complete and offers it to the shadows.
pub(crate) fn body_complete(
    shadow: Option<&Arc<Shadower>>,
    method: &str,
    path: &str,
    cap: &mut Captured,
) {
    cap.complete = true;
    if let Some(sh) = shadow {
        cap.ticket = sh.offer(method, path, cap);
    }
}
