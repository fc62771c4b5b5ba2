//! The same-host transport: a TCP connection between two processes of one host whose large
//! payloads never go through the socket. The receiver copies them out of the sender's memory
//! with one cross-memory-attach read (`process_vm_readv`), straight into their destination;
//! the socket carries the frames, the small payloads and the descriptions of the large ones
//! ([`records`]). A connection becomes one after the handshake proved that the peer process
//! is readable ([`crate::proto::handshake`], "Same host"); everything above the transport
//! (frames, checks, statuses, joins) is the same as over TCP.

mod records;
mod ring;
mod ring_sync;
mod rx;
mod shared_ring;
mod tx;

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use morio_shards::rt;

pub(crate) use records::{Device, DevicePart, DeviceRecords, MAX_DEVICE_ALLOCS, MAX_DEVICE_PAIRS};
pub(crate) use ring::{counts as ring_counts, default_bytes as default_ring_bytes};
pub(crate) use rx::{LocalRx, Verdict};
pub(crate) use shared_ring::{Declined, SharedRing};
pub(crate) use tx::LocalTx;

/// This host's boot id (`/proc/sys/kernel/random/boot_id`), read once; `None` where the
/// kernel does not expose it (the transport is then never offered).
pub(crate) fn host_id() -> Option<[u8; 16]> {
    static ID: OnceLock<Option<[u8; 16]>> = OnceLock::new();
    *ID.get_or_init(|| {
        let s = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let hex: Vec<u8> = s.trim().bytes().filter(|b| *b != b'-').collect();
        if hex.len() != 32 {
            return None;
        }
        let mut id = [0u8; 16];
        for (i, pair) in hex.chunks(2).enumerate() {
            id[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
        }
        Some(id)
    })
}

/// Let peers of this host read this process's memory where the Yama security module would
/// otherwise allow only its ancestors (`ptrace_scope` 1: `PR_SET_PTRACER_ANY`, done once,
/// logged). With `ptrace_scope` 2 or 3 nothing can be done here: the handshake's probe then
/// fails and connections stay on TCP.
pub(crate) fn prepare() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok());
        if scope == Some(1) {
            // SAFETY: prctl with integer arguments only.
            let r = unsafe { libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0) };
            if r == 0 {
                log::info!(
                    "same-host transport: allowed processes of this user to read this one's \
                     memory (Yama ptrace_scope 1); set same_host = off to keep it closed"
                );
            }
        }
    });
}

/// Whether this process could use the same-host transport with a peer of its user: `Err`
/// says why not (engines then use TCP). Checks the boot id, Yama's `ptrace_scope`, and that
/// the calls the transport makes are allowed (each tried on this process itself).
pub(crate) fn readiness() -> Result<(), String> {
    host_id().ok_or("the kernel exposes no boot id (/proc/sys/kernel/random/boot_id)")?;
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    if matches!(scope, Some(s) if s >= 2) {
        return Err(format!(
            "Yama ptrace_scope is {} (processes may not read each other's memory; 0 or 1 allows \
             it)",
            scope.unwrap_or(2)
        ));
    }
    let probe = 0x5eed_u64;
    let mut got = 0u64;
    read_peer(
        std::process::id() as libc::pid_t,
        &mut [libc::iovec {
            iov_base: (&mut got as *mut u64).cast(),
            iov_len: 8,
        }],
        &[libc::iovec {
            iov_base: (&probe as *const u64) as *mut libc::c_void,
            iov_len: 8,
        }],
    )
    .map_err(|e| format!("process_vm_readv is refused here ({e}): a seccomp profile?"))?;
    if got != probe {
        return Err("process_vm_readv read the wrong bytes".into());
    }
    if let Some(w) = Wake::new() {
        if take_fd(std::process::id() as libc::pid_t, w.tx.as_raw_fd()).is_none() {
            return Err(
                "pidfd_getfd is refused here (an old kernel or a seccomp profile): same-host \
                 sends would be checked on a timer"
                    .into(),
            );
        }
    }
    Ok(())
}

