//! The simulated engine's scheduler: a pure function of its state and the time it is asked
//! about. It never reads a clock, sleeps, touches a socket or a counter; [`super::engine`] asks
//! it what falls due ([`Scheduler::next_due`]), runs it ([`Scheduler::run_next`]) and hands the
//! [`EngineEvent`]s it produces to the responses. Cost-model mode (continuous batching, chunked
//! prefill, the step-time formula) and fixed mode are described in docs/mock.md, "Engine model".

use super::cache::{Alloc, IdMap, PrefixCache};
use crate::trace::hash::BlockHasher;
use rand::SeedableRng;
use rand_distr::Distribution;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::{Duration, Instant};

/// The step-time cost model, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Front-end latency of every request before the engine queues it (HTTP, tokenization,
    /// hand-off to the engine): adds to the client's TTFT, not to the engine's queue time or
    /// per-request `metrics`, and uses no engine capacity. Cost-model mode only.
    pub request_overhead_ms: f64,
    pub step_overhead_ms: f64,
    pub prefill_token_ms: f64,
    pub seq_ms: f64,
    pub context_token_ms: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        Profile::DEFAULT.cost
    }
}

impl CostModel {
    pub fn step_ms(&self, prefill_tokens: u64, seqs: u64, context_tokens: u64) -> f64 {
        self.step_overhead_ms
            + self.prefill_token_ms * prefill_tokens as f64
            + self.seq_ms * seqs as f64
            + self.context_token_ms * context_tokens as f64
    }
}

/// A named engine model: the cost model and the step token budget (`retrace mock --profile`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Profile {
    pub(crate) name: &'static str,
    pub cost: CostModel,
    pub(crate) max_num_batched_tokens: u32,
}

/// `--profile` names no known profile.
#[derive(Debug, thiserror::Error)]
#[error("--profile: unknown profile `{name}` (known: {known})")]
pub(crate) struct UnknownProfile {
    name: String,
    known: String,
}

impl Profile {
    /// The calibrated default (Llama-3.1-8B-like; docs/mock.md has what it gives).
    pub const LLAMA8B: Profile = Profile {
        name: "llama8b",
        cost: CostModel {
            request_overhead_ms: 56.4,
            step_overhead_ms: 7.9,
            prefill_token_ms: 0.04,
            seq_ms: 0.12,
            context_token_ms: 0.00005,
        },
        max_num_batched_tokens: 2048,
    };
    /// A fast multi-accelerator node for Mooncake-size prompts; `retrace replay`'s embedded target.
    pub const FAST: Profile = Profile {
        name: "fast",
        cost: CostModel {
            request_overhead_ms: 0.0,
            step_overhead_ms: 5.0,
            prefill_token_ms: 0.005,
            seq_ms: 0.05,
            context_token_ms: 0.00004,
        },
        max_num_batched_tokens: 8192,
    };
    pub(crate) const ALL: [Profile; 2] = [Profile::LLAMA8B, Profile::FAST];
    /// The profile of `retrace mock` without `--profile`.
    pub(crate) const DEFAULT: Profile = Profile::LLAMA8B;

    /// The profile called `name`; the error lists the known ones.
    pub(crate) fn by_name(name: &str) -> Result<Profile, UnknownProfile> {
        Profile::ALL
            .into_iter()
            .find(|p| p.name == name)
            .ok_or_else(|| UnknownProfile {
                name: name.to_string(),
                known: Profile::ALL.map(|p| p.name).join(", "),
            })
    }
}

/// Scheduler knobs (derived from `MockConfig`).
#[derive(Debug, Clone)]
pub(crate) struct SchedConfig {
    pub(crate) fixed: Option<(Duration, Duration)>,
    pub(crate) cost: CostModel,
    pub(crate) max_num_seqs: usize,
    pub(crate) max_num_batched_tokens: u32,
    pub(crate) block_size: u32,
    pub(crate) kv_blocks: usize,
    pub(crate) tokens_per_event: u32,
    pub(crate) seed: u64,
    pub(crate) eos_prob: f64,
    pub(crate) vocab: u32,
}

