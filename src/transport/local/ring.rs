//! The shared-memory rings of a same-host connection (protocol v9): each side makes a ring
//! for the bytes it receives (a sealed memfd), the peer takes it in the handshake
//! (`pidfd_getfd`) and writes its record stream there instead of into the socket, so a small
//! transfer crosses between the processes without a system call. The socket stays for
//! doorbells (one byte, only while the reader is parked) and to say the peer is gone.
//!
//! Layout of the file: a 4 KiB header of two words on their own cache lines — `head` (bytes
//! the producer has written, ever; its top bit: the consumer waits for a doorbell) and `tail`
//! (bytes the consumer has taken; its top bit: the producer waits for room), the handshakes
//! over them in [`super::ring_sync`] — then
//! the data (a power of two from [`MIN_RING_BYTES`] to [`MAX_RING_BYTES`], [`RING_BYTES`] by
//! default; the file's size says which), byte `i` of the stream at `i mod` its size.
//!
//! Either side may be hostile: each keeps its own index privately and only publishes it, so
//! a peer that scribbles over the header can at worst make this side see an impossible
//! distance between the indices, which fails the connection. Bytes are copied out of the
//! ring before anything looks at them (the frame decoder never reads shared memory), and the
//! file is sealed against shrinking before it is offered, so a peer cannot make a mapping
//! fault.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use super::ring_sync::{Header, INDEX};
use crate::proto::limits::{MAX_RING_BYTES, MIN_RING_BYTES};
use std::sync::Arc;

/// Data bytes of the rings this side offers by default: a few hundred small frames, a few
/// 64 KiB inline payloads (`MORIO_SAME_HOST_RING_BYTES` sets another, for A/B runs).
pub(crate) const RING_BYTES: usize = 1 << 20;
/// Bytes before the data.
const HEADER: usize = 4096;

/// Whether `n` is a ring size this build offers and takes.
pub(crate) fn bytes_ok(n: usize) -> bool {
    n.is_power_of_two() && (MIN_RING_BYTES..=MAX_RING_BYTES).contains(&n)
}

/// The data size of the rings an engine offers when its configuration names none:
/// `MORIO_SAME_HOST_RING_BYTES` when it holds an allowed size, else [`RING_BYTES`].
pub(crate) fn default_bytes() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("MORIO_SAME_HOST_RING_BYTES")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| bytes_ok(n))
            .unwrap_or(RING_BYTES)
    })
}

const HEAD: usize = 0;
const TAIL: usize = 64;

/// A mapping of a ring's file (its data area `cap` bytes), unmapped on drop.
#[derive(Debug)]
struct Map {
    base: NonNull<u8>,
    cap: usize,
}

// SAFETY: the mapping is plain shared memory; every access goes through atomics or raw
// copies, never through references that assume exclusive access.
unsafe impl Send for Map {}
// SAFETY: as above.
unsafe impl Sync for Map {}

impl Map {
    /// Map `fd`, a ring of `cap` data bytes (shared, read-write).
    fn new(fd: RawFd, cap: usize) -> io::Result<Self> {
        // SAFETY: a fresh mapping of a file we hold; the kernel picks the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                HEADER + cap,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        NonNull::new(p.cast())
            .map(|base| Self { base, cap })
            .ok_or_else(|| io::Error::other("mmap returned null"))
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `off` is one of the header's word offsets, 8-byte aligned inside the
        // mapping, which lives as long as `self`; AtomicU64 may alias memory others write.
        unsafe { &*self.base.as_ptr().add(off).cast::<AtomicU64>() }
    }

    /// The header's words, for the handshakes of [`super::ring_sync`].
    fn header(&self) -> Header<'_> {
        Header {
            head: self.word(HEAD),
            tail: self.word(TAIL),
        }
    }

    fn data(&self) -> *mut u8 {
        // SAFETY: the data follows the header inside the mapping.
        unsafe { self.base.as_ptr().add(HEADER) }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: we mapped exactly this range and nothing refers to it any more.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), HEADER + self.cap);
        }
    }
}

/// Bytes from `tail` to `head` (what the ring holds), refused when more than the ring's `cap`:
/// the peer wrote an impossible index (its `which` one), and the connection fails.
fn distance(head: u64, tail: u64, cap: usize, which: &str) -> io::Result<usize> {
    let d = head.wrapping_sub(tail);
    if d > cap as u64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "same-host ring: the peer's {which} index is impossible (write {head}, read \
                 {tail}, ring {cap} bytes)"
            ),
        ));
    }
    Ok(d as usize)
}

