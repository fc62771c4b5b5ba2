//! The same-host transport between engines of one process: chosen by itself, carrying every
//! size and shape verified (through shared-memory rings from protocol v9), off when
//! configured off, and engines of older versions together with this one.

use morio::{SameHost, StatusCode};

use crate::common::*;

fn cfg(mode: SameHost) -> morio::TcpBackendConfig {
    cfg_with(|c| c.same_host = Some(mode))
}

/// Writes and reads of a small, a medium (one pulled part), a striped and a batched transfer
/// from `a` to `b`, each verified byte for byte.
pub(crate) fn round_trips(a: &morio::IoEngine, b: &morio::IoEngine, seed: u64) {
    let n = 24 << 20;
    let src = random_buffer(a, n, seed);
    let dst = b.alloc_buffer(n).unwrap();
    let back = a.alloc_buffer(n).unwrap();
    for (off, len) in [(0usize, 4096usize), (8192, 300 << 10), (1 << 20, 16 << 20)] {
        let what = format!("write of {len} at {off}");
        assert_ok(
            &a.write(
                src.desc(),
                off,
                dst.desc(),
                off,
                len,
                a.allocate_transfer_uid(),
            ),
            &what,
        );
        assert_bytes_eq(&bytes_at(&dst, off, len), &bytes_at(&src, off, len), &what);
        let what = format!("read of {len} at {off}");
        assert_ok(
            &a.read(
                back.desc(),
                off,
                dst.desc(),
                off,
                len,
                a.allocate_transfer_uid(),
            ),
            &what,
        );
        assert_bytes_eq(&bytes_at(&back, off, len), &bytes_at(&src, off, len), &what);
    }
    // A batch of 64 pieces of 128 KiB, scattered.
    let offs: Vec<usize> = (0..64).map(|i| i * (256 << 10)).collect();
    let sizes = vec![128 << 10; 64];
    let sts = a.batch_write(
        &[src.desc().clone()],
        std::slice::from_ref(&offs),
        &[dst.desc().clone()],
        std::slice::from_ref(&offs),
        &[sizes],
        &[a.allocate_transfer_uid()],
    );
    assert_ok(&sts[0], "batch write");
    for &o in &offs {
        assert_bytes_eq(
            &bytes_at(&dst, o, 128 << 10),
            &bytes_at(&src, o, 128 << 10),
            "batch piece",
        );
    }
}

#[test]
fn same_host_carries_every_shape_verified() {
    let (a, b) = pair("sh_every", cfg(SameHost::Require));
    round_trips(&a, &b, 1);
    let t = a.stats().unwrap().total();
    assert!(t.lane_connects >= 1, "{t:?}");
    assert_eq!(
        t.lane_connects_same_host, t.lane_connects,
        "every lane on the same-host transport: {t:?}"
    );
    assert_eq!(
        t.lane_connects_ring,
        if rings_on() { t.lane_connects } else { 0 },
        "every lane's records in a shared-memory ring (unless turned off): {t:?}"
    );
    assert_eq!(t.lane_failures, 0, "{t:?}");
    // The target learns of every transfer as over TCP.
    assert!(b.stats().unwrap().total().bytes_received > 0);
}

/// A 16 MiB write on one lane once the lane is up: one chunk (no join at the target) when
/// same-host chunks may be 32 MiB, sixteen when they are 1 MiB; verified either way.
#[test]
fn same_host_peers_get_same_host_chunk_bytes() {
    for (shc, joined) in [(32usize << 20, 0u64), (1 << 20, 1)] {
        let (a, b) = pair(
            &format!("sh_chunk{}", shc >> 20),
            cfg_with(|c| {
                c.same_host = Some(SameHost::Require);
                c.num_data_conns = 1;
                c.same_host_chunk_bytes = shc;
            }),
        );
        let n = 16 << 20;
        let src = random_buffer(&a, n, 7);
        let dst = b.alloc_buffer(n).unwrap();
        // The first transfer brings the lane up (and tells the owner the peer is same-host).
        let uid = a.allocate_transfer_uid();
        assert_ok(
            &a.write(src.desc(), 0, dst.desc(), 0, 8, uid),
            "first write",
        );
        let before = b.stats().unwrap().total().joined_transfers;
        let uid = a.allocate_transfer_uid();
        assert_ok(
            &a.write(src.desc(), 0, dst.desc(), 0, n, uid),
            "16 MiB write",
        );
        assert_bytes_eq(&bytes_at(&dst, 0, n), &bytes_at(&src, 0, n), "16 MiB write");
        let t = b.stats().unwrap().total();
        assert_eq!(t.joined_transfers - before, joined, "chunk {shc}: {t:?}");
    }
}

