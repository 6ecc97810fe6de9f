//! Text prompts made by the target's own tokenizer, for requests recorded without a body when no
//! `--tokenizer` is given: chat (and every API with `--prompt-mode text`).
//!
//! Probed once before the clock ([`probe`]): the target's `POST /tokenize` of a sample of short
//! common words gives the token ids prompts are drawn from (ids the target itself makes of whole
//! words, [`whole_words`], its special tokens taken out), and its `POST /detokenize` must turn
//! ids back into text. Then, on the body builder's thread ([`crate::replay::plan::body`]), each prompt is the
//! [`Synth`] prompt of the request's hash ids (so prefixes are shared as recorded), turned into
//! text by `/detokenize` and counted by `/tokenize` in the request's own form (`prompt`, or one
//! user message in `messages`, the chat template included). When the count is not the
//! recorded input length, the token prompt is made longer or shorter by the difference and the
//! round repeats, at most [`MAX_ROUNDS`] times; what the target added to the last prompt is the
//! next prompt's first guess, so that most prompts take one round. Bounds: each call within
//! [`CALL_LIMIT`] and an answer of at most 16 MiB; a count above [`MAX_COUNT`] is refused as a
//! bad answer; after [`MAX_FAILURES`] failed calls in a row the target is not asked again and
//! the remaining prompts are approximate text (counted, with the first error). vLLM's shapes
//! (`{"model", "tokens"}` → `{"prompt"}`; `{"model", "prompt" | "messages"}` → `{"count"}`),
//! which the embedded mock serves too.

use crate::metrics::Api;
use crate::replay::http::client::Client;
use crate::replay::http::request::TargetText;
use crate::replay::plan::prompts::{Synth, Vocab};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Rounds of `/detokenize` + `/tokenize` for one prompt (at most twice as many calls).
pub(crate) const MAX_ROUNDS: usize = 4;
/// Time for one call.
pub(crate) const CALL_LIMIT: Duration = Duration::from_secs(10);
/// Failed calls in a row after which the target is not asked again.
pub(crate) const MAX_FAILURES: u64 = 3;
/// The most tokens a `/tokenize` answer may count (larger: a bad answer): the readers' bound on
/// any token count.
pub(crate) const MAX_COUNT: u64 = crate::trace::rows::MAX_TOKENS;
/// Fewer distinct ids than this from the sample: the target's tokenizer is not usable.
const MIN_VOCAB: usize = 16;
/// The most tokens the sample of words may come to (a larger answer is refused).
const MAX_SAMPLE_TOKENS: u64 = 4096;

/// Short common words (one token each in the usual vocabularies; the mock's built-in scheme
/// makes each a single piece).
const SAMPLE_WORDS: &str = "the of and to in is it that for on was with he as at by be this \
are or his from but not have an they you were her she had all one we can has more if will my so \
no do up out its who our him what when them then than some time only new may into also two any \
like very man day way use each make many over such back year work well just good give most even \
want here life both part down long made find tell last name hand high keep same look open show \
case seem area move read word play run end far home kind live mind";

/// What the target's tokenizer did for the run (the result's `target_text`).
#[derive(Debug, Default)]
pub(crate) struct TargetStats {
    pub(crate) prompts: AtomicU64,
    /// Prompts the target counted as exactly their recorded length.
    pub(crate) exact: AtomicU64,
    pub(crate) calls: AtomicU64,
    pub(crate) failed_calls: AtomicU64,
    /// The target stopped being asked ([`MAX_FAILURES`] failures in a row).
    pub(crate) gave_up: AtomicBool,
    pub(crate) first_error: Mutex<Option<String>>,
}

impl TargetStats {
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "prompts": self.prompts.load(Relaxed),
            "exact": self.exact.load(Relaxed),
            "calls": self.calls.load(Relaxed),
            "failed_calls": self.failed_calls.load(Relaxed),
            "gave_up": self.gave_up.load(Relaxed),
            "first_error": self.first_error.lock().ok().and_then(|e| e.clone()),
        })
    }
}

