//! Failures a transfer meets before any byte moves: argument errors at submission, remote
//! memory that is unknown, deregistered or smaller than a forged descriptor claims (zero bytes
//! written), and transfers before `create_backend`.

use std::sync::Arc;

use morio::{
    IoEngine, IoEngineConfig, MemoryDesc, MemoryLocationType, RegisteredBuffer, StatusCode,
    TransferStatus,
};

use super::MIB;
use crate::common::*;

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
