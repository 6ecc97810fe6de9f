//! `/v1/embeddings` as vLLM 0.32 answers it: `{"id","object":"list","created","model",
//! "data":[{"index","object":"embedding","embedding"}],"usage":{"prompt_tokens",
//! "total_tokens","completion_tokens":0,"prompt_tokens_details":null}}`. Vectors are
//! deterministic in the seed and the input's token ids, L2-normalised as vLLM normalises them;
//! `dimensions` keeps the first components (renormalised); `encoding_format: "base64"` gives
//! little-endian float32 bytes in base64. Input count and dimensions are checked against
//! their bounds before anything is allocated for them. No I/O, no routes.

use super::format::json_str;
use base64::Engine as _;
use serde_json::Value;
use std::fmt::Write;

/// Most inputs one request may hold (OpenAI's limit).
pub(crate) const MAX_INPUTS: usize = 2048;
/// Largest embedding dimension the mock serves (`MockConfig::embedding_dim` and `dimensions`).
pub(crate) const MAX_DIM: u32 = 8192;
/// Most numbers one answer may hold (inputs × dimensions).
pub(crate) const MAX_FLOATS: u64 = 1 << 22;

/// What an embeddings request asks besides its inputs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct EmbedAsk {
    pub(crate) dim: u32,
    pub(crate) base64: bool,
}

/// Checks `input`'s count, `dimensions` and `encoding_format` of `raw` against the bounds;
/// `served`: the model's own dimension. Errors are a message and the field.
pub(crate) fn ask(raw: &Value, served: u32) -> Result<EmbedAsk, (String, &'static str)> {
    let inputs = match raw.get("input") {
        Some(Value::Array(a)) if a.first().is_some_and(|x| !x.is_number()) => a.len(),
        _ => 1,
    };
    if inputs > MAX_INPUTS {
        let msg = format!("{inputs} inputs: the mock embeds at most {MAX_INPUTS} per request");
        return Err((msg, "input"));
    }
    let dim = match raw.get("dimensions") {
        None | Some(Value::Null) => served,
        Some(v) => match v.as_u64() {
            Some(d) if (1..=u64::from(served)).contains(&d) => d as u32,
            _ => {
                let msg = format!("field `dimensions` must be an integer from 1 to {served} (the model's dimension), got {v}");
                return Err((msg, "dimensions"));
            }
        },
    };
    if inputs as u64 * u64::from(dim) > MAX_FLOATS {
        let msg = format!(
            "{inputs} inputs of {dim} dimensions: the mock answers at most {MAX_FLOATS} numbers per request"
        );
        return Err((msg, "input"));
    }
    let base64 = match raw.get("encoding_format") {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) if s == "float" => false,
        Some(Value::String(s)) if s == "base64" => true,
        Some(_) => {
            let msg = "field `encoding_format` must be float or base64";
            return Err((msg.into(), "encoding_format"));
        }
    };
    Ok(EmbedAsk { dim, base64 })
}

