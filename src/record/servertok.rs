//! Estimated input lengths counted by the upstream itself (docs/record.md, "Input lengths"): a
//! text prompt or a chat whose length no `usage` gave (and no `--tokenizer` counts) is sent to
//! the upstream's own `POST /tokenize`, and the record takes the server's count and, when the
//! answer lists them, its token ids for the block hashes (labelled `InputCount::Server`).
//!
//! Owned by the writer thread; the requests go out from [`IN_FLIGHT`] worker threads (nice 10),
//! never from the forwarding path. A record waits here at most [`MAX_WAIT`] for a free slot and
//! [`ANSWER_TIMEOUT`] for its answer, then is written with its estimate (labelled
//! `InputCount::Estimated`); so is every record the bounds turn away. Bounds: at most `rate`
//! requests per second (a bucket of one second's worth), [`IN_FLIGHT`] in flight.
//!
//! Shapes: vLLM (and `retrace mock`) `{"model","prompt"}` or `{"model","messages",...}` →
//! `{"count","tokens","max_model_len"}`; llama.cpp `{"content","add_special"}` →
//! `{"tokens"}` (text prompts only: its `/tokenize` does not apply a chat template). The first
//! request finds which shape the upstream serves; an upstream that serves neither (404, 405, 501)
//! or whose first answer is unusable is asked again after [`RETRY_OFF`], its records estimated
//! meanwhile. The requests carry no client credentials (vLLM serves `/tokenize` outside its
//! `--api-key` check), the proxy's `Via` entry (a loop is refused as 508) and `Connection: close`.

use super::counters::ProxyCounters;
use crate::trace::hash::BlockHasher;
use crate::trace::rows::MAX_TOKENS;
use crate::trace::{Endpoint, InputCount, Request};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Requests in flight at most (one worker thread each).
pub(crate) const IN_FLIGHT: usize = 4;
/// A record waits at most this long for a free slot.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(1);
/// Connect, send and answer, at most this long.
pub(crate) const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);
/// After an upstream that does not serve `/tokenize`, ask again after this long.
pub(crate) const RETRY_OFF: Duration = Duration::from_secs(60);
/// A larger answer is refused unread (about 2 M token ids).
pub(crate) const MAX_ANSWER_BYTES: usize = 16 << 20;
/// Prompt bytes the waiting records may hold.
const MAX_WAITING_BYTES: usize = 64 << 20;

/// The chat request's fields vLLM's tokenize-chat request also reads (the template's inputs).
const CHAT_FIELDS: [&str; 8] = [
    "messages",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "chat_template",
    "chat_template_kwargs",
    "mm_processor_kwargs",
    "tools",
];

/// What to ask the server: the recorded prompt, as the request gave it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Ask {
    /// A completion's text prompt (`add_special_tokens` when the request set it).
    Text {
        model: Option<String>,
        text: String,
        add_special: Option<bool>,
    },
    /// A chat: the model and the fields of [`CHAT_FIELDS`] the request had.
    Chat(Map<String, Value>),
}

impl Ask {
    /// The question for a recorded request body, when it is one the server can count: a
    /// completion with one text prompt, or a chat with a list of messages.
    pub(crate) fn of(endpoint: &Endpoint, body: &[u8]) -> Option<Ask> {
        let v: Value = serde_json::from_slice(body).ok()?;
        let model = v.get("model").and_then(Value::as_str).map(str::to_string);
        match endpoint {
            Endpoint::Completions => Some(Ask::Text {
                model,
                text: v.get("prompt")?.as_str()?.to_string(),
                add_special: v.get("add_special_tokens").and_then(Value::as_bool),
            }),
            Endpoint::Chat => {
                v.get("messages")?.as_array()?;
                let mut m = Map::new();
                if let Some(model) = model {
                    m.insert("model".into(), Value::String(model));
                }
                for k in CHAT_FIELDS {
                    if let Some(x) = v.get(k).filter(|x| !x.is_null()) {
                        m.insert(k.into(), x.clone());
                    }
                }
                Some(Ask::Chat(m))
            }
            _ => None,
        }
    }

