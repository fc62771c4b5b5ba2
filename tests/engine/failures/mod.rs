//! Failure cases: argument errors, unknown or out-of-range remote memory (zero bytes
//! written), no backend, dying and silent peers, deregistration and engine drop with
//! transfers in flight, and `wait_all` over real failures; hostile clients on the listening
//! port are in [`hostile`].

use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use morio::proto::frame::Frame;
use morio::proto::limits::VERSION;
use morio::{
    AccessKey, EngineError, IoEngine, IoEngineConfig, MemoryDesc, MemoryLocationType,
    RegisteredBuffer, StatusCode, TransferStatus,
};

use super::common::*;

const MIB: usize = 1 << 20;

/// Poll `cond` (a memory probe, where no status can tell) until it holds, at most `limit`.
#[track_caller]
fn poll_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < limit, "{what}: not after {limit:?}");
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Whether the last byte of any of the first eight 1 MiB stripes of `buf` holds `v`.
fn some_stripe_landed(buf: &RegisteredBuffer, v: u8) -> bool {
    (0..8).any(|k| {
        let mut b = [0u8];
        buf.read_at(k * MIB + MIB - 1, &mut b);
        b[0] == v
    })
}

mod hostile;

// --- argument errors at submission ------------------------------------------------------

#[test]
fn invalid_args_fail_synchronously_and_move_nothing() {
    let (a, b) = pair("inval", test_cfg());
    let n = 4096;
    let src = random_buffer(&a, n, 1);
    let local_init = src.to_vec();
    let dst_init = random_bytes(n, 2);
    let dst = b.register_buffer(dst_init.clone()).unwrap();
    let (s, d) = (src.desc(), dst.desc());
    let sess = a.create_session(s, d).unwrap();
    let u = || a.allocate_transfer_uid();
    let first_uid = a.allocate_transfer_uid();
    let cases: Vec<(&str, Arc<TransferStatus>)> = vec![
        (
            "write: local offset+size past the end",
            a.write(s, 4000, d, 0, 100, u()),
        ),
        (
            "write: local offset past the end",
            a.write(s, n + 1, d, 0, 1, u()),
        ),
        (
            "write: size larger than both regions",
            a.write(s, 0, d, 0, n + 1, u()),
        ),
        (
            "write: remote offset+size past the end",
            a.write(s, 0, d, 4000, 100, u()),
        ),
        (
            "write: remote offset past the end",
            a.write(s, 0, d, n + 1, 1, u()),
        ),
        (
            "read: remote offset+size past the end",
            a.read(s, 0, d, 4090, 7, u()),
        ),
        (
            "read: local offset+size past the end",
            a.read(s, 4090, d, 0, 7, u()),
        ),
        (
            "write: local offset+size overflows",
            a.write(s, usize::MAX, d, 0, 2, u()),
        ),
        (
            "write: remote offset+size overflows",
            a.write(s, 0, d, usize::MAX - 1, 4, u()),
        ),
        ("read: size overflows", a.read(s, 1, d, 1, usize::MAX, u())),
        ("session write out of range", sess.write(0, 4095, 2, u())),
        ("session read out of range", sess.read(4095, 0, 2, u())),
        (
            "session batch_write: local offsets shorter than sizes",
            sess.batch_write(&[0, 8], &[0, 8, 16], &[8, 8, 8], u()),
        ),
        (
            "session batch_read: remote offsets shorter than sizes",
            sess.batch_read(&[0, 8], &[0], &[8, 8], u()),
        ),
        (
            "session batch_write: last entry out of range",
            sess.batch_write(&[0, 100, 200], &[0, 100, 4090], &[10, 10, 10], u()),
        ),
        (
            "session batch_read: entry overflows",
            sess.batch_read(&[0, 100], &[0, usize::MAX], &[10, 10], u()),
        ),
        (
            "local descriptor of another engine",
            a.write(d, 0, d, 0, 16, u()),
        ),
    ];
    let last_uid = a.allocate_transfer_uid();
    for (what, st) in &cases {
        // Already terminal when the call returned: no waiting.
        assert_eq!(
            st.code(),
            StatusCode::ErrInvalidArgs,
            "{what}: {}",
            st.message()
        );
        assert!(st.failed());
    }
    // Engine-level batches with outer lists of different lengths.
    let md = |x: &RegisteredBuffer| x.desc().clone();
    let sts = a.batch_write(
        &[md(&src), md(&src)],
        &[vec![0], vec![8]],
        &[md(&dst)],
        &[vec![0], vec![8]],
        &[vec![8], vec![8]],
        &[u(), u()],
    );
    assert!(!sts.is_empty());
    for st in &sts {
        assert_eq!(st.code(), StatusCode::ErrInvalidArgs, "{}", st.message());
    }
    // Lookups that fail at submission.
    let mut unknown_local = s.clone();
    unknown_local.id = 4242;
    let st = a.write(&unknown_local, 0, d, 0, 16, u());
    assert_eq!(st.code(), StatusCode::ErrNotFound, "{}", st.message());
    let nobody = MemoryDesc::cpu("nobody", 0, 0, 1 << 20);
    let st = a.write(s, 0, &nobody, 0, 16, u());
    assert_eq!(st.code(), StatusCode::ErrNotFound, "{}", st.message());
    // Zero bytes is a success at once (MORI).
    let st = a.write(s, 0, d, 0, 0, u());
    assert_eq!(st.code(), StatusCode::Success);

    // Nothing moved in either direction, and no target status exists for any of them.
    assert_bytes_eq(&dst.to_vec(), &dst_init, "target after refused submissions");
    assert_bytes_eq(
        &src.to_vec(),
        &local_init,
        "local after refused submissions",
    );
    for uid in first_uid..last_uid {
        assert!(
            b.pop_inbound_transfer_status(a.key(), uid).is_none(),
            "uid {uid}"
        );
    }
    // And the engine is fine (MORI: the error path is recoverable).
    let uid = u();
    assert_ok(&a.write(s, 0, d, 0, n, uid), "write after the errors");
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
    assert_bytes_eq(&dst.to_vec(), &local_init, "write after the errors");
}

