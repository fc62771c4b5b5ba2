//! VMM GPU memory (chunks mapped side by side, as torch's expandable segments and vLLM's
//! cuMem pool make) over the same-host transport: each chunk is exported as a file
//! descriptor, offered in one DEVICES record with every chunk a transfer touches, and the
//! receiver takes the descriptors out of the sender (`pidfd_getfd`), maps them and copies on
//! its GPU; transfers across the chunks' seams land byte for byte, and what cannot be
//! exported or opened is staged. On the fake runtime; CUDA runs the same paths across
//! processes (`python/tests/test_same_host.py::test_cuda_tensors_from_expandable_segments`).

use std::sync::Arc;

use morio::gpu::fake::FakeGpu;
use morio::gpu::{DeviceBuf, GpuRuntime};
use morio::{IoEngine, MemoryDesc, MemoryLocationType, SameHost, StatusCode, TcpBackendConfig};

use crate::common::*;

const CHUNK: usize = 64 << 10;
const CHUNKS: usize = 16;
const N: usize = CHUNK * CHUNKS;

fn cfg() -> TcpBackendConfig {
    cfg_with(|c| {
        c.same_host = Some(SameHost::Require);
        c.same_host_chunk_bytes = 64 << 10;
        c.num_data_conns = 2;
    })
}

/// VMM memory of `fake` holding `bytes`, registered with `e` (the buffer outlives `e`:
/// callers drop engines first).
fn vmm(fake: &Arc<FakeGpu>, e: &IoEngine, bytes: &[u8]) -> (DeviceBuf, MemoryDesc) {
    let d = fake.clone().alloc_device_chunked(0, CHUNK, CHUNKS).unwrap();
    d.write_at(0, bytes).unwrap();
    // SAFETY: the chunks live until the caller drops `d`, after the engines.
    let desc = unsafe { e.register_memory(d.ptr() as *mut u8, N, 0, MemoryLocationType::Gpu) }
        .expect("VMM memory registers across its chunks");
    (d, desc)
}

fn read(d: &DeviceBuf, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    d.read_at(off, &mut v).unwrap();
    v
}

/// Writes and reads between VMM regions across chunk seams, single and batched, every byte
/// moved device to device and none staged; each chunk opened once per process.
#[test]
fn vmm_chunks_move_device_to_device_across_their_seams() {
    let fake = Arc::new(FakeGpu::new(1));
    let rt: Arc<dyn GpuRuntime> = fake.clone();
    let src_bytes = random_big(N, 41);
    let (src, dst, back);
    {
        let (a, b) = pair("vmm_seams", cfg());
        a.set_gpu_runtime(rt.clone()).unwrap();
        b.set_gpu_runtime(rt).unwrap();
        let (s, sd) = vmm(&fake, &a, &src_bytes);
        let (d, dd) = vmm(&fake, &b, &vec![0u8; N]);
        let (k, kd) = vmm(&fake, &a, &vec![0u8; N]);
        assert_eq!(
            sd.ipc_handle, [0u8; 64],
            "MORI's field holds legacy handles only"
        );
        for (off, len) in [(CHUNK - 7, 9000), (3, N - 3), (5 * CHUNK + 100, 3 * CHUNK)] {
            let what = format!("write of {len} at {off}");
            let uid = a.allocate_transfer_uid();
            assert_ok(&a.write(&sd, off, &dd, off, len, uid), &what);
            assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success, "{what}");
            assert_bytes_eq(&read(&d, off, len), &src_bytes[off..off + len], &what);
            let what = format!("read of {len} at {off}");
            let uid = a.allocate_transfer_uid();
            assert_ok(&a.read(&kd, off, &dd, off, len, uid), &what);
            assert_bytes_eq(&read(&k, off, len), &src_bytes[off..off + len], &what);
        }
        // A batch whose pieces straddle seams, landing at other offsets.
        let offs: Vec<usize> = (0..CHUNKS - 1).map(|i| (i + 1) * CHUNK - 5000).collect();
        let dsts: Vec<usize> = offs.iter().map(|o| N - 9000 - o).collect();
        let sizes = vec![9000usize; offs.len()];
        let sts = a.batch_write(
            std::slice::from_ref(&sd),
            std::slice::from_ref(&offs),
            std::slice::from_ref(&dd),
            std::slice::from_ref(&dsts),
            &[sizes],
            &[a.allocate_transfer_uid()],
        );
        assert_ok(&sts[0], "batch write");
        for (&o, &t) in offs.iter().zip(&dsts) {
            assert_bytes_eq(&read(&d, t, 9000), &src_bytes[o..o + 9000], "piece");
        }
        for e in [&a, &b] {
            let t = e.stats().unwrap().total();
            assert!(t.gpu_ipc_bytes > 0, "{t:?}");
            assert_eq!((t.gpu_staged_bytes, t.gpu_ipc_declined), (0, 0), "{t:?}");
        }
        // Each side opened the other's chunks it copied from, each once (another test's
        // sweep may close unused ones meanwhile, which opens them again).
        assert!(fake.ipc_opens() >= CHUNKS as u64, "{}", fake.ipc_opens());
        (src, dst, back) = (s, d, k);
        drop((a, b));
    }
    drop((src, dst, back));
}