/// Whether this process can offer and take same-host rings: `Err` says why not (its
/// same-host connections then keep their records in the socket). Makes a ring and takes a
/// copy of it as a peer would.
pub(crate) fn ring_readiness() -> Result<(), String> {
    if !rings_enabled() {
        return Err("turned off (MORIO_SAME_HOST_RING=off)".into());
    }
    let ring = ring::Inbound::with_bytes(ring::default_bytes()).map_err(|e| e.to_string())?;
    let fd = ring.fd().ok_or("the ring has no descriptor")?;
    // SAFETY: duplicating a descriptor this process holds; the copy is owned below.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(format!(
            "cannot duplicate the ring's descriptor: {}",
            io::Error::last_os_error()
        ));
    }
    // SAFETY: a fresh descriptor of ours.
    ring::Outbound::adopt(unsafe { OwnedFd::from_raw_fd(dup) }).map_err(|e| e.to_string())?;
    Ok(())
}

/// A word pair of this process that peers read and write through the kernel: the probe of a
/// handshake (its proof in `proof`) and then the pull cell of the connection's sending half
/// (`live`, `acked`). Slots are never freed, only reused (a peer that reads one late reads a
/// value that is not its token, never unmapped memory).
#[repr(C, align(64))]
#[derive(Debug)]
pub(crate) struct Slot {
    /// The token of the send whose parts may be pulled now (0: none).
    pub(crate) live: AtomicU64,
    /// The index of the last part of that send the peer acknowledged.
    pub(crate) acked: AtomicU64,
    /// The handshake proof (two little-endian words).
    proof: [AtomicU64; 2],
    /// 1 + the descriptor (in this process) of the socket the peer may take to wake this
    /// side's sender after an acknowledgement (0: none).
    wake: AtomicU64,
    /// 1 + the descriptor of the ring this side offers to receive on (version 9; 0: none).
    ring: AtomicU64,
    /// 1 + the descriptor of the socket the peer may take to ring this side's doorbell
    /// (version 9; 0: none, then doorbells come through the connection's socket).
    bell: AtomicU64,
}

static SLOTS: Mutex<Vec<&'static Slot>> = Mutex::new(Vec::new());

/// A slot of this process, held until dropped.
#[derive(Debug)]
pub(crate) struct SlotRef(&'static Slot);

impl SlotRef {
    /// A free slot, cleared.
    pub(crate) fn take() -> Self {
        let s = SLOTS.lock().ok().and_then(|mut v| v.pop());
        let s = s.unwrap_or_else(|| {
            Box::leak(Box::new(Slot {
                live: AtomicU64::new(0),
                acked: AtomicU64::new(0),
                proof: [AtomicU64::new(0), AtomicU64::new(0)],
                wake: AtomicU64::new(0),
                ring: AtomicU64::new(0),
                bell: AtomicU64::new(0),
            }))
        });
        s.live.store(0, Ordering::SeqCst);
        s.acked.store(0, Ordering::SeqCst);
        Self(s)
    }

    /// Put a handshake proof in the slot.
    pub(crate) fn set_proof(&self, p: &[u8; 16]) {
        for (w, b) in self.0.proof.iter().zip(p.chunks(8)) {
            w.store(
                u64::from_le_bytes(b.try_into().unwrap_or_default()),
                Ordering::SeqCst,
            );
        }
    }

    /// Publish `fd` as the descriptor the peer may take to wake this side.
    pub(crate) fn set_wake(&self, fd: RawFd) {
        self.0.wake.store(fd as u64 + 1, Ordering::SeqCst);
    }

    /// Publish `fd` as the ring the peer may take to write this side's inbound bytes.
    pub(crate) fn set_ring(&self, fd: RawFd) {
        self.0.ring.store(fd as u64 + 1, Ordering::SeqCst);
    }

    /// Publish `fd` as the socket the peer may take to ring this side's doorbell.
    pub(crate) fn set_bell(&self, fd: RawFd) {
        self.0.bell.store(fd as u64 + 1, Ordering::SeqCst);
    }

    /// Its address, for the peer.
    pub(crate) fn addr(&self) -> u64 {
        self.0 as *const Slot as u64
    }

    pub(super) fn slot(&self) -> &'static Slot {
        self.0
    }
}

impl Drop for SlotRef {
    fn drop(&mut self) {
        self.0.live.store(0, Ordering::SeqCst);
        self.0.proof[0].store(0, Ordering::SeqCst);
        self.0.proof[1].store(0, Ordering::SeqCst);
        self.0.wake.store(0, Ordering::SeqCst);
        self.0.ring.store(0, Ordering::SeqCst);
        self.0.bell.store(0, Ordering::SeqCst);
        if let Ok(mut v) = SLOTS.lock() {
            v.push(self.0);
        }
    }
}

