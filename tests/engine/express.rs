//! Express writes (a small write the submitting thread puts straight into a same-host peer's
//! ring): they land, are recorded at the target and counted; large writes, reads and peers
//! over TCP take the usual path; a peer that goes away ends every one of them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use morio::{IoEngine, RegisteredBuffer, SameHost, StatusCode, TcpBackendConfig};

use crate::common::*;

/// Whether this run's same-host engines may write express: over rings, unless
/// `MORIO_EXPRESS=0` turned them off (an A/B run).
fn express_on() -> bool {
    rings_on() && std::env::var("MORIO_EXPRESS").map_or(true, |v| v.trim() != "0")
}

fn cfg(mode: SameHost) -> TcpBackendConfig {
    cfg_with(|c| c.same_host = Some(mode))
}

/// One write through the usual path opens every lane; wait until all are up (express
/// writes ride lanes that are up).
fn warm(a: &IoEngine, src: &RegisteredBuffer, dst: &RegisteredBuffer, lanes: u64) {
    let st = a.write(src.desc(), 0, dst.desc(), 0, 8, a.allocate_transfer_uid());
    assert_ok(&st, "first write");
    let t0 = Instant::now();
    while a.stats().unwrap().total().lane_connects < lanes {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "lanes did not come up"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Sizes of the small writes (all at most express's 16 KiB).
const SIZES: [usize; 6] = [1, 8, 100, 1000, 4096, 16 << 10];

#[test]
fn small_writes_to_a_ring_peer_go_express_land_and_are_recorded() {
    let c = cfg(SameHost::Require);
    let lanes = c.num_data_conns as u64;
    let (a, b) = pair("xp_land", c);
    let quarter = 64 << 10;
    let src = random_buffer(&a, 4 * quarter, 1);
    let dst = b.alloc_buffer(4 * quarter).unwrap();
    warm(&a, &src, &dst, lanes);
    let before = a.stats().unwrap().total();
    let (a, src, dst) = (Arc::new(a), Arc::new(src), Arc::new(dst));
    let per_thread = 60;
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (a, src, dst) = (a.clone(), src.clone(), dst.clone());
            std::thread::spawn(move || {
                let mut done = Vec::new();
                for i in 0..per_thread {
                    let size = SIZES[i % SIZES.len()];
                    let off = t * quarter + (i * 997) % (quarter - size);
                    let uid = a.allocate_transfer_uid();
                    let st = a.write(src.desc(), off, dst.desc(), off, size, uid);
                    assert_ok(&st, &format!("write {size} B at {off}"));
                    done.push((uid, off, size));
                }
                done
            })
        })
        .collect();
    let done: Vec<(u64, usize, usize)> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    for &(uid, off, size) in &done {
        assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success, "uid {uid}");
        assert_bytes_eq(
            &bytes_at(&dst, off, size),
            &bytes_at(&src, off, size),
            "express write",
        );
    }
    let mid = a.stats().unwrap().total();
    let express = mid.express_writes - before.express_writes;
    if express_on() {
        assert!(express > 0, "no write went express: {mid:?}");
    } else {
        assert_eq!(express, 0, "express writes without rings: {mid:?}");
    }
    assert_eq!(
        mid.transfers_ok - before.transfers_ok,
        done.len() as u64,
        "every write is counted once, express or not"
    );
    // A write larger than express's limit and a read take the usual path.
    let big = a.write(
        src.desc(),
        0,
        dst.desc(),
        0,
        64 << 10,
        a.allocate_transfer_uid(),
    );
    assert_ok(&big, "64 KiB write");
    let back = a.alloc_buffer(64).unwrap();
    let rd = a.read(back.desc(), 0, dst.desc(), 0, 64, a.allocate_transfer_uid());
    assert_ok(&rd, "read");
    assert_bytes_eq(&back.to_vec(), &bytes_at(&src, 0, 64), "read back");
    let after = a.stats().unwrap().total();
    assert_eq!(after.express_writes, mid.express_writes, "{after:?}");
}