/// VMM chunks the runtime cannot export (made without a descriptor handle type) still
/// register, and move staged, byte for byte, with nothing offered.
#[test]
fn vmm_chunks_that_cannot_be_exported_are_staged() {
    let fake = Arc::new(FakeGpu::new(1));
    fake.refuse_vmm_export(true);
    let rt: Arc<dyn GpuRuntime> = fake.clone();
    let src_bytes = random_big(N, 42);
    let bufs;
    {
        let (a, b) = pair("vmm_noexport", cfg());
        a.set_gpu_runtime(rt.clone()).unwrap();
        b.set_gpu_runtime(rt).unwrap();
        let (s, sd) = vmm(&fake, &a, &src_bytes);
        let (d, dd) = vmm(&fake, &b, &vec![0u8; N]);
        let uid = a.allocate_transfer_uid();
        assert_ok(&a.write(&sd, 10, &dd, 20, N - 30, uid), "staged write");
        assert_bytes_eq(
            &read(&d, 20, N - 30),
            &src_bytes[10..N - 20],
            "staged write",
        );
        let t = a.stats().unwrap().total();
        assert_eq!((t.gpu_ipc_bytes, t.gpu_ipc_declined), (0, 0), "{t:?}");
        assert_eq!(t.gpu_staged_bytes, (N - 30) as u64, "{t:?}");
        assert_eq!(fake.ipc_opens(), 0);
        bufs = (s, d);
        drop((a, b));
    }
    drop(bufs);
}

