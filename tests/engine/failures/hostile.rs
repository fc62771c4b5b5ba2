//! Hostile clients on the listening port: garbage, bad handshakes, out-of-range and forged
//! frames, wrong or stale access keys, and what one peer's frames can make the target hold.

use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use morio::proto::codes;
use morio::proto::frame::{Chunk, Frame, Hello, Seg};
use morio::proto::limits::{CHUNK_FIXED_BYTES, HEADER_BYTES, MIN_VERSION, VERSION};
use morio::{
    AccessKey, EngineError, IoEngine, MemoryDesc, MemoryLocationType, RegisterOptions, StatusCode,
};

use crate::common::*;

const MIB: usize = 1 << 20;

// --- hostile clients on the listening port --------------------------------------------------

/// A pair whose target `b` gives a connection 300 ms to say HELLO.
fn hostile_pair(prefix: &str) -> (IoEngine, IoEngine) {
    pair(
        prefix,
        cfg_with(|c| c.handshake_timeout = Duration::from_millis(300)),
    )
}

/// A normal a -> b write and read, verified (run while a hostile client is connected).
fn normal_traffic(a: &IoEngine, b: &IoEngine) {
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
fn header(kind: u8, flags: u8, body_len: u32, payload_len: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER_BYTES);
    h.extend_from_slice(&0x4F4Du16.to_le_bytes());
    h.extend_from_slice(&[kind, flags]);
    h.extend_from_slice(&body_len.to_le_bytes());
    h.extend_from_slice(&payload_len.to_le_bytes());
    h
}

