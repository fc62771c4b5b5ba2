//! GPU memory: MORI's GPU staging test and the whole matrix (CPU/GPU on either side, read and
//! write, single, batch and session, odd sizes), staging bounds and GPU faults. Every case runs
//! on the in-memory fake runtime; on a machine with a GPU runtime (the `cuda` feature and a
//! driver) it runs there too, and `MORIO_TEST_GPU=1` makes a missing GPU a failure.

use std::sync::Arc;
use std::time::Duration;

use morio::gpu::fake::{FakeGpu, FaultAt};
use morio::gpu::GpuRuntime;
use morio::{
    EngineError, IoEngine, MemoryLocationType, RegisteredBuffer, StatusCode, TcpBackendConfig,
};

use crate::common::*;

/// The runtimes to test: a fresh fake, and the machine's own when it has one.
pub(crate) fn runtimes() -> Vec<(&'static str, Arc<dyn GpuRuntime>)> {
    let mut v: Vec<(&'static str, Arc<dyn GpuRuntime>)> = vec![("fake", Arc::new(FakeGpu::new(2)))];
    match morio::gpu::detect() {
        Ok(rt) => v.push((rt.name(), rt)),
        Err(e) if std::env::var_os("MORIO_TEST_GPU").is_some() => {
            panic!("MORIO_TEST_GPU is set but no GPU runtime is usable: {e}")
        }
        Err(e) => eprintln!("no real GPU runtime here ({e}); fake only"),
    }
    v
}

pub(crate) fn gpu_pair(
    prefix: &str,
    cfg: TcpBackendConfig,
    rt: &Arc<dyn GpuRuntime>,
) -> (IoEngine, IoEngine) {
    let (a, b) = pair(prefix, cfg);
    a.set_gpu_runtime(rt.clone()).unwrap();
    b.set_gpu_runtime(rt.clone()).unwrap();
    (a, b)
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Kind {
    Cpu,
    Gpu,
}

pub(crate) fn buffer(e: &IoEngine, kind: Kind, bytes: &[u8]) -> RegisteredBuffer {
    match kind {
        Kind::Cpu => e.register_buffer(bytes.to_vec()).unwrap(),
        Kind::Gpu => {
            let b = e.alloc_gpu_buffer(0, bytes.len()).unwrap();
            assert!(b.write_at(0, bytes));
            b
        }
    }
}

/// Small slots and chunks so that even modest sizes run multi-slot, multi-chunk pipelines.
fn small_slots() -> TcpBackendConfig {
    cfg_with(|c| {
        c.gpu_slot_bytes = 16 << 10;
        c.gpu_staging_bytes = 2 * 2 * 4 * (16 << 10);
        c.chunk_bytes = 64 << 10;
        c.gpu_chunk_bytes = 64 << 10;
        c.same_host_chunk_bytes = 64 << 10;
        c.striping_threshold_bytes = 32 << 10;
        c.num_data_conns = 4;
    })
}

/// One batch write of the segments `[local offsets, remote offsets, sizes]` from `src` on
/// `a` into `dst`, which must then hold `want`.
fn batch_write_checked(
    a: &IoEngine,
    src: &RegisteredBuffer,
    dst: &RegisteredBuffer,
    [lo, ro, sz]: [&Vec<usize>; 3],
    want: &[u8],
    what: &str,
) {
    let uid = a.allocate_transfer_uid();
    let st = a.batch_write(
        &[src.desc().clone()],
        std::slice::from_ref(lo),
        &[dst.desc().clone()],
        std::slice::from_ref(ro),
        std::slice::from_ref(sz),
        &[uid],
    );
    assert_ok(&st[0], what);
    assert_bytes_eq(&dst.to_vec(), want, what);
}

/// MORI-IO's `test_tcp_gpu_write_read_and_batch_staging`: 4096-byte GPU buffers on device 0.
#[test]
fn tcp_gpu_write_read_and_batch_staging() {
    for (name, rt) in runtimes() {
        let (a, b) = gpu_pair(&format!("gpu_mori_{name}"), test_cfg(), &rt);
        let n = 4096;
        let src = buffer(&a, Kind::Gpu, &random_bytes(n, 1));
        let dst = buffer(&b, Kind::Gpu, &random_bytes(n, 2));
        assert_eq!(src.desc().loc, MemoryLocationType::Gpu);
        assert_eq!(src.desc().device_id, 0);
        assert!(!src.desc().device_bus_id.is_empty(), "bus id carried");

        let uid = a.allocate_transfer_uid();
        assert_ok(&a.write(src.desc(), 0, dst.desc(), 0, n, uid), "gpu write");
        assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
        assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "gpu write");

        // expected = dst.clone(); src.zero_(); read into src; src == expected.
        let expected = random_bytes(n, 3);
        assert!(dst.write_at(0, &expected));
        assert!(src.write_at(0, &vec![0u8; n]));
        let uid = a.allocate_transfer_uid();
        assert_ok(&a.read(src.desc(), 0, dst.desc(), 0, n, uid), "gpu read");
        assert_bytes_eq(&src.to_vec(), &expected, "gpu read");

        let offs = [0usize, 1024, 2048, 3072];
        let sizes = [511usize, 509, 507, 505];
        let fresh = random_bytes(n, 4);
        assert!(src.write_at(0, &fresh));
        let mut want = dst.to_vec();
        let sess = a.create_session(src.desc(), dst.desc()).unwrap();
        let uid = sess.allocate_transfer_uid();
        assert_ok(
            &sess.batch_write(&offs, &offs, &sizes, uid),
            "session batch_write",
        );
        for (&o, &z) in offs.iter().zip(&sizes) {
            want[o..o + z].copy_from_slice(&fresh[o..o + z]);
        }
        assert_bytes_eq(&dst.to_vec(), &want, "gpu session batch_write");
    }
}

/// One write and one read of `size` bytes at odd offsets between the given kinds; both
/// sides' bytes outside the range must stay untouched.
fn round_trip(a: &IoEngine, b: &IoEngine, local: Kind, remote: Kind, size: usize, seed: u64) {
    let pad = 3;
    let n = size + 2 * pad;
    let src = buffer(a, local, &random_big(n, seed));
    let dst = buffer(b, remote, &random_big(n, seed + 1));
    let what = format!("{local:?}->{remote:?} write of {size}");
    let mut want = dst.to_vec();
    want[pad..pad + size].copy_from_slice(&src.to_vec()[pad..pad + size]);
    let uid = a.allocate_transfer_uid();
    assert_ok(&a.write(src.desc(), pad, dst.desc(), pad, size, uid), &what);
    assert_eq!(inbound(b, a.key(), uid), StatusCode::Success, "{what}");
    assert_bytes_eq(&dst.to_vec(), &want, &what);

    let what = format!("{local:?}<-{remote:?} read of {size}");
    let fresh = random_big(n, seed + 2);
    assert!(dst.write_at(0, &fresh));
    let mut want = src.to_vec();
    want[pad..pad + size].copy_from_slice(&fresh[pad..pad + size]);
    let uid = a.allocate_transfer_uid();
    assert_ok(&a.read(src.desc(), pad, dst.desc(), pad, size, uid), &what);
    assert_eq!(inbound(b, a.key(), uid), StatusCode::Success, "{what}");
    assert_bytes_eq(&src.to_vec(), &want, &what);
}

const COMBOS: [(Kind, Kind); 3] = [
    (Kind::Gpu, Kind::Gpu),
    (Kind::Cpu, Kind::Gpu),
    (Kind::Gpu, Kind::Cpu),
];

#[test]
fn every_memory_combination_and_odd_size_round_trips() {
    let mut sizes = vec![
        1usize,
        7,
        4095,
        16 << 10,
        (16 << 10) + 1,
        (64 << 10) + 3,
        (1 << 20) + 17,
        (5 << 20) + 5,
    ];
    if std::env::var_os("MORIO_TEST_BIG").is_some() {
        sizes.push(1 << 30);
    }
    for (name, rt) in runtimes() {
        for (cfg_name, cfg) in [("default", test_cfg()), ("small_slots", small_slots())] {
            let (a, b) = gpu_pair(&format!("gpu_matrix_{name}_{cfg_name}"), cfg, &rt);
            for (i, &size) in sizes.iter().enumerate() {
                if size == 1 << 30 && cfg_name == "small_slots" {
                    continue;
                }
                for (local, remote) in COMBOS {
                    round_trip(&a, &b, local, remote, size, i as u64 * 10);
                }
            }
        }
    }
}

/// Batches of many small segments and a batch of several transfers, GPU on both sides.
#[test]
fn gpu_batches_of_small_and_scattered_segments() {
    for (name, rt) in runtimes() {
        let (a, b) = gpu_pair(&format!("gpu_batch_{name}"), small_slots(), &rt);
        let n = 256 * 64;
        let src = buffer(&a, Kind::Gpu, &random_bytes(n, 5));
        let dst = buffer(&b, Kind::Gpu, &random_bytes(n, 6));
        // 256 segments of 8 B, each at a different place on each side.
        let lo: Vec<usize> = (0..256).map(|i| i * 64).collect();
        let ro: Vec<usize> = (0..256).map(|i| (255 - i) * 64 + 13).collect();
        let sz = vec![8usize; 256];
        let mut want = dst.to_vec();
        let s = src.to_vec();
        for ((&l, &r), &z) in lo.iter().zip(&ro).zip(&sz) {
            want[r..r + z].copy_from_slice(&s[l..l + z]);
        }
        batch_write_checked(
            &a,
            &src,
            &dst,
            [&lo, &ro, &sz],
            &want,
            "8 B x 256 batch write",
        );

        // A batch of 8 transfers with segments of uneven, slot-straddling sizes, read back.
        let fresh = random_bytes(n, 7);
        assert!(dst.write_at(0, &fresh));
        let mut want = src.to_vec();
        let mut los = Vec::new();
        let mut ros = Vec::new();
        let mut szs = Vec::new();
        for t in 0..8 {
            let base = t * 2048;
            let (l, r, z) = (
                vec![base, base + 1000],
                vec![base + 5, base + 1003],
                vec![997usize, 1021],
            );
            for ((&l, &r), &z) in l.iter().zip(&r).zip(&z) {
                want[l..l + z].copy_from_slice(&fresh[r..r + z]);
            }
            los.push(l);
            ros.push(r);
            szs.push(z);
        }
        let uids: Vec<u64> = (0..8).map(|_| a.allocate_transfer_uid()).collect();
        let st = a.batch_read(
            &vec![src.desc().clone(); 8],
            &los,
            &vec![dst.desc().clone(); 8],
            &ros,
            &szs,
            &uids,
        );
        for s in &st {
            assert_ok(s, "batch read");
        }
        assert_bytes_eq(&src.to_vec(), &want, "batch of 8 reads");
    }
}

/// A chunk's many small segments reach the GPU runtime as one batch of copies per staging
/// slot (CUDA: one `cuMemcpyBatchAsync` instead of a call per segment), staged over TCP and
/// copied device to device between processes of one host alike.
#[test]
fn a_chunks_segments_are_copied_in_batches() {
    for same_host in [morio::SameHost::Off, morio::SameHost::Require] {
        let fake = Arc::new(FakeGpu::new(1));
        let rt: Arc<dyn GpuRuntime> = fake.clone();
        let cfg = TcpBackendConfig {
            same_host: Some(same_host),
            ..small_slots()
        };
        let (a, b) = gpu_pair(&format!("gpu_batched_{same_host:?}"), cfg, &rt);
        let n = 256 * 64;
        let src = buffer(&a, Kind::Gpu, &random_bytes(n, 15));
        let dst = buffer(&b, Kind::Gpu, &vec![0u8; n]);
        let lo: Vec<usize> = (0..256).map(|i| i * 64).collect();
        let ro: Vec<usize> = (0..256).map(|i| (255 - i) * 64 + 3).collect();
        let sz = vec![16usize; 256];
        let mut want = vec![0u8; n];
        let s = src.to_vec();
        for (&l, &r) in lo.iter().zip(&ro) {
            want[r..r + 16].copy_from_slice(&s[l..l + 16]);
        }
        let (copies, batches) = (fake.copies(), fake.batches());
        batch_write_checked(
            &a,
            &src,
            &dst,
            [&lo, &ro, &sz],
            &want,
            "16 B x 256 batch write",
        );
        let (copies, batches) = (fake.copies() - copies, fake.batches() - batches);
        // Staged: 256 D2H and 256 H2D copies; same host: 256 device-to-device copies. One
        // 4 KiB payload fits a slot, so each side issues one batch.
        assert!(copies >= 256, "{same_host:?}: {copies} copies");
        assert!(
            (1..=2).contains(&batches),
            "{same_host:?}: {copies} copies in {batches} batches"
        );
    }
}

/// Over TCP a transfer with GPU memory on either side is cut at `gpu_chunk_bytes`, one with
/// host memory on both at `chunk_bytes`: a 4 MiB write on one lane is one chunk or four, as
/// the target's count of joined (multi-chunk) transfers shows.
#[test]
fn gpu_transfers_over_tcp_take_gpu_chunk_bytes() {
    let rt: Arc<dyn GpuRuntime> = Arc::new(FakeGpu::new(1));
    let cfg = cfg_with(|c| {
        c.same_host = Some(morio::SameHost::Off);
        c.num_data_conns = 1;
        c.chunk_bytes = 1 << 20;
        c.gpu_chunk_bytes = 4 << 20;
    });
    let (a, b) = gpu_pair("gpu_chunks", cfg, &rt);
    let n = 4 << 20;
    let data = random_big(n, 21);
    for (local, remote, joined) in [
        (Kind::Cpu, Kind::Cpu, 1),
        (Kind::Gpu, Kind::Gpu, 0),
        (Kind::Cpu, Kind::Gpu, 0),
        (Kind::Gpu, Kind::Cpu, 0),
    ] {
        let what = format!("{local:?} -> {remote:?}");
        let src = buffer(&a, local, &data);
        let dst = buffer(&b, remote, &vec![0u8; n]);
        let before = b.stats().unwrap().total().joined_transfers;
        let uid = a.allocate_transfer_uid();
        assert_ok(&a.write(src.desc(), 0, dst.desc(), 0, n, uid), &what);
        assert_bytes_eq(&dst.to_vec(), &data, &what);
        let t = b.stats().unwrap().total();
        assert_eq!(t.joined_transfers - before, joined, "{what}: {t:?}");
    }
}

/// A staging pool too small for 2 MiB slots on every shard (1 MiB over 4 shards) takes
/// smaller slots instead of refusing the backend, and still moves every byte within its cap.
#[test]
fn a_small_staging_pool_over_several_shards_takes_smaller_slots() {
    let fake = Arc::new(FakeGpu::new(1));
    let rt: Arc<dyn GpuRuntime> = fake.clone();
    let cfg = cfg_with(|c| {
        c.same_host = Some(morio::SameHost::Off);
        c.num_shards = Some(4);
        c.num_data_conns = 4;
        c.gpu_staging_bytes = 1 << 20;
    });
    assert_eq!(cfg.gpu_slot_bytes, 2 << 20);
    assert_eq!(cfg.staging_slot_bytes(4), 64 << 10);
    let cap = cfg.gpu_staging_bytes;
    let (a, b) = gpu_pair("gpu_small_pool", cfg, &rt);
    let n = 6 << 20;
    let data = random_big(n, 23);
    let src = buffer(&a, Kind::Gpu, &data);
    let dst = buffer(&b, Kind::Gpu, &vec![0u8; n]);
    let uid = a.allocate_transfer_uid();
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, n, uid),
        "6 MiB write",
    );
    assert_bytes_eq(&dst.to_vec(), &data, "6 MiB write");
    let back = buffer(&a, Kind::Gpu, &vec![0u8; n]);
    let uid = a.allocate_transfer_uid();
    assert_ok(&a.read(back.desc(), 0, dst.desc(), 0, n, uid), "6 MiB read");
    assert_bytes_eq(&back.to_vec(), &data, "6 MiB read");
    for e in [&a, &b] {
        let t = e.stats().unwrap().total();
        assert!(
            0 < t.gpu_staging_bytes && t.gpu_staging_bytes <= cap,
            "{t:?}"
        );
    }
}

