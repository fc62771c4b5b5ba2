//! Backend lifecycle: `remove_backend` (MORI-IO's `RemoveBackend`) with and without transfers
//! in flight, re-creating a backend, and the CPU policy of pinned engines (host-wide claims).

use std::collections::BTreeSet;
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use morio::{BackendType, IoEngine, MemoryDesc, StatusCode, TcpBackendConfig, TransferStatus};

use crate::common::*;

const MIB: usize = 1 << 20;
const NO_BACKEND: &str = "No available backend found, create backend first";

/// Every way to submit fails at once with ERR_BAD_STATE "no backend".
#[track_caller]
fn assert_no_backend(a: &IoEngine, local: &MemoryDesc, remote: &MemoryDesc, what: &str) {
    let uid = a.allocate_transfer_uid();
    let mut st = vec![
        a.write(local, 0, remote, 0, 4096, uid),
        a.read(local, 0, remote, 0, 4096, uid + 1),
    ];
    st.extend(a.batch_write(
        std::slice::from_ref(local),
        &[vec![0, 8192]],
        std::slice::from_ref(remote),
        &[vec![0, 8192]],
        &[vec![4096, 4096]],
        &[uid + 2],
    ));
    for (i, s) in st.iter().enumerate() {
        // Terminal when the call returns: no wait.
        assert_eq!(s.code(), StatusCode::ErrBadState, "{what}: call {i}");
        assert_eq!(s.message(), NO_BACKEND, "{what}: call {i}");
    }
    assert_eq!(a.n_shards(), 0, "{what}");
    assert!(a.shard_cpus().is_empty(), "{what}");
    assert!(a.stats().is_none(), "{what}");
    assert!(a.create_session(local, remote).is_none(), "{what}");
}

fn refused(port: u16) -> bool {
    TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(2),
    )
    .is_err()
}

#[test]
fn removed_backend_fails_transfers_and_a_new_one_moves_verified_bytes() {
    let (a, b) = pair("rm_basic", test_cfg());
    let n = 2 * MIB;
    let src = random_buffer(&a, n, 1);
    let dst = b.alloc_buffer(n).unwrap();
    let back = a.alloc_buffer(n).unwrap();
    let sess = a.create_session(src.desc(), dst.desc()).unwrap();
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()),
        "before removal",
    );
    // An inbound status left unpopped on `a` goes with its backend.
    let b_src = random_buffer(&b, 4096, 2);
    let uid = b.allocate_transfer_uid();
    assert_ok(
        &b.write(b_src.desc(), 0, back.desc(), 0, 4096, uid),
        "b to a",
    );
    let old_port = a.engine_desc().port;
    assert_ne!(old_port, 0);

    a.remove_backend(BackendType::Tcp).unwrap();
    assert_no_backend(&a, src.desc(), dst.desc(), "after removal");
    assert!(a.pop_inbound_transfer_status(b.key(), uid).is_none());
    assert_eq!(a.engine_desc().port, 0, "the configured port again");
    assert!(refused(old_port), "the listener is closed");
    let st = sess.write(0, 0, 4096, sess.allocate_transfer_uid());
    assert_eq!(
        (st.code(), st.message()),
        (StatusCode::ErrBadState, NO_BACKEND.into())
    );
    // Removing again is a no-op.
    a.remove_backend(BackendType::Tcp).unwrap();
    // Memory registered while there is no backend is handed to the next one too.
    let late = random_buffer(&a, n, 3);

    a.create_backend(test_cfg()).unwrap();
    assert_eq!(a.n_shards(), 2);
    let port = a.engine_desc().port;
    assert_ne!(port, 0);
    assert!(!refused(port), "the new listener accepts");
    b.register_remote_engine(&a.engine_desc()).unwrap();

    // a → b: write from a region registered before the removal, then from one registered
    // during it, and read back into a third.
    let uid = a.allocate_transfer_uid();
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, n, uid),
        "write after",
    );
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "write after re-creating");
    assert_ok(
        &a.write(late.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()),
        "write from late region",
    );
    assert_bytes_eq(&dst.to_vec(), &late.to_vec(), "late region");
    assert_ok(
        &a.read(back.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()),
        "read after",
    );
    assert_bytes_eq(&back.to_vec(), &late.to_vec(), "read after re-creating");
    // The session made before the removal works again.
    let uid = sess.allocate_transfer_uid();
    assert_ok(&sess.write(0, 0, n, uid), "session after");
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "session after");
    // b → a over the new listener (b's old lanes to a were closed with a's shards).
    let b_big = random_buffer(&b, n, 4);
    let uid = b.allocate_transfer_uid();
    assert_ok(
        &b.write(b_big.desc(), 0, back.desc(), 0, n, uid),
        "b to a after",
    );
    assert_eq!(inbound(&a, b.key(), uid), StatusCode::Success);
    assert_bytes_eq(&back.to_vec(), &b_big.to_vec(), "b to a after");
    assert!(a.stats().is_some());
}

