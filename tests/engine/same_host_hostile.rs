//! A raw same-host peer written from PROTOCOL.md ("Same-host transport"): it proves itself
//! with this process's own memory, then sends records by hand. A correct PULL lands and is
//! acknowledged into its cell; a PULL whose token was withdrawn, one that points at unmapped
//! memory, and an unknown record each close the connection, land nothing and leave the
//! engine serving others. Likewise for DEVICE records into GPU memory.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use morio::proto::frame::{Chunk, Frame, Hello, LocalOffer, Seg};
use morio::proto::handshake::{host_tag, local_proof, Role};
use morio::proto::limits::VERSION;
use morio::{MemoryDesc, SameHost, StatusCode};

use crate::common::*;

/// A probe slot / pull cell laid out as PROTOCOL.md says: `live`, `acked`, the proof, the
/// wake descriptor's word, the ring's and the doorbell's descriptor words (0: none).
#[repr(C, align(64))]
pub(crate) struct Slot {
    pub(crate) live: AtomicU64,
    pub(crate) acked: AtomicU64,
    pub(crate) proof: [u8; 16],
    pub(crate) wake: u64,
    pub(crate) ring: u64,
    pub(crate) bell: u64,
}

impl Slot {
    pub(crate) fn new() -> Self {
        Slot {
            live: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            proof: [0; 16],
            wake: 0,
            ring: 0,
            bell: 0,
        }
    }
}

fn boot_id() -> [u8; 16] {
    let s = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let hex: Vec<u8> = s.trim().bytes().filter(|b| *b != b'-').collect();
    let mut id = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        id[i] = u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap();
    }
    id
}

/// Connect to `target` as engine `me`, pass the same-host step with `slot`: the stream now
/// carries records.
fn same_host_session(target: &morio::IoEngine, me: &str, slot: &mut Slot) -> TcpStream {
    same_host_session_v(target, me, slot, VERSION).0
}

/// [`same_host_session`] speaking protocol `version`; also the target's LOCAL offer.
pub(crate) fn same_host_session_v(
    target: &morio::IoEngine,
    me: &str,
    slot: &mut Slot,
    version: u32,
) -> (TcpStream, LocalOffer) {
    let mut s = raw_connect(target.engine_desc().port);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let nonce: [u8; 16] = rand::random();
    let hello = Hello {
        version,
        lane: 0,
        n_lanes: 1,
        src_key: me.into(),
        dst_key: target.key().into(),
        instance: 7,
        nonce,
        host_tag: Some(host_tag(&boot_id(), &nonce)),
    };
    s.write_all(&encode(&Frame::Hello(hello.clone()), 0))
        .unwrap();
    let Frame::HelloAck(ack) = read_frame(&mut s, Duration::from_secs(10)) else {
        panic!("expected HELLO_ACK");
    };
    assert!(
        ack.same_host,
        "the target must recognise this host: {ack:?}"
    );
    slot.proof = local_proof(Role::Dialer, &hello, &ack.nonce);
    let me_offer = LocalOffer {
        pid: std::process::id(),
        slot: slot as *const Slot as u64,
    };
    s.write_all(&encode(&Frame::Local(me_offer), 0)).unwrap();
    let Frame::Local(theirs) = read_frame(&mut s, Duration::from_secs(10)) else {
        panic!("expected LOCAL");
    };
    assert_eq!(theirs.pid, std::process::id(), "the target proved itself");
    (s, theirs)
}

pub(crate) fn inline(bytes: &[u8]) -> Vec<u8> {
    let mut v = vec![1u8];
    v.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    v.extend_from_slice(bytes);
    v
}

fn pull(addr: u64, len: u64, cell: &Slot, token: u64, index: u32) -> Vec<u8> {
    let mut v = vec![2u8];
    for w in [addr, len, cell as *const Slot as u64, token] {
        v.extend_from_slice(&w.to_le_bytes());
    }
    v.extend_from_slice(&index.to_le_bytes());
    v
}

