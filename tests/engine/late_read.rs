//! A read that fails while its data is on the way lands nothing in the application's memory
//! after its failure is reported: a fake target sends half of a READ_DATA, stalls past the
//! read's deadline, then sends the rest (`tests/netns/stale.rs` shows the same over a slow
//! link).

use std::io::Write;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use morio::gpu::fake::FakeGpu;
use morio::gpu::GpuRuntime;
use morio::proto::frame::{Frame, Reply};
use morio::{MemoryDesc, StatusCode};

use crate::common::*;
use crate::gpu::{buffer, Kind};

/// A target that accepts one lane and answers its first READ `(wait, stall)`: `wait` later
/// with `first` bytes of its data, then the rest `stall` after that; returns once the rest
/// is sent, keeping the connection open a while after.
fn trickling_target(
    key: &str,
    first: usize,
    (wait, stall): (Duration, Duration),
) -> (u16, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let key = key.to_string();
    let t = std::thread::spawn(move || {
        let mut c = accept_lane(&l, &key);
        let (chunk, final_) = match try_read_frame(&mut c, Duration::from_secs(10)) {
            Ok(Frame::Read { chunk, final_, .. }) => (chunk, final_),
            other => panic!("expected READ, got {other:?}"),
        };
        let bytes = chunk.segs.iter().map(|s| s.len).sum::<u64>() as usize;
        let reply = Reply {
            tag: chunk.tag,
            uid: chunk.uid,
            chunk: chunk.chunk,
            code: 0,
            msg: String::new(),
        };
        std::thread::sleep(wait);
        let mut out = encode(&Frame::ReadData { reply, final_ }, bytes as u64);
        out.resize(out.len() + first, 0xC3);
        c.write_all(&out).unwrap();
        std::thread::sleep(stall);
        let _ = c.write_all(&vec![0xC3; bytes - first]);
        std::thread::sleep(Duration::from_millis(500));
    });
    (port, t)
}

/// Read `n` bytes from the fake into a buffer of `kind`: the read fails by its 1 s deadline
/// with `first` bytes in; the buffer is refilled at once, and nothing of the rest may land.
fn late_read(name: &str, kind: Kind, n: usize, first: usize, gpu: Option<&Arc<FakeGpu>>) {
    // The answer begins 0.6 s in and ends 0.7 s later: after the read's 1 s deadline, before
    // the frame's own (1 s from its first wait), so the lane does not drop it as stalled.
    let deadline = Duration::from_secs(1);
    let timing = (Duration::from_millis(600), Duration::from_millis(700));
    let (port, target) = trickling_target(name, first, timing);
    let a = engine(
        &format!("{name}_a"),
        cfg_with(|c| {
            c.num_data_conns = 1;
            c.op_timeout = deadline;
            c.same_host = Some(morio::SameHost::Off);
            c.chunk_bytes = 16 << 20;
            c.gpu_chunk_bytes = 16 << 20;
            c.gpu_slot_bytes = 256 << 10;
            c.striping_threshold_bytes = 1 << 30;
        }),
    );
    if let Some(g) = gpu {
        let rt: Arc<dyn GpuRuntime> = g.clone();
        a.set_gpu_runtime(rt).unwrap();
    }
    a.register_remote_engine(&desc_at(name, port)).unwrap();
    let back = buffer(&a, kind, &vec![0u8; n]);
    let far = MemoryDesc::cpu(name, 1, 0x10000, n as u64);
    let t0 = Instant::now();
    let st = a.read(back.desc(), 0, &far, 0, n, a.allocate_transfer_uid());
    let code = wait_within(&st, Duration::from_secs(10));
    assert!(
        code as u32 > StatusCode::ERR_BEGIN,
        "{code:?} {}",
        st.message()
    );
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "failed after {:?}",
        t0.elapsed()
    );
    // The application reuses its buffer at once.
    let mine = vec![0x5A; n];
    assert!(back.write_at(0, &mine));
    target.join().unwrap();
    let got = back.to_vec();
    let bad = got.iter().filter(|&&b| b != 0x5A).count();
    assert_eq!(
        bad, 0,
        "{bad} bytes of the reused buffer were overwritten by the failed read"
    );
}

#[test]
fn a_read_failed_mid_chunk_lands_nothing_after_its_failure_in_host_memory() {
    late_read("late_read_host", Kind::Cpu, 4 << 20, 1 << 20, None);
}

/// The same into GPU memory through staging slots, whose copies into device memory are slow
/// (the fake's copy delay): the failure is reported only once the copies already queued
/// are done, so none lands over what the application writes next.
#[test]
fn a_read_failed_mid_chunk_lands_nothing_after_its_failure_in_gpu_memory() {
    let fake = Arc::new(FakeGpu::new(1));
    fake.set_copy_delay(Duration::from_millis(300));
    late_read("late_read_gpu", Kind::Gpu, 4 << 20, 1 << 20, Some(&fake));
}