#[test]
fn removing_other_backend_types_or_none_is_a_no_op() {
    let lone = IoEngine::new("rm_none", morio::IoEngineConfig::new("127.0.0.1", 0)).unwrap();
    lone.remove_backend(BackendType::Tcp).unwrap();
    assert_eq!(lone.n_shards(), 0);
    lone.create_backend(test_cfg()).unwrap();
    assert_eq!(lone.n_shards(), 2);

    let (a, b) = pair("rm_types", test_cfg());
    let port = a.engine_desc().port;
    let src = random_buffer(&a, 4096, 5);
    let dst = b.alloc_buffer(4096).unwrap();
    for ty in [
        BackendType::Rdma,
        BackendType::Xgmi,
        BackendType::Fabric,
        BackendType::Unknown,
    ] {
        a.remove_backend(ty).unwrap();
        assert_eq!(a.n_shards(), 2, "{ty:?}");
        assert_eq!(a.engine_desc().port, port, "{ty:?}");
        assert_ok(
            &a.write(
                src.desc(),
                0,
                dst.desc(),
                0,
                4096,
                a.allocate_transfer_uid(),
            ),
            &format!("after removing {ty:?}"),
        );
    }
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "other types");
}

#[test]
fn removal_ends_every_transfer_in_flight_and_wakes_its_waiters() {
    // The deadline is far beyond the bound below: nothing here may end by timing out.
    let cfg = cfg_with(|c| c.op_timeout = Duration::from_secs(120));
    let (a, b) = pair("rm_flight", cfg.clone());
    let fake_key = "rm_flight_fake";
    let fake = FakePeer::start(fake_key, FakeMode::AckThenSilent);
    a.register_remote_engine(&desc_at(fake_key, fake.port))
        .unwrap();
    let silent = MemoryDesc::cpu(fake_key, 0, 0x10000, 64 << 20);
    let n = 16 * MIB;
    let src = a.register_buffer(random_big(n, 6)).unwrap();
    let sink = a.alloc_buffer(n).unwrap();
    let dst = b.alloc_buffer(n).unwrap();
    let far = b.register_buffer(random_big(n, 7)).unwrap();

    // Transfers that can only end by the removal: a silent peer never answers.
    let mut stuck = Vec::new();
    for (size, read) in [
        (4096, false),
        (4096, true),
        (2 * MIB, false),
        (2 * MIB, true),
    ] {
        let uid = a.allocate_transfer_uid();
        stuck.push(if read {
            a.read(sink.desc(), 0, &silent, 0, size, uid)
        } else {
            a.write(src.desc(), 0, &silent, 0, size, uid)
        });
    }
    // Large transfers to a real peer, likely still moving when the removal comes.
    let mut real = Vec::new();
    for _ in 0..3 {
        real.push(a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()));
        real.push(a.read(sink.desc(), 0, far.desc(), 0, n, a.allocate_transfer_uid()));
    }
    // A thread blocked in an unbounded wait must be woken by the removal.
    let waited = stuck[0].clone();
    let waiter = std::thread::spawn(move || waited.wait());
    std::thread::sleep(Duration::from_millis(200));
    assert!(stuck.iter().all(|s| s.code() == StatusCode::InProgress));

    let a = Arc::new(a);
    let a2 = a.clone();
    within(Duration::from_secs(30), "remove_backend", move || {
        a2.remove_backend(BackendType::Tcp).unwrap()
    });
    // Right after it returned, nothing is left in progress.
    for (i, s) in stuck.iter().enumerate() {
        assert_eq!(
            s.code(),
            StatusCode::ErrBadState,
            "stuck {i}: {}",
            s.message()
        );
    }
    for (i, s) in real.iter().enumerate() {
        assert!(
            matches!(s.code(), StatusCode::Success | StatusCode::ErrBadState),
            "real {i} is {} after the removal: {}",
            s.code(),
            s.message()
        );
    }
    let code = within(Duration::from_secs(10), "the waiter", move || {
        waiter.join().unwrap()
    });
    assert_eq!(code, StatusCode::ErrBadState);
    drop(fake);

    // The target is unaffected, and a new backend on `a` works with it.
    a.create_backend(cfg).unwrap();
    b.register_remote_engine(&a.engine_desc()).unwrap();
    let uid = a.allocate_transfer_uid();
    assert_ok(&a.write(src.desc(), 0, dst.desc(), 0, n, uid), "after");
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "after the removal");
}

