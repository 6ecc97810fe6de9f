use super::*;

/// What the reader found besides records.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReadReport {
    /// Complete frames decoded (header frame included).
    pub frames_ok: u64,
    pub records: u64,
    /// Byte offset where a truncated (incomplete) last frame starts, if the file was cut.
    pub truncated_at: Option<u64>,
    /// Bytes after the last complete frame that could not be used.
    pub(crate) bytes_lost: u64,
    /// Corrupt frames: (byte offset, what was wrong).
    pub corrupt: Vec<(u64, String)>,
    /// Records dropped by the writer, as its last frame header said.
    pub dropped_by_writer: u64,
    /// Records that came after a later arrival in the file (frames are written in completion
    /// order); the reader returns them in arrival order.
    pub reordered: u64,
}

impl ReadReport {
    /// True when the whole file was read without loss.
    pub fn is_clean(&self) -> bool {
        self.truncated_at.is_none() && self.corrupt.is_empty()
    }

    /// One line for humans, e.g. "recovered 1200 records from 3 complete frames; file cut at byte 4521".
    pub fn summary(&self) -> String {
        let mut s = format!(
            "recovered {} records from {} complete frames",
            self.records, self.frames_ok
        );
        if let Some(off) = self.truncated_at {
            s.push_str(&format!(
                "; file cut at byte {off} ({} bytes of an incomplete frame lost)",
                self.bytes_lost
            ));
        }
        for (off, msg) in &self.corrupt {
            s.push_str(&format!("; corrupt frame at byte {off}: {msg}"));
        }
        s
    }
}

/// Does `data` start like a native trace (a zstd frame whose content starts with our header)?
pub fn sniff(data: &[u8]) -> bool {
    if !data.starts_with(&ZSTD_MAGIC) {
        return false;
    }
    let Ok(first) = first_frame(data) else {
        return false;
    };
    first
        .windows(MAGIC.len())
        .take(64)
        .any(|w| w == MAGIC.as_bytes())
}

pub(super) fn first_frame(data: &[u8]) -> Result<Vec<u8>, String> {
    let len = zstd::zstd_safe::find_frame_compressed_size(data).map_err(|_| "no zstd frame")?;
    decompress_frame(&data[..len])
}

pub(super) fn decompress_frame(frame: &[u8]) -> Result<Vec<u8>, String> {
    let cap = match zstd::zstd_safe::get_frame_content_size(frame) {
        Ok(Some(n)) if n <= MAX_FRAME_CONTENT => n as usize,
        Ok(Some(n)) => return Err(format!("frame declares {n} bytes, over the limit")),
        _ => return Err("frame has no content size".into()),
    };
    zstd::bulk::decompress(frame, cap).map_err(|e| format!("zstd: {e}"))
}

/// Reads a whole native trace from bytes. `path` only names the source in errors.
///
/// Errors only when no header can be read or the version is newer; damage after the header is
/// reported in the [`ReadReport`] and the good records are returned.
pub fn read_bytes(path: &str, data: &[u8]) -> Result<(Trace, ReadReport), TraceError> {
    read_bytes_as(path, data, None)
}

/// [`read_bytes`], read with `block_size` tokens per hash id instead of the header's when given
/// (records are bounded by it).
pub(crate) fn read_bytes_as(
    path: &str,
    data: &[u8],
    block_size: Option<u32>,
) -> Result<(Trace, ReadReport), TraceError> {
    let mut scan = FrameScanner::new(data);
    let header = read_header(path, &mut scan, block_size)?;
    let mut report = ReadReport {
        frames_ok: 1,
        ..Default::default()
    };
    let (mut requests, mut frame_records) = (Vec::new(), Vec::new());
    while let Some(item) = scan.next_item().map_err(|e| io_err(path, e))? {
        if let Scanned::Frame(pos, frame) = item {
            match decode_frame(&frame, &header, &mut frame_records) {
                Ok(dropped) => report.good_frame(dropped),
                Err(msg) => report.corrupt.push((pos, msg)),
            }
            requests.extend(frame_records.drain(..).map(Unexpanded::expand));
        } else {
            report.note(item);
        }
    }
    report.records = requests.len() as u64;
    let mut trace = Trace { header, requests };
    report.reordered = trace.sort_by_arrival();
    Ok((trace, report))
}

