//! Incremental Server-Sent Events splitter over arbitrary byte chunks.
//!
//! Feed it the body chunks as they arrive; it yields one [`SseEvent`] per complete event (a block
//! of lines ended by a blank line), joining multi-line `data:` fields with `\n` as the SSE spec
//! says, accepting LF, CRLF and CR line ends, and ignoring comments (`:` lines). It holds at most
//! one incomplete event in memory, capped by `max_event_bytes` (an over-long event is reported as
//! [`SseError::EventTooLarge`] and skipped, never buffered without bound). It does not parse the
//! JSON payloads (see [`crate::openai`]) and does no I/O.

/// One complete SSE event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` field, if any.
    pub event: Option<String>,
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
    pub fn new(max_event_bytes: usize) -> Self {
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
    pub fn finish(&mut self) -> Option<Result<SseEvent, SseError>> {
        let mut out = None;
        self.finish_raw(|e| out = Some(e.and_then(RawEvent::to_owned)));
        out
    }

    /// [`SseParser::feed`] without copies: each event's data is lent to `on_event` as bytes
    /// (not checked for UTF-8; the JSON layer does that), from a buffer reused across events,
    /// and a line that lies whole in `chunk` is read in place.
    pub fn feed_raw(
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
    pub fn finish_raw(&mut self, mut on_event: impl FnMut(Result<RawEvent<'_>, SseError>)) {
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
pub struct RawEvent<'a> {
    pub event: Option<&'a str>,
    /// The joined `data:` lines, as sent (not checked for UTF-8).
    pub data: &'a [u8],
}

impl RawEvent<'_> {
    /// `data: [DONE]`, the OpenAI end-of-stream marker.
    pub fn is_done(&self) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let s = include_bytes!("../fixtures/vllm/completions_tokenids_stream.sse");
        let evs = all(&[s]);
        assert_eq!(evs.len(), 6);
        assert!(evs.last().unwrap().as_ref().unwrap().is_done());
    }
}
