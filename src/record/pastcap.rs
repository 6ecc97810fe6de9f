//! An SSE response body past the capture cap (`--capture-max`), noted without keeping it: where
//! each event ends ([`crate::wire::sse::EventEnds`], timed by the read that completed it, as a
//! captured event is) and the bytes of the last complete event, which the writer reads for the
//! stream's usage and server timings. Bounded: 4 bytes of timing per event, at most as many
//! bytes as the cap (then the count stops, said in the record), and [`TAIL_MAX`] bytes twice.
//! Noted on the forwarding path: a byte scan and a copy of the last event, no parsing.

use crate::wire::sse::{after_last_blank_line, EventEnds};
use std::time::Duration;

/// The last event's bytes are kept up to this size (usage and timings fit many times over).
pub(crate) const TAIL_MAX: usize = 64 << 10;

/// What is noted of an SSE body once it passed the capture cap.
#[derive(Debug)]
pub(crate) struct Uncaptured {
    ends: EventEnds,
    count: Count,
}

/// The counted events and the bytes kept of them.
#[derive(Debug)]
struct Count {
    /// Arrival (µs after the exchange's) of the read the cap was passed in.
    start_us: u64,
    /// Where each event ended, µs after the previous one (the first after `start_us`); the last
    /// counted event is not among them but in `last_end_us`.
    gaps: Vec<u32>,
    /// Where the last gap ends (`start_us` and every gap).
    timed_us: u64,
    /// Most gaps kept; later events stop the count.
    max_events: usize,
    stopped: bool,
    /// Where the last counted event ended (µs after arrival), if any did.
    last_end_us: Option<u64>,
    /// Arrival of the latest read.
    read_us: u64,
    /// Bytes since the last counted event ended (the event in progress), unless over
    /// [`TAIL_MAX`].
    cur: Tail,
    /// The last counted event's bytes (and any uncounted blocks before it), unless over.
    last: Tail,
}

impl Count {
    /// An event ended at `at_us`: the one before it is timed (while the bound allows), and its
    /// bytes become the last event's.
    fn event_ended(&mut self, at_us: u64) {
        if let Some(prev) = self.last_end_us {
            if self.gaps.len() < self.max_events {
                let gap = prev.saturating_sub(self.timed_us);
                let gap = u32::try_from(gap).unwrap_or(u32::MAX);
                self.gaps.push(gap);
                self.timed_us += u64::from(gap);
            } else {
                self.stopped = true;
            }
        }
        self.last_end_us = Some(at_us);
        std::mem::swap(&mut self.cur, &mut self.last);
        self.cur.clear();
    }
}

/// Bytes kept up to [`TAIL_MAX`]; past it, nothing.
#[derive(Debug, Default)]
struct Tail {
    bytes: Vec<u8>,
    over: bool,
}

impl Tail {
    fn push(&mut self, b: &[u8]) {
        if self.over {
            return;
        }
        if self.bytes.len() + b.len() > TAIL_MAX {
            self.over = true;
            self.bytes = Vec::new();
        } else {
            self.bytes.extend_from_slice(b);
        }
    }

    fn get(&self) -> Option<&[u8]> {
        (!self.over).then_some(self.bytes.as_slice())
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.over = false;
    }
}

fn us(d: Duration) -> u64 {
    d.as_micros().min(u128::from(u64::MAX)) as u64
}

/// The events past the cap, as the record takes them.
#[derive(Debug, PartialEq)]
pub(crate) struct Counted<'a> {
    /// Where each event but the last ended, µs after arrival.
    pub(crate) ends_us: Vec<u64>,
    /// The last event: where it ended and its bytes, when they were kept.
    pub(crate) last: Option<(u64, Option<&'a [u8]>)>,
    /// More events ended than are counted.
    pub(crate) stopped: bool,
}

