//! Discovery on a plain etcd: an unreachable one is a clear error; engines publish under a
//! lease, are looked up and watched, move data and are forgotten when their lease goes
//! (over IPv4 and IPv6); watchers that connect peers open their lanes first.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use morio::discovery::{Discovery, DiscoveryError, DiscoveryOptions};
use morio::{StatusCode, TcpBackendConfig};

use crate::common::{engine, engine_at, filled, write_to};
use crate::server::{free_port, Etcd};

#[test]
fn unreachable_etcd_is_a_clear_error_within_the_connect_timeout() {
    let port = free_port(); // nothing listens there now
    let t0 = Instant::now();
    let o = DiscoveryOptions {
        connect_timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let e = Discovery::connect_with(&[format!("127.0.0.1:{port}")], "/morio", o).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(matches!(e, DiscoveryError::Unreachable { .. }), "{e:?}");
    assert!(e.to_string().contains(&port.to_string()), "{e}");
}

#[test]
fn engines_publish_are_watched_move_data_and_are_forgotten_when_their_lease_goes() {
    let etcd = Etcd::start();
    let n = 256 << 10;
    let (a, b, c) = (engine("disc_a"), engine("disc_b"), engine("disc_c"));
    let (ra, rb) = (a.alloc_buffer(n).unwrap(), b.alloc_buffer(n).unwrap());
    let da = etcd.connect("/t1");
    da.publish(&a, &[("kv", ra.desc())]).unwrap();
    let db = etcd.connect("/t1");
    db.publish(&b, &[("kv", rb.desc())]).unwrap();
    assert!(matches!(
        db.publish(&b, &[("a/b", rb.desc())]),
        Err(DiscoveryError::RegionName(_))
    ));
    // Engine keys with '/' would make one engine's keys look like another's.
    let slashed = engine("disc/slashed");
    assert!(matches!(
        db.publish(&slashed, &[]),
        Err(DiscoveryError::EngineKey(_))
    ));
    assert!(matches!(
        db.lookup("disc/slashed"),
        Err(DiscoveryError::EngineKey(_))
    ));

    // Lookups see what was published.
    let dc = etcd.connect("/t1");
    assert_eq!(dc.lookup("disc_a").unwrap(), Some(a.engine_desc()));
    assert_eq!(dc.lookup("nobody").unwrap(), None);
    let regions = dc.regions("disc_b").unwrap();
    assert_eq!(regions.len(), 1);
    assert_eq!(regions[0].0, "kv");
    assert_eq!(&regions[0].1, rb.desc());

    // The watcher registers both peers on c; data moves, verified.
    dc.watch(&c).unwrap();
    let src = filled(&c, n, 7);
    assert_eq!(write_to(&dc, &c, &src, "disc_a"), StatusCode::Success);
    assert_eq!(write_to(&dc, &c, &src, "disc_b"), StatusCode::Success);
    assert_eq!(ra.to_vec(), src.to_vec());
    assert_eq!(rb.to_vec(), src.to_vec());
    let a_region = dc.regions("disc_a").unwrap().remove(0).1;

    // a's handle goes (its lease is revoked): c forgets a within the TTL; b still works.
    drop(da);
    let t0 = Instant::now();
    loop {
        let st = c.write(src.desc(), 0, &a_region, 0, n, c.allocate_transfer_uid());
        st.wait_for(Duration::from_secs(10));
        if st.code() != StatusCode::Success {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "c still reaches a {:?} after a's lease went",
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(dc.lookup("disc_a").unwrap(), None);
    assert!(dc.regions("disc_a").unwrap().is_empty());
    assert_eq!(write_to(&dc, &c, &src, "disc_b"), StatusCode::Success);

    // a restarts (a new engine, a new port, new regions): c registers it again.
    drop(ra);
    drop(a);
    let a2 = engine("disc_a");
    let ra2 = a2.alloc_buffer(n).unwrap();
    let da2 = etcd.connect("/t1");
    da2.publish(&a2, &[("kv", ra2.desc())]).unwrap();
    let t0 = Instant::now();
    while write_to(&dc, &c, &src, "disc_a") != StatusCode::Success {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "restarted a unreachable"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(ra2.to_vec(), src.to_vec());
    da2.close().unwrap();
    drop(db);
}

/// An etcd on IPv6 loopback (`[::1]:port` endpoints) and engines on `::1`: published,
/// looked up and watched as on IPv4, and the watcher's engine moves verified bytes to both.
#[test]
fn discovery_works_over_ipv6() {
    if TcpListener::bind("[::1]:0").is_err() {
        eprintln!("skipped: no IPv6 loopback here");
        return;
    }
    let etcd = Etcd::start_v6();
    assert!(etcd.endpoint.starts_with("[::1]:"), "{}", etcd.endpoint);
    let n = 64 << 10;
    let (a, b) = (
        engine_at("disc6_a", "::1"),
        engine_at("disc6_b", "127.0.0.1"),
    );
    let c = engine_at("disc6_c", "::1");
    let (ra, rb) = (a.alloc_buffer(n).unwrap(), b.alloc_buffer(n).unwrap());
    let da = etcd.connect("/t6");
    da.publish(&a, &[("kv", ra.desc())]).unwrap();
    let db = etcd.connect("/t6");
    db.publish(&b, &[("kv", rb.desc())]).unwrap();
    let dc = etcd.connect("/t6");
    let found = dc.lookup("disc6_a").unwrap().expect("a published");
    assert_eq!(
        (found.host.as_str(), found.address()),
        ("::1", format!("[::1]:{}", found.port))
    );
    dc.watch(&c).unwrap();
    let src = filled(&c, n, 9);
    assert_eq!(write_to(&dc, &c, &src, "disc6_a"), StatusCode::Success);
    assert_eq!(write_to(&dc, &c, &src, "disc6_b"), StatusCode::Success);
    assert_eq!(ra.to_vec(), src.to_vec());
    assert_eq!(rb.to_vec(), src.to_vec());
    da.close().unwrap();
    drop(db);
}

/// With `connect_peers`, the watcher opens every connection to each peer it registers,
/// before any transfer: one already published (the snapshot) and one that appears later.
#[test]
fn watchers_that_connect_peers_open_their_lanes_before_any_transfer() {
    let etcd = Etcd::start();
    let (a, b, c) = (engine("conn_a"), engine("conn_b"), engine("conn_c"));
    let da = etcd.connect("/t9");
    da.publish(&a, &[]).unwrap();
    let o = DiscoveryOptions {
        connect_peers: true,
        ..etcd.options()
    };
    let dc = Discovery::connect_with(&[&etcd.endpoint], "/t9", o).unwrap();
    dc.publish(&c, &[]).unwrap();
    dc.watch(&c).unwrap();
    let lanes = TcpBackendConfig::default().num_data_conns as u64;
    let up_to = |peer: &str| {
        c.stats()
            .unwrap()
            .per_peer()
            .get(peer)
            .map_or(0, |p| p.lane_connects)
    };
    let wait_for = |peer: &str| {
        let t0 = Instant::now();
        while up_to(peer) < lanes {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{} of {lanes} lanes to {peer} after {:?}",
                up_to(peer),
                t0.elapsed()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for("conn_a");
    let db = etcd.connect("/t9");
    db.publish(&b, &[]).unwrap();
    wait_for("conn_b");
    // Each lane once: the later put did not open a's again.
    assert_eq!(up_to("conn_a"), lanes);
    // A watcher without the option opens nothing until a transfer needs it.
    let plain = etcd.connect("/t9");
    let d = engine("conn_d");
    plain.watch(&d).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(d.stats().unwrap().total().lane_connects, 0);
    drop((da, db, dc, plain));
}