pub(super) fn io_err(path: &str, source: std::io::Error) -> TraceError {
    TraceError::Io {
        path: path.to_string(),
        source,
    }
}

/// The header frame, checked: magic, version, fields; its block size replaced by `block_size`
/// when given.
pub(super) fn read_header<R: Read>(
    path: &str,
    scan: &mut FrameScanner<R>,
    block_size: Option<u32>,
) -> Result<TraceHeader, TraceError> {
    let err = |msg: String| TraceError::File {
        path: path.to_string(),
        msg,
    };
    let first = scan.next_item().map_err(|e| io_err(path, e))?;
    let Some(Scanned::Frame(0, frame)) = first else {
        return Err(err(
            "not a native trace (no complete zstd header frame)".into()
        ));
    };
    let hcontent = decompress_frame(&frame).map_err(|m| err(format!("header: {m}")))?;
    let hv: ciborium::Value = ciborium::from_reader(hcontent.as_slice())
        .map_err(|e| err(format!("header is not CBOR: {e}")))?;
    check_magic_version(path, &hv)?;
    let hw: HeaderWire = hv
        .deserialized()
        .map_err(|e| err(format!("bad header: {e}")))?;
    let mut header = hw.header;
    if header.block_size == 0 {
        return Err(err(
            "bad header: block_size is 0 (a block holds at least one token)".into(),
        ));
    }
    if let Some(b) = block_size {
        header.block_size = b;
    }
    Ok(header)
}

impl ReadReport {
    pub(super) fn good_frame(&mut self, dropped: u64) {
        self.frames_ok += 1;
        self.dropped_by_writer = self.dropped_by_writer.max(dropped);
    }

    /// Notes an unreadable stretch or a cut.
    pub(super) fn note(&mut self, item: Scanned) {
        match item {
            Scanned::Frame(..) => {}
            Scanned::Unreadable(pos) => self.corrupt.push((pos, "unreadable zstd frame".into())),
            Scanned::Cut(pos, lost) => {
                self.truncated_at = Some(pos);
                self.bytes_lost = lost;
            }
        }
    }
}

/// What [`FrameScanner`] found next.
pub(super) enum Scanned {
    /// A complete zstd frame at this byte offset.
    Frame(u64, Vec<u8>),
    /// Bytes at this offset that are no zstd frame, followed later by a frame magic.
    Unreadable(u64),
    /// The file ends inside a frame starting here; so many bytes were lost.
    Cut(u64, u64),
}

/// Largest compressed frame the scanner buffers while looking for its end.
pub(super) const MAX_FRAME_COMPRESSED: usize =
    (MAX_FRAME_CONTENT as usize) + (MAX_FRAME_CONTENT as usize >> 7) + (1 << 20);

/// Splits a byte stream into zstd frames, holding one frame (plus a read chunk) at a time. After
/// an unreadable frame it resynchronises on the next frame magic; a stream that ends inside a
/// frame is a cut.
pub(super) struct FrameScanner<R> {
    pub(super) src: R,
    pub(super) buf: Vec<u8>,
    /// Start of the unconsumed bytes in `buf`, and the stream offset of `buf[0]`.
    pub(super) pos: usize,
    pub(super) base: u64,
    pub(super) eof: bool,
    pub(super) done: bool,
}

impl<R: Read> FrameScanner<R> {
    pub(super) fn new(src: R) -> Self {
        FrameScanner {
            src,
            buf: Vec::new(),
            pos: 0,
            base: 0,
            eof: false,
            done: false,
        }
    }