#[test]
fn submitters_waiters_and_registrations_race_a_removal_cleanly() {
    let (a, b) = pair("rm_race", test_cfg());
    let a = Arc::new(a);
    let size = 256 << 10; // striped over every lane
    let src = random_buffer(&a, size, 8);
    let dst = b.alloc_buffer(8 * size).unwrap();
    let sess = Arc::new(a.create_session(src.desc(), dst.desc()).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicUsize::new(0));
    let codes = Arc::new(Mutex::new(Vec::<(StatusCode, String)>::new()));

    let mut threads = Vec::new();
    for t in 0..4usize {
        let (a, sess, stop, ok, codes) = (
            a.clone(),
            sess.clone(),
            stop.clone(),
            ok.clone(),
            codes.clone(),
        );
        let (s, d) = (src.desc().clone(), dst.desc().clone());
        threads.push(std::thread::spawn(move || {
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let len = if i % 2 == 0 { 4096 } else { size };
                let off = t * size;
                let st: Arc<TransferStatus> = match i % 3 {
                    0 => sess.write(0, off, len, sess.allocate_transfer_uid()),
                    1 => a.write(&s, 0, &d, off, len, a.allocate_transfer_uid()),
                    _ => a.read(&s, 0, &d, off, len, a.allocate_transfer_uid()),
                };
                let code = st.wait_for(Duration::from_secs(30));
                if code == StatusCode::Success {
                    ok.fetch_add(1, Ordering::Relaxed);
                }
                codes.lock().unwrap().push((code, st.message()));
                i += 1;
            }
        }));
    }
    // Registration and statistics calls meanwhile.
    {
        let (a, stop) = (a.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let buf = a.alloc_buffer(64 << 10).expect("register during removal");
                let _ = a.stats();
                a.deregister_memory(buf.desc())
                    .expect("deregister during removal");
            }
        }));
    }
    let t0 = Instant::now();
    while ok.load(Ordering::Relaxed) < 20 && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let a2 = a.clone();
    within(Duration::from_secs(30), "remove_backend", move || {
        a2.remove_backend(BackendType::Tcp).unwrap()
    });
    // Keep submitting against no backend for a moment, then stop.
    std::thread::sleep(Duration::from_millis(100));
    stop.store(true, Ordering::Relaxed);
    within(Duration::from_secs(60), "the racing threads", move || {
        for t in threads {
            t.join().expect("a racing thread panicked");
        }
    });
    let codes = codes.lock().unwrap();
    assert!(
        ok.load(Ordering::Relaxed) > 0,
        "nothing succeeded before the removal"
    );
    for (c, msg) in codes.iter() {
        assert!(
            matches!(c, StatusCode::Success | StatusCode::ErrBadState),
            "a transfer ended {c}: {msg}"
        );
    }
    assert!(
        codes.iter().any(|(_, m)| m == NO_BACKEND),
        "no submission met the removed backend"
    );
    // And the engine comes back.
    a.create_backend(test_cfg()).unwrap();
    b.register_remote_engine(&a.engine_desc()).unwrap();
    assert_ok(
        &sess.write(0, 0, size, sess.allocate_transfer_uid()),
        "after",
    );
    assert_bytes_eq(&bytes_at(&dst, 0, size), &src.to_vec(), "after the race");
}