/// A receiver that cannot open descriptor exports declines them (once tried per
/// connection), the bytes arrive staged, and the same connections still take ordinary
/// allocations' device parts afterwards (not declined for good).
#[test]
fn refused_vmm_imports_are_staged_and_ordinary_memory_still_moves_device_to_device() {
    let fake = Arc::new(FakeGpu::new(1));
    let rt: Arc<dyn GpuRuntime> = fake.clone();
    let src_bytes = random_big(N, 43);
    let bufs;
    {
        let (a, b) = pair(
            "vmm_refused",
            cfg_with(|c| {
                *c = cfg();
                c.num_data_conns = 1;
            }),
        );
        a.set_gpu_runtime(rt.clone()).unwrap();
        b.set_gpu_runtime(rt).unwrap();
        let (s, sd) = vmm(&fake, &a, &src_bytes);
        let dst = b.alloc_gpu_buffer(0, N).unwrap();
        fake.refuse_ipc(true);
        for round in 0..3 {
            let uid = a.allocate_transfer_uid();
            let what = format!("refused write {round}");
            assert_ok(&a.write(&sd, 0, dst.desc(), 0, N, uid), &what);
            assert_bytes_eq(&bytes_at(&dst, 0, N), &src_bytes, &what);
        }
        let t = a.stats().unwrap().total();
        assert_eq!(t.gpu_ipc_bytes, 0, "{t:?}");
        assert!(t.gpu_ipc_declined >= 3, "{t:?}");
        assert_eq!(t.gpu_staged_bytes, 3 * N as u64, "{t:?}");
        fake.refuse_ipc(false);
        let plain = a.alloc_gpu_buffer(0, 1 << 16).unwrap();
        assert!(plain.write_at(0, &[5u8; 1 << 16]));
        let before = fake.d2d_copies();
        let uid = a.allocate_transfer_uid();
        assert_ok(
            &a.write(plain.desc(), 0, dst.desc(), 0, 1 << 16, uid),
            "legacy",
        );
        assert_eq!(bytes_at(&dst, 0, 1 << 16), vec![5u8; 1 << 16]);
        assert!(
            fake.d2d_copies() > before,
            "offered and taken device to device"
        );
        bufs = s;
        drop((a, b, plain, dst));
    }
    drop(bufs);
}

/// Payloads of many tiny parts are staged, not offered as device parts (one device-to-device
/// copy between processes costs more than staging many small ones in batches): a batch of
/// 8-byte pieces in descending order (no 2D runs) and three 1 KiB pieces are staged; a
/// single 4 KiB write (one part) and a batch of 16 KiB pieces move device to device.
#[test]
fn tiny_parts_are_staged_and_larger_ones_offered() {
    let fake = Arc::new(FakeGpu::new(1));
    let rt: Arc<dyn GpuRuntime> = fake.clone();
    let (a, b) = pair("gpu_tiny_parts", cfg());
    a.set_gpu_runtime(rt.clone()).unwrap();
    b.set_gpu_runtime(rt).unwrap();
    let src = a.alloc_gpu_buffer(0, N).unwrap();
    let dst = b.alloc_gpu_buffer(0, N).unwrap();
    let bytes = random_big(N, 44);
    assert!(src.write_at(0, &bytes));
    let batch = |size: usize, n: usize| {
        let offs: Vec<usize> = (0..n).rev().map(|i| i * 2 * size).collect();
        let st = a.batch_write(
            &[src.desc().clone()],
            std::slice::from_ref(&offs),
            &[dst.desc().clone()],
            std::slice::from_ref(&offs),
            &[vec![size; n]],
            &[a.allocate_transfer_uid()],
        );
        assert_ok(&st[0], &format!("{n} x {size}"));
        for &o in &offs {
            assert_bytes_eq(&bytes_at(&dst, o, size), &bytes[o..o + size], "piece");
        }
    };
    // A lane's shard counts its chunk when the peer has taken it, which may be just after
    // the transfer completed through another lane: the counters settle within moments.
    let moved = |e: &IoEngine, want: (u64, u64)| {
        let f = || {
            let t = e.stats().unwrap().total();
            (t.gpu_ipc_bytes, t.gpu_staged_bytes)
        };
        settled(f, &want)
    };
    batch(8, 64);
    batch(1024, 3);
    let want = (0, 64 * 8 + 3 * 1024);
    assert_eq!(moved(&a, want), want, "staged");
    let uid = a.allocate_transfer_uid();
    assert_ok(&a.write(src.desc(), 0, dst.desc(), 0, 4096, uid), "4 KiB");
    batch(16 << 10, 16);
    let want = (4096 + 16 * (16 << 10), 64 * 8 + 3 * 1024);
    assert_eq!(moved(&a, want), want, "offered");
    drop((a, b, src, dst));
}