    /// Bytes it holds (about).
    fn size(&self) -> usize {
        match self {
            Ask::Text { text, .. } => text.len() + 64,
            Ask::Chat(m) => m.get("messages").map_or(0, |x| x.to_string().len()) + 64,
        }
    }

    fn vllm_body(&self) -> Vec<u8> {
        let v = match self {
            Ask::Text {
                model,
                text,
                add_special,
            } => {
                let mut m = Map::new();
                if let Some(model) = model {
                    m.insert("model".into(), Value::String(model.clone()));
                }
                m.insert("prompt".into(), Value::String(text.clone()));
                if let Some(a) = add_special {
                    m.insert("add_special_tokens".into(), Value::Bool(*a));
                }
                Value::Object(m)
            }
            Ask::Chat(m) => Value::Object(m.clone()),
        };
        v.to_string().into_bytes()
    }

    /// llama.cpp's shape: text prompts only.
    fn llamacpp_body(&self) -> Option<Vec<u8>> {
        match self {
            Ask::Text {
                text, add_special, ..
            } => {
                let v = serde_json::json!({"content": text, "add_special": add_special.unwrap_or(true)});
                Some(v.to_string().into_bytes())
            }
            Ask::Chat(_) => None,
        }
    }

    fn is_empty_text(&self) -> bool {
        matches!(self, Ask::Text { text, .. } if text.is_empty())
    }
}

/// A server's count of a prompt.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Answer {
    pub(crate) count: u64,
    /// The token ids, when the answer listed them (then `count` is their number).
    pub(crate) tokens: Option<Vec<u32>>,
}

/// Token ids, refused past [`MAX_TOKENS`] before more is allocated.
struct Ids(Vec<u32>);

impl<'de> Deserialize<'de> for Ids {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Ids;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of token ids")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut s: A) -> Result<Ids, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = s.next_element::<u32>()? {
                    if v.len() as u64 >= MAX_TOKENS {
                        return Err(serde::de::Error::custom(format!(
                            "more than {MAX_TOKENS} token ids"
                        )));
                    }
                    v.push(x);
                }
                Ok(Ids(v))
            }
        }
        d.deserialize_seq(V)
    }
}

#[derive(Deserialize)]
struct Wire {
    count: Option<u64>,
    tokens: Option<Ids>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dialect {
    Vllm,
    LlamaCpp,
}

/// Reads an answer body: vLLM's needs `count` (and `tokens`, when present, of that length);
/// llama.cpp's `tokens`. Counts over [`MAX_TOKENS`], and an empty count for a non-empty
/// prompt, are refused.
fn parse_answer(body: &[u8], d: Dialect, empty_prompt: bool) -> Result<Answer, String> {
    let w: Wire = serde_json::from_slice(body).map_err(|e| format!("answer not read: {e}"))?;
    let tokens = w.tokens.map(|t| t.0);
    let count = match (d, w.count, &tokens) {
        (Dialect::Vllm, Some(c), _) => c,
        (Dialect::Vllm, None, _) => return Err("no `count` in the answer".into()),
        (Dialect::LlamaCpp, _, Some(t)) => t.len() as u64,
        (Dialect::LlamaCpp, _, None) => return Err("no `tokens` in the answer".into()),
    };
    if count > MAX_TOKENS {
        return Err(format!("count {count} is over the limit of {MAX_TOKENS}"));
    }
    if count == 0 && !empty_prompt {
        return Err("a count of 0 for a non-empty prompt".into());
    }
    if let Some(t) = &tokens {
        if t.len() as u64 != count {
            return Err(format!("count {count} but {} token ids", t.len()));
        }
    }
    Ok(Answer { count, tokens })
}

/// Where `/tokenize` is, and how to reach it.
#[derive(Clone)]
pub(crate) struct TokenizeTarget {
    host: String,
    port: u16,
    /// The upstream's base path + `/tokenize`.
    path: String,
    /// The `Host` field (the upstream's authority).
    authority: String,
    tls: Option<Arc<rustls::ClientConfig>>,
    connect_timeout: Duration,
    via: String,
}

impl TokenizeTarget {
    /// The target for the upstream base URL `upstream` (TLS trusting `ca` or the system
    /// bundle); `via` is the proxy's own `Via` entry.
    pub(crate) fn new(
        upstream: &http::Uri,
        ca: Option<&std::path::Path>,
        connect_timeout: Duration,
        via: &str,
    ) -> anyhow::Result<TokenizeTarget> {
        let https = upstream.scheme_str() == Some("https");
        let host = upstream.host().unwrap_or("").to_string();
        let tls = https
            .then(|| crate::sys::tls::client_config(ca, "--upstream-ca", &[b"http/1.1"]))
            .transpose()?;
        Ok(TokenizeTarget {
            port: upstream.port_u16().unwrap_or(if https { 443 } else { 80 }),
            path: format!("{}/tokenize", upstream.path().trim_end_matches('/')),
            authority: upstream.authority().map_or(host.clone(), |a| a.to_string()),
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            tls,
            connect_timeout,
            via: via.to_string(),
        })
    }