impl SchedConfig {
    /// The front end's latency before a request reaches the engine (cost-model mode only).
    pub(crate) fn front_end(&self) -> Duration {
        match self.fixed {
            Some(_) => Duration::ZERO,
            None => Duration::from_secs_f64(self.cost.request_overhead_ms.max(0.0) / 1e3),
        }
    }
}

/// Why a choice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    Stop,
    Length,
}

impl Finish {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// One prompt to complete (a choice).
#[derive(Debug, Clone)]
pub(crate) struct SeqIn {
    pub(crate) prompt: Vec<u32>,
    /// Already clamped to the context length; at least 1.
    pub(crate) max_tokens: u32,
    pub(crate) min_tokens: u32,
    pub(crate) ignore_eos: bool,
    /// A stop string ends the output after this many tokens (`finish_reason: "stop"`), when
    /// that comes before its own end (the API finds it: `super::shape`).
    pub(crate) stop_after: Option<u32>,
}

/// What the scheduler decided, in time order.
#[derive(Debug, PartialEq)]
pub(crate) enum EngineEvent {
    /// A sequence of `req` got its KV blocks at `at`: `hit_tokens` of its prompt came from the
    /// prefix cache.
    Admitted {
        req: u64,
        at: Instant,
        prompt_tokens: u32,
        hit_tokens: u32,
    },
    /// Tokens of one choice, due at `at`; `finish` on its last ones.
    Tokens {
        req: u64,
        choice: u32,
        ids: Vec<u32>,
        finish: Option<Finish>,
        at: Instant,
    },
    /// The request cannot fit in the KV cache even when it is empty; it is not served.
    Rejected { req: u64 },
}

struct Seq {
    req: u64,
    choice: u32,
    prompt_len: u32,
    hashes: Vec<u64>,
    /// Prompt tokens whose KV exists (cache hits + prefilled).
    computed: u32,
    registered: usize,
    target: u32,
    finish: Finish,
    generated: u32,
    out_seed: u64,
    alloc: Alloc,
    arrival: Instant,
}

struct Step {
    end: Instant,
    prefill: Vec<(u64, u32)>,
    decode: Vec<u64>,
}

/// The scheduler's state (see the module doc).
pub(crate) struct Scheduler {
    cfg: SchedConfig,
    cache: PrefixCache,
    hasher: BlockHasher,
    seqs: IdMap<Seq>,
    next_seq: u64,
    waiting: VecDeque<u64>,
    running: Vec<u64>,
    step: Option<Step>,
    last_step_end: Option<Instant>,
    /// Fixed mode: (due, sequence) of every sequence's next event.
    fixed_next: BinaryHeap<Reverse<(Instant, u64)>>,
}

impl Scheduler {
    pub(crate) fn new(cfg: SchedConfig) -> Scheduler {
        Scheduler {
            cache: PrefixCache::new(cfg.kv_blocks, cfg.block_size),
            cfg,
            hasher: BlockHasher::xxh3(),
            seqs: IdMap::default(),
            next_seq: 0,
            waiting: VecDeque::new(),
            running: Vec::new(),
            step: None,
            last_step_end: None,
            fixed_next: BinaryHeap::new(),
        }
    }

    pub(crate) fn fixed(&self) -> bool {
        self.cfg.fixed.is_some()
    }

    /// Sequences in the running batch and waiting for it (cost-model mode).
    pub(crate) fn counts(&self) -> (usize, usize) {
        (self.running.len(), self.waiting.len())
    }

    /// `POST /reset_prefix_cache` ([`PrefixCache::reset`]).
    pub(crate) fn reset_prefix_cache(&mut self) -> bool {
        self.cache.reset()
    }

    /// The KV cache's used fraction.
    pub(crate) fn kv_usage(&self) -> f64 {
        self.cache.usage()
    }

