//! The link itself: every transfer shape over IPv4 and IPv6 (and at IPv6's smallest MTU), a
//! cut link failing its transfers within the deadline and the peer reached again once it is
//! back, and a narrowed link keeping bytes whole and deadlines kept.

use std::time::{Duration, Instant};

use morio::StatusCode;

use crate::common::*;
use crate::net::Net;

/// Every shape moves verified bytes across the link over IPv4 and IPv6, at the veth's
/// 1500-byte MTU and at IPv6's smallest, 1280.
#[test]
fn engines_on_two_hosts_move_verified_bytes_over_ipv4_and_ipv6() {
    let Some(net) = Net::new() else { return };
    let (a, b) = net.pair("ns4", false, cfg(Duration::from_secs(20)));
    round_trips(&a, &b, 1);
    round_trips(&b, &a, 2);
    net.mtu(1280);
    let (c, d) = net.pair("ns6", true, cfg(Duration::from_secs(20)));
    assert_eq!(d.engine_desc().host, net.v6[1]);
    round_trips(&c, &d, 3);
    round_trips(&a, &b, 4);
    let t = a.stats().unwrap().total();
    assert_eq!(t.lane_connects_same_host, 0, "{t:?}");
    assert_eq!(t.lane_failures, 0, "{t:?}");
}

/// A link cut (every packet lost, silently; `down`: the peer's own interface goes down
/// instead) under transfers: each fails within its deadline, none hangs; when the link is back,
/// the same engines reach each other again.
#[test]
fn a_cut_link_fails_its_transfers_within_the_deadline_and_the_peer_is_reached_again() {
    for down in [false, true] {
        cut_and_mend(down);
    }
}

fn cut_and_mend(down: bool) {
    let Some(net) = Net::new() else { return };
    let deadline = Duration::from_secs(2);
    let (a, b) = net.pair("nscut", false, cfg(deadline));
    let n = 16 << 20;
    let src = filled(&a, n, 5);
    let dst = b.alloc_buffer(n).unwrap();
    // The lanes are up before the cut.
    ok(
        &a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()),
        "before the cut",
    );
    let mend = |cut: bool| {
        if down {
            net.link(1, !cut)
        } else {
            net.cut(cut)
        }
    };
    mend(true);
    let t0 = Instant::now();
    let sts = [
        a.write(src.desc(), 0, dst.desc(), 0, 8, a.allocate_transfer_uid()),
        a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()),
        a.read(
            src.desc(),
            0,
            dst.desc(),
            0,
            64 << 10,
            a.allocate_transfer_uid(),
        ),
    ];
    for (i, st) in sts.iter().enumerate() {
        let code = wait(st, "across the cut link");
        assert!(
            code as u32 > StatusCode::ERR_BEGIN,
            "transfer {i}: {code:?}"
        );
    }
    let took = t0.elapsed();
    eprintln!(
        "cut link (down {down}): failed in {took:?}: {}",
        sts[1].message()
    );
    assert!(
        took < deadline + Duration::from_secs(3),
        "transfers on a cut link took {took:?} to fail (deadline {deadline:?})"
    );
    mend(false);
    // Back: a new transfer gets through (on lanes dialed again if the old ones were given up).
    let t0 = Instant::now();
    loop {
        let st = a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid());
        if wait(&st, "after the link is back") == StatusCode::Success {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the peer is still unreachable 30 s after the link came back: {}",
            st.message()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "cut link (down {down}): reached again after {:?}",
        t0.elapsed()
    );
    assert!(
        dst.to_vec() == src.to_vec(),
        "bytes after the link came back"
    );
}

/// A link narrowed to 200 Mbit/s: a transfer that fits its deadline moves verified bytes; one
/// that cannot (64 MiB in 1 s needs 537 Mbit/s) fails within the deadline and leaves the
/// engines working.
#[test]
fn a_slow_link_keeps_bytes_whole_and_deadlines_kept() {
    let Some(net) = Net::new() else { return };
    net.rate(0, "200mbit");
    let (a, b) = net.pair("nsslow", false, cfg(Duration::from_secs(1)));
    let n = 64 << 20;
    let src = filled(&a, n, 6);
    let dst = b.alloc_buffer(n).unwrap();
    let small = 2 << 20; // about 84 ms at 200 Mbit/s
    ok(
        &a.write(
            src.desc(),
            0,
            dst.desc(),
            0,
            small,
            a.allocate_transfer_uid(),
        ),
        "2 MiB",
    );
    assert!(dst.to_vec()[..small] == src.to_vec()[..small]);
    let t0 = Instant::now();
    let st = a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid());
    let code = wait(&st, "64 MiB on a slow link");
    let took = t0.elapsed();
    eprintln!("slow link: 64 MiB {code:?} in {took:?}: {}", st.message());
    assert!(code as u32 > StatusCode::ERR_BEGIN, "{code:?} in {took:?}");
    assert!(
        took < Duration::from_secs(4),
        "failed after {took:?} against a 1 s deadline"
    );
    // The engines still work (the lane the late chunks rode may be dialed again).
    let t0 = Instant::now();
    loop {
        let st = a.write(
            src.desc(),
            0,
            dst.desc(),
            0,
            4096,
            a.allocate_transfer_uid(),
        );
        if wait(&st, "after the late transfer") == StatusCode::Success {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no transfer gets through after the late one: {}",
            st.message()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
