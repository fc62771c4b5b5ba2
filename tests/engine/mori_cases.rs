//! MORI-IO's TCP test cases (reference §3.1, §3.2) against morio: auto-bind, config
//! validation, write/read/session batch with inbound statuses, duplicate uids, reconnect,
//! lane counts versus shards, one-sided registration.

use std::time::{Duration, Instant};

use morio::{
    ConfigError, EngineDesc, EngineError, IoEngine, IoEngineConfig, MemoryDesc, StatusCode,
    TcpBackendConfig,
};

use super::common::*;

#[test]
fn tcp_engine_desc_port_zero_auto_bind() {
    let e = IoEngine::new("auto_bind", IoEngineConfig::new("127.0.0.1", 0)).unwrap();
    assert_eq!(e.engine_desc().port, 0, "no port before the backend exists");
    e.create_backend(test_cfg()).unwrap();
    let d = e.engine_desc();
    assert!(
        d.port > 0,
        "port 0 must bind an ephemeral port, desc says {}",
        d.port
    );
    assert_eq!(d.key, "auto_bind");
    assert_eq!(d.host, "127.0.0.1");
    assert!(!d.node_id.is_empty() && d.pid > 0, "{d:?}");
    let back = EngineDesc::unpack(&d.pack()).unwrap();
    assert_eq!(back, d);
    // The advertised port is really listening.
    std::net::TcpStream::connect(("127.0.0.1", d.port)).expect("listener on the bound port");
    // A memory descriptor survives pack/unpack too.
    let m = e.alloc_buffer(4096).unwrap();
    assert_eq!(MemoryDesc::unpack(&m.desc().pack()).unwrap(), *m.desc());
}

#[test]
fn tcp_config_defaults_and_lane_validation() {
    let c = TcpBackendConfig::default();
    assert_eq!(c.sock_sndbuf_bytes, 32 << 20);
    assert_eq!(c.sock_rcvbuf_bytes, 32 << 20);
    assert_eq!(c.num_data_conns, 8);
    assert_eq!(c.striping_threshold_bytes, 65536);
    assert_eq!(c.op_timeout, Duration::from_secs(30));
    assert!(c.enable_keepalive && c.enable_ctrl_nodelay);
    assert_eq!(
        (c.keepalive_idle, c.keepalive_intvl, c.keepalive_cnt),
        (Duration::from_secs(30), Duration::from_secs(10), 3)
    );
    assert_eq!(c.chunk_bytes, 1 << 20);

    let e = IoEngine::new("lane_validation", IoEngineConfig::new("127.0.0.1", 0)).unwrap();
    for n in [0, 17] {
        match e.create_backend(cfg_with(|c| c.num_data_conns = n)) {
            Err(EngineError::Config(ConfigError::DataConns(got))) => assert_eq!(got, n),
            other => panic!("num_data_conns={n}: expected a config error, got {other:?}"),
        }
        // Nothing was started.
        assert_eq!(e.n_shards(), 0);
        assert_eq!(e.engine_desc().port, 0);
    }
    // The engine is still usable with a valid config, at both ends of the range.
    e.create_backend(cfg_with(|c| c.num_data_conns = 16))
        .unwrap();
    assert!(e.engine_desc().port > 0);
    let f = engine("lane_validation_one", cfg_with(|c| c.num_data_conns = 1));
    assert!(f.n_shards() >= 1);
}

#[test]
fn tcp_cpu_write_read_and_session_batch() {
    let (a, b) = pair("cpu_wrb", test_cfg());
    let n = 4096;
    let src = random_buffer(&a, n, 10);
    let dst = b.register_buffer(random_bytes(n, 11)).unwrap();
    assert_eq!(MemoryDesc::unpack(&src.desc().pack()).unwrap(), *src.desc());
    // The descriptor travels packed, as between processes.
    let dst_md = MemoryDesc::unpack(&dst.desc().pack()).unwrap();

    let uid = a.allocate_transfer_uid();
    let st = a.write(src.desc(), 0, &dst_md, 0, n, uid);
    assert_ok(&st, "write");
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "write");
    assert!(
        b.pop_inbound_transfer_status(a.key(), uid).is_none(),
        "pop is destructive"
    );

    // Read (meaningfully: the remote holds fresh data, the local buffer is overwritten).
    let fresh = random_bytes(n, 12);
    dst.write_at(0, &fresh);
    let uid = a.allocate_transfer_uid();
    let st = a.read(src.desc(), 0, &dst_md, 0, n, uid);
    assert_ok(&st, "read");
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
    assert_bytes_eq(&src.to_vec(), &fresh, "read");

    // Session batch_write: offsets [0,256,512,768], 128 bytes each.
    let fresh_src = random_bytes(n, 13);
    src.write_at(0, &fresh_src);
    let before = dst.to_vec();
    let sess = a.create_session(src.desc(), &dst_md).expect("session");
    assert!(sess.alive());
    let offs = [0, 256, 512, 768];
    let uid = sess.allocate_transfer_uid();
    let st = sess.batch_write(&offs, &offs, &[128; 4], uid);
    assert_ok(&st, "session batch_write");
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
    let mut want = before;
    for o in offs {
        want[o..o + 128].copy_from_slice(&fresh_src[o..o + 128]);
    }
    assert_bytes_eq(
        &dst.to_vec(),
        &want,
        "session batch_write (segments and gaps)",
    );
}