/// Offset of the proof within a slot (followed by the wake descriptor's word and, from
/// version 9, the ring's).
const PROOF_OFFSET: u64 = 16;
/// Offset of `acked` within a slot.
pub(crate) const ACKED_OFFSET: u64 = 8;

/// What a side takes from its proven peer: the socket that wakes the peer's sender, the
/// ring to write its bytes into and the socket that rings its doorbell (each `None` where the peer offers none, or the kernel, a
/// security policy or a check refuses it: then acknowledgements are checked on a timer, and
/// bytes go through the socket).
#[derive(Debug, Default)]
pub(crate) struct Taken {
    pub(crate) wake: Option<OwnedFd>,
    pub(crate) ring: Option<ring::Outbound>,
    /// The socket that rings the peer's doorbell (with the ring only).
    pub(crate) bell: Option<OwnedFd>,
}

/// Check that process `pid` holds `expect` in the probe slot at `slot`: that it is the peer of
/// this handshake, and that this process may read its memory. Then take what it offers
/// (connections of `version` 9 and later: its ring too).
pub(crate) fn check_peer(
    pid: u32,
    slot: u64,
    expect: &[u8; 16],
    version: u32,
) -> Result<Taken, String> {
    if pid == 0 || pid > i32::MAX as u32 {
        return Err(format!("no such process {pid}"));
    }
    let want = if version >= crate::proto::limits::RING_VERSION {
        40
    } else {
        24
    };
    let mut got = [0u8; 40];
    let n = read_peer(
        pid as libc::pid_t,
        &mut [libc::iovec {
            iov_base: got.as_mut_ptr().cast(),
            iov_len: want,
        }],
        &[libc::iovec {
            iov_base: slot.wrapping_add(PROOF_OFFSET) as *mut libc::c_void,
            iov_len: want,
        }],
    )
    .map_err(|e| format!("cannot read the memory of process {pid}: {e}"))?;
    if n != want || &got[..16] != expect {
        return Err(format!(
            "process {pid} does not hold this connection's proof (not the peer, or another \
             pid namespace)"
        ));
    }
    let word = |i: usize| u64::from_ne_bytes(got[i..i + 8].try_into().unwrap_or_default());
    let fd_of = |w: u64| w.checked_sub(1).and_then(|fd| RawFd::try_from(fd).ok());
    let wake = fd_of(word(16)).and_then(|fd| take_fd(pid as libc::pid_t, fd));
    let ring = fd_of(word(24))
        .filter(|_| want == 40 && rings_enabled())
        .and_then(|fd| take_fd(pid as libc::pid_t, fd))
        .and_then(|fd| {
            ring::Outbound::adopt(fd)
                .map_err(|e| {
                    log_once(
                        RingLog::Peer,
                        format!(
                            "same-host peer process {pid}: {e}; its bytes go through the socket"
                        ),
                    )
                })
                .ok()
        });
    // The doorbell socket matters only with the ring.
    let bell = fd_of(word(32))
        .filter(|_| ring.is_some())
        .and_then(|fd| take_fd(pid as libc::pid_t, fd));
    Ok(Taken { wake, ring, bell })
}

/// Which ring failure a log line is about.
#[derive(Clone, Copy)]
enum RingLog {
    /// This process could not make a ring.
    Make = 0,
    /// A peer's ring was refused.
    Peer = 1,
}

/// Log a ring failure at info level the first time of its kind in this process (rings fail
/// for every connection alike, a seccomp profile say: one line says it), at debug after.
fn log_once(kind: RingLog, msg: String) {
    static SAID: [AtomicBool; 2] = [AtomicBool::new(false), AtomicBool::new(false)];
    if SAID[kind as usize].swap(true, Ordering::Relaxed) {
        log::debug!("{msg}");
    } else {
        log::info!("{msg} (said once)");
    }
}

/// Whether this process offers and takes shared-memory rings (`MORIO_SAME_HOST_RING=off`
/// keeps same-host record streams in the socket, as version 8 does; for A/B runs).
pub(crate) fn rings_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        !matches!(
            std::env::var("MORIO_SAME_HOST_RING").as_deref(),
            Ok("off" | "0" | "false")
        )
    })
}

