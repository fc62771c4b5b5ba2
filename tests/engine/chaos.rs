//! Chaos: random writes and reads (single and batched) from several threads while the peer is
//! dropped and started again and its regions are deregistered and registered anew. Every
//! transfer ends within its deadline (no hang, no lost completion), with SUCCESS or a clear
//! error; every SUCCESS is checked byte for byte; and the pair works once the chaos stops.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use morio::{IoEngine, RegisteredBuffer, StatusCode, TransferStatus};
use rand::{Rng, SeedableRng};

use super::common::*;

const WORKERS: usize = 3;
const BUF: usize = 2 << 20;
const OP_TIMEOUT: Duration = Duration::from_secs(3);
const CHAOS: Duration = Duration::from_secs(4);

/// The peer as the workers see it now: its engine and each worker's target buffer.
struct Peer {
    engine: Arc<IoEngine>,
    dst: Vec<Arc<RegisteredBuffer>>,
}

/// What a worker knows its target buffer holds: a byte is known once a write of it
/// succeeded, and unknown again after a write over it failed (it may have landed in part).
struct Known {
    of: Arc<RegisteredBuffer>,
    bytes: Vec<u8>,
    valid: Vec<bool>,
}

impl Known {
    /// A freshly allocated buffer: zeros, all known.
    fn fresh(of: Arc<RegisteredBuffer>) -> Self {
        Self {
            of,
            bytes: vec![0; BUF],
            valid: vec![true; BUF],
        }
    }
}

/// Random non-overlapping ranges inside one buffer: `n` of them, 8 B to 256 KiB.
fn ranges(rng: &mut impl Rng, n: usize) -> Vec<(usize, usize)> {
    let slot = BUF / n;
    (0..n)
        .map(|i| {
            let len = match rng.gen_range(0..3) {
                0 => rng.gen_range(1..=64) * 8,
                1 => rng.gen_range(1..=64) * 1024,
                _ => rng.gen_range(1..=(slot.min(256 << 10))),
            }
            .min(slot);
            (i * slot + rng.gen_range(0..=slot - len), len)
        })
        .collect()
}

/// End `st` within the deadline (with the time it may spend queued behind others), and
/// never without a reason (kept, with its digits blanked, in `why`).
#[track_caller]
fn ended(st: &TransferStatus, what: &str, why: &mut BTreeSet<String>) -> StatusCode {
    let c = wait_within(st, OP_TIMEOUT * 2 + Duration::from_secs(5));
    if c != StatusCode::Success {
        let m = st.message();
        assert!(!m.is_empty(), "{what}: {c:?} without a message");
        why.insert(format!(
            "{c:?}: {}",
            m.replace(|c: char| c.is_ascii_digit(), "#")
        ));
    }
    c
}

/// One worker: random transfers against its buffer at the peer until `stop`; returns how
/// many succeeded, how many failed, and why they failed.
fn worker(
    a: &IoEngine,
    peer: &Mutex<Peer>,
    idx: usize,
    stop: &AtomicBool,
    seed: u64,
) -> (usize, usize, BTreeSet<String>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let src = a.register_buffer(vec![0u8; BUF]).unwrap();
    let back = a.register_buffer(vec![0u8; BUF]).unwrap();
    let mut known: Option<Known> = None;
    let (mut ok, mut failed) = (0, 0);
    let mut why = BTreeSet::new();
    while !stop.load(Ordering::Relaxed) {
        let dst = peer.lock().unwrap().dst[idx].clone();
        if known.as_ref().is_none_or(|k| !Arc::ptr_eq(&k.of, &dst)) {
            known = Some(Known::fresh(dst.clone()));
        }
        let k = known.as_mut().unwrap();
        let n = rng.gen_range(1..=4);
        let rs = ranges(&mut rng, n);
        let batched = n > 1 || rng.gen_bool(0.3);
        if rng.gen_bool(0.6) {
            // A write of fresh bytes.
            for &(off, len) in &rs {
                let fresh = random_bytes(len, rng.gen());
                assert!(src.write_at(off, &fresh));
            }
            let sts: Vec<Arc<TransferStatus>> = if batched {
                let offs = vec![rs.iter().map(|r| r.0).collect::<Vec<_>>()];
                let sizes = vec![rs.iter().map(|r| r.1).collect::<Vec<_>>()];
                a.batch_write(
                    &[src.desc().clone()],
                    &offs,
                    &[dst.desc().clone()],
                    &offs,
                    &sizes,
                    &[a.allocate_transfer_uid()],
                )
            } else {
                let (off, len) = rs[0];
                vec![a.write(
                    src.desc(),
                    off,
                    dst.desc(),
                    off,
                    len,
                    a.allocate_transfer_uid(),
                )]
            };
            let code = ended(&sts[0], "write", &mut why);
            for &(off, len) in &rs {
                if code == StatusCode::Success {
                    let sent = bytes_at(&src, off, len);
                    assert_bytes_eq(&bytes_at(&dst, off, len), &sent, "a write that succeeded");
                    k.bytes[off..off + len].copy_from_slice(&sent);
                    k.valid[off..off + len].fill(true);
                } else {
                    k.valid[off..off + len].fill(false);
                }
            }
            if code == StatusCode::Success {
                ok += 1;
            } else {
                failed += 1;
            }
        } else {
            // A read back of what the worker knows is there.
            for &(off, len) in &rs {
                assert!(back.write_at(off, &vec![0x5A; len]));
            }
            let sts: Vec<Arc<TransferStatus>> = if batched {
                let offs = vec![rs.iter().map(|r| r.0).collect::<Vec<_>>()];
                let sizes = vec![rs.iter().map(|r| r.1).collect::<Vec<_>>()];
                a.batch_read(
                    &[back.desc().clone()],
                    &offs,
                    &[dst.desc().clone()],
                    &offs,
                    &sizes,
                    &[a.allocate_transfer_uid()],
                )
            } else {
                let (off, len) = rs[0];
                vec![a.read(
                    back.desc(),
                    off,
                    dst.desc(),
                    off,
                    len,
                    a.allocate_transfer_uid(),
                )]
            };
            if ended(&sts[0], "read", &mut why) == StatusCode::Success {
                for &(off, len) in &rs {
                    let got = bytes_at(&back, off, len);
                    for i in (0..len).filter(|&i| k.valid[off + i]) {
                        assert_eq!(
                            got[i],
                            k.bytes[off + i],
                            "a read that succeeded: byte {} of {off}+{len}",
                            off + i
                        );
                    }
                }
                ok += 1;
            } else {
                failed += 1;
            }
        }
    }
    // Calm again: the latest buffer is written whole and read back whole.
    let dst = peer.lock().unwrap().dst[idx].clone();
    let fresh = random_bytes(BUF, seed ^ 0xC4A05);
    assert!(src.write_at(0, &fresh));
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, BUF, a.allocate_transfer_uid()),
        "a write after the chaos",
    );
    assert_ok(
        &a.read(
            back.desc(),
            0,
            dst.desc(),
            0,
            BUF,
            a.allocate_transfer_uid(),
        ),
        "a read after the chaos",
    );
    assert_bytes_eq(
        &back.to_vec(),
        &fresh,
        "written and read back after the chaos",
    );
    (ok, failed, why)
}

