//! Core cases: write, read (truly verified), batch, session, with inbound statuses.

use std::time::Duration;

use super::common::*;
use morio::{IoEngine, IoEngineConfig, StatusCode};

/// A target listening on every interface (MORI's default empty host) advertises an address
/// its peers can dial, and they do.
#[test]
fn a_target_on_every_interface_is_reachable_by_its_descriptor() {
    let b = IoEngine::new("anyhost_b", IoEngineConfig::new("", 0)).unwrap();
    b.create_backend(test_cfg()).unwrap();
    let desc = b.engine_desc();
    assert!(!desc.host.is_empty(), "{desc:?}");
    let a = engine("anyhost_a", test_cfg());
    a.register_remote_engine(&morio::EngineDesc::unpack(&desc.pack()).unwrap())
        .unwrap();
    let n = 64 << 10;
    let src = random_buffer(&a, n, 7);
    let dst = b.alloc_buffer(n).unwrap();
    let st = a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid());
    assert_eq!(wait(&st), StatusCode::Success, "{}", st.message());
    assert_eq!(src.to_vec(), dst.to_vec());
}

#[test]
fn write_then_read_verified() {
    let (a, b) = pair("wr", test_cfg());
    let n = 4096;
    let src = random_buffer(&a, n, 1);
    let dst = b.alloc_buffer(n).unwrap();
    let uid = a.allocate_transfer_uid();
    let st = a.write(src.desc(), 0, dst.desc(), 0, n, uid);
    assert_eq!(wait(&st), StatusCode::Success, "{}", st.message());
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
    assert_eq!(src.to_vec(), dst.to_vec());
    // Read back fresh data: change the remote, zero the local, read, compare to the remote.
    let fresh = random_bytes(n, 2);
    dst.write_at(0, &fresh);
    let back = a.alloc_buffer(n).unwrap();
    let uid = a.allocate_transfer_uid();
    let st = a.read(back.desc(), 0, dst.desc(), 0, n, uid);
    assert_eq!(wait(&st), StatusCode::Success, "{}", st.message());
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
    assert_eq!(back.to_vec(), fresh);
}

#[test]
fn stats_count_transfers_bytes_and_latency() {
    let (a, b) = pair("stats", test_cfg());
    assert!(
        IoEngine::new("nobackend", IoEngineConfig::new("127.0.0.1", 0))
            .unwrap()
            .stats()
            .is_none()
    );
    let n = 3 << 20;
    let src = random_buffer(&a, n, 11);
    let dst = b.alloc_buffer(n).unwrap();
    let st = a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid());
    assert_eq!(wait(&st), StatusCode::Success);
    let st = a.read(
        src.desc(),
        0,
        dst.desc(),
        0,
        4096,
        a.allocate_transfer_uid(),
    );
    assert_eq!(wait(&st), StatusCode::Success);
    let bad = a.write(
        src.desc(),
        0,
        dst.desc(),
        0,
        n + 1,
        a.allocate_transfer_uid(),
    );
    assert_eq!(wait(&bad), StatusCode::ErrInvalidArgs);
    let sa = a.stats().unwrap();
    assert_eq!(sa.shards.len(), a.n_shards());
    assert_eq!(a.shard_cpus().len(), a.n_shards());
    let ta = sa.total();
    assert_eq!(
        (ta.transfers_ok, ta.transfers_failed),
        (2, 0),
        "argument errors never reach a shard"
    );
    assert_eq!((ta.bytes_sent, ta.bytes_received), (n as u64, 4096));
    assert_eq!(ta.latency_us.len(), 2);
    let tb = b.stats().unwrap().total();
    assert_eq!(
        (tb.inbound_bytes_written, tb.inbound_bytes_read),
        (n as u64, 4096)
    );
    // The target received the written bytes and sent the read ones: its bytes_* count them.
    assert_eq!((tb.bytes_received, tb.bytes_sent), (n as u64, 4096));
    assert_eq!(tb.inbound_transfers, 2);
}

/// An engine behind an address translation advertises where peers reach it: it listens on
/// every interface, its descriptor names 127.0.0.3 (or a name), and peers dial that.
#[test]
fn a_descriptor_carries_the_advertised_host_and_peers_dial_it() {
    let cfg = IoEngineConfig {
        advertise_host: Some("127.0.0.3".into()),
        ..IoEngineConfig::new("", 0)
    };
    let b = IoEngine::new("adv_b", cfg).unwrap();
    b.create_backend(test_cfg()).unwrap();
    assert_eq!(b.engine_desc().host, "127.0.0.3");
    let a = engine("adv_a", test_cfg());
    a.register_remote_engine(&b.engine_desc()).unwrap();
    let n = 64 << 10;
    let src = random_buffer(&a, n, 5);
    let dst = b.alloc_buffer(n).unwrap();
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()),
        "to the advertised address",
    );
    assert_eq!(dst.to_vec(), src.to_vec());
    // A name is resolved when the descriptor is registered (from /etc/hosts here: tests ask
    // no outside resolver).
    let mut named = b.engine_desc();
    named.host = "localhost".into();
    a.register_remote_engine(&named).unwrap();
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()),
        "to the advertised name",
    );
    // An empty advertised host is refused at once.
    let bad = IoEngineConfig {
        advertise_host: Some(String::new()),
        ..IoEngineConfig::new("127.0.0.1", 0)
    };
    assert!(IoEngine::new("adv_bad", bad).is_err());
}

