//! Access keys: a region is reached only with its key. Wrong, zero, stale and local-only
//! keys are refused like unknown regions, raw or through the engine, and move nothing.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use morio::proto::codes;
use morio::proto::frame::{Chunk, Frame, Seg};
use morio::{AccessKey, IoEngine, MemoryDesc, MemoryLocationType, RegisterOptions, StatusCode};

use super::raw::*;
use super::MIB;
use crate::common::*;

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
        }]
        .into(),
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
