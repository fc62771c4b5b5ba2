//! Express writes (a small write the submitting thread sends itself, into a same-host peer's
//! ring or on a lane's TCP socket): they land, are recorded at the target and counted; large
//! writes and reads take the usual path; a peer that goes away ends every one of them. Each
//! case runs over rings and over TCP.

use std::sync::Arc;
use std::time::{Duration, Instant};

use morio::{IoEngine, RegisteredBuffer, SameHost, StatusCode, TcpBackendConfig};

use crate::common::*;

/// The two kinds of express port a case runs over.
const MODES: [SameHost; 2] = [SameHost::Require, SameHost::Off];

/// Whether this run's engines in `mode` may write express: not with `MORIO_EXPRESS=0`
/// (an A/B run), over TCP not with `MORIO_EXPRESS=ring`, same-host only over rings.
fn express_on(mode: SameHost) -> bool {
    match std::env::var("MORIO_EXPRESS").as_deref().map(str::trim) {
        Ok("0") => false,
        Ok("ring") => mode != SameHost::Off && rings_on(),
        _ => mode == SameHost::Off || rings_on(),
    }
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
fn small_writes_go_express_land_and_are_recorded() {
    for mode in MODES {
        small_writes_land_and_are_recorded(mode);
    }
}

fn small_writes_land_and_are_recorded(mode: SameHost) {
    let c = cfg(mode);
    let lanes = c.num_data_conns as u64;
    let (a, b) = pair(&format!("xp_land_{mode:?}"), c);
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
    if express_on(mode) {
        assert!(express > 0, "{mode:?}: no write went express: {mid:?}");
    } else {
        assert_eq!(express, 0, "{mode:?}: express writes while off: {mid:?}");
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

/// Small reads go express too (their data placed by the lane's reader), land exactly, and a
/// read of memory its owner deregistered fails with the target's code, never hangs.
#[test]
fn small_reads_go_express_land_and_fail_cleanly() {
    for mode in MODES {
        small_reads_land_and_fail(mode);
    }
}

fn small_reads_land_and_fail(mode: SameHost) {
    let c = cfg(mode);
    let lanes = c.num_data_conns as u64;
    let (a, b) = pair(&format!("xp_read_{mode:?}"), c);
    let src = random_buffer(&b, 1 << 16, 6);
    let back = a.alloc_buffer(1 << 16).unwrap();
    warm(&a, &back, &src, lanes);
    let before = a.stats().unwrap().total();
    let mut n = 0;
    for (i, &size) in SIZES.iter().cycle().take(60).enumerate() {
        let off = (i * 331) % ((1 << 16) - size);
        let st = a.read(
            back.desc(),
            off,
            src.desc(),
            off,
            size,
            a.allocate_transfer_uid(),
        );
        assert_ok(&st, &format!("read of {size} B at {off}"));
        assert_bytes_eq(
            &bytes_at(&back, off, size),
            &bytes_at(&src, off, size),
            "express read",
        );
        n += 1;
    }
    let t = a.stats().unwrap().total();
    let reads = t.express_reads - before.express_reads;
    if express_on(mode) && std::env::var("MORIO_EXPRESS_READS").as_deref() != Ok("0") {
        assert!(reads > 0, "{mode:?}: no read went express: {t:?}");
    } else {
        assert_eq!(reads, 0, "{mode:?}: express reads while off: {t:?}");
    }
    assert_eq!(t.transfers_ok - before.transfers_ok, n, "{t:?}");
    assert_eq!(t.express_writes, before.express_writes, "{t:?}");
    // The target's memory goes away: a small read of it fails with the target's code.
    let gone = src.desc().clone();
    b.deregister_memory(&gone).expect("deregister");
    let st = a.read(back.desc(), 0, &gone, 0, 64, a.allocate_transfer_uid());
    let code = st.wait_for(Duration::from_secs(20));
    assert_ne!(
        code,
        StatusCode::InProgress,
        "{mode:?}: a read still in flight"
    );
    assert_ne!(
        code,
        StatusCode::Success,
        "{mode:?}: read deregistered memory"
    );
    drop(b);
}

/// Over TCP only a write with no other express write in flight to its peer goes express
/// (each is a `send` on the caller's thread): a burst submitted at once mostly takes the
/// usual path, and lands whole either way.
#[test]
fn a_burst_over_tcp_goes_mostly_the_usual_way() {
    let c = cfg(SameHost::Off);
    let lanes = c.num_data_conns as u64;
    let (a, b) = pair("xp_burst", c);
    let src = random_buffer(&a, 1 << 16, 2);
    let dst = b.alloc_buffer(1 << 16).unwrap();
    warm(&a, &src, &dst, lanes);
    let before = a.stats().unwrap().total();
    let n = 200;
    let sts: Vec<_> = (0..n)
        .map(|i| {
            let off = i * 256;
            a.write(
                src.desc(),
                off,
                dst.desc(),
                off,
                256,
                a.allocate_transfer_uid(),
            )
        })
        .collect();
    for st in &sts {
        assert_ok(st, "write of a burst");
    }
    assert_bytes_eq(
        &bytes_at(&dst, 0, n * 256),
        &bytes_at(&src, 0, n * 256),
        "the burst",
    );
    let t = a.stats().unwrap().total();
    let express = t.express_writes - before.express_writes;
    assert_eq!(t.transfers_ok - before.transfers_ok, n as u64, "{t:?}");
    assert!(
        express < n as u64 / 2,
        "{express} of {n} writes of a burst went express over TCP"
    );
    assert_eq!(t.lane_connects_ring, 0, "{t:?}");
}

#[test]
fn express_writes_end_when_the_peer_goes_away() {
    for mode in MODES {
        express_writes_end_with_their_peer(mode);
    }
}

fn express_writes_end_with_their_peer(mode: SameHost) {
    // A long timeout: every write must end through its lane's death, not its deadline.
    let c = cfg_with(|c| {
        c.same_host = Some(mode);
        c.op_timeout = Duration::from_secs(60);
    });
    let lanes = c.num_data_conns as u64;
    let (a, b) = pair(&format!("xp_gone_{mode:?}"), c);
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
                    let uid = a.allocate_transfer_uid();
                    sts.push(if i % 3 == 2 {
                        a.read(&s, off, &d, off, size, uid)
                    } else {
                        a.write(&s, off, &d, off, size, uid)
                    });
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
    if express_on(mode) {
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
        let mode = MODES[round % 2];
        let (a, b) = pair(
            &format!("xp_drop{round}"),
            cfg_with(|c| {
                c.num_data_conns = 2;
                c.same_host = Some(mode);
            }),
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
            "round {round} ({mode:?}): a write to a dropped peer still in flight after {:?}",
            t0.elapsed()
        );
        assert_ne!(code, StatusCode::Success, "round {round}");
    }
}

/// Express frames that a TCP socket takes only in part are finished by the lane's writer
/// before anything else it sends: every write lands whole and is answered, however the
/// frames are cut, with large writes on the usual path beside them (the case runs alone:
/// its cut applies to the whole process).
#[test]
fn express_frames_cut_short_are_finished_by_the_writer() {
    run_alone("express::cut_express_frames");
}

#[test]
#[ignore = "run by express_frames_cut_short_are_finished_by_the_writer, alone"]
fn cut_express_frames() {
    let c = cfg(SameHost::Off);
    let lanes = c.num_data_conns as u64;
    let (a, b) = pair("xp_cut", c);
    let half = 1 << 20;
    let src = random_buffer(&a, 2 * half, 5);
    let dst = b.alloc_buffer(2 * half).unwrap();
    let back = a.alloc_buffer(SIZES[SIZES.len() - 1]).unwrap();
    warm(&a, &src, &dst, lanes);
    let before = a.stats().unwrap().total();
    let a = Arc::new(a);
    // Large writes on the usual path, into the second half, while the small ones go.
    let big = {
        let (a, s, d) = (a.clone(), src.desc().clone(), dst.desc().clone());
        std::thread::spawn(move || {
            for i in 0..20 {
                let off = half + (i % 4) * (half / 4);
                let st = a.write(&s, off, &d, off, half / 4, a.allocate_transfer_uid());
                assert_ok(&st, "large write beside cut express frames");
            }
        })
    };
    let mut done = Vec::new();
    let on = express_on(SameHost::Off);
    let express = |a: &IoEngine| a.stats().unwrap().total().express_writes;
    for (round, cut) in [1usize, 7, 40, 100, 1000].into_iter().enumerate() {
        morio::limit_express_sends(cut);
        // At least 40 writes, and on until 8 of them went express (a write goes express
        // only on an idle lane; the large writes beside them, or a loaded machine, keep
        // lanes busy for a while), so that every cut is exercised.
        let first = express(&a);
        let mut i = 0;
        while i < 40 || (on && express(&a) - first < 8 && i < 2000) {
            let size = SIZES[i % SIZES.len()];
            let off = (round * 2000 + i) * 2000 % (half - size);
            let uid = a.allocate_transfer_uid();
            let st = a.write(src.desc(), off, dst.desc(), off, size, uid);
            assert_ok(&st, &format!("write of {size} B cut after {cut} B"));
            done.push((uid, off, size));
            // Every fourth, read it back (READ frames are cut too).
            if i % 4 == 3 {
                let rd = a.read(
                    back.desc(),
                    0,
                    dst.desc(),
                    off,
                    size,
                    a.allocate_transfer_uid(),
                );
                assert_ok(&rd, &format!("read of {size} B cut after {cut} B"));
                assert_bytes_eq(
                    &bytes_at(&back, 0, size),
                    &bytes_at(&src, off, size),
                    "cut express read",
                );
            }
            i += 1;
        }
        if on {
            let n = express(&a) - first;
            assert!(n >= 8, "cut {cut}: only {n} of {i} writes went express");
        }
    }
    morio::limit_express_sends(0);
    big.join().unwrap();
    for &(uid, _, _) in &done {
        assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success, "uid {uid}");
    }
    for &(_, off, size) in &done {
        assert_bytes_eq(
            &bytes_at(&dst, off, size),
            &bytes_at(&src, off, size),
            "cut express write",
        );
    }
    let t = a.stats().unwrap().total();
    assert_eq!(t.lane_failures, before.lane_failures, "{t:?}");
}

/// A target that answers an express write with read data, or an express read with a bare
/// COMPLETE, fails that transfer at once (not at its deadline) and loses the lane: the
/// initiator never takes a mismatched answer as a success.
#[test]
fn mismatched_answers_to_express_transfers_fail_them_and_the_lane() {
    use morio::proto::frame::{Frame, Reply};
    use std::io::Write;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in l.incoming().take(8) {
            let Ok(mut c) = conn else { return };
            std::thread::spawn(move || {
                let Ok(Frame::Hello(_)) = try_read_frame(&mut c, Duration::from_secs(5)) else {
                    return;
                };
                let _ = c.write_all(&hello_ack("xp_fake"));
                loop {
                    let Ok((f, _)) = try_read_frame_and_payload(&mut c, Duration::from_secs(30))
                    else {
                        return;
                    };
                    let (chunk, read) = match f {
                        Frame::Write { chunk, .. } => (chunk, false),
                        Frame::Read { chunk, .. } => (chunk, true),
                        _ => return,
                    };
                    let reply = |code| Reply {
                        tag: chunk.tag,
                        uid: chunk.uid,
                        chunk: 0,
                        code,
                        msg: String::new(),
                    };
                    let express = chunk.tag & (1 << 63) != 0;
                    // The usual path's write is answered right, express transfers wrong.
                    let answer = if read != express {
                        let bytes = chunk.segs.iter().map(|s| s.len).sum::<u64>();
                        let mut out = encode(
                            &Frame::ReadData {
                                reply: reply(0),
                                final_: true,
                            },
                            bytes,
                        );
                        out.resize(out.len() + bytes as usize, 0xEE);
                        out
                    } else {
                        encode(&Frame::Complete(reply(0)), 0)
                    };
                    if c.write_all(&answer).is_err() {
                        return;
                    }
                }
            });
        }
    });
    let a = engine(
        "xp_mismatch",
        cfg_with(|c| {
            c.num_data_conns = 1;
            c.same_host = Some(SameHost::Off);
            c.op_timeout = Duration::from_secs(60);
        }),
    );
    a.register_remote_engine(&desc_at("xp_fake", port)).unwrap();
    let remote = morio::MemoryDesc::cpu("xp_fake", 0, 0x10000, 1 << 20);
    let src = a.register_buffer(vec![0x5A; 4096]).unwrap();
    let first = a.write(src.desc(), 0, &remote, 0, 64, a.allocate_transfer_uid());
    assert_ok(&first, "the usual path's write");
    if !express_on(SameHost::Off) {
        return;
    }
    for (what, read) in [("express write", false), ("express read", true)] {
        // The fake answers the usual path right: go until one goes express (the first
        // may find the owner's entry of the one before still there).
        let mut failed = false;
        for _ in 0..200 {
            let into = a.register_buffer(vec![0x5A; 64]).unwrap();
            let t = Instant::now();
            let uid = a.allocate_transfer_uid();
            let st = if read {
                a.read(into.desc(), 0, &remote, 0, 64, uid)
            } else {
                a.write(src.desc(), 0, &remote, 0, 64, uid)
            };
            let code = wait_within(&st, Duration::from_secs(10));
            if code == StatusCode::Success {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            assert_ne!(code, StatusCode::InProgress, "{what}");
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "{what}: {:?}",
                t.elapsed()
            );
            assert!(
                into.to_vec().iter().all(|&b| b == 0x5A),
                "{what}: a mismatched answer placed nothing"
            );
            failed = true;
            break;
        }
        assert!(failed, "{what}: no transfer went express");
    }
    assert!(a.stats().unwrap().total().lane_failures >= 1);
}