/// The head of a whole-transfer WRITE of `len` bytes at `off` of `d` (its payload follows).
pub(crate) fn write_head(uid: u64, d: &MemoryDesc, off: u64, len: u64) -> Vec<u8> {
    let chunk = Chunk {
        tag: uid,
        uid,
        chunk: 0,
        n_chunks: 1,
        mem_id: d.id,
        access_key: d.access_key,
        extent: (off, off + len),
        join_lane: 0,
        segs: vec![Seg { off, len }].into(),
    };
    encode(
        &Frame::Write {
            chunk,
            final_: true,
        },
        len,
    )
}

/// After hostile peers, `b` still serves a well-behaved engine `key` (same host required):
/// its write of `payload` into `d` succeeds. The engine, for more checks.
pub(crate) fn serves_a_well_behaved_peer(
    b: &morio::IoEngine,
    key: &str,
    payload: &[u8],
    d: &MemoryDesc,
) -> morio::IoEngine {
    let a = engine(key, cfg_with(|c| c.same_host = Some(SameHost::Require)));
    a.register_remote_engine(&b.engine_desc()).unwrap();
    let src = a.register_buffer(payload.to_vec()).unwrap();
    assert_ok(
        &a.write(
            src.desc(),
            0,
            d,
            0,
            payload.len(),
            a.allocate_transfer_uid(),
        ),
        "a well-behaved peer after the hostile ones",
    );
    a
}

/// The next frame in the record stream (inside an INLINE record), or `None` once closed.
pub(crate) fn next_answer(s: &mut TcpStream) -> Option<Frame> {
    let mut head = [0u8; 5];
    s.read_exact(&mut head).ok()?;
    assert_eq!(head[0], 1, "answers travel inline");
    let mut body = vec![0u8; u32::from_le_bytes(head[1..5].try_into().unwrap()) as usize];
    s.read_exact(&mut body).ok()?;
    match morio::proto::decode::decode_frame(&body) {
        Ok(Some((f, 0, _))) => Some(f),
        other => panic!("not one answer frame: {other:?}"),
    }
}

pub(crate) fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    matches!(s.read(&mut b), Ok(0) | Err(_))
}

/// The target answered transfer `uid` of engine `peer` with nothing but the close (a
/// GOAWAY may come first), acknowledged nothing into `slot` and recorded no success.
pub(crate) fn refused(
    s: &mut TcpStream,
    slot: &Slot,
    b: &morio::IoEngine,
    peer: &str,
    uid: u64,
    what: &str,
) {
    loop {
        match next_answer(s) {
            None => break,
            Some(Frame::GoAway { .. }) => continue,
            Some(f) => panic!("{what}: answered {f:?}"),
        }
    }
    assert!(closed(s), "{what}: the connection stays open");
    assert_eq!(slot.acked.load(Ordering::SeqCst), 0, "{what}: acknowledged");
    let st = b.pop_inbound_transfer_status(peer, uid);
    assert!(
        st.as_ref().is_none_or(|s| s.code() != StatusCode::Success),
        "{what}: recorded as a success"
    );
}

