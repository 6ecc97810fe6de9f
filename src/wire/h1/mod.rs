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

mod chunked;
pub use chunked::*;

#[cfg(test)]
mod tests;
