//! Peers that go away under transfers: one dying mid-transfer (transfers to others unaffected,
//! a restarted one reached again), a reset lane reported as a lost peer on every lane, and a
//! deregistered peer failing its transfers until it is registered again (its lanes reset,
//! so that what they still held is never delivered).

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use morio::proto::frame::Frame;
use morio::{MemoryDesc, StatusCode};

use super::{poll_until, some_stripe_landed, MIB};
use crate::common::*;

#[test]
fn peer_dies_mid_transfer_others_unaffected_and_restart_reconnects() {
    let op_timeout = Duration::from_secs(3);
    let a = engine("dies_a", cfg_with(|c| c.op_timeout = op_timeout));
    let b = engine("dies_b", test_cfg());
    let c = engine("dies_c", test_cfg());
    a.register_remote_engine(&b.engine_desc()).unwrap();
    a.register_remote_engine(&c.engine_desc()).unwrap();
    let n = 256 * MIB;
    let big = a.register_buffer(vec![0xA5; n]).unwrap();
    let b_dst = b.alloc_buffer(n).unwrap();
    let m = 32 * MIB;
    let c_src = a.register_buffer(random_big(m, 20)).unwrap();
    let c_dst = c.alloc_buffer(m).unwrap();

    let doomed = a.write(big.desc(), 0, b_dst.desc(), 0, n, a.allocate_transfer_uid());
    let uid_c = a.allocate_transfer_uid();
    let other = a.write(c_src.desc(), 0, c_dst.desc(), 0, m, uid_c);
    poll_until(Duration::from_secs(10), "first stripe at b", || {
        some_stripe_landed(&b_dst, 0xA5)
    });
    assert!(
        doomed.in_progress(),
        "precondition: the write is still in flight"
    );
    let t = Instant::now();
    within(Duration::from_secs(10), "dropping engine b", move || {
        drop(b)
    });
    let code = wait_within(&doomed, op_timeout + Duration::from_secs(2));
    assert_eq!(code, StatusCode::ErrBadState, "{}", doomed.message());
    assert!(
        t.elapsed() <= op_timeout + Duration::from_secs(1),
        "{:?}",
        t.elapsed()
    );

    // The transfer to c, started at the same time, is unaffected; so is the next one.
    assert_ok(&other, "concurrent write to c");
    assert_eq!(inbound(&c, a.key(), uid_c), StatusCode::Success);
    assert_bytes_eq(&c_dst.to_vec(), &c_src.to_vec(), "concurrent write to c");
    let small = random_buffer(&a, 4096, 21);
    assert_ok(
        &a.write(
            small.desc(),
            0,
            c_dst.desc(),
            0,
            4096,
            a.allocate_transfer_uid(),
        ),
        "later",
    );
    assert_bytes_eq(
        &bytes_at(&c_dst, 0, 4096),
        &small.to_vec(),
        "later write to c",
    );

    // b restarts (same key, new engine, new port) and is registered again: a reconnects.
    let b2 = engine("dies_b", test_cfg());
    a.register_remote_engine(&b2.engine_desc()).unwrap();
    let k = 4 * MIB;
    let src = a.register_buffer(random_big(k, 22)).unwrap();
    let dst = b2.alloc_buffer(k).unwrap();
    let uid = a.allocate_transfer_uid();
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, k, uid),
        "write to the restarted peer",
    );
    assert_eq!(inbound(&b2, a.key(), uid), StatusCode::Success);
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "write to the restarted peer");
}

/// A peer that goes away is reported as a lost connection, also to transfers on its other
/// lanes that the loss reaches only through another transfer's cancellation: here lane 0's
/// connection is reset while lane 1 is mid-frame (the fake target reads nothing) with a
/// stripe of the transfer lane 0 carried, and a second transfer waits behind it on lane 1.
#[test]
fn a_lost_peer_is_reported_as_lost_on_every_lane_not_as_a_timeout() {
    use std::sync::mpsc;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for conn in l.incoming().take(2) {
            let Ok(mut c) = conn else { return };
            let Ok(Frame::Hello(h)) = try_read_frame(&mut c, Duration::from_secs(5)) else {
                return;
            };
            let _ = c.write_all(&hello_ack("lost_fake"));
            let _ = tx.send((h.lane, c));
        }
    });
    let a = engine(
        "lost_a",
        cfg_with(|c| {
            c.num_shards = Some(1);
            c.num_data_conns = 2;
            c.chunk_bytes = 16 * MIB;
            c.sock_sndbuf_bytes = 256 << 10;
            c.op_timeout = Duration::from_secs(30);
        }),
    );
    a.register_remote_engine(&desc_at("lost_fake", port))
        .unwrap();
    let remote = MemoryDesc::cpu("lost_fake", 0, 0x10000, 64 << 20);
    let src = a.register_buffer(vec![0x5A; 32 * MIB]).unwrap();
    // Striped: a 16 MiB frame on each lane (home lane 0). Then a small one, home lane 1,
    // queued behind the big frame there.
    let big = a.write(
        src.desc(),
        0,
        &remote,
        0,
        32 * MIB,
        a.allocate_transfer_uid(),
    );
    let small = a.write(src.desc(), 0, &remote, 0, 4096, a.allocate_transfer_uid());
    let mut conns: Vec<(u16, TcpStream)> = (0..2)
        .map(|_| {
            rx.recv_timeout(Duration::from_secs(10))
                .expect("both lanes dial")
        })
        .collect();
    conns.sort_by_key(|(lane, _)| *lane);
    // Both writers are blocked mid-frame on full sockets.
    std::thread::sleep(Duration::from_millis(300));
    assert!(big.in_progress() && small.in_progress(), "precondition");
    let t = Instant::now();
    let (_, lane0) = conns.remove(0);
    socket2::SockRef::from(&lane0)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(lane0); // reset: the peer is gone, as far as lane 0 can tell
    for (what, st) in [
        ("striped write", &big),
        ("write behind it on lane 1", &small),
    ] {
        let code = wait_within(st, Duration::from_secs(10));
        let msg = st.message();
        assert_eq!(code, StatusCode::ErrBadState, "{what}: {msg}");
        assert!(msg.contains("lost"), "{what}: {msg}");
        assert!(!msg.contains("timed out"), "{what}: {msg}");
    }
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    drop(conns);
}