/// The unit vector of an input's token ids (`dim` components).
pub(crate) fn vector(seed: u64, ids: &[u32], dim: u32) -> Vec<f32> {
    let bytes: Vec<u8> = ids.iter().flat_map(|t| t.to_le_bytes()).collect();
    let h = xxhash_rust::xxh3::xxh3_64_with_seed(&bytes, seed ^ 0xe3bd);
    let mut v: Vec<f64> = (0..dim)
        .map(|j| {
            let x = xxhash_rust::xxh3::xxh3_64_with_seed(&j.to_le_bytes(), h);
            (x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        })
        .collect();
    let norm = v
        .iter()
        .map(|x| x * x)
        .sum::<f64>()
        .sqrt()
        .max(f64::MIN_POSITIVE);
    v.iter_mut().for_each(|x| *x /= norm);
    v.into_iter().map(|x| x as f32).collect()
}

/// The response body for the inputs' token ids.
pub(crate) fn body(
    id: &str,
    created: u64,
    model: &str,
    seed: u64,
    ask: EmbedAsk,
    inputs: &[std::sync::Arc<Vec<u32>>],
) -> String {
    let per = ask.dim as usize * if ask.base64 { 6 } else { 12 };
    let mut s = String::with_capacity(256 + inputs.len() * (per + 48));
    s.push_str("{\"id\":");
    json_str(&mut s, id);
    let _ = write!(s, ",\"object\":\"list\",\"created\":{created},\"model\":");
    json_str(&mut s, model);
    s.push_str(",\"data\":[");
    for (i, ids) in inputs.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "{{\"index\":{i},\"object\":\"embedding\",\"embedding\":");
        let v = vector(seed, ids, ask.dim);
        if ask.base64 {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            s.push('"');
            s.push_str(&base64::engine::general_purpose::STANDARD.encode(bytes));
            s.push('"');
        } else {
            s.push('[');
            for (j, x) in v.iter().enumerate() {
                let sep = if j > 0 { "," } else { "" };
                let _ = write!(s, "{sep}{x}");
            }
            s.push(']');
        }
        s.push('}');
    }
    let p: u64 = inputs.iter().map(|i| i.len() as u64).sum();
    let _ = write!(
        s,
        "],\"usage\":{{\"prompt_tokens\":{p},\"total_tokens\":{p},\"completion_tokens\":0,\"prompt_tokens_details\":null}}}}"
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Arc;

    #[test]
    fn vectors_are_unit_deterministic_and_differ_by_input() {
        let a = vector(0, &[1, 2, 3], 64);
        assert_eq!(a, vector(0, &[1, 2, 3], 64));
        assert_ne!(a, vector(0, &[1, 2, 4], 64));
        let n: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum();
        assert!((n - 1.0).abs() < 1e-5, "{n}");
    }

    #[test]
    fn body_has_vllm_keys_and_base64_decodes_to_the_floats() {
        let ins = vec![Arc::new(vec![1, 5]), Arc::new(vec![1, 6, 7])];
        let f = EmbedAsk {
            dim: 8,
            base64: false,
        };
        let v: Value = serde_json::from_str(&body("embd-1", 3, "m", 0, f, &ins)).unwrap();
        assert_eq!(v["object"], "list");
        assert_eq!(v["data"][1]["index"], 1);
        assert_eq!(v["data"][1]["object"], "embedding");
        assert_eq!(v["data"][0]["embedding"].as_array().unwrap().len(), 8);
        assert_eq!(v["usage"]["prompt_tokens"], 5);
        assert_eq!(v["usage"]["total_tokens"], 5);
        let b = EmbedAsk { base64: true, ..f };
        let w: Value = serde_json::from_str(&body("embd-1", 3, "m", 0, b, &ins)).unwrap();
        let raw = base64::engine::general_purpose::STANDARD
            .decode(w["data"][0]["embedding"].as_str().unwrap())
            .unwrap();
        let floats: Vec<f32> = raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(floats, vector(0, &[1, 5], 8));
    }

    /// The body has real vLLM 0.32's keys (`fixtures/vllm/embeddings_two_inputs.json`, its
    /// vectors cut to 4 values): the same at the top and in each item; in `usage`, vLLM's only
    /// other key is null there.
    #[test]
    fn body_keys_are_those_of_a_real_vllm_answer() {
        let real: Value = serde_json::from_str(include_str!(
            "../../fixtures/vllm/embeddings_two_inputs.json"
        ))
        .unwrap();
        let ins = vec![Arc::new(vec![1, 5]), Arc::new(vec![1, 6, 7])];
        let f = EmbedAsk {
            dim: 4,
            base64: false,
        };
        let mock: Value = serde_json::from_str(&body("embd-1", 3, "m", 0, f, &ins)).unwrap();
        let keys = |v: &Value| -> Vec<String> {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        assert_eq!(keys(&mock), keys(&real));
        assert_eq!(keys(&mock["data"][1]), keys(&real["data"][1]));
        for k in keys(&real["usage"]) {
            let shared = mock["usage"].get(&k).is_some();
            assert!(shared || real["usage"][&k].is_null(), "usage.{k}");
        }
        assert_eq!(mock["data"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn counts_and_dimensions_beyond_the_bounds_are_refused() {
        let many = json!({"input": vec!["x"; MAX_INPUTS + 1]});
        assert_eq!(ask(&many, 1024).unwrap_err().1, "input");
        assert_eq!(
            ask(&json!({"input": "x", "dimensions": 1025}), 1024)
                .unwrap_err()
                .1,
            "dimensions"
        );
        assert_eq!(
            ask(&json!({"input": "x", "dimensions": 0}), 1024)
                .unwrap_err()
                .1,
            "dimensions"
        );
        let big = json!({"input": vec!["x"; MAX_INPUTS]});
        assert_eq!(ask(&big, MAX_DIM).unwrap_err().1, "input");
        let ok = ask(
            &json!({"input": [[1, 2], [3]], "dimensions": 16, "encoding_format": "base64"}),
            1024,
        );
        assert_eq!(
            ok.unwrap(),
            EmbedAsk {
                dim: 16,
                base64: true
            }
        );
        assert_eq!(
            ask(&json!({"input": "x", "encoding_format": "hex"}), 8)
                .unwrap_err()
                .1,
            "encoding_format"
        );
    }
}
