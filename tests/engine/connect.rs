//! A peer's connections opened ahead of its first transfer (`connect_remote_engine`): every
//! lane comes up and reports its transport, the transfers that follow dial nothing, and a
//! peer that cannot be reached, refuses this engine or never answers is an error within the
//! call's timeout.

use std::time::{Duration, Instant};

use super::common::*;
use morio::{AuthSecret, EngineError, LaneTransport, SameHost};

fn lanes(n: usize) -> morio::TcpBackendConfig {
    cfg_with(|c| c.num_data_conns = n)
}

/// Every lane comes up once, over the transport the pair uses; transfers after it open no
/// connection, and calling again changes nothing.
#[test]
fn connecting_opens_every_lane_once_before_any_transfer() {
    let (a, b) = pair("conn_all", lanes(5));
    let t = a
        .connect_remote_engine(b.key(), Duration::from_secs(10))
        .unwrap();
    assert_eq!(t.len(), 5, "{t:?}");
    let s = a.stats().unwrap().total();
    assert_eq!(s.lane_connects, 5);
    let same_host = t.iter().filter(|t| t.is_same_host()).count() as u64;
    assert_eq!(s.lane_connects_same_host, same_host, "{t:?}");
    let rings = t
        .iter()
        .filter(|t| **t == LaneTransport::SameHostRing)
        .count() as u64;
    assert_eq!(s.lane_connects_ring, rings, "{t:?}");
    // A striped write uses every lane, and dials none.
    let n = 4 << 20;
    let src = a.register_buffer(random_big(n, 1)).unwrap();
    let dst = b.alloc_buffer(n).unwrap();
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()),
        "write",
    );
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "write");
    assert_eq!(a.stats().unwrap().total().lane_connects, 5);
    let again = a
        .connect_remote_engine(b.key(), Duration::from_secs(10))
        .unwrap();
    assert_eq!(again, t);
    assert_eq!(a.stats().unwrap().total().lane_connects, 5);
}

/// Forced off and required, the lanes report the transport asked for.
#[test]
fn lanes_report_their_transport() {
    for (mode, same) in [(SameHost::Off, false), (SameHost::Require, true)] {
        let (a, b) = pair(
            &format!("conn_{mode:?}"),
            cfg_with(|c| {
                c.num_data_conns = 2;
                c.same_host = Some(mode);
            }),
        );
        let t = a
            .connect_remote_engine(b.key(), Duration::from_secs(10))
            .unwrap();
        assert_eq!(t.len(), 2);
        assert!(
            t.iter().all(|t| t.is_same_host() == same),
            "{mode:?}: {t:?}"
        );
    }
}

/// A key never registered, and an engine without its backend, are errors at once.
#[test]
fn unknown_peers_and_missing_backends_are_errors() {
    let (a, b) = pair("conn_unknown", lanes(2));
    let e = a
        .connect_remote_engine("no_such_engine", Duration::from_secs(1))
        .unwrap_err();
    assert!(
        matches!(e, EngineError::UnknownRemote(ref k) if k == "no_such_engine"),
        "{e}"
    );
    let bare =
        morio::IoEngine::new("conn_bare", morio::IoEngineConfig::new("127.0.0.1", 0)).unwrap();
    bare.register_remote_engine(&b.engine_desc()).unwrap();
    let e = bare
        .connect_remote_engine(b.key(), Duration::from_secs(1))
        .unwrap_err();
    assert!(matches!(e, EngineError::NoBackend), "{e}");
    drop(a);
}

/// Nobody listening: refused at once, the error names the peer, its address and the cause.
#[test]
fn an_unreachable_peer_is_an_error_naming_it() {
    let a = engine("conn_refused_a", lanes(3));
    // A port nobody listens on: bound, then closed.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    a.register_remote_engine(&desc_at("conn_gone", port))
        .unwrap();
    let t = Instant::now();
    let e = a
        .connect_remote_engine("conn_gone", Duration::from_secs(10))
        .unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let msg = e.to_string();
    println!("{msg}");
    assert!(matches!(e, EngineError::Connect { .. }), "{msg}");
    assert!(
        msg.contains("conn_gone") && msg.contains(&port.to_string()),
        "{msg}"
    );
    assert!(msg.to_lowercase().contains("refused"), "{msg}");
}