/// The target's tokenizer, as probed: its client (its own connections, apart from the
/// workload's), the runtime its calls run on, and the ids prompts are drawn from.
pub(crate) struct ServerText {
    client: Arc<Client>,
    rt: tokio::runtime::Handle,
    model: String,
    synth: Synth,
    /// Tokens the target added to the last prompt, per API (completions, chat): the next
    /// prompt's first guess.
    added: [AtomicI64; 2],
    failures_in_a_row: AtomicU64,
    pub(crate) stats: Arc<TargetStats>,
}

/// The count of a `/tokenize` answer (vLLM's `count`, else the length of `tokens`), refused
/// above [`MAX_COUNT`]. The one reader of such answers (also [`crate::replay::http::overhead`]'s).
pub(crate) fn count_of(answer: &Value) -> Result<u64, String> {
    let n = match answer.get("count").and_then(Value::as_u64) {
        Some(n) => n,
        None => answer
            .get("tokens")
            .and_then(Value::as_array)
            .map(|t| t.len() as u64)
            .ok_or("POST /tokenize: no `count` in the answer")?,
    };
    if n > MAX_COUNT {
        return Err(format!(
            "POST /tokenize: a count of {n} tokens (more than {MAX_COUNT})"
        ));
    }
    Ok(n)
}

/// The ids of a `/tokenize` answer, at most `budget` (checked before they are collected).
fn tokens_of(answer: &Value, budget: u64) -> Result<Vec<u32>, String> {
    let list = answer
        .get("tokens")
        .and_then(Value::as_array)
        .ok_or("POST /tokenize: no `tokens` list in the answer")?;
    if list.len() as u64 > budget {
        return Err(format!(
            "POST /tokenize: {} tokens (more than {budget})",
            list.len()
        ));
    }
    list.iter()
        .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
        .collect::<Option<Vec<u32>>>()
        .ok_or_else(|| "POST /tokenize: a token that is not an id".into())
}

/// The first character of a token string that opens a word: byte-level BPE's `Ġ` (a space),
/// SentencePiece's `▁`.
const WORD_MARKS: [char; 2] = ['\u{120}', '\u{2581}'];

/// The sample's whole-word tokens, read from the answer's `token_strs` (vLLM's
/// `return_token_strs`): a token whose string opens a word (a [`WORD_MARKS`] character and more)
/// and is followed by the start of another word, or ends the sample. The pieces of a word the
/// target splits are left out: drawn at random, a word's tail after another word's start is text
/// the target tokenizes into other ids (real vLLM, tiny-llama: ` his` is `Ġh` + `is`, ` very` is
/// `Ġ` + `very`; 2,000 ids of all the sample's pieces came back as 2,009 to 2,016 tokens), so the
/// prompt's count drifts from its ids' (more rounds, some prompts never exact) and shared ids no
/// longer make a shared token prefix. `None` when the answer has no strings for its tokens.
fn whole_words(tokens: &[u32], answer: &Value) -> Option<Vec<u32>> {
    let strs = answer.get("token_strs")?.as_array()?;
    if strs.len() != tokens.len() {
        return None;
    }
    let mark = |k: usize| {
        let mut c = strs[k].as_str().unwrap_or("").chars();
        let opens = c.next().is_some_and(|c| WORD_MARKS.contains(&c));
        (opens, opens && c.next().is_some())
    };
    let ids = (0..tokens.len())
        .filter(|&k| mark(k).1 && (k + 1 == tokens.len() || mark(k + 1).0))
        .map(|k| tokens[k])
        .collect();
    Some(ids)
}

/// The ids prompts are drawn from: the sample's tokens without those the target adds to an
/// empty prompt (its BOS, when it adds one regardless).
fn vocab_of(sample: &[u32], added: &[u32]) -> Option<Vocab> {
    let added: BTreeSet<u32> = added.iter().copied().collect();
    let ids: Vec<u32> = sample
        .iter()
        .copied()
        .filter(|t| !added.contains(t))
        .collect();
    let v = Vocab::from_ids(ids)?;
    (v.len() >= MIN_VOCAB).then_some(v)
}

