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
    let raw = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
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
    let h = parse_response_head(
        b"HTTP/1.1 429 Too Many\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
        false,
    )
    .unwrap()
    .unwrap();
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

fn body(framing: Framing, wire: &[u8], cut: usize) -> (Vec<u8>, usize, bool, Option<&'static str>) {
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
