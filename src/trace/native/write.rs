use super::*;

/// Options for [`TraceWriter`].
#[derive(Debug, Clone)]
pub struct WriteOptions {
    /// zstd level (3 while recording; 19 for `convert`).
    pub level: i32,
    /// Close the open frame once its uncompressed size passes this.
    pub frame_bytes: usize,
    /// Close the open frame at the first push after it has been open this long (`None`: never).
    /// A writer that may sit idle should also call [`TraceWriter::flush_frame`] on a timer.
    pub frame_age: Option<std::time::Duration>,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            level: 3,
            frame_bytes: 4 << 20,
            frame_age: Some(std::time::Duration::from_secs(1)),
        }
    }
}

/// Bytes kept free at the front of the frame buffer for the frame header (at most 59 bytes:
/// a map of four keys with 64-bit values), so a frame is compressed from one slice, uncopied.
pub(super) const FRAME_HEAD_ROOM: usize = 64;

/// Writes a native trace: header frame, then record frames.
pub struct TraceWriter<W: Write> {
    pub(super) out: W,
    pub(super) opts: WriteOptions,
    /// The open frame: `FRAME_HEAD_ROOM` bytes of room, then its records' CBOR.
    pub(super) buf: Vec<u8>,
    /// One zstd context for every frame of the file (a fresh one per frame costs its setup),
    /// and the reused output buffer.
    pub(super) zc: zstd::bulk::Compressor<'static>,
    pub(super) zbuf: Vec<u8>,
    pub(super) in_frame: u64,
    /// Hash ids of the open frame's records (at most [`MAX_FRAME_IDS`]).
    pub(super) frame_ids: u64,
    pub(super) frame_opened: Option<std::time::Instant>,
    pub(super) prev_arrival: u64,
    pub(super) frames: u64,
    pub(super) records: u64,
    pub(super) dropped: u64,
    pub(super) bytes_written: u64,
    /// The file's header: its block rule bounds each record's hash ids.
    pub(super) header: TraceHeader,
}

impl<W: Write> TraceWriter<W> {
    /// Writes the header frame.
    pub fn new(out: W, header: &TraceHeader, opts: WriteOptions) -> std::io::Result<Self> {
        if header.block_size == 0 {
            // Every reader refuses such a header.
            let msg = "block_size 0: a block holds at least one token";
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, msg));
        }
        let mut zc = zstd::bulk::Compressor::new(opts.level)?;
        zc.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))?;
        let mut buf = Vec::with_capacity(1 << 16);
        buf.resize(FRAME_HEAD_ROOM, 0);
        let mut w = TraceWriter {
            out,
            opts,
            buf,
            zc,
            zbuf: Vec::new(),
            in_frame: 0,
            frame_ids: 0,
            frame_opened: None,
            prev_arrival: 0,
            frames: 0,
            records: 0,
            dropped: 0,
            bytes_written: 0,
            header: header.clone(),
        };
        let mut hb = Vec::new();
        cbor(
            &HeaderWire {
                magic: MAGIC.into(),
                version: (VERSION_MAJOR, VERSION_MINOR),
                header: header.clone(),
            },
            &mut hb,
        );
        w.write_frame(&hb)?;
        Ok(w)
    }

    pub(super) fn write_frame(&mut self, content: &[u8]) -> std::io::Result<()> {
        compress_into(&mut self.zc, content, &mut self.zbuf)?;
        self.out.write_all(&self.zbuf)?;
        self.bytes_written += self.zbuf.len() as u64;
        Ok(())
    }

    /// Appends a record; closes the frame when it is large enough. A record with more hash ids
    /// than its input length allows under the header ([`TraceHeader::check_ids`]) is refused
    /// (`InvalidInput`, nothing written): the reader would refuse it, and its frame with it.
    pub fn push(&mut self, r: &Request) -> std::io::Result<()> {
        // Every reader refuses an arrival past i64::MAX µs (its delta would turn negative).
        if i64::try_from(r.arrival_us).is_err() {
            let k = self.records + self.in_frame;
            let msg = format!(
                "record {k}: arrival {} µs is beyond any trace",
                r.arrival_us
            );
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, msg));
        }
        if let Some(resp) = r.response.as_deref() {
            let n = resp.past_cap.map_or(0, |p| p.events);
            if n > resp.events.len() as u64 {
                let k = self.records + self.in_frame;
                let msg = format!(
                    "record {k}: {n} events past the capture cap, of {} events",
                    resp.events.len()
                );
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, msg));
            }
        }
        if let Err(e) = self.header.check_ids(r.hash_ids.len(), r.input_tokens) {
            let k = self.records + self.in_frame;
            let msg = format!("record {k}: {e}");
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, msg));
        }
        // A frame holds at most MAX_FRAME_IDS ids, as every reader requires.
        let ids = r.hash_ids.len() as u64;
        if self.in_frame > 0 && self.frame_ids + ids > MAX_FRAME_IDS {
            self.flush_frame()?;
        }
        encode_record(r, self.prev_arrival, &mut self.buf);
        self.prev_arrival = r.arrival_us;
        self.in_frame += 1;
        self.frame_ids += ids;
        let opened = *self
            .frame_opened
            .get_or_insert_with(std::time::Instant::now);
        let too_old = self
            .opts
            .frame_age
            .is_some_and(|age| opened.elapsed() >= age);
        if self.buf.len() - FRAME_HEAD_ROOM >= self.opts.frame_bytes || too_old {
            self.flush_frame()?;
        }
        Ok(())
    }

    /// Records that `n` more records were dropped upstream of the writer (kept in frame headers).
    pub(crate) fn note_dropped(&mut self, n: u64) {
        self.dropped += n;
    }

    /// Closes the open frame (if it holds records) and flushes the output.
    pub(crate) fn flush_frame(&mut self) -> std::io::Result<()> {
        if self.in_frame == 0 {
            return self.out.flush();
        }
        self.frames += 1;
        let mut head = Vec::with_capacity(FRAME_HEAD_ROOM);
        cbor(
            &FrameWire {
                frame: self.frames,
                n: self.in_frame,
                first: self.records,
                dropped: self.dropped,
            },
            &mut head,
        );
        // The frame header goes into the room before the records: one slice, no copy of them.
        let at = FRAME_HEAD_ROOM - head.len().min(FRAME_HEAD_ROOM);
        let res = if head.len() <= FRAME_HEAD_ROOM {
            self.buf[at..FRAME_HEAD_ROOM].copy_from_slice(&head);
            compress_into(&mut self.zc, &self.buf[at..], &mut self.zbuf)
        } else {
            head.extend_from_slice(&self.buf[FRAME_HEAD_ROOM..]);
            compress_into(&mut self.zc, &head, &mut self.zbuf)
        };
        res?;
        self.out.write_all(&self.zbuf)?;
        self.bytes_written += self.zbuf.len() as u64;
        self.records += self.in_frame;
        self.in_frame = 0;
        self.frame_ids = 0;
        self.frame_opened = None;
        self.prev_arrival = 0;
        self.buf.truncate(FRAME_HEAD_ROOM);
        self.out.flush()
    }

    /// Records written so far (including the open frame).
    pub(crate) fn records(&self) -> u64 {
        self.records + self.in_frame
    }

    /// Compressed bytes written so far (closed frames only).
    pub(crate) fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    /// Closes the last frame and returns the output.
    pub fn finish(mut self) -> std::io::Result<W> {
        self.flush_frame()?;
        Ok(self.out)
    }

    pub(crate) fn get_mut(&mut self) -> &mut W {
        &mut self.out
    }
}
