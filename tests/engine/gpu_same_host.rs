//! GPU memory over the same-host transport: device parts (the receiver opens the sender's
//! exported allocation and copies on its GPU, no staging), the fallbacks (a runtime that
//! cannot open the handle, a host destination, a version 7 peer), copy faults and
//! deregistration while a device copy is in flight. On the fake runtime, whose "other
//! process" opens the export at an address of its own; the H200 host runs the same paths on
//! CUDA across processes (`morio bench --same-host`).

use std::sync::Arc;
use std::time::Duration;

use morio::gpu::fake::{FakeGpu, FaultAt};
use morio::gpu::GpuRuntime;
use morio::{IoEngine, RegisteredBuffer, SameHost, StatusCode, TcpBackendConfig};

use crate::common::*;

fn cfg() -> TcpBackendConfig {
    cfg_with(|c| {
        c.same_host = Some(SameHost::Require);
        c.chunk_bytes = 256 << 10;
        // GPU to GPU chunks are 8 × this: 256 KiB, several per transfer.
        c.same_host_chunk_bytes = 32 << 10;
        c.striping_threshold_bytes = 512 << 10;
        c.num_data_conns = 2;
    })
}

fn gpu_pair(prefix: &str, cfg: TcpBackendConfig) -> (IoEngine, IoEngine, Arc<FakeGpu>) {
    let fake = Arc::new(FakeGpu::new(1));
    let rt: Arc<dyn GpuRuntime> = fake.clone();
    let (a, b) = pair(prefix, cfg);
    a.set_gpu_runtime(rt.clone()).unwrap();
    b.set_gpu_runtime(rt).unwrap();
    (a, b, fake)
}

fn gpu_buf(e: &IoEngine, bytes: &[u8]) -> RegisteredBuffer {
    let b = e.alloc_gpu_buffer(0, bytes.len()).unwrap();
    assert!(b.write_at(0, bytes));
    b
}

/// Writes and reads GPU to GPU, single (one chunk, striped) and batched, verified byte for
/// byte; every byte moved by device-to-device copies, none staged.
#[test]
fn gpu_to_gpu_moves_as_device_parts_without_staging() {
    let (a, b, fake) = gpu_pair("gsh_parts", cfg());
    let n = 3 << 20;
    let src = gpu_buf(&a, &random_big(n, 1));
    let dst = gpu_buf(&b, &vec![0u8; n]);
    let back = gpu_buf(&a, &vec![0u8; n]);
    assert_ne!(
        src.desc().ipc_handle,
        [0u8; 64],
        "the handle is in the descriptor"
    );
    let staged_before = fake.copies() - fake.d2d_copies();
    for (off, len) in [(7usize, 10_000usize), (4096, 300 << 10), (1 << 20, 2 << 20)] {
        let what = format!("write of {len} at {off}");
        let uid = a.allocate_transfer_uid();
        assert_ok(&a.write(src.desc(), off, dst.desc(), off, len, uid), &what);
        assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success, "{what}");
        assert_bytes_eq(&bytes_at(&dst, off, len), &bytes_at(&src, off, len), &what);
        let what = format!("read of {len} at {off}");
        let uid = a.allocate_transfer_uid();
        assert_ok(&a.read(back.desc(), off, dst.desc(), off, len, uid), &what);
        assert_bytes_eq(&bytes_at(&back, off, len), &bytes_at(&src, off, len), &what);
    }
    let offs: Vec<usize> = (0..32).map(|i| i * 65536 + 3).collect();
    let sizes = vec![40_000usize; 32];
    let sts = a.batch_write(
        &[src.desc().clone()],
        std::slice::from_ref(&offs),
        &[dst.desc().clone()],
        std::slice::from_ref(&offs),
        &[sizes],
        &[a.allocate_transfer_uid()],
    );
    assert_ok(&sts[0], "batch write");
    for &o in &offs {
        assert_bytes_eq(
            &bytes_at(&dst, o, 40_000),
            &bytes_at(&src, o, 40_000),
            "piece",
        );
    }
    assert!(fake.d2d_copies() > 0, "device parts were used");
    assert_eq!(
        fake.copies() - fake.d2d_copies(),
        staged_before,
        "nothing was staged through host memory"
    );
    for e in [&a, &b] {
        let t = e.stats().unwrap().total();
        assert!(t.gpu_ipc_bytes > 0 && t.gpu_staged_bytes == 0, "{t:?}");
        assert_eq!(t.gpu_ipc_declined, 0);
    }
    // Opened once per exported allocation, not per transfer (another test's sweep may
    // close unused ones meanwhile, which opens them again).
    let open = fake.ipc_opens() - fake.ipc_closes();
    assert!(open <= 3, "{open} mappings open");
}