/// The ring this side receives on: made here, offered to the peer.
#[derive(Debug)]
pub(crate) struct Inbound {
    map: Arc<Map>,
    /// The file, open until the peer has surely taken it (its first record says so).
    fd: Option<OwnedFd>,
    /// Bytes taken so far (the published `tail` is only a copy of this).
    tail: u64,
    /// The writer asked for room and the last read made some: wake it.
    wake_writer: bool,
}

/// Why a ring could not be made or taken.
fn err(what: &str) -> io::Error {
    io::Error::other(format!(
        "same-host ring: {what}: {}",
        io::Error::last_os_error()
    ))
}

impl Inbound {
    /// A fresh ring of `cap` data bytes (a power of two in the allowed range).
    pub(crate) fn with_bytes(cap: usize) -> io::Result<Self> {
        // SAFETY: memfd_create with a NUL-terminated name; the descriptor is owned below.
        let fd = unsafe {
            libc::memfd_create(
                c"morio-ring".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(err("memfd_create"));
        }
        // SAFETY: a descriptor we just created.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain calls on our descriptor.
        unsafe {
            if libc::ftruncate(fd.as_raw_fd(), (HEADER + cap) as libc::off_t) != 0 {
                return Err(err("ftruncate"));
            }
            let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
            if libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) != 0 {
                return Err(err("seal"));
            }
        }
        let map = Arc::new(Map::new(fd.as_raw_fd(), cap)?);
        Ok(Self {
            map,
            fd: Some(fd),
            tail: 0,
            wake_writer: false,
        })
    }

    /// The file's descriptor in this process, for the peer to take (`None` once closed).
    pub(crate) fn fd(&self) -> Option<RawFd> {
        self.fd.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// The peer has switched to the ring, so it holds the file: close ours.
    pub(crate) fn taken(&mut self) {
        self.fd = None;
    }

    /// Copy up to `out.len()` waiting bytes into `out`; how many (0: empty). Fails if the
    /// producer's index is impossible.
    pub(crate) fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let cap = self.map.cap;
        let head = self.map.header().head();
        let avail = distance(head, self.tail, cap, "write")?;
        let n = out.len().min(avail);
        if n == 0 {
            return Ok(0);
        }
        let at = (self.tail % cap as u64) as usize;
        let first = n.min(cap - at);
        // SAFETY: both ranges lie inside the data area, which lives with `self.map`; `out`
        // is ours. The peer may write the source concurrently only if it is hostile, and then
        // the bytes copied are just untrusted input, like a socket's.
        unsafe {
            std::ptr::copy_nonoverlapping(self.map.data().add(at), out.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(self.map.data(), out.as_mut_ptr().add(first), n - first);
        }
        self.tail += n as u64;
        self.wake_writer |= self.map.header().publish_tail(self.tail);
        Ok(n)
    }

    /// Whether bytes are waiting (as [`Self::read`] would find them).
    pub(crate) fn has_bytes(&self) -> bool {
        self.map.header().has_bytes(self.tail)
    }

    /// After taking bytes: whether the producer waits for room (then wake it), once per
    /// request.
    pub(crate) fn producer_waits(&mut self) -> bool {
        std::mem::take(&mut self.wake_writer)
    }

    /// Ask for a doorbell: from now on the producer rings after writing. `true` if bytes
    /// arrived meanwhile (the request is withdrawn: read them instead of waiting).
    pub(crate) fn park(&self) -> bool {
        self.map.header().park(self.tail)
    }

    /// No doorbell wanted (the consumer is reading).
    pub(crate) fn unpark(&self) {
        self.map.header().unpark();
    }

    /// A probe for the busy poller: whether the producer has written past the published
    /// read index (a hostile peer can only make it say yes for nothing).
    pub(crate) fn probe(&self) -> impl Fn() -> bool + 'static {
        let map = self.map.clone();
        move || {
            let h = map.word(HEAD).load(Ordering::Relaxed) & INDEX;
            h != map.word(TAIL).load(Ordering::Relaxed) & INDEX
        }
    }
}

