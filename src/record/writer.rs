//! The recorder's writer thread: a bounded queue in, rotating native trace files out
//! (docs/record.md, "Trace files"). [`Recorder::submit`] never blocks: a full queue (in records
//! or captured bytes) drops and counts the record. The thread builds records
//! ([`super::extract`]), closes a frame at least every `flush_every` and rotates by size and age;
//! recorded exchanges go back to the forwarding path for reuse ([`Recorder::exchange`]).

use super::counters::ProxyCounters;
use super::extract::{Exchange, Extractor};
use super::servertok::{Ask, ServerTokenizer};
use crate::trace::native::{TraceWriter, WriteOptions};
use crate::trace::{Request, TraceHeader};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

/// How long the writer sleeps when its queue is empty.
const POLL: Duration = Duration::from_millis(5);

enum Msg {
    Exchange(Box<Exchange>),
    /// Close the file; records waiting for the upstream's `/tokenize` wait no later than this.
    Close(Option<Instant>),
}

/// Recorded exchanges the writer hands back for reuse, at most this many.
const SPARE_MAX: usize = 256;
/// An exchange holding more buffer capacity than this is freed, not reused.
const SPARE_MAX_BYTES: usize = 32 << 10;

/// Exchanges the writer is done with, emptied and reused by the forwarding path (else each
/// would be allocated on an I/O thread and freed on the writer thread, malloc's slow path).
type Spare = Arc<Mutex<Vec<Box<Exchange>>>>;

// The boxes are the point: the queue carries `Box<Exchange>`, and the box is reused too.
#[allow(clippy::vec_box)]
fn lock_spare(s: &Spare) -> std::sync::MutexGuard<'_, Vec<Box<Exchange>>> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

/// The forwarding path's handle to the writer.
#[derive(Clone)]
pub struct Recorder {
    tx: SyncSender<Msg>,
    stats: Arc<ProxyCounters>,
    /// Captured bytes currently queued, and the budget for them.
    queued_bytes: Arc<AtomicU64>,
    max_queued_bytes: u64,
    spare: Spare,
}

impl Recorder {
    /// A new exchange for a request arriving at `arrival`, with its method and path: one the
    /// writer handed back when there is one (its buffers kept, every field reset), else a fresh one.
    pub fn exchange(&self, arrival: Instant, method: &str, path: &str) -> Box<Exchange> {
        let reused = lock_spare(&self.spare).pop();
        match reused {
            Some(mut ex) => {
                ex.reuse(arrival);
                ex.method.push_str(method);
                ex.path.push_str(path);
                ex
            }
            None => Box::new(Exchange::new(arrival, method.into(), path.into())),
        }
    }

    /// Queues a finished exchange, or drops and counts it when the queue is full (in records or
    /// in captured bytes).
    pub fn submit(&self, ex: Box<Exchange>) {
        let bytes = ex.captured_bytes();
        let before = self.queued_bytes.fetch_add(bytes, Relaxed);
        if before + bytes > self.max_queued_bytes {
            self.queued_bytes.fetch_sub(bytes, Relaxed);
            self.stats.records_dropped.fetch_add(1, Relaxed);
            return;
        }
        if self.tx.try_send(Msg::Exchange(ex)).is_err() {
            self.queued_bytes.fetch_sub(bytes, Relaxed);
            self.stats.records_dropped.fetch_add(1, Relaxed);
        }
    }
}

/// Where and how files are written.
#[derive(Debug, Clone)]
pub struct FileOptions {
    pub dir: PathBuf,
    pub name: String,
    pub rotate_bytes: u64,
    pub rotate_every: Duration,
    /// Close a frame at least this often.
    pub flush_every: Duration,
    /// Bytes the disk still takes, shared by every file (`None`: no limit but the disk's). Past
    /// it a write fails as on a full disk: the seam tests use to fill one.
    pub space: Option<Arc<AtomicU64>>,
}