/// Pinned staging never exceeds the configured cap, however large the transfer.
#[test]
fn staging_stays_within_the_configured_cap() {
    let fake = Arc::new(FakeGpu::new(1));
    fake.set_copy_delay(Duration::from_micros(50));
    let rt: Arc<dyn GpuRuntime> = fake.clone();
    // Staging itself is under test: same-host device parts would bypass it.
    let cfg = TcpBackendConfig {
        same_host: Some(morio::SameHost::Off),
        ..small_slots()
    };
    let cap = cfg.gpu_staging_bytes;
    let (a, b) = gpu_pair("gpu_cap", cfg, &rt);
    let n = 24 << 20;
    let src = buffer(&a, Kind::Gpu, &random_big(n, 8));
    let dst = buffer(&b, Kind::Gpu, &vec![0u8; n]);
    let uid = a.allocate_transfer_uid();
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, n, uid),
        "24 MiB write",
    );
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "24 MiB write");
    let uid = a.allocate_transfer_uid();
    assert_ok(&a.read(src.desc(), 0, dst.desc(), 0, n, uid), "24 MiB read");
    for e in [&a, &b] {
        let t = e.stats().unwrap().total();
        assert!(t.gpu_staging_bytes > 0, "staging was used");
        assert!(
            t.gpu_staging_bytes <= cap,
            "{} > cap {cap}",
            t.gpu_staging_bytes
        );
        assert!(t.gpu_staging_peak_bytes <= t.gpu_staging_bytes);
    }
    // Both engines share the fake: together they hold at most two caps.
    assert!(
        fake.pinned_peak_bytes() <= 2 * cap,
        "{} > 2 x {cap}",
        fake.pinned_peak_bytes()
    );
}