/// Whether the target serves `/tokenize` and `/detokenize` for `model`: the prompt source, or
/// why not (one line). A few calls, each within [`CALL_LIMIT`].
pub(crate) async fn probe(
    client: Arc<Client>,
    model: &str,
    block_size: u32,
    seed: u64,
) -> Result<ServerText, String> {
    let post = |route: &'static str, body: Value| {
        let client = client.clone();
        async move { client.post_json_within(route, &body, CALL_LIMIT).await }
    };
    let sample = format!(" {SAMPLE_WORDS}");
    let bare =
        |prompt: &str| json!({"model": model, "prompt": prompt, "add_special_tokens": false});
    let mut ask = bare(&sample);
    ask["return_token_strs"] = Value::Bool(true);
    let answer = post("/tokenize", ask).await?;
    let words_n = count_of(&answer)?;
    if words_n > MAX_SAMPLE_TOKENS {
        return Err(format!(
            "POST /tokenize: {words_n} tokens for a sample of {} words (more than {MAX_SAMPLE_TOKENS})",
            SAMPLE_WORDS.split_whitespace().count()
        ));
    }
    let words = tokens_of(&answer, MAX_SAMPLE_TOKENS)?;
    // An error here leaves nothing out: the target adds nothing to an empty prompt.
    let empty = match post("/tokenize", bare("")).await {
        Ok(a) => tokens_of(&a, MAX_SAMPLE_TOKENS).unwrap_or_default(),
        Err(_) => Vec::new(),
    };
    // Whole words when the target names its tokens, else every piece of the sample.
    let vocab = whole_words(&words, &answer)
        .and_then(|w| vocab_of(&w, &empty))
        .or_else(|| vocab_of(&words, &empty))
        .ok_or_else(|| {
            format!("POST /tokenize: fewer than {MIN_VOCAB} distinct ids for a sample of words")
        })?;
    let ids: Vec<u32> = vocab.ids().iter().take(64).copied().collect();
    let detok = post("/detokenize", json!({"model": model, "tokens": ids})).await?;
    if !detok.get("prompt").is_some_and(Value::is_string) {
        return Err("POST /detokenize: no `prompt` text in the answer".into());
    }
    // First guesses of what the target adds: its special tokens, its chat template.
    let completion = post("/tokenize", json!({"model": model, "prompt": sample})).await;
    let messages = json!([{"role": "user", "content": sample}]);
    let chat = post("/tokenize", json!({"model": model, "messages": messages})).await;
    let added = |a: Result<Value, String>| {
        a.ok()
            .and_then(|a| count_of(&a).ok())
            .map_or(0, |n| n as i64 - words_n as i64)
    };
    Ok(ServerText {
        client,
        rt: tokio::runtime::Handle::current(),
        model: model.to_string(),
        synth: Synth::new(vocab, block_size, seed),
        added: [
            AtomicI64::new(added(completion)),
            AtomicI64::new(added(chat)),
        ],
        failures_in_a_row: AtomicU64::new(0),
        stats: Arc::new(TargetStats::default()),
    })
}

fn slot(api: Api) -> usize {
    match api {
        Api::Completions => 0,
        Api::Chat => 1,
    }
}