    /// One `POST /tokenize` → (status, body), within [`ANSWER_TIMEOUT`].
    fn post(&self, body: &[u8]) -> Result<(u16, Vec<u8>), String> {
        use std::net::ToSocketAddrs;
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        let addrs = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| format!("resolving {}: {e}", self.host))?;
        let mut last = String::from("no address");
        let mut tcp = None;
        for a in addrs {
            match std::net::TcpStream::connect_timeout(&a, self.connect_timeout.min(ANSWER_TIMEOUT))
            {
                Ok(s) => {
                    tcp = Some(s);
                    break;
                }
                Err(e) => last = format!("connecting to {a}: {e}"),
            }
        }
        let tcp = tcp.ok_or(last)?;
        let _ = tcp.set_nodelay(true);
        tcp.set_read_timeout(Some(ANSWER_TIMEOUT))
            .and_then(|()| tcp.set_write_timeout(Some(ANSWER_TIMEOUT)))
            .map_err(|e| e.to_string())?;
        let head = format!(
            "POST {} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nvia: {}\r\nuser-agent: retrace/{}\r\nconnection: close\r\n\r\n",
            self.path,
            self.authority,
            body.len(),
            self.via,
            env!("CARGO_PKG_VERSION")
        );
        match &self.tls {
            None => exchange(tcp, head.as_bytes(), body, deadline),
            Some(cfg) => {
                let name = rustls::pki_types::ServerName::try_from(self.host.clone())
                    .map_err(|e| format!("upstream host {:?}: {e}", self.host))?;
                let conn = rustls::ClientConnection::new(cfg.clone(), name)
                    .map_err(|e| format!("TLS: {e}"))?;
                exchange(
                    rustls::StreamOwned::new(conn, tcp),
                    head.as_bytes(),
                    body,
                    deadline,
                )
            }
        }
    }
}

