//! Hostile frames on a handshaken connection: huge claimed lengths, a frame stalled or
//! trickled past `op_timeout`, out-of-range writes (refused, nothing placed, the connection
//! kept in sync), join lanes the peer does not have, and run-form segments checked like lists.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use morio::proto::codes;
use morio::proto::frame::Frame;
use morio::proto::limits::{CHUNK_FIXED_BYTES, HEADER_BYTES};

use super::raw::*;
use crate::common::*;

#[test]
fn hostile_huge_lengths() {
    let (a, b) = hostile_pair("hostile_huge");
    let port = b.engine_desc().port;
    // Before the handshake: a HELLO claiming a 4 GiB body, a WRITE claiming a 2^64 payload.
    let mut pre = Vec::new();
    for h in [header(1, 0, u32::MAX, 0), header(3, 1, 64, u64::MAX)] {
        let mut s = raw_connect(port);
        let _ = s.write_all(&h);
        pre.push(s);
    }
    // After the handshake: the same lies in a frame on an established connection.
    let mut post = Vec::new();
    for h in [
        header(3, 1, u32::MAX, 0),
        header(3, 1, 64, 1 << 40),
        header(3, 1, 64, u64::MAX),
    ] {
        let mut s = handshaken(&b, "hostile_huge_client");
        let _ = s.write_all(&h);
        post.push(s);
    }
    normal_traffic(&a, &b);
    for mut s in pre {
        let (got, _) = read_until_closed(&mut s, CLOSE_LIMIT);
        assert!(
            got.is_empty(),
            "answered a bad pre-HELLO header with {} bytes",
            got.len()
        );
    }
    for mut s in post {
        let (got, _) = read_until_closed(&mut s, CLOSE_LIMIT);
        // Only a GOAWAY (if anything) comes back before the close.
        for f in parse_frames(&got) {
            assert!(matches!(f, Frame::GoAway { .. }), "unexpected {f:?}");
        }
    }
    normal_traffic(&a, &b);
}

#[test]
fn hostile_frame_stalled_mid_way_is_closed_after_op_timeout() {
    let (a, b) = pair(
        "hostile_stall",
        cfg_with(|c| c.op_timeout = Duration::from_millis(500)),
    );
    let mut s = handshaken(&b, "hostile_stall_client");
    let t = Instant::now();
    s.write_all(&header(3, 1, 64, 8)[..10]).unwrap();
    normal_traffic(&a, &b);
    let _ = read_until_closed(&mut s, CLOSE_LIMIT);
    assert!(
        t.elapsed() >= Duration::from_millis(400),
        "{:?}",
        t.elapsed()
    );
}