/// A GPU source with a host destination (write) and a GPU target read into host memory:
/// neither is offered as device parts (the READ says where its data goes), both arrive
/// staged.
#[test]
fn host_destinations_take_staged_bytes() {
    let (a, b, fake) = gpu_pair("gsh_host", cfg());
    let n = 1 << 20;
    let src = gpu_buf(&a, &random_big(n, 2));
    let host = b.alloc_buffer(n).unwrap();
    let uid = a.allocate_transfer_uid();
    assert_ok(
        &a.write(src.desc(), 0, host.desc(), 0, n, uid),
        "gpu->host write",
    );
    assert_bytes_eq(&host.to_vec(), &src.to_vec(), "gpu->host write");
    assert_eq!(
        fake.d2d_copies(),
        0,
        "a host destination is never offered parts"
    );
    let remote = gpu_buf(&b, &random_big(n, 3));
    let local = a.alloc_buffer(n).unwrap();
    let uid = a.allocate_transfer_uid();
    assert_ok(
        &a.read(local.desc(), 0, remote.desc(), 0, n, uid),
        "gpu->host read",
    );
    assert_bytes_eq(&local.to_vec(), &remote.to_vec(), "gpu->host read");
    assert_eq!(fake.d2d_copies(), 0, "staged");
    let (ta, tb) = (a.stats().unwrap().total(), b.stats().unwrap().total());
    assert_eq!(
        ta.gpu_ipc_declined, 0,
        "the write was never offered: {ta:?}"
    );
    assert_eq!(tb.gpu_ipc_declined, 0, "nor the read data: {tb:?}");
    // Each side staged its own GPU memory: a the write's source, b the read's.
    assert_eq!(ta.gpu_staged_bytes, n as u64, "{ta:?}");
    assert_eq!(tb.gpu_staged_bytes, n as u64, "{tb:?}");
}

/// A runtime that cannot open the peer's handles: every transfer still succeeds, staged.
#[test]
fn a_refused_handle_falls_back_to_staging() {
    let (a, b, fake) = gpu_pair("gsh_refused", cfg());
    fake.refuse_ipc(true);
    let n = 2 << 20;
    let src = gpu_buf(&a, &random_big(n, 4));
    let dst = gpu_buf(&b, &vec![0u8; n]);
    for i in 0..3 {
        let uid = a.allocate_transfer_uid();
        assert_ok(&a.write(src.desc(), 0, dst.desc(), 0, n, uid), "write");
        assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
        assert_bytes_eq(&dst.to_vec(), &src.to_vec(), &format!("write {i}"));
        let back = gpu_buf(&a, &vec![0u8; n]);
        let uid = a.allocate_transfer_uid();
        assert_ok(&a.read(back.desc(), 0, dst.desc(), 0, n, uid), "read");
        assert_bytes_eq(&back.to_vec(), &src.to_vec(), &format!("read {i}"));
    }
    assert_eq!(fake.d2d_copies(), 0);
    assert_eq!(fake.ipc_opens(), 0);
    let t = a.stats().unwrap().total();
    assert_eq!(t.lane_failures, 0, "no lane failed: {t:?}");
    assert_eq!(t.gpu_ipc_bytes, 0, "{t:?}");
    // Declined for good once per connection, never again on it.
    let declined = t.gpu_ipc_declined + b.stats().unwrap().total().gpu_ipc_declined;
    assert!((1..=8).contains(&declined), "{declined} declines");
}

/// A version 7 peer (same host, no device parts): staged, verified.
#[test]
fn a_version_7_peer_gets_staged_bytes() {
    let old = cfg_with(|c| {
        c.same_host = Some(SameHost::Require);
        c.max_protocol_version = 7;
    });
    let (a, b, fake) = gpu_pair("gsh_v7", old);
    let n = 1 << 20;
    let src = gpu_buf(&a, &random_big(n, 5));
    let dst = gpu_buf(&b, &vec![0u8; n]);
    let uid = a.allocate_transfer_uid();
    assert_ok(&a.write(src.desc(), 0, dst.desc(), 0, n, uid), "v7 write");
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "v7 write");
    assert_eq!(fake.d2d_copies(), 0);
    let t = a.stats().unwrap().total();
    assert!(t.lane_connects_same_host >= 1, "{t:?}");
    assert_eq!(t.lane_connects_same_host, t.lane_connects, "{t:?}");
}

