//! A striped write that fails early on the initiator's side (a chunk's staging copy refused
//! by its GPU, or a lane lost mid-frame) lands nothing at its target after the failure is
//! reported: its chunks already sent on the other, healthy lanes are placed before the
//! failure is reported (each such lane carries a FINISH after them, answered once they are
//! placed), so an application that reuses the memory at once never sees them land over what
//! it wrote there. `late_write.rs` covers a write failed by its deadline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use morio::gpu::fake::{FakeGpu, FaultAt};
use morio::gpu::GpuRuntime;
use morio::StatusCode;

use crate::common::*;
use crate::gpu::{buffer, Kind};

/// The initiator's copy out of GPU memory that fails: the submit of one chunk's only slot
/// (the chunk never leaves), or the completion of a chunk's second slot (its header left:
/// the lane closes).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Early {
    CopyRefused,
    LaneLost,
    /// A refused copy, with a target too slow to answer the fences by the deadline.
    PastDeadline,
    /// A refused copy between engines that speak protocol version 10.
    Version10,
}

#[test]
fn a_write_failed_by_a_refused_staging_copy_lands_nothing_after_its_failure() {
    for mode in [morio::SameHost::Off, morio::SameHost::Require] {
        early_failure_lands_nothing_later(mode, Early::CopyRefused);
    }
}

/// Between engines that speak version 10 (one FINISH, on the join lane, answered at once)
/// the write still fails as it did, its target records the failure once, and the lanes go
/// on; only the wait for the other lanes' chunks is missing (not checked here).
#[test]
fn a_version_10_peer_gets_one_finish() {
    early_failure_lands_nothing_later(morio::SameHost::Off, Early::Version10);
}

#[test]
fn a_write_failed_by_a_lost_lane_lands_nothing_after_its_failure() {
    for mode in [morio::SameHost::Off, morio::SameHost::Require] {
        early_failure_lands_nothing_later(mode, Early::LaneLost);
    }
}

/// Where the target is too slow for its lanes' FINISHes to be answered by the write's
/// deadline, the lanes still waiting are reset then, as for a write failed by its deadline
/// (`late_write.rs`): the failure is reported at the deadline, and what the target still
/// held unread is dropped there.
#[test]
fn a_fence_not_answered_by_the_deadline_resets_its_lanes() {
    for mode in [morio::SameHost::Off, morio::SameHost::Require] {
        early_failure_lands_nothing_later(mode, Early::PastDeadline);
    }
}