#[test]
fn hostile_same_host_records_close_the_connection_and_land_nothing() {
    let b = engine(
        "sh_hostile_b",
        cfg_with(|c| c.same_host = Some(SameHost::Auto)),
    );
    let n = 256 << 10;
    let init = random_bytes(n, 1);
    let dst = b.register_buffer(init.clone()).unwrap();
    let d = dst.desc().clone();
    let payload = random_bytes(n, 2);

    // A correct PULL: the bytes land, COMPLETE answers, the cell says index 1.
    let mut slot = Slot::new();
    let mut s = same_host_session(&b, "sh_hostile_a", &mut slot);
    slot.live.store(41, Ordering::SeqCst);
    let mut rec = inline(&write_head(1, &d, 0, n as u64));
    rec.extend(pull(payload.as_ptr() as u64, n as u64, &slot, 41, 1));
    s.write_all(&rec).unwrap();
    match next_answer(&mut s) {
        Some(Frame::Complete(r)) => assert_eq!((r.uid, r.code), (1, 0), "{r:?}"),
        other => panic!("expected COMPLETE, got {other:?}"),
    }
    assert_eq!(
        slot.acked.load(Ordering::SeqCst),
        1,
        "acknowledged into the cell"
    );
    assert_bytes_eq(&dst.to_vec(), &payload, "a correct pull");
    assert_eq!(inbound(&b, "sh_hostile_a", 1), StatusCode::Success);

    let other = random_bytes(n, 3);
    for (uid, what) in [
        (2u64, "withdrawn token"),
        (3, "unmapped memory"),
        (4, "unknown record"),
    ] {
        let landed = dst.to_vec();
        let mut slot = Slot::new();
        let mut s = same_host_session(&b, &format!("sh_hostile_{uid}"), &mut slot);
        let mut rec = inline(&write_head(uid, &d, 0, n as u64));
        match uid {
            // The cell holds another token: the sender gave up on this send.
            2 => {
                slot.live.store(7, Ordering::SeqCst);
                rec.extend(pull(other.as_ptr() as u64, n as u64, &slot, 8, 1));
            }
            3 => {
                slot.live.store(9, Ordering::SeqCst);
                rec.extend(pull(0x10, n as u64, &slot, 9, 1));
            }
            _ => rec.push(9),
        }
        s.write_all(&rec).unwrap();
        refused(&mut s, &slot, &b, &format!("sh_hostile_{uid}"), uid, what);
        if uid != 2 {
            // (A withdrawn send's bytes may have been copied before the check: the transfer
            // fails, as when a TCP connection breaks mid-payload.)
            assert_bytes_eq(&dst.to_vec(), &landed, what);
        }
    }

    // The engine still serves a well-behaved peer.
    serves_a_well_behaved_peer(&b, "sh_hostile_ok", &payload, &d);
    drop(init);
}

/// A DEVICE record (PROTOCOL.md, "Device parts") naming `parts` of the allocation `ex`.
fn device(ex: &morio::gpu::IpcExport, cell: &Slot, token: u64, parts: &[(u64, u64)]) -> Vec<u8> {
    let mut v = vec![3u8];
    v.extend_from_slice(&ex.handle);
    for w in [ex.base, cell as *const Slot as u64, token] {
        v.extend_from_slice(&w.to_le_bytes());
    }
    v.extend_from_slice(&(parts.len() as u32).to_le_bytes());
    for &(off, len) in parts {
        v.extend_from_slice(&off.to_le_bytes());
        v.extend_from_slice(&len.to_le_bytes());
    }
    v
}