/// A peer with another deployment secret refuses the handshake: the error says so.
#[test]
fn a_peer_with_another_secret_is_an_error_at_connect() {
    let with = |s: &[u8]| {
        cfg_with(|c| {
            c.num_data_conns = 2;
            c.auth_secret = Some(AuthSecret::new(s));
            c.handshake_timeout = Duration::from_millis(500);
        })
    };
    let a = engine("conn_auth_a", with(b"the secret of deployment one"));
    let b = engine("conn_auth_b", with(b"the secret of deployment two"));
    a.register_remote_engine(&b.engine_desc()).unwrap();
    let e = a
        .connect_remote_engine(b.key(), Duration::from_secs(10))
        .unwrap_err();
    let msg = e.to_string();
    println!("{msg}");
    assert!(matches!(e, EngineError::Connect { .. }), "{msg}");
    assert!(msg.contains("auth"), "{msg}");
}

/// A peer that accepts but never answers: the call returns at its timeout, not the
/// engine's op_timeout, and says it is still not connected.
#[test]
fn a_silent_peer_times_out_at_the_call_s_timeout() {
    let fake = FakePeer::start("conn_silent", FakeMode::Silent);
    let a = engine(
        "conn_silent_a",
        cfg_with(|c| {
            c.num_data_conns = 2;
            c.op_timeout = Duration::from_secs(20);
        }),
    );
    a.register_remote_engine(&desc_at("conn_silent", fake.port))
        .unwrap();
    let t = Instant::now();
    let e = a
        .connect_remote_engine("conn_silent", Duration::from_millis(300))
        .unwrap_err();
    let took = t.elapsed();
    println!("{e}");
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert!(e.to_string().contains("not connected within"), "{e}");
}

/// The first transfer to a peer opens all its lanes (as MORI-IO does): the next small
/// transfers, each on another lane of its owner, find them up instead of dialing.
#[test]
fn the_first_transfer_opens_every_lane() {
    let (a, b) = pair("conn_first", lanes(6));
    let src = a.register_buffer(random_big(64, 2)).unwrap();
    let dst = b.alloc_buffer(64).unwrap();
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, 8, a.allocate_transfer_uid()),
        "8 B",
    );
    let t0 = Instant::now();
    while a.stats().unwrap().total().lane_connects < 6 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{:?}",
            a.stats().unwrap().total()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    for i in 1..8usize {
        assert_ok(
            &a.write(
                src.desc(),
                i * 8,
                dst.desc(),
                i * 8,
                8,
                a.allocate_transfer_uid(),
            ),
            "8 B",
        );
    }
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "eight writes");
    let t = a.stats().unwrap().total();
    assert_eq!((t.lane_connects, t.lane_failures), (6, 0), "{t:?}");
}

/// A peer that restarts on the same address: its lanes went down with it, and the next
/// transfer opens them all again (not one per transfer, as they come).
#[test]
fn lanes_that_went_down_are_all_opened_again_by_the_next_transfer() {
    let port = closed_port();
    let cfg = lanes(4);
    let b = morio::IoEngine::new(
        "conn_again_b",
        morio::IoEngineConfig::new("127.0.0.1", port),
    )
    .unwrap();
    b.create_backend(cfg.clone()).unwrap();
    let a = engine("conn_again_a", cfg.clone());
    a.register_remote_engine(&b.engine_desc()).unwrap();
    let src = a.register_buffer(random_big(64, 3)).unwrap();
    let dst = b.alloc_buffer(64).unwrap();
    let connects = |want: u64| {
        let t0 = Instant::now();
        while a.stats().unwrap().total().lane_connects < want {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{:?}",
                a.stats().unwrap().total()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, 8, a.allocate_transfer_uid()),
        "before",
    );
    connects(4);
    // The peer's backend goes and comes back on the same port; a's lanes see it close.
    b.remove_backend(morio::BackendType::Tcp).unwrap();
    b.create_backend(cfg).unwrap();
    assert_eq!(b.engine_desc().port, port);
    // Every lane has seen the close before the next transfer (a lane that noticed it only
    // after that transfer reopened the others would wait for the one after).
    let t0 = Instant::now();
    while a.stats().unwrap().total().lane_failures < 4 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{:?}",
            a.stats().unwrap().total()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    loop {
        let st = a.write(src.desc(), 0, dst.desc(), 0, 8, a.allocate_transfer_uid());
        if wait(&st) == morio::StatusCode::Success {
            break;
        }
        // The first write may meet a lane that has not yet seen the close.
        assert!(t0.elapsed() < Duration::from_secs(10), "{}", st.message());
    }
    connects(8);
}