// --- remote memory that is unknown or too small -----------------------------------------

#[test]
fn unknown_remote_region_is_not_found_and_untouched() {
    let (a, b) = pair("unknown_mem", test_cfg());
    for n in [4096usize, 4 * MIB] {
        let src = a.register_buffer(random_big(n, 3)).unwrap();
        let dst_init = random_big(n, 4);
        let dst = b.register_buffer(dst_init.clone()).unwrap();
        let local_init = src.to_vec();
        let mut bogus = dst.desc().clone();
        bogus.id = 9999;
        let uid = a.allocate_transfer_uid();
        let st = a.write(src.desc(), 0, &bogus, 0, n, uid);
        assert_eq!(
            wait(&st),
            StatusCode::ErrNotFound,
            "write {n}: {}",
            st.message()
        );
        assert_eq!(inbound(&b, a.key(), uid), StatusCode::ErrNotFound);
        let uid = a.allocate_transfer_uid();
        let st = a.read(src.desc(), 0, &bogus, 0, n, uid);
        assert_eq!(
            wait(&st),
            StatusCode::ErrNotFound,
            "read {n}: {}",
            st.message()
        );
        assert_eq!(inbound(&b, a.key(), uid), StatusCode::ErrNotFound);
        assert_bytes_eq(&dst.to_vec(), &dst_init, "real region next to the bogus id");
        assert_bytes_eq(
            &src.to_vec(),
            &local_init,
            "local buffer of the refused read",
        );
    }

    // A region deregistered on the target (raw registration: the test keeps the memory).
    let n = 2 * MIB;
    let src = a.register_buffer(random_big(n, 5)).unwrap();
    let mut mem = random_big(n, 6);
    // SAFETY: `mem` outlives the registration (deregistered below, before it is dropped).
    let md =
        unsafe { b.register_memory(mem.as_mut_ptr(), n, -1, MemoryLocationType::Cpu) }.unwrap();
    assert_ok(
        &a.write(src.desc(), 0, &md, 0, n, a.allocate_transfer_uid()),
        "before",
    );
    b.deregister_memory(&md).expect("deregister");
    assert_bytes_eq(&mem, &src.to_vec(), "write before deregistering");
    mem.copy_from_slice(&random_big(n, 7));
    let snapshot = mem.clone();
    let fresh = a.register_buffer(random_big(n, 8)).unwrap();
    for (size, what) in [(4096usize, "small"), (n, "striped")] {
        let uid = a.allocate_transfer_uid();
        let st = a.write(fresh.desc(), 0, &md, 0, size, uid);
        assert_eq!(
            wait(&st),
            StatusCode::ErrNotFound,
            "{what} write: {}",
            st.message()
        );
        assert_eq!(inbound(&b, a.key(), uid), StatusCode::ErrNotFound);
        let st = a.read(fresh.desc(), 0, &md, 0, size, a.allocate_transfer_uid());
        assert_eq!(
            wait(&st),
            StatusCode::ErrNotFound,
            "{what} read: {}",
            st.message()
        );
    }
    assert_bytes_eq(&mem, &snapshot, "deregistered memory");
}

