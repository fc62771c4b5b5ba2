//! The engine over the in-process transport: the same shards, lanes and protocol with no
//! socket at all, which shows the service depends on the transport seam only.

use std::thread;
use std::time::Duration;

use super::common::*;
use morio::{IoEngine, IoEngineConfig, StatusCode, TcpBackendConfig};

/// Sockets this process has open (every fd that is one).
fn open_sockets() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))
                })
                .count()
        })
        .unwrap_or(0)
}

fn engine_in_process(key: &str, cfg: TcpBackendConfig) -> IoEngine {
    let e = IoEngine::new(key, IoEngineConfig::new("127.0.0.1", 0)).expect("engine");
    e.create_backend_in_process(cfg).expect("backend");
    e
}

fn pair_in_process(prefix: &str, cfg: TcpBackendConfig) -> (IoEngine, IoEngine) {
    let a = engine_in_process(&format!("{prefix}_a"), cfg.clone());
    let b = engine_in_process(&format!("{prefix}_b"), cfg);
    a.register_remote_engine(&b.engine_desc()).unwrap();
    b.register_remote_engine(&a.engine_desc()).unwrap();
    (a, b)
}

/// Runs `shapes_case` alone in a child process of this test binary: it counts the process's
/// sockets, which tests running beside it on other threads would open.
#[test]
fn transfers_of_every_shape_move_exact_bytes_without_a_socket() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "in_process::shapes_case",
            "--ignored",
            "--nocapture",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("1 passed"), "the case did not run: {text}");
}

/// Writes and reads of every shape (one chunk, striped, shared stripes, batches) move exact
/// bytes, with inbound statuses, and no socket is opened for any of it.
#[test]
#[ignore = "run alone by transfers_of_every_shape_move_exact_bytes_without_a_socket"]
fn shapes_case() {
    let before = open_sockets();
    let cfg = cfg_with(|c| {
        c.num_data_conns = 4;
        c.chunk_bytes = 64 << 10;
        c.same_host_chunk_bytes = 64 << 10;
        c.striping_threshold_bytes = 64 << 10;
    });
    let (a, b) = pair_in_process("ip_shapes", cfg);
    for (i, n) in [1usize, 4096, (64 << 10) + 3, 3 << 20]
        .into_iter()
        .enumerate()
    {
        let src = random_buffer(&a, n, i as u64);
        let dst = b.alloc_buffer(n).unwrap();
        let uid = a.allocate_transfer_uid();
        assert_ok(&a.write(src.desc(), 0, dst.desc(), 0, n, uid), "write");
        assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
        assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "written");
        let fresh = random_bytes(n, 100 + i as u64);
        dst.write_at(0, &fresh);
        let back = a.alloc_buffer(n).unwrap();
        let uid = a.allocate_transfer_uid();
        assert_ok(&a.read(back.desc(), 0, dst.desc(), 0, n, uid), "read");
        assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
        assert_bytes_eq(&back.to_vec(), &fresh, "read back");
    }
    // A batch of 256 strided segments, written then read through a session.
    let (n, seg) = (256usize, 4096usize);
    let src = random_buffer(&a, n * seg * 2, 7);
    let dst = b.alloc_buffer(n * seg * 2).unwrap();
    let offs: Vec<usize> = (0..n).map(|i| i * 2 * seg).collect();
    let sizes = vec![seg; n];
    let sess = a.create_session(src.desc(), dst.desc()).unwrap();
    let uid = a.allocate_transfer_uid();
    assert_ok(&sess.batch_write(&offs, &offs, &sizes, uid), "batch write");
    for &o in &offs {
        assert_eq!(
            bytes_at(&dst, o, seg),
            bytes_at(&src, o, seg),
            "segment at {o}"
        );
    }
    assert_eq!(
        open_sockets(),
        before,
        "the in-process transport opened a socket"
    );
}