/// A device copy that fails on the GPU fails its transfer with `ERR_GPU_OP` on both sides;
/// the lane carries the next one.
#[test]
fn a_failed_device_copy_fails_only_its_transfer() {
    let (a, b, fake) = gpu_pair("gsh_fault", cfg());
    let n = 64 << 10;
    let src = gpu_buf(&a, &random_big(n, 6));
    let dst = gpu_buf(&b, &vec![0u8; n]);
    fake.inject_fault(Some(0), FaultAt::Complete);
    let uid = a.allocate_transfer_uid();
    let st = a.write(src.desc(), 0, dst.desc(), 0, n, uid);
    assert_eq!(wait(&st), StatusCode::ErrGpuOp, "{}", st.message());
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::ErrGpuOp);
    fake.inject_fault(None, FaultAt::Submit);
    // The fake's fault is sticky per stream (as a CUDA device error is); a fresh pair of
    // buffers on the same engines still moves once the lane is redialed if it must be.
    let uid = a.allocate_transfer_uid();
    let st = a.write(src.desc(), 0, dst.desc(), 0, n, uid);
    let code = wait(&st);
    assert!(
        matches!(code, StatusCode::Success | StatusCode::ErrGpuOp),
        "{code:?}: {}",
        st.message()
    );
}

/// Deregistering the target's GPU memory while device copies run: it waits for them,
/// transfers after it are refused as unknown memory, and nothing hangs.
#[test]
fn deregistration_waits_for_device_copies() {
    let (a, b, fake) = gpu_pair("gsh_dereg", cfg());
    fake.set_copy_delay(Duration::from_millis(30));
    let n = 2 << 20;
    let src = gpu_buf(&a, &random_big(n, 7));
    let dst = gpu_buf(&b, &vec![0u8; n]);
    let uid = a.allocate_transfer_uid();
    let st = a.write(src.desc(), 0, dst.desc(), 0, n, uid);
    std::thread::sleep(Duration::from_millis(10));
    b.deregister_memory(dst.desc()).unwrap();
    // Deregistration returned: nothing is copying into the region any more.
    let copies = fake.d2d_copies();
    let code = wait(&st);
    assert!(
        code == StatusCode::Success || code.is_error(),
        "terminal: {code:?}: {}",
        st.message()
    );
    fake.set_copy_delay(Duration::ZERO);
    let uid = a.allocate_transfer_uid();
    let st = a.write(src.desc(), 0, dst.desc(), 0, n, uid);
    assert_eq!(wait(&st), StatusCode::ErrNotFound, "{}", st.message());
    assert_eq!(
        fake.d2d_copies(),
        copies,
        "nothing copied after deregistration"
    );
}

/// Mappings of the peer's GPU memory close once unused (they pin it in the peer), never
/// while a copy uses them, and open again for the next transfer.
#[test]
fn unused_mappings_close_and_reopen() {
    let (a, b, fake) = gpu_pair("gsh_sweep", cfg());
    let n = 1 << 20;
    let src = gpu_buf(&a, &random_big(n, 8));
    let dst = gpu_buf(&b, &vec![0u8; n]);
    let uid = a.allocate_transfer_uid();
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, n, uid),
        "first write",
    );
    let opened = fake.ipc_opens();
    assert!(opened >= 1);
    morio::gpu::ipc::sweep_all(Duration::from_secs(3600));
    assert_eq!(fake.ipc_closes(), 0, "used too recently");
    morio::gpu::ipc::sweep_all(Duration::ZERO);
    assert_eq!(fake.ipc_closes(), opened, "every unused mapping closed");
    let uid = a.allocate_transfer_uid();
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, n, uid),
        "after the sweep",
    );
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "after the sweep");
    assert!(fake.ipc_opens() > opened, "opened again");
    // Sweeping while copies run closes nothing they use: every transfer completes.
    fake.set_copy_delay(Duration::from_millis(2));
    let sts: Vec<_> = (0..8)
        .map(|_| a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()))
        .collect();
    for _ in 0..20 {
        morio::gpu::ipc::sweep_all(Duration::ZERO);
        std::thread::sleep(Duration::from_millis(1));
    }
    for st in &sts {
        assert_ok(st, "write during sweeps");
    }
    fake.set_copy_delay(Duration::ZERO);
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "during sweeps");
}