#[test]
fn forged_oversized_remote_desc_writes_zero_bytes() {
    let (a, b) = pair("forged", test_cfg());
    // (real region size, forged size, remote offset, size, label)
    let cases = [
        (
            8192usize,
            MIB,
            6000usize,
            4096usize,
            "single chunk straddling the end",
        ),
        (
            8192,
            MIB,
            100_000,
            4096,
            "single chunk entirely past the end",
        ),
        (
            4 * MIB,
            8 * MIB,
            MIB,
            4 * MIB,
            "striped, straddling the end",
        ),
        (
            4 * MIB,
            64 * MIB,
            8 * MIB,
            4 * MIB,
            "striped, entirely past the end",
        ),
    ];
    for (real, forged_size, off, size, what) in cases {
        let src = a.register_buffer(random_big(size, 10)).unwrap();
        let dst_init = random_big(real, 11);
        let dst = b.register_buffer(dst_init.clone()).unwrap();
        let mut forged = dst.desc().clone();
        forged.size = forged_size as u64;
        let uid = a.allocate_transfer_uid();
        let st = a.write(src.desc(), 0, &forged, off, size, uid);
        assert_eq!(
            wait(&st),
            StatusCode::ErrInvalidArgs,
            "{what}: {}",
            st.message()
        );
        assert_eq!(
            inbound(&b, a.key(), uid),
            StatusCode::ErrInvalidArgs,
            "{what}"
        );
        assert_bytes_eq(&dst.to_vec(), &dst_init, &format!("{what}: target region"));
        // The same range read: refused, and the local buffer keeps its bytes.
        let local_init = src.to_vec();
        let uid = a.allocate_transfer_uid();
        let st = a.read(src.desc(), 0, &forged, off, size, uid);
        assert_eq!(
            wait(&st),
            StatusCode::ErrInvalidArgs,
            "{what} read: {}",
            st.message()
        );
        assert_eq!(
            inbound(&b, a.key(), uid),
            StatusCode::ErrInvalidArgs,
            "{what} read"
        );
        assert_bytes_eq(
            &src.to_vec(),
            &local_init,
            &format!("{what}: local of the read"),
        );
    }

    // A striped batch whose first segments fit and whose last does not: nothing lands.
    let real = 4 * MIB;
    let src = a.register_buffer(random_big(real, 12)).unwrap();
    let dst_init = random_big(real, 13);
    let dst = b.register_buffer(dst_init.clone()).unwrap();
    let mut forged = dst.desc().clone();
    forged.size = 2 * real as u64;
    let sess = a.create_session(src.desc(), &forged).unwrap();
    let uid = sess.allocate_transfer_uid();
    let st = sess.batch_write(
        &[0, MIB, 2 * MIB],
        &[0, MIB, real - MIB / 2],
        &[MIB, MIB, MIB],
        uid,
    );
    assert_eq!(wait(&st), StatusCode::ErrInvalidArgs, "{}", st.message());
    assert_bytes_eq(
        &dst.to_vec(),
        &dst_init,
        "batch with its last segment past the end",
    );
    // The engine and the lanes are fine afterwards.
    let uid = a.allocate_transfer_uid();
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, real, uid),
        "valid write afterwards",
    );
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "valid write afterwards");
}

