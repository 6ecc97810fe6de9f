use super::*;

fn sample(n: usize) -> Trace {
    let mut reqs = Vec::new();
    for k in 0..n {
        let mut r = Request {
            arrival_us: (k as u64) * 1_000 + (k as u64 % 7),
            input_tokens: 100 + k as u64,
            output_tokens: 10,
            hash_ids: vec![0, 1, 2, k as u64 + 10],
            ..Default::default()
        };
        if k % 3 == 0 {
            r.endpoint = Endpoint::Chat;
            r.model = Some("m".into());
            r.params.max_tokens = Some(10);
            r.session = Some(Session {
                id: format!("s{}", k % 5),
                turn: (k / 5) as u32,
                think_us: Some(5),
            });
            r.response = Some(Box::new(Response {
                status: 200,
                ttft_us: Some(50_000),
                events: vec![
                    Event {
                        offset_us: 50_000,
                        tokens: 0,
                    },
                    Event {
                        offset_us: 60_000,
                        tokens: 2,
                    },
                ],
                end_us: Some(61_000),
                usage: Some(Usage {
                    prompt_tokens: 100,
                    completion_tokens: 2,
                }),
                server_metrics: Some(ServerMetrics {
                    queue_time_ms: Some(0.5),
                    ..Default::default()
                }),
                body: Some(b"data: x\n\n".to_vec()),
                ..Default::default()
            }));
            r.body = Some(b"{\"prompt\":[1,2]}".to_vec());
        }
        reqs.push(r);
    }
    Trace {
        header: TraceHeader::imported(16, true, "test"),
        requests: reqs,
    }
}

#[test]
fn round_trip_across_frames() {
    let t = sample(500);
    let bytes = write_bytes(
        &t,
        WriteOptions {
            level: 3,
            frame_bytes: 2000,
            frame_age: None,
        },
    );
    let (back, rep) = read_bytes("mem", &bytes).unwrap();
    assert!(rep.is_clean(), "{rep:?}");
    assert!(
        rep.frames_ok > 3,
        "small frame_bytes must make several frames"
    );
    assert_eq!(back, t);
}

/// A past-the-cap note round-trips; one counting more events than the record has is
/// refused, and a reader that knows no `x` reads the rest of the record as it was.
#[test]
fn past_cap_notes_round_trip_and_are_checked() {
    let resp = Response {
        status: 200,
        events: vec![Event {
            offset_us: 3,
            tokens: 1,
        }],
        past_cap: Some(PastCap {
            events: 1,
            stopped: true,
        }),
        ..Default::default()
    };
    let wire = ResponseWire::from_response(&resp);
    assert_eq!(wire.x.as_ref().map(|x| (x.n, x.s)), Some((1, true)));
    let mut buf = Vec::new();
    cbor(&wire, &mut buf);
    let back: ResponseWire = ciborium::from_reader(buf.as_slice()).unwrap();
    assert_eq!(back.into_response().unwrap(), resp);
    #[derive(Deserialize)]
    struct Older {
        eg: Vec<u64>,
        st: u16,
    }
    let old: Older = ciborium::from_reader(buf.as_slice()).unwrap();
    assert_eq!((old.eg, old.st), (vec![3], 200));
    let over = ResponseWire {
        eg: vec![3],
        x: Some(PastCapWire { n: 2, s: false }),
        ..Default::default()
    };
    let e = over.into_response().unwrap_err();
    assert!(
        e.contains("2 events past the capture cap, of 1 events"),
        "{e}"
    );
    // The writer refuses what the readers refuse.
    let header = TraceHeader::imported(16, true, "t");
    let mut w = TraceWriter::new(Vec::new(), &header, WriteOptions::default()).unwrap();
    let mut bad = resp.clone();
    bad.past_cap = Some(PastCap {
        events: 2,
        stopped: false,
    });
    let r = Request {
        response: Some(Box::new(bad)),
        ..Default::default()
    };
    let e = w.push(&r).unwrap_err().to_string();
    assert!(
        e.contains("2 events past the capture cap, of 1 events"),
        "{e}"
    );
}

#[test]
fn runs_round_trip() {
    let ids = vec![5, 6, 7, 1, 9, 10, u64::MAX, 0];
    let mut r = Vec::new();
    encode_runs(&ids, &mut r);
    assert_eq!(r, vec![5, 3, 1, 1, 9, 2, u64::MAX, 1, 0, 1]);
    assert_eq!(decode_runs(&r, 100).unwrap(), ids);
    assert!(decode_runs(&[0, u64::MAX], 1000).is_err());
    assert!(decode_runs(&[0, 5, 1], 1000).is_err());
}