/// Writes the request and reads the whole answer (its `Content-Length`, chunks, or up to the
/// close), refusing one over [`MAX_ANSWER_BYTES`].
fn exchange<S: Read + Write>(
    mut s: S,
    head: &[u8],
    body: &[u8],
    deadline: Instant,
) -> Result<(u16, Vec<u8>), String> {
    s.write_all(head)
        .and_then(|()| s.write_all(body))
        .and_then(|()| s.flush())
        .map_err(|e| format!("sending: {e}"))?;
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 16 << 10];
    // (status, head length, content length, chunked)
    let mut parsed: Option<(u16, usize, Option<usize>, bool)> = None;
    loop {
        if let Some((_, hl, Some(n), false)) = parsed {
            if buf.len() >= hl + n {
                break;
            }
        }
        if Instant::now() >= deadline {
            return Err("no whole answer in time".into());
        }
        let n = match s.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => 0,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("reading the answer: {e}")),
        };
        if n == 0 {
            break;
        }
        if buf.len() + n > MAX_ANSWER_BYTES + (64 << 10) {
            return Err(format!("answer over {MAX_ANSWER_BYTES} bytes"));
        }
        buf.extend_from_slice(&chunk[..n]);
        if parsed.is_none() {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut r = httparse::Response::new(&mut headers);
            match r.parse(&buf) {
                Ok(httparse::Status::Complete(hl)) => {
                    let status = r.code.unwrap_or(0);
                    let mut len = None;
                    let mut chunked = false;
                    for h in r.headers.iter() {
                        if h.name.eq_ignore_ascii_case("content-length") {
                            let v = std::str::from_utf8(h.value).unwrap_or("").trim();
                            len = Some(v.parse::<usize>().map_err(|_| "bad content-length")?);
                        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                            chunked = String::from_utf8_lossy(h.value)
                                .to_ascii_lowercase()
                                .contains("chunked");
                        }
                    }
                    if len.is_some_and(|n| n > MAX_ANSWER_BYTES) {
                        return Err(format!("answer over {MAX_ANSWER_BYTES} bytes"));
                    }
                    parsed = Some((status, hl, len, chunked));
                }
                Ok(httparse::Status::Partial) if buf.len() <= 64 << 10 => {}
                Ok(httparse::Status::Partial) => return Err("answer head over 64 KiB".into()),
                Err(e) => return Err(format!("answer head: {e}")),
            }
        }
    }
    let (status, hl, len, chunked) = parsed.ok_or("closed before an answer")?;
    let raw = &buf[hl..];
    let body = if chunked {
        let mut d = crate::wire::h1::ChunkedDecoder::new();
        let mut out = Vec::with_capacity(raw.len());
        d.feed(raw, |a, b| out.extend_from_slice(&raw[a..b]))
            .map_err(|e| format!("answer framing: {e}"))?;
        if !d.is_done() {
            return Err("answer cut short".into());
        }
        out
    } else if let Some(n) = len {
        raw.get(..n).ok_or("answer cut short")?.to_vec()
    } else {
        raw.to_vec()
    };
    Ok((status, body))
}

enum Outcome {
    Counted(Answer, Dialect),
    /// The upstream has no `/tokenize` for this shape.
    NotServed(String),
    Failed(String),
}

fn not_served(status: u16) -> bool {
    matches!(status, 404 | 405 | 501)
}

/// Asks the server, in the shape it is known to serve, else finding it (vLLM's first).
fn ask_server(t: &TokenizeTarget, ask: &Ask, known: Option<Dialect>) -> Outcome {
    let empty = ask.is_empty_text();
    if known != Some(Dialect::LlamaCpp) {
        match t.post(&ask.vllm_body()) {
            Ok((200, b)) => match parse_answer(&b, Dialect::Vllm, empty) {
                Ok(a) => return Outcome::Counted(a, Dialect::Vllm),
                // llama.cpp answers a body without `content` with `tokens` alone.
                Err(e) if known.is_some() || parse_answer(&b, Dialect::LlamaCpp, true).is_err() => {
                    return Outcome::Failed(e)
                }
                Err(_) => {}
            },
            Ok((st, _)) if not_served(st) && known.is_none() => {}
            Ok((st, _)) if not_served(st) => {
                return Outcome::NotServed(format!("POST /tokenize: HTTP {st}"))
            }
            Ok((st, _)) => return Outcome::Failed(format!("POST /tokenize: HTTP {st}")),
            Err(e) => return Outcome::Failed(e),
        }
    }
    let Some(body) = ask.llamacpp_body() else {
        return Outcome::NotServed("POST /tokenize does not count a chat in this shape".into());
    };
    match t.post(&body) {
        Ok((200, b)) => match parse_answer(&b, Dialect::LlamaCpp, empty) {
            Ok(a) => Outcome::Counted(a, Dialect::LlamaCpp),
            Err(e) => Outcome::Failed(e),
        },
        Ok((st, _)) if not_served(st) => Outcome::NotServed(format!("POST /tokenize: HTTP {st}")),
        Ok((st, _)) => Outcome::Failed(format!("POST /tokenize: HTTP {st}")),
        Err(e) => Outcome::Failed(e),
    }
}