// --- no backend --------------------------------------------------------------------------

#[test]
fn transfers_before_create_backend_are_bad_state() {
    let e = IoEngine::new("nobackend", IoEngineConfig::new("127.0.0.1", 0)).unwrap();
    assert_eq!(e.n_shards(), 0);
    let buf = e.alloc_buffer(64).unwrap();
    e.register_remote_engine(&desc_at("elsewhere", 9)).unwrap();
    let remote = MemoryDesc::cpu("elsewhere", 0, 0x1000, 64);
    let uid = e.allocate_transfer_uid();
    for st in [
        e.write(buf.desc(), 0, &remote, 0, 64, uid),
        e.read(buf.desc(), 0, &remote, 0, 64, uid),
    ] {
        assert_eq!(st.code(), StatusCode::ErrBadState, "{}", st.message());
    }
    let sts = e.batch_read(
        &[buf.desc().clone()],
        &[vec![0]],
        std::slice::from_ref(&remote),
        &[vec![0]],
        &[vec![64]],
        &[uid],
    );
    assert_eq!(sts.len(), 1);
    assert_eq!(sts[0].code(), StatusCode::ErrBadState);
    assert!(e.create_session(buf.desc(), &remote).is_none());
    // Memory registered before the backend is usable once it exists.
    e.create_backend(test_cfg()).unwrap();
    assert!(e.create_session(buf.desc(), &remote).is_some());
    let b = engine("nobackend_peer", test_cfg());
    e.register_remote_engine(&b.engine_desc()).unwrap();
    buf.write_at(0, &random_bytes(64, 14));
    let dst = b.alloc_buffer(64).unwrap();
    assert_ok(
        &e.write(buf.desc(), 0, dst.desc(), 0, 64, e.allocate_transfer_uid()),
        "late",
    );
    assert_bytes_eq(
        &dst.to_vec(),
        &buf.to_vec(),
        "memory registered before the backend",
    );
}

// --- peers that die or go silent -----------------------------------------------------------

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

/// Writes and reads (small and striped) to a fake peer that never completes them: each fails
/// with ERR_BAD_STATE after about `op_timeout` (300 ms), well within 2 s. Each case runs on
/// a fresh initiator, so its lanes start from nothing and the lower bound is exact (on one
/// engine, a transfer queued behind a dial that is about to time out fails with that dial,
/// earlier than its own deadline, as MORI's peer abort fails waiting ops).
fn times_out_against(mode: FakeMode, prefix: &str) {
    let fake_key = format!("{prefix}_fake");
    let fake = FakePeer::start(&fake_key, mode);
    let cfg = cfg_with(|c| c.op_timeout = Duration::from_millis(300));
    let remote = MemoryDesc::cpu(&fake_key, 0, 0x10000, 16 << 20);
    let data = random_big(2 * MIB, 30);
    let mut keys = Vec::new();
    let mut last = None;
    for (i, (size, read)) in [
        (4096usize, false),
        (4096, true),
        (2 * MIB, false),
        (2 * MIB, true),
    ]
    .into_iter()
    .enumerate()
    {
        let a = engine(&format!("{prefix}_a{i}"), cfg.clone());
        keys.push(a.key().to_string());
        a.register_remote_engine(&desc_at(&fake_key, fake.port))
            .unwrap();
        let src = a.register_buffer(data.clone()).unwrap();
        let t = Instant::now();
        let uid = a.allocate_transfer_uid();
        let st = if read {
            a.read(src.desc(), 0, &remote, 0, size, uid)
        } else {
            a.write(src.desc(), 0, &remote, 0, size, uid)
        };
        let code = wait_within(&st, Duration::from_secs(2));
        let el = t.elapsed();
        let what = format!("{mode:?} size {size} read={read}");
        assert_eq!(code, StatusCode::ErrBadState, "{what}: {}", st.message());
        assert!(
            el >= Duration::from_millis(250),
            "{what}: failed before the timeout: {el:?}"
        );
        assert!(el < Duration::from_secs(2), "{what}: {el:?}");
        assert_bytes_eq(&src.to_vec(), &data, &format!("{what}: local buffer"));
        last = Some((a, src));
    }
    let hellos = fake.hellos.lock().unwrap().clone();
    assert!(!hellos.is_empty(), "no engine dialed the fake peer");
    for h in &hellos {
        assert_eq!(h.version, VERSION);
        assert!(keys.contains(&h.src_key), "{h:?}");
        assert_eq!(h.dst_key, fake_key);
        assert!(h.lane < h.n_lanes);
    }
    // The engine still works with a real peer.
    let (a, src) = last.unwrap();
    let b = engine(&format!("{prefix}_b"), test_cfg());
    a.register_remote_engine(&b.engine_desc()).unwrap();
    let dst = b.alloc_buffer(2 * MIB).unwrap();
    assert_ok(
        &a.write(
            src.desc(),
            0,
            dst.desc(),
            0,
            2 * MIB,
            a.allocate_transfer_uid(),
        ),
        "real",
    );
    assert_bytes_eq(&dst.to_vec(), &data, "write to a real peer afterwards");
}

