//! A write that fails by its deadline lands nothing at its target after the failure, even
//! where the target's kernel already holds all of its bytes: a real target placing into GPU
//! memory whose copies are slow (the fake's copy delay) keeps the write's chunks queued in its
//! socket, unread, past the deadline. `fence.rs` shows the initiator's side against a fake
//! target; `tests/serve/stopped.rs` a target process that was stopped.

use std::sync::Arc;
use std::time::{Duration, Instant};

use morio::gpu::fake::FakeGpu;
use morio::gpu::GpuRuntime;
use morio::StatusCode;

use crate::common::*;
use crate::gpu::{buffer, Kind};

/// A 4 MiB write in 256 KiB chunks to a target that places a chunk every 150 ms (each copy
/// into its GPU memory takes that long, and its two staging slots are all it has): the whole
/// write fits the target's receive queue, so the initiator's socket holds none of it when
/// the write fails by its 1 s deadline with most chunks still queued at the target. Once the
/// chunks the target had already taken are in place, its application reuses the memory:
/// nothing of the failed write may land there afterwards.
#[test]
fn a_write_its_slow_target_already_holds_lands_nothing_after_its_failure() {
    for mode in [morio::SameHost::Off, morio::SameHost::Require] {
        slow_target_drops_a_failed_write(mode);
    }
}

fn slow_target_drops_a_failed_write(mode: morio::SameHost) {
    let delay = Duration::from_millis(150);
    let deadline = Duration::from_secs(1);
    let slot = 256 << 10;
    let fake = Arc::new(FakeGpu::new(1));
    fake.set_copy_delay(delay);
    let rt: Arc<dyn GpuRuntime> = fake.clone();
    let (a, b) = pair(
        &format!("late_write_{mode:?}"),
        cfg_with(|c| {
            c.num_shards = Some(1);
            c.num_data_conns = 1;
            c.op_timeout = deadline;
            c.same_host = Some(mode);
            c.chunk_bytes = slot;
            c.gpu_chunk_bytes = slot;
            c.same_host_chunk_bytes = slot;
            c.gpu_slot_bytes = slot;
            c.gpu_staging_bytes = 2 * slot;
            c.gpu_ipc = Some(false);
            c.striping_threshold_bytes = 1 << 30;
        }),
    );
    b.set_gpu_runtime(rt).unwrap();
    let n = 4 << 20;
    let src = a.register_buffer(vec![0xAB; n]).unwrap();
    let dst = buffer(&b, Kind::Gpu, &vec![0u8; n]);
    let t0 = Instant::now();
    let st = a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid());
    let code = wait_within(&st, Duration::from_secs(10));
    assert_eq!(code, StatusCode::ErrBadState, "{mode:?}: {}", st.message());
    let failed = t0.elapsed();
    let placed_by_then = bytes_at(&dst, 0, n).iter().filter(|&&x| x == 0xAB).count();
    assert!(
        placed_by_then < n / 2,
        "{mode:?}: the target was not slow: {placed_by_then} bytes placed by the failure"
    );
    // What the target had taken before the reset lands within a few copies; then the
    // application reuses the memory.
    std::thread::sleep(4 * delay);
    assert!(dst.write_at(0, &vec![0x5A; n]));
    // Until long after the whole write would have been placed (16 chunks, 150 ms each).
    let all_placed = delay * (n / slot) as u32;
    std::thread::sleep(all_placed.saturating_sub(failed) + Duration::from_millis(500));
    let late = bytes_at(&dst, 0, n).iter().filter(|&&x| x != 0x5A).count();
    assert_eq!(
        late, 0,
        "{mode:?}: {late} bytes of the write that failed after {failed:?} landed later"
    );
    let dropped = b.stats().unwrap().total().inbound_writes_dropped;
    eprintln!("{mode:?}: the target dropped {dropped} WRITE chunks unplaced");
    if mode == morio::SameHost::Off {
        // The target's check, not something else, kept them out.
        assert_eq!(dropped, 1, "{mode:?}");
    }
}