// --- the CPU policy of pinned engines --------------------------------------------------------

/// A claim directory of this test's own (so tests never see each other's claims).
struct ClaimDir(PathBuf);

impl ClaimDir {
    fn new(tag: &str) -> Self {
        Self(std::env::temp_dir().join(format!(
            "morio-test-claims-{tag}-{}-{:x}",
            std::process::id(),
            rand::random::<u64>()
        )))
    }

    fn cfg(&self, f: impl FnOnce(&mut TcpBackendConfig)) -> TcpBackendConfig {
        cfg_with(|c| {
            c.pin_shards = true;
            c.num_shards = None;
            c.cpu_claim_dir = Some(self.0.clone());
            f(c)
        })
    }
}

impl Drop for ClaimDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn pinned(e: &IoEngine) -> Vec<usize> {
    e.shard_cpus().into_iter().flatten().collect()
}

#[test]
fn library_engines_float_by_default() {
    let e = engine("cpu_default", TcpBackendConfig::default());
    let cpus = e.shard_cpus();
    assert!(!cpus.is_empty());
    assert!(cpus.iter().all(Option::is_none), "{cpus:?}");
    let allowed = morio::placement::allowed_cpus().len();
    assert_eq!(e.n_shards(), allowed.clamp(1, 8));
}

#[test]
fn pinned_engines_claim_disjoint_cpus_and_release_them_on_removal() {
    let dir = ClaimDir::new("engines");
    let allowed: Vec<usize> = morio::placement::allowed_cpus().iter().collect();
    let one = |c: &mut TcpBackendConfig| c.num_shards = Some(1);
    let a = engine("cpu_claim_a", dir.cfg(one));
    let b = engine("cpu_claim_b", dir.cfg(one));
    let (pa, pb) = (pinned(&a), pinned(&b));
    assert_eq!(pa.len(), 1, "{:?}", a.shard_cpus());
    assert!(allowed.contains(&pa[0]));
    if allowed.len() >= 2 {
        assert_eq!(pb.len(), 1, "{:?}", b.shard_cpus());
        assert_ne!(pa, pb, "two pinned engines share a CPU");
    }
    // Pinned engines move bytes like any others.
    a.register_remote_engine(&b.engine_desc()).unwrap();
    let src = random_buffer(&a, 2 * MIB, 9);
    let dst = b.alloc_buffer(2 * MIB).unwrap();
    assert_ok(
        &a.write(
            src.desc(),
            0,
            dst.desc(),
            0,
            2 * MIB,
            a.allocate_transfer_uid(),
        ),
        "pinned",
    );
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "pinned engines");

    // An engine wanting every CPU gets the ones left: none of a's or b's (unpinned if none).
    let c = engine("cpu_claim_c", dir.cfg(|_| {}));
    let pc = pinned(&c);
    let taken: BTreeSet<usize> = pa.iter().chain(&pb).copied().collect();
    assert!(pc.iter().all(|x| !taken.contains(x)), "{pc:?} vs {taken:?}");
    let want = allowed
        .len()
        .min(TcpBackendConfig::default().num_data_conns);
    assert_eq!(pc.len(), want.min(allowed.len() - taken.len()), "{pc:?}");
    assert!(c.n_shards() >= 1);
    if pc.is_empty() {
        assert!(c.shard_cpus().iter().all(Option::is_none));
    }
    // Removing a's backend releases its CPU for the next claimer.
    a.remove_backend(BackendType::Tcp).unwrap();
    let d = engine("cpu_claim_d", dir.cfg(one));
    assert_eq!(pinned(&d), pa, "a's CPU was not released");
    // And a's new backend finds it taken: a CPU no one holds, or none.
    a.create_backend(dir.cfg(one)).unwrap();
    let now: BTreeSet<usize> = [&b, &c, &d].iter().flat_map(|e| pinned(e)).collect();
    assert!(pinned(&a).iter().all(|x| !now.contains(x)));
    // Dropping an engine releases its claims too.
    drop(d);
    a.remove_backend(BackendType::Tcp).unwrap();
    a.create_backend(dir.cfg(one)).unwrap();
    assert_eq!(pinned(&a), pa, "d's drop did not release its CPU");
}