#[test]
fn op_timeout_when_peer_never_answers_hello() {
    times_out_against(FakeMode::Silent, "to_hello");
}

#[test]
fn op_timeout_when_peer_goes_silent_after_handshake() {
    times_out_against(FakeMode::AckThenSilent, "to_silent");
}

// --- deregistration and drop with transfers in flight --------------------------------------

#[test]
fn deregister_target_memory_during_large_write() {
    let (a, b) = pair("dereg_busy", test_cfg());
    let n = 256 * MIB;
    let src = a.register_buffer(vec![0xC3; n]).unwrap();
    let mut mem = vec![0u8; n];
    let base = mem.as_mut_ptr();
    // SAFETY: `mem` lives until the end of the test, after its deregistration returned.
    let md = unsafe { b.register_memory(base, n, -1, MemoryLocationType::Cpu) }.unwrap();
    let st = a.write(src.desc(), 0, &md, 0, n, a.allocate_transfer_uid());
    poll_until(Duration::from_secs(10), "first stripe", || {
        // SAFETY: in bounds; a volatile probe of bytes the engine is placing.
        (0..8).any(|k| unsafe { base.add(k * MIB + MIB - 1).read_volatile() } == 0xC3)
    });
    assert!(
        st.in_progress(),
        "precondition: the write is still in flight"
    );
    let t = Instant::now();
    b.deregister_memory(&md)
        .expect("deregister with a write in flight");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "deregister took {:?}",
        t.elapsed()
    );
    // From here on the engine must not touch `mem`.
    let snapshot = mem.clone();
    let code = wait_within(&st, Duration::from_secs(25));
    assert!(
        matches!(
            code,
            StatusCode::Success | StatusCode::ErrNotFound | StatusCode::ErrBadState
        ),
        "{code}: {}",
        st.message()
    );
    assert_bytes_eq(
        &mem,
        &snapshot,
        "memory written after deregister_memory returned",
    );
    // The deregistered descriptor is gone; the engine keeps working with other regions.
    let small = random_buffer(&a, 4096, 60);
    let st = a.write(small.desc(), 0, &md, 0, 4096, a.allocate_transfer_uid());
    assert_eq!(wait(&st), StatusCode::ErrNotFound, "{}", st.message());
    let other = b.alloc_buffer(4 * MIB).unwrap();
    let data = a.register_buffer(random_big(4 * MIB, 61)).unwrap();
    let uid = a.allocate_transfer_uid();
    assert_ok(
        &a.write(data.desc(), 0, other.desc(), 0, 4 * MIB, uid),
        "write afterwards",
    );
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
    assert_bytes_eq(&other.to_vec(), &data.to_vec(), "write afterwards");
    drop(mem);
}

