//! A write from GPU memory whose same-host lane dies from outside (here: its peer
//! deregistered) while the lane's writer waits for a staging copy in the middle of a frame
//! puts nothing more into the peer's ring: the dead lane's ring is closed, so the rest of
//! the frame never reaches a target still reading that frame, and nothing of the write lands
//! after what the target had taken before the lane died. (`die_as` closes the lane's port,
//! and `Out::put` refuses a closed ring; with express writes on, as by default, removing the
//! lane's express port closes the ring too, so `MORIO_EXPRESS=0` checks the former alone.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use morio::gpu::fake::FakeGpu;
use morio::gpu::GpuRuntime;
use morio::StatusCode;

use crate::common::*;
use crate::gpu::{buffer, Kind};

/// A staging slot; the write is one chunk of 3 slots, and each side's pool holds 2.
const SLOT: usize = 64 << 10;
/// Each copy out of the initiator's GPU memory (one at a time).
const OUT: Duration = Duration::from_millis(400);
/// Each copy into the target's GPU memory (one at a time): the target falls behind.
const IN: Duration = Duration::from_millis(1200);

#[test]
fn a_write_whose_ring_lane_dies_mid_frame_puts_nothing_more_into_the_ring() {
    let name = "dying_write";
    let cfg = cfg_with(|c| {
        c.num_shards = Some(1);
        c.num_data_conns = 1;
        c.gpu_data_conns = Some(1);
        c.same_host = Some(morio::SameHost::Require);
        c.gpu_ipc = Some(false);
        c.chunk_bytes = 3 * SLOT;
        c.gpu_chunk_bytes = 3 * SLOT;
        c.same_host_chunk_bytes = 3 * SLOT;
        c.gpu_slot_bytes = SLOT;
        c.gpu_staging_bytes = 4 * SLOT;
        c.striping_threshold_bytes = 1 << 30;
    });
    let (a, b) = pair(name, cfg);
    let (fa, fb) = (Arc::new(FakeGpu::new(1)), Arc::new(FakeGpu::new(1)));
    for (e, f) in [(&a, &fa), (&b, &fb)] {
        let rt: Arc<dyn GpuRuntime> = f.clone();
        e.set_gpu_runtime(rt).unwrap();
    }
    let n = 3 * SLOT;
    let src = buffer(&a, Kind::Gpu, &vec![0xAB; n]);
    let dst = buffer(&b, Kind::Gpu, &vec![0u8; n]);
    // The lane comes up first (from host memory: one copy, not delayed, into the target).
    let warm = a.register_buffer(vec![1u8; 8]).unwrap();
    let st = a.write(warm.desc(), 0, dst.desc(), 0, 8, a.allocate_transfer_uid());
    assert_ok(&st, "warm-up write");
    let t = a.stats().unwrap().total();
    assert_eq!(t.lane_connects_ring >= 1, rings_on(), "{t:?}");
    fa.set_copy_delay(OUT);
    fb.set_copy_delay(IN);

    // 1. The initiator copies slots 0 and 1 out (done at 0.4 s, 0.8 s); at 0.4 s it puts the
    //    frame's header and slot 0 into the ring and copies slot 2 out (done at 1.2 s). The
    //    target copies slot 0 in (done at 1.6 s); at 0.8 s it takes slot 1 (done at 2.8 s)
    //    and, its two slots taken, waits for slot 0's copy, the rest of the frame unread.
    let before = fb.copies();
    let st = a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid());
    let t0 = Instant::now();
    while fb.copies() < before + 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "slot 1 never arrived"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // 2. The lane dies from outside its writer, which waits for slot 2's copy (0.4 s on):
    //    the write fails. The lane's ring must be closed now: once the writer resumes, slot
    //    2 would go in, and the target, back at 1.6 s, would place it.
    a.deregister_remote_engine(&b.engine_desc());
    let killed = t0.elapsed();
    assert!(
        killed < 3 * OUT,
        "precondition: the lane died at {killed:?}, slot 2 sent"
    );
    let code = wait_within(&st, Duration::from_secs(10));
    assert!(
        code as u32 > StatusCode::ERR_BEGIN,
        "{code:?} {}",
        st.message()
    );
    // 3. What the target had taken (slots 0 and 1) lands by 2.8 s; then the application
    //    reuses the memory. Slot 2, had it gone in, would land 1.2 s later.
    let landed = |i: usize| bytes_at(&dst, i * SLOT, SLOT).iter().all(|&x| x == 0xAB);
    while !landed(1) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "slot 1 never landed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(dst.write_at(0, &vec![0x5A; n]));
    std::thread::sleep(IN + Duration::from_millis(500));
    let late = dst.to_vec().iter().filter(|&&x| x != 0x5A).count();
    assert_eq!(
        late,
        0,
        "{late} bytes of the write that failed landed afterwards ({} copies into the target)",
        fb.copies()
    );
}