/// The running writer thread.
pub struct WriterHandle {
    tx: SyncSender<Msg>,
    /// The files closed, in order.
    join: JoinHandle<Vec<PathBuf>>,
}

impl WriterHandle {
    /// Asks the writer to close its file and waits for it (blocking; call off the async runtime);
    /// returns the files it closed, in order. Records still waiting for the upstream's
    /// `/tokenize` count wait until `deadline` at most (the drain's), then keep their estimate.
    pub fn close(self, deadline: Option<Instant>) -> Vec<PathBuf> {
        let _ = self.tx.send(Msg::Close(deadline));
        self.join.join().unwrap_or_default()
    }
}

/// Starts the writer thread.
#[allow(clippy::too_many_arguments)]
pub fn spawn(
    queue: usize,
    max_queued_bytes: u64,
    files: FileOptions,
    header: TraceHeader,
    extractor: Extractor,
    servertok: Option<ServerTokenizer>,
    t0: Instant,
    stats: Arc<ProxyCounters>,
) -> std::io::Result<(Recorder, WriterHandle)> {
    let (tx, rx) = sync_channel(queue.max(1));
    let queued_bytes = Arc::new(AtomicU64::new(0));
    let spare: Spare = Arc::default();
    let rec = Recorder {
        tx: tx.clone(),
        stats: stats.clone(),
        queued_bytes: queued_bytes.clone(),
        max_queued_bytes,
        spare: spare.clone(),
    };
    let start_tag = {
        let secs = header.t0_unix_us.unwrap_or(0).div_euclid(1_000_000);
        chrono::DateTime::from_timestamp(secs, 0)
            .map(|d| d.format("%Y%m%dT%H%M%SZ").to_string())
            .unwrap_or_else(|| "start".into())
    };
    let mut w = Writer {
        files,
        header,
        start_tag,
        seq: 0,
        cur: None,
        last_failed_open: None,
        extractor,
        servertok,
        t0,
        stats,
        closed: Vec::new(),
        noted_dropped: 0,
        pending: Vec::new(),
        order: Vec::new(),
        queued_bytes,
        spare,
        done: Vec::new(),
    };
    let join = std::thread::Builder::new()
        .name("retrace-record-writer".into())
        .spawn(move || {
            crate::sys::thread_timing::lower_priority();
            w.run(rx);
            w.closed
        })?;
    Ok((rec, WriterHandle { tx, join }))
}

struct OpenFile {
    w: TraceWriter<BufWriter<Sink>>,
    partial: PathBuf,
    path: PathBuf,
    opened: Instant,
    /// Bytes up to the end of the last complete frame, and the records in them.
    good: u64,
    kept: u64,
}

