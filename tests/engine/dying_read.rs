//! A read whose lane dies from outside (here: its peer deregistered) while the lane's reader
//! still copies the read's data into GPU memory lands nothing after its failure is reported:
//! the dead lane is kept where the read's cancel finds it (`shard.dying_lanes`), so the
//! failure waits for those copies (they take 0.4 s, within the owner's 1 s grace for its
//! lanes' shards to confirm).

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

const SLOT: usize = 64 << 10;
/// Chunk 0 is 2 slots: 2 copies of `COPY` each, one at a time.
const CHUNK: usize = 2 * SLOT;
const COPY: Duration = Duration::from_millis(200);

/// A target that accepts one lane, reads the read's two READs and answers only chunk 0's
/// (all of its bytes, 0xC3); chunk 1 stays unanswered. Holds the lane until it is closed.
fn half_answering_target(key: &str) -> (u16, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let key = key.to_string();
    let t = std::thread::spawn(move || {
        let mut c = accept_lane(&l, &key);
        let Frame::Read { chunk, final_, .. } = read_frame(&mut c, Duration::from_secs(10)) else {
            panic!("expected READ");
        };
        assert_eq!(chunk.chunk, 0);
        let bytes = chunk.segs.iter().map(|s| s.len).sum::<u64>();
        assert_eq!(bytes, CHUNK as u64);
        let second = read_frame(&mut c, Duration::from_secs(10));
        assert!(matches!(second, Frame::Read { .. }), "{second:?}");
        let reply = Reply {
            tag: chunk.tag,
            uid: chunk.uid,
            chunk: 0,
            code: 0,
            msg: String::new(),
        };
        let mut out = encode(&Frame::ReadData { reply, final_ }, bytes);
        out.resize(out.len() + CHUNK, 0xC3);
        c.write_all(&out).unwrap();
        // Until the initiator closes the lane.
        let _ = try_read_frame(&mut c, Duration::from_secs(10));
    });
    (port, t)
}

#[test]
fn a_read_whose_lane_dies_while_copying_into_gpu_memory_lands_nothing_after_its_failure() {
    let name = "dying_read";
    let (port, target) = half_answering_target(name);
    let a = engine(
        &format!("{name}_a"),
        cfg_with(|c| {
            c.num_shards = Some(1);
            c.num_data_conns = 1;
            c.same_host = Some(morio::SameHost::Off);
            c.gpu_ipc = Some(false);
            c.chunk_bytes = CHUNK;
            c.gpu_chunk_bytes = CHUNK;
            c.gpu_slot_bytes = SLOT;
            c.striping_threshold_bytes = 1 << 30;
        }),
    );
    let fake = Arc::new(FakeGpu::new(1));
    fake.set_copy_delay(COPY);
    let rt: Arc<dyn GpuRuntime> = fake.clone();
    a.set_gpu_runtime(rt).unwrap();
    let desc = desc_at(name, port);
    a.register_remote_engine(&desc).unwrap();
    let n = 2 * CHUNK;
    let dst = buffer(&a, Kind::Gpu, &vec![0u8; n]);
    let far = MemoryDesc::cpu(name, 1, 0x10000, n as u64);
    let st = a.read(dst.desc(), 0, &far, 0, n, a.allocate_transfer_uid());

    // 1. Chunk 0's bytes are in slots and both its copies are queued (the first lands 0.2 s
    //    on, the second 0.4 s on): the lane's reader waits for them.
    let t = Instant::now();
    while fake.copies() < 2 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "chunk 0 never arrived"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let landed = |at: usize| {
        let mut b = [0u8];
        dst.read_at(at, &mut b);
        b[0] == 0xC3
    };
    assert!(!landed(CHUNK - 1), "precondition: chunk 0 still landing");
    // 2. The lane dies from outside its reader (retired) with chunk 1 still on it: the read
    //    fails. Its cancel must find the dead lane, still placing chunk 0, and wait for its
    //    copies (0.4 s, 0.6 s short of the owner's grace); without that, it fails at once.
    let killed = Instant::now();
    a.deregister_remote_engine(&desc);
    let code = wait_within(&st, Duration::from_secs(10));
    assert!(
        code as u32 > StatusCode::ERR_BEGIN && st.message().contains("deregistered"),
        "{code:?} {}",
        st.message()
    );
    // 3. The application reuses its buffer at once; nothing of the read may land on it (had
    //    the failure not waited, chunk 0's last copy would land up to 0.4 s after the kill).
    let failed_after = killed.elapsed();
    assert!(dst.write_at(0, &vec![0x5A; n]));
    std::thread::sleep(3 * COPY);
    target.join().unwrap();
    let bad = dst.to_vec().iter().filter(|&&b| b != 0x5A).count();
    assert_eq!(
        bad, 0,
        "{bad} bytes of the failed read landed after its failure ({failed_after:?} after the \
         lane died)"
    );
}