#[test]
fn every_cut_point_recovers_complete_frames_without_panic() {
    let t = sample(300);
    let bytes = write_bytes(
        &t,
        WriteOptions {
            level: 1,
            frame_bytes: 1500,
            frame_age: None,
        },
    );
    // Record where each frame ends, and how many records are complete by then.
    let (_, full) = read_bytes("mem", &bytes).unwrap();
    assert!(full.frames_ok >= 5);
    let mut ends = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        pos += zstd::zstd_safe::find_frame_compressed_size(&bytes[pos..]).unwrap();
        ends.push(pos);
    }
    // records complete at the end of each frame
    let mut complete_at = Vec::new();
    for &e in &ends {
        let (tr, rep) = read_bytes("mem", &bytes[..e]).unwrap();
        assert!(rep.is_clean());
        complete_at.push((e, tr.requests.len()));
    }
    for cut in 0..bytes.len() {
        let res = read_bytes("mem", &bytes[..cut]);
        if cut < ends[0] {
            assert!(res.is_err(), "cut {cut} inside the header must be an error");
            continue;
        }
        let (tr, rep) = res.unwrap();
        let expect = complete_at
            .iter()
            .rev()
            .find(|(e, _)| *e <= cut)
            .map(|(_, n)| *n)
            .unwrap();
        assert_eq!(tr.requests.len(), expect, "cut at {cut}");
        assert_eq!(tr.requests[..], t.requests[..expect]);
        let at_boundary = ends.contains(&cut);
        assert_eq!(rep.truncated_at.is_some(), !at_boundary, "cut at {cut}");
    }
}

#[test]
fn corrupt_middle_frame_is_reported_and_later_frames_read() {
    let t = sample(300);
    let mut bytes = write_bytes(
        &t,
        WriteOptions {
            level: 1,
            frame_bytes: 1500,
            frame_age: None,
        },
    );
    let mut ends = vec![0];
    let mut pos = 0;
    while pos < bytes.len() {
        pos += zstd::zstd_safe::find_frame_compressed_size(&bytes[pos..]).unwrap();
        ends.push(pos);
    }
    // Damage the middle of frame 3 (index 2 counts the header frame as 0).
    let (a, b) = (ends[2], ends[3]);
    for x in &mut bytes[a + 8..b - 4] {
        *x ^= 0x5a;
    }
    let (tr, rep) = read_bytes("mem", &bytes).unwrap();
    assert_eq!(rep.corrupt.len(), 1, "{rep:?}");
    assert_eq!(rep.corrupt[0].0, a as u64);
    assert!(tr.requests.len() < t.requests.len());
    // The last record is still there: frames after the damage were read.
    assert_eq!(tr.requests.last(), t.requests.last());
    assert!(rep.summary().contains("corrupt frame at byte"));
}

#[test]
fn old_frames_close_on_push() {
    let t = sample(3);
    let mut w = TraceWriter::new(
        Vec::new(),
        &t.header,
        WriteOptions {
            frame_age: Some(std::time::Duration::ZERO),
            ..Default::default()
        },
    )
    .unwrap();
    for r in &t.requests {
        w.push(r).unwrap();
    }
    // Every push closed its frame: all three records are readable before finish().
    let (back, rep) = read_bytes("mem", w.get_mut()).unwrap();
    assert_eq!(back.requests.len(), 3);
    assert_eq!(rep.frames_ok, 4);
}

/// Frames written through the writer's one reused zstd context are the bytes a fresh
/// checksumming compressor gives for each frame's content alone.
#[test]
fn reused_zstd_context_gives_fresh_context_bytes() {
    let t = sample(400);
    for level in [1, 3, 19] {
        let bytes = write_bytes(
            &t,
            WriteOptions {
                level,
                frame_bytes: 3000,
                frame_age: None,
            },
        );
        let mut pos = 0;
        let mut frames = 0;
        while pos < bytes.len() {
            let len = zstd::zstd_safe::find_frame_compressed_size(&bytes[pos..]).unwrap();
            let frame = &bytes[pos..pos + len];
            let content = decompress_frame(frame).unwrap();
            let mut fresh = zstd::bulk::Compressor::new(level).unwrap();
            fresh
                .set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))
                .unwrap();
            assert_eq!(fresh.compress(&content).unwrap(), frame);
            pos += len;
            frames += 1;
        }
        assert!(frames > 5, "{frames} frames");
    }
}

