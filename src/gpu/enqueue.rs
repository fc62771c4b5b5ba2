//! Handing a chunk's copies to a GPU stream: runs at constant pitches as 2D copies, small
//! copies as one batch, large and overlapping ones one call each.

use super::strided::{self, runs_2d};
use super::{BatchCopy, CopyDir, GpuError, GpuStream};

/// Whether the engine hands a chunk's segments to the GPU runtime as one batch
/// ([`GpuStream::copy_batch`]); `MORIO_GPU_BATCH_COPIES=off` enqueues them one by one (an A/B
/// knob, read once).
fn batch_copies() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        !matches!(
            std::env::var("MORIO_GPU_BATCH_COPIES").as_deref(),
            Ok("off" | "0" | "false")
        )
    })
}

/// Copies larger than this go to the runtime one call each, never in a batch: their call
/// costs little against their bytes, and CUDA may move a batch on its copy engines where a
/// single device-to-device copy runs on the SMs at several times the speed (NVIDIA/nccl
/// #2177: 87 GiB/s against 1.6 TiB/s for 32 MiB). 128 KiB is where cudf found batching (with
/// the copy engines preferred) stops paying (rapidsai/cudf#23675).
pub const BATCH_MAX_COPY: usize = 128 << 10;

/// The largest device-to-device copy batched: [`BATCH_MAX_COPY`] unless
/// `MORIO_GPU_D2D_BATCH_MAX` (bytes, read once) says otherwise, an A/B knob (a single D2D copy
/// may run on the SMs where a batch runs on the copy engines). On the H100 host 16 KiB ×
/// 1024 between processes moved at 8.7–10.5 GB/s batched against 5.6 with only copies up to
/// 4 KiB batched and 8.8–9.2 unbatched, in rounds that varied by ±20 %
/// (docs/perf/h100-s31.md).
fn d2d_batch_max() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        std::env::var("MORIO_GPU_D2D_BATCH_MAX")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(BATCH_MAX_COPY)
    })
}

/// The largest copy batched in direction `dir`.
fn batch_max(dir: CopyDir) -> usize {
    match dir {
        CopyDir::D2d => d2d_batch_max(),
        CopyDir::D2h | CopyDir::H2d => BATCH_MAX_COPY,
    }
}

/// Enqueue `copies` on `stream`: runs of small copies at constant pitches as one 2D copy
/// each ([`runs_2d`]; `MORIO_GPU_COPY_2D=off`: not), the other copies
/// of at most [`BATCH_MAX_COPY`] bytes (device to device: `MORIO_GPU_D2D_BATCH_MAX`) as one
/// batch, larger ones one call each. A batch's copies may run in any order, so copies whose
/// destinations overlap (a batch that writes one place twice: the later segment wins) go one
/// by one in their order, as do all of them when batching is off.
///
/// # Safety
/// As [`GpuStream::copy_batch`].
pub(crate) unsafe fn enqueue_copies(
    stream: &dyn GpuStream,
    dir: CopyDir,
    copies: &[BatchCopy],
) -> Result<(), GpuError> {
    let max = batch_max(dir);
    if copies.len() < 2 || !batch_copies() || destinations_overlap(copies) {
        // SAFETY: forwarded from the caller.
        return unsafe { one_by_one(stream, dir, copies) };
    }
    let rest = if copies.len() >= strided::MIN_ROWS && strided::copies_2d() {
        let (runs, rest) = runs_2d(copies, max);
        for r in &runs {
            // SAFETY: forwarded from the caller; the rows are copies given.
            unsafe { stream.copy_2d(dir, r)? };
        }
        rest
    } else {
        copies.to_vec()
    };
    let small = rest.iter().filter(|c| c.len <= max).count();
    if small < 2 {
        // SAFETY: forwarded from the caller.
        return unsafe { one_by_one(stream, dir, &rest) };
    }
    let (batch, large): (Vec<BatchCopy>, Vec<BatchCopy>) = rest.iter().partition(|c| c.len <= max);
    // SAFETY: forwarded from the caller.
    unsafe {
        one_by_one(stream, dir, &large)?;
        stream.copy_batch(dir, &batch)
    }
}

/// The copies of `copies` that [`enqueue_copies`] would not take into 2D copies (all of
/// them where it would not look for runs), in their order.
pub(crate) fn loose_copies(dir: CopyDir, copies: &[BatchCopy]) -> Vec<BatchCopy> {
    if copies.len() >= strided::MIN_ROWS && strided::copies_2d() {
        runs_2d(copies, batch_max(dir)).1
    } else {
        copies.to_vec()
    }
}

