//! GPU segments at constant strides (MORI's batch layout: segments of `size` bytes every
//! `size + 1`) staged over TCP: each slot's rows go to the runtime as one 2D copy on both
//! sides, and every byte lands where it should, on the fake and on a real GPU runtime; and a
//! device-to-device 2D copy (a same-host receiver's) on each runtime.

use std::sync::Arc;

use morio::gpu::fake::FakeGpu;
use morio::gpu::GpuRuntime;
use morio::{IoEngine, RegisteredBuffer};

use crate::common::*;
use crate::gpu::{buffer, gpu_pair, runtimes, Kind};

/// A batch of `count` segments of `size` bytes at stride `size + 1`, written from `a` into `b`
/// and read back into a zeroed buffer: both must hold the segments, nothing else changed.
fn strided_round_trip(a: &IoEngine, b: &IoEngine, size: usize, count: usize, what: &str) {
    let stride = size + 1;
    let n = stride * count;
    let data = random_big(n, size as u64);
    let src = buffer(a, Kind::Gpu, &data);
    let dst = buffer(b, Kind::Gpu, &vec![0u8; n]);
    let offs: Vec<usize> = (0..count).map(|i| i * stride).collect();
    let sizes = vec![size; count];
    let mut want = vec![0u8; n];
    for &o in &offs {
        want[o..o + size].copy_from_slice(&data[o..o + size]);
    }
    batch(a, true, &src, &dst, &offs, &sizes, what);
    assert_bytes_eq(&dst.to_vec(), &want, what);
    let back = buffer(a, Kind::Gpu, &vec![0u8; n]);
    batch(a, false, &back, &dst, &offs, &sizes, what);
    assert_bytes_eq(&back.to_vec(), &want, what);
}

/// One batch write (or read) of `sizes` at `offs` on both sides between `local` and `remote`.
fn batch(
    a: &IoEngine,
    write: bool,
    local: &RegisteredBuffer,
    remote: &RegisteredBuffer,
    offs: &[usize],
    sizes: &[usize],
    what: &str,
) {
    let uid = a.allocate_transfer_uid();
    let (l, r) = ([local.desc().clone()], [remote.desc().clone()]);
    let (o, z) = ([offs.to_vec()], [sizes.to_vec()]);
    let st = if write {
        a.batch_write(&l, &o, &r, &o, &z, &[uid])
    } else {
        a.batch_read(&l, &o, &r, &o, &z, &[uid])
    };
    assert_ok(&st[0], what);
}

/// 4 KiB × 256 and 8 B × 1024 in MORI's layout, GPU to GPU over TCP: on the fake, the slots'
/// copies went as 2D copies (write: out of the initiator's GPU and into the target's; read:
/// the other way), and on a real runtime the bytes are right.
#[test]
fn strided_gpu_segments_move_as_2d_copies() {
    let fake = Arc::new(FakeGpu::new(1));
    let mut rts: Vec<(&str, Arc<dyn GpuRuntime>)> = vec![("fake", fake.clone())];
    rts.extend(runtimes().into_iter().filter(|(n, _)| *n != "fake"));
    for (name, rt) in rts {
        let cfg = cfg_with(|c| c.same_host = Some(morio::SameHost::Off));
        let (a, b) = gpu_pair(&format!("gpu_strided_{name}"), cfg, &rt);
        let n0 = fake.copies_2d();
        strided_round_trip(&a, &b, 4096, 256, &format!("{name}: 4 KiB x 256"));
        strided_round_trip(&a, &b, 8, 1024, &format!("{name}: 8 B x 1024"));
        if name == "fake" {
            // Both layouts, both directions, both sides: at least one 2D copy each.
            let n = fake.copies_2d() - n0;
            assert!(n >= 8, "{n} 2D copies");
        }
    }
}

/// A 2D copy device to device (what a same-host receiver enqueues for a run of a peer's
/// segments): 300 rows of 8 B at pitch 9 into rows at pitch 24, on each runtime; exactly the
/// rows land, the gaps stay zero.
#[test]
fn a_device_to_device_2d_copy_moves_exactly_its_rows() {
    use morio::gpu::{Copy2d, CopyDir};
    for (name, rt) in runtimes() {
        let (rows, width, sp, dp) = (300usize, 8usize, 9u64, 24u64);
        let data = random_big(rows * sp as usize, 46);
        let src = rt.clone().alloc_device(0, data.len()).unwrap();
        src.write_at(0, &data).unwrap();
        let dst = rt.clone().alloc_device(0, rows * dp as usize).unwrap();
        dst.write_at(0, &vec![0u8; dst.len()]).unwrap();
        let stream = rt.create_stream(0).unwrap();
        let run = Copy2d {
            dst: dst.ptr(),
            dst_pitch: dp,
            src: src.ptr(),
            src_pitch: sp,
            width,
            rows,
        };
        // SAFETY: both buffers are live device memory of this runtime, held past the fence.
        unsafe { stream.copy_2d(CopyDir::D2d, &run) }.unwrap();
        stream.fence().unwrap().wait_blocking().unwrap();
        let mut got = vec![0u8; dst.len()];
        dst.read_at(0, &mut got).unwrap();
        let mut want = vec![0u8; dst.len()];
        for i in 0..rows {
            let (s, d) = (i * sp as usize, i * dp as usize);
            want[d..d + width].copy_from_slice(&data[s..s + width]);
        }
        assert_bytes_eq(&got, &want, &format!("{name}: D2D 2D copy"));
    }
}