    /// Queues request `req`'s choices, arrived (at the engine) at `arrival`; returns their
    /// sequence keys. Fixed mode admits them at once.
    pub(crate) fn add(
        &mut self,
        req: u64,
        arrival: Instant,
        seqs: Vec<SeqIn>,
        out: &mut Vec<EngineEvent>,
    ) -> Vec<u64> {
        let mut keys = Vec::with_capacity(seqs.len());
        for (choice, q) in seqs.into_iter().enumerate() {
            let out_seed = out_seed(self.cfg.seed, &q.prompt, choice as u32);
            let (target, finish) = output_len(&q, out_seed, self.cfg.eos_prob);
            let key = self.next_seq;
            self.next_seq += 1;
            let hashes = self
                .hasher
                .chain(&q.prompt, self.cfg.block_size as usize, false);
            let mut s = Seq {
                req,
                choice: choice as u32,
                prompt_len: q.prompt.len() as u32,
                hashes,
                computed: 0,
                registered: 0,
                target,
                finish,
                generated: 0,
                out_seed,
                alloc: Alloc::default(),
                arrival,
            };
            if let Some((ttft, _)) = self.cfg.fixed {
                // Prefix-cache accounting now, the first event `ttft` after arrival.
                let need = self.cache.blocks_for(s.prompt_len);
                if let Some(a) = self.cache.acquire(&s.hashes, s.prompt_len, need) {
                    s.computed = a.hit_tokens;
                    s.alloc = a;
                }
                out.push(EngineEvent::Admitted {
                    req,
                    at: arrival,
                    prompt_tokens: s.prompt_len,
                    hit_tokens: s.computed,
                });
                self.fixed_next.push(Reverse((arrival + ttft, key)));
            } else {
                self.waiting.push_back(key);
            }
            self.seqs.insert(key, s);
            keys.push(key);
        }
        keys
    }

    /// Forgets a sequence (finished, or its request ended) and frees its blocks.
    pub(crate) fn remove(&mut self, key: u64) {
        if let Some(s) = self.seqs.remove(&key) {
            self.cache.release(&s.alloc.blocks);
            if let Some(p) = self.running.iter().position(|&k| k == key) {
                self.running.remove(p);
            } else if let Some(p) = self.waiting.iter().position(|&k| k == key) {
                self.waiting.remove(p);
            }
        }
    }