/// The first transfer to a peer is planned before any lane to it is up: a peer whose
/// descriptor names this node gets same-host chunks from the start (one 16 MiB chunk, no
/// join at the target), unless the same-host transport is off (TCP's 1 MiB chunks: a join).
#[test]
fn a_first_transfer_to_a_same_host_peer_takes_same_host_chunks() {
    for (mode, joined) in [
        (SameHost::Require, 0u64),
        (SameHost::Auto, 0),
        (SameHost::Off, 1),
    ] {
        let (a, b) = pair(
            &format!("sh_first_{mode:?}"),
            cfg_with(|c| {
                c.same_host = Some(mode);
                c.num_data_conns = 1;
                c.chunk_bytes = 1 << 20;
                c.same_host_chunk_bytes = 32 << 20;
            }),
        );
        let n = 16 << 20;
        let src = random_buffer(&a, n, 11);
        let dst = b.alloc_buffer(n).unwrap();
        let uid = a.allocate_transfer_uid();
        assert_ok(
            &a.write(src.desc(), 0, dst.desc(), 0, n, uid),
            "first write",
        );
        assert_bytes_eq(&bytes_at(&dst, 0, n), &bytes_at(&src, 0, n), "first write");
        let t = b.stats().unwrap().total();
        assert_eq!(t.joined_transfers, joined, "{mode:?}: {t:?}");
    }
}

#[test]
fn auto_picks_same_host_and_off_keeps_tcp() {
    let (a, b) = pair("sh_auto", cfg(SameHost::Auto));
    round_trips(&a, &b, 2);
    let t = a.stats().unwrap().total();
    assert!(t.lane_connects_same_host >= 1, "auto chose TCP: {t:?}");
    let (c, d) = pair("sh_off", cfg(SameHost::Off));
    round_trips(&c, &d, 3);
    let t = c.stats().unwrap().total();
    assert!(t.lane_connects >= 1, "{t:?}");
    assert_eq!(t.lane_connects_same_host, 0, "off used same host: {t:?}");
    // One side off is enough for TCP, whichever side it is.
    let e = engine("sh_mixed_e", cfg(SameHost::Auto));
    let f = engine("sh_mixed_f", cfg(SameHost::Off));
    e.register_remote_engine(&f.engine_desc()).unwrap();
    f.register_remote_engine(&e.engine_desc()).unwrap();
    round_trips(&e, &f, 4);
    round_trips(&f, &e, 5);
    for x in [&e, &f] {
        let t = x.stats().unwrap().total();
        assert_eq!(t.lane_connects_same_host, 0, "{t:?}");
    }
}

/// Rolling upgrades: an engine that offers only protocol v6 and one that speaks v7 agree on
/// v6 (TCP, as v6 has no same-host transport) and move verified bytes both ways.
#[test]
fn protocol_versions_6_and_7_work_together() {
    let old = engine(
        "sh_v6",
        cfg_with(|c| {
            c.max_protocol_version = 6;
            c.same_host = Some(SameHost::Auto);
        }),
    );
    let new = engine("sh_v7", cfg(SameHost::Auto));
    old.register_remote_engine(&new.engine_desc()).unwrap();
    new.register_remote_engine(&old.engine_desc()).unwrap();
    round_trips(&old, &new, 6);
    round_trips(&new, &old, 7);
    for x in [&old, &new] {
        let t = x.stats().unwrap().total();
        assert!(t.lane_connects >= 1, "{t:?}");
        assert_eq!(t.lane_connects_same_host, 0, "v6 has no same-host: {t:?}");
    }
    // A version this build does not speak is refused at configuration.
    for v in [5, morio::proto::limits::VERSION + 1] {
        let bad = cfg_with(|c| c.max_protocol_version = v);
        let e = morio::IoEngine::new("sh_bad_version", morio::IoEngineConfig::new("127.0.0.1", 0))
            .unwrap();
        assert!(e.create_backend(bad).is_err(), "version {v} accepted");
    }
}