/// Whether two of `copies` write the same byte.
fn destinations_overlap(copies: &[BatchCopy]) -> bool {
    let mut d: Vec<(u64, u64)> = copies
        .iter()
        .map(|c| (c.dst, c.dst.saturating_add(c.len as u64)))
        .collect();
    d.sort_unstable();
    d.windows(2).any(|w| w[1].0 < w[0].1)
}

/// Enqueue `copies` one call each.
///
/// # Safety
/// As [`GpuStream::copy_batch`].
pub unsafe fn one_by_one<S: GpuStream + ?Sized>(
    stream: &S,
    dir: CopyDir,
    copies: &[BatchCopy],
) -> Result<(), GpuError> {
    for c in copies {
        // SAFETY: forwarded from the caller.
        unsafe {
            match dir {
                CopyDir::D2h => stream.d2h(c.dst as *mut u8, c.src, c.len)?,
                CopyDir::H2d => stream.h2d(c.dst, c.src as *const u8, c.len)?,
                CopyDir::D2d => stream.d2d(c.dst, c.src, c.len)?,
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::fake::FakeGpu;
    use crate::gpu::{DeviceBuf, GpuRuntime, PinnedBuf};
    use std::sync::Arc;

    fn copy(dst: u64, src: u64, len: usize) -> BatchCopy {
        BatchCopy { dst, src, len }
    }

    #[test]
    fn overlapping_destinations_are_found() {
        assert!(!destinations_overlap(&[]));
        assert!(!destinations_overlap(&[copy(0, 0, 8), copy(8, 0, 8)]));
        assert!(destinations_overlap(&[copy(8, 0, 8), copy(0, 0, 9)]));
        assert!(destinations_overlap(&[
            copy(0, 0, 64),
            copy(100, 0, 1),
            copy(10, 0, 1)
        ]));
        assert!(!destinations_overlap(&[
            copy(u64::MAX - 8, 0, 16),
            copy(0, 0, 1)
        ]));
    }

    /// A fake GPU, 1 MiB of its memory, a stream, and 1 MiB of pinned memory holding
    /// `i % modulus` at byte `i`.
    fn fake_setup(modulus: usize) -> (Arc<FakeGpu>, DeviceBuf, Box<dyn GpuStream>, PinnedBuf) {
        let gpu = Arc::new(FakeGpu::new(1));
        let dev = gpu.clone().alloc_device(0, 1 << 20).unwrap();
        let stream = gpu.create_stream(0).unwrap();
        let mut host = gpu.alloc_pinned(1 << 20).unwrap();
        for (i, b) in host.as_mut_slice().iter_mut().enumerate() {
            *b = (i % modulus) as u8;
        }
        (gpu, dev, stream, host)
    }

    /// Small copies go as one batch and large ones alone; copies into one place twice keep
    /// their order (the later wins), never batched.
    #[test]
    fn small_copies_are_batched_and_overlapping_ones_keep_their_order() {
        let (gpu, dev, stream, host) = fake_setup(251);
        let (h, d) = (host.as_slice().as_ptr() as u64, dev.ptr());
        // 16 small disjoint copies at irregular places and one of 256 KiB.
        let mut copies: Vec<BatchCopy> = (0..16)
            .map(|i| copy(d + i * 64, h + i * 32 + (i % 3) * 7, 32))
            .collect();
        copies.push(copy(d + (512 << 10), h + (512 << 10), 256 << 10));
        let (b0, c0) = (gpu.batches(), gpu.copies());
        // SAFETY: both ranges are live allocations of this test, left alone until the fence.
        unsafe { enqueue_copies(&*stream, CopyDir::H2d, &copies) }.unwrap();
        stream.fence().unwrap().wait_blocking().unwrap();
        assert_eq!((gpu.batches() - b0, gpu.copies() - c0), (1, 17));
        let mut back = vec![0u8; 1 << 20];
        // SAFETY: the device buffer is live.
        unsafe { gpu.copy_from_device(0, &mut back, d) }.unwrap();
        for i in 0..16usize {
            let at = i * 32 + (i % 3) * 7;
            assert_eq!(&back[i * 64..i * 64 + 32], &host.as_slice()[at..at + 32]);
        }
        assert_eq!(
            &back[512 << 10..768 << 10],
            &host.as_slice()[512 << 10..768 << 10]
        );

        // The same 8 bytes written three times: the last source wins, one call each.
        let twice = [copy(d, h, 8), copy(d, h + 100, 8), copy(d + 4, h + 200, 8)];
        let (b0, c0) = (gpu.batches(), gpu.copies());
        // SAFETY: as above.
        unsafe { enqueue_copies(&*stream, CopyDir::H2d, &twice) }.unwrap();
        stream.fence().unwrap().wait_blocking().unwrap();
        assert_eq!((gpu.batches() - b0, gpu.copies() - c0), (0, 3));
        // SAFETY: as above.
        unsafe { gpu.copy_from_device(0, &mut back[..12], d) }.unwrap();
        let s = host.as_slice();
        assert_eq!(&back[..4], &s[100..104]);
        assert_eq!(&back[4..12], &s[200..208]);
    }

    /// Small copies at constant pitches go as one 2D copy, both ways, a shorter run and the
    /// copies around it as a batch; every byte lands where its copy says.
    #[test]
    fn copies_at_constant_pitches_go_as_one_2d_copy() {
        let (gpu, dev, stream, host) = fake_setup(253);
        let (h, d) = (host.as_slice().as_ptr() as u64, dev.ptr());
        // MORI's layout (stride 4097) packed at 4096, then three copies too few for a run.
        let mut copies: Vec<BatchCopy> = (0..32)
            .map(|i| copy(d + i * 4097, h + i * 4096, 4096))
            .collect();
        copies
            .extend((0..3).map(|i| copy(d + (512 << 10) + i * 100, h + (512 << 10) + i * 50, 50)));
        let (b0, t0, c0) = (gpu.batches(), gpu.copies_2d(), gpu.copies());
        // SAFETY: both ranges are live allocations of this test, left alone until the fence.
        unsafe { enqueue_copies(&*stream, CopyDir::H2d, &copies) }.unwrap();
        stream.fence().unwrap().wait_blocking().unwrap();
        assert_eq!(
            (gpu.batches() - b0, gpu.copies_2d() - t0, gpu.copies() - c0),
            (1, 1, 35)
        );
        let mut back = vec![0u8; 1 << 20];
        // SAFETY: the device buffer is live.
        unsafe { gpu.copy_from_device(0, &mut back, d) }.unwrap();
        for c in &copies {
            let (at, from) = ((c.dst - d) as usize, (c.src - h) as usize);
            assert_eq!(&back[at..at + c.len], &host.as_slice()[from..from + c.len]);
        }
        // And back out: device rows at 4097 into a packed slot, as one 2D copy.
        let mut slot = gpu.alloc_pinned(32 * 4096).unwrap();
        let s = slot.as_mut_slice().as_mut_ptr() as u64;
        let out: Vec<BatchCopy> = (0..32)
            .map(|i| copy(s + i * 4096, d + i * 4097, 4096))
            .collect();
        let t0 = gpu.copies_2d();
        // SAFETY: as above.
        unsafe { enqueue_copies(&*stream, CopyDir::D2h, &out) }.unwrap();
        stream.fence().unwrap().wait_blocking().unwrap();
        assert_eq!(gpu.copies_2d() - t0, 1);
        for i in 0..32usize {
            assert_eq!(
                &slot.as_slice()[i * 4096..(i + 1) * 4096],
                &host.as_slice()[i * 4096..(i + 1) * 4096]
            );
        }
        // Device to device (a same-host peer's opened memory into this GPU's): 64 rows of
        // 8 B at stride 9 into rows at stride 24, as one 2D copy; `loose_copies` leaves none.
        let other = gpu.clone().alloc_device(0, 1 << 16).unwrap();
        let o = other.ptr();
        let d2d: Vec<BatchCopy> = (0..64).map(|i| copy(o + i * 24, d + i * 9, 8)).collect();
        assert!(loose_copies(CopyDir::D2d, &d2d).is_empty());
        let (t0, c0) = (gpu.copies_2d(), gpu.d2d_copies());
        // SAFETY: both device ranges are live allocations of this test.
        unsafe { enqueue_copies(&*stream, CopyDir::D2d, &d2d) }.unwrap();
        stream.fence().unwrap().wait_blocking().unwrap();
        assert_eq!((gpu.copies_2d() - t0, gpu.d2d_copies() - c0), (1, 64));
        let (mut from, mut to) = (vec![0u8; 1 << 16], vec![0u8; 1 << 16]);
        // SAFETY: both device buffers are live.
        unsafe {
            gpu.copy_from_device(0, &mut from, d).unwrap();
            gpu.copy_from_device(0, &mut to, o).unwrap();
        }
        for i in 0..64usize {
            assert_eq!(&to[i * 24..i * 24 + 8], &from[i * 9..i * 9 + 8], "row {i}");
            assert!(
                to[i * 24 + 8..i * 24 + 24].iter().all(|&b| b == 0),
                "row {i}"
            );
        }
        // Irregular destinations: every copy stays loose.
        let mut shuffled = d2d.clone();
        shuffled.swap(3, 40);
        shuffled.swap(10, 20);
        assert!(loose_copies(CopyDir::D2d, &shuffled).len() > 4);
    }
}