    /// When the next thing happens: a fixed-mode event, the current step's end, or the start of
    /// the next step.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        if self.fixed() {
            return self.fixed_next.peek().map(|Reverse((t, _))| *t);
        }
        self.step
            .as_ref()
            .map(|s| s.end)
            .or_else(|| self.next_start())
    }

    /// With no step under way: when the next one starts (the last one's end, or the arrival of
    /// the first waiting sequence on an idle engine).
    fn next_start(&self) -> Option<Instant> {
        let last = self.last_step_end;
        if !self.running.is_empty() {
            return last;
        }
        let arrival = self.waiting.front().map(|k| self.seqs[k].arrival)?;
        Some(last.map_or(arrival, |e| e.max(arrival)))
    }

    /// Runs what is due at [`Scheduler::next_due`] (the caller decides that it is due).
    pub(crate) fn run_next(&mut self, out: &mut Vec<EngineEvent>) {
        if self.fixed() {
            if let Some(Reverse((at, key))) = self.fixed_next.pop() {
                self.fixed_event(key, at, out);
            }
        } else if self.step.is_some() {
            self.finish_step(out);
        } else if let Some(start) = self.next_start() {
            self.plan_step(start, out);
        }
    }

    /// Fixed mode: one event of one sequence.
    fn fixed_event(&mut self, key: u64, at: Instant, out: &mut Vec<EngineEvent>) {
        let Some((_, itl)) = self.cfg.fixed else {
            return;
        };
        let Some(s) = self.seqs.get_mut(&key) else {
            return;
        };
        let mut n = self.cfg.tokens_per_event;
        if s.generated == 0 {
            n = 1;
            // The prompt is "computed" at the first token: register its full blocks.
            for (h, &b) in s.hashes.iter().zip(&s.alloc.blocks) {
                self.cache.register(b, *h);
            }
        }
        if emit_tokens(s, n, self.cfg.vocab, at, out) {
            self.remove(key);
        } else {
            self.fixed_next.push(Reverse((at + itl, key)));
        }
    }

    /// Cost-model mode: admits and batches the step starting at `start`.
    fn plan_step(&mut self, start: Instant, out: &mut Vec<EngineEvent>) {
        let mut b = Batch {
            budget: self.cfg.max_num_batched_tokens.max(1),
            ..Batch::default()
        };
        for &k in &self.running {
            let s = &self.seqs[&k];
            if s.computed >= s.prompt_len && b.budget > 0 {
                b.budget -= 1;
                b.decode.push(k);
                b.context += u64::from(s.prompt_len + s.generated);
            }
        }
        for &k in &self.running {
            let s = &self.seqs[&k];
            if s.computed < s.prompt_len {
                b.prefill(k, s);
            }
        }
        self.admit(start, &mut b, out);
        let seqs = (b.prefill.len() + b.decode.len()) as u64;
        self.last_step_end = Some(start);
        if seqs == 0 {
            // The head of the queue cannot fit even in an empty cache (the configuration allows
            // no such request): never wait on it.
            if let Some(k) = self.waiting.front().filter(|_| self.running.is_empty()) {
                let req = self.seqs[k].req;
                let keys: Vec<u64> = self
                    .seqs
                    .iter()
                    .filter(|(_, s)| s.req == req)
                    .map(|(k, _)| *k)
                    .collect();
                keys.into_iter().for_each(|k| self.remove(k));
                out.push(EngineEvent::Rejected { req });
            }
            return;
        }
        // At most an hour per step, whatever the cost knobs say.
        let dur = self
            .cfg
            .cost
            .step_ms(b.prefill_tokens, seqs, b.context)
            .clamp(0.0, 3_600_000.0);
        self.step = Some(Step {
            end: start + Duration::from_secs_f64(dur / 1e3),
            prefill: b.prefill,
            decode: b.decode,
        });
    }

    /// Moves waiting sequences that arrived by `start` into the batch while it has room.
    fn admit(&mut self, start: Instant, b: &mut Batch, out: &mut Vec<EngineEvent>) {
        while b.budget > 0 && self.running.len() < self.cfg.max_num_seqs {
            let Some(&k) = self.waiting.front() else {
                break;
            };
            let s = &self.seqs[&k];
            if s.arrival > start {
                break;
            }
            let need = self.cache.blocks_for(s.prompt_len + s.target);
            let Some(alloc) = self.cache.acquire(&s.hashes, s.prompt_len, need) else {
                break;
            };
            self.waiting.pop_front();
            let s = self.seqs.get_mut(&k).expect("waiting seq exists");
            s.computed = alloc.hit_tokens;
            s.registered = (alloc.hit_tokens / self.cfg.block_size) as usize;
            s.alloc = alloc;
            out.push(EngineEvent::Admitted {
                req: s.req,
                at: start,
                prompt_tokens: s.prompt_len,
                hit_tokens: s.computed,
            });
            b.prefill(k, s);
            self.running.push(k);
        }
    }

    /// Cost-model mode: the current step ends; its sequences get their tokens.
    fn finish_step(&mut self, out: &mut Vec<EngineEvent>) {
        let Some(step) = self.step.take() else {
            return;
        };
        let (end, bs) = (step.end, self.cfg.block_size);
        let mut done = Vec::new();
        for (key, chunk) in step.prefill {
            let Some(s) = self.seqs.get_mut(&key) else {
                continue;
            };
            s.computed += chunk;
            let full = ((s.computed / bs) as usize).min(s.hashes.len());
            for i in s.registered..full {
                if let Some(&b) = s.alloc.blocks.get(i) {
                    self.cache.register(b, s.hashes[i]);
                }
            }
            s.registered = s.registered.max(full);
            if s.computed >= s.prompt_len && emit_tokens(s, 1, self.cfg.vocab, end, out) {
                done.push(key);
            }
        }
        let tpe = self.cfg.tokens_per_event;
        for key in step.decode {
            let Some(s) = self.seqs.get_mut(&key) else {
                continue;
            };
            if s.generated < s.target && emit_tokens(s, tpe, self.cfg.vocab, end, out) {
                done.push(key);
            }
        }
        for key in done {
            self.remove(key);
        }
        self.last_step_end = Some(end);
    }
}

/// A step being put together.
#[derive(Default)]
struct Batch {
    budget: u32,
    prefill: Vec<(u64, u32)>,
    decode: Vec<u64>,
    prefill_tokens: u64,
    context: u64,
}

