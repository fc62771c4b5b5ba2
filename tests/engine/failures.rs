//! Failure cases: argument errors, unknown or out-of-range remote memory (zero bytes
//! written), no backend, dying and silent peers, hostile clients on the listening port,
//! deregistration and engine drop with transfers in flight, and `wait_all` over real failures.

use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use morio::proto::codes;
use morio::proto::frame::{Chunk, Frame, Hello, Seg};
use morio::proto::limits::{CHUNK_FIXED_BYTES, HEADER_BYTES, MIN_VERSION, VERSION};
use morio::{
    AccessKey, EngineError, IoEngine, IoEngineConfig, MemoryDesc, MemoryLocationType,
    RegisterOptions, RegisteredBuffer, StatusCode, TransferStatus,
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

// --- hostile clients on the listening port --------------------------------------------------

/// A pair whose target `b` gives a connection 300 ms to say HELLO.
fn hostile_pair(prefix: &str) -> (IoEngine, IoEngine) {
    pair(
        prefix,
        cfg_with(|c| c.handshake_timeout = Duration::from_millis(300)),
    )
}

/// A normal a -> b write and read, verified (run while a hostile client is connected).
fn normal_traffic(a: &IoEngine, b: &IoEngine) {
    for n in [4096usize, 512 << 10] {
        let src = a.register_buffer(random_big(n, n as u64)).unwrap();
        let dst = b.alloc_buffer(n).unwrap();
        assert_ok(
            &a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()),
            "write",
        );
        assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "normal write");
        let fresh = random_big(n, n as u64 + 1);
        dst.write_at(0, &fresh);
        assert_ok(
            &a.read(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()),
            "read",
        );
        assert_bytes_eq(&src.to_vec(), &fresh, "normal read");
    }
}

/// A raw frame header.
fn header(kind: u8, flags: u8, body_len: u32, payload_len: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER_BYTES);
    h.extend_from_slice(&0x4F4Du16.to_le_bytes());
    h.extend_from_slice(&[kind, flags]);
    h.extend_from_slice(&body_len.to_le_bytes());
    h.extend_from_slice(&payload_len.to_le_bytes());
    h
}

/// Connect, say HELLO as `src` to `b`, and check the HELLO_ACK.
fn handshaken(b: &IoEngine, src: &str) -> TcpStream {
    let mut s = raw_connect(b.engine_desc().port);
    s.write_all(&hello(src, b.key())).unwrap();
    match read_frame(&mut s, Duration::from_secs(5)) {
        Frame::HelloAck(ack) => {
            assert_eq!(
                (ack.code, ack.key.as_str()),
                (codes::SUCCESS, b.key()),
                "{ack:?}"
            );
        }
        f => panic!("expected HELLO_ACK, got {f:?}"),
    }
    s
}

const CLOSE_LIMIT: Duration = Duration::from_secs(3);

#[test]
fn hostile_garbage_bytes() {
    let (a, b) = hostile_pair("hostile_garbage");
    let mut s = raw_connect(b.engine_desc().port);
    let mut junk = random_bytes(1000, 40);
    junk[0] = 0; // not the frame magic
    let _ = s.write_all(&junk);
    normal_traffic(&a, &b);
    let (got, _) = read_until_closed(&mut s, CLOSE_LIMIT);
    assert!(got.is_empty(), "answered garbage with {} bytes", got.len());
}

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
fn hostile_half_hello_is_closed_after_handshake_timeout() {
    let (a, b) = hostile_pair("hostile_half");
    let h = hello("hostile_half_client", b.key());
    let t = Instant::now();
    let mut s = raw_connect(b.engine_desc().port);
    s.write_all(&h[..h.len() / 2]).unwrap();
    // The accept loop is not blocked by the stalled handshake.
    normal_traffic(&a, &b);
    let (got, _) = read_until_closed(&mut s, CLOSE_LIMIT);
    let el = t.elapsed();
    assert!(got.is_empty());
    assert!(
        el >= Duration::from_millis(250),
        "closed before handshake_timeout: {el:?}"
    );
    // Same for a connection that says nothing at all.
    let t = Instant::now();
    let mut s = raw_connect(b.engine_desc().port);
    let _ = read_until_closed(&mut s, CLOSE_LIMIT);
    assert!(t.elapsed() >= Duration::from_millis(250));
}