#[test]
fn deregistering_a_peer_fails_its_transfers_and_reregistering_works() {
    let (a, b) = pair("dereg_peer", test_cfg());
    let n = 256 * MIB;
    let big = a.register_buffer(vec![0x3C; n]).unwrap();
    let dst = b.alloc_buffer(n).unwrap();
    let st = a.write(big.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid());
    poll_until(Duration::from_secs(10), "first stripe", || {
        some_stripe_landed(&dst, 0x3C)
    });
    assert!(
        st.in_progress(),
        "precondition: the write is still in flight"
    );
    a.deregister_remote_engine(&b.engine_desc());
    assert_eq!(
        wait_within(&st, Duration::from_secs(5)),
        StatusCode::ErrBadState,
        "{}",
        st.message()
    );
    let small = random_buffer(&a, 4096, 23);
    let st = a.write(
        small.desc(),
        0,
        dst.desc(),
        0,
        4096,
        a.allocate_transfer_uid(),
    );
    assert_eq!(
        st.code(),
        StatusCode::ErrNotFound,
        "unknown peer: {}",
        st.message()
    );
    a.register_remote_engine(&b.engine_desc()).unwrap();
    let st = a.write(
        small.desc(),
        0,
        dst.desc(),
        0,
        4096,
        a.allocate_transfer_uid(),
    );
    assert_ok(&st, "after re-registering");
    assert_bytes_eq(
        &bytes_at(&dst, 0, 4096),
        &small.to_vec(),
        "after re-registering",
    );
}

/// A peer deregistered while a write to it is half sent: the write fails at once, and its
/// lane is reset rather than closed in order, so the peer never gets the rest of what the
/// socket still held (it would land after the failure was reported).
#[test]
fn deregistering_a_peer_resets_lanes_that_still_carried_its_transfers() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let fake = std::thread::spawn(move || {
        let mut c = accept_lane(&l, "retired_fake");
        // Not read until the write has failed: its frame fills both sockets' buffers.
        std::thread::sleep(Duration::from_millis(500));
        read_until_closed(&mut c, Duration::from_secs(10))
    });
    let a = engine(
        "retired_a",
        cfg_with(|c| {
            c.num_shards = Some(1);
            c.num_data_conns = 1;
            c.sock_sndbuf_bytes = 256 << 10;
        }),
    );
    let desc = desc_at("retired_fake", port);
    a.register_remote_engine(&desc).unwrap();
    let remote = MemoryDesc::cpu("retired_fake", 0, 0x10000, 64 << 20);
    let n = 16 * MIB;
    let src = a.register_buffer(vec![0x5A; n]).unwrap();
    let st = a.write(src.desc(), 0, &remote, 0, n, a.allocate_transfer_uid());
    std::thread::sleep(Duration::from_millis(200));
    assert!(st.in_progress(), "the writer is blocked mid-frame");
    a.deregister_remote_engine(&desc);
    assert_eq!(
        wait_within(&st, Duration::from_secs(5)),
        StatusCode::ErrBadState,
        "{}",
        st.message()
    );
    let (got, closed) = fake.join().unwrap();
    assert_eq!(closed, Closed::Reset, "after {} bytes", got.len());
    assert!(got.len() < n, "{} bytes", got.len());
}

/// A peer that resets the connection in the middle of a READ_DATA's payload: the read fails
/// at once, as lost with its lane, not at its deadline (its chunk had left the lane's book
/// when its answer was matched).
#[test]
fn a_read_cut_off_mid_data_fails_at_once() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let n = 1 << 20;
    let fake = std::thread::spawn(move || {
        let mut c = accept_lane(&l, "cut_read_fake");
        let Frame::Read { chunk, final_, .. } = read_frame(&mut c, Duration::from_secs(10)) else {
            panic!("expected READ");
        };
        let reply = morio::proto::frame::Reply {
            tag: chunk.tag,
            uid: chunk.uid,
            chunk: 0,
            code: 0,
            msg: String::new(),
        };
        let mut out = encode(&Frame::ReadData { reply, final_ }, n as u64);
        out.resize(out.len() + n / 2, 0xC3);
        c.write_all(&out).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        socket2::SockRef::from(&c)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(c); // reset, half the data sent
    });
    let a = engine(
        "cut_read_a",
        cfg_with(|c| {
            c.num_shards = Some(1);
            c.num_data_conns = 1;
            c.op_timeout = Duration::from_secs(20);
        }),
    );
    a.register_remote_engine(&desc_at("cut_read_fake", port))
        .unwrap();
    let far = MemoryDesc::cpu("cut_read_fake", 1, 0x10000, n as u64);
    let dst = a.alloc_buffer(n).unwrap();
    let t = Instant::now();
    let st = a.read(dst.desc(), 0, &far, 0, n, a.allocate_transfer_uid());
    let code = wait_within(&st, Duration::from_secs(30));
    let msg = st.message();
    assert_eq!(code, StatusCode::ErrBadState, "{msg}");
    assert!(msg.contains("lost") && !msg.contains("timed out"), "{msg}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "failed after {:?}",
        t.elapsed()
    );
    fake.join().unwrap();
}