/// A version 8 engine (same-host records in the socket) and this one agree on version 8:
/// same-host lanes without rings, verified bytes both ways.
#[test]
fn protocol_versions_8_and_9_work_together() {
    let old = engine(
        "sh_v8",
        cfg_with(|c| {
            c.max_protocol_version = 8;
            c.same_host = Some(SameHost::Require);
        }),
    );
    let new = engine("sh_v9", cfg(SameHost::Require));
    old.register_remote_engine(&new.engine_desc()).unwrap();
    new.register_remote_engine(&old.engine_desc()).unwrap();
    round_trips(&old, &new, 8);
    round_trips(&new, &old, 9);
    for x in [&old, &new] {
        let t = x.stats().unwrap().total();
        assert!(t.lane_connects >= 1, "{t:?}");
        assert_eq!(t.lane_connects_same_host, t.lane_connects, "{t:?}");
        assert_eq!(t.lane_connects_ring, 0, "v8 has no rings: {t:?}");
        assert_eq!(t.lane_failures, 0, "{t:?}");
    }
}

/// Many small transfers in flight at once through rings: 2048 transfers of 4 KiB (inline
/// records: 4 MiB per lane, its ring of 1 MiB filled and drained many times over) written and
/// read back, verified.
#[test]
fn rings_carry_many_small_transfers_verified() {
    let (a, b) = pair(
        "sh_ring_small",
        cfg_with(|c| {
            c.same_host = Some(SameHost::Require);
            c.num_data_conns = 2;
        }),
    );
    let n = 8 << 20;
    let src = random_buffer(&a, n, 77);
    let dst = b.alloc_buffer(n).unwrap();
    let back = a.alloc_buffer(n).unwrap();
    // 2048 transfers of one 4 KiB piece each, all in flight at once, then read back.
    let piece = 4096usize;
    let k = n / piece;
    let offs: Vec<Vec<usize>> = (0..k).map(|i| vec![i * piece]).collect();
    let sizes = vec![vec![piece]; k];
    for op in ["write", "read"] {
        let (l, r) = if op == "write" {
            (&src, &dst)
        } else {
            (&back, &dst)
        };
        let locals = vec![l.desc().clone(); k];
        let remotes = vec![r.desc().clone(); k];
        let uids: Vec<u64> = (0..k).map(|_| a.allocate_transfer_uid()).collect();
        let sts = if op == "write" {
            a.batch_write(&locals, &offs, &remotes, &offs, &sizes, &uids)
        } else {
            a.batch_read(&locals, &offs, &remotes, &offs, &sizes, &uids)
        };
        for st in &sts {
            assert_ok(st, &format!("{op} of 4 KiB among {k}"));
        }
    }
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "writes landed");
    assert_bytes_eq(&back.to_vec(), &src.to_vec(), "reads came back");
    let t = a.stats().unwrap().total();
    assert_eq!(t.lane_connects_ring >= 1, rings_on(), "{t:?}");
    // Whether a reader parked during the burst is up to timing; after an idle spell it has
    // (nothing spins here for long): the next small write rings for it, from the lane's
    // shard or as an express write from this thread, and is counted either way.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let uid = a.allocate_transfer_uid();
    let st = a.write(src.desc(), 0, dst.desc(), 0, 8, uid);
    assert_ok(&st, "a write after an idle spell");
    let after = a.stats().unwrap().total();
    assert_eq!(
        after.same_host_doorbells > t.same_host_doorbells,
        rings_on(),
        "{t:?} then {after:?}"
    );
}