/// A new peer engine (same key, new port), known to `a`, with a fresh buffer per worker.
fn start_peer(a: &IoEngine) -> Peer {
    let b = Arc::new(engine("chaos_b", cfg_with(|c| c.op_timeout = OP_TIMEOUT)));
    a.register_remote_engine(&b.engine_desc()).unwrap();
    let dst = (0..WORKERS)
        .map(|_| Arc::new(b.alloc_buffer(BUF).unwrap()))
        .collect();
    Peer { engine: b, dst }
}

#[test]
fn transfers_survive_peers_restarting_and_regions_churning() {
    let a = Arc::new(engine("chaos_a", cfg_with(|c| c.op_timeout = OP_TIMEOUT)));
    let peer = Arc::new(Mutex::new(start_peer(&a)));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..WORKERS)
        .map(|i| {
            let (a, peer, stop) = (a.clone(), peer.clone(), stop.clone());
            std::thread::spawn(move || worker(&a, &peer, i, &stop, 0xC4A0 + i as u64))
        })
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xC4A05);
    let (restarts, churns) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let t0 = Instant::now();
    while t0.elapsed() < CHAOS {
        std::thread::sleep(Duration::from_millis(rng.gen_range(50..250)));
        match rng.gen_range(0..5) {
            0 | 1 => {
                // The peer restarts: the new one is published, then the old one dropped
                // under the workers' transfers.
                let new = start_peer(&a);
                let old = std::mem::replace(&mut *peer.lock().unwrap(), new);
                within(
                    Duration::from_secs(10),
                    "dropping the old peer",
                    move || drop(old),
                );
                restarts.fetch_add(1, Ordering::Relaxed);
            }
            2 | 3 => {
                // One worker's region is registered anew and the old one deregistered.
                let i = rng.gen_range(0..WORKERS);
                let mut p = peer.lock().unwrap();
                let fresh = Arc::new(p.engine.alloc_buffer(BUF).unwrap());
                let old = std::mem::replace(&mut p.dst[i], fresh);
                let engine = p.engine.clone();
                drop(p);
                within(Duration::from_secs(10), "deregistering", move || {
                    engine.deregister_memory(old.desc())
                })
                .unwrap();
                churns.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }
    stop.store(true, Ordering::Relaxed);
    let (mut totals, mut why) = ((0, 0), BTreeSet::new());
    for w in workers {
        let (ok, failed, w_why) = w.join().expect("a worker failed");
        totals.0 += ok;
        totals.1 += failed;
        why.extend(w_why);
    }
    println!(
        "{} transfers succeeded, {} failed; {} restarts, {} regions churned",
        totals.0,
        totals.1,
        restarts.load(Ordering::Relaxed),
        churns.load(Ordering::Relaxed)
    );
    for w in &why {
        println!("  {w}");
    }
    assert!(totals.0 > 0, "no transfer succeeded");
}
