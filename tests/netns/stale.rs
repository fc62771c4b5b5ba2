//! No stale bytes: a write or read that failed on a cut or slow link (by its deadline, with
//! its bytes still on the way or whole frames still queued) never lands later over what a
//! newer, successful transfer put there.

use std::time::{Duration, Instant};

use morio::StatusCode;

use crate::common::*;
use crate::net::Net;

/// No stale bytes after a cut: a write that failed on the cut link must not land later over
/// what newer, successful writes to the same place put there once the link was back. The old
/// write rides one lane (no striping) and the new ones the others (each transfer takes the
/// next lane), which were idle during the cut and so deliver at once, while the old lane's
/// retransmissions wait on timers that backed off during the cut.
#[test]
fn a_transfer_that_failed_on_a_cut_link_never_lands_over_a_later_one() {
    let Some(net) = Net::new() else { return };
    let deadline = Duration::from_secs(2);
    let mut c = cfg(deadline);
    c.striping_threshold_bytes = 1 << 30;
    let (a, b) = net.pair("nsstale", false, c);
    let n = 4 << 20;
    let old = filled(&a, n, 7);
    let new = filled(&a, n, 8);
    assert!(old.to_vec() != new.to_vec());
    let dst = b.alloc_buffer(n).unwrap();
    for _ in 0..4 {
        let uid = a.allocate_transfer_uid();
        ok(&a.write(new.desc(), 0, dst.desc(), 0, 8, uid), "lanes up");
    }
    net.cut(true);
    let st = a.write(old.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid());
    let code = wait(&st, "the old write");
    assert!(code as u32 > StatusCode::ERR_BEGIN, "{code:?}");
    net.cut(false);
    let t0 = Instant::now();
    let mut landed = 0;
    while landed < 3 {
        let st = a.write(new.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid());
        let code = wait(&st, "a new write");
        eprintln!(
            "new write after {:?}: {code:?} {}",
            t0.elapsed(),
            st.message()
        );
        if code == StatusCode::Success {
            landed += 1;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{}", st.message());
    }
    // Long enough for the old connection's retransmissions (its timer backed off during the
    // cut) to have come through, had it been kept.
    std::thread::sleep(Duration::from_secs(5));
    let (got, want) = (dst.to_vec(), new.to_vec());
    if got != want {
        let bad = got.iter().zip(&want).filter(|(g, w)| g != w).count();
        let first = got.iter().zip(&want).position(|(g, w)| g != w).unwrap();
        panic!("{bad} bytes of the successful writes were overwritten later (first at {first})");
    }
}

/// A slow link (`rate` on `a`'s side), a deadline (`deadline`), and a write of `n` bytes that
/// fails by it while its bytes still flow; then its tail (`tail` bytes) written anew until
/// `landings` new writes succeeded: after a wait for anything of the old write still on its
/// way, the tail must hold the new bytes.
struct LateWrite {
    ns: &'static str,
    rate: &'static str,
    deadline: Duration,
    chunk_bytes: Option<usize>,
    n: usize,
    tail: usize,
    landings: usize,
    seeds: (u64, u64),
}

fn late_write_never_lands_over_a_later_one(t: LateWrite) {
    let Some(net) = Net::new() else { return };
    net.rate(0, t.rate);
    let mut c = cfg(t.deadline);
    c.striping_threshold_bytes = 1 << 30;
    if let Some(b) = t.chunk_bytes {
        c.chunk_bytes = b;
    }
    let (a, b) = net.pair(t.ns, false, c);
    let n = t.n;
    let old = filled(&a, n, t.seeds.0);
    let new = filled(&a, n, t.seeds.1);
    let dst = b.alloc_buffer(n).unwrap();
    for _ in 0..4 {
        let uid = a.allocate_transfer_uid();
        ok(&a.write(new.desc(), 0, dst.desc(), 0, 8, uid), "lanes up");
    }
    let st = a.write(old.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid());
    let code = wait(&st, "the old write");
    assert!(code as u32 > StatusCode::ERR_BEGIN, "{code:?}");
    // The tail the old write had not reached, written anew on other lanes.
    let (off, len) = (n - t.tail, t.tail);
    let t0 = Instant::now();
    let mut landed = 0;
    while landed < t.landings {
        let uid = a.allocate_transfer_uid();
        let st = a.write(new.desc(), off, dst.desc(), off, len, uid);
        let code = wait(&st, "a new write");
        eprintln!(
            "new write after {:?}: {code:?} {}",
            t0.elapsed(),
            st.message()
        );
        landed += usize::from(code == StatusCode::Success);
        assert!(t0.elapsed() < Duration::from_secs(30), "{}", st.message());
    }
    std::thread::sleep(Duration::from_secs(5));
    let (got, want) = (dst.to_vec(), new.to_vec());
    let o = old.to_vec();
    let old_landed = got[..off]
        .iter()
        .zip(&o[..off])
        .filter(|(g, w)| g == w)
        .count();
    let stats = a.stats().unwrap().total();
    eprintln!(
        "old bytes at the target: {old_landed} of {off}; lane failures {}",
        stats.lane_failures
    );
    let (got, want) = (&got[off..off + len], &want[off..off + len]);
    if got != want {
        let bad = got.iter().zip(want).filter(|(g, w)| g != w).count();
        panic!("{bad} bytes of the successful writes were overwritten later by the failed one");
    }
}

/// No stale bytes after a deadline on a slow link: a write that failed by its deadline while
/// its bytes were still flowing (the link narrowed, acknowledgements still coming) must not
/// land later over what a newer, successful write to the same place put there.
#[test]
fn a_late_transfer_never_lands_over_a_later_one() {
    // 64 MiB at 200 Mbit/s needs 2.7 s: it fails after 1 s with most of it still to come.
    late_write_never_lands_over_a_later_one(LateWrite {
        ns: "nslate",
        rate: "200mbit",
        deadline: Duration::from_secs(1),
        chunk_bytes: None,
        n: 64 << 20,
        tail: 1 << 20,
        landings: 3,
        seeds: (9, 10),
    });
}

/// A deadline that passes while whole frames of the transfer still wait in the socket's
/// send buffer (none half sent, so nothing closes the lane for framing's sake) on a slow link.
#[test]
fn whole_frames_of_a_late_transfer_never_land_over_a_later_one() {
    // 6 MiB at 5 MB/s: it fails after 0.5 s, its frames queued whole in the socket.
    late_write_never_lands_over_a_later_one(LateWrite {
        ns: "nswhole",
        rate: "40mbit",
        deadline: Duration::from_millis(500),
        chunk_bytes: Some(64 << 10),
        n: 6 << 20,
        tail: 64 << 10,
        landings: 1,
        seeds: (11, 12),
    });
}

/// A read that failed by its deadline on a slow link never writes into the application's
/// buffer later: its data still on the way is dropped when it comes (the lane no longer waits
/// for it), so the buffer keeps what the application put there after the failure.
#[test]
fn a_late_read_never_lands_in_a_reused_buffer() {
    let Some(net) = Net::new() else { return };
    net.rate(1, "200mbit"); // what b sends: the read's data
    let mut c = cfg(Duration::from_secs(1));
    c.striping_threshold_bytes = 1 << 30;
    let (a, b) = net.pair("nsread", false, c);
    let n = 64 << 20;
    let far = filled(&b, n, 13);
    let back = a.alloc_buffer(n).unwrap();
    ok(
        &a.read(back.desc(), 0, far.desc(), 0, 8, a.allocate_transfer_uid()),
        "lanes up",
    );
    // 64 MiB at 200 Mbit/s needs 2.7 s.
    let st = a.read(back.desc(), 0, far.desc(), 0, n, a.allocate_transfer_uid());
    let code = wait(&st, "the slow read");
    assert!(code as u32 > StatusCode::ERR_BEGIN, "{code:?}");
    // The application reuses its buffer at once.
    let mine = vec![0x5Au8; n];
    back.write_at(0, &mine);
    let before = b.stats().unwrap().total().inbound_bytes_read;
    std::thread::sleep(Duration::from_secs(4));
    eprintln!(
        "read data the target sent after the failure: {} bytes",
        b.stats().unwrap().total().inbound_bytes_read - before
    );
    let got = back.to_vec();
    if got != mine {
        let bad = got.iter().filter(|&&g| g != 0x5A).count();
        panic!("{bad} bytes of the reused buffer were overwritten by the failed read");
    }
    // The engines still work.
    let t0 = Instant::now();
    loop {
        let st = a.read(
            back.desc(),
            0,
            far.desc(),
            0,
            4096,
            a.allocate_transfer_uid(),
        );
        if wait(&st, "a read afterwards") == StatusCode::Success {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{}", st.message());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(back.to_vec()[..4096] == far.to_vec()[..4096]);
}