/// A GPU copy that fails is `ERR_GPU_OP` for that transfer only; the connection stays usable.
#[test]
fn gpu_copy_faults_fail_only_their_transfer() {
    let fake = Arc::new(FakeGpu::new(1));
    let rt: Arc<dyn GpuRuntime> = fake.clone();
    let (a, b) = gpu_pair("gpu_fault", test_cfg(), &rt);
    let n = 8192;
    let src = buffer(&a, Kind::Gpu, &random_bytes(n, 9));
    let dst = buffer(&b, Kind::Cpu, &vec![0u8; n]);
    let host = buffer(&a, Kind::Cpu, &random_bytes(n, 10));

    // The initiator's D2H is refused: nothing leaves.
    fake.inject_fault(Some(0), FaultAt::Submit);
    let uid = a.allocate_transfer_uid();
    let st = a.write(src.desc(), 0, dst.desc(), 0, n, uid);
    assert_eq!(wait(&st), StatusCode::ErrGpuOp, "{}", st.message());
    assert!(
        b.pop_inbound_transfer_status(a.key(), uid).is_none(),
        "nothing reached b"
    );
    assert!(dst.to_vec().iter().all(|&x| x == 0));

    // The same lane carries the next transfer.
    let uid = a.allocate_transfer_uid();
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, n, uid),
        "after the fault",
    );
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "after the fault");

    // Target side: b's H2D into its GPU buffer fails at completion; b says so, and a sees it.
    let gdst = buffer(&b, Kind::Gpu, &vec![0u8; n]);
    fake.inject_fault(Some(0), FaultAt::Complete);
    let uid = a.allocate_transfer_uid();
    let st = a.write(host.desc(), 0, gdst.desc(), 0, n, uid);
    assert_eq!(wait(&st), StatusCode::ErrGpuOp, "{}", st.message());
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::ErrGpuOp);
    fake.inject_fault(None, FaultAt::Submit);
}

