//! GPU segments at irregular places (a paged KV cache's blocks: a block table on each side,
//! any order, lengths and alignments mixed) staged over TCP with the gather kernel on: every
//! byte lands where it should, written and read back, on the fake (which counts the gathers)
//! and on CUDA (whose kernel must load).

use std::sync::Arc;

use morio::gpu::fake::FakeGpu;
use morio::gpu::GpuRuntime;
use morio::IoEngine;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::common::*;
use crate::gpu::{buffer, gpu_pair, Kind};

/// `count` segments of `len(i)` bytes, from slots of `slot` bytes taken in a random order on
/// each side (local and remote block tables differ), at `skew` bytes into their slots.
fn layout(
    count: usize,
    slot: usize,
    skew: usize,
    len: impl Fn(&mut rand::rngs::StdRng) -> usize,
    seed: u64,
) -> [Vec<usize>; 3] {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut ids: Vec<usize> = (0..count * 2).collect();
    ids.shuffle(&mut rng);
    let lo = ids[..count].iter().map(|i| i * slot + skew).collect();
    ids.shuffle(&mut rng);
    let ro = ids[..count].iter().map(|i| i * slot + skew).collect();
    let sz = (0..count).map(|_| len(&mut rng)).collect();
    [lo, ro, sz]
}

/// Write the segments from `a` into `b`, then read them back into a zeroed buffer: each side
/// holds exactly the segments, nothing else changed.
fn round_trip(a: &IoEngine, b: &IoEngine, [lo, ro, sz]: &[Vec<usize>; 3], n: usize, what: &str) {
    let data = random_big(n, n as u64);
    let src = buffer(a, Kind::Gpu, &data);
    let dst = buffer(b, Kind::Gpu, &vec![0u8; n]);
    let back = buffer(a, Kind::Gpu, &vec![0u8; n]);
    let (mut want_dst, mut want_back) = (vec![0u8; n], vec![0u8; n]);
    for ((&l, &r), &z) in lo.iter().zip(ro).zip(sz) {
        want_dst[r..r + z].copy_from_slice(&data[l..l + z]);
        want_back[l..l + z].copy_from_slice(&data[l..l + z]);
    }
    let (o, p, z) = ([lo.clone()], [ro.clone()], [sz.clone()]);
    let uid = a.allocate_transfer_uid();
    let st = a.batch_write(
        &[src.desc().clone()],
        &o,
        &[dst.desc().clone()],
        &p,
        &z,
        &[uid],
    );
    assert_ok(&st[0], what);
    assert_bytes_eq(&dst.to_vec(), &want_dst, &format!("{what}: written"));
    let uid = a.allocate_transfer_uid();
    let st = a.batch_read(
        &[back.desc().clone()],
        &o,
        &[dst.desc().clone()],
        &p,
        &z,
        &[uid],
    );
    assert_ok(&st[0], what);
    assert_bytes_eq(&back.to_vec(), &want_back, &format!("{what}: read back"));
}

/// Aligned 4 KiB blocks (the kernel's 16-byte path), 8-byte segments at odd places (its byte
/// path, and more segments than one launch's table holds), 12-byte ones at 4-byte places,
/// and mixed lengths at mixed alignments, each way.
fn cases(a: &IoEngine, b: &IoEngine, name: &str) {
    let kv = layout(300, 4096, 0, |_| 4096, 1);
    round_trip(a, b, &kv, 600 * 4096, &format!("{name}: 4 KiB blocks"));
    let tiny = layout(3000, 16, 3, |_| 8, 2);
    round_trip(
        a,
        b,
        &tiny,
        6000 * 16,
        &format!("{name}: 8 B at odd places"),
    );
    let words = layout(500, 32, 4, |_| 12, 3);
    round_trip(
        a,
        b,
        &words,
        1000 * 32,
        &format!("{name}: 12 B at 4-byte places"),
    );
    let mixed = layout(400, 8192, 0, |r| r.gen_range(1..=8192), 4);
    round_trip(a, b, &mixed, 800 * 8192, &format!("{name}: mixed lengths"));
}

#[test]
fn scattered_gpu_segments_move_through_the_gather_kernel() {
    let cfg = || cfg_with(|c| c.same_host = Some(morio::SameHost::Off));
    let fake = Arc::new(FakeGpu::new(1));
    fake.set_gather(true);
    let rt: Arc<dyn GpuRuntime> = fake.clone();
    let (a, b) = gpu_pair("gpu_gather_fake", cfg(), &rt);
    cases(&a, &b, "fake");
    // Every case, both ways, both sides: at least one gather each.
    assert!(fake.gathers() >= 16, "{} gathers", fake.gathers());
    #[cfg(feature = "cuda")]
    match morio::gpu::cuda::CudaRuntime::new() {
        Ok(cuda) => {
            let cuda = cuda.with_gather(true);
            assert!(cuda.gather_ready(0), "the driver refused the gather kernel");
            let rt: Arc<dyn GpuRuntime> = Arc::new(cuda);
            let (a, b) = gpu_pair("gpu_gather_cuda", cfg(), &rt);
            cases(&a, &b, "cuda");
        }
        Err(e) if std::env::var_os("MORIO_TEST_GPU").is_some() => {
            panic!("MORIO_TEST_GPU is set but CUDA is not usable: {e}")
        }
        Err(e) => eprintln!("no CUDA here ({e}): fake only"),
    }
}