#[test]
fn hostile_bad_hellos_are_refused_with_a_code() {
    let (a, b) = hostile_pair("hostile_refused");
    let port = b.engine_desc().port;
    let bad = |version, lane, n_lanes, src: &str, dst: &str| {
        encode(
            &Frame::Hello(Hello {
                version,
                lane,
                n_lanes,
                src_key: src.into(),
                dst_key: dst.into(),
                instance: 1,
                nonce: [3; 16],
                host_tag: None,
            }),
            0,
        )
    };
    let cases = [
        (
            "wrong dst key",
            bad(VERSION, 0, 1, "x", "not_b"),
            Some(codes::ERR_NOT_FOUND),
        ),
        ("lane >= n_lanes", bad(VERSION, 2, 2, "x", b.key()), None),
        ("17 lanes", bad(VERSION, 0, 17, "x", b.key()), None),
        (
            "a version older than any this build speaks",
            bad(MIN_VERSION - 1, 0, 1, "x", b.key()),
            None,
        ),
        ("empty src key", bad(VERSION, 0, 1, "", b.key()), None),
    ];
    let mut conns = Vec::new();
    for (what, bytes, _) in &cases {
        let mut s = raw_connect(port);
        s.write_all(bytes).unwrap_or_else(|e| panic!("{what}: {e}"));
        conns.push(s);
    }
    normal_traffic(&a, &b);
    for ((what, _, want), mut s) in cases.into_iter().zip(conns) {
        let (got, _) = read_until_closed(&mut s, CLOSE_LIMIT);
        let frames = parse_frames(&got);
        match frames.as_slice() {
            [Frame::HelloAck(ack)] => {
                assert_ne!(ack.code, codes::SUCCESS, "{what}: accepted");
                if let Some(code) = want {
                    assert_eq!(ack.code, code, "{what}: {ack:?}");
                }
            }
            other => panic!("{what}: expected one HELLO_ACK, got {other:?}"),
        }
    }
}