#[test]
fn newer_major_version_is_rejected_clearly() {
    let mut hb = Vec::new();
    let hw = HeaderWire {
        magic: MAGIC.into(),
        version: (VERSION_MAJOR + 1, 0),
        header: TraceHeader::imported(16, true, "future"),
    };
    cbor(&hw, &mut hb);
    let bytes = zstd::bulk::compress(&hb, 3).unwrap();
    let e = read_bytes("f.trace.zst", &bytes).unwrap_err().to_string();
    assert!(e.contains("f.trace.zst") && e.contains("newer"), "{e}");
}

#[test]
fn garbage_is_an_error_not_a_panic() {
    for data in [
        &b""[..],
        b"hello",
        &ZSTD_MAGIC[..],
        b"\x28\xb5\x2f\xfd\x00\x00",
    ] {
        assert!(read_bytes("x", data).is_err());
    }
}

#[test]
fn output_is_a_plain_zstd_stream_of_cbor() {
    let t = sample(10);
    let bytes = write_bytes(&t, WriteOptions::default());
    let plain = zstd::stream::decode_all(bytes.as_slice()).unwrap();
    let mut rd = plain.as_slice();
    let first: ciborium::Value = ciborium::from_reader(&mut rd).unwrap();
    assert!(format!("{first:?}").contains(MAGIC));
    let mut items = 1;
    while !rd.is_empty() {
        let _: ciborium::Value = ciborium::from_reader(&mut rd).unwrap();
        items += 1;
    }
    assert_eq!(items, 1 + 1 + 10, "header, frame header, 10 records");
}

/// Every single-bit flip anywhere in a written file is found: the read fails (the header
/// frame), reports damage, or gives the very records written (a bit zstd ignores, such as the
/// frame descriptor's unused bit). Without frame checksums flips changed records unnoticed.
/// Records each inside their own bound but not together: a few bytes of runs declaring
/// 1,250,016 ids each, 2,000 of them in one frame (20 GB expanded). The frame is dropped as
/// damaged before any id is expanded; the good frames around it read whole.
#[test]
fn a_frame_whose_records_declare_too_many_ids_together_is_damage() {
    let header = TraceHeader::imported(16, true, "t");
    let per = super::super::rows::id_limit(header.blocks_for(10_000_000));
    let rec = |t| RequestWire {
        t,
        i: 10_000_000,
        o: 1,
        h: vec![0, per],
        ..RequestWire::from_request(&Request::default(), 0)
    };
    let mut content = Vec::new();
    cbor(
        &FrameWire {
            frame: 1,
            n: 2000,
            first: 0,
            dropped: 0,
        },
        &mut content,
    );
    for k in 0..2000 {
        cbor(&rec(i64::from(k > 0)), &mut content);
    }
    let mut decoded = Vec::new();
    let e = decode_frame(
        &zstd::bulk::compress(&content, 3).unwrap(),
        &header,
        &mut decoded,
    )
    .unwrap_err();
    assert!(e.contains("more than 33554432 hash ids"), "{e}");
    assert!(decoded.is_empty());
    // The writer keeps frames within the bound: one record of that many ids a frame.
    let big = Request {
        input_tokens: 10_000_000,
        hash_ids: (0..per).collect(),
        ..Default::default()
    };
    // No frame age: the frame closes for its ids alone, however slowly this machine pushes.
    let opts = WriteOptions {
        frame_age: None,
        ..WriteOptions::default()
    };
    let mut w = TraceWriter::new(Vec::new(), &header, opts).unwrap();
    let fit = (MAX_FRAME_IDS / per) as usize;
    for _ in 0..fit {
        w.push(&big).unwrap();
    }
    assert_eq!(
        (w.frames, w.frame_ids),
        (0, fit as u64 * per),
        "all fit in the open frame"
    );
    w.push(&big).unwrap();
    assert_eq!(
        (w.frames, w.frame_ids),
        (1, per),
        "one more starts a new frame"
    );
}

