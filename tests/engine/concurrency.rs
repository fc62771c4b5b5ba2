//! Many application threads on one engine pair: shared `Arc<IoEngine>`, many transfers in
//! flight at once in both directions, sessions shared across threads; every byte and every
//! inbound status checked.

use std::sync::Arc;
use std::thread;

use morio::{IoEngine, IoEngineSession, RegisteredBuffer, StatusCode, TransferStatus};
use rand::{Rng, SeedableRng};

use super::common::*;

#[test]
fn engine_and_session_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<IoEngine>();
    send_sync::<IoEngineSession>();
    send_sync::<RegisteredBuffer>();
    send_sync::<TransferStatus>();
}

/// Random size in 1 B ..= 2 MiB, spread over the scales (uniform in log2, then uniform).
fn random_size(rng: &mut impl Rng) -> usize {
    let k = rng.gen_range(0..=21);
    ((1usize << k) + rng.gen_range(0..(1usize << k))).min(2 << 20)
}

struct Job {
    write: bool,
    local_off: usize,
    remote_off: usize,
    len: usize,
    uid: u64,
}

#[test]
fn four_threads_share_one_engine_pair() {
    let (a, b) = pair("conc4", test_cfg());
    let (a, b) = (Arc::new(a), Arc::new(b));
    const THREADS: usize = 4;
    const PER_THREAD: usize = 50;

    // Plan every thread's transfers: disjoint slots in its own local buffer and in its own
    // window of one remote buffer shared by all threads.
    let mut rng = rand::rngs::StdRng::seed_from_u64(200);
    let plans: Vec<Vec<(bool, usize)>> = (0..THREADS)
        .map(|_| {
            (0..PER_THREAD)
                .map(|_| (rng.gen_bool(0.5), random_size(&mut rng)))
                .collect()
        })
        .collect();
    let window: Vec<usize> = plans
        .iter()
        .map(|p| p.iter().map(|&(_, n)| n + 3).sum())
        .collect();
    let remote_len: usize = window.iter().sum();
    let remote_init = random_big(remote_len, 201);
    let remote = b.register_buffer(remote_init.clone()).unwrap();

    let handles: Vec<_> = plans
        .into_iter()
        .enumerate()
        .map(|(t, plan)| {
            let (a, rdesc) = (a.clone(), remote.desc().clone());
            let base: usize = window[..t].iter().sum();
            let local_init = random_big(window[t], 210 + t as u64);
            thread::spawn(move || {
                let local = a.register_buffer(local_init.clone()).unwrap();
                let mut jobs = Vec::new();
                let mut at = 0;
                for (write, len) in plan {
                    jobs.push(Job {
                        write,
                        local_off: at,
                        remote_off: base + at + 1,
                        len,
                        uid: a.allocate_transfer_uid(),
                    });
                    at += len + 3;
                }
                // Submit everything, then wait for all of it.
                let statuses: Vec<Arc<TransferStatus>> = jobs
                    .iter()
                    .map(|j| {
                        if j.write {
                            a.write(
                                local.desc(),
                                j.local_off,
                                &rdesc,
                                j.remote_off,
                                j.len,
                                j.uid,
                            )
                        } else {
                            a.read(
                                local.desc(),
                                j.local_off,
                                &rdesc,
                                j.remote_off,
                                j.len,
                                j.uid,
                            )
                        }
                    })
                    .collect();
                let code = a.wait_all(&statuses, -1);
                for (j, s) in jobs.iter().zip(&statuses) {
                    assert_eq!(
                        s.code(),
                        StatusCode::Success,
                        "uid {}: {}",
                        j.uid,
                        s.message()
                    );
                }
                assert_eq!(code, StatusCode::Success);
                (jobs, local_init, local.to_vec())
            })
        })
        .collect();

    let mut remote_model = remote_init.clone();
    let mut uids = Vec::new();
    for h in handles {
        let (jobs, local_init, local_now) = h.join().expect("worker thread");
        let mut local_model = local_init.clone();
        for j in &jobs {
            let (l, r, n) = (j.local_off, j.remote_off, j.len);
            if j.write {
                remote_model[r..r + n].copy_from_slice(&local_init[l..l + n]);
            } else {
                local_model[l..l + n].copy_from_slice(&remote_init[r..r + n]);
            }
            uids.push(j.uid);
        }
        assert_bytes_eq(&local_now, &local_model, "a thread's local buffer");
    }
    assert_bytes_eq(&remote.to_vec(), &remote_model, "the shared remote buffer");
    assert_eq!(uids.len(), THREADS * PER_THREAD);
    for uid in uids {
        assert_eq!(
            b.pop_inbound_transfer_status(a.key(), uid)
                .map(|s| s.code()),
            Some(StatusCode::Success),
            "inbound status of uid {uid}"
        );
    }
}