/// Device parts from a raw peer into GPU memory (the fake runtime; the peer's allocation
/// exported by another fake runtime of this process): a correct record is copied device to
/// device and acknowledged with 1; a part outside the peer's allocation, parts that do not
/// add up to the payload, and a withdrawn token each close the connection without a success.
#[test]
fn hostile_device_parts_close_the_connection_and_land_nothing() {
    use morio::gpu::fake::FakeGpu;
    use morio::gpu::GpuRuntime;
    use std::sync::Arc;

    let fake_b = Arc::new(FakeGpu::new(1));
    let b = engine(
        "sh_dev_hostile_b",
        cfg_with(|c| c.same_host = Some(SameHost::Auto)),
    );
    b.set_gpu_runtime(fake_b.clone()).unwrap();
    let n = 128 << 10;
    let dst = b.alloc_gpu_buffer(0, n).unwrap();
    let d = dst.desc().clone();
    // The raw peer's GPU memory, exported.
    let fake_a: Arc<dyn GpuRuntime> = Arc::new(FakeGpu::new(1));
    let src = fake_a.clone().alloc_device(0, 2 * n).unwrap();
    let payload = random_bytes(2 * n, 4);
    src.write_at(0, &payload).unwrap();
    let ex = fake_a.ipc_export(0, src.ptr()).unwrap();

    let new_slot = || Slot::new();
    // A correct record: the bytes at offset n of the peer's allocation land.
    let mut slot = new_slot();
    let mut s = same_host_session(&b, "sh_dev_a", &mut slot);
    slot.live.store(5, Ordering::SeqCst);
    let mut rec = inline(&write_head(1, &d, 0, n as u64));
    rec.extend(device(&ex, &slot, 5, &[(n as u64, n as u64)]));
    s.write_all(&rec).unwrap();
    match next_answer(&mut s) {
        Some(Frame::Complete(r)) => assert_eq!((r.uid, r.code), (1, 0), "{r:?}"),
        other => panic!("expected COMPLETE, got {other:?}"),
    }
    assert_eq!(slot.acked.load(Ordering::SeqCst), 1, "taken");
    assert_bytes_eq(&dst.to_vec(), &payload[n..], "device parts");
    assert!(fake_b.d2d_copies() >= 1);

    for (uid, what) in [
        (2u64, "a part outside the allocation"),
        (3, "parts short of the payload"),
        (4, "a withdrawn token"),
        (5, "a DEVICE record on a version 7 connection"),
    ] {
        let landed = dst.to_vec();
        let mut slot = new_slot();
        let version = if uid == 5 { 7 } else { VERSION };
        let mut s = same_host_session_v(&b, &format!("sh_dev_{uid}"), &mut slot, version).0;
        slot.live.store(11, Ordering::SeqCst);
        let mut rec = inline(&write_head(uid, &d, 0, n as u64));
        rec.extend(match uid {
            2 => device(&ex, &slot, 11, &[(2 * n as u64 - 10, n as u64)]),
            3 => device(&ex, &slot, 11, &[(0, n as u64 - 1)]),
            4 => device(&ex, &slot, 12, &[(0, n as u64)]),
            _ => device(&ex, &slot, 11, &[(0, n as u64)]),
        });
        s.write_all(&rec).unwrap();
        refused(&mut s, &slot, &b, &format!("sh_dev_{uid}"), uid, what);
        if uid != 4 {
            // (A withdrawn send's bytes are copied before the check, as for PULL.)
            assert_bytes_eq(&dst.to_vec(), &landed, what);
        }
    }
}

/// A DEVICES record (version 10, PROTOCOL.md "Several allocations") naming `parts`
/// (allocation index, offset, length) of `allocs`.
fn devices(
    allocs: &[morio::gpu::IpcExport],
    cell: &Slot,
    token: u64,
    parts: &[(u16, u64, u64)],
) -> Vec<u8> {
    let mut v = vec![5u8];
    for w in [cell as *const Slot as u64, token] {
        v.extend_from_slice(&w.to_le_bytes());
    }
    v.extend_from_slice(&(allocs.len() as u16).to_le_bytes());
    v.extend_from_slice(&(parts.len() as u32).to_le_bytes());
    for a in allocs {
        v.push(a.kind as u8);
        v.extend_from_slice(&a.handle);
        v.extend_from_slice(&a.base.to_le_bytes());
        v.extend_from_slice(&a.size.to_le_bytes());
    }
    for &(i, off, len) in parts {
        v.extend_from_slice(&i.to_le_bytes());
        v.extend_from_slice(&off.to_le_bytes());
        v.extend_from_slice(&len.to_le_bytes());
    }
    v
}

