//! A stale GPU copy-ahead (made for a chunk whose transfer then failed) is waited for while
//! the next chunk is still queued: a transfer failing during that wait is dropped, never sent
//! after its failure was reported (against a raw fake target that logs the WRITEs it reads).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use morio::gpu::fake::FakeGpu;
use morio::proto::frame::{Frame, Reply};
use morio::proto::limits::HEADER_BYTES;
use morio::{MemoryDesc, StatusCode};

use crate::common::*;
use crate::gpu::{buffer, Kind};

const KEY: &str = "ahead_race_target";

/// How long the fake GPU takes for every copy.
const C: Duration = Duration::from_secs(2);

/// One frame's header and body, and its payload length (left unread).
fn read_head(c: &mut TcpStream) -> std::io::Result<(Frame, u64)> {
    let bad = |e: morio::proto::decode::DecodeError| std::io::Error::other(e.to_string());
    let mut h = [0u8; HEADER_BYTES];
    c.read_exact(&mut h)?;
    let header = morio::proto::decode::decode_header(&h).map_err(bad)?;
    let mut body = vec![0u8; header.body_len as usize];
    c.read_exact(&mut body)?;
    let f = morio::proto::decode::decode_body(&header, &body).map_err(bad)?;
    Ok((f, header.payload_len))
}

/// A target with one lane that answers each WRITE with COMPLETE as soon as it has its header,
/// reads the first WRITE's payload only once `resume` says so, and reports the uid of every
/// WRITE whose payload it read.
fn target() -> (u16, mpsc::Sender<()>, mpsc::Receiver<u64>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (resume, resumed) = mpsc::channel();
    let (seen, writes) = mpsc::channel();
    std::thread::spawn(move || {
        let mut c = accept_lane(&l, KEY);
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut first = true;
        while let Ok((f, len)) = read_head(&mut c) {
            let Frame::Write { chunk, .. } = f else {
                continue;
            };
            let (tag, uid) = (chunk.tag, chunk.uid);
            let r = Reply {
                tag,
                uid,
                chunk: 0,
                code: 0,
                msg: String::new(),
            };
            let _ = c.write_all(&encode(&Frame::Complete(r), 0));
            if std::mem::take(&mut first) && resumed.recv().is_err() {
                return;
            }
            let mut payload = vec![0u8; len as usize];
            if c.read_exact(&mut payload).is_err() || seen.send(uid).is_err() {
                return;
            }
        }
    });
    (port, resume, writes)
}

/// Every copy out of GPU memory takes `C` (2 s); the deadline is 1.4 C. Times from W's
/// submission, in C (the margins, 0.3 C, outlast a CI machine's stalls):
///  0     W (4 MiB, one slot) and Z are queued; W's slot is copied (0 .. 1).
///  1     W's frame starts; Z's first slot is copied ahead (1 .. 2). The target answers W
///        at once but reads none of its payload, so W's send blocks on the full socket.
///  0.3   X is queued behind Z.      1.4   Z fails by its deadline (dropped from the queue).
///  then  the target reads W; the writer, done with W, finds the copy ahead stale (Z's) and
///        waits for it (until 2). 1.7   X fails by its deadline, in that wait.
///  then  Y (host memory) is written; the target reads WRITEs until Y's: X's must not be
///        among them (before the fix, X had been popped off the queue before the wait, so
///        its cancellation missed it and the writer sent it after its failure was reported).
#[test]
fn a_write_failing_while_a_stale_copy_ahead_settles_is_not_sent_after_its_failure() {
    let (port, resume, writes) = target();
    let fake = Arc::new(FakeGpu::new(1));
    fake.set_copy_delay(C);
    let (big, five) = (4 << 20, Duration::from_secs(10));
    let a = engine(
        "ahead_race_a",
        cfg_with(|c| {
            c.same_host = Some(morio::SameHost::Off);
            c.gpu_ipc = Some(false);
            c.num_shards = Some(1);
            c.num_data_conns = 1;
            c.gpu_data_conns = Some(1);
            c.op_timeout = C * 14 / 10;
            c.gpu_chunk_bytes = big;
            c.gpu_slot_bytes = big;
            c.gpu_staging_bytes = 4 * big; // two slots a pool: W's, and the copy ahead
            c.striping_threshold_bytes = 1 << 30;
            c.sock_sndbuf_bytes = 256 << 10;
        }),
    );
    a.set_gpu_runtime(fake).unwrap();
    a.register_remote_engine(&desc_at(KEY, port)).unwrap();
    a.connect_remote_engine(KEY, five).unwrap();
    let src = buffer(&a, Kind::Gpu, &vec![0x11; big]);
    let host = a.register_buffer(vec![0x22; 64 << 10]).unwrap();
    let remote = MemoryDesc::cpu(KEY, 1, 0x10000, big as u64);
    let write_from = |from: &morio::RegisteredBuffer, n: usize| {
        let uid = a.allocate_transfer_uid();
        (uid, a.write(from.desc(), 0, &remote, 0, n, uid))
    };
    let failed = |s: &morio::TransferStatus| wait_within(s, five) == StatusCode::ErrBadState;
    let t0 = Instant::now();
    let (uid_w, w) = write_from(&src, big);
    let (_, z) = write_from(&src, 4096);
    std::thread::sleep((C * 3 / 10).saturating_sub(t0.elapsed()));
    let (uid_x, x) = write_from(&src, 4096);
    assert!(failed(&z), "Z: {}", z.message());
    assert!(t0.elapsed() > C, "Z failed too soon");
    resume.send(()).unwrap();
    assert_eq!(writes.recv_timeout(five), Ok(uid_w));
    let w_read = t0.elapsed();
    assert_ok(&w, "W");
    assert!(failed(&x), "X: {}", x.message());
    let x_failed = t0.elapsed();
    // X must fail after the writer is done with W and before the stale copy is (2 C).
    assert!(
        w_read < x_failed && x_failed < 2 * C - Duration::from_millis(50),
        "timing missed: W read by {w_read:?}, X failed at {x_failed:?}"
    );
    // Y, from host memory (no copy), leaves after anything still to go before it.
    let (uid_y, y) = write_from(&host, 64 << 10);
    assert_ok(&y, "Y");
    let mut after = Vec::new();
    while let Ok(uid) = writes.recv_timeout(five) {
        after.push(uid);
        if uid == uid_y {
            break;
        }
    }
    assert!(after.ends_with(&[uid_y]), "Y's WRITE never came: {after:?}");
    assert!(
        !after.contains(&uid_x),
        "X's WRITE reached the target after X failed at {x_failed:?}: {after:?} (X = {uid_x})"
    );
    let ahead = a.stats().unwrap().total().gpu_copies_ahead;
    assert!(ahead >= 1, "no copy was made ahead");
}
