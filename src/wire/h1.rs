//! HTTP/1.1 wire format for retrace's own forwarding loop (`record::h1`) and HTTP/1.1 clients:
//! message heads and chunked framing.
//!
//! [`parse_request`] and [`parse_response`] read one head with `httparse`, decide how its body is
//! framed (RFC 9112 §6.3) and write the rewritten head for the next hop: hop-by-hop headers
//! removed (RFC 9110 §7.6.1: `Connection` and every header it names, `Keep-Alive`,
//! `Proxy-Connection`, `TE` other than `trailers`, `Trailer`, `Transfer-Encoding`, `Upgrade`),
//! `Host` replaced by the upstream authority, the upstream base path prepended; the same rules
//! as `proxy` applies to hyper's messages. The one exception is a protocol switch (RFC 9110
//! §7.8, e.g. WebSocket): a request with `Connection: upgrade` and an `Upgrade` field (other
//! than `h2c`, which would hide the requests inside from the recorder) keeps its `Upgrade` field
//! and says `connection: upgrade` on the next hop, as nginx does with `proxy_set_header`; a `101
//! Switching Protocols` answering it is accepted ([`ResponseOptions::upgrade`]) and written with
//! its `Upgrade` field and `connection: upgrade`. A 101 nobody asked for stays an error. Because
//! both hops speak HTTP/1.1, a chunked body is
//! passed through with its framing untouched, so the original `Transfer-Encoding` line is written
//! again on the next hop; [`ChunkedDecoder`] follows that framing byte by byte to find where the
//! body ends and to hand the decoded payload to the capture. Header names keep their case and
//! order. Duplicate equal `Content-Length` values (several fields or a list) go out as one field
//! (RFC 9110 §8.6; different values are refused); a request with two `Host` fields is refused
//! (RFC 9112 §3.2), and one whose `Via` carries the proxy's own entry came round a loop
//! ([`HeadError::Loop`]); the forwarded request gets that entry. Pure: no I/O, no clock, no
//! allocation beyond the output head and the two strings of a request line. It does not read sockets or decide timeouts (see `h1`).

/// Largest request or response head accepted (bytes).
pub(crate) const MAX_HEAD: usize = 64 << 10;
/// Most header fields accepted in one head.
pub(crate) const MAX_HEADERS: usize = 128;
/// Longest chunk-size line (with extensions) or trailer section accepted by [`ChunkedDecoder`].
const MAX_CHUNK_LINE: u32 = 4096;
const MAX_TRAILERS: u32 = 64 << 10;

/// How a message body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body.
    None,
    /// Exactly this many bytes (never 0: that is [`Framing::None`]).
    Length(u64),
    /// `Transfer-Encoding` ending in `chunked`.
    Chunked,
    /// Until the sender closes the connection (responses only).
    Close,
}

/// Why a head was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeadError {
    /// Longer than [`MAX_HEAD`] or more than [`MAX_HEADERS`] fields (431 for a request).
    TooLarge,
    /// Not HTTP/1.x, or framing that cannot be forwarded safely (400 for a request).
    Malformed(&'static str),
    /// The request already passed through this proxy (its `Via` entry): 508.
    Loop,
}

impl HeadError {
    /// The status a client gets for a request head refused this way.
    pub(crate) fn status(self) -> u16 {
        match self {
            HeadError::TooLarge => 431,
            HeadError::Malformed(_) => 400,
            HeadError::Loop => 508,
        }
    }

    pub(crate) fn reason(self) -> &'static str {
        match self {
            HeadError::TooLarge => "request header fields too large",
            HeadError::Malformed(why) => why,
            HeadError::Loop => {
                "the request came back to this proxy (Via): does --upstream point at it?"
            }
        }
    }
}

/// A parsed request head (the rewritten head went to the output buffer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RequestHead {
    /// Bytes of the head in the input, blank line included.
    pub(crate) len: usize,
    /// Where the method is in the parsed buffer (see [`RequestHead::method_in`]): positions,
    /// not a copy, so parsing a head allocates nothing.
    pub(crate) method: std::ops::Range<usize>,
    /// Where the path and query are in the parsed buffer, as the client sent them
    /// (origin-form; from absolute-form when given so; see [`RequestHead::path_into`]).
    pub(crate) path: std::ops::Range<usize>,
    /// The target had a query but no path (`?q`, `http://h?q`): the path is `/` + `buf[path]`.
    pub(crate) path_slash: bool,
    /// [`Framing::None`], [`Framing::Length`] or [`Framing::Chunked`].
    pub(crate) body: Framing,
    /// The client lets the connection carry another request (HTTP/1.1 without `close`).
    pub(crate) keep_alive: bool,
    /// HTTP/1.0: chunked responses are decoded for it and the connection closes after.
    pub(crate) http10: bool,
    /// A `HEAD` request: the response has no body whatever its headers say.
    pub(crate) is_head: bool,
    /// The request asks to switch protocols (`Connection: upgrade` + `Upgrade`, HTTP/1.1, not
    /// `h2c`): the head for the upstream kept its `Upgrade` field and says `connection: upgrade`.
    pub(crate) upgrade: bool,
}

impl RequestHead {
    /// The method, from the buffer the head was parsed from.
    pub(crate) fn method_in<'a>(&self, buf: &'a [u8]) -> &'a str {
        buf.get(self.method.clone())
            .and_then(|b| std::str::from_utf8(b).ok())
            .unwrap_or("")
    }

    /// Appends the path and query (origin-form) to `out`, from the buffer the head was parsed from.
    pub(crate) fn path_into(&self, buf: &[u8], out: &mut String) {
        if self.path_slash {
            out.push('/');
        }
        if let Some(p) = buf
            .get(self.path.clone())
            .and_then(|b| std::str::from_utf8(b).ok())
        {
            out.push_str(p);
        }
    }
}

/// Where `part` (a slice of `buf`) sits in `buf`.
fn range_in(buf: &[u8], part: &str) -> std::ops::Range<usize> {
    let start = (part.as_ptr() as usize).wrapping_sub(buf.as_ptr() as usize);
    if start <= buf.len() && part.len() <= buf.len() - start {
        start..start + part.len()
    } else {
        0..0
    }
}

/// A parsed response head (the rewritten head went to the output buffer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResponseHead {
    pub(crate) len: usize,
    pub(crate) status: u16,
    pub(crate) body: Framing,
    /// The upstream keeps the connection open after this response.
    pub(crate) reusable: bool,
    /// The `Content-Type` value, copied (from [`parse_response_head`]; [`parse_response`],
    /// the recorder's, leaves it `None` and gives its position instead).
    pub(crate) content_type: Option<String>,
    /// Where the `Content-Type` value is in the parsed buffer.
    pub(crate) content_type_at: Option<std::ops::Range<usize>>,
}