impl ServerText {
    /// One call on the runtime, from the builder's thread, counted; `None` once the target is
    /// no longer asked.
    fn call(&self, route: &'static str, body: Value) -> Option<Result<Value, String>> {
        if self.stats.gave_up.load(Relaxed) {
            return None;
        }
        self.stats.calls.fetch_add(1, Relaxed);
        let answer = self.rt.block_on(async {
            let within = self.client.post_json_within(route, &body, CALL_LIMIT);
            // The pool's limit covers the exchange; this one the connection too.
            tokio::time::timeout(CALL_LIMIT + Duration::from_secs(1), within)
                .await
                .unwrap_or_else(|_| Err(format!("POST {route}: no answer in time")))
        });
        match &answer {
            Ok(_) => self.failures_in_a_row.store(0, Relaxed),
            Err(e) => {
                self.stats.failed_calls.fetch_add(1, Relaxed);
                if let Ok(mut first) = self.stats.first_error.lock() {
                    first.get_or_insert_with(|| e.clone());
                }
                if self.failures_in_a_row.fetch_add(1, Relaxed) + 1 >= MAX_FAILURES {
                    self.stats.gave_up.store(true, Relaxed);
                }
            }
        }
        Some(answer)
    }

    /// The target's text of `ids`, and its count of that text on `api`.
    fn round(&self, ids: &[u32], api: Api) -> Option<(String, u64)> {
        let body = json!({"model": self.model, "tokens": ids});
        let answer = self.call("/detokenize", body)?.ok()?;
        let text = answer.get("prompt").and_then(Value::as_str)?.to_string();
        let body = match api {
            Api::Completions => json!({"model": self.model, "prompt": text}),
            Api::Chat => {
                json!({"model": self.model, "messages": [{"role": "user", "content": text}]})
            }
        };
        let answer = self.call("/tokenize", body)?.ok()?;
        match count_of(&answer) {
            Ok(n) => Some((text, n)),
            Err(e) => {
                if let Ok(mut first) = self.stats.first_error.lock() {
                    first.get_or_insert(e);
                }
                None
            }
        }
    }

    /// Text of about `n` tokens when the target cannot be asked: the sample's words, repeated.
    fn fallback(n: u64) -> String {
        let words: Vec<&str> = SAMPLE_WORDS.split_whitespace().collect();
        let mut s = String::new();
        for k in 0..n.min(MAX_COUNT) as usize {
            s.push(' ');
            s.push_str(words[k % words.len()]);
        }
        s
    }
}

/// The next token length to try: `n` corrected by the target's miss, within `1..=2T + 4096`.
fn next_len(n: u64, want: u64, got: u64) -> u64 {
    let next = n as i64 + want as i64 - got as i64;
    (next.max(1) as u64).min(want.saturating_mul(2).saturating_add(4096))
}