    /// Reads until at least `more` bytes beyond the unconsumed ones are buffered, or the end.
    pub(super) fn fill(&mut self, more: usize) -> std::io::Result<()> {
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.base += self.pos as u64;
            self.pos = 0;
        }
        let want = self.buf.len() + more.max(64 << 10);
        while !self.eof && self.buf.len() < want {
            let at = self.buf.len();
            self.buf.resize(want, 0);
            let n = loop {
                match self.src.read(&mut self.buf[at..]) {
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    r => break r,
                }
            };
            let n = n.inspect_err(|_| self.buf.truncate(at))?;
            self.buf.truncate(at + n);
            self.eof = n == 0;
        }
        Ok(())
    }

    pub(super) fn next_item(&mut self) -> std::io::Result<Option<Scanned>> {
        if self.done {
            return Ok(None);
        }
        loop {
            let rest = &self.buf[self.pos..];
            let at = self.base + self.pos as u64;
            if rest.is_empty() {
                if self.eof {
                    self.done = true;
                    return Ok(None);
                }
                self.fill(0)?;
                continue;
            }
            match zstd::zstd_safe::find_frame_compressed_size(rest) {
                Ok(len) if len > 0 && len <= rest.len() => {
                    let frame = rest[..len].to_vec();
                    self.pos += len;
                    return Ok(Some(Scanned::Frame(at, frame)));
                }
                _ if !self.eof && rest.len() < MAX_FRAME_COMPRESSED => {
                    let more = rest.len();
                    self.fill(more)?;
                }
                _ => return self.resync(at),
            }
        }
    }

    /// After an unreadable frame at `at`: skips to the next frame magic (an unreadable frame),
    /// or to the end (a cut).
    pub(super) fn resync(&mut self, at: u64) -> std::io::Result<Option<Scanned>> {
        let mut from = self.pos + 1;
        loop {
            if let Some(k) = find_magic(&self.buf[from.min(self.buf.len())..]) {
                self.pos = from + k;
                return Ok(Some(Scanned::Unreadable(at)));
            }
            if self.eof {
                self.done = true;
                let end = self.base + self.buf.len() as u64;
                return Ok(Some(Scanned::Cut(at, end - at)));
            }
            // Keep the last three bytes: a magic may straddle the next read.
            self.pos = from.max(self.buf.len().saturating_sub(3));
            self.fill(0)?;
            from = 0;
        }
    }
}

/// Where one good record frame lies in a file, and the earliest arrival in it.
pub(super) struct FrameEntry {
    pub(super) offset: u64,
    pub(super) len: usize,
    pub(super) min_arrival: u64,
}

/// A native trace file read frame by frame in arrival order, in two passes: the first decodes
/// every frame once (the [`ReadReport`], each good frame's place and earliest arrival); the
/// second merges the frames by arrival, decoding a frame only when its earliest record is due,
/// so memory holds the frames whose arrival ranges overlap (a recording's frames overlap by the
/// longest request's duration), never the whole file. Hash ids stay runs until a record is
/// handed out: however many ids a file's runs declare, the expanded ids in memory are one
/// record's (at most [`crate::trace::rows::id_limit`]). The records and report equal [`read_bytes`]
/// of the same file.
pub struct NativeStream {
    pub(super) path: String,
    pub(super) file: std::fs::File,
    pub(super) header: TraceHeader,
    pub(super) report: ReadReport,
    /// Good frames by (earliest arrival, file order), the next to decode first.
    pub(super) frames: std::collections::VecDeque<(usize, FrameEntry)>,
    pub(super) due: BinaryHeap<Reverse<Pending>>,
}

/// A decoded record waiting for its turn: ordered by arrival, then file position.
pub(super) struct Pending {
    pub(super) key: (u64, usize, usize),
    pub(super) rec: Unexpanded,
}

impl PartialEq for Pending {
    fn eq(&self, o: &Self) -> bool {
        self.key == o.key
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Pending {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.key.cmp(&o.key)
    }
}

impl NativeStream {
    /// Opens `path` and runs the first pass.
    pub fn open(path: &Path) -> Result<NativeStream, TraceError> {
        Self::open_as(path, None)
    }