/// A ring smaller than what its lane has in flight makes the sender wait for room: the waits
/// are counted (a slow path made visible), and every byte still lands.
#[test]
fn a_full_ring_makes_senders_wait_and_loses_nothing() {
    if !rings_on() {
        eprintln!("MORIO_SAME_HOST_RING=off: no rings; the default run covers this");
        return;
    }
    let (a, b) = pair(
        "sh_ring_full",
        cfg_with(|c| {
            c.same_host = Some(SameHost::Require);
            c.num_data_conns = 1;
            c.same_host_ring_bytes = Some(64 << 10);
        }),
    );
    let n = 8 << 20;
    let src = random_buffer(&a, n, 78);
    let dst = b.alloc_buffer(n).unwrap();
    let back = a.alloc_buffer(n).unwrap();
    // One transfer of 512 scattered 8 KiB pieces: each 1 MiB chunk is one frame whose pieces
    // all travel inline (under a quarter of the ring), far more than the ring holds.
    let offs: Vec<usize> = (0..512).map(|i| i * (16 << 10)).collect();
    let sizes = vec![8 << 10; 512];
    for op in ["write", "read"] {
        let (l, what) = if op == "write" {
            (&src, "a write through a small ring")
        } else {
            (&back, "a read through a small ring")
        };
        let args = (
            [l.desc().clone()],
            std::slice::from_ref(&offs),
            [dst.desc().clone()],
            std::slice::from_ref(&offs),
            [sizes.clone()],
            [a.allocate_transfer_uid()],
        );
        let sts = if op == "write" {
            a.batch_write(&args.0, args.1, &args.2, args.3, &args.4, &args.5)
        } else {
            a.batch_read(&args.0, args.1, &args.2, args.3, &args.4, &args.5)
        };
        assert_ok(&sts[0], what);
    }
    for &o in &offs {
        let want = bytes_at(&src, o, 8 << 10);
        assert_bytes_eq(&bytes_at(&dst, o, 8 << 10), &want, "written piece");
        assert_bytes_eq(&bytes_at(&back, o, 8 << 10), &want, "piece read back");
    }
    let t = a.stats().unwrap().total();
    assert_eq!(t.lane_connects_ring, t.lane_connects, "{t:?}");
    assert!(
        t.same_host_ring_full_waits > 0,
        "the ring never filled: {t:?}"
    );
}

/// A transfer that fails over the same-host transport fails as over TCP: regions
/// deregistered on either side while transfers are in flight, and a target that went away.
#[test]
fn same_host_failures_are_clean() {
    use morio::MemoryLocationType::Cpu;
    let (a, b) = pair("sh_fail", cfg(SameHost::Require));
    let n = 8 << 20;
    // The target's region is deregistered while writes into it are in flight: each write
    // lands whole or fails, none hangs, and no byte lands after deregistration returns.
    let src = random_buffer(&a, n, 8);
    let mut mem = vec![0u8; n];
    // SAFETY: `mem` outlives the registration (deregistered below, before it is dropped).
    let md = unsafe { b.register_memory(mem.as_mut_ptr(), n, -1, Cpu) }.unwrap();
    let sts: Vec<_> = (0..8)
        .map(|_| a.write(src.desc(), 0, &md, 0, n, a.allocate_transfer_uid()))
        .collect();
    b.deregister_memory(&md).expect("deregister");
    let snapshot = mem.clone();
    for st in &sts {
        assert_ne!(wait(st), StatusCode::Init);
    }
    assert_bytes_eq(&mem, &snapshot, "target memory after its deregistration");
    let again = a.write(src.desc(), 0, &md, 0, n, a.allocate_transfer_uid());
    assert_eq!(wait(&again), StatusCode::ErrNotFound, "{}", again.message());
    // The initiator's source is deregistered while writes from it are in flight: the
    // deregistration waits for the target to have taken their bytes.
    let dst = b.alloc_buffer(n).unwrap();
    let mut local = random_big(n, 9);
    let expect = local.clone();
    // SAFETY: as above.
    let lmd = unsafe { a.register_memory(local.as_mut_ptr(), n, -1, Cpu) }.unwrap();
    let sts: Vec<_> = (0..8)
        .map(|_| a.write(&lmd, 0, dst.desc(), 0, n, a.allocate_transfer_uid()))
        .collect();
    a.deregister_memory(&lmd).expect("deregister");
    local.fill(0xEE);
    for st in &sts {
        assert_ne!(wait(st), StatusCode::Init);
    }
    if sts.iter().all(|st| st.code() == StatusCode::Success) {
        assert_bytes_eq(
            &dst.to_vec(),
            &expect,
            "writes completed before deregistration",
        );
    }
    // The target goes away: the next transfer fails, none hangs.
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()),
        "write before the target goes",
    );
    b.remove_backend(morio::BackendType::Tcp).unwrap();
    let st = a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid());
    assert_ne!(wait(&st), StatusCode::Success);
}