struct Job {
    id: u64,
    ask: Ask,
    dialect: Option<Dialect>,
}

struct Done {
    id: u64,
    outcome: Outcome,
}

/// The writer thread's side: records held while the server counts them.
pub struct ServerTokenizer {
    target: TokenizeTarget,
    rate: u32,
    stats: Arc<ProxyCounters>,
    dialect: Option<Dialect>,
    off_until: Option<Instant>,
    /// Tokens of the rate bucket, and when it was last filled.
    bucket: f64,
    filled: Instant,
    waiting: VecDeque<(u64, Instant, Ask)>,
    waiting_bytes: usize,
    held: HashMap<u64, Request>,
    next_id: u64,
    in_flight: usize,
    jobs: Option<SyncSender<Job>>,
    done_tx: Sender<Done>,
    done_rx: Receiver<Done>,
}

impl ServerTokenizer {
    /// At most `rate` requests a second (and [`IN_FLIGHT`] at a time) to `target`.
    pub(crate) fn new(target: TokenizeTarget, rate: u32, stats: Arc<ProxyCounters>) -> Self {
        let (done_tx, done_rx) = channel();
        ServerTokenizer {
            target,
            rate: rate.max(1),
            stats,
            dialect: None,
            off_until: None,
            bucket: f64::from(rate.max(1)),
            filled: Instant::now(),
            waiting: VecDeque::new(),
            waiting_bytes: 0,
            held: HashMap::new(),
            next_id: 0,
            in_flight: 0,
            jobs: None,
            done_tx,
            done_rx,
        }
    }

    /// A record given back with its estimate (counted as not asked).
    pub(crate) fn skip(&self, req: Request, out: &mut Vec<Request>) {
        self.stats.upstream_tokenize_skipped.fetch_add(1, Relaxed);
        out.push(req);
    }