/// A 4 MiB write in 256 KiB chunks over two lanes from the initiator's GPU memory to a
/// target that places a chunk every 50 ms (its copies into GPU memory are that slow), so
/// most chunks sent before the failure still wait at the target when it happens. Once the
/// failure is reported the application writes the memory again: nothing of the failed
/// write may land there afterwards, and the next write succeeds.
fn early_failure_lands_nothing_later(mode: morio::SameHost, how: Early) {
    let past = how == Early::PastDeadline;
    // Where the fences must outlast the deadline, the target's copies outlast it by
    // most of a second: a test thread stalled for a few hundred milliseconds on a loaded CI
    // machine would otherwise run the FINISH's answer before the tick that times it out.
    let (delay, deadline) = if past {
        (Duration::from_millis(1200), Duration::from_millis(400))
    } else {
        (Duration::from_millis(50), Duration::from_secs(20))
    };
    let chunk = 256 << 10;
    let slot = match how {
        Early::LaneLost => chunk / 2,
        _ => chunk,
    };
    let (src_gpu, dst_gpu) = (Arc::new(FakeGpu::new(1)), Arc::new(FakeGpu::new(1)));
    dst_gpu.set_copy_delay(delay);
    let (a, b) = pair(
        &format!("early_write_{mode:?}_{how:?}"),
        cfg_with(|c| {
            c.num_shards = Some(1);
            c.num_data_conns = 2;
            c.gpu_data_conns = Some(2);
            c.op_timeout = deadline;
            c.same_host = Some(mode);
            c.chunk_bytes = chunk;
            c.gpu_chunk_bytes = chunk;
            c.same_host_chunk_bytes = chunk;
            c.gpu_slot_bytes = slot;
            c.gpu_staging_bytes = 4 * chunk;
            c.gpu_ipc = Some(false);
            c.striping_threshold_bytes = chunk;
            if how == Early::Version10 {
                c.max_protocol_version = 10;
            }
        }),
    );
    let src_rt: Arc<dyn GpuRuntime> = src_gpu.clone();
    let dst_rt: Arc<dyn GpuRuntime> = dst_gpu.clone();
    a.set_gpu_runtime(src_rt).unwrap();
    b.set_gpu_runtime(dst_rt).unwrap();
    let n = 4 << 20;
    let src = buffer(&a, Kind::Gpu, &vec![0xAB; n]);
    let dst = buffer(&b, Kind::Gpu, &vec![0u8; n]);
    // Both lanes up first, so the write stripes over both from its first chunk.
    a.connect_remote_engine(b.key(), Duration::from_secs(10))
        .unwrap();
    // Some chunks' copies succeed (on both lanes), then one fails. A copy made ahead of its
    // frame that fails is made again in the frame's turn: then the write does not fail
    // early (it succeeds, or times out at a target too slow), and the scenario runs again.
    let early_code = match how {
        Early::LaneLost => StatusCode::ErrBadState,
        _ => StatusCode::ErrGpuOp,
    };
    let mut tries = 0;
    let (st, code, failed, uid) = loop {
        tries += 1;
        assert!(
            tries <= 5,
            "{mode:?} {how:?}: the injected fault never failed the write"
        );
        match how {
            Early::CopyRefused | Early::Version10 => src_gpu.inject_fault(Some(6), FaultAt::Submit),
            Early::PastDeadline => src_gpu.inject_fault(Some(2), FaultAt::Submit),
            Early::LaneLost => src_gpu.inject_fault(Some(13), FaultAt::Complete),
        }
        let t0 = Instant::now();
        let uid = a.allocate_transfer_uid();
        let st = a.write(src.desc(), 0, dst.desc(), 0, n, uid);
        let code = wait_within(&st, Duration::from_secs(30));
        src_gpu.inject_fault(None, FaultAt::Submit);
        let failed = t0.elapsed();
        // A lost lane may be reported as the refused copies that follow the sticky fault.
        if code == early_code || (how == Early::LaneLost && code == StatusCode::ErrGpuOp) {
            break (st, code, failed, uid);
        }
        eprintln!("{mode:?} {how:?}: the fault was absorbed ({code:?}), again");
        // Until every chunk sent is placed (or, past the deadline, the lanes were reset and
        // the chunks being placed then have landed).
        std::thread::sleep(if past { 3 * delay } else { delay * 16 });
    };
    if past {
        assert!(
            failed >= deadline,
            "{mode:?}: failed after {failed:?}, before its fences"
        );
        let m = st.message();
        assert!(
            m.contains("staging copy"),
            "{mode:?}: reported as the copy's failure: {m}"
        );
        // What the target had begun to place before the reset (its copies run one at a
        // time) lands within a few copies' time.
        std::thread::sleep(3 * delay);
    }
    // The application writes the memory again as soon as it hears.
    assert!(dst.write_at(0, &vec![0x5A; n]));
    // Until long after every chunk sent would have been placed (16 chunks), or where the
    // lanes were reset, the target's next reads dropped what it held.
    let settle = if past {
        2 * delay
    } else {
        (delay * 16).saturating_sub(failed)
    };
    std::thread::sleep(settle + Duration::from_millis(500));
    if !past {
        // The target recorded the failure once (the first FINISH it read).
        let recorded = b
            .pop_inbound_transfer_status(a.key(), uid)
            .map(|s| s.code());
        assert!(
            recorded.is_some_and(|c| c.is_error()),
            "{mode:?} {how:?}: {recorded:?}"
        );
        assert!(b.pop_inbound_transfer_status(a.key(), uid).is_none());
    }
    let st_a = a.stats().unwrap().total();
    if how == Early::Version10 {
        assert_eq!(st_a.writes_fenced, 0, "a version 10 peer gets one FINISH");
        return next_write_lands(&a, &dst, &dst_gpu, n, "version 10");
    }
    assert!(st_a.writes_fenced >= 1, "{mode:?} {how:?}: {st_a:?}");
    if past {
        assert!(st_a.fences_timed_out >= 1, "{mode:?}: {st_a:?}");
    }
    // A lane lost mid-frame left its target a chunk it had begun to place: its FINISHes on
    // the other lane were answered only once that chunk's copies landed (`finish_wait.rs`
    // drives that order by hand). Nothing of the write lands after its failure is reported
    // (the chunks on the healthy lane were 0.5–1.3 MB late on the code before the fences).
    let late = bytes_at(&dst, 0, n).iter().filter(|&&x| x != 0x5A).count();
    eprintln!(
        "{mode:?} {how:?}: late {late}, target {:?}",
        b.stats().unwrap().total().finishes_held
    );
    assert!(
        late == 0,
        "{mode:?} {how:?}: {late} bytes of the write that failed after {failed:?} ({code:?}: {}) \
         landed later",
        st.message()
    );
    eprintln!(
        "{mode:?} {how:?}: failed after {failed:?} ({code:?}: {})",
        st.message()
    );
    next_write_lands(&a, &dst, &dst_gpu, n, &format!("{mode:?} {how:?}"));
}

/// The lanes go on (or are dialed again): the next write lands whole (from host memory: the
/// fake's error at a copy's completion is sticky, as a CUDA device error is).
fn next_write_lands(
    a: &morio::IoEngine,
    dst: &morio::RegisteredBuffer,
    dst_gpu: &FakeGpu,
    n: usize,
    what: &str,
) {
    dst_gpu.set_copy_delay(Duration::ZERO);
    let host = a.register_buffer(vec![0xAB; n]).unwrap();
    let st = a.write(host.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid());
    assert_eq!(
        wait_within(&st, Duration::from_secs(30)),
        StatusCode::Success,
        "{what}: {}",
        st.message()
    );
    assert!(bytes_at(dst, 0, n).iter().all(|&x| x == 0xAB), "{what}");
}