/// A trace file as the writer sees it: bytes written are counted, and after a failed write
/// nothing more goes out (so what follows the last complete frame can be cut off).
struct Sink {
    file: File,
    written: u64,
    failed: bool,
    space: Option<Arc<AtomicU64>>,
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let room = self.space.as_ref().map_or(usize::MAX, |s| {
            usize::try_from(s.load(Relaxed)).unwrap_or(usize::MAX)
        });
        let r = match (self.failed, room.min(buf.len())) {
            (true, _) => Err(std::io::Error::other("an earlier write failed")),
            (false, 0) if !buf.is_empty() => Err(std::io::ErrorKind::StorageFull.into()),
            (false, n) => self.file.write(&buf[..n]),
        };
        match r {
            Ok(n) => {
                self.written += n as u64;
                if let Some(s) = &self.space {
                    s.fetch_sub(n as u64, Relaxed);
                }
                Ok(n)
            }
            Err(e) => {
                self.failed = true;
                Err(e)
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

struct Writer {
    files: FileOptions,
    header: TraceHeader,
    start_tag: String,
    seq: u64,
    cur: Option<OpenFile>,
    last_failed_open: Option<Instant>,
    extractor: Extractor,
    /// Counts estimated input lengths with the upstream's `/tokenize` (records held meanwhile).
    servertok: Option<ServerTokenizer>,
    t0: Instant,
    stats: Arc<ProxyCounters>,
    closed: Vec<PathBuf>,
    noted_dropped: u64,
    /// Records of the open frame, sorted by arrival before they are pushed.
    pending: Vec<Request>,
    /// (arrival, index into the frame's records), reused across frames.
    order: Vec<(u64, usize)>,
    queued_bytes: Arc<AtomicU64>,
    spare: Spare,
    /// Recorded exchanges waiting to go back to `spare` (handed back in batches, one lock each).
    #[allow(clippy::vec_box)]
    done: Vec<Box<Exchange>>,
}

impl Writer {
    /// Counts a failed write or open; `/healthz` says so until a frame is written again.
    fn write_failed(&self) {
        self.stats.write_errors.fetch_add(1, Relaxed);
        self.stats.writer_failing.store(true, Relaxed);
    }

    fn run(&mut self, rx: Receiver<Msg>) {
        // Polled, not blocked on: a blocked receiver would make every `try_send` on the
        // forwarding path pay a wake-up. While records keep coming the clock is read every 64.
        let mut next_flush = Instant::now() + self.files.flush_every;
        let mut since_clock = 0u32;
        let deadline = loop {
            match rx.try_recv() {
                Ok(Msg::Exchange(ex)) => {
                    self.record(ex);
                    since_clock += 1;
                    if since_clock < 64 {
                        continue;
                    }
                }
                Ok(Msg::Close(deadline)) => break deadline,
                Err(TryRecvError::Disconnected) => break None,
                Err(TryRecvError::Empty) => {
                    let wait = next_flush.saturating_duration_since(Instant::now());
                    std::thread::sleep(wait.min(POLL));
                }
            }
            since_clock = 0;
            self.poll_tokenize();
            if Instant::now() >= next_flush {
                self.flush();
                next_flush = Instant::now() + self.files.flush_every;
            }
        };
        // Drain what is already queued, then close.
        while let Ok(Msg::Exchange(ex)) = rx.try_recv() {
            self.record(ex);
        }
        self.finish_tokenize(deadline);
        self.flush();
        self.close_file();
    }

    fn record(&mut self, ex: Box<Exchange>) {
        self.queued_bytes.fetch_sub(ex.captured_bytes(), Relaxed);
        let (req, parse_failure) = self.extractor.to_request(&ex, self.t0);
        if let Some(msg) = &parse_failure {
            self.stats.parse_failures.fetch_add(1, Relaxed);
            tracing::debug!(path = %ex.path, "request body not parsed: {msg}");
        }
        if let Some(t) = req.response.as_ref().and_then(|r| r.ttft_us) {
            self.stats.ttft.observe(Duration::from_micros(t));
        }
        let ask = match (&self.servertok, req.input_count) {
            (Some(_), crate::trace::InputCount::Estimated)
                if ex.request.complete && !ex.request.truncated =>
            {
                Ask::of(&req.endpoint, &ex.request.data)
            }
            _ => None,
        };
        // Past the drain deadline the proxy is closing: nothing more is asked.
        let cut = self.stats.drain_cut.load(Relaxed);
        match (ask, self.servertok.as_mut()) {
            (Some(_), Some(st)) if cut => st.skip(req, &mut self.pending),
            (Some(ask), Some(st)) => st.offer(req, ask, &mut self.pending),
            _ => self.pending.push(req),
        }
        self.give_back(ex);
        if self.pending.len() >= 4096 {
            self.flush();
        }
    }

    /// Takes the records the server has counted (or failed to) into the open frame.
    fn poll_tokenize(&mut self) {
        if let Some(st) = self.servertok.as_mut() {
            let x = &self.extractor;
            st.poll(&x.hasher, x.block_size, &mut self.pending);
        }
    }

    /// At close: answers in flight are waited for (at most the wait for a slot and an answer,
    /// and not past `deadline`, the drain's; not at all once the drain deadline cut exchanges),
    /// then every record still held is written with its estimate.
    fn finish_tokenize(&mut self, deadline: Option<Instant>) {
        let Some(st) = self.servertok.as_mut() else {
            return;
        };
        let most = Instant::now() + super::servertok::MAX_WAIT + super::servertok::ANSWER_TIMEOUT;
        let deadline = match self.stats.drain_cut.load(Relaxed) {
            true => Instant::now(),
            false => deadline.map_or(most, |d| d.min(most)),
        };
        while st.holds() && Instant::now() < deadline {
            st.poll(
                &self.extractor.hasher,
                self.extractor.block_size,
                &mut self.pending,
            );
            std::thread::sleep(POLL);
        }
        st.finish(&mut self.pending);
    }

    /// Keeps a recorded exchange for reuse unless it holds large buffers (a long stream's) or
    /// enough are kept; hands them back 32 at a time.
    fn give_back(&mut self, ex: Box<Exchange>) {
        if ex.retained_bytes() <= SPARE_MAX_BYTES {
            self.done.push(ex);
        }
        if self.done.len() >= 32 {
            let mut spare = lock_spare(&self.spare);
            let room = SPARE_MAX.saturating_sub(spare.len());
            let n = self.done.len().min(room);
            spare.extend(self.done.drain(..n));
            drop(spare);
            self.done.clear();
        }
    }

    /// Pushes the pending records and closes a frame; rotates when due.
    fn flush(&mut self) {
        if self.pending.is_empty() {
            if self
                .cur
                .as_ref()
                .is_some_and(|f| f.opened.elapsed() >= self.files.rotate_every)
            {
                self.close_file();
            }
            return;
        }
        self.ensure_open();
        let mut pending = std::mem::take(&mut self.pending);
        let Some(f) = self.cur.as_mut() else {
            self.stats
                .records_lost_io
                .fetch_add(pending.len() as u64, Relaxed);
            return;
        };
        // Arrival order, ties in completion order: (arrival, index) keys are sorted, not the
        // records (the keys are unique, so an unstable sort gives that order).
        let mut order = std::mem::take(&mut self.order);
        order.clear();
        order.extend(pending.iter().enumerate().map(|(k, r)| (r.arrival_us, k)));
        order.sort_unstable();
        let dropped = self.stats.records_dropped.load(Relaxed);
        f.w.note_dropped(dropped - self.noted_dropped);
        self.noted_dropped = dropped;
        let n = pending.len() as u64;
        let res = order
            .iter()
            .try_for_each(|&(_, k)| f.w.push(&pending[k]))
            .and_then(|()| f.w.flush_frame());
        self.order = order;
        // The emptied record list keeps its capacity for the next frame.
        pending.clear();
        if self.pending.is_empty() {
            self.pending = pending;
        }
        if let Err(e) = res {
            tracing::error!(
                "writing {}: {e}; it ends at its last complete frame, a new file in 5 s",
                f.partial.display()
            );
            self.write_failed();
            self.stats.records_lost_io.fetch_add(n, Relaxed);
            if let Some(f) = self.cur.take() {
                drop(f.w);
                self.seal(f.partial, f.path, f.good, f.kept);
            }
            self.last_failed_open = Some(Instant::now());
            return;
        }
        self.stats.records_written.fetch_add(n, Relaxed);
        self.stats.writer_failing.store(false, Relaxed);
        f.good = f.w.get_mut().get_ref().written;
        f.kept = f.w.records();
        let rotate = f.w.bytes_written() >= self.files.rotate_bytes
            || f.opened.elapsed() >= self.files.rotate_every;
        if rotate {
            self.close_file();
        }
    }

    fn ensure_open(&mut self) {
        if self.cur.is_some() {
            return;
        }
        if self
            .last_failed_open
            .is_some_and(|t| t.elapsed() < Duration::from_secs(5))
        {
            return;
        }
        match self.open() {
            Ok(f) => {
                self.last_failed_open = None;
                self.cur = Some(f);
            }
            Err(e) => {
                self.write_failed();
                tracing::error!(
                    "cannot open a trace file in {}: {e}; records are lost until it works (retrying every 5 s)",
                    self.files.dir.display()
                );
                self.last_failed_open = Some(Instant::now());
            }
        }
    }

    fn open(&mut self) -> std::io::Result<OpenFile> {
        std::fs::create_dir_all(&self.files.dir)?;
        let (file, partial, path) = self.claim_name()?;
        let sink = Sink {
            file,
            written: 0,
            failed: false,
            space: self.files.space.clone(),
        };
        self.start_file(sink, partial.clone(), path)
            .inspect_err(|_| {
                // Nothing worth keeping: the name is used again by the next try.
                if std::fs::remove_file(&partial).is_ok() {
                    self.seq -= 1;
                }
            })
    }

    /// Takes the next free file name: its `.partial` is created with `create_new`, and no
    /// closed file has that name. A name another recorder on the same `--out` holds or has
    /// closed (one started in the same second) is passed over at once for the next sequence
    /// number. Any other error leaves the sequence number for the next try.
    fn claim_name(&mut self) -> std::io::Result<(File, PathBuf, PathBuf)> {
        for _ in 0..NAME_TRIES {
            self.seq += 1;
            let name = file_name(&self.files.name, &self.start_tag, self.seq);
            let path = self.files.dir.join(name);
            let partial = partial_path(&path);
            let created = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&partial);
            match created {
                // Checked after the `.partial` is ours: whoever closed a file of this name
                // held its `.partial` before, so none can appear from now on.
                Ok(file) if std::fs::symlink_metadata(&path).is_err() => {
                    return Ok((file, partial, path))
                }
                Ok(_) => {
                    let _ = std::fs::remove_file(&partial);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    self.seq -= 1;
                    return Err(e);
                }
            }
        }
        Err(std::io::Error::other(format!(
            "{NAME_TRIES} file names in a row are taken"
        )))
    }

    /// Writes the header of a new file.
    fn start_file(&self, sink: Sink, partial: PathBuf, path: PathBuf) -> std::io::Result<OpenFile> {
        let mut header = self.header.clone();
        let opened_us = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64);
        header
            .meta
            .insert("file_opened_unix_us".into(), opened_us.to_string());
        header.meta.insert("file_seq".into(), self.seq.to_string());
        let mut w = TraceWriter::new(
            BufWriter::with_capacity(1 << 16, sink),
            &header,
            WriteOptions::default(),
        )?;
        w.flush_frame()?;
        let good = w.get_mut().get_ref().written;
        Ok(OpenFile {
            w,
            partial,
            path,
            opened: Instant::now(),
            good,
            kept: 0,
        })
    }

    /// Closes the open file after its last frame; if that cannot be written, the file ends at
    /// its last complete frame and the records after it are counted as lost.
    fn close_file(&mut self) {
        let Some(f) = self.cur.take() else { return };
        let total = f.w.records();
        match f
            .w
            .finish()
            .and_then(|b| b.into_inner().map_err(|e| e.into_error()))
        {
            Ok(sink) => self.seal(f.partial, f.path, sink.written, total),
            Err(e) => {
                self.write_failed();
                let lost = total - f.kept;
                self.stats.records_lost_io.fetch_add(lost, Relaxed);
                tracing::error!("closing {}: {e}; {lost} records lost", f.partial.display());
                self.seal(f.partial, f.path, f.good, f.kept);
            }
        }
    }

    /// Gives a file its final name (cut to `len` bytes), or removes it if it holds no records.
    fn seal(&mut self, partial: PathBuf, path: PathBuf, len: u64, records: u64) {
        match seal_file(&partial, &path, len, records) {
            Ok(true) => {
                self.stats.files_closed.fetch_add(1, Relaxed);
                self.closed.push(path);
            }
            Ok(false) => {}
            Err(e) => {
                self.write_failed();
                tracing::error!("closing {}: {e}", partial.display());
            }
        }
    }
}

/// Cuts `partial` to `len` bytes, syncs it and renames it to `path`; with no records it is
/// removed instead. Returns whether a file was kept.
fn seal_file(partial: &Path, path: &Path, len: u64, records: u64) -> std::io::Result<bool> {
    if records == 0 {
        std::fs::remove_file(partial)?;
        return Ok(false);
    }
    let file = std::fs::OpenOptions::new().write(true).open(partial)?;
    file.set_len(len)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(partial, path)?;
    if let Some(dir) = path.parent() {
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(true)
}

/// Names taken by other recorders passed over in a row before opening a file fails.
const NAME_TRIES: u32 = 1000;

/// A trace file's name: `<name>-<start>-<seq>.trace.zst`.
fn file_name(name: &str, start_tag: &str, seq: u64) -> String {
    format!("{name}-{start_tag}-{seq:04}.trace.zst")
}

/// Refuses an output directory trace files cannot be written to (a regular file, a path below
/// one, a read-only directory): creates it if missing, then writes and removes a probe file.
pub(crate) fn check_dir(dir: &Path) -> std::io::Result<()> {
    if dir.exists() && !dir.is_dir() {
        return Err(std::io::Error::other("it is not a directory"));
    }
    std::fs::create_dir_all(dir)?;
    let probe = dir.join(format!(".retrace-probe-{}", std::process::id()));
    std::fs::write(&probe, b"")?;
    std::fs::remove_file(&probe)
}

/// Refuses a file name prefix the directory cannot hold (too long for its file system): creates
/// and removes a file of the longest name the writer uses (a `.partial` with a ten-digit
/// sequence number, which no recording reaches). Returns the probe's name length on error.
pub(crate) fn check_name(dir: &Path, name: &str) -> Result<(), (usize, std::io::Error)> {
    let probe = partial_path(Path::new(&file_name(
        name,
        "00000000T000000Z",
        9_999_999_999,
    )));
    let len = probe.as_os_str().len();
    let path = dir.join(probe);
    let made = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path);
    match made {
        Ok(_) => std::fs::remove_file(&path).map_err(|e| (len, e)),
        // Another recorder's probe of the same name: the name fits.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err((len, e)),
    }
}

/// `<path>.partial`.
pub(crate) fn partial_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".partial");
    PathBuf::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::record::extract::Bodies;
    use crate::record::prompt::TextTokenizer;
    use crate::trace::hash::BlockHasher;

    /// A writer into `dir` (block size 4, no rotation) that closes a frame every `flush`.
    fn writer_in(
        dir: &Path,
        flush: Duration,
        space: Option<Arc<AtomicU64>>,
    ) -> (Recorder, WriterHandle, Arc<ProxyCounters>, Instant) {
        let t0 = Instant::now();
        let header = TraceHeader {
            hash_scheme: BlockHasher::xxh3().scheme(),
            t0_unix_us: Some(0),
            ..TraceHeader::imported(4, true, "test")
        };
        let files = FileOptions {
            dir: dir.to_path_buf(),
            name: "t".into(),
            rotate_bytes: 1 << 30,
            rotate_every: Duration::from_secs(3600),
            flush_every: flush,
            space,
        };
        let extractor = Extractor {
            hasher: BlockHasher::xxh3(),
            block_size: 4,
            tokenizer: TextTokenizer::Approx,
            bodies: Bodies::None,
        };
        let stats = Arc::new(ProxyCounters::default());
        let (rec, handle) = spawn(
            64,
            1 << 20,
            files,
            header,
            extractor,
            None,
            t0,
            stats.clone(),
        )
        .unwrap();
        (rec, handle, stats, t0)
    }

    /// Waits (at most 30 s: a hang, not a slow machine) until `counter` reaches `want`.
    fn wait_for(counter: &AtomicU64, want: u64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while counter.load(Relaxed) < want {
            assert!(
                Instant::now() < deadline,
                "{} of {want}",
                counter.load(Relaxed)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .map(|d| {
                d.map(|e| e.unwrap().file_name().into_string().unwrap())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    /// The disk fills up after three records: the file ends at its last complete frame, gets
    /// its final name and is listed; the two records after are counted as lost.
    #[test]
    fn disk_full_closes_the_file_at_its_last_frame_and_renames_it() {
        let dir = tempfile::tempdir().unwrap();
        let space = Arc::new(AtomicU64::new(1 << 20));
        let flush = Duration::from_millis(20);
        let (rec, handle, stats, t0) = writer_in(dir.path(), flush, Some(space.clone()));
        for k in 0..3 {
            rec.submit(rec.exchange(t0 + Duration::from_millis(k), "GET", "/a"));
        }
        wait_for(&stats.records_written, 3);
        space.store(0, Relaxed);
        for k in 3..5 {
            rec.submit(rec.exchange(t0 + Duration::from_millis(k), "GET", "/b"));
        }
        wait_for(&stats.records_lost_io, 2);
        let files = handle.close(None);
        assert_eq!(names_in(dir.path()), ["t-19700101T000000Z-0001.trace.zst"]);
        assert_eq!(
            files,
            [dir.path().join("t-19700101T000000Z-0001.trace.zst")]
        );
        let (t, rep) = crate::trace::native::read_file(&files[0]).unwrap();
        assert!(rep.is_clean(), "{}", rep.summary());
        assert_eq!(t.requests.len(), 3);
        assert_eq!(stats.records_lost_io.load(Relaxed), 2);
        assert!(stats.write_errors.load(Relaxed) >= 1);
    }

    /// A full disk when a file is opened: no empty `.partial` is left behind.
    #[test]
    fn disk_full_at_open_leaves_no_empty_partial() {
        let dir = tempfile::tempdir().unwrap();
        let space = Some(Arc::new(AtomicU64::new(0)));
        let (rec, handle, stats, t0) = writer_in(dir.path(), Duration::from_millis(20), space);
        rec.submit(rec.exchange(t0, "GET", "/a"));
        wait_for(&stats.records_lost_io, 1);
        assert!(handle.close(None).is_empty());
        assert_eq!(names_in(dir.path()), Vec::<String>::new());
    }

    /// Records of one frame come out in arrival order, ties in completion order.
    #[test]
    fn frame_records_are_in_arrival_order_ties_in_completion_order() {
        let dir = tempfile::tempdir().unwrap();
        let (rec, handle, stats, t0) = writer_in(dir.path(), Duration::from_secs(3600), None);
        // (arrival ms, path): completion order is the submission order.
        let order = [(5, "/a"), (1, "/b"), (5, "/c"), (3, "/d"), (1, "/e")];
        for (ms, path) in order {
            let ex = rec.exchange(t0 + Duration::from_millis(ms), "GET", path);
            rec.submit(ex);
        }
        let files = handle.close(None);
        assert_eq!(stats.records_written.load(Relaxed), 5);
        let (trace, _) = crate::trace::native::read_file(&files[0]).unwrap();
        let got: Vec<(u64, String)> = trace
            .requests
            .iter()
            .map(|r| (r.arrival_us, r.endpoint.as_str().to_string()))
            .collect();
        let want: Vec<(u64, String)> = [(1, "/b"), (1, "/e"), (3, "/d"), (5, "/a"), (5, "/c")]
            .iter()
            .map(|(ms, p)| (ms * 1000, p.to_string()))
            .collect();
        assert_eq!(got, want);
    }
}