#[test]
fn the_writer_refuses_an_arrival_every_reader_would_refuse() {
    let h = TraceHeader::imported(16, true, "t");
    let mut w = TraceWriter::new(Vec::new(), &h, WriteOptions::default()).unwrap();
    let late = Request {
        arrival_us: u64::MAX,
        ..Default::default()
    };
    let e = w.push(&late).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    w.push(&Request::default()).unwrap();
    let (back, rep) = read_bytes("t", &w.finish().unwrap()).unwrap();
    assert!(
        rep.is_clean() && back.requests.len() == 1,
        "{}",
        rep.summary()
    );
}

#[test]
fn a_header_with_block_size_0_is_refused_by_the_writer_and_the_reader() {
    let mut h = TraceHeader::imported(16, true, "t");
    h.block_size = 0;
    let e = TraceWriter::new(Vec::new(), &h, WriteOptions::default())
        .err()
        .unwrap();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    // A file written with a good header, its block size then patched to 0 in the header
    // frame, is refused naming the field.
    let hw = HeaderWire {
        magic: MAGIC.into(),
        version: (VERSION_MAJOR, VERSION_MINOR),
        header: h,
    };
    let mut cbor = Vec::new();
    ciborium::into_writer(&hw, &mut cbor).unwrap();
    let frame = zstd::bulk::compress(&cbor, 1).unwrap();
    let e = read_bytes("z.trace.zst", &frame).unwrap_err().to_string();
    assert!(
        e.contains("z.trace.zst") && e.contains("block_size is 0"),
        "{e}"
    );
}

#[test]
fn a_record_with_more_hash_ids_than_its_input_allows_is_refused_and_the_rest_reads_whole() {
    let t = sample(6);
    let mut w = TraceWriter::new(Vec::new(), &t.header, WriteOptions::default()).unwrap();
    w.push(&t.requests[0]).unwrap();
    let limit = super::super::rows::id_limit(t.header.blocks_for(1));
    let over = Request {
        input_tokens: 1,
        hash_ids: (0..limit + 1).collect(),
        ..t.requests[1].clone()
    };
    let e = w.push(&over).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    assert!(e.to_string().starts_with("record 1: "), "{e}");
    for r in &t.requests[1..] {
        w.push(r).unwrap();
    }
    let (back, rep) = read_bytes("t", &w.finish().unwrap()).unwrap();
    assert!(rep.is_clean(), "{}", rep.summary());
    assert_eq!(back.requests, t.requests);
}

#[test]
fn byte_flips_in_a_native_trace_are_detected_as_damage() {
    let t = sample(60);
    let opts = WriteOptions {
        level: 3,
        frame_bytes: 1500,
        frame_age: None,
    };
    let bytes = write_bytes(&t, opts);
    let hlen = zstd::zstd_safe::find_frame_compressed_size(&bytes).unwrap();
    let mut unnoticed = Vec::new();
    for i in 0..bytes.len() {
        let mut b = bytes.clone();
        b[i] ^= 1 << (i % 8);
        match read_bytes("flip", &b) {
            Ok((back, rep)) if rep.is_clean() && back != t => unnoticed.push(i),
            Ok(_) => {}
            Err(_) => assert!(i < hlen, "byte {i}: only a damaged header fails the read"),
        }
    }
    assert!(bytes.len() > 1000 && hlen < 200, "{} bytes", bytes.len());
    assert!(unnoticed.is_empty(), "flips not detected at {unnoticed:?}");
}

/// A file written without checksums (format 1.1) still reads cleanly.
#[test]
fn old_files_without_checksums_still_read() {
    let t = sample(30);
    let mut bytes = Vec::new();
    let mut hb = Vec::new();
    let hw = HeaderWire {
        magic: MAGIC.into(),
        version: (1, 1),
        header: t.header.clone(),
    };
    cbor(&hw, &mut hb);
    bytes.extend(zstd::bulk::compress(&hb, 3).unwrap());
    let mut fb = Vec::new();
    let fw = FrameWire {
        frame: 1,
        n: t.requests.len() as u64,
        first: 0,
        dropped: 0,
    };
    cbor(&fw, &mut fb);
    let mut prev = 0;
    for r in &t.requests {
        encode_record(r, prev, &mut fb);
        prev = r.arrival_us;
    }
    bytes.extend(zstd::bulk::compress(&fb, 3).unwrap());
    let (back, rep) = read_bytes("old", &bytes).unwrap();
    assert!(rep.is_clean(), "{}", rep.summary());
    assert_eq!(back, t);
}