/// Registration errors are clear and typed; nothing panics.
#[test]
fn bad_gpu_registrations_are_refused() {
    let fake: Arc<dyn GpuRuntime> = Arc::new(FakeGpu::new(1));
    // Declared before the engines, so both outlive them (registrations are never undone).
    let mut host = vec![0u8; 64];
    let d = fake.clone().alloc_device(0, 64).unwrap();
    let (a, _b) = gpu_pair("gpu_reg", test_cfg(), &fake);
    // SAFETY: `host` outlives the engine, and no transfer touches it (the registration is
    // refused anyway: host memory is not device memory).
    let r = unsafe { a.register_memory(host.as_mut_ptr(), 64, 0, MemoryLocationType::Gpu) };
    assert!(
        matches!(r, Err(EngineError::Gpu(_))),
        "host memory claimed as GPU: {r:?}"
    );
    assert!(
        matches!(a.alloc_gpu_buffer(3, 64), Err(EngineError::Gpu(_))),
        "no GPU 3"
    );
    // SAFETY: `d`'s 64 bytes of device memory outlive the engine, and no transfer touches
    // them.
    let ok = unsafe { a.register_memory(d.ptr() as *mut u8, 64, 0, MemoryLocationType::Gpu) };
    assert!(ok.is_ok());
    // SAFETY: the range overruns `d` by one byte on purpose: GPU registrations are checked
    // against the runtime's allocations and refused before anything uses the pointer.
    let over = unsafe { a.register_memory(d.ptr() as *mut u8, 65, 0, MemoryLocationType::Gpu) };
    assert!(
        matches!(over, Err(EngineError::Gpu(_))),
        "past the allocation: {over:?}"
    );
    let other: Arc<dyn GpuRuntime> = Arc::new(FakeGpu::new(1));
    assert!(a.set_gpu_runtime(other).is_err(), "runtime already chosen");

    // Without a runtime set, the engine detects one: on a machine without a GPU that is a
    // clear error, never a panic.
    let e = engine("gpu_detect", test_cfg());
    match e.alloc_gpu_buffer(0, 64) {
        Ok(b) => assert_eq!(b.desc().loc, MemoryLocationType::Gpu),
        Err(err) => assert!(matches!(err, EngineError::Gpu(_)), "{err}"),
    }
}