/// The peer's ring, which this side writes.
#[derive(Debug)]
pub(crate) struct Outbound {
    map: Arc<Map>,
    /// Bytes written so far (the published `head` is only a copy of this).
    head: u64,
    /// The reader asked for a doorbell and the last write answered it: ring.
    ring_bell: bool,
}

impl Outbound {
    /// Take the ring the peer offers as `fd` (duplicated into this process): refused unless
    /// it is a memory file sealed against shrinking whose data area is a power of two in the
    /// allowed range, so the mapping can never fault.
    pub(crate) fn adopt(fd: OwnedFd) -> io::Result<Self> {
        let raw = fd.as_raw_fd();
        // SAFETY: fcntl and fstat on a descriptor we own, into a zeroed stat.
        let (seals, st) = unsafe {
            let seals = libc::fcntl(raw, libc::F_GET_SEALS);
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(raw, &mut st) != 0 {
                return Err(err("fstat"));
            }
            (seals, st)
        };
        let need = libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;
        if seals < 0 || seals & need != need {
            return Err(io::Error::other(
                "same-host ring: the peer's file is not a memory file sealed against shrinking",
            ));
        }
        let cap = usize::try_from(st.st_size)
            .ok()
            .and_then(|n| n.checked_sub(HEADER))
            .filter(|&n| bytes_ok(n));
        let Some(cap) = cap.filter(|_| st.st_mode & libc::S_IFMT == libc::S_IFREG) else {
            return Err(io::Error::other(format!(
                "same-host ring: the peer's file has {} bytes, not 4 KiB and a power of two \
                 from {MIN_RING_BYTES} to {MAX_RING_BYTES}",
                st.st_size
            )));
        };
        let map = Arc::new(Map::new(raw, cap)?);
        Ok(Self {
            map,
            head: 0,
            ring_bell: false,
        })
    }

    /// Data bytes of the ring.
    pub(crate) fn cap(&self) -> usize {
        self.map.cap
    }

    /// Write as much of `parts` from (`idx`, `off`) as fits, moving the position on, and
    /// publish it; the bytes written. Fails if the consumer's index is impossible.
    pub(crate) fn write(
        &mut self,
        parts: &[&[u8]],
        idx: &mut usize,
        off: &mut usize,
    ) -> io::Result<usize> {
        let cap = self.map.cap;
        let tail = self.map.header().tail();
        let mut room = cap - distance(self.head, tail, cap, "read")?;
        let mut wrote = 0usize;
        while room > 0 && *idx < parts.len() {
            let src = &parts[*idx][*off..];
            let n = src.len().min(room);
            let at = ((self.head + wrote as u64) % cap as u64) as usize;
            let first = n.min(cap - at);
            // SAFETY: the destination ranges lie inside the data area, in the free part the
            // consumer does not read until `head` is published below.
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr(), self.map.data().add(at), first);
                std::ptr::copy_nonoverlapping(src.as_ptr().add(first), self.map.data(), n - first);
            }
            wrote += n;
            room -= n;
            if n == src.len() {
                *idx += 1;
                *off = 0;
            } else {
                *off += n;
            }
        }
        if wrote > 0 {
            self.head += wrote as u64;
            self.ring_bell |= self.map.header().publish_head(self.head);
        }
        Ok(wrote)
    }

    /// Free bytes in the ring now (the consumer may free more at any time). Fails if the
    /// consumer's index is impossible.
    pub(crate) fn room(&self) -> io::Result<usize> {
        let cap = self.map.cap;
        Ok(cap - distance(self.head, self.map.header().tail(), cap, "read")?)
    }

    /// After writing: whether the consumer waits for a doorbell (ring it then), once per
    /// park.
    pub(crate) fn doorbell_wanted(&mut self) -> bool {
        std::mem::take(&mut self.ring_bell)
    }

    /// The ring is full: ask the consumer to wake this side when it takes bytes. `true` if
    /// there is room already (no need to wait).
    pub(crate) fn wait_room(&self) -> bool {
        self.map.header().wait_room(self.head, self.map.cap as u64)
    }
}

thread_local! {
    /// This thread's (a shard's) doorbells rung and waits for room, for its stats.
    static COUNTS: std::cell::Cell<RingCounts> = const { std::cell::Cell::new(RingCounts { doorbells: 0, full_waits: 0 }) };
    /// Doorbells that other threads (applications' express writes) rang on the rings this
    /// thread's lanes send into: theirs to add, this shard's to report.
    static EXPRESS_BELLS: Arc<AtomicU64> = Arc::new(AtomicU64::new(0));
}