/// A duplicate of descriptor `fd` of process `pid`; `None` if the kernel refuses.
fn take_fd(pid: libc::pid_t, fd: RawFd) -> Option<OwnedFd> {
    crate::fdpass::take_fd(pid, fd).ok()
}

/// The wake channel of a sending half: the end it waits on, and the end the peer takes.
#[derive(Debug)]
pub(crate) struct Wake {
    /// Read by this side's sender (a byte per acknowledgement, at most).
    pub(crate) rx: OwnedFd,
    /// Taken by the peer (`pidfd_getfd`); kept open while the connection lives.
    pub(crate) tx: OwnedFd,
}

impl Wake {
    /// A fresh pair (non-blocking, close-on-exec), or `None`.
    pub(crate) fn new() -> Option<Self> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: socketpair writes two descriptors into `fds`, owned here on success.
        let r = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        // SAFETY: on success both descriptors are open and ours.
        (r == 0).then(|| unsafe {
            Self {
                rx: OwnedFd::from_raw_fd(fds[0]),
                tx: OwnedFd::from_raw_fd(fds[1]),
            }
        })
    }
}

/// Wake the peer's sender through `fd` (one byte; a full socket already holds a wake).
pub(crate) fn wake(fd: &OwnedFd) {
    // SAFETY: a non-blocking send of one byte from a live buffer on a descriptor we own.
    unsafe {
        libc::send(
            fd.as_raw_fd(),
            [1u8].as_ptr().cast(),
            1,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        );
    }
}

/// `process_vm_readv`: copy from `remote` ranges of process `pid` into `local` buffers; the
/// bytes copied.
pub(crate) fn read_peer(
    pid: libc::pid_t,
    local: &mut [libc::iovec],
    remote: &[libc::iovec],
) -> io::Result<usize> {
    // SAFETY: every local iovec points into memory the caller lends us for writing; the
    // remote ones are only read by the kernel in the other process (bad ones fail with EFAULT).
    let r = unsafe {
        libc::process_vm_readv(
            pid,
            local.as_ptr(),
            local.len() as _,
            remote.as_ptr(),
            remote.len() as _,
            0,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as usize)
}

/// `process_vm_writev` of one word: write `v` at `addr` in process `pid`.
pub(crate) fn write_peer_word(pid: libc::pid_t, addr: u64, v: u64) -> io::Result<()> {
    let bytes = v.to_ne_bytes();
    let local = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: 8,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: 8,
    };
    // SAFETY: the local iovec points at `bytes`, alive for the call; the remote address is
    // written by the kernel in the other process only (a bad one fails with EFAULT).
    let r = unsafe { libc::process_vm_writev(pid, &local, 1, &remote, 1, 0) };
    match r {
        8 => Ok(()),
        r if r < 0 => Err(io::Error::last_os_error()),
        _ => Err(io::Error::other("short cross-process write")),
    }
}

/// What makes a TCP connection a same-host one: the peer's pid, this side's slot and wake
/// channel, the peer's wake socket, the deadline of a send.
#[derive(Debug)]
pub(crate) struct Upgrade {
    /// The peer process.
    pub(crate) peer: u32,
    /// This side's slot (its pull cell from now on).
    pub(crate) slot: SlotRef,
    /// This side's wake channel (its sender waits on it), if one could be made.
    pub(crate) wake: Option<Wake>,
    /// The peer's wake socket, taken from it, if it offered one and the kernel allowed it.
    pub(crate) peer_wake: Option<OwnedFd>,
    /// The ring this side offered to receive on (version 9).
    pub(crate) ring: Option<ring::Inbound>,
    /// The peer's ring, taken from it: this side's bytes go there.
    pub(crate) peer_ring: Option<ring::Outbound>,
    /// This side's doorbell (with its ring): its receiver waits on `rx`, the peer took `tx`.
    pub(crate) bell: Option<Wake>,
    /// The peer's doorbell, taken from it.
    pub(crate) peer_bell: Option<OwnedFd>,
    /// How long a send may wait for the peer to take its parts (`op_timeout`).
    pub(crate) stall: Duration,
    /// Whether the connection carries device parts (its version has them).
    pub(crate) device: DeviceRecords,
}