/// A GPU copy that fails after its frame's header has left cannot be answered in-band: the
/// lane closes, the transfer fails within its deadline, and the next transfer redials.
#[test]
fn gpu_fault_mid_frame_closes_the_lane_and_the_next_transfer_redials() {
    let fake = Arc::new(FakeGpu::new(1));
    let rt: Arc<dyn GpuRuntime> = fake.clone();
    let cfg = cfg_with(|c| {
        c.gpu_slot_bytes = 16 << 10;
        c.num_data_conns = 1;
        c.num_shards = Some(1);
        c.op_timeout = Duration::from_secs(5);
    });
    let (a, b) = gpu_pair("gpu_midframe", cfg, &rt);
    let n = 256 << 10;
    let src = buffer(&a, Kind::Gpu, &random_bytes(n, 11));
    let dst = buffer(&b, Kind::Cpu, &vec![0u8; n]);
    // The first slot's copy succeeds (so the header leaves), the third fails.
    fake.inject_fault(Some(2), FaultAt::Complete);
    let uid = a.allocate_transfer_uid();
    let st = a.write(src.desc(), 0, dst.desc(), 0, n, uid);
    let code = wait(&st);
    assert!(code.is_error(), "{code:?}");
    fake.inject_fault(None, FaultAt::Submit);
    // Host memory on a fresh connection still moves (the GPU stream's error is sticky, as a
    // CUDA device error is).
    let hsrc = buffer(&a, Kind::Cpu, &random_bytes(n, 12));
    let uid = a.allocate_transfer_uid();
    assert_ok(
        &a.write(hsrc.desc(), 0, dst.desc(), 0, n, uid),
        "after the lane closed",
    );
    assert_bytes_eq(&dst.to_vec(), &hsrc.to_vec(), "after the lane closed");
}