impl TargetText for ServerText {
    fn text(&self, hash_ids: &[u64], input_tokens: u64, key: u64, api: Api) -> (String, bool) {
        self.stats.prompts.fetch_add(1, Relaxed);
        let added = self.added[slot(api)].load(Relaxed);
        let mut n = (input_tokens as i64 - added).max(1) as u64;
        let mut best: Option<(u64, String)> = None;
        let mut tried = BTreeSet::new();
        for _ in 0..MAX_ROUNDS {
            if !tried.insert(n) {
                break;
            }
            let ids = self.synth.prompt(hash_ids, n, key);
            let Some((text, got)) = self.round(&ids, api) else {
                break;
            };
            self.added[slot(api)].store(got as i64 - n as i64, Relaxed);
            if got == input_tokens {
                self.stats.exact.fetch_add(1, Relaxed);
                return (text, true);
            }
            let miss = got.abs_diff(input_tokens);
            if best.as_ref().is_none_or(|(m, _)| miss < *m) {
                best = Some((miss, text));
            }
            n = next_len(n, input_tokens, got);
        }
        match best {
            Some((_, text)) => (text, false),
            None => (ServerText::fallback(n), false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_within_their_bounds() {
        assert_eq!(count_of(&json!({"count": 7, "tokens": [1, 2]})), Ok(7));
        assert_eq!(count_of(&json!({"tokens": [0, 615, 80]})), Ok(3));
        assert!(count_of(&json!({"error": "x"})).is_err());
        let e = count_of(&json!({"count": MAX_COUNT + 1})).unwrap_err();
        assert!(e.contains("more than"), "{e}");
        assert_eq!(tokens_of(&json!({"tokens": [3, 4]}), 2), Ok(vec![3, 4]));
        let e = tokens_of(&json!({"tokens": [3, 4, 5]}), 2).unwrap_err();
        assert!(e.contains("3 tokens (more than 2)"), "{e}");
        assert!(tokens_of(&json!({"tokens": [3, -1]}), 9).is_err());
        assert!(tokens_of(&json!({"tokens": [3, 1u64 << 40]}), 9).is_err());
        assert!(tokens_of(&json!({"count": 2}), 9).is_err());
    }

    #[test]
    fn the_vocabulary_leaves_out_what_the_target_adds() {
        let sample: Vec<u32> = (100..140).chain([1, 1]).collect();
        let v = vocab_of(&sample, &[1]).unwrap();
        assert_eq!(v.len(), 40);
        assert!(!v.ids().contains(&1));
        assert!(vocab_of(&(100..110).collect::<Vec<_>>(), &[]).is_none());
    }

    /// Real vLLM 0.32 (CPU, tiny-llama): the probe's `/tokenize` of the sample with
    /// `return_token_strs` (fixtures/vllm/tokenize_sample_words.json), and `/detokenize` then
    /// `/tokenize` of 48 ids drawn from the whole words and from all the pieces
    /// (fixtures/vllm/detokenize_roundtrip.json).
    #[test]
    fn prompts_are_drawn_from_whole_words_the_target_gives_back() {
        let answer: Value = serde_json::from_str(include_str!(
            "../../../fixtures/vllm/tokenize_sample_words.json"
        ))
        .unwrap();
        let tokens = tokens_of(&answer, MAX_SAMPLE_TOKENS).unwrap();
        let strs: Vec<&str> = answer["token_strs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        let id = |s: &str| tokens[strs.iter().position(|t| *t == s).unwrap()];
        let v = vocab_of(&whole_words(&tokens, &answer).unwrap(), &[]).unwrap();
        assert_eq!((tokens.len(), v.len()), (135, 100));
        for piece in ["\u{120}h", "is", "er", "\u{120}", "very", "igh"] {
            assert!(
                !v.ids().contains(&id(piece)),
                "{piece} is a piece of a word"
            );
        }
        for word in ["\u{120}the", "\u{120}like", "\u{120}work", "\u{120}she"] {
            assert!(v.ids().contains(&id(word)), "{word} is a word");
        }
        let trip: Value = serde_json::from_str(include_str!(
            "../../../fixtures/vllm/detokenize_roundtrip.json"
        ))
        .unwrap();
        let ids = |v: &Value| tokens_of(v, 64).unwrap();
        let (w, p) = (&trip["whole_words"], &trip["all_pieces"]);
        assert!(ids(w).iter().all(|t| v.ids().contains(t)));
        assert_eq!(ids(&w["tokenize"]), ids(w), "whole words come back as sent");
        assert!(ids(p).iter().any(|t| !v.ids().contains(t)));
        assert_ne!(ids(&p["tokenize"]), ids(p), "pieces glue into other tokens");
        // Without names (the mock's built-in tokenizer, other servers): every piece, as before.
        assert_eq!(whole_words(&tokens, &json!({"token_strs": null})), None);
        assert_eq!(whole_words(&tokens, &json!({"token_strs": ["a"]})), None);
        let sp = json!({"token_strs": ["\u{2581}a", "\u{2581}b", "c", "\u{2581}d"]});
        assert_eq!(whole_words(&[1, 2, 3, 4], &sp), Some(vec![1, 4]));
    }

    #[test]
    fn a_miss_corrects_the_length_within_bounds() {
        assert_eq!(next_len(100, 100, 108), 92);
        assert_eq!(next_len(92, 100, 99), 93);
        assert_eq!(next_len(5, 3, 20), 1);
        assert_eq!(next_len(10, 10, 0), 20);
        assert_eq!(next_len(u64::MAX / 4, 1, 0), 4098);
        assert_eq!(ServerText::fallback(3), " the of and");
    }
}