/// How to write a response head for the client.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ResponseOptions {
    /// The request was `HEAD`.
    pub(crate) head_request: bool,
    /// The client connection closes after this response (`Connection: close` is written).
    pub(crate) close: bool,
    /// The client speaks HTTP/1.0: a chunked body is sent decoded, so no `Transfer-Encoding`.
    pub(crate) dechunk: bool,
    /// The request asked to switch protocols ([`RequestHead::upgrade`]): a `101 Switching
    /// Protocols` is accepted and written with its `Upgrade` field and `connection: upgrade`
    /// (never `connection: close`).
    pub(crate) upgrade: bool,
}

fn eq(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

/// Hop-by-hop by itself (RFC 9110 §7.6.1), without being named in `Connection`: the one list
/// both of record's paths apply (raw heads here, header maps in `record::common`).
pub(crate) fn is_hop_by_hop(name: &str) -> bool {
    eq(name, "connection")
        || eq(name, "transfer-encoding")
        || eq(name, "upgrade")
        || eq(name, "trailer")
        || eq(name, "te")
        || eq(name, "keep-alive")
        || eq(name, "proxy-connection")
}

fn tokens(v: &[u8]) -> impl Iterator<Item = &[u8]> {
    v.split(|&b| b == b',').map(|t| t.trim_ascii())
}

/// Whether a `Connection` field of `headers` names `name`.
fn named_in_connection(headers: &[httparse::Header<'_>], name: &str) -> bool {
    headers
        .iter()
        .filter(|h| eq(h.name, "connection"))
        .any(|h| tokens(h.value).any(|t| t.eq_ignore_ascii_case(name.as_bytes())))
}

fn connection_has(headers: &[httparse::Header<'_>], token: &str) -> bool {
    named_in_connection(headers, token)
}

/// Framing from `Transfer-Encoding` (chunked last or not) and `Content-Length` fields.
fn framing_fields(
    headers: &[httparse::Header<'_>],
) -> Result<(Option<bool>, Option<u64>), HeadError> {
    let mut chunked = None;
    let mut length: Option<u64> = None;
    for h in headers {
        if eq(h.name, "transfer-encoding") {
            let last = tokens(h.value).filter(|t| !t.is_empty()).last();
            chunked = Some(last.is_some_and(|t| t.eq_ignore_ascii_case(b"chunked")));
        } else if eq(h.name, "content-length") {
            for t in tokens(h.value) {
                // At most 18 digits: no overflow possible.
                if t.is_empty() || t.len() > 18 || !t.iter().all(u8::is_ascii_digit) {
                    return Err(HeadError::Malformed("invalid content-length"));
                }
                let n = t.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
                if length.is_some_and(|l| l != n) {
                    return Err(HeadError::Malformed("conflicting content-length"));
                }
                length = Some(n);
            }
        }
    }
    Ok((chunked, length))
}

/// Writes the fields of `headers` that survive the hop (hop-by-hop ones and `Host` dropped;
/// `TE: trailers` kept; the `Transfer-Encoding` lines again when `keep_te`; the `Upgrade` lines
/// and `connection: upgrade` when `upgrade`).
fn write_fields(
    headers: &[httparse::Header<'_>],
    keep_te: bool,
    drop_host: bool,
    upgrade: bool,
    out: &mut Vec<u8>,
) {
    let has_connection = headers.iter().any(|h| eq(h.name, "connection"));
    let (mut te_trailers, mut length_sent) = (false, false);
    for h in headers {
        if eq(h.name, "content-length") {
            // Equal values (checked by `framing_fields`) go out once.
            if !length_sent {
                let v = tokens(h.value).next().unwrap_or_default();
                field(out, h.name.as_bytes(), v);
                length_sent = true;
            }
            continue;
        }
        if eq(h.name, "transfer-encoding") {
            if keep_te {
                field(out, h.name.as_bytes(), h.value);
            }
            continue;
        }
        if upgrade && eq(h.name, "upgrade") {
            field(out, h.name.as_bytes(), h.value);
            continue;
        }
        if eq(h.name, "te") {
            te_trailers |=
                tokens(h.value).any(|t| t.len() >= 8 && t[..8].eq_ignore_ascii_case(b"trailers"));
            continue;
        }
        if is_hop_by_hop(h.name)
            || (drop_host && eq(h.name, "host"))
            || (has_connection && named_in_connection(headers, h.name))
        {
            continue;
        }
        field(out, h.name.as_bytes(), h.value);
    }
    if te_trailers {
        out.extend_from_slice(b"te: trailers\r\n");
    }
    if upgrade {
        out.extend_from_slice(b"connection: upgrade\r\n");
    }
}

/// Whether a request's fields ask for a protocol switch the proxy forwards: `Connection` names
/// `upgrade` and an `Upgrade` field names a protocol other than `h2c` (an HTTP/2 upgrade would
/// hide the requests inside from the recorder; without it the client carries on in HTTP/1.1).
fn wants_upgrade(headers: &[httparse::Header<'_>]) -> bool {
    if !connection_has(headers, "upgrade") {
        return false;
    }
    let mut any = false;
    for h in headers.iter().filter(|h| eq(h.name, "upgrade")) {
        for t in tokens(h.value).filter(|t| !t.is_empty()) {
            if t.eq_ignore_ascii_case(b"h2c") {
                return false;
            }
            any = true;
        }
    }
    any
}

fn field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// The origin-form path and query of a request target.
fn origin_form(target: &str) -> Result<&str, HeadError> {
    if target.starts_with('/') || target == "*" {
        return Ok(target);
    }
    for scheme in ["http://", "https://"] {
        let b = target.as_bytes();
        if b.len() >= scheme.len() && b[..scheme.len()].eq_ignore_ascii_case(scheme.as_bytes()) {
            // The scheme is ASCII, so this is a char boundary.
            let rest = &target[scheme.len()..];
            return Ok(match rest.find(['/', '?']) {
                Some(i) if rest.as_bytes()[i] == b'/' => &rest[i..],
                Some(i) => &rest[i..], // "?q" without a path: written as "/?q" by the caller
                None => "/",
            });
        }
    }
    Err(HeadError::Malformed(
        "request target is not origin-form or absolute-form",
    ))
}

/// Whether a `Via` field value carries the pseudonym of `entry` (`1.1 retrace-ab12` →
/// `retrace-ab12`): a request that does came back to the proxy that added it.
pub(crate) fn via_names(value: &[u8], entry: &[u8]) -> bool {
    let id = entry.split(|&b| b == b' ').nth(1).unwrap_or(entry);
    !id.is_empty() && value.windows(id.len()).any(|w| w.eq_ignore_ascii_case(id))
}

/// Refuses a request with two `Host` fields, or one carrying our `Via` entry.
fn check_request_fields(headers: &[httparse::Header<'_>], via: &[u8]) -> Result<(), HeadError> {
    if headers.iter().filter(|h| eq(h.name, "host")).count() > 1 {
        return Err(HeadError::Malformed("more than one host header"));
    }
    let ours = |h: &&httparse::Header<'_>| eq(h.name, "via") && via_names(h.value, via);
    match headers.iter().any(|h| ours(&h)) {
        true => Err(HeadError::Loop),
        false => Ok(()),
    }
}

/// Parses one request head at the start of `buf`. `Ok(None)`: incomplete, read more (the caller
/// refuses a buffer of [`MAX_HEAD`] bytes that is still incomplete, see [`incomplete_limit`]).
/// On success the head for the upstream (`host` as `Host`, `base_path` prepended, `via` added as
/// a `Via` field unless empty) is in `out`.
pub(crate) fn parse_request(
    buf: &[u8],
    host: &[u8],
    base_path: &str,
    via: &[u8],
    out: &mut Vec<u8>,
) -> Result<Option<RequestHead>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let Some(len) = head_len(req.parse(buf), buf.len(), "malformed request head")? else {
        return Ok(None);
    };
    let method = req.method.unwrap_or("GET");
    let target = req.path.unwrap_or("/");
    let http10 = req.version == Some(0);
    let headers = req.headers;
    check_request_fields(headers, via)?;
    let pq = origin_form(target)?;
    let (chunked, length) = framing_fields(headers)?;
    let body = match (chunked, length) {
        (Some(_), Some(_)) => {
            return Err(HeadError::Malformed(
                "both transfer-encoding and content-length",
            ))
        }
        (Some(true), None) => Framing::Chunked,
        (Some(false), None) => {
            return Err(HeadError::Malformed(
                "transfer-encoding of a request must end in chunked",
            ))
        }
        (None, Some(0)) | (None, None) => Framing::None,
        (None, Some(n)) => Framing::Length(n),
    };
    let keep_alive = !http10 && !connection_has(headers, "close");
    let upgrade = !http10 && wants_upgrade(headers);

    out.clear();
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    if pq != "*" {
        out.extend_from_slice(base_path.as_bytes());
    }
    if pq.starts_with('?') {
        out.push(b'/');
    }
    out.extend_from_slice(pq.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    field(out, b"host", host);
    write_fields(headers, body == Framing::Chunked, true, upgrade, out);
    if !via.is_empty() {
        field(out, b"via", via);
    }
    out.extend_from_slice(b"\r\n");
    Ok(Some(RequestHead {
        len,
        method: range_in(buf, method),
        path: range_in(buf, pq),
        path_slash: pq.starts_with('?'),
        body,
        keep_alive,
        http10,
        is_head: method == "HEAD",
        upgrade,
    }))
}

/// `Err(TooLarge)` when an incomplete head already fills [`MAX_HEAD`] bytes.
pub(crate) fn incomplete_limit(have: usize) -> Result<(), HeadError> {
    if have >= MAX_HEAD {
        Err(HeadError::TooLarge)
    } else {
        Ok(())
    }
}

/// Parses one response head at the start of `buf` for a client that consumes the body itself
/// (the replayer): the same framing and reuse decisions as [`parse_response`], without writing a
/// head for another hop. `head_request`: the request was `HEAD` (no body whatever the headers
/// say). `Ok(None)`: incomplete. Interim (1xx) heads come back with [`Framing::None`]; the caller
/// skips `len` bytes and parses again.
pub(crate) fn parse_response_head(
    buf: &[u8],
    head_request: bool,
) -> Result<Option<ResponseHead>, HeadError> {
    with_response_head(buf, |resp, len| {
        response_head(resp, buf, len, head_request, false, true).map(|(h, _)| h)
    })
}

/// Parses a response head at the start of `buf` and hands it and its length to `then`;
/// `Ok(None)` while incomplete.
fn with_response_head<T>(
    buf: &[u8],
    then: impl FnOnce(&httparse::Response<'_, '_>, usize) -> Result<T, HeadError>,
) -> Result<Option<T>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    match head_len(resp.parse(buf), buf.len(), "malformed response head")? {
        Some(len) => then(&resp, len).map(Some),
        None => Ok(None),
    }
}

/// The length of a complete head from httparse's answer, `None` while incomplete (and within
/// the size limit), or why the head is refused.
fn head_len(
    r: httparse::Result<usize>,
    buf_len: usize,
    malformed: &'static str,
) -> Result<Option<usize>, HeadError> {
    let len = match r {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return incomplete_limit(buf_len).map(|_| None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(_) => return Err(HeadError::Malformed(malformed)),
    };
    if len > MAX_HEAD {
        return Err(HeadError::TooLarge);
    }
    Ok(Some(len))
}

/// Framing and reuse of a parsed response head; also its `Content-Length`, if any. `upgrade`:
/// the request asked to switch protocols, so a 101 is accepted (no body, not reusable: the
/// connection then carries the new protocol).
fn response_head(
    resp: &httparse::Response<'_, '_>,
    buf: &[u8],
    len: usize,
    head_request: bool,
    upgrade: bool,
    copy_content_type: bool,
) -> Result<(ResponseHead, Option<u64>), HeadError> {
    let status = resp.code.unwrap_or(0);
    let http10 = resp.version == Some(0);
    let headers: &[httparse::Header<'_>] = resp.headers;
    let interim = (100..200).contains(&status);
    if status == 101 && !upgrade {
        // Upgrade is forwarded only for a request that asked to switch.
        return Err(HeadError::Malformed("unrequested 101 switching protocols"));
    }
    let (chunked, length) = framing_fields(headers)?;
    let body = if interim || status == 204 || status == 304 || head_request {
        Framing::None
    } else {
        match (chunked, length) {
            (Some(true), _) => Framing::Chunked,
            (Some(false), _) => Framing::Close,
            (None, Some(0)) => Framing::None,
            (None, Some(n)) => Framing::Length(n),
            (None, None) => Framing::Close,
        }
    };
    let ambiguous = chunked.is_some() && length.is_some();
    let reusable = !(http10
        || connection_has(headers, "close")
        || body == Framing::Close
        || ambiguous
        || status == 101);
    let ct = headers
        .iter()
        .find(|h| eq(h.name, "content-type"))
        .and_then(|h| std::str::from_utf8(h.value).ok());
    Ok((
        ResponseHead {
            len,
            status,
            body,
            reusable,
            content_type: ct.filter(|_| copy_content_type).map(str::to_string),
            content_type_at: ct.map(|v| range_in(buf, v)),
        },
        length,
    ))
}

/// Parses one response head at the start of `buf` and writes the head for the client to `out`.
/// `Ok(None)`: incomplete. Interim (1xx) heads come back with [`Framing::None`]; the caller
/// forwards them and parses again.
pub(crate) fn parse_response(
    buf: &[u8],
    o: ResponseOptions,
    out: &mut Vec<u8>,
) -> Result<Option<ResponseHead>, HeadError> {
    with_response_head(buf, |resp, len| {
        let (head, length) = response_head(resp, buf, len, o.head_request, o.upgrade, false)?;
        write_response_head(resp, &head, length.is_some(), o, out);
        Ok(head)
    })
}

/// The head [`parse_response`] writes for the client: status line, fields for the next hop,
/// `connection: close` when this response ends the connection.
fn write_response_head(
    resp: &httparse::Response<'_, '_>,
    head: &ResponseHead,
    has_length: bool,
    o: ResponseOptions,
    out: &mut Vec<u8>,
) {
    let (status, body) = (head.status, head.body);
    let interim = (100..200).contains(&status);
    let reason = resp.reason.unwrap_or("");
    let headers: &[httparse::Header<'_>] = resp.headers;

    out.clear();
    out.extend_from_slice(b"HTTP/1.1 ");
    let mut code = [0u8; 3];
    code[0] = b'0' + (status / 100 % 10) as u8;
    code[1] = b'0' + (status / 10 % 10) as u8;
    code[2] = b'0' + (status % 10) as u8;
    out.extend_from_slice(&code);
    out.push(b' ');
    out.extend_from_slice(reason.as_bytes());
    out.extend_from_slice(b"\r\n");
    let raw_chunked = body == Framing::Chunked && !o.dechunk;
    let switch = status == 101;
    // Content-Length next to a chunked body is dropped: the chunked framing wins (RFC 9112 §6.3).
    if body == Framing::Chunked && has_length {
        let kept: Vec<httparse::Header<'_>> = headers
            .iter()
            .filter(|h| !eq(h.name, "content-length"))
            .copied()
            .collect();
        write_fields(&kept, raw_chunked, false, false, out);
    } else {
        write_fields(headers, raw_chunked, false, switch, out);
    }
    if !interim && (o.close || body == Framing::Close || (body == Framing::Chunked && o.dechunk)) {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Serializes a client request with a `Content-Length` body into `out` (cleared first): request
/// line, `Host`, the caller's `fields` (names and values as given; the caller guarantees they are
/// valid header tokens and values), `content-length`, blank line, then `body`, so that the whole
/// request goes out in one write. Nothing is validated or rewritten here.
pub(crate) fn write_request<'a>(
    method: &str,
    path: &str,
    host: &[u8],
    fields: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    body: &[u8],
    out: &mut Vec<u8>,
) {
    out.clear();
    out.reserve(256 + body.len());
    write_request_head(method, path, host, fields, body.len(), out);
    out.extend_from_slice(body);
}

/// [`write_request`]'s head alone (for a body of `body_len` bytes sent after it, e.g. by one
/// vectored write): appended to `out`.
pub(crate) fn write_request_head<'a>(
    method: &str,
    path: &str,
    host: &[u8],
    fields: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    body_len: usize,
    out: &mut Vec<u8>,
) {
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    field(out, b"host", host);
    for (k, v) in fields {
        field(out, k, v);
    }
    let mut digits = [0u8; 20];
    let mut n = body_len;
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    field(out, b"content-length", &digits[i..]);
    out.extend_from_slice(b"\r\n");
}

/// A malformed chunked body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkError(pub &'static str);

impl std::fmt::Display for ChunkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bad chunked framing: {}", self.0)
    }
}

impl std::error::Error for ChunkError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum St {
    #[default]
    Size,
    Ext,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    TrailerStart,
    Trailer,
    TrailerLf,
    EndLf,
    Done,
}

/// The LF that must end a framing line.
fn lf(b: u8, expected: &'static str) -> Result<(), ChunkError> {
    (b == b'\n').then_some(()).ok_or(ChunkError(expected))
}

/// Follows chunked framing incrementally: where the body ends and which bytes are payload.
#[derive(Debug, Clone, Default)]
pub struct ChunkedDecoder {
    st: St,
    size: u64,
    digits: u8,
    line: u32,
    trailers: u32,
}

impl ChunkedDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// The terminating chunk and trailer section have been seen.
    pub fn is_done(&self) -> bool {
        self.st == St::Done
    }

    /// Consumes framing bytes from `buf`, calling `payload(start, end)` for each range of
    /// payload bytes (indices into `buf`), and stops right after the end of the body. Returns
    /// how many bytes of `buf` belong to the body.
    pub fn feed(
        &mut self,
        buf: &[u8],
        mut payload: impl FnMut(usize, usize),
    ) -> Result<usize, ChunkError> {
        let mut i = 0;
        while i < buf.len() {
            if self.st == St::Data {
                let n = (buf.len() - i).min(usize::try_from(self.size).unwrap_or(usize::MAX));
                payload(i, i + n);
                i += n;
                self.size -= n as u64;
                if self.size == 0 {
                    self.st = St::DataCr;
                }
                continue;
            }
            let b = buf[i];
            i += 1;
            match self.st {
                St::Size => match b {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        if self.digits == 16 {
                            return Err(ChunkError("chunk size too large"));
                        }
                        let d = (b as char).to_digit(16).unwrap_or(0) as u64;
                        self.size = self.size << 4 | d;
                        self.digits += 1;
                    }
                    b';' | b' ' | b'\t' if self.digits > 0 => {
                        self.st = St::Ext;
                        self.line = 0;
                    }
                    b'\r' if self.digits > 0 => self.st = St::SizeLf,
                    b'\n' if self.digits > 0 => self.size_line_end(),
                    _ => return Err(ChunkError("invalid chunk size")),
                },
                St::Ext => match b {
                    b'\r' => self.st = St::SizeLf,
                    b'\n' => self.size_line_end(),
                    _ => {
                        self.line += 1;
                        if self.line > MAX_CHUNK_LINE {
                            return Err(ChunkError("chunk extension too long"));
                        }
                    }
                },
                St::SizeLf => {
                    lf(b, "expected LF after chunk size")?;
                    self.size_line_end();
                }
                St::DataCr => match b {
                    b'\r' => self.st = St::DataLf,
                    b'\n' => self.next_chunk(),
                    _ => return Err(ChunkError("expected CRLF after chunk data")),
                },
                St::DataLf => {
                    lf(b, "expected LF after chunk data")?;
                    self.next_chunk();
                }
                St::TrailerStart => match b {
                    b'\r' => self.st = St::EndLf,
                    b'\n' => {
                        self.st = St::Done;
                        return Ok(i);
                    }
                    _ => {
                        self.st = St::Trailer;
                        self.trailer_byte()?;
                    }
                },
                St::Trailer => match b {
                    b'\r' => self.st = St::TrailerLf,
                    b'\n' => self.st = St::TrailerStart,
                    _ => self.trailer_byte()?,
                },
                St::TrailerLf => {
                    lf(b, "expected LF after trailer field")?;
                    self.st = St::TrailerStart;
                }
                St::EndLf => {
                    lf(b, "expected LF after last chunk")?;
                    self.st = St::Done;
                    return Ok(i);
                }
                St::Done => return Ok(i - 1),
                St::Data => unreachable!("handled above"),
            }
        }
        Ok(i)
    }

    fn size_line_end(&mut self) {
        self.st = if self.size == 0 {
            St::TrailerStart
        } else {
            St::Data
        };
    }

    fn next_chunk(&mut self) {
        self.st = St::Size;
        self.size = 0;
        self.digits = 0;
    }

    fn trailer_byte(&mut self) -> Result<(), ChunkError> {
        self.trailers += 1;
        if self.trailers > MAX_TRAILERS {
            return Err(ChunkError("trailer section too long"));
        }
        Ok(())
    }
}

/// Follows one response body of any [`Framing`] for a client that consumes it: hands out the
/// payload and says where the body ends. The end of a [`Framing::Close`] body is the sender's
/// close, which the caller sees (`at_eof`); this type only counts and decodes.
#[derive(Debug, Clone)]
pub(crate) struct BodyDecoder {
    framing: Framing,
    left: u64,
    chunked: ChunkedDecoder,
    done: bool,
}

impl BodyDecoder {
    pub(crate) fn new(framing: Framing) -> Self {
        BodyDecoder {
            framing,
            left: match framing {
                Framing::Length(n) => n,
                _ => 0,
            },
            chunked: ChunkedDecoder::new(),
            done: framing == Framing::None,
        }
    }

    /// The whole body has been seen (never true for [`Framing::Close`]).
    pub(crate) fn is_done(&self) -> bool {
        self.done
    }

    /// Consumes body bytes from `buf`, calling `payload` with each run of payload bytes (in place,
    /// no copy); stops right after the end of the body and returns how many bytes of `buf` it used
    /// (fewer than `buf.len()` only when the body ended inside `buf`).
    pub(crate) fn feed(
        &mut self,
        buf: &[u8],
        mut payload: impl FnMut(&[u8]),
    ) -> Result<usize, ChunkError> {
        if self.done {
            return Ok(0);
        }
        match self.framing {
            Framing::None => Ok(0),
            Framing::Close => {
                if !buf.is_empty() {
                    payload(buf);
                }
                Ok(buf.len())
            }
            Framing::Length(_) => {
                let n = buf
                    .len()
                    .min(usize::try_from(self.left).unwrap_or(usize::MAX));
                if n > 0 {
                    payload(&buf[..n]);
                }
                self.left -= n as u64;
                self.done = self.left == 0;
                Ok(n)
            }
            Framing::Chunked => {
                let n = self.chunked.feed(buf, |a, b| payload(&buf[a..b]))?;
                self.done = self.chunked.is_done();
                Ok(n)
            }
        }
    }

    /// What is missing when the connection ends now: `None` when the body is complete (a
    /// [`Framing::Close`] body ends exactly here), otherwise why it is truncated.
    pub(crate) fn at_eof(&self) -> Option<&'static str> {
        match (self.done, self.framing) {
            (true, _) | (_, Framing::Close) => None,
            (_, Framing::Length(_)) => {
                Some("connection closed before the end of the content-length body")
            }
            _ => Some("connection closed before the last chunk"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST: &[u8] = b"up.example:8001";

    fn path_of(h: &RequestHead, buf: &[u8]) -> String {
        let mut p = String::new();
        h.path_into(buf, &mut p);
        p
    }

    fn req(raw: &str) -> (Result<Option<RequestHead>, HeadError>, String) {
        let mut out = Vec::new();
        let r = parse_request(raw.as_bytes(), HOST, "", b"", &mut out);
        (r, String::from_utf8(out).unwrap())
    }

    #[test]
    fn request_head_is_rewritten_for_the_upstream() {
        let raw = "POST /v1/completions?x=1 HTTP/1.1\r\nHost: proxy:8000\r\nContent-Type: application/json\r\n\
                   Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nTE: trailers, deflate\r\n\
                   Authorization: Bearer k\r\nContent-Length: 5\r\n\r\nhello";
        let (r, out) = req(raw);
        let h = r.unwrap().unwrap();
        assert_eq!(h.len, raw.len() - 5);
        assert_eq!(h.method_in(raw.as_bytes()), "POST");
        assert_eq!(path_of(&h, raw.as_bytes()), "/v1/completions?x=1");
        assert_eq!(h.body, Framing::Length(5));
        assert!(h.keep_alive && !h.http10 && !h.is_head);
        assert_eq!(
            out,
            "POST /v1/completions?x=1 HTTP/1.1\r\nhost: up.example:8001\r\nContent-Type: application/json\r\n\
             Authorization: Bearer k\r\nContent-Length: 5\r\nte: trailers\r\n\r\n"
        );
    }

    #[test]
    fn upgrade_requests_keep_upgrade_and_say_connection_upgrade() {
        let raw = "GET /v1/realtime HTTP/1.1\r\nHost: proxy\r\nConnection: keep-alive, Upgrade\r\n\
                   Upgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
                   Sec-WebSocket-Version: 13\r\nKeep-Alive: timeout=5\r\n\r\n";
        let (r, out) = req(raw);
        let h = r.unwrap().unwrap();
        assert!(h.upgrade && h.keep_alive);
        assert_eq!(h.body, Framing::None);
        assert_eq!(
            out,
            "GET /v1/realtime HTTP/1.1\r\nhost: up.example:8001\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
             connection: upgrade\r\n\r\n"
        );
        // Not a switch: Upgrade without Connection naming it, Connection without Upgrade, h2c
        // (the recorder must keep seeing the requests), HTTP/1.0.
        for raw in [
            "GET / HTTP/1.1\r\nUpgrade: websocket\r\n\r\n",
            "GET / HTTP/1.1\r\nConnection: upgrade\r\n\r\n",
            "GET / HTTP/1.1\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n",
            "GET / HTTP/1.0\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
        ] {
            let (r, out) = req(raw);
            assert!(!r.unwrap().unwrap().upgrade, "{raw:?}");
            assert!(!out.to_ascii_lowercase().contains("upgrade"), "{raw:?}: {out}");
            assert!(!out.contains("HTTP2-Settings"), "{raw:?}: {out}");
        }
        // A body is framed as usual.
        let (r, out) = req("POST /ws HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: foo/2, bar\r\nContent-Length: 2\r\n\r\nhi");
        let h = r.unwrap().unwrap();
        assert!(h.upgrade);
        assert_eq!(h.body, Framing::Length(2));
        assert!(
            out.contains("Upgrade: foo/2, bar\r\n") && out.ends_with("connection: upgrade\r\n\r\n"),
            "{out}"
        );
    }

    #[test]
    fn a_101_is_accepted_only_for_an_upgrade_request() {
        let raw =
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                   Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n\x01\x02hi";
        let o = ResponseOptions {
            upgrade: true,
            // A draining proxy never writes close on a switch.
            close: true,
            ..Default::default()
        };
        let mut out = Vec::new();
        let h = parse_response(raw.as_bytes(), o, &mut out)
            .unwrap()
            .unwrap();
        assert_eq!((h.status, h.body, h.reusable), (101, Framing::None, false));
        assert_eq!(
            &raw[h.len..],
            "\x01\x02hi",
            "tunnel bytes after the head are not consumed"
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\nconnection: upgrade\r\n\r\n"
        );
        let mut out = Vec::new();
        let plain = ResponseOptions::default();
        assert_eq!(
            parse_response(raw.as_bytes(), plain, &mut out),
            Err(HeadError::Malformed("unrequested 101 switching protocols"))
        );
        // A refusal is an ordinary response: its Upgrade field is hop-by-hop as ever.
        let (h, out) = resp(
            "HTTP/1.1 426 Upgrade Required\r\nUpgrade: websocket\r\nConnection: Upgrade\r\ncontent-length: 2\r\n\r\nno",
            ResponseOptions { upgrade: true, ..Default::default() },
        );
        assert_eq!(
            (h.status, h.body, h.reusable),
            (426, Framing::Length(2), true)
        );
        assert_eq!(
            out,
            "HTTP/1.1 426 Upgrade Required\r\ncontent-length: 2\r\n\r\n"
        );
    }

    #[test]
    fn base_path_absolute_form_and_chunked_requests() {
        let mut out = Vec::new();
        let raw = b"GET http://proxy:8000/v1/models HTTP/1.1\r\nhost: proxy\r\n\r\n";
        let h = parse_request(raw, HOST, "/prefix", b"", &mut out)
            .unwrap()
            .unwrap();
        assert_eq!(path_of(&h, raw), "/v1/models");
        assert_eq!(h.body, Framing::None);
        assert!(out.starts_with(b"GET /prefix/v1/models HTTP/1.1\r\nhost: up.example:8001\r\n\r\n"));
        let raw = b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n";
        let h = parse_request(raw, HOST, "", b"", &mut out)
            .unwrap()
            .unwrap();
        assert_eq!(h.body, Framing::Chunked);
        let s = String::from_utf8(out.clone()).unwrap();
        assert!(s.contains("Transfer-Encoding: chunked\r\n"), "{s}");
        assert!(s.contains("Expect: 100-continue\r\n"), "{s}");
        let raw = b"GET http://h?q=1 HTTP/1.1\r\n\r\n";
        let h = parse_request(raw, HOST, "", b"", &mut out)
            .unwrap()
            .unwrap();
        assert_eq!(path_of(&h, raw), "/?q=1");
        assert!(out.starts_with(b"GET /?q=1 HTTP/1.1\r\n"));
    }

    #[test]
    fn keep_alive_http10_and_head() {
        let (r, _) = req("GET / HTTP/1.1\r\nConnection: Close\r\n\r\n");
        assert!(!r.unwrap().unwrap().keep_alive);
        let (r, _) = req("HEAD / HTTP/1.0\r\n\r\n");
        let h = r.unwrap().unwrap();
        assert!(h.http10 && !h.keep_alive && h.is_head);
    }

    #[test]
    fn incomplete_oversized_and_malformed_request_heads() {
        assert_eq!(req("POST /x HTTP/1.1\r\nHost: a\r\n").0, Ok(None));
        let mut big = "GET / HTTP/1.1\r\nX: ".to_string();
        big.push_str(&"a".repeat(MAX_HEAD));
        assert_eq!(req(&big).0, Err(HeadError::TooLarge));
        let mut many = "GET / HTTP/1.1\r\n".to_string();
        for k in 0..=MAX_HEADERS {
            many.push_str(&format!("x-{k}: 1\r\n"));
        }
        many.push_str("\r\n");
        assert_eq!(req(&many).0, Err(HeadError::TooLarge));
        assert_eq!(HeadError::TooLarge.status(), 431);
        for bad in [
            "GARBAGE\r\n\r\n",
            "GET / HTTP/1.1\r\nBad Header: x\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
            "CONNECT host:443 HTTP/1.1\r\n\r\n",
        ] {
            let e = req(bad).0.unwrap_err();
            assert_eq!(e.status(), 400, "{bad:?}: {e:?}");
        }
    }

    fn resp(raw: &str, o: ResponseOptions) -> (ResponseHead, String) {
        let mut out = Vec::new();
        let h = parse_response(raw.as_bytes(), o, &mut out)
            .unwrap()
            .unwrap();
        (h, String::from_utf8(out).unwrap())
    }

    #[test]
    fn client_response_heads_match_the_forwarding_decisions() {
        for (raw, head_req, framing, reusable) in [
            ("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\ndata", false, Framing::Chunked, true),
            ("HTTP/1.1 200 OK\r\ncontent-length: 3\r\nconnection: close\r\n\r\nabc", false, Framing::Length(3), false),
            ("HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nabc", true, Framing::None, true),
            ("HTTP/1.1 500 Oops\r\ncontent-length: 0\r\n\r\n", false, Framing::None, true),
            ("HTTP/1.0 200 OK\r\n\r\nrest", false, Framing::Close, false),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", false, Framing::Close, false),
            ("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n", false, Framing::None, true),
        ] {
            let h = parse_response_head(raw.as_bytes(), head_req).unwrap().unwrap();
            assert_eq!((h.body, h.reusable), (framing, reusable), "{raw}");
            let (fwd, _) = resp(raw, ResponseOptions { head_request: head_req, ..Default::default() });
            // The recorder's parse gives the content type's position instead of a copy.
            let ct = fwd.content_type_at.clone().map(|r| raw[r].to_string());
            assert_eq!(ct, h.content_type, "{raw}");
            assert_eq!(ResponseHead { content_type: ct, ..fwd }, h, "{raw}");
        }
        let h = parse_response_head(b"HTTP/1.1 429 Too Many\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}", false).unwrap().unwrap();
        assert_eq!(
            (h.status, h.len, h.content_type.as_deref()),
            (429, 76, Some("application/json"))
        );
        assert_eq!(
            parse_response_head(b"HTTP/1.1 200 OK\r\ncontent-le", false),
            Ok(None)
        );
        assert_eq!(
            parse_response_head(
                b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
                false
            ),
            Err(HeadError::Malformed("conflicting content-length"))
        );
        assert!(matches!(
            parse_response_head(b"SSH-2.0-x\r\n\r\n", false),
            Err(HeadError::Malformed(_))
        ));
        assert!(matches!(
            parse_response_head(b"HTTP/1.1 101 Switching\r\n\r\n", false),
            Err(HeadError::Malformed(_))
        ));
        let mut big = b"HTTP/1.1 200 OK\r\nx: ".to_vec();
        big.resize(MAX_HEAD, b'a');
        assert_eq!(parse_response_head(&big, false), Err(HeadError::TooLarge));
    }

    #[test]
    fn client_requests_are_serialized_in_one_buffer() {
        let mut out = b"stale".to_vec();
        let fields: [(&[u8], &[u8]); 2] = [
            (b"content-type", b"application/json"),
            (b"authorization", b"Bearer k"),
        ];
        write_request(
            "POST",
            "/v1/completions",
            b"127.0.0.1:8000",
            fields,
            b"{\"a\":1}",
            &mut out,
        );
        assert_eq!(
            String::from_utf8(out.clone()).unwrap(),
            "POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1:8000\r\ncontent-type: application/json\r\nauthorization: Bearer k\r\ncontent-length: 7\r\n\r\n{\"a\":1}"
        );
        let mut headers = [httparse::EMPTY_HEADER; 8];
        let mut req = httparse::Request::new(&mut headers);
        assert!(
            matches!(req.parse(&out), Ok(httparse::Status::Complete(n)) if &out[n..] == b"{\"a\":1}")
        );
        write_request("GET", "/", b"h", [], b"", &mut out);
        assert_eq!(
            out,
            b"GET / HTTP/1.1\r\nhost: h\r\ncontent-length: 0\r\n\r\n"
        );
    }

    #[test]
    fn response_heads_framing_and_rewriting() {
        let o = ResponseOptions::default();
        let (h, out) = resp(
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\r\n",
            o,
        );
        assert_eq!(h.body, Framing::Chunked);
        assert!(h.reusable);
        assert_eq!(h.content_type, None, "the recorder's parse copies nothing");
        assert_eq!(h.content_type_at, Some(31..48));
        assert_eq!(
            out,
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
        let (h, out) = resp(
            "HTTP/1.1 200 OK\r\ncontent-length: 3\r\nconnection: close\r\n\r\nabc",
            o,
        );
        assert_eq!((h.body, h.reusable, h.len), (Framing::Length(3), false, 57));
        assert_eq!(out, "HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\n");
        let (h, out) = resp("HTTP/1.0 200 OK\r\n\r\n", o);
        assert_eq!((h.body, h.reusable), (Framing::Close, false));
        assert_eq!(out, "HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n");
        for (raw, head) in [
            (
                "HTTP/1.1 204 No Content\r\ncontent-length: 7\r\n\r\n",
                false,
            ),
            ("HTTP/1.1 304 Not Modified\r\n\r\n", false),
            ("HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\n", true),
            ("HTTP/1.1 100 Continue\r\n\r\n", false),
        ] {
            let o = ResponseOptions {
                head_request: head,
                ..o
            };
            let (h, _) = resp(raw, o);
            assert_eq!(h.body, Framing::None, "{raw:?}");
            assert!(h.reusable);
        }
        // An interim head never says close; a final one does when asked, and for an HTTP/1.0
        // client the chunked framing goes.
        let c = ResponseOptions {
            close: true,
            dechunk: true,
            ..o
        };
        let (_, out) = resp("HTTP/1.1 100 Continue\r\n\r\n", c);
        assert_eq!(out, "HTTP/1.1 100 Continue\r\n\r\n");
        let (h, out) = resp("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", c);
        assert_eq!(h.body, Framing::Chunked);
        assert_eq!(out, "HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n");
        let (h, out) = resp(
            "HTTP/1.1 200 OK\r\nContent-Length: 9\r\nTransfer-Encoding: chunked\r\n\r\n",
            o,
        );
        assert_eq!((h.body, h.reusable), (Framing::Chunked, false));
        assert_eq!(out, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        let mut out = Vec::new();
        assert_eq!(
            parse_response(b"HTTP/1.1 200 OK\r\n", o, &mut out),
            Ok(None)
        );
        assert!(parse_response(b"SSH-2.0-x\r\n\r\n", o, &mut out).is_err());
        assert!(parse_response(b"HTTP/1.1 101 Switching\r\n\r\n", o, &mut out).is_err());
    }

    /// Feeds `wire` cut at `cut` and returns (payload, body length consumed).
    fn dechunk(wire: &[u8], cuts: &[usize]) -> Result<(Vec<u8>, usize), ChunkError> {
        let mut d = ChunkedDecoder::new();
        let mut payload = Vec::new();
        let mut pos = 0;
        let mut bounds: Vec<usize> = cuts.iter().copied().filter(|&c| c < wire.len()).collect();
        bounds.push(wire.len());
        for end in bounds {
            if end < pos {
                continue;
            }
            let part = &wire[pos..end];
            let n = d.feed(part, |a, b| payload.extend_from_slice(&part[a..b]))?;
            pos += n;
            if d.is_done() {
                return Ok((payload, pos));
            }
            assert_eq!(n, part.len(), "stops early only when done");
        }
        Err(ChunkError("unterminated"))
    }

    fn body(
        framing: Framing,
        wire: &[u8],
        cut: usize,
    ) -> (Vec<u8>, usize, bool, Option<&'static str>) {
        let mut d = BodyDecoder::new(framing);
        let mut out = Vec::new();
        let mut used = 0;
        for part in [&wire[..cut], &wire[cut..]] {
            let n = d.feed(part, |p| out.extend_from_slice(p)).unwrap();
            used += n;
            if n < part.len() {
                break;
            }
        }
        (out, used, d.is_done(), d.at_eof())
    }

    #[test]
    fn body_decoder_follows_every_framing_at_every_cut() {
        let chunked = b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\nNEXT";
        for cut in 0..=chunked.len() {
            assert_eq!(
                body(Framing::Chunked, chunked, cut),
                (b"hello world".to_vec(), chunked.len() - 4, true, None),
                "cut {cut}"
            );
        }
        let plain = b"hello worldNEXT";
        for cut in 0..=plain.len() {
            assert_eq!(
                body(Framing::Length(11), plain, cut),
                (b"hello world".to_vec(), 11, true, None),
                "cut {cut}"
            );
            assert_eq!(
                body(Framing::Close, plain, cut),
                (plain.to_vec(), plain.len(), false, None),
                "cut {cut}"
            );
        }
        assert_eq!(body(Framing::None, b"x", 0), (vec![], 0, true, None));
        // Truncated bodies say so at EOF.
        let (out, _, done, eof) = body(Framing::Length(20), plain, 3);
        assert_eq!((out.len(), done), (plain.len(), false));
        assert!(eof.unwrap().contains("content-length"));
        let (_, _, done, eof) = body(Framing::Chunked, b"5\r\nhel", 2);
        assert!(!done && eof.unwrap().contains("chunk"));
        let mut d = BodyDecoder::new(Framing::Chunked);
        assert!(d.feed(b"zz\r\n", |_| {}).is_err());
    }

    #[test]
    fn chunked_decoder_follows_framing_at_every_cut() {
        let wire = b"5\r\nhello\r\nA;ext=1\r\n0123456789\r\n0\r\nx-trailer: 1\r\n\r\nNEXT";
        let body_len = wire.len() - 4;
        for cut in 0..wire.len() {
            let (p, n) = dechunk(wire, &[cut]).unwrap();
            assert_eq!(p, b"hello0123456789", "cut {cut}");
            assert_eq!(n, body_len);
        }
        let every: Vec<usize> = (1..wire.len()).collect();
        assert_eq!(dechunk(wire, &every).unwrap().1, body_len);
        // Bare LF line ends are accepted; the last chunk with no trailers.
        assert_eq!(
            dechunk(b"3\nabc\n0\n\n", &[]).unwrap(),
            (b"abc".to_vec(), 9)
        );
        assert!(dechunk(b"3\r\nabc\r\n", &[]).is_err(), "no last chunk");
    }

    #[test]
    fn chunked_decoder_rejects_bad_framing() {
        for bad in [
            &b"x\r\n"[..],
            b"\r\n",
            b"3\r\nabcX\r\n",
            b"11111111111111111\r\n",
            b"3\rX",
            b"0\r\n\rX",
        ] {
            let mut d = ChunkedDecoder::new();
            assert!(d.feed(bad, |_, _| {}).is_err(), "{bad:?}");
        }
        let mut long = b"1;".to_vec();
        long.extend(std::iter::repeat_n(b'e', 5000));
        assert!(ChunkedDecoder::new().feed(&long, |_, _| {}).is_err());
    }

    #[test]
    fn two_host_headers_are_refused_and_equal_content_lengths_go_out_once() {
        let (r, _) = req("GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n");
        assert_eq!(r, Err(HeadError::Malformed("more than one host header")));
        let raw = "POST / HTTP/1.1\r\nContent-Length: 3\r\ncontent-length: 3, 3\r\n\r\nabc";
        let (r, out) = req(raw);
        assert_eq!(r.unwrap().unwrap().body, Framing::Length(3));
        assert_eq!(out.matches("ength: ").count(), 1, "{out}");
        assert!(out.contains("Content-Length: 3\r\n"), "{out}");
        let raw = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nhi";
        let (h, out) = resp(raw, ResponseOptions::default());
        assert_eq!(h.body, Framing::Length(2));
        assert_eq!(out.matches("Content-Length: 2\r\n").count(), 1, "{out}");
    }

    #[test]
    fn a_request_carrying_our_via_entry_is_a_loop() {
        let via = b"1.1 retrace-00ab";
        let mut out = Vec::new();
        let raw = b"GET / HTTP/1.1\r\nVia: 1.0 other\r\n\r\n";
        parse_request(raw, HOST, "", via, &mut out)
            .unwrap()
            .unwrap();
        let s = String::from_utf8(out.clone()).unwrap();
        assert!(
            s.ends_with("Via: 1.0 other\r\nvia: 1.1 retrace-00ab\r\n\r\n"),
            "{s}"
        );
        let back = b"GET / HTTP/1.1\r\nVia: 1.0 other, 1.1 Retrace-00AB\r\n\r\n";
        let r = parse_request(back, HOST, "", via, &mut out);
        assert_eq!(r, Err(HeadError::Loop));
        assert_eq!(HeadError::Loop.status(), 508);
        let other = b"GET / HTTP/1.1\r\nVia: 1.1 retrace-ffff\r\n\r\n";
        assert!(parse_request(other, HOST, "", via, &mut out).is_ok());
    }

    proptest::proptest! {
        /// Whatever a client or an upstream sends, the parsers answer (never panic).
        #[test]
        fn parsers_never_panic_on_arbitrary_bytes(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600)) {
            let mut out = Vec::new();
            let _ = parse_request(&data, HOST, "/b", b"1.1 retrace-x", &mut out);
            let _ = parse_response(&data, ResponseOptions::default(), &mut out);
            let mut d = ChunkedDecoder::new();
            let _ = d.feed(&data, |a, b| assert!(a <= b && b <= data.len()));
        }

        /// Any chunking of any payload, cut anywhere, decodes to the payload and ends exactly
        /// at the end of the framing.
        #[test]
        fn chunked_round_trip_at_any_cut(
            payload in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
            sizes in proptest::collection::vec(1usize..40, 1..20),
            cut in 0usize..400,
            upper in proptest::prelude::any::<bool>(),
        ) {
            let mut wire = Vec::new();
            let mut rest = &payload[..];
            let mut k = 0;
            while !rest.is_empty() {
                let n = sizes[k % sizes.len()].min(rest.len());
                let size = if upper { format!("{n:X}") } else { format!("{n:x}") };
                wire.extend_from_slice(size.as_bytes());
                wire.extend_from_slice(b"\r\n");
                wire.extend_from_slice(&rest[..n]);
                wire.extend_from_slice(b"\r\n");
                rest = &rest[n..];
                k += 1;
            }
            wire.extend_from_slice(b"0\r\n\r\n");
            let body_len = wire.len();
            wire.extend_from_slice(b"GET / HTTP/1.1\r\n");
            let (got, n) = dechunk(&wire, &[cut]).unwrap();
            proptest::prop_assert_eq!(got, payload);
            proptest::prop_assert_eq!(n, body_len);
        }
    }
}