/// MORI's odd-size, non-adjacent batch (BATCH_WRITE_REQ there), written and then read back.
fn odd_batch(prefix: &str, cfg: TcpBackendConfig) {
    let (a, b) = pair(prefix, cfg);
    let n = 4096;
    let offs = [0usize, 1024, 2048, 3072];
    let sizes = [511usize, 509, 507, 505];
    let src = random_buffer(&a, n, 20);
    let dst = b.register_buffer(random_bytes(n, 21)).unwrap();
    let mut model = dst.to_vec();
    let sess = a.create_session(src.desc(), dst.desc()).unwrap();

    let uid = sess.allocate_transfer_uid();
    let st = sess.batch_write(&offs, &offs, &sizes, uid);
    assert_ok(&st, "batch_write");
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
    let s = src.to_vec();
    for (&o, &z) in offs.iter().zip(&sizes) {
        model[o..o + z].copy_from_slice(&s[o..o + z]);
    }
    assert_bytes_eq(&dst.to_vec(), &model, "batch_write");

    // Fresh remote data, read into a local buffer whose gaps must stay as they were.
    let fresh = random_bytes(n, 22);
    dst.write_at(0, &fresh);
    let local_before = random_bytes(n, 23);
    src.write_at(0, &local_before);
    let uid = sess.allocate_transfer_uid();
    let st = sess.batch_read(&offs, &offs, &sizes, uid);
    assert_ok(&st, "batch_read");
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
    let mut want = local_before;
    for (&o, &z) in offs.iter().zip(&sizes) {
        want[o..o + z].copy_from_slice(&fresh[o..o + z]);
    }
    assert_bytes_eq(&src.to_vec(), &want, "batch_read");
}

#[test]
fn odd_size_non_adjacent_session_batch() {
    odd_batch("odd_batch", test_cfg());
}

#[test]
fn odd_size_non_adjacent_session_batch_everything_striped() {
    // MORI's C++ transport test config: 4 connections, threshold 1 byte, 5 s timeout.
    odd_batch(
        "odd_batch_striped",
        cfg_with(|c| {
            c.num_data_conns = 4;
            c.striping_threshold_bytes = 1;
            c.op_timeout = Duration::from_secs(5);
        }),
    );
}

#[test]
fn duplicate_peer_op_id_only_fails_new_submission() {
    let (a, b) = pair("dup_uid", test_cfg());
    let big = 64 << 20;
    let src = a.register_buffer(random_big(big, 30)).unwrap();
    let dst = b.alloc_buffer(big).unwrap();
    let small_src = random_buffer(&a, 4096, 31);
    let small_dst = b.alloc_buffer(4096).unwrap();

    let uid = a.allocate_transfer_uid();
    let first = a.write(src.desc(), 0, dst.desc(), 0, big, uid);
    let second = a.write(small_src.desc(), 0, small_dst.desc(), 0, 4096, uid);
    assert_eq!(
        wait(&second),
        StatusCode::ErrBadState,
        "{}",
        second.message()
    );
    assert_ok(&first, "first transfer with the uid");
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "first transfer");
    assert!(
        small_dst.to_vec().iter().all(|&x| x == 0),
        "the refused duplicate wrote bytes"
    );
    // Once the first is done, the uid may be used again.
    let again = a.write(small_src.desc(), 0, small_dst.desc(), 0, 4096, uid);
    assert_ok(&again, "uid reused after completion");
    assert_bytes_eq(&small_dst.to_vec(), &small_src.to_vec(), "reuse");
}

#[test]
fn read_response_and_write_payload_may_share_op_id() {
    let (a, b) = pair("share_uid", test_cfg());
    let n = 4 << 20;
    let uid = 777;
    // a reads b_src into a_dst; b writes b_out into a_in; both with uid 777.
    let b_src = b.register_buffer(random_big(n, 40)).unwrap();
    let a_dst = a.alloc_buffer(n).unwrap();
    let b_out = b.register_buffer(random_big(n, 41)).unwrap();
    let a_in = a.alloc_buffer(n).unwrap();
    let r = a.read(a_dst.desc(), 0, b_src.desc(), 0, n, uid);
    let w = b.write(b_out.desc(), 0, a_in.desc(), 0, n, uid);
    assert_ok(&r, "a reads from b");
    assert_ok(&w, "b writes to a");
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
    assert_eq!(inbound(&a, b.key(), uid), StatusCode::Success);
    assert_bytes_eq(&a_dst.to_vec(), &b_src.to_vec(), "read");
    assert_bytes_eq(&a_in.to_vec(), &b_out.to_vec(), "write");
}

