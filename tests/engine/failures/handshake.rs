//! Hostile clients before and at the handshake: garbage bytes, a half or missing HELLO
//! (closed after `handshake_timeout`), HELLOs refused with a code, a duplicate HELLO, and a
//! dialer of a later version answered with this one.

use std::io::Write;
use std::time::{Duration, Instant};

use morio::proto::codes;
use morio::proto::frame::{Frame, Hello};
use morio::proto::limits::{HEADER_BYTES, MIN_VERSION, VERSION};

use super::raw::*;
use crate::common::*;

#[test]
fn hostile_garbage_bytes() {
    let (a, b) = hostile_pair("hostile_garbage");
    let mut s = raw_connect(b.engine_desc().port);
    let mut junk = random_bytes(1000, 40);
    junk[0] = 0; // not the frame magic
    let _ = s.write_all(&junk);
    normal_traffic(&a, &b);
    let (got, _) = read_until_closed(&mut s, CLOSE_LIMIT);
    assert!(got.is_empty(), "answered garbage with {} bytes", got.len());
}

#[test]
fn hostile_half_hello_is_closed_after_handshake_timeout() {
    let (a, b) = hostile_pair("hostile_half");
    let h = hello("hostile_half_client", b.key());
    let t = Instant::now();
    let mut s = raw_connect(b.engine_desc().port);
    s.write_all(&h[..h.len() / 2]).unwrap();
    // The accept loop is not blocked by the stalled handshake.
    normal_traffic(&a, &b);
    let (got, _) = read_until_closed(&mut s, CLOSE_LIMIT);
    let el = t.elapsed();
    assert!(got.is_empty());
    assert!(
        el >= Duration::from_millis(250),
        "closed before handshake_timeout: {el:?}"
    );
    // Same for a connection that says nothing at all.
    let t = Instant::now();
    let mut s = raw_connect(b.engine_desc().port);
    let _ = read_until_closed(&mut s, CLOSE_LIMIT);
    assert!(t.elapsed() >= Duration::from_millis(250));
}

#[test]
fn hostile_bad_hellos_are_refused_with_a_code() {
    let (a, b) = hostile_pair("hostile_refused");
    let port = b.engine_desc().port;
    let bad = |version, lane, n_lanes, src: &str, dst: &str| {
        encode(
            &Frame::Hello(Hello {
                version,
                lane,
                n_lanes,
                src_key: src.into(),
                dst_key: dst.into(),
                instance: 1,
                nonce: [3; 16],
                host_tag: None,
            }),
            0,
        )
    };
    let cases = [
        (
            "wrong dst key",
            bad(VERSION, 0, 1, "x", "not_b"),
            Some(codes::ERR_NOT_FOUND),
        ),
        ("lane >= n_lanes", bad(VERSION, 2, 2, "x", b.key()), None),
        ("17 lanes", bad(VERSION, 0, 17, "x", b.key()), None),
        (
            "a version older than any this build speaks",
            bad(MIN_VERSION - 1, 0, 1, "x", b.key()),
            None,
        ),
        ("empty src key", bad(VERSION, 0, 1, "", b.key()), None),
    ];
    let mut conns = Vec::new();
    for (what, bytes, _) in &cases {
        let mut s = raw_connect(port);
        s.write_all(bytes).unwrap_or_else(|e| panic!("{what}: {e}"));
        conns.push(s);
    }
    normal_traffic(&a, &b);
    for ((what, _, want), mut s) in cases.into_iter().zip(conns) {
        let (got, _) = read_until_closed(&mut s, CLOSE_LIMIT);
        let frames = parse_frames(&got);
        match frames.as_slice() {
            [Frame::HelloAck(ack)] => {
                assert_ne!(ack.code, codes::SUCCESS, "{what}: accepted");
                if let Some(code) = want {
                    assert_eq!(ack.code, code, "{what}: {ack:?}");
                }
            }
            other => panic!("{what}: expected one HELLO_ACK, got {other:?}"),
        }
    }
}

#[test]
fn hostile_duplicate_hello_closes_the_connection() {
    let (a, b) = hostile_pair("hostile_dup_hello");
    let mut s = handshaken(&b, "hostile_dup_client");
    s.write_all(&hello("hostile_dup_client", b.key())).unwrap();
    normal_traffic(&a, &b);
    let (got, _) = read_until_closed(&mut s, CLOSE_LIMIT);
    for f in parse_frames(&got) {
        assert!(matches!(f, Frame::GoAway { .. }), "unexpected {f:?}");
    }
}

/// A dialer of a later version (its HELLO offers version + 1 and carries a field this build
/// does not know) is answered with this version, which the connection then speaks: a fleet
/// upgrades node by node.
#[test]
fn a_newer_dialer_is_answered_with_this_version() {
    let (a, b) = hostile_pair("newer_dialer");
    let port = b.engine_desc().port;
    let mut bytes = encode(
        &Frame::Hello(Hello {
            version: VERSION + 1,
            lane: 0,
            n_lanes: 1,
            src_key: "newer".into(),
            dst_key: b.key().into(),
            instance: 5,
            nonce: [9; 16],
            host_tag: None,
        }),
        0,
    );
    bytes.extend_from_slice(&[0xAB; 12]);
    let body = (bytes.len() - HEADER_BYTES) as u32;
    bytes[4..8].copy_from_slice(&body.to_le_bytes());
    let mut s = raw_connect(port);
    s.write_all(&bytes).unwrap();
    match read_frame(&mut s, Duration::from_secs(10)) {
        Frame::HelloAck(ack) => assert_eq!((ack.code, ack.version), (codes::SUCCESS, VERSION)),
        f => panic!("expected HELLO_ACK, got {f:?}"),
    }
    normal_traffic(&a, &b);
}
