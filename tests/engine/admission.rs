//! Connection caps: a client that opens connections without a word, or one peer that opens
//! more than its share, is refused, while a legitimate peer keeps transferring.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use super::common::*;
use morio::proto::frame::Frame;
use morio::IoEngine;

fn capped(prefix: &str) -> (IoEngine, IoEngine) {
    pair(
        prefix,
        cfg_with(|c| {
            c.max_handshakes = 8;
            c.max_connections_per_peer = 4;
            c.max_connections = 64;
            c.num_data_conns = 2;
            c.handshake_timeout = Duration::from_secs(20);
        }),
    )
}

/// A verified write a -> b.
fn works(a: &IoEngine, b: &IoEngine) {
    let n = 256 << 10;
    let src = a.register_buffer(random_big(n, 1)).unwrap();
    let dst = b.alloc_buffer(n).unwrap();
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()),
        "write",
    );
    assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "written");
}

/// Whether the engine closed `s` (EOF or reset) within `limit`, having sent nothing.
fn closed_at_once(s: &mut TcpStream, limit: Duration) -> bool {
    use std::io::Read;
    s.set_read_timeout(Some(limit)).unwrap();
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(0) => true,
        Err(e) => {
            e.kind() != std::io::ErrorKind::WouldBlock && e.kind() != std::io::ErrorKind::TimedOut
        }
        Ok(_) => false,
    }
}

#[test]
fn silent_connections_beyond_max_handshakes_are_closed_at_once() {
    let (a, b) = capped("adm_silent");
    let port = b.engine_desc().port;
    // Eight silent connections fill the handshake slots (kept open)...
    let _held: Vec<TcpStream> = (0..8).map(|_| raw_connect(port)).collect();
    std::thread::sleep(Duration::from_millis(200));
    // ...so the next ones are closed at once, without waiting for handshake_timeout.
    for _ in 0..4 {
        let mut s = raw_connect(port);
        assert!(
            closed_at_once(&mut s, Duration::from_secs(10)),
            "not refused"
        );
    }
    // Once the silent connections go, a legitimate peer is served.
    drop(_held);
    std::thread::sleep(Duration::from_millis(200));
    works(&a, &b);
}

#[test]
fn one_peer_gets_at_most_its_share_of_connections() {
    let (a, b) = capped("adm_share");
    let port = b.engine_desc().port;
    let key = b.key().to_string();
    // Four handshaken connections claiming to be "greedy" take its whole share...
    let mut mine = Vec::new();
    for _ in 0..4 {
        let mut s = raw_connect(port);
        s.write_all(&hello("greedy", &key)).unwrap();
        assert!(
            matches!(read_frame(&mut s, Duration::from_secs(10)), Frame::HelloAck(ack) if ack.code == 0)
        );
        mine.push(s);
    }
    // ...and a fifth is told why and closed.
    let mut s = raw_connect(port);
    s.write_all(&hello("greedy", &key)).unwrap();
    assert!(matches!(
        read_frame(&mut s, Duration::from_secs(10)),
        Frame::HelloAck(_)
    ));
    match read_frame(&mut s, Duration::from_secs(10)) {
        Frame::GoAway { msg, .. } => assert!(msg.contains("too many connections"), "{msg}"),
        f => panic!("expected GOAWAY, got {f:?}"),
    }
    // Another peer is unaffected.
    works(&a, &b);
    // The greedy peer's share comes back with its connections.
    drop(mine);
    std::thread::sleep(Duration::from_millis(300));
    let mut s = raw_connect(port);
    s.write_all(&hello("greedy", &key)).unwrap();
    assert!(
        matches!(read_frame(&mut s, Duration::from_secs(10)), Frame::HelloAck(ack) if ack.code == 0)
    );
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut b1 = [0u8; 1];
    assert!(
        std::io::Read::read(&mut s, &mut b1).is_err(),
        "served again: no GOAWAY"
    );
}