/// Memory the runtime cannot export (a virtual-memory pool's, say) carries no IPC handle in
/// its descriptor and is never offered: staged, verified, nothing declined.
#[test]
fn memory_that_cannot_be_exported_is_staged() {
    let (a, b, fake) = gpu_pair("gsh_noexport", cfg());
    fake.refuse_export(true);
    let n = 1 << 20;
    let src = gpu_buf(&a, &random_big(n, 9));
    fake.refuse_export(false);
    let dst = gpu_buf(&b, &vec![0u8; n]);
    assert_eq!(src.desc().ipc_handle, [0u8; 64], "no handle to give");
    // The destination is exported, the source is not: the write is staged.
    assert_ne!(dst.desc().ipc_handle, [0u8; 64]);
    let uid = a.allocate_transfer_uid();
    assert_ok(&a.write(src.desc(), 0, dst.desc(), 0, n, uid), "write");
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "write");
    let t = a.stats().unwrap().total();
    assert_eq!((t.gpu_ipc_bytes, t.gpu_ipc_declined), (0, 0), "{t:?}");
    assert_eq!(t.gpu_staged_bytes, n as u64, "{t:?}");
}

/// Device parts configured off on either side (`gpu_ipc = false`, or `MORIO_GPU_IPC=off`):
/// GPU payloads are staged, verified, and neither side opens a handle.
#[test]
fn device_parts_configured_off_on_either_side_stage() {
    for (what, off_a, off_b) in [("sender", true, false), ("receiver", false, true)] {
        let fake = Arc::new(FakeGpu::new(1));
        let rt: Arc<dyn GpuRuntime> = fake.clone();
        let with = |off: bool| {
            let mut c = cfg();
            if off {
                c.gpu_ipc = Some(false);
            }
            c
        };
        let a = engine(&format!("gsh_off_{what}_a"), with(off_a));
        let b = engine(&format!("gsh_off_{what}_b"), with(off_b));
        a.register_remote_engine(&b.engine_desc()).unwrap();
        b.register_remote_engine(&a.engine_desc()).unwrap();
        a.set_gpu_runtime(rt.clone()).unwrap();
        b.set_gpu_runtime(rt).unwrap();
        let n = 1 << 20;
        let src = gpu_buf(&a, &random_big(n, 10));
        let dst = gpu_buf(&b, &vec![0u8; n]);
        for _ in 0..3 {
            let uid = a.allocate_transfer_uid();
            assert_ok(&a.write(src.desc(), 0, dst.desc(), 0, n, uid), what);
            assert_bytes_eq(&dst.to_vec(), &src.to_vec(), what);
        }
        assert_eq!(fake.ipc_opens(), 0, "{what}: a handle was opened");
        assert_eq!(fake.d2d_copies(), 0, "{what}");
        let t = a.stats().unwrap().total();
        assert_eq!(t.gpu_ipc_bytes, 0, "{what}: {t:?}");
        // A receiver that is off declines for good once per connection; a sender that is
        // off never offers.
        let most = if off_a { 0 } else { 2 };
        assert!(t.gpu_ipc_declined <= most, "{what}: {t:?}");
    }
}

/// Engine `e`'s (IPC bytes, staged bytes, offers declined) so far.
fn moved(e: &IoEngine) -> (u64, u64, u64) {
    let t = e.stats().unwrap().total();
    (t.gpu_ipc_bytes, t.gpu_staged_bytes, t.gpu_ipc_declined)
}