impl Batch {
    /// Adds the next prefill chunk of sequence `k` (as much as the budget allows).
    fn prefill(&mut self, k: u64, s: &Seq) {
        if self.budget == 0 {
            return;
        }
        let chunk = (s.prompt_len - s.computed).min(self.budget);
        self.budget -= chunk;
        self.prefill.push((k, chunk));
        self.prefill_tokens += u64::from(chunk);
        self.context += u64::from(s.computed + chunk);
    }
}

/// Puts the next (at most) `n` tokens of `s`, due at `at`, in `out`; true when they are its last.
fn emit_tokens(s: &mut Seq, n: u32, vocab: u32, at: Instant, out: &mut Vec<EngineEvent>) -> bool {
    let n = n.max(1).min(s.target - s.generated);
    let ids = (s.generated..s.generated + n)
        .map(|i| token_id(s.out_seed, i, vocab))
        .collect();
    s.generated += n;
    let last = s.generated >= s.target;
    out.push(EngineEvent::Tokens {
        req: s.req,
        choice: s.choice,
        ids,
        finish: last.then_some(s.finish),
        at,
    });
    last
}

/// The seed of choice `choice`'s output tokens for `prompt` (docs/mock.md, "Determinism").
pub(crate) fn out_seed(seed: u64, prompt: &[u32], choice: u32) -> u64 {
    seed ^ prompt_hash(prompt) ^ u64::from(choice).wrapping_mul(0x9E37_79B9)
}

/// xxh3 of the prompt's ids as little-endian bytes (the output tokens' seed).
fn prompt_hash(prompt: &[u32]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut buf = [0u8; 1024];
    for ids in prompt.chunks(buf.len() / 4) {
        for (b, t) in buf.chunks_exact_mut(4).zip(ids) {
            b.copy_from_slice(&t.to_le_bytes());
        }
        h.update(&buf[..ids.len() * 4]);
    }
    h.digest()
}

/// Output token `i` of the choice whose seed is `out_seed`.
pub(crate) fn token_id(out_seed: u64, i: u32, vocab: u32) -> u32 {
    (xxhash_rust::xxh3::xxh3_64_with_seed(&i.to_le_bytes(), out_seed) % u64::from(vocab.max(1)))
        as u32
}

/// Output length and finish reason for one sequence (see the module doc).
pub(crate) fn output_len(s: &SeqIn, out_seed: u64, eos_prob: f64) -> (u32, Finish) {
    let (len, finish) = natural_len(s, out_seed, eos_prob);
    match s.stop_after {
        Some(k) if (1..=len).contains(&k) => (k, Finish::Stop),
        _ => (len, finish),
    }
}