/// A frame whose header and body arrived and whose payload then trickles in, a byte every
/// 200 ms (each read progresses well within op_timeout), is closed once op_timeout has
/// passed since it began, not when (if ever) it completes.
#[test]
fn hostile_trickled_frame_is_closed_within_op_timeout() {
    let op_timeout = Duration::from_secs(1);
    let (a, b) = pair("hostile_trickle", cfg_with(|c| c.op_timeout = op_timeout));
    let dst = b.alloc_buffer(4096).unwrap();
    let mut s = handshaken(&b, "hostile_trickle_client");
    let frame = write_frame(1, target_of(dst.desc()), (0, 4096), &[(0, 4096)]);
    let head = frame.len() - 4096;
    let t = Instant::now();
    s.write_all(&frame[..head]).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let trickler = {
        let (mut w, stop) = (s.try_clone().unwrap(), stop.clone());
        std::thread::spawn(move || {
            for byte in &frame[head..] {
                if stop.load(std::sync::atomic::Ordering::SeqCst) || w.write_all(&[*byte]).is_err()
                {
                    break;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    let (got, _) = read_until_closed(&mut s, 3 * op_timeout);
    let el = t.elapsed();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    trickler.join().unwrap();
    assert!(
        el >= op_timeout * 9 / 10,
        "closed before op_timeout: {el:?}"
    );
    for f in parse_frames(&got) {
        assert!(matches!(f, Frame::GoAway { .. }), "unexpected {f:?}");
    }
    assert!(b
        .pop_inbound_transfer_status("hostile_trickle_client", 1)
        .is_none());
    normal_traffic(&a, &b);
}

#[test]
fn hostile_out_of_range_writes_are_refused_and_place_nothing() {
    let (a, b) = hostile_pair("hostile_oor");
    let n = 4096u64;
    let dst_init = random_bytes(n as usize, 50);
    let dst = b.register_buffer(dst_init.clone()).unwrap();
    let id = target_of(dst.desc());
    let client = "hostile_oor_client";
    let mut s = handshaken(&b, client);
    // (uid, frame, expected code)
    let cases = [
        (
            1,
            write_frame(1, id, (4000, 4100), &[(4000, 100)]),
            codes::ERR_INVALID_ARGS,
        ),
        (
            2,
            write_frame(2, id, (0, 1 << 30), &[(0, 64)]),
            codes::ERR_INVALID_ARGS,
        ),
        (
            3,
            write_frame(3, id, (0, 100), &[(200, 10)]),
            codes::ERR_INVALID_ARGS,
        ),
        (
            4,
            write_frame(4, (id.0.wrapping_add(77), id.1), (0, 64), &[(0, 64)]),
            codes::ERR_NOT_FOUND,
        ),
    ];
    for (uid, bytes, want) in &cases {
        s.write_all(bytes).unwrap();
        let r = match read_frame(&mut s, Duration::from_secs(5)) {
            Frame::Complete(r) => r,
            f => panic!("uid {uid}: unexpected answer {f:?}"),
        };
        assert_eq!((r.uid, r.code), (*uid, *want), "uid {uid}: {r:?}");
        let st = b
            .pop_inbound_transfer_status(client, *uid)
            .expect("inbound status");
        assert_eq!(st.code().as_u32(), *want, "uid {uid}");
    }
    // A two-chunk transfer past the region: chunk 1 is refused and gets no answer of its
    // own (protocol v4: no ACK); chunk 0 (on this lane, its join lane) is refused too, and
    // the first frame back is the transfer's COMPLETE with chunk 0's tag and the error,
    // with the inbound status recorded first.
    let past = (4090, 5000);
    s.write_all(&part_frame(5, (1, 2, 0), id, past, &[(4096, 4)]))
        .unwrap();
    s.write_all(&part_frame(5, (0, 2, 0), id, past, &[(4090, 6)]))
        .unwrap();
    match read_frame(&mut s, Duration::from_secs(5)) {
        Frame::Complete(r) => assert_eq!((r.tag, r.uid, r.code), (50, 5, codes::ERR_INVALID_ARGS)),
        f => panic!("unexpected answer to chunk 0: {f:?}"),
    }
    let st = b
        .pop_inbound_transfer_status(client, 5)
        .expect("inbound status");
    assert_eq!(st.code().as_u32(), codes::ERR_INVALID_ARGS);
    assert_bytes_eq(
        &dst.to_vec(),
        &dst_init,
        "region after refused hostile writes",
    );
    // While it is connected, normal traffic flows.
    normal_traffic(&a, &b);
    // The connection is still in sync: a valid in-range chunk lands where it says.
    let ok = write_frame(6, id, (10, 20), &[(10, 10)]);
    s.write_all(&ok).unwrap();
    match read_frame(&mut s, Duration::from_secs(5)) {
        Frame::Complete(r) => assert_eq!((r.uid, r.code), (6, codes::SUCCESS), "{r:?}"),
        f => panic!("unexpected {f:?}"),
    }
    let mut want = dst_init;
    want[10..20].copy_from_slice(&ok[ok.len() - 10..]);
    assert_bytes_eq(&dst.to_vec(), &want, "region after one valid hostile write");
    // A frame an initiator must never send closes the connection, after a GOAWAY.
    s.write_all(&hello_ack("whatever")).unwrap();
    let (got, _) = read_until_closed(&mut s, CLOSE_LIMIT);
    let frames = parse_frames(&got);
    assert!(
        matches!(frames.as_slice(), [Frame::GoAway { .. }]),
        "expected a GOAWAY before the close, got {frames:?}"
    );
}

/// A chunk of a multi-chunk transfer naming a join lane its connection's peer does not have
/// closes that connection (after a GOAWAY) before any of its payload is placed; traffic on
/// other connections goes on.
#[test]
fn hostile_join_lanes_close_the_connection() {
    let (a, b) = hostile_pair("hostile_join");
    let n = 4096u64;
    let dst_init = random_bytes(n as usize, 51);
    let dst = b.register_buffer(dst_init.clone()).unwrap();
    let id = target_of(dst.desc());
    // This client dialed lane 0 of 1, so lane 3 is no lane of its.
    let mut s = handshaken(&b, "hostile_join_client");
    s.write_all(&part_frame(7, (1, 2, 3), id, (0, 64), &[(0, 64)]))
        .unwrap();
    let (got, _) = read_until_closed(&mut s, CLOSE_LIMIT);
    let frames = parse_frames(&got);
    assert!(
        matches!(frames.as_slice(), [Frame::GoAway { .. }]),
        "expected a GOAWAY before the close, got {frames:?}"
    );
    assert_bytes_eq(&dst.to_vec(), &dst_init, "region after a bad join lane");
    assert!(b
        .pop_inbound_transfer_status("hostile_join_client", 7)
        .is_none());
    normal_traffic(&a, &b);
}

#[test]
fn hostile_run_form_writes_are_checked_like_lists() {
    let (a, b) = hostile_pair("hostile_runs");
    let dst_init = random_bytes(4096, 60);
    let dst = b.register_buffer(dst_init.clone()).unwrap();
    let id = target_of(dst.desc());
    let mut s = handshaken(&b, "hostile_runs_client");
    let segs = [(0, 8), (16, 8), (32, 8), (48, 8)];
    // Regular segments go as one run; the last one reaches past the declared extent.
    let bad = write_frame(1, id, (0, 40), &segs);
    assert_ne!(bad[3] & morio::proto::frame::FLAG_RUNS, 0, "run form");
    s.write_all(&bad).unwrap();
    match read_frame(&mut s, Duration::from_secs(5)) {
        Frame::Complete(r) => assert_eq!((r.uid, r.code), (1, codes::ERR_INVALID_ARGS)),
        f => panic!("unexpected {f:?}"),
    }
    assert_bytes_eq(&dst.to_vec(), &dst_init, "after a refused run");
    // The connection is in sync: a valid run lands exactly on its segments.
    let ok = write_frame(2, id, (0, 56), &segs);
    s.write_all(&ok).unwrap();
    match read_frame(&mut s, Duration::from_secs(5)) {
        Frame::Complete(r) => assert_eq!((r.uid, r.code), (2, codes::SUCCESS), "{r:?}"),
        f => panic!("unexpected {f:?}"),
    }
    let payload = &ok[ok.len() - 32..];
    let mut want = dst_init;
    for (i, &(off, len)) in segs.iter().enumerate() {
        want[off as usize..(off + len) as usize].copy_from_slice(&payload[i * 8..i * 8 + 8]);
    }
    assert_bytes_eq(&dst.to_vec(), &want, "after a valid run");
    // Runs that describe more segments than a chunk may hold close the connection: the
    // valid frame's fixed part, its run count (which ends it) set to 2, then two huge runs.
    let n_at = HEADER_BYTES + CHUNK_FIXED_BYTES - 4;
    let mut lie = ok[..n_at + 4].to_vec();
    lie[n_at..n_at + 4].copy_from_slice(&2u32.to_le_bytes());
    for _ in 0..2 {
        for v in [0u64, 1] {
            lie.extend_from_slice(&v.to_le_bytes()); // off, len
        }
        lie.extend_from_slice(&u32::MAX.to_le_bytes()); // count
        lie.extend_from_slice(&1u64.to_le_bytes()); // stride
    }
    let body = (lie.len() - HEADER_BYTES) as u32;
    lie[4..8].copy_from_slice(&body.to_le_bytes());
    lie[8..16].copy_from_slice(&1u64.to_le_bytes());
    s.write_all(&lie).unwrap();
    let (got, _) = read_until_closed(&mut s, CLOSE_LIMIT);
    let frames = parse_frames(&got);
    assert!(
        matches!(frames.as_slice(), [Frame::GoAway { .. }]),
        "expected a GOAWAY before the close, got {frames:?}"
    );
    normal_traffic(&a, &b);
}