#[test]
fn hostile_duplicate_hello_closes_the_connection() {
    let (a, b) = hostile_pair("hostile_dup_hello");
    let mut s = handshaken(&b, "hostile_dup_client");
    s.write_all(&hello("hostile_dup_client", b.key())).unwrap();
    normal_traffic(&a, &b);
    let (got, _) = read_until_closed(&mut s, CLOSE_LIMIT);
    for f in parse_frames(&got) {
        assert!(matches!(f, Frame::GoAway { .. }), "unexpected {f:?}");
    }
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

/// The region a raw chunk names: its id and the access key it presents.
type Target = (u32, AccessKey);

/// What a raw chunk must present to reach the region of `d`.
fn target_of(d: &MemoryDesc) -> Target {
    (d.id, d.access_key)
}

/// A WRITE frame of the whole transfer `uid` for `target` (one segment per `segs`), with its
/// payload.
fn write_frame(uid: u64, target: Target, extent: (u64, u64), segs: &[(u64, u64)]) -> Vec<u8> {
    part_frame(uid, (0, 1, 0), target, extent, segs)
}

/// A WRITE frame of chunk `chunk` of `n_chunks` of transfer `uid`, joined on `join_lane`
/// (FINAL when it is the whole transfer), tagged `uid * 10 + chunk`.
fn part_frame(
    uid: u64,
    (chunk, n_chunks, join_lane): (u32, u32, u16),
    (mem_id, access_key): Target,
    extent: (u64, u64),
    segs: &[(u64, u64)],
) -> Vec<u8> {
    let chunk = Chunk {
        tag: uid * 10 + u64::from(chunk),
        uid,
        chunk,
        n_chunks,
        mem_id,
        access_key,
        extent,
        join_lane,
        segs: segs.iter().map(|&(off, len)| Seg { off, len }).collect(),
    };
    let payload_len = chunk.bytes();
    let final_ = n_chunks == 1;
    let mut v = encode(&Frame::Write { chunk, final_ }, payload_len);
    v.extend(random_bytes(payload_len as usize, uid));
    v
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

// --- access keys: a region is reached only with its key ------------------------------------

/// The message of every refusal of a chunk whose region is unknown, local-only, or whose key
/// it does not carry.
const NOT_REGISTERED: &str = "remote memory region not registered";

/// A READ frame of the whole transfer `uid` for `target` (tagged `uid * 10`).
fn read_frame_of(uid: u64, (mem_id, access_key): Target, extent: (u64, u64)) -> Vec<u8> {
    let chunk = Chunk {
        tag: uid * 10,
        uid,
        chunk: 0,
        n_chunks: 1,
        mem_id,
        access_key,
        extent,
        join_lane: 0,
        segs: vec![Seg {
            off: extent.0,
            len: extent.1 - extent.0,
        }],
    };
    encode(
        &Frame::Read {
            chunk,
            final_: true,
            to_device: false,
        },
        0,
    )
}

/// A whole WRITE of `n` random bytes over `[0, n)` of `target` on `s`: COMPLETE's code and
/// message.
fn raw_write(s: &mut TcpStream, uid: u64, target: Target, n: u64) -> (u32, String) {
    s.write_all(&write_frame(uid, target, (0, n), &[(0, n)]))
        .unwrap();
    match read_frame(s, Duration::from_secs(10)) {
        Frame::Complete(r) => {
            assert_eq!(r.uid, uid, "{r:?}");
            (r.code, r.msg)
        }
        f => panic!("uid {uid}: unexpected answer {f:?}"),
    }
}

/// A whole READ of `[0, n)` of `target` on `s`: READ_DATA's code, message and bytes.
fn raw_read(s: &mut TcpStream, uid: u64, target: Target, n: u64) -> (u32, String, Vec<u8>) {
    s.write_all(&read_frame_of(uid, target, (0, n))).unwrap();
    match read_frame_and_payload(s, Duration::from_secs(10)) {
        (Frame::ReadData { reply, final_ }, bytes) => {
            assert!(final_, "{reply:?}");
            assert_eq!(reply.uid, uid, "{reply:?}");
            (reply.code, reply.msg, bytes)
        }
        (f, _) => panic!("uid {uid}: unexpected answer {f:?}"),
    }
}

/// Keys that are not `right`: none (a descriptor of MORI's form), one bit off, random.
fn wrong_keys(right: AccessKey) -> [(&'static str, AccessKey); 3] {
    let mut off = right.to_bytes();
    off[9] ^= 0x10;
    let random = AccessKey::from_bytes(random_bytes(16, 77).try_into().unwrap());
    assert!(random != right && !random.is_none());
    [
        ("zero key", AccessKey::NONE),
        ("one bit off", AccessKey::from_bytes(off)),
        ("random key", random),
    ]
}

/// `packed` (a keyed `MemoryDesc`) in MORI's 15-element form: the key dropped.
fn mori_form(packed: &[u8]) -> Vec<u8> {
    assert_eq!(&packed[..3], &[0xdc, 0x00, 0x10], "array 16");
    assert_eq!(&packed[packed.len() - 18..packed.len() - 16], &[0xc4, 0x10]);
    let mut v = vec![0x9f];
    v.extend_from_slice(&packed[3..packed.len() - 18]);
    v
}

/// A peer that knows a region's id but not its key (the zero key of a MORI-form descriptor,
/// a key one bit off, a random one) overwrites and reads none of it, one chunk or several,
/// raw or through the engine, and its refusals read exactly like those of an unknown region
/// (also past the region's end, which must not reveal its size); the connection stays in
/// sync, and the right key then writes and reads.
#[test]
fn hostile_wrong_or_zero_keys_are_refused_like_unknown_regions_and_move_nothing() {
    let (a, b) = hostile_pair("hostile_keys");
    let n = MIB as u64;
    let secret = random_big(MIB, 70);
    let dst = b.register_buffer(secret.clone()).unwrap();
    let (id, key) = target_of(dst.desc());
    assert!(!key.is_none());
    let client = "hostile_keys_client";
    let mut s = handshaken(&b, client);
    let refused = |b: &IoEngine, uid: u64| {
        let st = b.pop_inbound_transfer_status(client, uid);
        assert_eq!(
            st.map(|st| st.code()),
            Some(StatusCode::ErrNotFound),
            "uid {uid}"
        );
    };
    // What an unknown id gets: what every wrong key must get.
    let unknown = raw_write(&mut s, 1, (id ^ 0x8000_0000, key), n);
    assert_eq!(unknown, (codes::ERR_NOT_FOUND, NOT_REGISTERED.to_string()));
    let mut uid = 10;
    for (what, k) in wrong_keys(key) {
        // The whole region overwritten in one chunk.
        uid += 1;
        assert_eq!(raw_write(&mut s, uid, (id, k), n), unknown, "{what}: write");
        refused(&b, uid);
        // Two chunks of one transfer: the join's COMPLETE carries the refusal.
        uid += 1;
        let half = n / 2;
        s.write_all(&part_frame(
            uid,
            (1, 2, 0),
            (id, k),
            (0, n),
            &[(half, half)],
        ))
        .unwrap();
        s.write_all(&part_frame(uid, (0, 2, 0), (id, k), (0, n), &[(0, half)]))
            .unwrap();
        match read_frame(&mut s, Duration::from_secs(10)) {
            Frame::Complete(r) => assert_eq!(
                (r.uid, r.code, r.msg.as_str()),
                (uid, codes::ERR_NOT_FOUND, NOT_REGISTERED),
                "{what}: two chunks"
            ),
            f => panic!("{what}: unexpected answer {f:?}"),
        }
        refused(&b, uid);
        // Past the region's end: refused for the key, not for the range.
        uid += 1;
        s.write_all(&write_frame(uid, (id, k), (0, 1 << 40), &[(0, 64)]))
            .unwrap();
        match read_frame(&mut s, Duration::from_secs(10)) {
            Frame::Complete(r) => {
                assert_eq!((r.code, r.msg), unknown, "{what}: past the end")
            }
            f => panic!("{what}: unexpected answer {f:?}"),
        }
        // The whole region read.
        uid += 1;
        let (code, msg, bytes) = raw_read(&mut s, uid, (id, k), n);
        assert_eq!((code, msg), unknown, "{what}: read");
        assert!(bytes.is_empty(), "{what}: {} bytes read", bytes.len());
        refused(&b, uid);
        assert_bytes_eq(
            &dst.to_vec(),
            &secret,
            &format!("planted secret after {what}"),
        );
    }

    // Through the engine: the descriptor unpacked from MORI's form (no key), and altered.
    let from_mori = MemoryDesc::unpack(&mori_form(&dst.desc().pack())).unwrap();
    assert!(from_mori.access_key.is_none());
    assert_eq!(&from_mori, dst.desc(), "MORI's equality ignores the key");
    let mut forged: Vec<(&str, MemoryDesc)> = vec![("MORI's form", from_mori)];
    for (what, k) in wrong_keys(key) {
        let mut d = dst.desc().clone();
        d.access_key = k;
        forged.push((what, d));
    }
    let src = a.register_buffer(random_big(MIB, 71)).unwrap();
    let local_init = src.to_vec();
    for (what, d) in &forged {
        for size in [4096, MIB] {
            let uid = a.allocate_transfer_uid();
            let st = a.write(src.desc(), 0, d, 0, size, uid);
            assert_eq!(wait(&st), StatusCode::ErrNotFound, "{what} write {size}");
            assert!(st.message().contains(NOT_REGISTERED), "{}", st.message());
            assert_eq!(inbound(&b, a.key(), uid), StatusCode::ErrNotFound);
            let uid = a.allocate_transfer_uid();
            let st = a.read(src.desc(), 0, d, 0, size, uid);
            assert_eq!(wait(&st), StatusCode::ErrNotFound, "{what} read {size}");
            assert!(st.message().contains(NOT_REGISTERED), "{}", st.message());
            assert_eq!(inbound(&b, a.key(), uid), StatusCode::ErrNotFound);
        }
    }
    assert_bytes_eq(
        &dst.to_vec(),
        &secret,
        "planted secret after the engine's tries",
    );
    assert_bytes_eq(
        &src.to_vec(),
        &local_init,
        "reader's buffer after refused reads",
    );

    // The connection is in sync (every refused payload was drained): the right key works.
    uid += 1;
    let ok = write_frame(uid, (id, key), (100, 200), &[(100, 100)]);
    s.write_all(&ok).unwrap();
    match read_frame(&mut s, Duration::from_secs(10)) {
        Frame::Complete(r) => assert_eq!((r.uid, r.code), (uid, codes::SUCCESS), "{r:?}"),
        f => panic!("unexpected {f:?}"),
    }
    let mut want = secret;
    want[100..200].copy_from_slice(&ok[ok.len() - 100..]);
    assert_bytes_eq(&dst.to_vec(), &want, "after the right key's write");
    uid += 1;
    let (code, msg, bytes) = raw_read(&mut s, uid, (id, key), n);
    assert_eq!((code, msg.as_str()), (codes::SUCCESS, ""));
    assert_bytes_eq(&bytes, &want, "the right key's read");
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, MIB, a.allocate_transfer_uid()),
        "engine write with the real descriptor",
    );
    assert_bytes_eq(
        &dst.to_vec(),
        &local_init,
        "engine write with the real descriptor",
    );
    normal_traffic(&a, &b);
}

/// Memory deregistered and registered again gets a new id and key: the old descriptor, and
/// the old key under the new id, are refused (raw and through the engine) and move nothing;
/// the new descriptor works.
#[test]
fn hostile_stale_descriptors_are_refused_after_registering_again() {
    let (a, b) = hostile_pair("hostile_stale");
    let n = 4 * MIB;
    let mut mem = random_big(n, 80);
    // SAFETY: `mem` outlives both registrations (deregistered below, before it is dropped).
    let old =
        unsafe { b.register_memory(mem.as_mut_ptr(), n, -1, MemoryLocationType::Cpu) }.unwrap();
    let src = a.register_buffer(random_big(n, 81)).unwrap();
    assert_ok(
        &a.write(src.desc(), 0, &old, 0, n, a.allocate_transfer_uid()),
        "before deregistering",
    );
    b.deregister_memory(&old).unwrap();
    assert_bytes_eq(&mem, &src.to_vec(), "write before deregistering");
    // SAFETY: as above.
    let new =
        unsafe { b.register_memory(mem.as_mut_ptr(), n, -1, MemoryLocationType::Cpu) }.unwrap();
    assert_ne!(new.access_key, old.access_key, "a new key");
    assert_ne!(new.id, old.id, "a new id");
    mem.copy_from_slice(&random_big(n, 82));
    let secret = mem.clone();
    let mut old_key = new.clone();
    old_key.access_key = old.access_key;
    let fresh = a.register_buffer(random_big(n, 83)).unwrap();
    let local_init = fresh.to_vec();
    let client = "hostile_stale_client";
    let mut s = handshaken(&b, client);
    let mut raw_uid = 0;
    for (what, d) in [("old descriptor", &old), ("old key, new id", &old_key)] {
        for size in [4096, n] {
            let uid = a.allocate_transfer_uid();
            let st = a.write(fresh.desc(), 0, d, 0, size, uid);
            assert_eq!(wait(&st), StatusCode::ErrNotFound, "{what} write {size}");
            assert_eq!(inbound(&b, a.key(), uid), StatusCode::ErrNotFound);
            let uid = a.allocate_transfer_uid();
            let st = a.read(fresh.desc(), 0, d, 0, size, uid);
            assert_eq!(wait(&st), StatusCode::ErrNotFound, "{what} read {size}");
            assert_eq!(inbound(&b, a.key(), uid), StatusCode::ErrNotFound);
        }
        raw_uid += 1;
        let want = (codes::ERR_NOT_FOUND, NOT_REGISTERED.to_string());
        assert_eq!(
            raw_write(&mut s, raw_uid, target_of(d), n as u64),
            want,
            "{what}"
        );
        raw_uid += 1;
        let (code, msg, bytes) = raw_read(&mut s, raw_uid, target_of(d), n as u64);
        assert_eq!((code, msg), want, "{what}: raw read");
        assert!(bytes.is_empty());
    }
    assert_bytes_eq(&mem, &secret, "memory under stale descriptors");
    assert_bytes_eq(&fresh.to_vec(), &local_init, "reader's buffer");
    // The new descriptor reaches it.
    assert_ok(
        &a.write(fresh.desc(), 0, &new, 0, n, a.allocate_transfer_uid()),
        "write with the new descriptor",
    );
    assert_bytes_eq(&mem, &local_init, "write with the new descriptor");
    raw_uid += 1;
    let (code, _, bytes) = raw_read(&mut s, raw_uid, target_of(&new), 4096);
    assert_eq!(code, codes::SUCCESS);
    assert_bytes_eq(
        &bytes,
        &local_init[..4096],
        "raw read with the new descriptor",
    );
    b.deregister_memory(&new).unwrap();
    drop(mem);
    normal_traffic(&a, &b);
}

/// A region registered local-only is no peer's target, whatever key a chunk presents (none,
/// another region's, a random one), raw or through the engine, and its refusals read like an
/// unknown region's; its engine still uses it as the local side of its own transfers.
#[test]
fn hostile_local_only_regions_are_never_a_remote_target() {
    let (a, b) = hostile_pair("hostile_local");
    let n = 4 * MIB;
    let secret = random_big(n, 90);
    let private = b
        .register_buffer_with(secret.clone(), RegisterOptions::LOCAL_ONLY)
        .unwrap();
    let id = private.desc().id;
    assert!(
        private.desc().access_key.is_none(),
        "a local-only region has no key"
    );
    let public = b.register_buffer(random_big(64, 91)).unwrap();
    let keys = [
        ("no key", AccessKey::NONE),
        ("another region's key", public.desc().access_key),
        ("random key", wrong_keys(public.desc().access_key)[2].1),
    ];
    let client = "hostile_local_client";
    let mut s = handshaken(&b, client);
    let want = (codes::ERR_NOT_FOUND, NOT_REGISTERED.to_string());
    let src = a.register_buffer(random_big(n, 92)).unwrap();
    let local_init = src.to_vec();
    for (i, (what, k)) in keys.into_iter().enumerate() {
        let uid = 2 * i as u64 + 1;
        assert_eq!(
            raw_write(&mut s, uid, (id, k), n as u64),
            want,
            "{what}: raw write"
        );
        let (code, msg, bytes) = raw_read(&mut s, uid + 1, (id, k), n as u64);
        assert_eq!((code, msg), want, "{what}: raw read");
        assert!(bytes.is_empty());
        let mut d = private.desc().clone();
        d.access_key = k;
        for size in [4096, n] {
            let uid = a.allocate_transfer_uid();
            let st = a.write(src.desc(), 0, &d, 0, size, uid);
            assert_eq!(wait(&st), StatusCode::ErrNotFound, "{what} write {size}");
            assert_eq!(inbound(&b, a.key(), uid), StatusCode::ErrNotFound);
            let st = a.read(src.desc(), 0, &d, 0, size, a.allocate_transfer_uid());
            assert_eq!(wait(&st), StatusCode::ErrNotFound, "{what} read {size}");
        }
    }
    assert_bytes_eq(&private.to_vec(), &secret, "local-only region");
    assert_bytes_eq(&src.to_vec(), &local_init, "reader's buffer");
    // Its own engine reads into it and writes from it.
    let theirs = a.register_buffer(random_big(n, 93)).unwrap();
    let mine = theirs.to_vec();
    assert_ok(
        &b.read(
            private.desc(),
            0,
            theirs.desc(),
            0,
            n,
            b.allocate_transfer_uid(),
        ),
        "read into local-only memory",
    );
    assert_bytes_eq(&private.to_vec(), &mine, "read into local-only memory");
    let out = a.alloc_buffer(n).unwrap();
    assert_ok(
        &b.write(
            private.desc(),
            0,
            out.desc(),
            0,
            n,
            b.allocate_transfer_uid(),
        ),
        "write from local-only memory",
    );
    assert_bytes_eq(&out.to_vec(), &mine, "write from local-only memory");
    normal_traffic(&a, &b);
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

// --- bounded target state: what one peer's frames can make the target hold -----------------

/// This process's address space and resident memory, in bytes (`/proc/self/statm`).
fn statm() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let mut v = s.split_whitespace().map(|x| x.parse::<u64>().unwrap());
    // SAFETY: sysconf only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    (v.next().unwrap() * page, v.next().unwrap() * page)
}

/// WRITE frames of 95 bytes (111 with the access key), each claiming 2^32 - 1 chunks (a join's bitmap is sized by the
/// count: 512 MiB each before counts were checked), close their connection and reserve
/// nothing; counts at the limit (2^20, for a wide extent) reserve no more than the join caps
/// allow. The process's memory stays put, and normal traffic flows after.
#[test]
fn hostile_chunk_counts_reserve_no_memory() {
    run_alone("failures::hostile_chunk_counts_reserve_no_memory_case");
}

#[test]
#[ignore = "run alone by hostile_chunk_counts_reserve_no_memory: it measures the process's memory"]
fn hostile_chunk_counts_reserve_no_memory_case() {
    let (a, b) = hostile_pair("hostile_counts");
    let dst = b.alloc_buffer(4096).unwrap();
    let id = target_of(dst.desc());
    let client = "hostile_counts_client";
    // A one-byte whole write after each hostile frame: answered only if the hostile frame
    // left the connection open.
    let sync = |uid| write_frame(uid, id, (0, 1), &[(0, 1)]);
    let before = statm();
    let mut conns = Vec::new();
    for i in 0..128u64 {
        let mut s = handshaken(&b, client);
        let mut bytes = part_frame(1000 + i, (1, u32::MAX, 0), id, (0, 64), &[(0, 13)]);
        // The attack's 95-byte frame, plus the 16-byte access key chunks carry since v6.
        assert_eq!(bytes.len(), 95 + 16);
        bytes.extend(sync(5000 + i));
        s.write_all(&bytes).unwrap();
        let first = try_read_frame(&mut s, Duration::from_secs(5));
        conns.push((s, first));
    }
    // Counts at the limit for an extent no region has: every chunk is refused (unknown
    // region) and still reports to the join table, where a join of 2^20 chunks takes 2048
    // slots: two per peer at the default cap, the rest refused.
    let mut open = Vec::new();
    for k in 0..8 {
        let mut s = handshaken(&b, &format!("hostile_counts_peer{k}"));
        for uid in 0..16u64 {
            let f = part_frame(
                uid,
                (1, 1 << 20, 0),
                (id.0.wrapping_add(99), id.1),
                (0, 1 << 40),
                &[(0, 13)],
            );
            s.write_all(&f).unwrap();
        }
        s.write_all(&sync(99)).unwrap();
        match read_frame(&mut s, Duration::from_secs(5)) {
            Frame::Complete(r) => assert_eq!((r.uid, r.code), (99, codes::SUCCESS), "{r:?}"),
            f => panic!("peer {k}: unexpected {f:?}"),
        }
        open.push(s);
    }
    let after = statm();
    let (space, resident) = (
        after.0.saturating_sub(before.0),
        after.1.saturating_sub(before.1),
    );
    assert!(
        space < 1 << 30 && resident < 16 << 20,
        "the target grew by {} MiB of address space and {} MiB resident",
        space >> 20,
        resident >> 20
    );
    for (i, (mut s, first)) in conns.into_iter().enumerate() {
        assert!(
            matches!(first, Ok(Frame::GoAway { .. })),
            "connection {i}: expected a GOAWAY, got {first:?}"
        );
        read_until_closed(&mut s, CLOSE_LIMIT);
    }
    assert!(b.pop_inbound_transfer_status(client, 1000).is_none());
    assert!(b.pop_inbound_transfer_status(client, 5000).is_none());
    normal_traffic(&a, &b);
    drop(open);
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

/// A peer that starts more joins than its cap (chunk 0 of transfers whose chunk 1 never
/// comes) gets each further transfer refused at once (COMPLETE with ERR_BAD_STATE, recorded
/// as its inbound status), while another peer's striped transfers go on; a join that
/// completes gives its slot back, and another key has a cap of its own.
#[test]
fn hostile_join_flood_is_refused_past_its_cap_while_others_transfer() {
    let (a, b) = pair(
        "hostile_joincap",
        cfg_with(|c| {
            c.handshake_timeout = Duration::from_millis(300);
            c.max_joins_per_peer = 8;
        }),
    );
    let dst = b.alloc_buffer(4096).unwrap();
    let id = target_of(dst.desc());
    let client = "hostile_joincap_client";
    let mut s = handshaken(&b, client);
    for uid in 0..40u64 {
        s.write_all(&part_frame(uid, (0, 2, 0), id, (0, 64), &[(0, 32)]))
            .unwrap();
    }
    for uid in 8..40u64 {
        match read_frame(&mut s, Duration::from_secs(5)) {
            Frame::Complete(r) => {
                assert_eq!(
                    (r.tag, r.uid, r.code),
                    (uid * 10, uid, codes::ERR_BAD_STATE)
                );
                assert!(r.msg.contains("max_joins_per_peer"), "{}", r.msg);
            }
            f => panic!("uid {uid}: unexpected {f:?}"),
        }
    }
    let st = b
        .pop_inbound_transfer_status(client, 8)
        .expect("inbound status");
    assert_eq!(st.code(), StatusCode::ErrBadState);
    assert!(
        b.pop_inbound_transfer_status(client, 0).is_none(),
        "in flight"
    );
    // Another peer transfers meanwhile, striped (joined) transfers included.
    normal_traffic(&a, &b);
    // Chunk 1 of transfer 0 completes its join and gives its slot back...
    s.write_all(&part_frame(0, (1, 2, 0), id, (0, 64), &[(32, 32)]))
        .unwrap();
    match read_frame(&mut s, Duration::from_secs(5)) {
        Frame::Complete(r) => assert_eq!((r.tag, r.uid, r.code), (1, 0, codes::SUCCESS)),
        f => panic!("unexpected {f:?}"),
    }
    // ... so a new transfer fits again.
    for chunk in 0..2u32 {
        let f = part_frame(
            100,
            (chunk, 2, 0),
            id,
            (0, 64),
            &[(u64::from(chunk) * 32, 32)],
        );
        s.write_all(&f).unwrap();
    }
    match read_frame(&mut s, Duration::from_secs(5)) {
        Frame::Complete(r) => assert_eq!((r.uid, r.code), (100, codes::SUCCESS), "{r:?}"),
        f => panic!("unexpected {f:?}"),
    }
    // Another key has a cap of its own.
    let mut other = handshaken(&b, "hostile_joincap_other");
    for chunk in 0..2u32 {
        let f = part_frame(
            7,
            (chunk, 2, 0),
            id,
            (0, 64),
            &[(u64::from(chunk) * 32, 32)],
        );
        other.write_all(&f).unwrap();
    }
    match read_frame(&mut other, Duration::from_secs(5)) {
        Frame::Complete(r) => assert_eq!((r.uid, r.code), (7, codes::SUCCESS), "{r:?}"),
        f => panic!("unexpected {f:?}"),
    }
    normal_traffic(&a, &b);
}

/// Inbound statuses nobody pops are bounded per peer (its newest kept) and in total, over
/// many connections with distinct 1000-byte source keys; the newest status is always there.
#[test]
fn hostile_inbound_statuses_are_capped_per_peer_and_in_total() {
    let (a, b) = pair(
        "hostile_status",
        cfg_with(|c| {
            c.max_inbound_statuses_per_peer = 16;
            c.max_inbound_statuses = 64;
        }),
    );
    let dst = b.alloc_buffer(4096).unwrap();
    let id = target_of(dst.desc());
    let client = "hostile_status_client";
    let mut s = handshaken(&b, client);
    for uid in 0..100u64 {
        s.write_all(&write_frame(uid, id, (0, 1), &[(0, 1)]))
            .unwrap();
    }
    for uid in 0..100u64 {
        match read_frame(&mut s, Duration::from_secs(5)) {
            Frame::Complete(r) => assert_eq!((r.uid, r.code), (uid, codes::SUCCESS)),
            f => panic!("unexpected {f:?}"),
        }
    }
    let kept: Vec<u64> = (0..100)
        .filter(|&uid| b.pop_inbound_transfer_status(client, uid).is_some())
        .collect();
    assert_eq!(kept, (84..100).collect::<Vec<_>>(), "the newest 16");
    let keys: Vec<String> = (0..300).map(|i| format!("{i:0>1000}")).collect();
    for key in &keys {
        let mut s = handshaken(&b, key);
        s.write_all(&write_frame(1, id, (0, 1), &[(0, 1)])).unwrap();
        match read_frame(&mut s, Duration::from_secs(5)) {
            Frame::Complete(r) => assert_eq!((r.uid, r.code), (1, codes::SUCCESS)),
            f => panic!("unexpected {f:?}"),
        }
    }
    let last = b.pop_inbound_transfer_status(keys.last().unwrap(), 1);
    assert!(last.is_some(), "the newest status is kept");
    let kept = keys
        .iter()
        .filter(|k| b.pop_inbound_transfer_status(k, 1).is_some())
        .count();
    assert!(kept < 64, "{kept} statuses kept past the total of 64");
    normal_traffic(&a, &b);
}

/// A host region larger than the machine's memory (a 1 PiB registration) is refused.
#[test]
fn regions_larger_than_physical_memory_are_refused() {
    let e = engine("too_big", test_cfg());
    let ptr = std::ptr::NonNull::<u8>::dangling().as_ptr();
    // SAFETY: refused before the range is recorded or touched.
    let r = unsafe { e.register_memory(ptr, 1 << 50, -1, MemoryLocationType::Cpu) };
    assert!(
        matches!(r, Err(EngineError::RegionTooLarge { size, .. }) if size == 1 << 50),
        "{r:?}"
    );
    assert!(matches!(
        e.alloc_buffer(1 << 50),
        Err(EngineError::RegionTooLarge { .. })
    ));
}

/// A dialer of a later version (its HELLO offers version + 1 and carries a field this build
/// does not know) is answered with this version, which the connection then speaks: a fleet
/// upgrades node by node.
#[test]
fn a_newer_dialer_is_answered_with_this_version() {
    let (a, b) = hostile_pair("newer_dialer");
    let port = b.engine_desc().port;
    let mut bytes = encode(
        &Frame::Hello(Hello {
            version: VERSION + 1,
            lane: 0,
            n_lanes: 1,
            src_key: "newer".into(),
            dst_key: b.key().into(),
            instance: 5,
            nonce: [9; 16],
            host_tag: None,
        }),
        0,
    );
    bytes.extend_from_slice(&[0xAB; 12]);
    let body = (bytes.len() - HEADER_BYTES) as u32;
    bytes[4..8].copy_from_slice(&body.to_le_bytes());
    let mut s = raw_connect(port);
    s.write_all(&bytes).unwrap();
    match read_frame(&mut s, Duration::from_secs(10)) {
        Frame::HelloAck(ack) => assert_eq!((ack.code, ack.version), (codes::SUCCESS, VERSION)),
        f => panic!("expected HELLO_ACK, got {f:?}"),
    }
    normal_traffic(&a, &b);
}