#[test]
fn peer_abort_allows_next_operation_to_reconnect() {
    let cfg = cfg_with(|c| {
        c.op_timeout = Duration::from_millis(500);
        c.num_data_conns = 2;
    });
    let a = engine("reconnect_a", cfg.clone());
    let b = engine("reconnect_b", cfg);
    // a knows b at a port nothing listens on.
    a.register_remote_engine(&desc_at(b.key(), closed_port()))
        .unwrap();
    let src = random_buffer(&a, 4096, 50);
    let dst = b.alloc_buffer(4096).unwrap();
    let t = Instant::now();
    let st = a.write(
        src.desc(),
        0,
        dst.desc(),
        0,
        4096,
        a.allocate_transfer_uid(),
    );
    let c = wait_within(&st, Duration::from_secs(3));
    assert!(c.is_error(), "write to a closed port ended with {c}");
    assert!(t.elapsed() < Duration::from_secs(3));
    assert!(dst.to_vec().iter().all(|&x| x == 0));

    // The real descriptor: the next transfers dial afresh and succeed.
    a.register_remote_engine(&b.engine_desc()).unwrap();
    let uid = a.allocate_transfer_uid();
    let st = a.write(src.desc(), 0, dst.desc(), 0, 4096, uid);
    assert_ok(&st, "write after re-registering");
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "write after reconnect");
    // A striped transfer uses both lanes.
    let big_src = a.register_buffer(random_big(1 << 20, 51)).unwrap();
    let big_dst = b.alloc_buffer(1 << 20).unwrap();
    let st = a.write(
        big_src.desc(),
        0,
        big_dst.desc(),
        0,
        1 << 20,
        a.allocate_transfer_uid(),
    );
    assert_ok(&st, "striped write after reconnect");
    assert_bytes_eq(
        &big_dst.to_vec(),
        &big_src.to_vec(),
        "striped write after reconnect",
    );
}

/// 8 MiB striped write then read, verified, between engines with the given configs.
fn striped_round_trip(prefix: &str, cfg_a: TcpBackendConfig, cfg_b: TcpBackendConfig) {
    let a = engine(&format!("{prefix}_a"), cfg_a);
    let b = engine(&format!("{prefix}_b"), cfg_b);
    a.register_remote_engine(&b.engine_desc()).unwrap();
    let n = 8 << 20;
    let src = a.register_buffer(random_big(n, 60)).unwrap();
    let dst = b.alloc_buffer(n).unwrap();
    let uid = a.allocate_transfer_uid();
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, n, uid),
        "striped write",
    );
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "striped write");
    let fresh = random_big(n, 61);
    dst.write_at(0, &fresh);
    let back = a.alloc_buffer(n).unwrap();
    let uid = a.allocate_transfer_uid();
    assert_ok(
        &a.read(back.desc(), 0, dst.desc(), 0, n, uid),
        "striped read",
    );
    assert_eq!(inbound(&b, a.key(), uid), StatusCode::Success);
    assert_bytes_eq(&back.to_vec(), &fresh, "striped read");
}

fn lanes_shards(conns: usize, shards: usize) -> TcpBackendConfig {
    cfg_with(|c| {
        c.num_data_conns = conns;
        c.num_shards = Some(shards);
    })
}

#[test]
fn sixteen_lanes_on_two_shards() {
    striped_round_trip("lanes16", lanes_shards(16, 2), lanes_shards(16, 2));
}

#[test]
fn three_lanes_on_two_shards() {
    striped_round_trip("lanes3", lanes_shards(3, 2), lanes_shards(3, 2));
}

#[test]
fn one_lane() {
    striped_round_trip("lanes1", lanes_shards(1, 2), lanes_shards(1, 2));
}

#[test]
fn sixteen_lanes_into_a_one_shard_one_lane_target() {
    // The target serves every declared lane whatever its own config says.
    striped_round_trip("lanes_mixed", lanes_shards(16, 2), lanes_shards(1, 1));
}

#[test]
fn target_that_never_registered_the_initiator() {
    let a = engine("oneway_a", test_cfg());
    let b = engine("oneway_b", test_cfg());
    a.register_remote_engine(&b.engine_desc()).unwrap();
    for n in [4096usize, 3 << 20] {
        let src = a.register_buffer(random_big(n, 70)).unwrap();
        let dst = b.alloc_buffer(n).unwrap();
        let uid = a.allocate_transfer_uid();
        assert_ok(&a.write(src.desc(), 0, dst.desc(), 0, n, uid), "write");
        assert_eq!(inbound(&b, "oneway_a", uid), StatusCode::Success);
        assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "write");
        let fresh = random_big(n, 71);
        dst.write_at(0, &fresh);
        let uid = a.allocate_transfer_uid();
        assert_ok(&a.read(src.desc(), 0, dst.desc(), 0, n, uid), "read");
        assert_eq!(inbound(&b, "oneway_a", uid), StatusCode::Success);
        assert_bytes_eq(&src.to_vec(), &fresh, "read");
    }
    // b cannot initiate towards a: it does not know a.
    let x = b.alloc_buffer(16).unwrap();
    let y = a.alloc_buffer(16).unwrap();
    let st = b.write(x.desc(), 0, y.desc(), 0, 16, b.allocate_transfer_uid());
    assert_eq!(st.code(), StatusCode::ErrNotFound, "{}", st.message());
}
