//! Incremental Server-Sent Events splitter over arbitrary byte chunks.
//!
//! Feed it the body chunks as they arrive; it yields one [`SseEvent`] per complete event (a block
//! of lines ended by a blank line), joining multi-line `data:` fields with `\n` as the SSE spec
//! says, accepting LF, CRLF and CR line ends, and ignoring comments (`:` lines). It holds at most
//! one incomplete event in memory, capped by `max_event_bytes` (an over-long event is reported as
//! [`SseError::EventTooLarge`] and skipped, never buffered without bound). It does not parse the
//! JSON payloads (see [`crate::wire::openai`]) and does no I/O. [`EventEnds`] says where the same
//! events end without keeping any of them.

/// One complete SSE event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` field, if any.
    pub(crate) event: Option<String>,
    /// The joined `data:` lines.
    pub data: String,
}

impl SseEvent {
    /// `data: [DONE]`, the OpenAI end-of-stream marker.
    pub fn is_done(&self) -> bool {
        self.data.trim() == "[DONE]"
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// An event grew beyond the cap before its terminating blank line; it was dropped.
    #[error("an SSE event grew beyond {0} bytes before its end")]
    EventTooLarge(usize),
    /// The payload was not UTF-8; the event was dropped.
    #[error("an SSE event's data is not UTF-8")]
    NotUtf8,
}

/// The splitter state.
#[derive(Debug)]
pub struct SseParser {
    line: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
    event: Option<String>,
    last_was_cr: bool,
    max_event_bytes: usize,
    overflow: bool,
}

impl Default for SseParser {
    fn default() -> Self {
        Self::new(16 << 20)
    }
}

impl SseParser {
    pub(crate) fn new(max_event_bytes: usize) -> Self {
        SseParser {
            line: Vec::new(),
            data: Vec::new(),
            has_data: false,
            event: None,
            last_was_cr: false,
            max_event_bytes,
            overflow: false,
        }
    }

    /// Feeds a chunk; calls `on_event` for every event completed by it.
    pub fn feed(&mut self, chunk: &[u8], mut on_event: impl FnMut(Result<SseEvent, SseError>)) {
        self.feed_raw(chunk, |e| on_event(e.and_then(RawEvent::to_owned)));
    }

    /// Ends the stream: an event left without its blank line is returned (servers that close
    /// right after the last `data:` line are common).
    pub(crate) fn finish(&mut self) -> Option<Result<SseEvent, SseError>> {
        let mut out = None;
        self.finish_raw(|e| out = Some(e.and_then(RawEvent::to_owned)));
        out
    }