/// The counter of doorbells rung by express writes into the rings of the calling shard's
/// lanes (given to each such ring when its lane connects, on the shard).
pub(crate) fn express_bells() -> Arc<AtomicU64> {
    EXPRESS_BELLS.with(Arc::clone)
}

/// What the rings of the calling shard have done so far.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RingCounts {
    /// Doorbells rung for parked readers.
    pub(crate) doorbells: u64,
    /// Sends that found the peer's ring full and waited for room.
    pub(crate) full_waits: u64,
}

/// The calling shard's [`RingCounts`], express writes' doorbells into its lanes' rings
/// included.
pub(crate) fn counts() -> RingCounts {
    let mut c = COUNTS.with(std::cell::Cell::get);
    c.doorbells += EXPRESS_BELLS.with(|b| b.load(Ordering::Relaxed));
    c
}

/// Count a wait for room in a peer's ring on the calling shard.
pub(crate) fn count_full_wait() {
    COUNTS.with(|c| {
        let mut v = c.get();
        v.full_waits += 1;
        c.set(v);
    });
}

/// Ring the doorbell: one byte into the connection's socket `fd` (non-blocking; a full socket
/// holds doorbells already, and a broken one is the reader's to report), counted for the
/// calling shard.
pub(crate) fn ring_doorbell(fd: RawFd) {
    COUNTS.with(|c| {
        let mut v = c.get();
        v.doorbells += 1;
        c.set(v);
    });
    send_doorbell(fd);
}

/// [`ring_doorbell`] from any thread, counted on `bells` (an [`express_bells`] counter).
pub(crate) fn ring_doorbell_for(fd: RawFd, bells: &AtomicU64) {
    bells.fetch_add(1, Ordering::Relaxed);
    send_doorbell(fd);
}