    /// Takes a record whose input length is an estimate, to be counted by the server; or, when
    /// the server is not asked now (off, over the bounds), puts it in `out` as it is.
    pub(crate) fn offer(&mut self, req: Request, ask: Ask, out: &mut Vec<Request>) {
        let now = Instant::now();
        let off = self.off_until.is_some_and(|t| now < t);
        let unservable = self.dialect == Some(Dialect::LlamaCpp) && matches!(ask, Ask::Chat(_));
        let size = ask.size();
        if off || unservable || self.waiting_bytes + size > MAX_WAITING_BYTES {
            return self.skip(req, out);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.held.insert(id, req);
        self.waiting.push_back((id, now, ask));
        self.waiting_bytes += size;
        self.dispatch(out);
    }

    fn release_waiting(&mut self, out: &mut Vec<Request>) {
        while let Some((id, _, _)) = self.waiting.pop_front() {
            if let Some(r) = self.held.remove(&id) {
                self.skip(r, out);
            }
        }
        self.waiting_bytes = 0;
    }

    /// Sends what the bounds allow; records that waited past [`MAX_WAIT`] go out estimated.
    fn dispatch(&mut self, out: &mut Vec<Request>) {
        let now = Instant::now();
        let rate = f64::from(self.rate);
        self.bucket =
            (self.bucket + now.duration_since(self.filled).as_secs_f64() * rate).min(rate);
        self.filled = now;
        while let Some((_, since, _)) = self.waiting.front() {
            if now.duration_since(*since) <= MAX_WAIT {
                break;
            }
            let (id, _, ask) = self.waiting.pop_front().expect("a front");
            self.waiting_bytes -= ask.size();
            if let Some(r) = self.held.remove(&id) {
                self.skip(r, out);
            }
        }
        // Until the shape is known, one request at a time finds it.
        let slots = if self.dialect.is_some() { IN_FLIGHT } else { 1 };
        while self.in_flight < slots && self.bucket >= 1.0 && !self.waiting.is_empty() {
            let (id, _, ask) = self.waiting.pop_front().expect("not empty");
            self.waiting_bytes -= ask.size();
            let job = Job {
                id,
                ask,
                dialect: self.dialect,
            };
            if self.jobs().try_send(job).is_err() {
                if let Some(r) = self.held.remove(&id) {
                    self.skip(r, out);
                }
                continue;
            }
            self.bucket -= 1.0;
            self.in_flight += 1;
        }
    }

    /// The job queue, its workers started on first use.
    fn jobs(&mut self) -> &SyncSender<Job> {
        self.jobs.get_or_insert_with(|| {
            let (tx, rx) = sync_channel::<Job>(IN_FLIGHT);
            let rx = Arc::new(Mutex::new(rx));
            for k in 0..IN_FLIGHT {
                let (t, rx, done) = (self.target.clone(), rx.clone(), self.done_tx.clone());
                let spawned = std::thread::Builder::new()
                    .name(format!("retrace-record-tokenize-{k}"))
                    .spawn(move || worker(&t, &rx, &done));
                if let Err(e) = spawned {
                    tracing::warn!("starting a /tokenize worker: {e}");
                }
            }
            tx
        })
    }

    /// Takes the answers that came: counted records (hashed with `hasher` in blocks of
    /// `block_size`) and the failed ones go to `out`; then sends what the bounds allow.
    pub(crate) fn poll(&mut self, hasher: &BlockHasher, block_size: u32, out: &mut Vec<Request>) {
        while let Ok(done) = self.done_rx.try_recv() {
            self.in_flight = self.in_flight.saturating_sub(1);
            let Some(mut req) = self.held.remove(&done.id) else {
                continue;
            };
            match done.outcome {
                Outcome::Counted(a, d) => {
                    if self.dialect != Some(d) {
                        tracing::info!(
                            "estimated input lengths are counted by the upstream's POST /tokenize ({})",
                            if d == Dialect::Vllm { "vLLM's shape" } else { "llama.cpp's shape" }
                        );
                    }
                    self.dialect = Some(d);
                    self.stats.upstream_tokenize_ok.fetch_add(1, Relaxed);
                    apply(&mut req, a, hasher, block_size);
                }
                Outcome::NotServed(e) => {
                    self.stats.upstream_tokenize_failed.fetch_add(1, Relaxed);
                    self.turn_off(&e, out);
                }
                Outcome::Failed(e) => {
                    self.stats.upstream_tokenize_failed.fetch_add(1, Relaxed);
                    if self.dialect.is_none() {
                        self.turn_off(&e, out);
                    } else {
                        tracing::debug!("an input length stays estimated: {e}");
                    }
                }
            }
            out.push(req);
        }
        self.dispatch(out);
    }

    fn turn_off(&mut self, why: &str, out: &mut Vec<Request>) {
        tracing::warn!(
            "the upstream's /tokenize cannot count input lengths ({why}): estimated lengths stay estimates; asking again in {} s",
            RETRY_OFF.as_secs()
        );
        self.dialect = None;
        self.off_until = Some(Instant::now() + RETRY_OFF);
        self.release_waiting(out);
    }

    /// Records are held (waiting, or asked).
    pub(crate) fn holds(&self) -> bool {
        !self.held.is_empty()
    }

    /// Every record still held goes to `out` with its estimate (the recording ends).
    pub(crate) fn finish(&mut self, out: &mut Vec<Request>) {
        self.waiting.clear();
        self.waiting_bytes = 0;
        for (_, r) in self.held.drain() {
            self.stats.upstream_tokenize_skipped.fetch_add(1, Relaxed);
            out.push(r);
        }
        self.jobs = None;
    }
}

/// The record takes the server's count, and its token ids' block hashes when the answer had
/// them (else its estimated hashes fitted to the count).
fn apply(req: &mut Request, a: Answer, hasher: &BlockHasher, block_size: u32) {
    let bs = block_size.max(1) as usize;
    req.input_tokens = a.count;
    req.input_count = InputCount::Server;
    match a.tokens {
        Some(t) => req.hash_ids = hasher.chain(&t, bs, true),
        None => super::extract::fit(
            hasher,
            &mut req.hash_ids,
            a.count.div_ceil(bs as u64) as usize,
        ),
    }
}

fn worker(t: &TokenizeTarget, jobs: &Mutex<Receiver<Job>>, done: &Sender<Done>) {
    crate::sys::thread_timing::lower_priority();
    loop {
        let job = jobs.lock().unwrap_or_else(|p| p.into_inner()).recv();
        let Ok(job) = job else { return };
        let outcome = ask_server(t, &job.ask, job.dialect);
        if done
            .send(Done {
                id: job.id,
                outcome,
            })
            .is_err()
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asks_are_the_recorded_prompt() {
        let a = Ask::of(
            &Endpoint::Completions,
            br#"{"model":"m","prompt":"hello","max_tokens":3}"#,
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(a.vllm_body()).unwrap(),
            r#"{"model":"m","prompt":"hello"}"#
        );
        assert_eq!(
            String::from_utf8(a.llamacpp_body().unwrap()).unwrap(),
            r#"{"add_special":true,"content":"hello"}"#
        );
        let c = Ask::of(
            &Endpoint::Chat,
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"tools":null,"add_generation_prompt":false}"#,
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(c.vllm_body()).unwrap(),
            r#"{"add_generation_prompt":false,"messages":[{"content":"hi","role":"user"}],"model":"m"}"#
        );
        assert!(c.llamacpp_body().is_none());
        // a batch, token ids, other endpoints: nothing to ask
        for (e, b) in [
            (Endpoint::Completions, &br#"{"prompt":["a","b"]}"#[..]),
            (Endpoint::Completions, br#"{"prompt":[1,2]}"#),
            (Endpoint::Chat, br#"{"messages":"x"}"#),
            (Endpoint::Embeddings, br#"{"input":"x"}"#),
            (Endpoint::Completions, b"not json"),
        ] {
            assert_eq!(Ask::of(&e, b), None);
        }
    }

    #[test]
    fn answers_are_bounded_and_checked() {
        let real = include_bytes!("../../fixtures/vllm/tokenize.json");
        let a = parse_answer(real, Dialect::Vllm, false);
        if let Ok(a) = &a {
            assert_eq!(a.count as usize, a.tokens.as_ref().unwrap().len());
        }
        assert!(a.is_ok(), "{a:?}");
        let ok = parse_answer(br#"{"count":3,"max_model_len":9}"#, Dialect::Vllm, false);
        assert_eq!(
            ok.unwrap(),
            Answer {
                count: 3,
                tokens: None
            }
        );
        let l = parse_answer(br#"{"tokens":[5,6]}"#, Dialect::LlamaCpp, false).unwrap();
        assert_eq!(l.count, 2);
        for bad in [
            &br#"{"count":10000001}"#[..],
            br#"{"count":1e300}"#,
            br#"{"count":-1}"#,
            br#"{"count":2,"tokens":[1]}"#,
            br#"{"count":0}"#,
            br#"{"tokens":[1,2]}"#,
            br#"{"count":2,"tokens":[1,-2]}"#,
            b"<html>",
            b"",
        ] {
            let r = parse_answer(bad, Dialect::Vllm, false);
            assert!(r.is_err(), "{}: {r:?}", String::from_utf8_lossy(bad));
        }
        assert!(parse_answer(br#"{"tokens":[]}"#, Dialect::LlamaCpp, false).is_err());
    }
}