#[test]
fn explicit_cpus_are_used_as_given_even_when_claimed() {
    let dir = ClaimDir::new("explicit");
    let first = morio::placement::allowed_cpus().iter().next().unwrap();
    let a = engine("cpu_explicit_a", dir.cfg(|c| c.num_shards = Some(1)));
    let pa = pinned(&a);
    assert_eq!(pa.len(), 1);
    // Explicit CPUs pin even with pin_shards off, exactly as listed.
    let b = engine(
        "cpu_explicit_b",
        dir.cfg(|c| {
            c.pin_shards = false;
            c.cpus = Some(vec![pa[0]]);
        }),
    );
    assert_eq!(b.shard_cpus(), vec![Some(pa[0])]);
    let e = engine("cpu_explicit_e", dir.cfg(|c| c.cpus = Some(vec![first])));
    assert_eq!(e.shard_cpus(), vec![Some(first)]);
}

#[test]
fn a_peer_registered_before_its_backend_fails_clearly_until_registered_again() {
    // MORI-IO accepts the descriptor of an engine that has no backend yet (port 0).
    let a = engine("early_a", test_cfg());
    let b = IoEngine::new("early_b", morio::IoEngineConfig::new("127.0.0.1", 0)).unwrap();
    a.register_remote_engine(&b.engine_desc()).unwrap();
    b.create_backend(test_cfg()).unwrap();
    let src = random_buffer(&a, 4096, 7);
    let dst = b.alloc_buffer(4096).unwrap();
    let st = a.write(
        src.desc(),
        0,
        dst.desc(),
        0,
        4096,
        a.allocate_transfer_uid(),
    );
    assert_eq!(
        wait_within(&st, Duration::from_secs(10)),
        StatusCode::ErrBadState
    );
    assert!(st.message().contains("port 0"), "{}", st.message());
    a.register_remote_engine(&b.engine_desc()).unwrap();
    let st = a.write(
        src.desc(),
        0,
        dst.desc(),
        0,
        4096,
        a.allocate_transfer_uid(),
    );
    assert_ok(&st, "after registering the real port");
    assert_eq!(dst.to_vec(), src.to_vec());
}

#[test]
fn sessions_report_whether_the_backend_runs() {
    let (a, b) = pair("alive", test_cfg());
    let src = a.alloc_buffer(64).unwrap();
    let dst = b.alloc_buffer(64).unwrap();
    let sess = a.create_session(src.desc(), dst.desc()).unwrap();
    assert!(sess.alive());
    a.remove_backend(BackendType::Tcp).unwrap();
    assert!(!sess.alive());
    a.create_backend(test_cfg()).unwrap();
    assert!(sess.alive());
}