fn send_doorbell(fd: RawFd) {
    // SAFETY: a non-blocking send of one byte from a live buffer on the connection's socket.
    unsafe {
        libc::send(
            fd,
            [0u8].as_ptr().cast(),
            1,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both ends of one ring in this process (the descriptor duplicated as the peer would).
    fn pair() -> (Inbound, Outbound) {
        let inb = Inbound::with_bytes(RING_BYTES).unwrap();
        // SAFETY: dup of a descriptor we hold; the copy is owned by the OwnedFd.
        let dup = unsafe { OwnedFd::from_raw_fd(libc::dup(inb.fd().unwrap())) };
        (inb, Outbound::adopt(dup).unwrap())
    }

    /// Bytes of every size, gathered from several parts, come out in order across many
    /// wrap-arounds, whatever the sizes of the reads and of the ring.
    #[test]
    fn bytes_come_out_in_order_across_wraps() {
        for cap in [MIN_RING_BYTES, RING_BYTES, 1 << 20] {
            let rx = Inbound::with_bytes(cap).unwrap();
            // SAFETY: dup of a descriptor we hold; the copy is owned by the OwnedFd.
            let dup = unsafe { OwnedFd::from_raw_fd(libc::dup(rx.fd().unwrap())) };
            stream_through(rx, Outbound::adopt(dup).unwrap(), cap);
        }
    }

    fn stream_through(mut rx: Inbound, mut tx: Outbound, cap: usize) {
        let mut rng = 0x1234_5678_9abc_def0_u64;
        let mut next = |m: usize| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % m as u64) as usize
        };
        let stream: Vec<u8> = (0..(3 * cap + 12345))
            .map(|i| (i * 7 + i / 251) as u8)
            .collect();
        let mut sent = 0usize;
        let mut got = Vec::with_capacity(stream.len());
        while got.len() < stream.len() {
            if sent < stream.len() {
                let a = (sent + next(70_000)).min(stream.len());
                let b = (a + next(5_000)).min(stream.len());
                let parts = [&stream[sent..a], &stream[a..b]];
                let (mut idx, mut off) = (0, 0);
                let n = tx.write(&parts, &mut idx, &mut off).unwrap();
                sent += n;
            }
            let mut buf = vec![0u8; 1 + next(90_000)];
            let n = rx.read(&mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        assert!(got == stream, "the stream came out changed");
        assert!(!rx.has_bytes());
    }

    /// A full ring takes nothing more until the consumer reads; the producer is told there is
    /// room only then, and the consumer is told the producer waits.
    #[test]
    fn a_full_ring_waits_for_room() {
        let (mut rx, mut tx) = pair();
        let big = vec![9u8; RING_BYTES + 100];
        let (mut idx, mut off) = (0, 0);
        assert_eq!(tx.write(&[&big], &mut idx, &mut off).unwrap(), RING_BYTES);
        assert_eq!((idx, off), (0, RING_BYTES));
        assert_eq!(tx.write(&[&big], &mut idx, &mut off).unwrap(), 0);
        assert!(!tx.wait_room(), "full: wait");
        let mut buf = [0u8; 10];
        assert_eq!(rx.read(&mut buf).unwrap(), 10);
        assert!(
            rx.producer_waits(),
            "the consumer wakes the waiting producer"
        );
        assert!(!rx.producer_waits(), "once");
        assert!(tx.wait_room());
        assert_eq!(tx.write(&[&big], &mut idx, &mut off).unwrap(), 10);
    }

    /// The doorbell protocol: a parked consumer gets exactly one doorbell for the bytes
    /// written after it parked; one that parks with bytes waiting is told to read instead.
    #[test]
    fn doorbells_only_for_parked_consumers() {
        let (mut rx, mut tx) = pair();
        let (mut i, mut o) = (0, 0);
        tx.write(&[b"ab"], &mut i, &mut o).unwrap();
        assert!(!tx.doorbell_wanted(), "nobody parked");
        assert!(rx.park(), "bytes wait: read them");
        let mut buf = [0u8; 8];
        assert_eq!(rx.read(&mut buf).unwrap(), 2);
        assert!(!rx.park(), "empty: wait for the doorbell");
        let (mut i, mut o) = (0, 0);
        tx.write(&[b"c"], &mut i, &mut o).unwrap();
        assert!(tx.doorbell_wanted());
        assert!(!tx.doorbell_wanted(), "one doorbell per park");
        assert!(rx.has_bytes());
        let probe = rx.probe();
        assert!(probe());
        rx.read(&mut buf).unwrap();
        assert!(!probe());
    }

    /// A peer that scribbles over the indices fails the connection on either side.
    #[test]
    fn impossible_indices_are_refused() {
        let (mut rx, mut tx) = pair();
        rx.map
            .word(HEAD)
            .store(RING_BYTES as u64 + 1, Ordering::SeqCst);
        assert!(rx.read(&mut [0u8; 4]).is_err());
        rx.map.word(HEAD).store(u64::MAX, Ordering::SeqCst);
        assert!(rx.read(&mut [0u8; 4]).is_err());
        tx.map.word(TAIL).store(7, Ordering::SeqCst);
        let (mut i, mut o) = (0, 0);
        assert!(
            tx.write(&[b"x"], &mut i, &mut o).is_err(),
            "tail ahead of head"
        );
    }

    /// Only a sealed memory file of the ring's size is taken.
    #[test]
    fn only_sealed_ring_files_are_adopted() {
        // SAFETY: plain descriptor calls; every descriptor is owned by an OwnedFd.
        unsafe {
            let unsealed = libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC);
            assert!(unsealed >= 0);
            assert_eq!(
                libc::ftruncate(unsealed, (HEADER + RING_BYTES) as libc::off_t),
                0
            );
            assert!(Outbound::adopt(OwnedFd::from_raw_fd(unsealed)).is_err());
            let small =
                libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING);
            assert_eq!(libc::ftruncate(small, 4096), 0);
            let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
            assert_eq!(libc::fcntl(small, libc::F_ADD_SEALS, seals), 0);
            assert!(
                Outbound::adopt(OwnedFd::from_raw_fd(small)).is_err(),
                "too small"
            );
            let odd =
                libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING);
            assert_eq!(
                libc::ftruncate(odd, (HEADER + RING_BYTES + 4096) as libc::off_t),
                0
            );
            assert_eq!(libc::fcntl(odd, libc::F_ADD_SEALS, seals), 0);
            assert!(
                Outbound::adopt(OwnedFd::from_raw_fd(odd)).is_err(),
                "not a power of two"
            );
            let mut fds = [0; 2];
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            libc::close(fds[1]);
            assert!(
                Outbound::adopt(OwnedFd::from_raw_fd(fds[0])).is_err(),
                "a pipe"
            );
        }
    }
}