    /// [`Self::open`], read with `block_size` tokens per hash id instead of the header's when
    /// given (records are bounded by it).
    pub(crate) fn open_as(
        path: &Path,
        block_size: Option<u32>,
    ) -> Result<NativeStream, TraceError> {
        let name = path.display().to_string();
        let open = || std::fs::File::open(path).map_err(|e| io_err(&path.display().to_string(), e));
        let mut scan = FrameScanner::new(open()?);
        let header = read_header(&name, &mut scan, block_size)?;
        let mut report = ReadReport {
            frames_ok: 1,
            ..Default::default()
        };
        let mut frames = Vec::new();
        let mut scratch = Vec::new();
        let mut last = 0u64;
        while let Some(item) = scan.next_item().map_err(|e| io_err(&name, e))? {
            let Scanned::Frame(offset, frame) = item else {
                report.note(item);
                continue;
            };
            scratch.clear();
            match decode_frame(&frame, &header, &mut scratch) {
                Ok(dropped) => report.good_frame(dropped),
                Err(msg) => {
                    report.corrupt.push((offset, msg));
                    continue;
                }
            }
            for r in scratch.iter().map(|u| &u.req) {
                report.reordered += u64::from(report.records > 0 && r.arrival_us < last);
                last = r.arrival_us;
                report.records += 1;
            }
            if let Some(min_arrival) = scratch.iter().map(|u| u.req.arrival_us).min() {
                frames.push(FrameEntry {
                    offset,
                    len: frame.len(),
                    min_arrival,
                });
            }
        }
        let mut frames: Vec<(usize, FrameEntry)> = frames.into_iter().enumerate().collect();
        frames.sort_by_key(|(k, f)| (f.min_arrival, *k));
        Ok(NativeStream {
            path: name,
            file: open()?,
            header,
            report,
            frames: frames.into(),
            due: BinaryHeap::new(),
        })
    }

    pub(crate) fn header(&self) -> &TraceHeader {
        &self.header
    }

    /// What the first pass found (complete before the first record).
    pub fn report(&self) -> &ReadReport {
        &self.report
    }

    /// The earliest arrival in the file (from the first pass; nothing decoded).
    pub(crate) fn earliest(&self) -> Option<u64> {
        self.frames.front().map(|(_, f)| f.min_arrival)
    }

    /// Decodes the next frame by earliest arrival into the heap.
    pub(super) fn load_next(&mut self) -> Result<(), TraceError> {
        use std::io::{Seek, SeekFrom};
        let Some((k, f)) = self.frames.pop_front() else {
            return Ok(());
        };
        let mut frame = vec![0; f.len];
        self.file
            .seek(SeekFrom::Start(f.offset))
            .and_then(|_| self.file.read_exact(&mut frame))
            .map_err(|e| io_err(&self.path, e))?;
        let mut reqs = Vec::new();
        decode_frame(&frame, &self.header, &mut reqs).map_err(|msg| TraceError::File {
            path: self.path.clone(),
            msg: format!("frame at byte {} changed while reading: {msg}", f.offset),
        })?;
        for (j, rec) in reqs.into_iter().enumerate() {
            let key = (rec.req.arrival_us, k, j);
            self.due.push(Reverse(Pending { key, rec }));
        }
        Ok(())
    }
}

impl Iterator for NativeStream {
    type Item = Result<Request, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            // The heap's least record is next unless an undecoded frame may hold an earlier one.
            let head = self.due.peek().map(|Reverse(p)| p.key);
            let frame = self.frames.front().map(|(k, f)| (f.min_arrival, *k, 0));
            match (head, frame) {
                (Some(h), Some(f)) if h < f => break,
                (Some(_), None) => break,
                (None, None) => return None,
                _ => {
                    if let Err(e) = self.load_next() {
                        self.frames.clear();
                        return Some(Err(e));
                    }
                }
            }
        }
        self.due.pop().map(|Reverse(p)| Ok(p.rec.expand()))
    }
}

pub(super) fn find_magic(data: &[u8]) -> Option<usize> {
    data.windows(4).position(|w| w == ZSTD_MAGIC)
}