/// Tiny GPU segments between same-host engines: 8 B × 256 in MORI's layout (stride 9) on both
/// sides move as device parts, each run one 2D copy; in descending order on both sides
/// (no runs, 8 B a copy) they are staged; a strided source into descending destinations is
/// offered by the sender, declined by the receiver (whose copies form no runs) and staged.
/// Every byte checked, writes and reads.
#[test]
fn a_few_tiny_parts_move_device_to_device_and_more_are_staged() {
    let (a, b, _fake) = gpu_pair("gsh_few", cfg());
    let size = 8usize;
    let src = gpu_buf(&a, &random_big(64, 10));
    // Descending 8 B parts: no 2D run. Two go device to device, three are staged.
    for (count, want) in [(1usize, (8, 0, 0)), (2, (16, 0, 0)), (3, (0, 24, 0))] {
        let offs: Vec<usize> = (0..count).rev().map(|i| i * 16).collect();
        let dst = gpu_buf(&b, &[0u8; 64]);
        let a0 = moved(&a);
        let uid = [a.allocate_transfer_uid()];
        let st = a.batch_write(
            &[src.desc().clone()],
            std::slice::from_ref(&offs),
            &[dst.desc().clone()],
            std::slice::from_ref(&offs),
            &[vec![size; count]],
            &uid,
        );
        assert_ok(&st[0], "batch");
        for &o in &offs {
            assert_bytes_eq(&bytes_at(&dst, o, size), &bytes_at(&src, o, size), "write");
        }
        let delta = || {
            let y = moved(&a);
            (y.0 - a0.0, y.1 - a0.1, y.2 - a0.2)
        };
        assert_eq!(settled(delta, &want), want, "{count} parts");
    }
}

#[test]
fn tiny_parts_move_device_to_device_only_as_runs() {
    let (a, b, fake) = gpu_pair("gsh_runs", cfg());
    let (size, count) = (8usize, 256usize);
    let n = (size + 1) * count;
    let bytes = (size * count) as u64;
    let src = gpu_buf(&a, &random_big(n, 9));
    let strided: Vec<usize> = (0..count).map(|i| i * (size + 1)).collect();
    let descending: Vec<usize> = strided.iter().rev().copied().collect();
    let sizes = vec![vec![size; count]];
    let one = |e: &IoEngine,
               write: bool,
               l: &RegisteredBuffer,
               lo: &[usize],
               r: &RegisteredBuffer,
               ro: &[usize]| {
        let (ld, rd) = ([l.desc().clone()], [r.desc().clone()]);
        let (lo, ro) = ([lo.to_vec()], [ro.to_vec()]);
        let uid = [e.allocate_transfer_uid()];
        let st = if write {
            e.batch_write(&ld, &lo, &rd, &ro, &sizes, &uid)
        } else {
            e.batch_read(&ld, &lo, &rd, &ro, &sizes, &uid)
        };
        assert_ok(&st[0], "batch");
    };
    let same =
        |x: &RegisteredBuffer, xo: &[usize], y: &RegisteredBuffer, yo: &[usize], what: &str| {
            for (&p, &q) in xo.iter().zip(yo) {
                assert_bytes_eq(&bytes_at(x, p, size), &bytes_at(y, q, size), what);
            }
        };
    // (what, source offsets, destination offsets, the writer's (IPC, staged, declined)).
    type Case<'a> = (&'a str, &'a [usize], &'a [usize], (u64, u64, u64));
    let cases: [Case; 3] = [
        ("runs on both sides", &strided, &strided, (bytes, 0, 0)),
        ("no runs", &descending, &descending, (0, bytes, 0)),
        (
            "runs only at the source",
            &strided,
            &descending,
            (0, bytes, 1),
        ),
    ];
    for (what, from, to, want) in cases {
        let dst = gpu_buf(&b, &vec![0u8; n]);
        let (a0, t0) = (moved(&a), fake.copies_2d());
        one(&a, true, &src, from, &dst, to);
        same(&dst, to, &src, from, &format!("write, {what}"));
        // A shard counts its chunk once the peer's verdict is in, which may be just after
        // the transfer completed: the counters settle within moments.
        let delta = |e: &IoEngine, x: (u64, u64, u64)| {
            let y = moved(e);
            (y.0 - x.0, y.1 - x.1, y.2 - x.2)
        };
        let got = settled(|| delta(&a, a0), &want);
        assert_eq!(got, want, "write, {what}");
        if want.0 > 0 {
            assert!(fake.copies_2d() > t0, "write, {what}: no 2D copy");
        }
        // Read it back (the target sends, from `to`'s layout into `from`'s).
        let back = gpu_buf(&a, &vec![0u8; n]);
        let b0 = moved(&b);
        one(&a, false, &back, from, &dst, to);
        same(&back, from, &src, from, &format!("read, {what}"));
        // The target's layout has no runs in the other cases: never offered.
        let want = match what {
            "runs on both sides" => (bytes, 0, 0),
            _ => (0, bytes, 0),
        };
        let got = settled(|| delta(&b, b0), &want);
        assert_eq!(got, want, "read, {what}");
    }
}