#[test]
fn peers_over_tcp_get_no_express_writes() {
    let c = cfg(SameHost::Off);
    let lanes = c.num_data_conns as u64;
    let (a, b) = pair("xp_tcp", c);
    let src = random_buffer(&a, 1 << 16, 2);
    let dst = b.alloc_buffer(1 << 16).unwrap();
    warm(&a, &src, &dst, lanes);
    for (i, &size) in SIZES.iter().cycle().take(60).enumerate() {
        let off = (i * 331) % ((1 << 16) - size);
        let st = a.write(
            src.desc(),
            off,
            dst.desc(),
            off,
            size,
            a.allocate_transfer_uid(),
        );
        assert_ok(&st, "small write over TCP");
    }
    let t = a.stats().unwrap().total();
    assert_eq!(t.express_writes, 0, "{t:?}");
    assert_eq!(t.lane_connects_ring, 0, "{t:?}");
}

#[test]
fn express_writes_end_when_the_peer_goes_away() {
    // A long timeout: every write must end through its lane's death, not its deadline.
    let c = cfg_with(|c| {
        c.same_host = Some(SameHost::Require);
        c.op_timeout = Duration::from_secs(60);
    });
    let lanes = c.num_data_conns as u64;
    let (a, b) = pair("xp_gone", c);
    let src = random_buffer(&a, 1 << 16, 3);
    let dst = b.alloc_buffer(1 << 16).unwrap();
    warm(&a, &src, &dst, lanes);
    let a = Arc::new(a);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let threads: Vec<_> = (0..3)
        .map(|t| {
            let (a, stop) = (a.clone(), stop.clone());
            let (s, d) = (src.desc().clone(), dst.desc().clone());
            std::thread::spawn(move || {
                // At most 32 in flight per thread: the writes still in flight when the peer
                // goes away are what this test is about, not a flood of later ones.
                let mut sts: Vec<Arc<morio::TransferStatus>> = Vec::new();
                let mut i = 0usize;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let size = SIZES[(i + t) % 4];
                    let off = (i * 64) % ((1 << 16) - size);
                    sts.push(a.write(&s, off, &d, off, size, a.allocate_transfer_uid()));
                    if sts.len() >= 32 {
                        let done = sts.remove(0);
                        done.wait_for(Duration::from_secs(20));
                    }
                    i += 1;
                }
                sts
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let express_before = a.stats().unwrap().total().express_writes;
    drop(b);
    std::thread::sleep(Duration::from_millis(100));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sts: Vec<_> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let t0 = Instant::now();
    let mut failed = 0;
    for s in &sts {
        let left = Duration::from_secs(15).saturating_sub(t0.elapsed());
        let code = s.wait_for(left.max(Duration::from_millis(1)));
        assert_ne!(
            code,
            StatusCode::InProgress,
            "a write still in flight 15 s after its peer went away"
        );
        failed += usize::from(code != StatusCode::Success);
    }
    assert!(failed > 0, "no write failed although the peer went away");
    if express_on() {
        assert!(
            express_before > 0,
            "no write went express before the peer went away"
        );
    }
}

/// A write to a peer that was just dropped ends (fails) at once, round after round: the
/// rings' doorbell sockets are never held open behind the connection's back (a duplicate of
/// one kept the dropped peer's connection open, and such a write waited for its deadline).
#[test]
fn writes_to_a_peer_just_dropped_end_at_once() {
    for round in 0..100 {
        let (a, b) = pair(
            &format!("xp_drop{round}"),
            cfg_with(|c| c.num_data_conns = 2),
        );
        let src = random_buffer(&a, 1000, 4);
        let dst = b.alloc_buffer(1000).unwrap();
        let st = a.write(
            src.desc(),
            0,
            dst.desc(),
            0,
            1000,
            a.allocate_transfer_uid(),
        );
        assert_ok(&st, "first write");
        let gone = dst.desc().clone();
        drop(dst);
        drop(b);
        let t0 = Instant::now();
        let st = a.write(src.desc(), 0, &gone, 0, 1000, a.allocate_transfer_uid());
        let code = st.wait_for(Duration::from_secs(10));
        assert_ne!(
            code,
            StatusCode::InProgress,
            "round {round}: a write to a dropped peer still in flight after {:?}",
            t0.elapsed()
        );
        assert_ne!(code, StatusCode::Success, "round {round}");
    }
}