#[test]
fn deregister_unknown_or_foreign_desc_is_an_error() {
    let (a, b) = pair("dereg_unknown", test_cfg());
    let buf = b.alloc_buffer(64).unwrap();
    let mut bogus = buf.desc().clone();
    bogus.id = 31337;
    assert!(matches!(
        b.deregister_memory(&bogus),
        Err(EngineError::UnknownMemory(31337))
    ));
    // A descriptor of another engine (same id, other key).
    let theirs = a.alloc_buffer(64).unwrap();
    assert!(b.deregister_memory(theirs.desc()).is_err());
    // The right id with another access key (a descriptor of an earlier registration whose
    // id was drawn again) names no memory of this engine.
    let mut stale = buf.desc().clone();
    stale.access_key = AccessKey::NONE;
    assert!(matches!(
        b.deregister_memory(&stale),
        Err(EngineError::UnknownMemory(_))
    ));
    // Twice: the second is unknown. (Raw registration, so nothing else holds the region.)
    let mut mem = vec![0u8; 64];
    // SAFETY: `mem` outlives the registration.
    let md =
        unsafe { b.register_memory(mem.as_mut_ptr(), 64, -1, MemoryLocationType::Cpu) }.unwrap();
    b.deregister_memory(&md).unwrap();
    assert!(matches!(
        b.deregister_memory(&md),
        Err(EngineError::UnknownMemory(_))
    ));
    // Host memory claimed as GPU memory: no runtime here, or one that says it is not device
    // memory; either way a typed error.
    // SAFETY: refused before the pointer is used.
    let gpu = unsafe { b.register_memory(mem.as_mut_ptr(), 64, 0, MemoryLocationType::Gpu) };
    assert!(matches!(gpu, Err(EngineError::Gpu(_))), "{gpu:?}");
    // CPU memory with a device id, and an unknown location.
    // SAFETY: refused before the pointer is used.
    let cpu = unsafe { b.register_memory(mem.as_mut_ptr(), 64, 0, MemoryLocationType::Cpu) };
    assert!(matches!(cpu, Err(EngineError::UnsupportedMemory(_))));
    // SAFETY: refused before the pointer is used.
    let unk = unsafe { b.register_memory(mem.as_mut_ptr(), 64, -1, MemoryLocationType::Unknown) };
    assert!(matches!(unk, Err(EngineError::UnsupportedMemory(_))));
    drop(mem);
}

#[test]
fn deregister_registered_buffer_while_the_handle_is_alive() {
    let b = engine(
        "dereg_owned",
        cfg_with(|c| c.op_timeout = Duration::from_millis(500)),
    );
    let buf = b.alloc_buffer(4096).unwrap();
    let desc = buf.desc().clone();
    let b = Arc::new(b);
    let b2 = b.clone();
    let t = Instant::now();
    let r = within(Duration::from_secs(10), "deregister_memory", move || {
        b2.deregister_memory(&desc).map_err(|e| e.to_string())
    });
    assert!(
        r.is_ok(),
        "deregister of a held RegisteredBuffer: {r:?} after {:?}",
        t.elapsed()
    );
    assert!(
        t.elapsed() < Duration::from_millis(400),
        "took {:?}",
        t.elapsed()
    );
    // The handle still reads and writes its own bytes; peers can no longer resolve it.
    assert!(buf.write_at(0, &[1, 2, 3]));
    assert_eq!(bytes_at(&buf, 0, 3), [1, 2, 3]);
}