impl Uncaptured {
    /// Starts past the cap, passed in a read that arrived at `at`: `captured` is the body's
    /// bytes before it (the end of an event may be among them); at most `max_events` timed.
    pub(crate) fn new(captured: &[u8], at: Duration, max_events: usize) -> Self {
        let from = after_last_blank_line(captured);
        let mut ends = EventEnds::default();
        // No event ends after the last blank line: these bytes only set where `ends` is.
        ends.feed(&captured[from..], |_| {});
        let mut cur = Tail::default();
        cur.push(&captured[from..]);
        let count = Count {
            start_us: us(at),
            gaps: Vec::new(),
            timed_us: us(at),
            max_events,
            stopped: false,
            last_end_us: None,
            read_us: us(at),
            cur,
            last: Tail::default(),
        };
        Uncaptured { ends, count }
    }

    /// Notes a read of body bytes that arrived at `at`.
    pub(crate) fn note(&mut self, at: Duration, data: &[u8]) {
        let at_us = us(at);
        let count = &mut self.count;
        count.read_us = at_us;
        let mut from = 0;
        self.ends.feed(data, |i| {
            count.cur.push(&data[from..i]);
            from = i;
            count.event_ended(at_us);
        });
        count.cur.push(&data[from..]);
    }

    /// The events past the cap, the stream having ended (an event left without its blank line
    /// counts, as the parser returns it).
    pub(crate) fn counted(&self) -> Counted<'_> {
        let c = &self.count;
        let mut ends_us = Vec::with_capacity(c.gaps.len() + 1);
        let mut t = c.start_us;
        for &g in &c.gaps {
            t += u64::from(g);
            ends_us.push(t);
        }
        let mut stopped = c.stopped;
        let unfinished = self.ends.clone().finish();
        let last = match (unfinished, c.last_end_us) {
            (true, prev) => {
                if let Some(prev) = prev {
                    match ends_us.len() < c.max_events {
                        true => ends_us.push(prev),
                        false => stopped = true,
                    }
                }
                Some((c.read_us, c.cur.get()))
            }
            (false, Some(end)) => Some((end, c.last.get())),
            (false, None) => None,
        };
        Counted {
            ends_us,
            last,
            stopped,
        }
    }

    /// Bytes held (what it costs in the writer queue).
    pub(crate) fn held_bytes(&self) -> usize {
        let c = &self.count;
        c.gaps.capacity() * 4 + c.cur.bytes.capacity() + c.last.bytes.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn events_past_the_cap_are_timed_by_their_reads_and_the_last_is_kept() {
        // The cap fell inside the second event.
        let mut u = Uncaptured::new(b"data: 1\n\ndata: 2", ms(5), 100);
        u.note(ms(6), b"2\n\ndata: 3\n\ndata: ");
        u.note(ms(9), b"{\"usage\":1}\n\ndata: [DONE]\n\n");
        let c = u.counted();
        assert_eq!(c.ends_us, [6000, 6000]);
        assert_eq!(c.last, Some((9000, Some(&b"data: {\"usage\":1}\n\n"[..]))));
        assert!(!c.stopped);
    }

    #[test]
    fn an_unfinished_last_event_counts_and_the_bound_stops_the_count() {
        let mut u = Uncaptured::new(b"", ms(1), 2);
        u.note(ms(2), b"data: a\n\ndata: b\n\ndata: c\n\n");
        u.note(ms(3), b"data: d\n\ndata: tail");
        let c = u.counted();
        assert_eq!(c.ends_us, [2000, 2000]);
        assert_eq!(c.last, Some((3000, Some(&b"data: tail"[..]))));
        assert!(c.stopped, "c and d are not counted");
    }

    #[test]
    fn a_last_event_over_the_tail_bound_is_counted_unread() {
        let mut u = Uncaptured::new(b"", ms(1), 10);
        let mut big = b"data: ".to_vec();
        big.resize(TAIL_MAX + 10, b'x');
        big.extend_from_slice(b"\n\n");
        u.note(ms(2), &big);
        assert_eq!(u.counted().last, Some((2000, None)));
        assert!(u.held_bytes() < 2 * TAIL_MAX);
    }
}