/// Lanes are counted as they connect and as they fail; a close on purpose (a deregistered
/// peer) is not a failure.
#[test]
fn lane_connects_and_failures_are_counted() {
    let (a, b) = pair("lanes_counted", test_cfg());
    let n = 4096;
    let src = random_buffer(&a, n, 3);
    let dst = b.alloc_buffer(n).unwrap();
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()),
        "write",
    );
    let t = a.stats().unwrap().total();
    assert!(t.lane_connects >= 1, "{t:?}");
    assert_eq!(t.lane_failures, 0, "{t:?}");
    // Deregistering the peer closes its lanes on purpose.
    a.deregister_remote_engine(&b.engine_desc());
    a.register_remote_engine(&b.engine_desc()).unwrap();
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()),
        "write after re-registering",
    );
    let t = a.stats().unwrap().total();
    assert_eq!(t.lane_failures, 0, "a close on purpose counted: {t:?}");
    assert!(t.lane_connects >= 2, "{t:?}");
    // The peer goes away: the next transfer's lane fails (its dial, or its connection).
    b.remove_backend(morio::BackendType::Tcp).unwrap();
    let st = a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid());
    assert_ne!(wait(&st), StatusCode::Success);
    let t = a.stats().unwrap().total();
    assert!(t.lane_failures >= 1, "{t:?}");
}

/// The target times every chunk it serves: one sample per chunk of every write and read,
/// in its stats and its metrics.
#[test]
fn inbound_chunks_are_timed() {
    let (a, b) = pair(
        "inbound_timed",
        cfg_with(|c| {
            c.chunk_bytes = 1 << 20;
            c.same_host_chunk_bytes = 1 << 20;
            c.num_data_conns = 2;
        }),
    );
    let n = 8 << 20;
    let src = random_buffer(&a, n, 21);
    let dst = b.alloc_buffer(n).unwrap();
    let back = a.alloc_buffer(n).unwrap();
    let count = |e: &morio::IoEngine| e.stats().unwrap().total().inbound_latency_us.len();
    assert_eq!(count(&b), 0);
    assert_ok(
        &a.write(
            src.desc(),
            0,
            dst.desc(),
            0,
            4096,
            a.allocate_transfer_uid(),
        ),
        "small write",
    );
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()),
        "striped write",
    );
    assert_ok(
        &a.read(back.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()),
        "striped read",
    );
    // 1 + 8 + 8 chunks; the target records a read's chunk once its data is queued, which
    // may be a moment after the initiator saw it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while count(&b) < 17 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(count(&b), 17, "{:?}", b.stats().unwrap().total());
    assert_eq!(count(&a), 0, "the initiator served nothing");
    let text = b.metrics_text();
    assert!(
        text.contains("morio_inbound_chunk_latency_seconds_count"),
        "{text}"
    );
}

/// The target waits for a transfer's inbound status instead of polling: it returns when the
/// transfer ends there, with its code; a uid that never comes is `None` at the timeout.
#[test]
fn the_target_waits_for_an_inbound_status() {
    let (a, b) = pair("inbound_wait", test_cfg());
    let n = 1 << 20;
    let src = random_buffer(&a, n, 4);
    let dst = b.alloc_buffer(n).unwrap();
    let uid = a.allocate_transfer_uid();
    std::thread::scope(|sc| {
        let waiter = sc.spawn(|| {
            b.wait_inbound_transfer_status(a.key(), uid, Duration::from_secs(20))
                .map(|s| s.code())
        });
        std::thread::sleep(Duration::from_millis(50));
        assert_ok(&a.write(src.desc(), 0, dst.desc(), 0, n, uid), "write");
        assert_eq!(waiter.join().unwrap(), Some(StatusCode::Success));
    });
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "write");
    let t0 = std::time::Instant::now();
    let none = b.wait_inbound_transfer_status(a.key(), uid + 1000, Duration::from_millis(150));
    assert!(none.is_none());
    assert!(
        t0.elapsed() >= Duration::from_millis(150),
        "{:?}",
        t0.elapsed()
    );
}