/// Deregistering GPU memory while a large transfer uses it is safe: the transfer ends, and
/// the region is released only after its last staging copy.
#[test]
fn deregister_gpu_memory_during_a_transfer() {
    let fake = Arc::new(FakeGpu::new(1));
    fake.set_copy_delay(Duration::from_micros(20));
    let rt: Arc<dyn GpuRuntime> = fake.clone();
    let (a, b) = gpu_pair("gpu_dereg", small_slots(), &rt);
    let n = 8 << 20;
    let src = buffer(&a, Kind::Cpu, &random_big(n, 13));
    let dst = b.alloc_gpu_buffer(0, n).unwrap();
    let uid = a.allocate_transfer_uid();
    let st = a.write(src.desc(), 0, dst.desc(), 0, n, uid);
    std::thread::sleep(Duration::from_millis(2));
    b.deregister_memory(dst.desc()).unwrap();
    let code = wait(&st);
    assert!(
        code == StatusCode::Success || code.is_error(),
        "terminal: {code:?}"
    );
    // Later transfers to it are refused and the handle still reads its memory.
    let uid = a.allocate_transfer_uid();
    let st = a.write(src.desc(), 0, dst.desc(), 0, 4096, uid);
    assert_eq!(wait(&st), StatusCode::ErrNotFound);
    assert_eq!(dst.to_vec().len(), n);
}

