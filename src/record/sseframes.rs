//! Splits the captured frames of an SSE response into events for the writer thread, reading
//! the common shape in place: when the splitter holds nothing (every earlier frame ended with
//! a blank line) and a frame is a run of `data: <payload>\n\n` blocks (payload without CR or
//! LF), each payload is lent straight from the frame, with no copy into the splitter's buffer
//! and no per-line field parsing. At the first byte that does not fit that shape, the rest of the
//! frame goes to [`crate::sse::SseParser::feed_raw`], which at that point holds nothing either,
//! so the events and the frame each completes at are exactly the parser's (tested on every cut
//! of real vLLM streams and on property-generated SSE). It does not parse JSON.

use crate::sse::{RawEvent, SseError, SseParser};

/// Events of one response, frame by frame.
#[derive(Debug)]
pub struct FrameSplitter {
    parser: SseParser,
    /// The parser holds no partial line or event (the last frame fed to it ended with `\n\n`).
    idle: bool,
    max_event_bytes: usize,
}

impl FrameSplitter {
    pub fn new(max_event_bytes: usize) -> Self {
        FrameSplitter {
            parser: SseParser::new(max_event_bytes),
            idle: true,
            max_event_bytes,
        }
    }

    /// Feeds one frame; calls `on_event` for every event it completes.
    pub fn feed(&mut self, frame: &[u8], mut on_event: impl FnMut(Result<RawEvent<'_>, SseError>)) {
        let mut i = 0;
        if self.idle {
            while frame[i..].starts_with(b"data: ") {
                let start = i + 6;
                let end = memchr::memchr2(b'\n', b'\r', &frame[start..])
                    .map_or(frame.len(), |k| start + k);
                // The parser's size rule for a line read in place: the whole line counts.
                if frame.get(end) != Some(&b'\n')
                    || frame.get(end + 1) != Some(&b'\n')
                    || end - i > self.max_event_bytes
                {
                    break;
                }
                on_event(Ok(RawEvent {
                    event: None,
                    data: &frame[start..end],
                }));
                i = end + 2;
            }
            if i == frame.len() {
                return;
            }
        }
        let rest = &frame[i..];
        self.parser.feed_raw(rest, &mut on_event);
        self.idle = rest.ends_with(b"\n\n");
    }

    /// Ends the response (an event left without its blank line is delivered).
    pub fn finish(&mut self, on_event: impl FnMut(Result<RawEvent<'_>, SseError>)) {
        self.parser.finish_raw(on_event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    type Got = Vec<(usize, Result<(Option<String>, Vec<u8>), SseError>)>;

    fn own(e: Result<RawEvent<'_>, SseError>) -> Result<(Option<String>, Vec<u8>), SseError> {
        e.map(|e| (e.event.map(str::to_string), e.data.to_vec()))
    }

    /// (frame index completing it, event) for both splitters.
    fn both(frames: &[&[u8]]) -> (Got, Got) {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let mut fs = FrameSplitter::new(64);
        let mut p = SseParser::new(64);
        for (k, f) in frames.iter().enumerate() {
            fs.feed(f, |e| a.push((k, own(e))));
            p.feed_raw(f, |e| b.push((k, own(e))));
        }
        fs.finish(|e| a.push((frames.len(), own(e))));
        p.finish_raw(|e| b.push((frames.len(), own(e))));
        (a, b)
    }

    #[test]
    fn agrees_with_the_parser_at_every_cut_of_real_streams() {
        for s in [
            &include_bytes!("../../fixtures/vllm/completions_tokenids_stream.sse")[..],
            include_bytes!("../../fixtures/vllm/chat_stream.sse"),
            include_bytes!("../../fixtures/vllm/return_token_ids_stream.sse"),
        ] {
            let mut fs = FrameSplitter::new(4 << 20);
            let mut n = 0;
            fs.feed(s, |_| n += 1);
            assert!(n >= 3, "{n}");
            for cut in 0..s.len() {
                for cut2 in [cut, (cut + 37).min(s.len()), (cut + 300).min(s.len())] {
                    let frames = [&s[..cut], &s[cut..cut2], &s[cut2..]];
                    let (a, b) = both(&frames);
                    assert_eq!(a, b, "cuts {cut} {cut2}");
                }
            }
        }
    }

    #[test]
    fn other_shapes_go_through_the_parser() {
        let cases: [&[&[u8]]; 6] = [
            &[b"data: a\n\ndata: b\r\n\r\n", b"data: c\n\n"],
            &[b"data: a\n\n: comment\n\ndata: b\n\n"],
            &[b"event: e\ndata: a\n\n", b"data: b\n\n"],
            &[b"data: a\ndata: b\n\n", b"data:c\n\n"],
            &[b"data: a\n", b"\ndata: b\n\n", b"data: tail"],
            &[b"data: 0123456789012345678901234567890123456789012345678901234567890123456789\n\ndata: ok\n\n"],
        ];
        for frames in cases {
            let (a, b) = both(frames);
            assert_eq!(a, b, "{frames:?}");
        }
    }

    proptest! {
        #[test]
        fn agrees_with_the_parser_on_generated_sse(
            pieces in proptest::collection::vec(proptest::sample::select(vec![
                &b"data: "[..], b"data:", b"\n", b"\r", b"\r\n", b"\n\n", b": c", b"event: e",
                b"x", b"{\"a\":1}", b"[DONE]",
                b"0123456789012345678901234567890123456789012345678901234567890123456789",
            ]), 0..40),
            cuts in proptest::collection::vec(0usize..200, 0..5),
        ) {
            let s: Vec<u8> = pieces.concat();
            let s = &s[..];
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(s.len())).collect();
            cuts.sort_unstable();
            let mut frames = Vec::new();
            let mut from = 0;
            for c in cuts {
                frames.push(&s[from..c]);
                from = c;
            }
            frames.push(&s[from..]);
            let (a, b) = both(&frames);
            prop_assert_eq!(a, b);
        }
    }
}