#[test]
fn dropping_the_initiator_fails_in_flight_transfers_and_joins() {
    let (a, b) = pair("drop_init", test_cfg());
    let n = 32 * MIB;
    let probe_local = a.alloc_buffer(16).unwrap();
    let probe_remote = b.alloc_buffer(16).unwrap();
    let sess = a
        .create_session(probe_local.desc(), probe_remote.desc())
        .unwrap();
    // Buffers first, then every submission back to back, then the drop at once.
    let writes: Vec<_> = (0..4u8)
        .map(|k| {
            (
                a.register_buffer(vec![k + 1; n]).unwrap(),
                b.alloc_buffer(n).unwrap(),
            )
        })
        .collect();
    let reads: Vec<_> = (0..2u8)
        .map(|k| {
            (
                a.alloc_buffer(n).unwrap(),
                b.register_buffer(vec![k + 7; n]).unwrap(),
            )
        })
        .collect();
    let mut statuses = Vec::new();
    for (src, dst) in &writes {
        statuses.push(a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()));
    }
    for (local, remote) in &reads {
        statuses.push(a.read(
            local.desc(),
            0,
            remote.desc(),
            0,
            n,
            a.allocate_transfer_uid(),
        ));
    }
    let t = Instant::now();
    within(Duration::from_secs(10), "dropping engine a", move || {
        drop(a)
    });
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "drop took {:?}",
        t.elapsed()
    );
    // Right after the drop returned: nothing is left in progress.
    let codes: Vec<StatusCode> = statuses.iter().map(|s| s.code()).collect();
    for (i, (c, s)) in codes.iter().zip(&statuses).enumerate() {
        assert!(
            matches!(c, StatusCode::Success | StatusCode::ErrBadState),
            "transfer {i} is {c} after the drop: {}",
            s.message()
        );
    }
    assert!(
        codes.contains(&StatusCode::ErrBadState),
        "no transfer was in flight at the drop: {codes:?}"
    );
    // A session that outlived its engine refuses work.
    let st = sess.write(0, 0, 16, sess.allocate_transfer_uid());
    assert_eq!(st.code(), StatusCode::ErrBadState, "{}", st.message());
    // The target is unaffected: a new initiator with the same key works with it.
    let a2 = engine("drop_init_a", test_cfg());
    a2.register_remote_engine(&b.engine_desc()).unwrap();
    let src = a2.register_buffer(random_big(2 * MIB, 70)).unwrap();
    let dst = b.alloc_buffer(2 * MIB).unwrap();
    let uid = a2.allocate_transfer_uid();
    assert_ok(
        &a2.write(src.desc(), 0, dst.desc(), 0, 2 * MIB, uid),
        "new initiator",
    );
    assert_eq!(inbound(&b, a2.key(), uid), StatusCode::Success);
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "new initiator");
}

// --- wait_all over real transfers -----------------------------------------------------------

#[test]
fn wait_all_returns_the_first_failure_in_list_order() {
    let (a, b) = pair("waitall", test_cfg());
    let n = 16 * MIB;
    let src = a.register_buffer(random_big(n, 80)).unwrap();
    let dst = b.alloc_buffer(n).unwrap();
    let mut bogus = dst.desc().clone();
    bogus.id = 5555;
    let ok = |off: usize, len: usize| {
        a.write(
            src.desc(),
            off,
            dst.desc(),
            off,
            len,
            a.allocate_transfer_uid(),
        )
    };
    let not_found = || a.write(src.desc(), 0, &bogus, 0, 4096, a.allocate_transfer_uid());
    let invalid = || a.write(src.desc(), 0, dst.desc(), n, 1, a.allocate_transfer_uid());

    let list = [ok(0, n), not_found()];
    assert_eq!(a.wait_all(&list, -1), StatusCode::ErrNotFound);
    assert_eq!(
        list[0].code(),
        StatusCode::Success,
        "wait_all(-1) waits for every status"
    );
    assert_eq!(list[1].code(), StatusCode::ErrNotFound);
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "the successful one");

    let list = [not_found(), ok(0, n)];
    assert_eq!(a.wait_all(&list, -1), StatusCode::ErrNotFound);
    assert!(list.iter().all(|s| s.code().is_terminal()));

    let list = [ok(0, MIB), not_found(), invalid()];
    assert_eq!(a.wait_all(&list, -1), StatusCode::ErrNotFound);
    let list = [ok(0, MIB), invalid(), not_found()];
    assert_eq!(a.wait_all(&list, -1), StatusCode::ErrInvalidArgs);
    assert!(list.iter().all(|s| s.code().is_terminal()));
    // Bounded and polling forms over finished statuses agree.
    assert_eq!(a.wait_all(&list, 10_000), StatusCode::ErrInvalidArgs);
    assert_eq!(a.wait_all(&list, 0), StatusCode::ErrInvalidArgs);
    let list = [ok(0, MIB), ok(MIB, MIB)];
    assert_eq!(a.wait_all(&list, -1), StatusCode::Success);
    assert_eq!(a.wait_all(&[], -1), StatusCode::Success);
}

// --- peers that hang in connect ---------------------------------------------------------

