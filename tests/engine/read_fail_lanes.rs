//! A striped read that fails once its chunks' answers arrived resets none of its lanes:
//! nothing of a read is left to land at its target, so another transfer in flight on the
//! same lanes goes on, and no lane failure is counted. (Lanes used to count such read
//! chunks as "write chunks sent and not yet placed" and were reset, failing the other
//! transfer with "connection to ... reset: transfer ... failed".)

use std::sync::Arc;
use std::time::Duration;

use morio::gpu::fake::{FakeGpu, FaultAt};
use morio::gpu::GpuRuntime;
use morio::StatusCode;

use crate::common::*;
use crate::gpu::{buffer, gpu_pair, Kind};

/// A read of 4 chunks from the target's GPU memory, over both lanes, whose later staging
/// copies fail there (their READ_DATA says ERR_GPU_OP; the first chunks carry their data),
/// with a 32 MiB host write queued on the same lanes right behind its READ frames.
#[test]
fn a_failed_striped_read_resets_no_lane_and_fails_no_other_transfer() {
    // One shard, two lanes over TCP; chunks of 256 KiB, each staged in one slot, so that a
    // failed copy is answered in-band (before the READ_DATA's header left).
    let cfg = cfg_with(|c| {
        c.num_shards = Some(1);
        c.num_data_conns = 2;
        c.gpu_data_conns = Some(2);
        c.same_host = Some(morio::SameHost::Off);
        c.chunk_bytes = 256 << 10;
        c.gpu_chunk_bytes = 256 << 10;
        c.gpu_slot_bytes = 256 << 10;
        c.striping_threshold_bytes = 64 << 10;
    });
    let fake = Arc::new(FakeGpu::new(1));
    let rt: Arc<dyn GpuRuntime> = fake.clone();
    let (a, b) = gpu_pair("read_fail_lanes", cfg, &rt);
    let r_len = 1 << 20;
    let far = buffer(&b, Kind::Gpu, &random_bytes(r_len, 1));
    let back = buffer(&a, Kind::Cpu, &vec![0u8; r_len]);
    let w_len = 32 << 20;
    let src = buffer(&a, Kind::Cpu, &random_big(w_len, 2));
    let dst = buffer(&b, Kind::Cpu, &vec![0u8; w_len]);
    // Slow copies on b's one stream, the third failing (and the ones after it, the fault
    // being sticky): the read fails about a second in, with data of its first chunks here.
    // b serves the write's chunks on each lane only after the read's, so the write is still
    // in flight on both lanes then, with most of its bytes to go.
    fake.set_copy_delay(Duration::from_millis(500));
    fake.inject_fault(Some(2), FaultAt::Complete);
    let (ru, wu) = (a.allocate_transfer_uid(), a.allocate_transfer_uid());
    let r = a.read(back.desc(), 0, far.desc(), 0, r_len, ru);
    let w = a.write(src.desc(), 0, dst.desc(), 0, w_len, wu);
    assert_eq!(wait(&r), StatusCode::ErrGpuOp, "read: {}", r.message());
    // Its failure took no lane with it: the write succeeds, whole, on the lanes it began on.
    assert_ok(&w, "write on the lanes of the failed read");
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "written bytes");
    let t = a.stats().unwrap().total();
    assert!(t.bytes_received > 0, "no data of the read arrived: {t:?}");
    assert_eq!((t.lane_connects, t.lane_failures), (2, 0), "{t:?}");
    fake.inject_fault(None, FaultAt::Submit);
}
