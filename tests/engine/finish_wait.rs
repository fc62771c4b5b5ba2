//! A target answers a FINISH only once no chunk of its transfer is being placed on another
//! connection: a lane lost mid-chunk leaves its target a chunk it has begun to place (its
//! first slot's copy into GPU memory still running), and the initiator reports the write
//! failed once its FINISHes on the other lanes are answered, so that chunk must land before
//! them. A raw initiator drives the two lanes by hand, so the order is exact.

use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use morio::gpu::fake::FakeGpu;
use morio::gpu::GpuRuntime;
use morio::proto::codes;
use morio::proto::frame::{Finish, Frame, Hello, Op};
use morio::proto::limits::VERSION;

use crate::common::*;
use crate::failures::raw::{part_frame, target_of};
use crate::gpu::{buffer, Kind};

/// Lane `lane` of 2 from the raw initiator `src` to `b`, handshaken.
fn lane(b: &morio::IoEngine, src: &str, lane: u16) -> TcpStream {
    let mut s = raw_connect(b.engine_desc().port);
    let hello = Frame::Hello(Hello {
        version: VERSION,
        lane,
        n_lanes: 2,
        src_key: src.into(),
        dst_key: b.key().into(),
        instance: 1,
        nonce: [0; 16],
        host_tag: None,
    });
    s.write_all(&encode(&hello, 0)).unwrap();
    match read_frame(&mut s, Duration::from_secs(5)) {
        Frame::HelloAck(ack) => assert_eq!(ack.code, codes::SUCCESS, "{ack:?}"),
        f => panic!("expected HELLO_ACK, got {f:?}"),
    }
    s
}

#[test]
fn a_finish_is_answered_after_a_chunk_another_lane_had_begun_to_place() {
    let slot = 64usize << 10;
    let copy = Duration::from_millis(400);
    let b = engine(
        "finish_wait_target",
        cfg_with(|c| {
            c.num_shards = Some(1);
            c.gpu_slot_bytes = slot;
            c.gpu_staging_bytes = 4 * slot;
            c.gpu_ipc = Some(false);
        }),
    );
    let gpu = Arc::new(FakeGpu::new(1));
    let rt: Arc<dyn GpuRuntime> = gpu.clone();
    b.set_gpu_runtime(rt).unwrap();
    let n = 4 * slot;
    let dst = buffer(&b, Kind::Gpu, &vec![0u8; n]);
    gpu.set_copy_delay(copy);
    let src = "finish_wait_initiator";
    let (mut a0, mut a1) = (lane(&b, src, 0), lane(&b, src, 1));
    // Chunk 1 of 2 (two slots; chunk 0 would go on lane 1, the join lane) on lane 0: its
    // header and first slot only, whose copy into GPU memory then runs for 400 ms.
    let uid = 7;
    let frame = part_frame(
        uid,
        (1, 2, 1),
        target_of(dst.desc()),
        (0, n as u64),
        &[(0, 2 * slot as u64)],
    );
    let head = frame.len() - 2 * slot;
    a0.write_all(&frame[..head + slot]).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    // Lane 0 is lost mid-chunk (reset), and the initiator fences the write on lane 1.
    socket2::SockRef::from(&a0)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(a0);
    let t0 = Instant::now();
    let finish = Frame::Finish(Finish {
        tag: 99,
        uid,
        op: Op::Write,
        n_chunks: 2,
        total_bytes: n as u64,
        code: codes::ERR_BAD_STATE,
        msg: "lane 0 lost".into(),
    });
    a1.write_all(&encode(&finish, 0)).unwrap();
    let answered = match read_frame(&mut a1, Duration::from_secs(10)) {
        Frame::Complete(r) => {
            assert_eq!((r.tag, r.uid), (99, uid), "{r:?}");
            t0.elapsed()
        }
        f => panic!("expected COMPLETE, got {f:?}"),
    };
    // By the answer the slot read before the loss has landed: the initiator may report
    // the failure now, and its application reuse the memory.
    let placed = bytes_at(&dst, 0, slot);
    assert!(
        placed == frame[head..head + slot],
        "answered after {answered:?}, before the first slot landed"
    );
    assert!(dst.write_at(0, &vec![0x5A; n]));
    std::thread::sleep(copy + Duration::from_millis(300));
    assert!(
        bytes_at(&dst, 0, n).iter().all(|&x| x == 0x5A),
        "a byte of the lost chunk landed after the answer ({answered:?})"
    );
    let st = b.stats().unwrap().total();
    assert_eq!(st.finishes_held, 1, "{st:?}");
    // The connection goes on: a whole transfer on it is placed and answered.
    gpu.set_copy_delay(Duration::ZERO);
    let whole = part_frame(
        8,
        (0, 1, 0),
        target_of(dst.desc()),
        (0, n as u64),
        &[(0, n as u64)],
    );
    a1.write_all(&whole).unwrap();
    match read_frame(&mut a1, Duration::from_secs(10)) {
        Frame::Complete(r) => assert_eq!((r.uid, r.code), (8, codes::SUCCESS), "{r:?}"),
        f => panic!("expected COMPLETE, got {f:?}"),
    }
    let head = whole.len() - n;
    assert!(bytes_at(&dst, 0, n) == whole[head..]);
}