/// Device parts in several VMM chunks from a raw peer (the fake runtime; the chunks exported
/// as descriptors the target takes out of this process): parts across a seam land and are
/// acknowledged with 1; a descriptor that names no export is declined (not for good) and the
/// bytes that follow land instead; a part past its allocation, and a DEVICES record on a
/// version 9 connection, close the connection without a success.
#[test]
fn hostile_device_sets_are_checked_and_unknown_descriptors_declined() {
    use morio::gpu::fake::FakeGpu;
    use morio::gpu::{GpuRuntime, IpcExport};
    use std::os::fd::AsRawFd;
    use std::sync::Arc;

    let fake_b = Arc::new(FakeGpu::new(1));
    let b = engine(
        "sh_devs_hostile_b",
        cfg_with(|c| c.same_host = Some(SameHost::Auto)),
    );
    b.set_gpu_runtime(fake_b.clone()).unwrap();
    let (chunk, n) = (64usize << 10, 96usize << 10);
    let dst = b.alloc_gpu_buffer(0, n).unwrap();
    let d = dst.desc().clone();
    // The raw peer's VMM memory: two chunks side by side, each exported as a descriptor.
    let fake_a = Arc::new(FakeGpu::new(1));
    let src = fake_a.clone().alloc_device_chunked(0, chunk, 2).unwrap();
    let payload = random_bytes(2 * chunk, 6);
    src.write_at(0, &payload).unwrap();
    let exports = fake_a.ipc_export_range(0, src.ptr(), 2 * chunk).unwrap();
    let ex: Vec<IpcExport> = exports.list().to_vec();
    assert_eq!(ex.len(), 2);

    // Correct: 96 KiB from offset 16 KiB, across the seam (32 KiB of the second chunk).
    let mut slot = Slot::new();
    let mut s = same_host_session(&b, "sh_devs_a", &mut slot);
    slot.live.store(5, Ordering::SeqCst);
    let mut rec = inline(&write_head(1, &d, 0, n as u64));
    let first = (chunk - (16 << 10)) as u64;
    rec.extend(devices(
        &ex,
        &slot,
        5,
        &[(0, 16 << 10, first), (1, 0, n as u64 - first)],
    ));
    s.write_all(&rec).unwrap();
    match next_answer(&mut s) {
        Some(Frame::Complete(r)) => assert_eq!((r.uid, r.code), (1, 0), "{r:?}"),
        other => panic!("expected COMPLETE, got {other:?}"),
    }
    assert_eq!(slot.acked.load(Ordering::SeqCst), 1, "taken");
    assert_bytes_eq(
        &dst.to_vec(),
        &payload[16 << 10..(16 << 10) + n],
        "across the seam",
    );

    // A descriptor of this process that is no export (a socket): declined this time, and
    // the bytes follow inline.
    let (sock, _other) = std::os::unix::net::UnixStream::pair().unwrap();
    let bogus = IpcExport::posix_fd(sock.as_raw_fd(), 1, ex[0].base, 2 * chunk as u64);
    let mut slot = Slot::new();
    let mut s = same_host_session(&b, "sh_devs_bogus", &mut slot);
    slot.live.store(7, Ordering::SeqCst);
    let mut rec = inline(&write_head(2, &d, 0, n as u64));
    rec.extend(devices(&[bogus], &slot, 7, &[(0, 0, n as u64)]));
    s.write_all(&rec).unwrap();
    let t0 = std::time::Instant::now();
    while slot.acked.load(Ordering::SeqCst) == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no answer to the offer"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        slot.acked.load(Ordering::SeqCst),
        1 << 40,
        "declined, not for good"
    );
    let bytes = random_bytes(n, 8);
    s.write_all(&inline(&bytes)).unwrap();
    match next_answer(&mut s) {
        Some(Frame::Complete(r)) => assert_eq!((r.uid, r.code), (2, 0), "{r:?}"),
        other => panic!("expected COMPLETE, got {other:?}"),
    }
    assert_bytes_eq(&dst.to_vec(), &bytes, "the bytes after the decline");

    for (uid, what) in [
        (3u64, "a part past its allocation"),
        (4, "a DEVICES record on a version 9 connection"),
    ] {
        let landed = dst.to_vec();
        let mut slot = Slot::new();
        let version = if uid == 4 { 9 } else { VERSION };
        let mut s = same_host_session_v(&b, &format!("sh_devs_{uid}"), &mut slot, version).0;
        slot.live.store(11, Ordering::SeqCst);
        let mut rec = inline(&write_head(uid, &d, 0, n as u64));
        rec.extend(match uid {
            3 => devices(
                &ex,
                &slot,
                11,
                &[
                    (0, 0, chunk as u64 + 1),
                    (1, 0, n as u64 - chunk as u64 - 1),
                ],
            ),
            _ => devices(
                &ex,
                &slot,
                11,
                &[(0, 0, chunk as u64), (1, 0, n as u64 - chunk as u64)],
            ),
        });
        s.write_all(&rec).unwrap();
        refused(&mut s, &slot, &b, &format!("sh_devs_{uid}"), uid, what);
        assert_bytes_eq(&dst.to_vec(), &landed, what);
    }
    drop((b, exports, src));
}