pub(super) fn check_magic_version(path: &str, v: &ciborium::Value) -> Result<(), TraceError> {
    let err = |msg: &str| TraceError::File {
        path: path.to_string(),
        msg: msg.to_string(),
    };
    let map = v.as_map().ok_or_else(|| err("header is not a map"))?;
    let get = |k: &str| {
        map.iter()
            .find(|(kk, _)| kk.as_text() == Some(k))
            .map(|(_, v)| v)
    };
    if get("magic").and_then(|m| m.as_text()) != Some(MAGIC) {
        return Err(err("not a retrace trace (header magic missing)"));
    }
    let ver = get("version")
        .and_then(|v| v.as_array())
        .ok_or_else(|| err("header has no version"))?;
    let num = |i: usize| -> u16 {
        ver.get(i)
            .and_then(|x| x.as_integer())
            .and_then(|x| u16::try_from(x).ok())
            .unwrap_or(u16::MAX)
    };
    let (major, minor) = (num(0), num(1));
    if major > VERSION_MAJOR {
        return Err(TraceError::NewerVersion {
            path: path.to_string(),
            found_major: major,
            found_minor: minor,
            ours_major: VERSION_MAJOR,
        });
    }
    Ok(())
}

/// Most hash ids one frame's records may carry together (32 Mi ids, 256 MiB decoded): a few
/// bytes of runs can declare millions of ids per record, each record within its own bound
/// ([`crate::trace::rows::id_limit`], at most about 2 × 10^7), so a frame is bounded as a whole too.
/// The writer starts a new frame rather than pass it; a reader drops a frame over it as damaged.
pub const MAX_FRAME_IDS: u64 = 1 << 25;

/// The hash ids a record's runs declare (saturating).
pub(super) fn run_total(runs: &[u64]) -> u64 {
    runs.chunks(2)
        .map(|r| r.get(1).copied().unwrap_or(0))
        .fold(0u64, u64::saturating_add)
}

/// Decodes one record frame, appending to `out` only if the whole frame is good (its records'
/// ids left as runs).
pub(super) fn decode_frame(
    frame: &[u8],
    header: &TraceHeader,
    out: &mut Vec<Unexpanded>,
) -> Result<u64, String> {
    let content = decompress_frame(frame)?;
    let mut rd = content.as_slice();
    let fw: FrameWire =
        ciborium::from_reader(&mut rd).map_err(|e| format!("bad frame header: {e}"))?;
    // Each record takes at least one byte: a count beyond the content is corrupt.
    if fw.n > content.len() as u64 {
        return Err(format!(
            "frame claims {} records in {} bytes",
            fw.n,
            content.len()
        ));
    }
    let start = out.len();
    out.reserve(fw.n as usize);
    let mut prev = 0u64;
    let res = (|| {
        // The records as read (their ids still runs, as small as the frame), then their ids
        // counted together, before any is expanded.
        let mut wires = Vec::with_capacity(fw.n as usize);
        let mut ids = 0u64;
        for k in 0..fw.n {
            let w: RequestWire =
                ciborium::from_reader(&mut rd).map_err(|e| format!("record {k}: {e}"))?;
            ids = ids.saturating_add(run_total(&w.h));
            if ids > MAX_FRAME_IDS {
                return Err(format!(
                    "record {k}: the frame's records declare more than {MAX_FRAME_IDS} hash ids"
                ));
            }
            wires.push(w);
        }
        if !rd.is_empty() {
            return Err(format!(
                "{} trailing bytes after {} records",
                rd.len(),
                fw.n
            ));
        }
        for (k, w) in wires.into_iter().enumerate() {
            let r = w
                .into_unexpanded(prev, header)
                .map_err(|e| format!("record {k}: {e}"))?;
            prev = r.req.arrival_us;
            out.push(r);
        }
        Ok(())
    })();
    if let Err(e) = res {
        // All or nothing per frame.
        out.truncate(start);
        return Err(e);
    }
    Ok(fw.dropped)
}

/// Reads a native trace file whole, through [`NativeStream`].
pub fn read_file(path: &Path) -> Result<(Trace, ReadReport), TraceError> {
    let s = NativeStream::open(path)?;
    let (header, report) = (s.header.clone(), s.report.clone());
    let requests = s.collect::<Result<Vec<_>, _>>()?;
    Ok((Trace { header, requests }, report))
}