/// This side's half of the same-host step: its slot holding its proof and the descriptor of
/// its wake channel, for the peer to read.
#[derive(Debug)]
pub(crate) struct Offer {
    slot: SlotRef,
    wake: Option<Wake>,
    ring: Option<ring::Inbound>,
    bell: Option<Wake>,
}

impl Offer {
    /// A slot holding `proof`, with a wake channel when one can be made and, on a connection
    /// of `version` 9 or later, a ring of `ring_bytes` to receive on.
    pub(crate) fn new(proof: &[u8; 16], version: u32, ring_bytes: usize) -> Self {
        let slot = SlotRef::take();
        slot.set_proof(proof);
        let wake = Wake::new();
        if let Some(w) = &wake {
            slot.set_wake(w.tx.as_raw_fd());
        }
        let ring = (version >= crate::proto::limits::RING_VERSION && rings_enabled())
            .then(|| {
                ring::Inbound::with_bytes(ring_bytes)
                    .map_err(|e| {
                        log_once(
                            RingLog::Make,
                            format!("{e}: same-host bytes go through the socket"),
                        )
                    })
                    .ok()
            })
            .flatten();
        if let Some(fd) = ring.as_ref().and_then(ring::Inbound::fd) {
            slot.set_ring(fd);
        }
        // A socket pair rings the doorbell for less than the TCP socket does (no TCP stack).
        let bell = ring.as_ref().and_then(|_| Wake::new());
        if let Some(b) = &bell {
            slot.set_bell(b.tx.as_raw_fd());
        }
        Self {
            slot,
            wake,
            ring,
            bell,
        }
    }

    /// The slot's address, for the peer.
    pub(crate) fn addr(&self) -> u64 {
        self.slot.addr()
    }

    /// What upgrades the connection once the peer (process `peer`, whose wake socket we
    /// may have taken) is proven.
    /// `version` is the one the connection speaks.
    pub(crate) fn upgrade(self, peer: u32, taken: Taken, stall: Duration, version: u32) -> Upgrade {
        Upgrade {
            peer,
            slot: self.slot,
            wake: self.wake,
            peer_wake: taken.wake,
            ring: self.ring,
            peer_ring: taken.ring,
            bell: self.bell,
            peer_bell: taken.bell,
            stall,
            device: DeviceRecords::of_version(version),
        }
    }
}

/// A same-host connection, whole.
#[derive(Debug)]
pub(crate) struct LocalConn {
    pub(crate) stream: rt::TcpStream,
    pub(crate) up: Upgrade,
}

/// A same-host connection on its way to another shard.
#[derive(Debug)]
pub(crate) struct LocalHandoff {
    pub(crate) fd: OwnedFd,
    pub(crate) up: Upgrade,
}

impl LocalConn {
    /// Its receiving and sending halves. With the peer's ring taken, the sending half's first
    /// record (RING, into the socket) moves its stream there.
    pub(crate) fn split(self) -> (LocalRx, LocalTx) {
        let (r, w) = rt::split(self.stream);
        let up = self.up;
        let pid = up.peer as libc::pid_t;
        let peer_ring = up.peer_ring.filter(|_| announce_ring(w.raw_fd()));
        let peer_bell = up.peer_bell.filter(|_| peer_ring.is_some());
        let offered = up.ring.map(|ring| (ring, up.bell));
        let (wake_rx, wake_tx) = up.wake.map(|w| (w.rx, w.tx)).unzip();
        (
            LocalRx::new(r, pid, up.peer_wake, up.device, offered, wake_tx),
            LocalTx::new(
                w,
                pid,
                up.slot,
                wake_rx,
                up.stall,
                up.device,
                peer_ring.map(|ring| (ring, peer_bell)),
            ),
        )
    }
}

/// Send the RING record on a fresh connection's socket `fd` (its first byte of records;
/// non-blocking, so `false` only if the socket cannot take one byte: the stream then stays
/// in the socket).
fn announce_ring(fd: RawFd) -> bool {
    // SAFETY: a non-blocking send of one byte from a live buffer on the connection's socket.
    let r = unsafe {
        libc::send(
            fd,
            [records::RING].as_ptr().cast(),
            1,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    r == 1
}