/// Staging memory from the runtime, at sizes that are and are not whole 2 MiB pages, carries
/// bytes into device memory and back through a stream (on CUDA: `cuMemHostAlloc`'s pinned
/// memory, DMA'd by the copy engines, as staging slots are).
#[test]
fn pinned_staging_memory_of_any_size_carries_bytes_both_ways() {
    for (name, rt) in runtimes() {
        let stream = rt.create_stream(0).unwrap();
        for len in [1usize, 4096 + 3, 2 << 20, 4 << 20, (3 << 20) + 5] {
            let mut up = rt.alloc_pinned(len).unwrap();
            let mut down = rt.alloc_pinned(len).unwrap();
            assert_eq!((up.len(), down.len()), (len, len), "{name}");
            for (i, b) in up.as_mut_slice().iter_mut().enumerate() {
                *b = (i % 251) as u8 ^ 0x5a;
            }
            let dev = rt.clone().alloc_device(0, len).unwrap();
            // SAFETY: both pinned buffers and the device buffer are live and untouched until
            // the fence below completes.
            unsafe {
                stream.h2d(dev.ptr(), up.as_slice().as_ptr(), len).unwrap();
                stream
                    .d2h(down.as_mut_slice().as_mut_ptr(), dev.ptr(), len)
                    .unwrap();
            }
            stream.fence().unwrap().wait_blocking().unwrap();
            assert!(up.as_slice() == down.as_slice(), "{name}: {len} bytes");
        }
    }
}

/// The lane indices `a` has dialed to `b` once there are `at_least` or `wait` has passed
/// (lanes count their connects as they come up, which may trail the transfer's SUCCESS on
/// another shard by a moment).
fn lanes_to(a: &IoEngine, b: &IoEngine, at_least: usize, wait: Duration) -> Vec<u16> {
    let key = b.engine_desc().key.clone();
    let t0 = std::time::Instant::now();
    loop {
        let lanes: Vec<u16> = a
            .stats()
            .unwrap()
            .per_peer()
            .get(&key)
            .map(|p| p.lanes.keys().copied().collect())
            .unwrap_or_default();
        if lanes.len() >= at_least || t0.elapsed() > wait {
            return lanes;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A transfer staged through GPU memory over TCP that gives each of `gpu_data_conns` lanes a
/// whole chunk stripes over them, a host-memory one and a smaller staged one over
/// `num_data_conns` only (the lanes past them open on the first large staged transfer);
/// `gpu_data_conns` below `num_data_conns` means `num_data_conns`. Bytes checked both ways.
#[test]
fn staged_gpu_transfers_stripe_over_gpu_data_conns_lanes() {
    for (name, rt) in runtimes() {
        for (gpu_conns, want) in [(4usize, vec![0u16, 1, 2, 3]), (1, vec![0, 1])] {
            let cfg = TcpBackendConfig {
                same_host: Some(morio::SameHost::Off),
                num_data_conns: 2,
                gpu_data_conns: Some(gpu_conns),
                ..small_slots()
            };
            let (a, b) = gpu_pair(&format!("gpu_lanes_{name}_{gpu_conns}"), cfg, &rt);
            let n = 1 << 20;
            let settle = Duration::from_millis(300);
            // Host memory, striped; then staged and striped (32 KiB threshold), but less than a
            // 64 KiB chunk for each of 4 lanes: both on lanes 0-1.
            for (kind, len, uid) in [(Kind::Cpu, n, 1), (Kind::Gpu, 192 << 10, 4)] {
                let what = format!("{name}: {kind:?} write of {len} bytes");
                let src = buffer(&a, kind, &random_bytes(len, uid));
                let dst = buffer(&b, kind, &vec![0u8; len]);
                assert_ok(&a.write(src.desc(), 0, dst.desc(), 0, len, uid), &what);
                assert_bytes_eq(&dst.to_vec(), &src.to_vec(), &what);
                assert_eq!(lanes_to(&a, &b, 3, settle), vec![0, 1], "{what}");
            }

            let src = buffer(&a, Kind::Gpu, &random_bytes(n, 22));
            let dst = buffer(&b, Kind::Gpu, &vec![0u8; n]);
            let s = a.write(src.desc(), 0, dst.desc(), 0, n, 2);
            assert_ok(&s, "GPU write");
            assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "GPU write");
            assert!(dst.write_at(0, &random_bytes(n, 23)));
            let s = a.read(src.desc(), 0, dst.desc(), 0, n, 3);
            assert_ok(&s, "GPU read");
            assert_bytes_eq(&src.to_vec(), &dst.to_vec(), "GPU read");
            let got = lanes_to(&a, &b, want.len(), Duration::from_secs(5));
            assert_eq!(got, want, "{name}: {gpu_conns}");
        }
    }
}
