//! Striped transfers of staged GPU memory over TCP ramp their chunk sizes: the first chunk of
//! each lane grows from `gpu_chunk_bytes / lanes` to the full chunk and the last ones shrink
//! back, so the lanes' first copies out of device memory and last copies into it are small
//! (`proto::plan::ramp_sizes`). Every byte still lands where it should.

use std::sync::Arc;

use morio::gpu::fake::FakeGpu;
use morio::gpu::GpuRuntime;

use crate::common::*;
use crate::gpu::{buffer, gpu_pair, Kind};

/// A 6 MiB + 123 B write and read between GPU buffers over four lanes in 256 KiB chunks and
/// slots: ramps of 64, 128, 192 and 256 KiB at each end, 19 full chunks and one of 123 B
/// between them, 28 chunks where an even cut (`gpu_ramp` off) makes 25. Each chunk is one
/// slot, so one copy on each side (the fake counts them); the bytes match both ways.
#[test]
fn staged_gpu_transfers_ramp_their_first_and_last_chunks() {
    for (ramp, chunks) in [(true, 28), (false, 25)] {
        ramped(ramp, chunks);
    }
}

fn ramped(ramp: bool, chunks: u64) {
    let fake = Arc::new(FakeGpu::new(1));
    let rt: Arc<dyn GpuRuntime> = fake.clone();
    let cfg = cfg_with(|c| {
        c.gpu_ramp = ramp;
        c.same_host = Some(morio::SameHost::Off);
        c.num_shards = Some(2);
        c.num_data_conns = 4;
        c.gpu_chunk_bytes = 256 << 10;
        c.gpu_slot_bytes = 256 << 10;
        c.gpu_staging_bytes = 2 * 2 * 2 * (256 << 10);
    });
    let (a, b) = gpu_pair(&format!("gpu_ramp_{ramp}"), cfg, &rt);
    let n = (6 << 20) + 123;
    let data = random_big(n, 31);
    let src = buffer(&a, Kind::Gpu, &data);
    let dst = buffer(&b, Kind::Gpu, &vec![0u8; n]);
    let before = fake.copies();
    let uid = a.allocate_transfer_uid();
    assert_ok(&a.write(src.desc(), 0, dst.desc(), 0, n, uid), "write");
    assert_bytes_eq(&dst.to_vec(), &data, "ramped write");
    assert_eq!(
        fake.copies() - before,
        2 * chunks,
        "ramp {ramp}: a copy a chunk each side"
    );

    let back = buffer(&a, Kind::Gpu, &vec![0u8; n]);
    let before = fake.copies();
    let uid = a.allocate_transfer_uid();
    assert_ok(&a.read(back.desc(), 0, dst.desc(), 0, n, uid), "read");
    assert_bytes_eq(&back.to_vec(), &data, "ramped read");
    assert_eq!(
        fake.copies() - before,
        2 * chunks,
        "ramp {ramp}: a copy a chunk each side"
    );
}
