//! Where requests go and their limits: `--target` (and `--scrape-metrics`) URLs, `--header`
//! values, per-request timeouts. No I/O here.

use hyper::header::{HeaderName, HeaderValue};
use hyper::{HeaderMap, Uri};
use std::time::Duration;

/// What a target that refused a request for want of a key (HTTP 401 or 403) is told to be
/// given.
pub(crate) const KEY_HINT: &str =
    "the target wants an API key: give --api-key-env VAR, or set OPENAI_API_KEY";

/// `{what} answered HTTP {status}`, with [`KEY_HINT`] when the status is 401 or 403.
pub(crate) fn answered(what: &str, status: u16) -> String {
    match status {
        401 | 403 => format!("{what} answered HTTP {status}: {KEY_HINT}"),
        _ => format!("{what} answered HTTP {status}"),
    }
}

/// Why the target named no model to send.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NoModel {
    /// It refused the request for want of a key (401, 403): `--model` would not help.
    #[error("{0}")]
    Refused(String),
    /// Anything else: `--model` names one instead.
    #[error("{0} (or give --model)")]
    Other(String),
}

/// Where requests go.
#[derive(Debug, Clone)]
pub struct Target {
    /// `host:port`.
    pub(crate) authority: String,
    /// The host alone (TLS server name).
    pub(crate) host: String,
    /// `https://`: connections are wrapped in TLS.
    pub(crate) tls: bool,
    /// Base path prefix (no trailing slash; usually empty).
    pub(crate) base_path: String,
    /// Headers sent with every request (auth included; never printed).
    pub(crate) headers: HeaderMap,
}

impl Target {
    /// Parses `--target` (`http://` or `https://`).
    pub fn parse(url: &str, headers: HeaderMap) -> Result<Target, String> {
        Target::parse_as(url, headers, "--target")
    }

    /// Parses a server URL given by `flag` (named in errors).
    pub(crate) fn parse_as(url: &str, headers: HeaderMap, flag: &str) -> Result<Target, String> {
        crate::sys::userinfo::refuse(flag, url)?;
        crate::sys::userinfo::refuse_query(flag, url)?;
        let url = url.trim_end_matches('/');
        let uri: Uri = url
            .parse()
            .map_err(|e| format!("{flag} {url:?} is not a URL: {e}"))?;
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => {
                return Err(format!(
                    "{flag} {url:?}: give a URL like http://127.0.0.1:8000"
                ))
            }
        };
        let Some(auth) = uri.authority() else {
            return Err(format!("{flag} {url:?} has no host"));
        };
        let authority = match auth.port_u16() {
            Some(_) => auth.as_str().to_string(),
            None => format!("{}:{}", auth.host(), if tls { 443 } else { 80 }),
        };
        let host = auth
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        // A target given as .../v1 keeps working: paths we add start with /v1.
        let path = uri.path().trim_end_matches('/');
        let base_path = path.strip_suffix("/v1").unwrap_or(path).to_string();
        Ok(Target {
            authority,
            host,
            tls,
            base_path,
            headers,
        })
    }

    /// The origin-form request target for `path`.
    pub(crate) fn uri(&self, path: &str) -> Result<Uri, String> {
        format!("{}{}", self.base_path, path)
            .parse()
            .map_err(|e| format!("bad request URI: {e}"))
    }

    /// `http://authority/base` for display (no headers).
    pub(crate) fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}{}", self.authority, self.base_path)
    }
}

/// Per-request limits.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// No byte (headers or body) for this long → `timeout_idle`.
    pub idle: Duration,
    /// The whole request took longer → `timeout_total`.
    pub(crate) total: Duration,
}

/// Parses one `--header K=V` (or `K: V`).
pub(crate) fn parse_header(s: &str) -> Result<(HeaderName, HeaderValue), String> {
    let (k, v) = s
        .split_once('=')
        .or_else(|| s.split_once(':'))
        .ok_or_else(|| format!("--header {s:?}: expected K=V"))?;
    let name = HeaderName::from_bytes(k.trim().as_bytes())
        .map_err(|_| format!("--header {s:?}: {k:?} is not a header name"))?;
    let value = HeaderValue::from_str(v.trim())
        .map_err(|_| format!("--header {s:?}: the value is not a valid header value"))?;
    Ok((name, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_urls() {
        let t = Target::parse("https://example.org/v1/", HeaderMap::new()).unwrap();
        assert_eq!(
            (t.authority.as_str(), t.host.as_str(), t.tls),
            ("example.org:443", "example.org", true)
        );
        assert_eq!(
            (t.base_path.as_str(), t.url()),
            ("", "https://example.org:443".to_string())
        );
        let t = Target::parse("http://[::1]:8000/proxy", HeaderMap::new()).unwrap();
        assert_eq!(
            (t.authority.as_str(), t.host.as_str(), t.tls),
            ("[::1]:8000", "::1", false)
        );
        assert_eq!(t.uri("/v1/models").unwrap().path(), "/proxy/v1/models");
        let t = Target::parse("http://localhost", HeaderMap::new()).unwrap();
        assert_eq!(t.authority, "localhost:80");
        for bad in ["ftp://x", "localhost:8000", "http:///v1"] {
            let e = Target::parse(bad, HeaderMap::new()).expect_err(bad);
            assert!(e.contains("--target"), "{e}");
        }
    }
}
