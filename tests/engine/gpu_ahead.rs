//! GPU memory sent through staging: a lane copies its next chunk's first slot out of device
//! memory while it sends the frame before ("copy-ahead"), for the chunks of one transfer and
//! for the next transfer's, and a target does the same for the next READ it has buffered; a
//! copy failing there fails its transfer, never hangs it.

use std::sync::Arc;
use std::time::Duration;

use morio::gpu::fake::{FakeGpu, FaultAt};
use morio::gpu::GpuRuntime;
use morio::{StatusCode, TcpBackendConfig};

use crate::common::*;
use crate::gpu::{buffer, gpu_pair, Kind};

/// One shard and one lane over TCP (for GPU transfers too), 64 KiB chunks in one 64 KiB slot
/// each, two slots per pool: the chunk being sent holds one, the next chunk's copy the other.
fn one_lane() -> TcpBackendConfig {
    cfg_with(|c| {
        c.same_host = Some(morio::SameHost::Off);
        c.num_shards = Some(1);
        c.num_data_conns = 1;
        c.gpu_data_conns = Some(1);
        c.gpu_chunk_bytes = 64 << 10;
        c.gpu_slot_bytes = 64 << 10;
        c.gpu_staging_bytes = 2 * 2 * (64 << 10);
    })
}

/// With slow copies (the fake's delay), the chunks of a write from GPU memory, into GPU and
/// into host memory, and of a read from the target's GPU memory have their copies out of
/// device memory issued while the chunk before is sent (counted), and so do the first chunks
/// of writes queued behind another; every byte lands where it should.
#[test]
fn chunks_are_copied_out_of_gpu_memory_while_the_chunk_before_is_sent() {
    let fake = Arc::new(FakeGpu::new(1));
    fake.set_copy_delay(Duration::from_millis(1));
    let rt: Arc<dyn GpuRuntime> = fake.clone();
    let (a, b) = gpu_pair("gpu_ahead", one_lane(), &rt);
    let n = 1 << 20;
    // Writes from a's GPU memory (a copies ahead), then reads of b's (b, the target, copies
    // the next READ chunk's slot while it sends the READ_DATA before); into GPU and host.
    let cases = [
        (false, Kind::Gpu),
        (false, Kind::Cpu),
        (true, Kind::Gpu),
        (true, Kind::Cpu),
    ];
    for (i, (read, into)) in cases.into_iter().enumerate() {
        let what = format!("{} into {into:?}", if read { "read" } else { "write" });
        let (sender, receiver) = if read { (&b, &a) } else { (&a, &b) };
        let data = random_big(n, 50 + i as u64);
        let src = buffer(sender, Kind::Gpu, &data);
        let dst = buffer(receiver, into, &vec![0u8; n]);
        let before = sender.stats().unwrap().total().gpu_copies_ahead;
        let uid = a.allocate_transfer_uid();
        let st = if read {
            a.read(dst.desc(), 0, src.desc(), 0, n, uid)
        } else {
            a.write(src.desc(), 0, dst.desc(), 0, n, uid)
        };
        assert_ok(&st, &what);
        assert_bytes_eq(&dst.to_vec(), &data, &what);
        let ahead = sender.stats().unwrap().total().gpu_copies_ahead - before;
        // Sixteen chunks: all but the first may be copied ahead; with 1 ms copies most are.
        assert!((8..=15).contains(&ahead), "{what}: {ahead} copied ahead");
    }

    // Four one-chunk writes queued at once on the one lane: each next one's copy runs while
    // the one before is sent.
    let len = 64 << 10;
    let data = random_big(4 * len, 57);
    let src = buffer(&a, Kind::Gpu, &data);
    let dst = buffer(&b, Kind::Gpu, &vec![0u8; 4 * len]);
    let before = a.stats().unwrap().total().gpu_copies_ahead;
    let sts: Vec<_> = (0..4)
        .map(|i| {
            let uid = a.allocate_transfer_uid();
            let off = i * len;
            a.write(src.desc(), off, dst.desc(), off, len, uid)
        })
        .collect();
    for s in &sts {
        assert_ok(s, "queued writes");
    }
    assert_bytes_eq(&dst.to_vec(), &data, "queued writes");
    let ahead = a.stats().unwrap().total().gpu_copies_ahead - before;
    assert!(ahead >= 1, "queued writes: {ahead} copied ahead");
}

/// A copy out of device memory that fails after it was issued ahead fails the transfer of
/// its chunk (ERR_GPU_OP, at the target too) and does not hang it; the lane stays whole: a
/// host write on it succeeds next. (The fake's fault is sticky on the shard's stream, as a
/// CUDA device error is, so no GPU transfer of this engine can succeed after it.)
#[test]
fn a_copy_failing_ahead_fails_its_transfer_and_leaves_the_lane_whole() {
    let fake = Arc::new(FakeGpu::new(1));
    fake.set_copy_delay(Duration::from_millis(1));
    let rt: Arc<dyn GpuRuntime> = fake.clone();
    let (a, b) = gpu_pair("gpu_ahead_fault", one_lane(), &rt);
    let n = 1 << 20;
    let data = random_big(n, 59);
    let src = buffer(&a, Kind::Gpu, &data);
    let dst = buffer(&b, Kind::Gpu, &vec![0u8; n]);
    // Past the first chunks, so the failing copy is one issued ahead of its frame.
    fake.inject_fault(Some(6), FaultAt::Complete);
    let uid = a.allocate_transfer_uid();
    let st = a.write(src.desc(), 0, dst.desc(), 0, n, uid);
    assert_eq!(wait(&st), StatusCode::ErrGpuOp, "{}", st.message());
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::ErrGpuOp);
    assert!(a.stats().unwrap().total().gpu_copies_ahead > 0);

    let host = buffer(&a, Kind::Cpu, &data);
    let back = buffer(&b, Kind::Cpu, &vec![0u8; n]);
    let uid = a.allocate_transfer_uid();
    assert_ok(
        &a.write(host.desc(), 0, back.desc(), 0, n, uid),
        "host write after",
    );
    assert_bytes_eq(&back.to_vec(), &data, "host write after");
    assert_eq!(a.stats().unwrap().total().lane_failures, 0);
}