    /// [`SseParser::feed`] without copies: each event's data is lent to `on_event` as bytes
    /// (not checked for UTF-8; the JSON layer does that), from a buffer reused across events,
    /// and a line that lies whole in `chunk` is read in place.
    pub(crate) fn feed_raw(
        &mut self,
        chunk: &[u8],
        mut on_event: impl FnMut(Result<RawEvent<'_>, SseError>),
    ) {
        let mut start = 0;
        let mut i = 0;
        while i < chunk.len() {
            let j = memchr::memchr2(b'\n', b'\r', &chunk[i..]).map_or(chunk.len(), |k| i + k);
            if j == chunk.len() {
                self.last_was_cr = false;
                break;
            }
            let rel = j - i;
            if rel > 0 {
                self.last_was_cr = false;
            }
            let b = chunk[j];
            if b == b'\n' && self.last_was_cr && start == j {
                // second half of a CRLF
                self.last_was_cr = false;
            } else {
                self.line_end(&chunk[start..j], &mut on_event);
                self.last_was_cr = b == b'\r';
            }
            start = j + 1;
            i = j + 1;
        }
        self.push_line_bytes(&chunk[start..]);
    }

    /// [`SseParser::finish`] without copies.
    pub(crate) fn finish_raw(&mut self, mut on_event: impl FnMut(Result<RawEvent<'_>, SseError>)) {
        let mut emitted = false;
        if !self.line.is_empty() {
            self.line_end(&[], &mut |e| {
                emitted = true;
                on_event(e)
            });
        }
        if !emitted {
            self.line_end(&[], &mut on_event);
        }
    }

    fn push_line_bytes(&mut self, bytes: &[u8]) {
        if self.overflow {
            return;
        }
        if self.line.len() + self.data.len() + bytes.len() > self.max_event_bytes {
            self.overflow = true;
            self.line.clear();
            self.data.clear();
            return;
        }
        self.line.extend_from_slice(bytes);
    }

    /// A line ends: its bytes are what is buffered followed by `tail`.
    fn line_end(&mut self, tail: &[u8], on_event: &mut impl FnMut(Result<RawEvent<'_>, SseError>)) {
        if !self.overflow && self.line.len() + self.data.len() + tail.len() > self.max_event_bytes {
            self.overflow = true;
            self.line.clear();
            self.data.clear();
        }
        if self.overflow {
            // An over-long event was dropped: the next line end reports it.
            self.overflow = false;
            on_event(Err(SseError::EventTooLarge(self.max_event_bytes)));
            self.reset_event();
            return;
        }
        if self.line.is_empty() {
            self.process(tail, on_event);
        } else {
            self.line.extend_from_slice(tail);
            let line = std::mem::take(&mut self.line);
            self.process(&line, on_event);
            self.line = line;
            self.line.clear();
        }
    }

    fn reset_event(&mut self) {
        self.has_data = false;
        self.event = None;
        self.data.clear();
    }

    fn process(&mut self, line: &[u8], on_event: &mut impl FnMut(Result<RawEvent<'_>, SseError>)) {
        if line.is_empty() {
            // Blank line: dispatch.
            if self.has_data {
                on_event(Ok(RawEvent {
                    event: self.event.as_deref(),
                    data: &self.data,
                }));
            }
            self.reset_event();
            return;
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(0) => return, // comment
            Some(p) => {
                let v = &line[p + 1..];
                (&line[..p], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
            b"event" => self.event = Some(String::from_utf8_lossy(value).into_owned()),
            _ => {}
        }
    }
}

/// One complete event, borrowed from the parser ([`SseParser::feed_raw`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RawEvent<'a> {
    pub(crate) event: Option<&'a str>,
    /// The joined `data:` lines, as sent (not checked for UTF-8).
    pub(crate) data: &'a [u8],
}

impl RawEvent<'_> {
    /// `data: [DONE]`, the OpenAI end-of-stream marker.
    pub(crate) fn is_done(&self) -> bool {
        self.data.trim_ascii() == b"[DONE]"
    }

    fn to_owned(self) -> Result<SseEvent, SseError> {
        match std::str::from_utf8(self.data) {
            Ok(d) => Ok(SseEvent {
                event: self.event.map(str::to_string),
                data: d.to_string(),
            }),
            Err(_) => Err(SseError::NotUtf8),
        }
    }
}

/// Where the events of a stream end, without keeping them: each event [`SseParser`] would
/// dispatch, except `[DONE]`, is told at the byte that completes it. Its state is a few bytes
/// (where in a line it is, whether the event has data, whether that data is `[DONE]` so far),
/// whatever the stream; the recorder counts a body past its capture cap with it.
#[derive(Debug, Clone, Default)]
pub(crate) struct EventEnds {
    last_was_cr: bool,
    line: Line,
    has_data: bool,
    /// How much of `[DONE]` the event's data matches (see [`done_step`]).
    done: u8,
}

/// Where a line is, for [`EventEnds`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Line {
    /// Nothing of the line yet.
    #[default]
    Start,
    /// The first `n` bytes of `data` (1 to 4).
    Field(u8),
    /// Right after `data:` (one space is skipped).
    ValueStart,
    /// In a `data` value.
    Value,
    /// A comment or another field: the rest of the line does not matter.
    Other,
}

const DONE: &[u8; 6] = b"[DONE]";
/// [`done_step`]'s state once the data is `[DONE]` (ASCII whitespace around it), and once it
/// cannot be.
const DONE_MATCHED: u8 = 6;
const DONE_FAILED: u8 = 7;

/// The next state of the `[DONE]` match after byte `b`: 0 while only whitespace came, then the
/// number of bytes of `[DONE]` matched, [`DONE_MATCHED`] (whitespace may follow) or
/// [`DONE_FAILED`].
fn done_step(s: u8, b: u8) -> u8 {
    match s {
        0 if b.is_ascii_whitespace() => 0,
        DONE_MATCHED if b.is_ascii_whitespace() => DONE_MATCHED,
        0..=5 if b == DONE[s as usize] => s + 1,
        _ => DONE_FAILED,
    }
}

impl EventEnds {
    /// Feeds a chunk; calls `on_end(i)` for every event completed in it, `i` being the index
    /// just past the byte that completed it.
    pub(crate) fn feed(&mut self, chunk: &[u8], mut on_end: impl FnMut(usize)) {
        let mut i = 0;
        while i < chunk.len() {
            let j = memchr::memchr2(b'\n', b'\r', &chunk[i..]).map_or(chunk.len(), |k| i + k);
            if j > i {
                self.last_was_cr = false;
                self.line_bytes(&chunk[i..j]);
            }
            let Some(&b) = chunk.get(j) else { break };
            // The LF of a CRLF ends nothing more.
            if !(b == b'\n' && self.last_was_cr) && self.line_end() {
                on_end(j + 1);
            }
            self.last_was_cr = b == b'\r';
            i = j + 1;
        }
    }

    /// The stream ended: whether an event left without its blank line counts (as
    /// [`SseParser::finish`] returns it).
    pub(crate) fn finish(&mut self) -> bool {
        if self.line != Line::Start && self.line_end() {
            return true;
        }
        self.line_end()
    }

    /// Bytes of a line (no line end among them).
    fn line_bytes(&mut self, mut seg: &[u8]) {
        while let Some((&b, rest)) = seg.split_first() {
            match self.line {
                Line::Start | Line::Field(_) => {
                    let n = match self.line {
                        Line::Field(n) => n,
                        _ => 0,
                    };
                    self.line = match (n, b) {
                        (4, b':') => {
                            self.data_field();
                            Line::ValueStart
                        }
                        (0..=3, b) if b == b"data"[n as usize] => Line::Field(n + 1),
                        _ => Line::Other,
                    };
                    seg = rest;
                }
                Line::ValueStart => {
                    self.line = Line::Value;
                    if b == b' ' {
                        seg = rest;
                    }
                }
                Line::Value => {
                    for &b in seg {
                        self.done = done_step(self.done, b);
                        if self.done == DONE_FAILED {
                            break;
                        }
                    }
                    return;
                }
                Line::Other => return,
            }
        }
    }

    /// A line ends; returns whether it was the blank line that completes a counted event.
    fn line_end(&mut self) -> bool {
        let line = std::mem::take(&mut self.line);
        match line {
            Line::Start => {
                let counted = self.has_data && self.done != DONE_MATCHED;
                self.has_data = false;
                self.done = 0;
                counted
            }
            // `data` alone: a data field with an empty value.
            Line::Field(4) => {
                self.data_field();
                false
            }
            _ => false,
        }
    }

    /// A `data` field starts: joined to the previous one with a line feed.
    fn data_field(&mut self) {
        if self.has_data {
            self.done = done_step(self.done, b'\n');
        }
        self.has_data = true;
    }
}

/// Where the last event that a stream's first bytes hold ends: just past the first line end
/// of the last blank line in `bytes` (so the bytes from there on are the start of an event not
/// yet complete, and an [`EventEnds`] fed them alone is where one fed all of `bytes` would be);
/// 0 when there is none.
pub(crate) fn after_last_blank_line(bytes: &[u8]) -> usize {
    let mut end = bytes.len();
    while let Some(i) = memchr::memrchr2(b'\n', b'\r', &bytes[..end]) {
        // Two line ends in a row (a CRLF is one): the second starts a blank line.
        if i > 0
            && matches!(
                (bytes[i - 1], bytes[i]),
                (b'\n', b'\n' | b'\r') | (b'\r', b'\r')
            )
        {
            return i;
        }
        end = i;
    }
    0
}

/// Whether the last event of an SSE body is `data: [DONE]`, its blank line included and only
/// line ends after it: the stream said it is over. Looks at the last event alone.
pub(crate) fn ends_with_done(body: &[u8]) -> bool {
    let end = after_last_blank_line(body);
    if end == 0 || !body[end..].iter().all(|b| matches!(b, b'\r' | b'\n')) {
        return false;
    }
    let start = after_last_blank_line(&body[..end - 1]);
    let mut last = None;
    SseParser::new(64).feed(&body[start..], |e| last = Some(e));
    matches!(last, Some(Ok(e)) if e.is_done())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_ends_with_done_only_when_its_last_event_is_done() {
        let ev = "data: {\"choices\":[]}\n\n";
        assert!(ends_with_done(format!("{ev}data: [DONE]\n\n").as_bytes()));
        assert!(ends_with_done(b"data:[DONE]\r\n\r\n"));
        assert!(ends_with_done(
            format!("{ev}\r\ndata: [DONE]\r\n\r\n").as_bytes()
        ));
        // Not yet ended, another event after it, or no [DONE] at all.
        assert!(!ends_with_done(format!("{ev}data: [DONE]\n").as_bytes()));
        assert!(!ends_with_done(format!("data: [DONE]\n\n{ev}").as_bytes()));
        assert!(!ends_with_done(b"data: [DONE]\n\ndata: x"));
        assert!(!ends_with_done(ev.as_bytes()));
        assert!(!ends_with_done(b"data: [DONE] and more\n\n"));
        assert!(!ends_with_done(b""));
    }

    fn all(chunks: &[&[u8]]) -> Vec<Result<SseEvent, SseError>> {
        let mut p = SseParser::new(64);
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c, |e| out.push(e));
        }
        if let Some(e) = p.finish() {
            out.push(e);
        }
        out
    }

    fn data(s: &str) -> Result<SseEvent, SseError> {
        Ok(SseEvent {
            event: None,
            data: s.into(),
        })
    }

    #[test]
    fn errors_read_as_words() {
        let e = SseError::EventTooLarge(16 << 20).to_string();
        assert_eq!(e, "an SSE event grew beyond 16777216 bytes before its end");
    }

    #[test]
    fn splits_at_any_chunk_boundary() {
        let stream = b"data: {\"a\":1}\n\ndata: x\r\n\r\n: comment\n\ndata: [DONE]\n\n";
        let want = vec![data("{\"a\":1}"), data("x"), data("[DONE]")];
        for cut in 0..stream.len() {
            assert_eq!(all(&[&stream[..cut], &stream[cut..]]), want, "cut {cut}");
        }
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(all(&bytes), want);
    }

    #[test]
    fn multi_line_data_and_event_field() {
        let got = all(&[b"event: e\ndata: a\ndata: b\n\n"]);
        assert_eq!(
            got,
            vec![Ok(SseEvent {
                event: Some("e".into()),
                data: "a\nb".into()
            })]
        );
    }

    #[test]
    fn unterminated_last_event_is_returned_by_finish() {
        assert_eq!(all(&[b"data: tail"]), vec![data("tail")]);
    }

    #[test]
    fn oversized_event_is_an_error_and_parsing_continues() {
        let mut big = b"data: ".to_vec();
        big.extend(vec![b'x'; 100]);
        big.extend(b"\n\ndata: ok\n\n");
        assert_eq!(
            all(&[&big]),
            vec![Err(SseError::EventTooLarge(64)), data("ok")]
        );
    }

    #[test]
    fn real_vllm_stream() {
        let s = include_bytes!("../../fixtures/vllm/completions_tokenids_stream.sse");
        let evs = all(&[s]);
        assert_eq!(evs.len(), 6);
        assert!(evs.last().unwrap().as_ref().unwrap().is_done());
    }

    /// Where the parser completes each event other than `[DONE]` (index past the completing
    /// byte, fed byte by byte), and whether `finish` returns one more.
    fn parser_ends(stream: &[u8]) -> (Vec<usize>, bool) {
        let mut p = SseParser::new(1 << 20);
        let mut ends = Vec::new();
        for (k, b) in stream.iter().enumerate() {
            p.feed_raw(std::slice::from_ref(b), |e| {
                if e.is_ok_and(|e| !e.is_done()) {
                    ends.push(k + 1);
                }
            });
        }
        let mut last = false;
        p.finish_raw(|e| last = e.is_ok_and(|e| !e.is_done()));
        (ends, last)
    }

    fn counter_ends(chunks: &[&[u8]]) -> (Vec<usize>, bool) {
        let mut c = EventEnds::default();
        let (mut ends, mut base) = (Vec::new(), 0);
        for ch in chunks {
            c.feed(ch, |i| ends.push(base + i));
            base += ch.len();
        }
        (ends, c.finish())
    }

    #[test]
    fn event_ends_are_the_parsers_events_without_done() {
        let s = b"data: {\"a\":1}\n\ndata: x\r\n\r\n: c\n\nid: 3\n\ndata\n\ndata:\ndata:  [DONE] \n\ndata: [DONE]\r\rdata: tail";
        let want = parser_ends(s);
        assert_eq!(want.0.len(), 3, "{want:?}");
        assert!(want.1);
        for cut in 0..s.len() {
            assert_eq!(counter_ends(&[&s[..cut], &s[cut..]]), want, "cut {cut}");
        }
        let real = include_bytes!("../../fixtures/vllm/chat_stream.sse");
        assert_eq!(counter_ends(&[real]), parser_ends(real));
    }

    proptest::proptest! {
        /// On any stream of SSE-like lines cut anywhere, the counter ends events where the
        /// parser does, and starting it after the last blank line of a prefix changes nothing
        /// it says of the rest.
        #[test]
        fn event_ends_match_the_parser(
            parts in proptest::collection::vec(proptest::sample::select(vec![
                &b"data: "[..], b"data:", b"data", b"dat", b"[DONE]", b" [DONE]", b"x", b"{}",
                b":", b"event: e", b"\n", b"\r", b"\r\n", b" ", b"\t",
            ]), 0..40),
            cut in 0usize..400,
        ) {
            let s: Vec<u8> = parts.concat();
            let cut = cut.min(s.len());
            let want = parser_ends(&s);
            proptest::prop_assert_eq!(counter_ends(&[&s[..cut], &s[cut..]]), want.clone());
            let from = after_last_blank_line(&s[..cut]);
            let mut c = EventEnds::default();
            c.feed(&s[from..cut], |i| panic!("an event ends at {} before the cut", from + i));
            let mut ends = Vec::new();
            c.feed(&s[cut..], |i| ends.push(cut + i));
            let later: Vec<usize> = want.0.iter().copied().filter(|&e| e > cut).collect();
            proptest::prop_assert_eq!((ends, c.finish()), (later, want.1));
        }
    }
}
