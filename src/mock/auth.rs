//! `retrace mock --api-key`: as vLLM's `--api-key`, a request for a path under `/v1` without
//! `Authorization: Bearer KEY` is answered 401 before it is routed; other paths (`/health`,
//! `/metrics`, `/tokenize`, ...) and `OPTIONS` requests stay open, as vLLM leaves them.

use super::api::error_response;
use super::conn::Reply;
use hyper::header::AUTHORIZATION;
use hyper::{Method, Request};
use std::fmt;

/// The key the mock asks for. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// The key `key`; `None` when it is empty.
    pub fn new(key: &str) -> Option<ApiKey> {
        (!key.is_empty()).then(|| ApiKey(key.to_string()))
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(..)")
    }
}

/// The 401 answer to `req` when `key` is set, the path is under `/v1` and the request does not
/// carry the key; `None` lets the request through.
pub(crate) fn refuse<B>(req: &Request<B>, key: Option<&ApiKey>) -> Option<Reply> {
    let key = key?;
    let path = req.uri().path();
    let guarded = path == "/v1" || path.starts_with("/v1/");
    if !guarded || req.method() == Method::OPTIONS || carries(req, key) {
        return None;
    }
    Some(error_response(401, "Unauthorized: no valid API key", None))
}

/// The request's `Authorization` is `Bearer KEY` (the scheme in any case, as vLLM reads it).
fn carries<B>(req: &Request<B>, key: &ApiKey) -> bool {
    let Some(v) = req.headers().get(AUTHORIZATION) else {
        return false;
    };
    let Some((scheme, token)) = v.as_bytes().split_at_checked(7) else {
        return false;
    };
    scheme.eq_ignore_ascii_case(b"bearer ") && same(token, key.0.as_bytes())
}

/// `a == b` in time that depends on their lengths only.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: Method, path: &str, auth: Option<&str>) -> Request<()> {
        let mut b = Request::builder().method(method).uri(path);
        if let Some(a) = auth {
            b = b.header(AUTHORIZATION, a);
        }
        b.body(()).unwrap()
    }

    fn status(method: Method, path: &str, auth: Option<&str>) -> u16 {
        let key = ApiKey::new("k3y").unwrap();
        refuse(&req(method, path, auth), Some(&key)).map_or(200, |r| r.status().as_u16())
    }

    #[test]
    fn only_v1_paths_need_the_key_as_vllm_guards_them() {
        use Method as M;
        assert_eq!(status(M::POST, "/v1/completions", None), 401);
        assert_eq!(status(M::GET, "/v1/models", Some("Bearer wrong")), 401);
        assert_eq!(status(M::GET, "/v1/models", Some("Bearer k3y ")), 401);
        assert_eq!(status(M::GET, "/v1/models", Some("Basic k3y")), 401);
        assert_eq!(status(M::GET, "/v1/models", Some("Bearer k3y")), 200);
        assert_eq!(status(M::GET, "/v1/models", Some("bearer k3y")), 200);
        assert_eq!(status(M::OPTIONS, "/v1/models", None), 200);
        for open in ["/health", "/metrics", "/tokenize", "/version", "/v1x"] {
            assert_eq!(status(M::GET, open, None), 200, "{open}");
        }
        let no_key = refuse(&req(M::GET, "/v1/models", None), None);
        assert!(no_key.is_none(), "without --api-key every request passes");
    }

    #[test]
    fn the_key_is_not_in_its_debug_text() {
        let k = ApiKey::new("s3cret").unwrap();
        assert!(!format!("{k:?}").contains("s3cret"));
        assert_eq!(ApiKey::new(""), None);
    }
}
