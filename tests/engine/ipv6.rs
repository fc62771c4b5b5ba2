//! Engines on IPv6 loopback (`::1`): every transfer shape over TCP and over the same-host
//! transport, engines of the two address families together, descriptors and addresses that
//! name IPv6 hosts. Skipped, with a line saying so, where the machine has no `::1`.

use morio::{EngineDesc, IoEngine, IoEngineConfig, SameHost};

use crate::common::*;
use crate::same_host::round_trips;

/// Whether this machine has IPv6 loopback (containers may turn IPv6 off).
fn v6_loopback() -> bool {
    match std::net::TcpListener::bind("[::1]:0") {
        Ok(_) => true,
        Err(e) => {
            eprintln!("skipped: no IPv6 loopback here ([::1]:0: {e})");
            false
        }
    }
}

fn pair_at(prefix: &str, hosts: [&str; 2], mode: SameHost) -> (IoEngine, IoEngine) {
    let cfg = cfg_with(|c| c.same_host = Some(mode));
    let a = engine_at(&format!("{prefix}_a"), hosts[0], cfg.clone());
    let b = engine_at(&format!("{prefix}_b"), hosts[1], cfg);
    a.register_remote_engine(&b.engine_desc()).unwrap();
    b.register_remote_engine(&a.engine_desc()).unwrap();
    (a, b)
}

/// Small (express), medium, striped and batched writes and reads between two engines on
/// `::1`, verified byte for byte, over TCP and over the same-host transport; the target
/// learns of each transfer.
#[test]
fn engines_on_ipv6_loopback_move_every_shape_over_both_transports() {
    if !v6_loopback() {
        return;
    }
    for (mode, same_host) in [(SameHost::Off, false), (SameHost::Require, true)] {
        let (a, b) = pair_at(&format!("v6_{same_host}"), ["::1", "::1"], mode);
        let d = b.engine_desc();
        assert_eq!(d.host, "::1");
        assert_eq!(d.address(), format!("[::1]:{}", d.port));
        round_trips(&a, &b, 11);
        let t = a.stats().unwrap().total();
        assert!(t.lane_connects >= 1, "{t:?}");
        let want = if same_host { t.lane_connects } else { 0 };
        assert_eq!(t.lane_connects_same_host, want, "{mode:?}: {t:?}");
        assert_eq!(t.lane_failures, 0, "{t:?}");
        // A small write's inbound status at the target, as over IPv4.
        let src = random_buffer(&a, 64, 5);
        let dst = b.alloc_buffer(64).unwrap();
        let uid = a.allocate_transfer_uid();
        assert_ok(&a.write(src.desc(), 0, dst.desc(), 0, 64, uid), "8 B write");
        assert_eq!(inbound(&b, a.key(), uid), morio::StatusCode::Success);
    }
}

/// An engine on `127.0.0.1` and one on `::1` write to each other: each dials the other's
/// address, whatever family it listens on itself.
#[test]
fn an_ipv4_engine_and_an_ipv6_engine_reach_each_other() {
    if !v6_loopback() {
        return;
    }
    let (a, b) = pair_at("v46", ["127.0.0.1", "::1"], SameHost::Off);
    round_trips(&a, &b, 12);
    round_trips(&b, &a, 13);
}

/// A host in brackets (`[::1]`, as in `HOST:PORT`) is taken in the engine's config and in a
/// peer's descriptor, and the engine advertises the bare address.
#[test]
fn bracketed_ipv6_hosts_are_accepted_and_advertised_bare() {
    if !v6_loopback() {
        return;
    }
    let a = engine_at("v6br_a", "[::1]", test_cfg());
    let b = engine_at("v6br_b", "::1", test_cfg());
    assert_eq!(a.engine_desc().host, "::1");
    let mut d: EngineDesc = b.engine_desc();
    d.host = "[::1]".into();
    // Through the packed bytes, as descriptors travel.
    let d = EngineDesc::unpack(&d.pack()).unwrap();
    a.register_remote_engine(&d).unwrap();
    b.register_remote_engine(&a.engine_desc()).unwrap();
    let src = random_buffer(&a, 1 << 20, 3);
    let dst = b.alloc_buffer(1 << 20).unwrap();
    let uid = a.allocate_transfer_uid();
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, 1 << 20, uid),
        "1 MiB write",
    );
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "1 MiB write");
    // Not addresses: a clear error, not a panic or a hang.
    for bad in ["[127.0.0.1]", "[::1", "::1]:80", "[::1]:80"] {
        let e = IoEngine::new("v6bad", IoEngineConfig::new(bad, 0)).unwrap_err();
        assert!(
            e.to_string().contains("not a numeric IP address"),
            "{bad}: {e}"
        );
    }
}
