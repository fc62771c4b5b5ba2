//! Shared-memory rings (protocol v9) from a raw peer written from PROTOCOL.md ("Rings"): a
//! frame written into the target's ring lands and is answered; impossible indices, a second
//! RING record and a RING record where no ring was offered each close the connection with
//! nothing landed and no success recorded.

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use morio::proto::frame::{Frame, LocalOffer};
use morio::SameHost;

use crate::common::*;
use crate::same_host_hostile::{
    inline, next_answer, refused, same_host_session_v, serves_a_well_behaved_peer, write_head, Slot,
};

/// The ring's layout (PROTOCOL.md): a 4 KiB header (`head` at 0, `tail` at 64, each with a
/// request bit on top), then the data (the file's size tells how much).
const HEADER: usize = 4096;

/// The target's ring, mapped as its peer maps it.
struct PeerRing {
    base: *mut u8,
    data: usize,
    head: u64,
}

impl PeerRing {
    /// Take the ring the target offers in its slot (the target is this very process, so
    /// its slot and descriptors are ours to read and duplicate).
    fn take(theirs: &LocalOffer) -> Self {
        // SAFETY: the target's slot is a live, never-freed 64-byte slot of this process.
        let word = unsafe { std::ptr::read_volatile((theirs.slot + 40) as *const u64) };
        assert!(word > 0, "a version 9 target offers a ring");
        // SAFETY: duplicating and mapping a descriptor of this process; owned below.
        unsafe {
            let fd = OwnedFd::from_raw_fd(libc::dup((word - 1) as i32));
            let mut st: libc::stat = std::mem::zeroed();
            assert_eq!(libc::fstat(fd.as_raw_fd(), &mut st), 0);
            let data = st.st_size as usize - HEADER;
            assert!(data.is_power_of_two() && data >= 64 << 10, "{data}");
            let p = libc::mmap(
                std::ptr::null_mut(),
                HEADER + data,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            Self {
                base: p.cast(),
                data,
                head: 0,
            }
        }
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        // SAFETY: a header word of the live mapping.
        unsafe { &*self.base.add(off).cast::<AtomicU64>() }
    }

    /// Append `bytes` to the stream and publish them (no wrap needed in these tests).
    fn put(&mut self, bytes: &[u8]) {
        let at = self.head as usize % self.data;
        assert!(at + bytes.len() <= self.data);
        // SAFETY: inside the data area of the live mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(HEADER + at), bytes.len())
        };
        self.head += bytes.len() as u64;
        self.word(0).store(self.head, Ordering::Release);
    }

    /// Publish an arbitrary write index.
    fn set_head(&self, v: u64) {
        self.word(0).store(v, Ordering::Release);
    }
}

impl Drop for PeerRing {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `take`.
        unsafe { libc::munmap(self.base.cast(), HEADER + self.data) };
    }
}

/// Ring the target's doorbell (always: an extra doorbell is harmless).
fn doorbell(s: &mut std::net::TcpStream) {
    s.write_all(&[0]).unwrap();
}

#[test]
fn frames_through_the_ring_land_and_hostile_rings_close_the_connection() {
    if !rings_on() {
        eprintln!("MORIO_SAME_HOST_RING=off: engines offer no rings; the default run covers this");
        return;
    }
    let b = engine(
        "sh_ring_b",
        cfg_with(|c| c.same_host = Some(SameHost::Auto)),
    );
    let n = 4096;
    let init = random_bytes(n, 1);
    let dst = b.register_buffer(init.clone()).unwrap();
    let d = dst.desc().clone();
    let payload = random_bytes(n, 2);

    // A correct frame through the ring: it lands, COMPLETE answers in the socket.
    let mut slot = Slot::new();
    let (mut s, theirs) = same_host_session_v(&b, "sh_ring_a", &mut slot, 9);
    let mut ring = PeerRing::take(&theirs);
    s.write_all(&[4]).unwrap();
    let mut rec = inline(&write_head(1, &d, 0, n as u64));
    rec.extend(inline(&payload));
    ring.put(&rec);
    doorbell(&mut s);
    match next_answer(&mut s) {
        Some(Frame::Complete(r)) => assert_eq!((r.uid, r.code), (1, 0), "{r:?}"),
        other => panic!("expected COMPLETE, got {other:?}"),
    }
    assert_bytes_eq(&dst.to_vec(), &payload, "a frame through the ring");
    assert_eq!(inbound(&b, "sh_ring_a", 1), morio::StatusCode::Success);
    assert_eq!(
        ring.word(64).load(Ordering::Acquire),
        ring.head,
        "the target published how far it read"
    );

    for (uid, what) in [
        (2u64, "write index past the ring"),
        (3, "write index behind the read index"),
        (4, "a second RING record"),
        (5, "RING on a version 8 connection"),
    ] {
        let landed = dst.to_vec();
        let peer = format!("sh_ring_{uid}");
        let mut slot = Slot::new();
        let version = if uid == 5 { 8 } else { 9 };
        let (mut s, theirs) = same_host_session_v(&b, &peer, &mut slot, version);
        let mut rec = inline(&write_head(uid, &d, 0, n as u64));
        rec.extend(inline(&random_bytes(n, uid)));
        if uid == 5 {
            assert_eq!(
                // SAFETY: as in `PeerRing::take`.
                unsafe { std::ptr::read_volatile((theirs.slot + 40) as *const u64) },
                0,
                "no ring offered on version 8"
            );
            s.write_all(&[4]).unwrap();
            s.write_all(&rec).unwrap();
        } else {
            let mut ring = PeerRing::take(&theirs);
            s.write_all(&[4]).unwrap();
            match uid {
                2 => {
                    ring.put(&rec[..5]);
                    ring.set_head(ring.data as u64 + 6);
                }
                3 => {
                    ring.put(&rec[..1]);
                    ring.set_head(u64::MAX);
                }
                _ => {
                    ring.put(&[4]);
                    ring.put(&rec);
                }
            }
            doorbell(&mut s);
        }
        refused(&mut s, &slot, &b, &peer, uid, what);
        assert_bytes_eq(&dst.to_vec(), &landed, what);
    }

    // The engine still serves a well-behaved peer, through rings.
    let a = serves_a_well_behaved_peer(&b, "sh_ring_ok", &payload, &d);
    assert!(a.stats().unwrap().total().lane_connects_ring >= 1);
    drop(init);
}