/// A VMM source deregistered while a device copy from it is in flight: deregistration waits
/// for it (the chunks' descriptors stay open until the receiver acknowledged), and the same
/// memory registered again is exported afresh (new descriptors, new serials), so the
/// receiver replaces its mappings instead of reusing ones made for the old registration.
#[test]
fn a_vmm_source_registered_again_is_exported_and_opened_afresh() {
    let fake = Arc::new(FakeGpu::new(1));
    let rt: Arc<dyn GpuRuntime> = fake.clone();
    let first = random_big(N, 45);
    let second = random_big(N, 46);
    let bufs;
    {
        let (a, b) = pair("vmm_again", cfg());
        a.set_gpu_runtime(rt.clone()).unwrap();
        b.set_gpu_runtime(rt).unwrap();
        let (s, sd) = vmm(&fake, &a, &first);
        let dst = b.alloc_gpu_buffer(0, N).unwrap();
        fake.set_copy_delay(std::time::Duration::from_millis(30));
        let st = a.write(&sd, 0, dst.desc(), 0, N, a.allocate_transfer_uid());
        std::thread::sleep(std::time::Duration::from_millis(10));
        a.deregister_memory(&sd).unwrap();
        let code = wait(&st);
        assert!(
            code == StatusCode::Success || code.is_error(),
            "terminal: {code:?}: {}",
            st.message()
        );
        fake.set_copy_delay(std::time::Duration::ZERO);
        s.write_at(0, &second).unwrap();
        // SAFETY: the chunks live until `s` drops, after the engines.
        let again = unsafe { a.register_memory(s.ptr() as *mut u8, N, 0, MemoryLocationType::Gpu) }
            .unwrap();
        let opens = fake.ipc_opens();
        let uid = a.allocate_transfer_uid();
        assert_ok(
            &a.write(&again, 0, dst.desc(), 0, N, uid),
            "registered again",
        );
        assert_bytes_eq(&bytes_at(&dst, 0, N), &second, "registered again");
        assert!(fake.ipc_opens() > opens, "the old mappings were replaced");
        let t = a.stats().unwrap().total();
        assert_eq!(t.gpu_staged_bytes, 0, "{t:?}");
        bufs = s;
        drop((a, b, dst));
    }
    drop(bufs);
}

/// VMM chunks exported as fabric handles (chunks made with only a fabric handle type, as
/// torch makes them on IMEX systems) move device to device as descriptor exports do, with no
/// descriptor to take.
#[test]
fn vmm_chunks_exported_as_fabric_handles_move_device_to_device() {
    use morio::gpu::IpcKind;
    let fake = Arc::new(FakeGpu::new(1));
    fake.export_vmm_as_fabric(true);
    let rt: Arc<dyn GpuRuntime> = fake.clone();
    let src_bytes = random_big(N, 47);
    let bufs;
    {
        let (a, b) = pair("vmm_fabric", cfg());
        a.set_gpu_runtime(rt.clone()).unwrap();
        b.set_gpu_runtime(rt).unwrap();
        let (s, sd) = vmm(&fake, &a, &src_bytes);
        let (d, dd) = vmm(&fake, &b, &vec![0u8; N]);
        let kinds: Vec<IpcKind> = fake
            .ipc_export_range(0, s.ptr(), N)
            .unwrap()
            .list()
            .iter()
            .map(|e| e.kind)
            .collect();
        assert_eq!(kinds, vec![IpcKind::Fabric; CHUNKS]);
        let (off, len) = (CHUNK / 2, 5 * CHUNK);
        let uid = a.allocate_transfer_uid();
        assert_ok(&a.write(&sd, off, &dd, off, len, uid), "fabric write");
        assert_bytes_eq(
            &read(&d, off, len),
            &src_bytes[off..off + len],
            "fabric write",
        );
        let moved = || {
            let t = a.stats().unwrap().total();
            (t.gpu_ipc_bytes, t.gpu_staged_bytes)
        };
        assert_eq!(settled(moved, &(len as u64, 0)), (len as u64, 0));
        bufs = (s, d);
        drop((a, b));
    }
    drop(bufs);
}