#[test]
fn unresponsive_peer_does_not_stall_dials_to_other_peers() {
    let hole = BlackHole::new();
    let a = engine(
        "hole_a",
        cfg_with(|c| c.op_timeout = Duration::from_secs(3)),
    );
    let c = engine("hole_c", test_cfg());
    a.register_remote_engine(&desc_at("hole", hole.port))
        .unwrap();
    a.register_remote_engine(&c.engine_desc()).unwrap();
    let n = 4 * MIB;
    let src = a.register_buffer(random_big(n, 90)).unwrap();
    let stuck = a.write(
        src.desc(),
        0,
        &MemoryDesc::cpu("hole", 0, 0x1000, n as u64),
        0,
        n,
        a.allocate_transfer_uid(),
    );
    // Give the black-holed dials a head start (they stay pending for op_timeout).
    assert_eq!(
        stuck.wait_for(Duration::from_millis(50)),
        StatusCode::InProgress
    );
    let dst = c.alloc_buffer(n).unwrap();
    let t = Instant::now();
    let ok = a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid());
    let code = wait_within(&ok, Duration::from_secs(5));
    assert_eq!(
        code,
        StatusCode::Success,
        "healthy peer: {} after {:?}",
        ok.message(),
        t.elapsed()
    );
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "healthy peer took {:?}",
        t.elapsed()
    );
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "write to the healthy peer");
    assert_eq!(
        wait_within(&stuck, Duration::from_secs(5)),
        StatusCode::ErrBadState
    );
}

#[test]
fn dropping_an_engine_while_it_dials_panics_no_thread() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static HELPER_PANICS: AtomicUsize = AtomicUsize::new(0);
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info
                .location()
                .is_some_and(|l| l.file().contains("blocking"))
            {
                HELPER_PANICS.fetch_add(1, Ordering::SeqCst);
            }
            prev(info);
        }));
    });
    let before = HELPER_PANICS.load(Ordering::SeqCst);
    let hole = BlackHole::new();
    let op_timeout = Duration::from_millis(300);
    let a = engine("dial_drop_a", cfg_with(|c| c.op_timeout = op_timeout));
    a.register_remote_engine(&desc_at("hole", hole.port))
        .unwrap();
    let src = a.alloc_buffer(4096).unwrap();
    let remote = MemoryDesc::cpu("hole", 0, 0x1000, 4096);
    let st = a.write(src.desc(), 0, &remote, 0, 4096, a.allocate_transfer_uid());
    assert_eq!(
        st.wait_for(Duration::from_millis(50)),
        StatusCode::InProgress
    );
    within(Duration::from_secs(5), "drop while dialing", move || {
        drop(a)
    });
    assert_eq!(st.code(), StatusCode::ErrBadState);
    // The pending connect gives up after op_timeout; nothing may panic when it does.
    let t = Instant::now();
    while t.elapsed() < op_timeout + Duration::from_secs(1) {
        assert_eq!(
            HELPER_PANICS.load(Ordering::SeqCst),
            before,
            "a helper thread panicked after the engine was dropped"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn dropping_the_target_closes_its_connections() {
    let op_timeout = Duration::from_secs(3);
    let (a, b) = pair("drop_target", cfg_with(|c| c.op_timeout = op_timeout));
    let n = MIB;
    let src = a.register_buffer(random_big(n, 95)).unwrap();
    let dst = b.alloc_buffer(n).unwrap();
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()),
        "write",
    );
    let port = b.engine_desc().port;
    assert!(established_on_local_port(port) > 0, "no lane to b is up");
    within(Duration::from_secs(5), "dropping b", move || drop(b));
    poll_until(
        Duration::from_secs(2),
        "b's accepted connections closed",
        || established_on_local_port(port) == 0,
    );
    // So a's next transfer to b fails at once (its lanes see the close), not at op_timeout.
    let t = Instant::now();
    let st = a.write(
        src.desc(),
        0,
        dst.desc(),
        0,
        4096,
        a.allocate_transfer_uid(),
    );
    let code = wait_within(&st, op_timeout + Duration::from_secs(1));
    assert_eq!(code, StatusCode::ErrBadState, "{}", st.message());
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "failed only after {:?}: {}",
        t.elapsed(),
        st.message()
    );
}