#[test]
fn both_directions_at_once() {
    let (a, b) = pair("conc_bidi", test_cfg());
    let (a, b) = (Arc::new(a), Arc::new(b));
    let n = 6 << 20;
    // Each side writes its buffer into the other's and reads the other's into a third.
    let run = |me: Arc<IoEngine>, peer: Arc<IoEngine>, seed: u64| {
        let mine = me.register_buffer(random_big(n, seed)).unwrap();
        let inbox = peer.alloc_buffer(n).unwrap();
        let theirs = peer.register_buffer(random_big(n, seed + 1)).unwrap();
        let fetched = me.alloc_buffer(n).unwrap();
        thread::spawn(move || {
            let mut sts = Vec::new();
            let mut uids = Vec::new();
            for k in 0..8 {
                let (o, z) = (k * (n / 8), n / 8);
                let u = me.allocate_transfer_uid();
                sts.push(me.write(mine.desc(), o, inbox.desc(), o, z, u));
                let v = me.allocate_transfer_uid();
                sts.push(me.read(fetched.desc(), o, theirs.desc(), o, z, v));
                uids.extend([u, v]);
            }
            assert_eq!(me.wait_all(&sts, -1), StatusCode::Success);
            for u in uids {
                assert_eq!(inbound(&peer, me.key(), u), StatusCode::Success);
            }
            assert_bytes_eq(&inbox.to_vec(), &mine.to_vec(), "written");
            assert_bytes_eq(&fetched.to_vec(), &theirs.to_vec(), "read");
        })
    };
    let h1 = run(a.clone(), b.clone(), 300);
    let h2 = run(b.clone(), a.clone(), 310);
    h1.join().expect("a -> b");
    h2.join().expect("b -> a");
}

#[test]
fn sessions_used_from_several_threads() {
    let (a, b) = pair("conc_sess", test_cfg());
    let a = Arc::new(a);
    const THREADS: usize = 4;
    let slot = 256 << 10;
    let local = a.register_buffer(random_big(THREADS * slot, 400)).unwrap();
    let remote_init = random_big(THREADS * slot, 401);
    let remote = b.register_buffer(remote_init.clone()).unwrap();
    // One session shared by every thread.
    let shared = Arc::new(a.create_session(local.desc(), remote.desc()).unwrap());
    let local_init = local.to_vec();
    // Each thread: in its own slot, the first half is written through the shared session
    // (one plain write, one batch), the second half read through a session of its own.
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (a, shared) = (a.clone(), shared.clone());
            let (ld, rd) = (local.desc().clone(), remote.desc().clone());
            thread::spawn(move || {
                let own = a.create_session(&ld, &rd).unwrap();
                let base = t * slot;
                let half = slot / 2;
                let q = half / 2;
                let mut sts = vec![shared.write(base, base, q, shared.allocate_transfer_uid())];
                // A strided batch over the second quarter: 64 segments of 512 B, stride 1 KiB.
                let offs: Vec<usize> = (0..64).map(|i| base + q + i * 1024).collect();
                sts.push(shared.batch_write(
                    &offs,
                    &offs,
                    &[512; 64],
                    shared.allocate_transfer_uid(),
                ));
                sts.push(own.read(base + half, base + half, q, own.allocate_transfer_uid()));
                let offs: Vec<usize> = (0..64).map(|i| base + half + q + i * 1024).collect();
                sts.push(own.batch_read(&offs, &offs, &[512; 64], own.allocate_transfer_uid()));
                for s in &sts {
                    assert_eq!(wait(s), StatusCode::Success, "{}", s.message());
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("session thread");
    }
    let (l, r) = (local.to_vec(), remote.to_vec());
    let mut want_r = remote_init.clone();
    let mut want_l = local_init.clone();
    for t in 0..THREADS {
        let (base, half) = (t * slot, slot / 2);
        let q = half / 2;
        want_r[base..base + q].copy_from_slice(&local_init[base..base + q]);
        for i in 0..64 {
            let o = base + q + i * 1024;
            want_r[o..o + 512].copy_from_slice(&local_init[o..o + 512]);
        }
        let o = base + half;
        want_l[o..o + q].copy_from_slice(&remote_init[o..o + q]);
        for i in 0..64 {
            let o = base + half + q + i * 1024;
            want_l[o..o + 512].copy_from_slice(&remote_init[o..o + 512]);
        }
    }
    assert_bytes_eq(&r, &want_r, "remote after session writes");
    assert_bytes_eq(&l, &want_l, "local after session reads");
}