/// Connect, say HELLO as `src` to `b`, and check the HELLO_ACK.
fn handshaken(b: &IoEngine, src: &str) -> TcpStream {
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

const CLOSE_LIMIT: Duration = Duration::from_secs(3);

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
fn hostile_huge_lengths() {
    let (a, b) = hostile_pair("hostile_huge");
    let port = b.engine_desc().port;
    // Before the handshake: a HELLO claiming a 4 GiB body, a WRITE claiming a 2^64 payload.
    let mut pre = Vec::new();
    for h in [header(1, 0, u32::MAX, 0), header(3, 1, 64, u64::MAX)] {
        let mut s = raw_connect(port);
        let _ = s.write_all(&h);
        pre.push(s);
    }
    // After the handshake: the same lies in a frame on an established connection.
    let mut post = Vec::new();
    for h in [
        header(3, 1, u32::MAX, 0),
        header(3, 1, 64, 1 << 40),
        header(3, 1, 64, u64::MAX),
    ] {
        let mut s = handshaken(&b, "hostile_huge_client");
        let _ = s.write_all(&h);
        post.push(s);
    }
    normal_traffic(&a, &b);
    for mut s in pre {
        let (got, _) = read_until_closed(&mut s, CLOSE_LIMIT);
        assert!(
            got.is_empty(),
            "answered a bad pre-HELLO header with {} bytes",
            got.len()
        );
    }
    for mut s in post {
        let (got, _) = read_until_closed(&mut s, CLOSE_LIMIT);
        // Only a GOAWAY (if anything) comes back before the close.
        for f in parse_frames(&got) {
            assert!(matches!(f, Frame::GoAway { .. }), "unexpected {f:?}");
        }
    }
    normal_traffic(&a, &b);
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

#[test]
fn hostile_frame_stalled_mid_way_is_closed_after_op_timeout() {
    let (a, b) = pair(
        "hostile_stall",
        cfg_with(|c| c.op_timeout = Duration::from_millis(500)),
    );
    let mut s = handshaken(&b, "hostile_stall_client");
    let t = Instant::now();
    s.write_all(&header(3, 1, 64, 8)[..10]).unwrap();
    normal_traffic(&a, &b);
    let _ = read_until_closed(&mut s, CLOSE_LIMIT);
    assert!(
        t.elapsed() >= Duration::from_millis(400),
        "{:?}",
        t.elapsed()
    );
}

/// The region a raw chunk names: its id and the access key it presents.
type Target = (u32, AccessKey);

/// What a raw chunk must present to reach the region of `d`.
fn target_of(d: &MemoryDesc) -> Target {
    (d.id, d.access_key)
}

/// A WRITE frame of the whole transfer `uid` for `target` (one segment per `segs`), with its
/// payload.
fn write_frame(uid: u64, target: Target, extent: (u64, u64), segs: &[(u64, u64)]) -> Vec<u8> {
    part_frame(uid, (0, 1, 0), target, extent, segs)
}

/// A WRITE frame of chunk `chunk` of `n_chunks` of transfer `uid`, joined on `join_lane`
/// (FINAL when it is the whole transfer), tagged `uid * 10 + chunk`.
fn part_frame(
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

#[test]
fn hostile_out_of_range_writes_are_refused_and_place_nothing() {
    let (a, b) = hostile_pair("hostile_oor");
    let n = 4096u64;
    let dst_init = random_bytes(n as usize, 50);
    let dst = b.register_buffer(dst_init.clone()).unwrap();
    let id = target_of(dst.desc());
    let client = "hostile_oor_client";
    let mut s = handshaken(&b, client);
    // (uid, frame, expected code)
    let cases = [
        (
            1,
            write_frame(1, id, (4000, 4100), &[(4000, 100)]),
            codes::ERR_INVALID_ARGS,
        ),
        (
            2,
            write_frame(2, id, (0, 1 << 30), &[(0, 64)]),
            codes::ERR_INVALID_ARGS,
        ),
        (
            3,
            write_frame(3, id, (0, 100), &[(200, 10)]),
            codes::ERR_INVALID_ARGS,
        ),
        (
            4,
            write_frame(4, (id.0.wrapping_add(77), id.1), (0, 64), &[(0, 64)]),
            codes::ERR_NOT_FOUND,
        ),
    ];
    for (uid, bytes, want) in &cases {
        s.write_all(bytes).unwrap();
        let r = match read_frame(&mut s, Duration::from_secs(5)) {
            Frame::Complete(r) => r,
            f => panic!("uid {uid}: unexpected answer {f:?}"),
        };
        assert_eq!((r.uid, r.code), (*uid, *want), "uid {uid}: {r:?}");
        let st = b
            .pop_inbound_transfer_status(client, *uid)
            .expect("inbound status");
        assert_eq!(st.code().as_u32(), *want, "uid {uid}");
    }
    // A two-chunk transfer past the region: chunk 1 is refused and gets no answer of its
    // own (protocol v4: no ACK); chunk 0 (on this lane, its join lane) is refused too, and
    // the first frame back is the transfer's COMPLETE with chunk 0's tag and the error,
    // with the inbound status recorded first.
    let past = (4090, 5000);
    s.write_all(&part_frame(5, (1, 2, 0), id, past, &[(4096, 4)]))
        .unwrap();
    s.write_all(&part_frame(5, (0, 2, 0), id, past, &[(4090, 6)]))
        .unwrap();
    match read_frame(&mut s, Duration::from_secs(5)) {
        Frame::Complete(r) => assert_eq!((r.tag, r.uid, r.code), (50, 5, codes::ERR_INVALID_ARGS)),
        f => panic!("unexpected answer to chunk 0: {f:?}"),
    }
    let st = b
        .pop_inbound_transfer_status(client, 5)
        .expect("inbound status");
    assert_eq!(st.code().as_u32(), codes::ERR_INVALID_ARGS);
    assert_bytes_eq(
        &dst.to_vec(),
        &dst_init,
        "region after refused hostile writes",
    );
    // While it is connected, normal traffic flows.
    normal_traffic(&a, &b);
    // The connection is still in sync: a valid in-range chunk lands where it says.
    let ok = write_frame(6, id, (10, 20), &[(10, 10)]);
    s.write_all(&ok).unwrap();
    match read_frame(&mut s, Duration::from_secs(5)) {
        Frame::Complete(r) => assert_eq!((r.uid, r.code), (6, codes::SUCCESS), "{r:?}"),
        f => panic!("unexpected {f:?}"),
    }
    let mut want = dst_init;
    want[10..20].copy_from_slice(&ok[ok.len() - 10..]);
    assert_bytes_eq(&dst.to_vec(), &want, "region after one valid hostile write");
    // A frame an initiator must never send closes the connection, after a GOAWAY.
    s.write_all(&hello_ack("whatever")).unwrap();
    let (got, _) = read_until_closed(&mut s, CLOSE_LIMIT);
    let frames = parse_frames(&got);
    assert!(
        matches!(frames.as_slice(), [Frame::GoAway { .. }]),
        "expected a GOAWAY before the close, got {frames:?}"
    );
}

/// A chunk of a multi-chunk transfer naming a join lane its connection's peer does not have
/// closes that connection (after a GOAWAY) before any of its payload is placed; traffic on
/// other connections goes on.
#[test]
fn hostile_join_lanes_close_the_connection() {
    let (a, b) = hostile_pair("hostile_join");
    let n = 4096u64;
    let dst_init = random_bytes(n as usize, 51);
    let dst = b.register_buffer(dst_init.clone()).unwrap();
    let id = target_of(dst.desc());
    // This client dialed lane 0 of 1, so lane 3 is no lane of its.
    let mut s = handshaken(&b, "hostile_join_client");
    s.write_all(&part_frame(7, (1, 2, 3), id, (0, 64), &[(0, 64)]))
        .unwrap();
    let (got, _) = read_until_closed(&mut s, CLOSE_LIMIT);
    let frames = parse_frames(&got);
    assert!(
        matches!(frames.as_slice(), [Frame::GoAway { .. }]),
        "expected a GOAWAY before the close, got {frames:?}"
    );
    assert_bytes_eq(&dst.to_vec(), &dst_init, "region after a bad join lane");
    assert!(b
        .pop_inbound_transfer_status("hostile_join_client", 7)
        .is_none());
    normal_traffic(&a, &b);
}

// --- access keys: a region is reached only with its key ------------------------------------

/// The message of every refusal of a chunk whose region is unknown, local-only, or whose key
/// it does not carry.
const NOT_REGISTERED: &str = "remote memory region not registered";

/// A READ frame of the whole transfer `uid` for `target` (tagged `uid * 10`).
fn read_frame_of(uid: u64, (mem_id, access_key): Target, extent: (u64, u64)) -> Vec<u8> {
    let chunk = Chunk {
        tag: uid * 10,
        uid,
        chunk: 0,
        n_chunks: 1,
        mem_id,
        access_key,
        extent,
        join_lane: 0,
        segs: vec![Seg {
            off: extent.0,
            len: extent.1 - extent.0,
        }],
    };
    encode(
        &Frame::Read {
            chunk,
            final_: true,
            to_device: false,
        },
        0,
    )
}

/// A whole WRITE of `n` random bytes over `[0, n)` of `target` on `s`: COMPLETE's code and
/// message.
fn raw_write(s: &mut TcpStream, uid: u64, target: Target, n: u64) -> (u32, String) {
    s.write_all(&write_frame(uid, target, (0, n), &[(0, n)]))
        .unwrap();
    match read_frame(s, Duration::from_secs(10)) {
        Frame::Complete(r) => {
            assert_eq!(r.uid, uid, "{r:?}");
            (r.code, r.msg)
        }
        f => panic!("uid {uid}: unexpected answer {f:?}"),
    }
}

/// A whole READ of `[0, n)` of `target` on `s`: READ_DATA's code, message and bytes.
fn raw_read(s: &mut TcpStream, uid: u64, target: Target, n: u64) -> (u32, String, Vec<u8>) {
    s.write_all(&read_frame_of(uid, target, (0, n))).unwrap();
    match read_frame_and_payload(s, Duration::from_secs(10)) {
        (Frame::ReadData { reply, final_ }, bytes) => {
            assert!(final_, "{reply:?}");
            assert_eq!(reply.uid, uid, "{reply:?}");
            (reply.code, reply.msg, bytes)
        }
        (f, _) => panic!("uid {uid}: unexpected answer {f:?}"),
    }
}

/// Keys that are not `right`: none (a descriptor of MORI's form), one bit off, random.
fn wrong_keys(right: AccessKey) -> [(&'static str, AccessKey); 3] {
    let mut off = right.to_bytes();
    off[9] ^= 0x10;
    let random = AccessKey::from_bytes(random_bytes(16, 77).try_into().unwrap());
    assert!(random != right && !random.is_none());
    [
        ("zero key", AccessKey::NONE),
        ("one bit off", AccessKey::from_bytes(off)),
        ("random key", random),
    ]
}

/// `packed` (a keyed `MemoryDesc`) in MORI's 15-element form: the key dropped.
fn mori_form(packed: &[u8]) -> Vec<u8> {
    assert_eq!(&packed[..3], &[0xdc, 0x00, 0x10], "array 16");
    assert_eq!(&packed[packed.len() - 18..packed.len() - 16], &[0xc4, 0x10]);
    let mut v = vec![0x9f];
    v.extend_from_slice(&packed[3..packed.len() - 18]);
    v
}

/// A peer that knows a region's id but not its key (the zero key of a MORI-form descriptor,
/// a key one bit off, a random one) overwrites and reads none of it, one chunk or several,
/// raw or through the engine, and its refusals read exactly like those of an unknown region
/// (also past the region's end, which must not reveal its size); the connection stays in
/// sync, and the right key then writes and reads.
#[test]
fn hostile_wrong_or_zero_keys_are_refused_like_unknown_regions_and_move_nothing() {
    let (a, b) = hostile_pair("hostile_keys");
    let n = MIB as u64;
    let secret = random_big(MIB, 70);
    let dst = b.register_buffer(secret.clone()).unwrap();
    let (id, key) = target_of(dst.desc());
    assert!(!key.is_none());
    let client = "hostile_keys_client";
    let mut s = handshaken(&b, client);
    let refused = |b: &IoEngine, uid: u64| {
        let st = b.pop_inbound_transfer_status(client, uid);
        assert_eq!(
            st.map(|st| st.code()),
            Some(StatusCode::ErrNotFound),
            "uid {uid}"
        );
    };
    // What an unknown id gets: what every wrong key must get.
    let unknown = raw_write(&mut s, 1, (id ^ 0x8000_0000, key), n);
    assert_eq!(unknown, (codes::ERR_NOT_FOUND, NOT_REGISTERED.to_string()));
    let mut uid = 10;
    for (what, k) in wrong_keys(key) {
        // The whole region overwritten in one chunk.
        uid += 1;
        assert_eq!(raw_write(&mut s, uid, (id, k), n), unknown, "{what}: write");
        refused(&b, uid);
        // Two chunks of one transfer: the join's COMPLETE carries the refusal.
        uid += 1;
        let half = n / 2;
        s.write_all(&part_frame(
            uid,
            (1, 2, 0),
            (id, k),
            (0, n),
            &[(half, half)],
        ))
        .unwrap();
        s.write_all(&part_frame(uid, (0, 2, 0), (id, k), (0, n), &[(0, half)]))
            .unwrap();
        match read_frame(&mut s, Duration::from_secs(10)) {
            Frame::Complete(r) => assert_eq!(
                (r.uid, r.code, r.msg.as_str()),
                (uid, codes::ERR_NOT_FOUND, NOT_REGISTERED),
                "{what}: two chunks"
            ),
            f => panic!("{what}: unexpected answer {f:?}"),
        }
        refused(&b, uid);
        // Past the region's end: refused for the key, not for the range.
        uid += 1;
        s.write_all(&write_frame(uid, (id, k), (0, 1 << 40), &[(0, 64)]))
            .unwrap();
        match read_frame(&mut s, Duration::from_secs(10)) {
            Frame::Complete(r) => {
                assert_eq!((r.code, r.msg), unknown, "{what}: past the end")
            }
            f => panic!("{what}: unexpected answer {f:?}"),
        }
        // The whole region read.
        uid += 1;
        let (code, msg, bytes) = raw_read(&mut s, uid, (id, k), n);
        assert_eq!((code, msg), unknown, "{what}: read");
        assert!(bytes.is_empty(), "{what}: {} bytes read", bytes.len());
        refused(&b, uid);
        assert_bytes_eq(
            &dst.to_vec(),
            &secret,
            &format!("planted secret after {what}"),
        );
    }

    // Through the engine: the descriptor unpacked from MORI's form (no key), and altered.
    let from_mori = MemoryDesc::unpack(&mori_form(&dst.desc().pack())).unwrap();
    assert!(from_mori.access_key.is_none());
    assert_eq!(&from_mori, dst.desc(), "MORI's equality ignores the key");
    let mut forged: Vec<(&str, MemoryDesc)> = vec![("MORI's form", from_mori)];
    for (what, k) in wrong_keys(key) {
        let mut d = dst.desc().clone();
        d.access_key = k;
        forged.push((what, d));
    }
    let src = a.register_buffer(random_big(MIB, 71)).unwrap();
    let local_init = src.to_vec();
    for (what, d) in &forged {
        for size in [4096, MIB] {
            let uid = a.allocate_transfer_uid();
            let st = a.write(src.desc(), 0, d, 0, size, uid);
            assert_eq!(wait(&st), StatusCode::ErrNotFound, "{what} write {size}");
            assert!(st.message().contains(NOT_REGISTERED), "{}", st.message());
            assert_eq!(inbound(&b, a.key(), uid), StatusCode::ErrNotFound);
            let uid = a.allocate_transfer_uid();
            let st = a.read(src.desc(), 0, d, 0, size, uid);
            assert_eq!(wait(&st), StatusCode::ErrNotFound, "{what} read {size}");
            assert!(st.message().contains(NOT_REGISTERED), "{}", st.message());
            assert_eq!(inbound(&b, a.key(), uid), StatusCode::ErrNotFound);
        }
    }
    assert_bytes_eq(
        &dst.to_vec(),
        &secret,
        "planted secret after the engine's tries",
    );
    assert_bytes_eq(
        &src.to_vec(),
        &local_init,
        "reader's buffer after refused reads",
    );

    // The connection is in sync (every refused payload was drained): the right key works.
    uid += 1;
    let ok = write_frame(uid, (id, key), (100, 200), &[(100, 100)]);
    s.write_all(&ok).unwrap();
    match read_frame(&mut s, Duration::from_secs(10)) {
        Frame::Complete(r) => assert_eq!((r.uid, r.code), (uid, codes::SUCCESS), "{r:?}"),
        f => panic!("unexpected {f:?}"),
    }
    let mut want = secret;
    want[100..200].copy_from_slice(&ok[ok.len() - 100..]);
    assert_bytes_eq(&dst.to_vec(), &want, "after the right key's write");
    uid += 1;
    let (code, msg, bytes) = raw_read(&mut s, uid, (id, key), n);
    assert_eq!((code, msg.as_str()), (codes::SUCCESS, ""));
    assert_bytes_eq(&bytes, &want, "the right key's read");
    assert_ok(
        &a.write(src.desc(), 0, dst.desc(), 0, MIB, a.allocate_transfer_uid()),
        "engine write with the real descriptor",
    );
    assert_bytes_eq(
        &dst.to_vec(),
        &local_init,
        "engine write with the real descriptor",
    );
    normal_traffic(&a, &b);
}

/// Memory deregistered and registered again gets a new id and key: the old descriptor, and
/// the old key under the new id, are refused (raw and through the engine) and move nothing;
/// the new descriptor works.
#[test]
fn hostile_stale_descriptors_are_refused_after_registering_again() {
    let (a, b) = hostile_pair("hostile_stale");
    let n = 4 * MIB;
    let mut mem = random_big(n, 80);
    // SAFETY: `mem` outlives both registrations (deregistered below, before it is dropped).
    let old =
        unsafe { b.register_memory(mem.as_mut_ptr(), n, -1, MemoryLocationType::Cpu) }.unwrap();
    let src = a.register_buffer(random_big(n, 81)).unwrap();
    assert_ok(
        &a.write(src.desc(), 0, &old, 0, n, a.allocate_transfer_uid()),
        "before deregistering",
    );
    b.deregister_memory(&old).unwrap();
    assert_bytes_eq(&mem, &src.to_vec(), "write before deregistering");
    // SAFETY: as above.
    let new =
        unsafe { b.register_memory(mem.as_mut_ptr(), n, -1, MemoryLocationType::Cpu) }.unwrap();
    assert_ne!(new.access_key, old.access_key, "a new key");
    assert_ne!(new.id, old.id, "a new id");
    mem.copy_from_slice(&random_big(n, 82));
    let secret = mem.clone();
    let mut old_key = new.clone();
    old_key.access_key = old.access_key;
    let fresh = a.register_buffer(random_big(n, 83)).unwrap();
    let local_init = fresh.to_vec();
    let client = "hostile_stale_client";
    let mut s = handshaken(&b, client);
    let mut raw_uid = 0;
    for (what, d) in [("old descriptor", &old), ("old key, new id", &old_key)] {
        for size in [4096, n] {
            let uid = a.allocate_transfer_uid();
            let st = a.write(fresh.desc(), 0, d, 0, size, uid);
            assert_eq!(wait(&st), StatusCode::ErrNotFound, "{what} write {size}");
            assert_eq!(inbound(&b, a.key(), uid), StatusCode::ErrNotFound);
            let uid = a.allocate_transfer_uid();
            let st = a.read(fresh.desc(), 0, d, 0, size, uid);
            assert_eq!(wait(&st), StatusCode::ErrNotFound, "{what} read {size}");
            assert_eq!(inbound(&b, a.key(), uid), StatusCode::ErrNotFound);
        }
        raw_uid += 1;
        let want = (codes::ERR_NOT_FOUND, NOT_REGISTERED.to_string());
        assert_eq!(
            raw_write(&mut s, raw_uid, target_of(d), n as u64),
            want,
            "{what}"
        );
        raw_uid += 1;
        let (code, msg, bytes) = raw_read(&mut s, raw_uid, target_of(d), n as u64);
        assert_eq!((code, msg), want, "{what}: raw read");
        assert!(bytes.is_empty());
    }
    assert_bytes_eq(&mem, &secret, "memory under stale descriptors");
    assert_bytes_eq(&fresh.to_vec(), &local_init, "reader's buffer");
    // The new descriptor reaches it.
    assert_ok(
        &a.write(fresh.desc(), 0, &new, 0, n, a.allocate_transfer_uid()),
        "write with the new descriptor",
    );
    assert_bytes_eq(&mem, &local_init, "write with the new descriptor");
    raw_uid += 1;
    let (code, _, bytes) = raw_read(&mut s, raw_uid, target_of(&new), 4096);
    assert_eq!(code, codes::SUCCESS);
    assert_bytes_eq(
        &bytes,
        &local_init[..4096],
        "raw read with the new descriptor",
    );
    b.deregister_memory(&new).unwrap();
    drop(mem);
    normal_traffic(&a, &b);
}

/// A region registered local-only is no peer's target, whatever key a chunk presents (none,
/// another region's, a random one), raw or through the engine, and its refusals read like an
/// unknown region's; its engine still uses it as the local side of its own transfers.
#[test]
fn hostile_local_only_regions_are_never_a_remote_target() {
    let (a, b) = hostile_pair("hostile_local");
    let n = 4 * MIB;
    let secret = random_big(n, 90);
    let private = b
        .register_buffer_with(secret.clone(), RegisterOptions::LOCAL_ONLY)
        .unwrap();
    let id = private.desc().id;
    assert!(
        private.desc().access_key.is_none(),
        "a local-only region has no key"
    );
    let public = b.register_buffer(random_big(64, 91)).unwrap();
    let keys = [
        ("no key", AccessKey::NONE),
        ("another region's key", public.desc().access_key),
        ("random key", wrong_keys(public.desc().access_key)[2].1),
    ];
    let client = "hostile_local_client";
    let mut s = handshaken(&b, client);
    let want = (codes::ERR_NOT_FOUND, NOT_REGISTERED.to_string());
    let src = a.register_buffer(random_big(n, 92)).unwrap();
    let local_init = src.to_vec();
    for (i, (what, k)) in keys.into_iter().enumerate() {
        let uid = 2 * i as u64 + 1;
        assert_eq!(
            raw_write(&mut s, uid, (id, k), n as u64),
            want,
            "{what}: raw write"
        );
        let (code, msg, bytes) = raw_read(&mut s, uid + 1, (id, k), n as u64);
        assert_eq!((code, msg), want, "{what}: raw read");
        assert!(bytes.is_empty());
        let mut d = private.desc().clone();
        d.access_key = k;
        for size in [4096, n] {
            let uid = a.allocate_transfer_uid();
            let st = a.write(src.desc(), 0, &d, 0, size, uid);
            assert_eq!(wait(&st), StatusCode::ErrNotFound, "{what} write {size}");
            assert_eq!(inbound(&b, a.key(), uid), StatusCode::ErrNotFound);
            let st = a.read(src.desc(), 0, &d, 0, size, a.allocate_transfer_uid());
            assert_eq!(wait(&st), StatusCode::ErrNotFound, "{what} read {size}");
        }
    }
    assert_bytes_eq(&private.to_vec(), &secret, "local-only region");
    assert_bytes_eq(&src.to_vec(), &local_init, "reader's buffer");
    // Its own engine reads into it and writes from it.
    let theirs = a.register_buffer(random_big(n, 93)).unwrap();
    let mine = theirs.to_vec();
    assert_ok(
        &b.read(
            private.desc(),
            0,
            theirs.desc(),
            0,
            n,
            b.allocate_transfer_uid(),
        ),
        "read into local-only memory",
    );
    assert_bytes_eq(&private.to_vec(), &mine, "read into local-only memory");
    let out = a.alloc_buffer(n).unwrap();
    assert_ok(
        &b.write(
            private.desc(),
            0,
            out.desc(),
            0,
            n,
            b.allocate_transfer_uid(),
        ),
        "write from local-only memory",
    );
    assert_bytes_eq(&out.to_vec(), &mine, "write from local-only memory");
    normal_traffic(&a, &b);
}

#[test]
fn hostile_run_form_writes_are_checked_like_lists() {
    let (a, b) = hostile_pair("hostile_runs");
    let dst_init = random_bytes(4096, 60);
    let dst = b.register_buffer(dst_init.clone()).unwrap();
    let id = target_of(dst.desc());
    let mut s = handshaken(&b, "hostile_runs_client");
    let segs = [(0, 8), (16, 8), (32, 8), (48, 8)];
    // Regular segments go as one run; the last one reaches past the declared extent.
    let bad = write_frame(1, id, (0, 40), &segs);
    assert_ne!(bad[3] & morio::proto::frame::FLAG_RUNS, 0, "run form");
    s.write_all(&bad).unwrap();
    match read_frame(&mut s, Duration::from_secs(5)) {
        Frame::Complete(r) => assert_eq!((r.uid, r.code), (1, codes::ERR_INVALID_ARGS)),
        f => panic!("unexpected {f:?}"),
    }
    assert_bytes_eq(&dst.to_vec(), &dst_init, "after a refused run");
    // The connection is in sync: a valid run lands exactly on its segments.
    let ok = write_frame(2, id, (0, 56), &segs);
    s.write_all(&ok).unwrap();
    match read_frame(&mut s, Duration::from_secs(5)) {
        Frame::Complete(r) => assert_eq!((r.uid, r.code), (2, codes::SUCCESS), "{r:?}"),
        f => panic!("unexpected {f:?}"),
    }
    let payload = &ok[ok.len() - 32..];
    let mut want = dst_init;
    for (i, &(off, len)) in segs.iter().enumerate() {
        want[off as usize..(off + len) as usize].copy_from_slice(&payload[i * 8..i * 8 + 8]);
    }
    assert_bytes_eq(&dst.to_vec(), &want, "after a valid run");
    // Runs that describe more segments than a chunk may hold close the connection: the
    // valid frame's fixed part, its run count (which ends it) set to 2, then two huge runs.
    let n_at = HEADER_BYTES + CHUNK_FIXED_BYTES - 4;
    let mut lie = ok[..n_at + 4].to_vec();
    lie[n_at..n_at + 4].copy_from_slice(&2u32.to_le_bytes());
    for _ in 0..2 {
        for v in [0u64, 1] {
            lie.extend_from_slice(&v.to_le_bytes()); // off, len
        }
        lie.extend_from_slice(&u32::MAX.to_le_bytes()); // count
        lie.extend_from_slice(&1u64.to_le_bytes()); // stride
    }
    let body = (lie.len() - HEADER_BYTES) as u32;
    lie[4..8].copy_from_slice(&body.to_le_bytes());
    lie[8..16].copy_from_slice(&1u64.to_le_bytes());
    s.write_all(&lie).unwrap();
    let (got, _) = read_until_closed(&mut s, CLOSE_LIMIT);
    let frames = parse_frames(&got);
    assert!(
        matches!(frames.as_slice(), [Frame::GoAway { .. }]),
        "expected a GOAWAY before the close, got {frames:?}"
    );
    normal_traffic(&a, &b);
}

// --- bounded target state: what one peer's frames can make the target hold -----------------

/// This process's address space and resident memory, in bytes (`/proc/self/statm`).
fn statm() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let mut v = s.split_whitespace().map(|x| x.parse::<u64>().unwrap());
    // SAFETY: sysconf only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    (v.next().unwrap() * page, v.next().unwrap() * page)
}

/// WRITE frames of 95 bytes (111 with the access key), each claiming 2^32 - 1 chunks (a join's bitmap is sized by the
/// count: 512 MiB each before counts were checked), close their connection and reserve
/// nothing; counts at the limit (2^20, for a wide extent) reserve no more than the join caps
/// allow. The process's memory stays put, and normal traffic flows after.
#[test]
fn hostile_chunk_counts_reserve_no_memory() {
    run_alone("failures::hostile::hostile_chunk_counts_reserve_no_memory_case");
}

#[test]
#[ignore = "run alone by hostile_chunk_counts_reserve_no_memory: it measures the process's memory"]
fn hostile_chunk_counts_reserve_no_memory_case() {
    let (a, b) = hostile_pair("hostile_counts");
    let dst = b.alloc_buffer(4096).unwrap();
    let id = target_of(dst.desc());
    let client = "hostile_counts_client";
    // A one-byte whole write after each hostile frame: answered only if the hostile frame
    // left the connection open.
    let sync = |uid| write_frame(uid, id, (0, 1), &[(0, 1)]);
    let before = statm();
    let mut conns = Vec::new();
    for i in 0..128u64 {
        let mut s = handshaken(&b, client);
        let mut bytes = part_frame(1000 + i, (1, u32::MAX, 0), id, (0, 64), &[(0, 13)]);
        // The attack's 95-byte frame, plus the 16-byte access key chunks carry since v6.
        assert_eq!(bytes.len(), 95 + 16);
        bytes.extend(sync(5000 + i));
        s.write_all(&bytes).unwrap();
        let first = try_read_frame(&mut s, Duration::from_secs(5));
        conns.push((s, first));
    }
    // Counts at the limit for an extent no region has: every chunk is refused (unknown
    // region) and still reports to the join table, where a join of 2^20 chunks takes 2048
    // slots: two per peer at the default cap, the rest refused.
    let mut open = Vec::new();
    for k in 0..8 {
        let mut s = handshaken(&b, &format!("hostile_counts_peer{k}"));
        for uid in 0..16u64 {
            let f = part_frame(
                uid,
                (1, 1 << 20, 0),
                (id.0.wrapping_add(99), id.1),
                (0, 1 << 40),
                &[(0, 13)],
            );
            s.write_all(&f).unwrap();
        }
        s.write_all(&sync(99)).unwrap();
        match read_frame(&mut s, Duration::from_secs(5)) {
            Frame::Complete(r) => assert_eq!((r.uid, r.code), (99, codes::SUCCESS), "{r:?}"),
            f => panic!("peer {k}: unexpected {f:?}"),
        }
        open.push(s);
    }
    let after = statm();
    let (space, resident) = (
        after.0.saturating_sub(before.0),
        after.1.saturating_sub(before.1),
    );
    assert!(
        space < 1 << 30 && resident < 16 << 20,
        "the target grew by {} MiB of address space and {} MiB resident",
        space >> 20,
        resident >> 20
    );
    for (i, (mut s, first)) in conns.into_iter().enumerate() {
        assert!(
            matches!(first, Ok(Frame::GoAway { .. })),
            "connection {i}: expected a GOAWAY, got {first:?}"
        );
        read_until_closed(&mut s, CLOSE_LIMIT);
    }
    assert!(b.pop_inbound_transfer_status(client, 1000).is_none());
    assert!(b.pop_inbound_transfer_status(client, 5000).is_none());
    normal_traffic(&a, &b);
    drop(open);
}

/// A frame whose header and body arrived and whose payload then trickles in, a byte every
/// 200 ms (each read progresses well within op_timeout), is closed once op_timeout has
/// passed since it began, not when (if ever) it completes.
#[test]
fn hostile_trickled_frame_is_closed_within_op_timeout() {
    let op_timeout = Duration::from_secs(1);
    let (a, b) = pair("hostile_trickle", cfg_with(|c| c.op_timeout = op_timeout));
    let dst = b.alloc_buffer(4096).unwrap();
    let mut s = handshaken(&b, "hostile_trickle_client");
    let frame = write_frame(1, target_of(dst.desc()), (0, 4096), &[(0, 4096)]);
    let head = frame.len() - 4096;
    let t = Instant::now();
    s.write_all(&frame[..head]).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let trickler = {
        let (mut w, stop) = (s.try_clone().unwrap(), stop.clone());
        std::thread::spawn(move || {
            for byte in &frame[head..] {
                if stop.load(std::sync::atomic::Ordering::SeqCst) || w.write_all(&[*byte]).is_err()
                {
                    break;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    let (got, _) = read_until_closed(&mut s, 3 * op_timeout);
    let el = t.elapsed();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    trickler.join().unwrap();
    assert!(
        el >= op_timeout * 9 / 10,
        "closed before op_timeout: {el:?}"
    );
    for f in parse_frames(&got) {
        assert!(matches!(f, Frame::GoAway { .. }), "unexpected {f:?}");
    }
    assert!(b
        .pop_inbound_transfer_status("hostile_trickle_client", 1)
        .is_none());
    normal_traffic(&a, &b);
}

/// A peer that starts more joins than its cap (chunk 0 of transfers whose chunk 1 never
/// comes) gets each further transfer refused at once (COMPLETE with ERR_BAD_STATE, recorded
/// as its inbound status), while another peer's striped transfers go on; a join that
/// completes gives its slot back, and another key has a cap of its own.
#[test]
fn hostile_join_flood_is_refused_past_its_cap_while_others_transfer() {
    let (a, b) = pair(
        "hostile_joincap",
        cfg_with(|c| {
            c.handshake_timeout = Duration::from_millis(300);
            c.max_joins_per_peer = 8;
        }),
    );
    let dst = b.alloc_buffer(4096).unwrap();
    let id = target_of(dst.desc());
    let client = "hostile_joincap_client";
    let mut s = handshaken(&b, client);
    for uid in 0..40u64 {
        s.write_all(&part_frame(uid, (0, 2, 0), id, (0, 64), &[(0, 32)]))
            .unwrap();
    }
    for uid in 8..40u64 {
        match read_frame(&mut s, Duration::from_secs(5)) {
            Frame::Complete(r) => {
                assert_eq!(
                    (r.tag, r.uid, r.code),
                    (uid * 10, uid, codes::ERR_BAD_STATE)
                );
                assert!(r.msg.contains("max_joins_per_peer"), "{}", r.msg);
            }
            f => panic!("uid {uid}: unexpected {f:?}"),
        }
    }
    let st = b
        .pop_inbound_transfer_status(client, 8)
        .expect("inbound status");
    assert_eq!(st.code(), StatusCode::ErrBadState);
    assert!(
        b.pop_inbound_transfer_status(client, 0).is_none(),
        "in flight"
    );
    // Another peer transfers meanwhile, striped (joined) transfers included.
    normal_traffic(&a, &b);
    // Chunk 1 of transfer 0 completes its join and gives its slot back...
    s.write_all(&part_frame(0, (1, 2, 0), id, (0, 64), &[(32, 32)]))
        .unwrap();
    match read_frame(&mut s, Duration::from_secs(5)) {
        Frame::Complete(r) => assert_eq!((r.tag, r.uid, r.code), (1, 0, codes::SUCCESS)),
        f => panic!("unexpected {f:?}"),
    }
    // ... so a new transfer fits again.
    for chunk in 0..2u32 {
        let f = part_frame(
            100,
            (chunk, 2, 0),
            id,
            (0, 64),
            &[(u64::from(chunk) * 32, 32)],
        );
        s.write_all(&f).unwrap();
    }
    match read_frame(&mut s, Duration::from_secs(5)) {
        Frame::Complete(r) => assert_eq!((r.uid, r.code), (100, codes::SUCCESS), "{r:?}"),
        f => panic!("unexpected {f:?}"),
    }
    // Another key has a cap of its own.
    let mut other = handshaken(&b, "hostile_joincap_other");
    for chunk in 0..2u32 {
        let f = part_frame(
            7,
            (chunk, 2, 0),
            id,
            (0, 64),
            &[(u64::from(chunk) * 32, 32)],
        );
        other.write_all(&f).unwrap();
    }
    match read_frame(&mut other, Duration::from_secs(5)) {
        Frame::Complete(r) => assert_eq!((r.uid, r.code), (7, codes::SUCCESS), "{r:?}"),
        f => panic!("unexpected {f:?}"),
    }
    normal_traffic(&a, &b);
}

/// Inbound statuses nobody pops are bounded per peer (its newest kept) and in total, over
/// many connections with distinct 1000-byte source keys; the newest status is always there.
#[test]
fn hostile_inbound_statuses_are_capped_per_peer_and_in_total() {
    let (a, b) = pair(
        "hostile_status",
        cfg_with(|c| {
            c.max_inbound_statuses_per_peer = 16;
            c.max_inbound_statuses = 64;
        }),
    );
    let dst = b.alloc_buffer(4096).unwrap();
    let id = target_of(dst.desc());
    let client = "hostile_status_client";
    let mut s = handshaken(&b, client);
    for uid in 0..100u64 {
        s.write_all(&write_frame(uid, id, (0, 1), &[(0, 1)]))
            .unwrap();
    }
    for uid in 0..100u64 {
        match read_frame(&mut s, Duration::from_secs(5)) {
            Frame::Complete(r) => assert_eq!((r.uid, r.code), (uid, codes::SUCCESS)),
            f => panic!("unexpected {f:?}"),
        }
    }
    let kept: Vec<u64> = (0..100)
        .filter(|&uid| b.pop_inbound_transfer_status(client, uid).is_some())
        .collect();
    assert_eq!(kept, (84..100).collect::<Vec<_>>(), "the newest 16");
    let keys: Vec<String> = (0..300).map(|i| format!("{i:0>1000}")).collect();
    for key in &keys {
        let mut s = handshaken(&b, key);
        s.write_all(&write_frame(1, id, (0, 1), &[(0, 1)])).unwrap();
        match read_frame(&mut s, Duration::from_secs(5)) {
            Frame::Complete(r) => assert_eq!((r.uid, r.code), (1, codes::SUCCESS)),
            f => panic!("unexpected {f:?}"),
        }
    }
    let last = b.pop_inbound_transfer_status(keys.last().unwrap(), 1);
    assert!(last.is_some(), "the newest status is kept");
    let kept = keys
        .iter()
        .filter(|k| b.pop_inbound_transfer_status(k, 1).is_some())
        .count();
    assert!(kept < 64, "{kept} statuses kept past the total of 64");
    normal_traffic(&a, &b);
}

/// A host region larger than the machine's memory (a 1 PiB registration) is refused.
#[test]
fn regions_larger_than_physical_memory_are_refused() {
    let e = engine("too_big", test_cfg());
    let ptr = std::ptr::NonNull::<u8>::dangling().as_ptr();
    // SAFETY: refused before the range is recorded or touched.
    let r = unsafe { e.register_memory(ptr, 1 << 50, -1, MemoryLocationType::Cpu) };
    assert!(
        matches!(r, Err(EngineError::RegionTooLarge { size, .. }) if size == 1 << 50),
        "{r:?}"
    );
    assert!(matches!(
        e.alloc_buffer(1 << 50),
        Err(EngineError::RegionTooLarge { .. })
    ));
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