/// Output length and finish reason without stop strings.
pub(crate) fn natural_len(s: &SeqIn, out_seed: u64, eos_prob: f64) -> (u32, Finish) {
    let max = s.max_tokens.max(1);
    if s.ignore_eos || eos_prob <= 0.0 || s.min_tokens >= max {
        return (max, Finish::Length);
    }
    let Ok(geo) = rand_distr::Geometric::new(eos_prob.min(1.0)) else {
        return (max, Finish::Length);
    };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(out_seed);
    let len = u64::from(s.min_tokens) + 1 + geo.sample(&mut rng);
    if len < u64::from(max) {
        (len as u32, Finish::Stop)
    } else {
        (max, Finish::Length)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A config for tests: cost model `llama8b`, ample capacity, no EOS.
    pub(crate) fn test_config() -> SchedConfig {
        SchedConfig {
            fixed: None,
            cost: Profile::LLAMA8B.cost,
            max_num_seqs: 1000,
            max_num_batched_tokens: 2048,
            block_size: 16,
            kv_blocks: 1 << 16,
            tokens_per_event: 1,
            seed: 1,
            eos_prob: 0.0,
            vocab: 1000,
        }
    }

    #[test]
    fn cost_model_calibration() {
        let c = CostModel::default();
        let ttft = c.request_overhead_ms + c.step_ms(137, 1, 137);
        assert!((ttft - 70.0).abs() < 1.0, "{ttft}");
        let tpot = c.step_ms(0, 1, 138);
        assert!((tpot - 8.0).abs() < 0.2, "{tpot}");
        assert!(c.step_ms(0, 64, 64 * 1000) > 2.0 * tpot);
        // Long prompts and contexts stay within an accelerator's reach: a 7k-token prompt in
        // 2,048-token chunks is under half a second, a 100k-token context step under 20 ms.
        let long = c.request_overhead_ms
            + (0..4)
                .map(|k| {
                    let chunk = (7000 - 2048 * k).min(2048);
                    c.step_ms(chunk, 1, 2048 * k + chunk)
                })
                .sum::<f64>();
        assert!(long < 500.0, "{long}");
        assert!(c.step_ms(0, 1, 100_000) < 20.0);
    }

    #[test]
    fn prompt_hash_is_xxh3_of_little_endian_ids() {
        let long: Vec<u32> = (0..1000).map(|i| i * 7919).collect();
        for p in [
            vec![],
            vec![7u32],
            vec![1, 2, 3, u32::MAX, 0x0102_0304],
            long,
        ] {
            let bytes: Vec<u8> = p.iter().flat_map(|t| t.to_le_bytes()).collect();
            assert_eq!(prompt_hash(&p), xxhash_rust::xxh3::xxh3_64(&bytes));
        }
    }

    #[test]
    fn output_len_rules() {
        let s = SeqIn {
            prompt: vec![1],
            max_tokens: 50,
            min_tokens: 0,
            ignore_eos: true,
            stop_after: None,
        };
        assert_eq!(output_len(&s, 1, 0.5), (50, Finish::Length));
        let s = SeqIn {
            ignore_eos: false,
            stop_after: None,
            min_tokens: 10,
            ..s
        };
        for seed in 0..200 {
            let (n, f) = output_len(&s, seed, 0.2);
            assert!((11..=50).contains(&n), "{n}");
            assert_eq!(f == Finish::Stop, n < 50);
            assert_eq!(output_len(&s, seed, 0.2), (n, f), "deterministic");
        }
        assert!((0..200).any(|seed| output_len(&s, seed, 0.2).1 == Finish::Stop));
    }

    /// Runs `reqs` requests (137-token prompts, 16 tokens each) arriving together on the
    /// scheduler's own clock: (admission offset, mean ITL) of each, in ms.
    fn batch_run(reqs: u32, max_num_seqs: usize) -> Vec<(f64, f64)> {
        let mut s = Scheduler::new(SchedConfig {
            max_num_seqs,
            ..test_config()
        });
        let t0 = Instant::now();
        let mut out = Vec::new();
        for i in 0..reqs {
            let prompt = (0..137).map(|t| t + i * 1000).collect();
            let q = SeqIn {
                prompt,
                max_tokens: 16,
                min_tokens: 0,
                ignore_eos: true,
                stop_after: None,
            };
            s.add(u64::from(i), t0, vec![q], &mut out);
        }
        while s.next_due().is_some() {
            s.run_next(&mut out);
        }
        let ms = |t: Instant| (t - t0).as_secs_f64() * 1e3;
        let mut r = vec![(f64::NAN, Vec::new()); reqs as usize];
        for e in out {
            match e {
                EngineEvent::Admitted { req, at, .. } => r[req as usize].0 = ms(at),
                EngineEvent::Tokens { req, at, .. } => r[req as usize].1.push(ms(at)),
                EngineEvent::Rejected { .. } => panic!("nothing is too large here"),
            }
        }
        r.into_iter()
            .map(|(adm, ts)| {
                assert_eq!(ts.len(), 16);
                (adm, (ts[15] - ts[0]) / 15.0)
            })
            .collect()
    }

    #[test]
    fn batching_slows_steps_and_queues_beyond_max_num_seqs() {
        let lone = batch_run(1, 64)[0].1;
        assert!((lone - 8.0).abs() < 0.3, "calibrated TPOT: {lone}");
        let all = batch_run(128, 64);
        let mean = all.iter().map(|r| r.1).sum::<f64>() / 128.0;
        assert!(mean > lone * 1.5, "loaded TPOT {mean} vs lone {lone}");
        assert!(all.iter().all(|r| r.1 >= lone), "no ITL below the lone one");
        // The second half waits for a sequence of the first to finish (16 steps at least).
        let min_wait = 16.0 * Profile::LLAMA8B.cost.step_overhead_ms;
        assert!(
            all[64..].iter().all(|r| r.0 >= min_wait),
            "{:?}",
            &all[64..]
        );
    }
}
