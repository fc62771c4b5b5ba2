//! GPU staging pools: a shard pins every slot its share of `gpu_staging_bytes` allows once
//! device memory is registered, so no transfer stalls on pinning memory, and it never pins
//! more.

use std::sync::Arc;
use std::time::Duration;

use morio::gpu::fake::FakeGpu;
use morio::gpu::GpuRuntime;

use crate::common::*;
use crate::gpu::{buffer, gpu_pair, Kind};

/// One shard per engine, four 64 KiB slots per pool: once GPU memory is registered, both pools
/// of each engine hold all four slots before any transfer; a 64 KiB write, then a 4 MiB write
/// and read through slow copies (many slots in flight, both directions) pin nothing more.
#[test]
fn pools_are_pinned_whole_when_gpu_memory_is_registered_and_never_grow() {
    let fake = Arc::new(FakeGpu::new(1));
    fake.set_copy_delay(Duration::from_micros(200));
    let rt: Arc<dyn GpuRuntime> = fake.clone();
    let slot = 64 << 10;
    let cfg = cfg_with(|c| {
        c.same_host = Some(morio::SameHost::Off);
        c.num_shards = Some(1);
        c.num_data_conns = 2;
        c.gpu_chunk_bytes = slot;
        c.gpu_slot_bytes = slot;
        c.gpu_staging_bytes = 2 * 4 * slot;
    });
    let (a, b) = gpu_pair("gpu_pool", cfg, &rt);
    let n = 4 << 20;
    let data = random_big(n, 31);
    let src = buffer(&a, Kind::Gpu, &data);
    let dst = buffer(&b, Kind::Gpu, &vec![0u8; n]);
    let staged = |e: &morio::IoEngine| e.stats().unwrap().total().gpu_staging_bytes;
    for e in [&a, &b] {
        assert_eq!(staged(e), 8 * slot, "both pools of {}, whole", e.key());
    }
    let before = fake.pinned_live_bytes();
    let uid = a.allocate_transfer_uid();
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, slot, uid),
        "64 KiB write",
    );
    let uid = a.allocate_transfer_uid();
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, n, uid),
        "4 MiB write",
    );
    assert_bytes_eq(&dst.to_vec(), &data, "4 MiB write");
    let back = buffer(&a, Kind::Gpu, &vec![0u8; n]);
    let uid = a.allocate_transfer_uid();
    assert_ok(&a.read(back.desc(), 0, dst.desc(), 0, n, uid), "4 MiB read");
    assert_bytes_eq(&back.to_vec(), &data, "4 MiB read");
    assert_eq!(fake.pinned_live_bytes(), before, "transfers pinned more");
    for e in [&a, &b] {
        let t = e.stats().unwrap().total();
        assert_eq!(
            t.gpu_staging_bytes,
            8 * slot,
            "both pools of {}, whole",
            e.key()
        );
        assert!(t.gpu_staging_peak_bytes <= t.gpu_staging_bytes, "{t:?}");
    }
}
