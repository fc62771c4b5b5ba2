//! A write that fails by its deadline leaves nothing behind to land later: the lanes that
//! still held its bytes are reset before the failure is reported, their send queues dropped
//! unsent (over loopback, against a target that stops reading; `tests/netns/stale.rs` shows the
//! same over a real link, where a later write to the same place would be overwritten).

use std::io::Read;
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use morio::{MemoryDesc, StatusCode};

use crate::common::*;

/// What the stalled target saw once it read again: the bytes waiting in its receive queue
/// when the write failed, what it then read in all, and how its connection ended (reset,
/// or still open after a second of silence).
struct Seen {
    queued: usize,
    read: usize,
    reset: bool,
    open: bool,
}

/// A target that accepts one lane, answers its HELLO, reads nothing until `resume`, then
/// reads to the end of the connection.
fn stalled_target(key: &str) -> (u16, mpsc::Sender<()>, std::thread::JoinHandle<Seen>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    let key = key.to_string();
    let t = std::thread::spawn(move || {
        let mut c = accept_lane(&l, &key);
        rx.recv().unwrap();
        let mut queued: libc::c_int = 0;
        // SAFETY: FIONREAD into an int we own, on a socket we own.
        let r = unsafe { libc::ioctl(c.as_raw_fd(), libc::FIONREAD, &mut queued) };
        assert_eq!(r, 0);
        c.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let (mut read, mut buf) = (0usize, vec![0u8; 1 << 20]);
        let (reset, open) = loop {
            match c.read(&mut buf) {
                Ok(0) => break (false, false),
                Ok(n) => read += n,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break (true, false),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break (false, true),
                Err(e) => panic!("reading the lane: {e}"),
            }
        };
        Seen {
            queued: queued as usize,
            read,
            reset,
            open,
        }
    });
    (port, tx, t)
}

/// The target stops reading; a 32 MiB write on its one lane fills both sockets' buffers and
/// fails by its deadline. From then on, nothing more of it reaches the target: it reads
/// exactly what its receive queue held at the failure (no byte of the initiator's send queue
/// follows), then the reset.
#[test]
fn a_write_failed_by_its_deadline_leaves_nothing_queued_to_land_later() {
    let key = "fence_target";
    let (port, resume, target) = stalled_target(key);
    let deadline = Duration::from_secs(1);
    let a = engine(
        "fence_a",
        cfg_with(|c| {
            c.num_data_conns = 1;
            c.op_timeout = deadline;
        }),
    );
    a.register_remote_engine(&desc_at(key, port)).unwrap();
    let n = 32 << 20;
    let src = a.register_buffer(random_big(n, 9)).unwrap();
    let remote = MemoryDesc::cpu(key, 1, 0x10000, n as u64);
    let t0 = Instant::now();
    let st = a.write(src.desc(), 0, &remote, 0, n, a.allocate_transfer_uid());
    let code = wait_within(&st, Duration::from_secs(10));
    let took = t0.elapsed();
    assert_eq!(code, StatusCode::ErrBadState, "{}", st.message());
    assert!(
        took < deadline + Duration::from_secs(1),
        "failed after {took:?}"
    );
    resume.send(()).unwrap();
    let seen = target.join().unwrap();
    assert!(
        seen.reset,
        "the lane ended without a reset: its send queue was sent"
    );
    assert_eq!(
        seen.read, seen.queued,
        "bytes arrived after the failure was reported ({} read, {} were queued at the target)",
        seen.read, seen.queued
    );
    assert!(seen.read < n, "all {n} bytes reached the target");
    let t = a.stats().unwrap().total();
    assert_eq!(t.lane_failures, 1, "{t:?}");
}

/// An express write (the submitting thread put its frame on the lane itself) that its peer
/// already holds, unread, when its deadline passes: it fails, and its lane is reset all the
/// same: the frame waits in the peer's receive queue, and a target that reads it later checks
/// for the reset and drops it (`late_write.rs`) instead of placing a write reported failed.
#[test]
fn an_express_write_the_peer_holds_fails_by_its_deadline_with_a_reset() {
    let key = "fence_express_target";
    let (port, resume, target) = stalled_target(key);
    let deadline = Duration::from_millis(500);
    let a = engine(
        "fence_express_a",
        cfg_with(|c| {
            c.num_data_conns = 1;
            c.op_timeout = deadline;
        }),
    );
    a.register_remote_engine(&desc_at(key, port)).unwrap();
    // The lane is up, so the write can go express.
    a.connect_remote_engine(key, Duration::from_secs(5))
        .unwrap();
    let src = a.register_buffer(vec![7u8; 8]).unwrap();
    let remote = MemoryDesc::cpu(key, 1, 0x10000, 4096);
    let st = a.write(src.desc(), 0, &remote, 0, 8, a.allocate_transfer_uid());
    let code = wait_within(&st, Duration::from_secs(10));
    assert_eq!(code, StatusCode::ErrBadState, "{}", st.message());
    assert_eq!(st.message(), "operation timeout");
    let t = a.stats().unwrap().total();
    assert_eq!(t.lane_failures, 1, "{t:?}");
    resume.send(()).unwrap();
    let seen = target.join().unwrap();
    assert!(seen.reset && !seen.open, "the lane was not reset");
    assert_eq!(seen.read, seen.queued);
    assert!(
        seen.read > 8,
        "the frame was not at the peer: {} bytes",
        seen.read
    );
}
