//! A hostile client's tools: a pair whose target gives a handshake 300 ms, normal traffic to
//! run beside the attack, raw frame headers, a handshaken socket, and WRITE frames built by
//! hand for any region id and access key.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use morio::proto::codes;
use morio::proto::frame::{Chunk, Frame, Seg};
use morio::proto::limits::HEADER_BYTES;
use morio::{AccessKey, IoEngine, MemoryDesc};

use crate::common::*;

/// A pair whose target `b` gives a connection 300 ms to say HELLO.
pub fn hostile_pair(prefix: &str) -> (IoEngine, IoEngine) {
    pair(
        prefix,
        cfg_with(|c| c.handshake_timeout = Duration::from_millis(300)),
    )
}

/// A normal a -> b write and read, verified (run while a hostile client is connected).
pub fn normal_traffic(a: &IoEngine, b: &IoEngine) {
    for n in [4096usize, 512 << 10] {
        let src = a.register_buffer(random_big(n, n as u64)).unwrap();
        let dst = b.alloc_buffer(n).unwrap();
        assert_ok(
            &a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()),
            "write",
        );
        assert_bytes_eq(&dst.to_vec(), &src.to_vec(), "normal write");
        let fresh = random_big(n, n as u64 + 1);
        dst.write_at(0, &fresh);
        assert_ok(
            &a.read(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()),
            "read",
        );
        assert_bytes_eq(&src.to_vec(), &fresh, "normal read");
    }
}

/// A raw frame header.
pub fn header(kind: u8, flags: u8, body_len: u32, payload_len: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER_BYTES);
    h.extend_from_slice(&0x4F4Du16.to_le_bytes());
    h.extend_from_slice(&[kind, flags]);
    h.extend_from_slice(&body_len.to_le_bytes());
    h.extend_from_slice(&payload_len.to_le_bytes());
    h
}

/// Connect, say HELLO as `src` to `b`, and check the HELLO_ACK.
pub fn handshaken(b: &IoEngine, src: &str) -> TcpStream {
    let mut s = raw_connect(b.engine_desc().port);
    s.write_all(&hello(src, b.key())).unwrap();
    match read_frame(&mut s, Duration::from_secs(5)) {
        Frame::HelloAck(ack) => {
            assert_eq!(
                (ack.code, ack.key.as_str()),
                (codes::SUCCESS, b.key()),
                "{ack:?}"
            );
        }
        f => panic!("expected HELLO_ACK, got {f:?}"),
    }
    s
}

pub const CLOSE_LIMIT: Duration = Duration::from_secs(3);

/// The region a raw chunk names: its id and the access key it presents.
pub type Target = (u32, AccessKey);

/// What a raw chunk must present to reach the region of `d`.
pub fn target_of(d: &MemoryDesc) -> Target {
    (d.id, d.access_key)
}

/// A WRITE frame of the whole transfer `uid` for `target` (one segment per `segs`), with its
/// payload.
pub fn write_frame(uid: u64, target: Target, extent: (u64, u64), segs: &[(u64, u64)]) -> Vec<u8> {
    part_frame(uid, (0, 1, 0), target, extent, segs)
}

/// A WRITE frame of chunk `chunk` of `n_chunks` of transfer `uid`, joined on `join_lane`
/// (FINAL when it is the whole transfer), tagged `uid * 10 + chunk`.
pub fn part_frame(
    uid: u64,
    (chunk, n_chunks, join_lane): (u32, u32, u16),
    (mem_id, access_key): Target,
    extent: (u64, u64),
    segs: &[(u64, u64)],
) -> Vec<u8> {
    let chunk = Chunk {
        tag: uid * 10 + u64::from(chunk),
        uid,
        chunk,
        n_chunks,
        mem_id,
        access_key,
        extent,
        join_lane,
        segs: segs.iter().map(|&(off, len)| Seg { off, len }).collect(),
    };
    let payload_len = chunk.bytes();
    let final_ = n_chunks == 1;
    let mut v = encode(&Frame::Write { chunk, final_ }, payload_len);
    v.extend(random_bytes(payload_len as usize, uid));
    v
}
