//! Credentials in URLs (`http://user:secret@host/`): found and hidden before a URL is printed,
//! logged or stored. `--upstream` and `--target` refuse them (a key goes in a header:
//! `--api-key-env`, `--header`, or the client's own `Authorization`).

/// The `user:pass@` part of `scheme://user:pass@host/...`, if any.
fn span(url: &str) -> Option<(usize, usize)> {
    let start = url.find("://")? + 3;
    let end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    let at = url[start..end].rfind('@')?;
    Some((start, start + at + 1))
}

/// Does `url` carry credentials before its host?
pub(crate) fn present(url: &str) -> bool {
    span(url).is_some()
}

/// `url` with any credentials replaced by `***@`.
pub(crate) fn redact(url: &str) -> String {
    match span(url) {
        Some((a, b)) => format!("{}***@{}", &url[..a], &url[b..]),
        None => url.to_string(),
    }
}

/// An error naming `flag` when `url` carries credentials (the URL is shown redacted).
pub(crate) fn refuse(flag: &str, url: &str) -> Result<(), String> {
    match present(url) {
        true => Err(format!(
            "{flag} {}: credentials in the URL are not accepted (they would reach logs and \
             traces); send a key as a header instead (replay: --api-key-env VAR or --header; \
             record forwards each client's own Authorization)",
            redact(url)
        )),
        false => Ok(()),
    }
}

/// An error naming `flag` when the base URL `url` (API paths are appended to it) has a query
/// string or fragment; it could only break the paths, and may hold a key. The URL is shown
/// without it.
pub(crate) fn refuse_query(flag: &str, url: &str) -> Result<(), String> {
    match url.find(['?', '#']) {
        Some(at) => Err(format!(
            "{flag} {}: a query string or fragment is not accepted (API paths are appended to \
             this URL); send a key as a header instead",
            redact(&url[..at])
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_found_and_hidden() {
        assert!(present("http://u:SECRET@127.0.0.1:8000/v1"));
        assert!(present("https://token@host"));
        assert!(!present("http://127.0.0.1:8000/a@b"));
        assert!(!present("http://host/?q=a@b"));
        assert_eq!(
            redact("http://u:SECRET@127.0.0.1:8000/v1"),
            "http://***@127.0.0.1:8000/v1"
        );
        let e = refuse("--target", "http://u:SECRET@h:1").unwrap_err();
        assert!(
            e.starts_with("--target http://***@h:1:") && !e.contains("SECRET"),
            "{e}"
        );
        assert!(refuse("--target", "http://h:1/x@y").is_ok());
    }

    #[test]
    fn a_query_string_in_a_base_url_is_refused_without_being_shown() {
        let e = refuse_query("--target", "http://h:1/?api_key=sk-SECRET").unwrap_err();
        assert!(
            e.starts_with("--target http://h:1/:") && !e.contains("SECRET"),
            "{e}"
        );
        assert!(refuse_query("--upstream", "http://h:1/#frag").is_err());
        assert!(refuse_query("--target", "http://h:1/v1").is_ok());
    }
}