/// Many threads transfer at once over the pipes.
#[test]
fn concurrent_transfers_from_many_threads() {
    let (a, b) = pair_in_process("ip_conc", test_cfg());
    let n = 256 << 10;
    let dst = b.alloc_buffer(8 * n).unwrap();
    let src = random_buffer(&a, 8 * n, 3);
    thread::scope(|s| {
        for t in 0..8 {
            let (a, src, dst) = (&a, &src, &dst);
            s.spawn(move || {
                for _ in 0..8 {
                    let uid = a.allocate_transfer_uid();
                    let st = a.write(src.desc(), t * n, dst.desc(), t * n, n, uid);
                    assert_ok(&st, "concurrent write");
                }
            });
        }
    });
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "every thread's slice");
}

/// A peer whose backend goes away fails the transfers to it with a clear status, and the
/// next transfer after it comes back (new descriptor) redials and succeeds.
#[test]
fn a_vanished_peer_fails_clearly_and_a_new_one_is_redialed() {
    let (a, b) = pair_in_process("ip_gone", test_cfg());
    let n = 1 << 20;
    let src = random_buffer(&a, n, 5);
    let dst = b.alloc_buffer(n).unwrap();
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()),
        "first",
    );
    b.remove_backend(morio::BackendType::Tcp).unwrap();
    let st = a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid());
    let code = wait_within(&st, Duration::from_secs(30));
    assert_ne!(code, StatusCode::Success, "{}", st.message());
    assert!(!st.message().is_empty());
    b.create_backend_in_process(test_cfg()).unwrap();
    a.register_remote_engine(&b.engine_desc()).unwrap();
    let st = a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid());
    assert_ok(&st, "after the peer came back");
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "after the peer came back");
}

/// An in-process engine cannot be reached over TCP (its port is not a socket) and cannot
/// reach a TCP engine: both fail the transfer with a message, nothing hangs.
#[test]
fn in_process_and_tcp_engines_do_not_mix() {
    let cfg = cfg_with(|c| c.op_timeout = Duration::from_secs(5));
    let a = engine_in_process("ip_mix_a", cfg.clone());
    let b = engine("ip_mix_b", cfg);
    a.register_remote_engine(&b.engine_desc()).unwrap();
    let src = random_buffer(&a, 4096, 1);
    let dst = b.alloc_buffer(4096).unwrap();
    let st = a.write(
        src.desc(),
        0,
        dst.desc(),
        0,
        4096,
        a.allocate_transfer_uid(),
    );
    assert_ne!(
        wait_within(&st, Duration::from_secs(30)),
        StatusCode::Success
    );
    assert!(st.message().contains("in-process"), "{}", st.message());
    // The TCP engine dialing the in-process one's advertised port reaches no engine there.
    b.register_remote_engine(&a.engine_desc()).unwrap();
    let back = b.alloc_buffer(4096).unwrap();
    let src_a = a.alloc_buffer(4096).unwrap();
    let st = b.write(
        back.desc(),
        0,
        src_a.desc(),
        0,
        4096,
        b.allocate_transfer_uid(),
    );
    assert_ne!(
        wait_within(&st, Duration::from_secs(30)),
        StatusCode::Success
    );
}

/// Dropping engines with transfers in flight over the pipes ends every status and leaves no
/// shard behind.
#[test]
fn drop_with_transfers_in_flight_ends_every_status() {
    let (a, b) = pair_in_process("ip_drop", test_cfg());
    let n = 8 << 20;
    let src = random_buffer(&a, n, 9);
    let dst = b.alloc_buffer(n).unwrap();
    let sts: Vec<_> = (0..8)
        .map(|_| a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()))
        .collect();
    drop(b);
    for st in &sts {
        let code = wait_within(st, Duration::from_secs(30));
        assert!(
            code == StatusCode::Success || !st.message().is_empty(),
            "{code:?} without a message"
        );
    }
    drop(a);
}
