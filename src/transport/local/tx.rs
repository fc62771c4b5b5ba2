//! The sending half of a same-host connection: small parts into the peer's ring (or the
//! socket, before version 9), large ones described there and pulled by the peer, the send
//! complete once every one is acknowledged.

use std::io;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use morio_shards::rt;

use futures_lite::AsyncReadExt;

use super::records::{
    put_device, put_inline, put_pull, Device, DevicePart, DeviceRecords, Pull, DECLINED,
    DECLINED_FOR_GOOD, MAX_INLINE, PULL_MIN_BYTES,
};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use super::ring::{ring_doorbell, Outbound};
use super::shared_ring::SharedRing;
use super::SlotRef;
use crate::gpu::IpcExport;

/// The sending half.
#[derive(Debug)]
pub(crate) struct LocalTx {
    out: Out,
    cell: SlotRef,
    heads: Vec<u8>,
    /// Which device records GPU memory may be offered in (the connection's version has
    /// them, and the peer has not declined them for good).
    device: DeviceRecords,
    /// Parts of at least this many bytes are pulled by the peer, smaller ones sent inline.
    pull_min: usize,
}

/// Where the record stream goes, and how this side waits on the peer.
#[derive(Debug)]
struct Out {
    w: rt::WriteHalf,
    /// The peer's ring, where the record stream goes (announced), shared with express
    /// writers; `None`: the stream goes into the socket.
    ring: Option<(Arc<SharedRing>, Option<OwnedFd>)>,
    /// Where the peer wakes this sender after an acknowledgement (or when its ring has room),
    /// and whether it has shown it does (its first byte comes when it took the socket).
    waker: Option<(rt::UnixReader, bool)>,
    /// The peer process (for the log only: the peer does all the cross-process work).
    peer: libc::pid_t,
    /// How long a send may wait for the peer (`op_timeout`).
    stall: Duration,
}

/// Clears the cell's token when the send ends however it ends (completed, failed, or its
/// future dropped): from then on a pull of its parts fails its check at the peer.
struct Withdraw<'a>(&'a SlotRef);

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        self.0.slot().live.store(0, Ordering::SeqCst);
    }
}

/// One piece of the gather list: a range of `heads`, or a part sent as is.
enum Piece {
    Head(usize, usize),
    Part(usize),
}

impl LocalTx {
    pub(crate) fn new(
        w: rt::WriteHalf,
        peer: libc::pid_t,
        cell: SlotRef,
        wake: Option<OwnedFd>,
        stall: Duration,
        device: DeviceRecords,
        ring: Option<(Outbound, Option<OwnedFd>)>,
    ) -> Self {
        let waker = wake.map(|rx| (rt::UnixReader::from_fd(rx), false));
        let ring = match ring {
            None => None,
            Some((ring, bell)) => {
                // The doorbell: the socket the peer gave for it, else the connection's own;
                // both stay open while this half lives, and its drop breaks the ring first.
                let fd = bell.as_ref().map_or(w.raw_fd(), AsRawFd::as_raw_fd);
                Some((Arc::new(SharedRing::new(ring, fd)), bell))
            }
        };
        Self {
            cell,
            heads: Vec::with_capacity(256),
            device,
            pull_min: ring
                .as_ref()
                .map_or(PULL_MIN_BYTES, |(r, _)| ring_pull_min(r.lock().ring.cap())),
            out: Out {
                w,
                ring,
                waker,
                peer,
                stall,
            },
        }
    }

    /// Whether the record stream goes through the peer's shared-memory ring.
    pub(crate) fn rides_ring(&self) -> bool {
        self.out.ring.is_some()
    }

    /// The peer's ring, for express writes (`None`: the stream goes into the socket).
    pub(crate) fn shared_ring(&self) -> Option<Arc<SharedRing>> {
        self.out.ring.as_ref().map(|(r, _)| r.clone())
    }

    /// Which device records GPU memory may be offered to the peer in.
    pub(crate) fn offers_device(&self) -> DeviceRecords {
        self.device
    }

    /// Send `head` (a frame's bytes), then offer `parts` of the exported allocations
    /// `allocs` as its payload (a DEVICE record where one will do, else DEVICES: the caller
    /// keeps to [`Self::offers_device`]). `Ok(true)` once the peer has copied them (the
    /// memory may be reused then); `Ok(false)` if it declined, and the caller must then send
    /// the same bytes as usual.
    pub(crate) async fn send_device(
        &mut self,
        head: &[u8],
        allocs: &[IpcExport],
        parts: &[DevicePart],
    ) -> io::Result<bool> {
        self.heads.clear();
        let token = loop {
            let t: u64 = rand::random();
            if t != 0 {
                break t;
            }
        };
        if !head.is_empty() {
            put_inline(head.len(), &mut self.heads);
        }
        let at = self.heads.len();
        let d = Device {
            allocs: allocs.to_vec(),
            cell: self.cell.addr(),
            token,
            parts: parts.to_vec(),
        };
        let sets = !d.fits_device_record();
        if self.device == DeviceRecords::None || (sets && self.device < DeviceRecords::Sets) {
            return Err(io::Error::other(
                "device parts this connection cannot carry",
            ));
        }
        put_device(&d, sets, &mut self.heads);
        let cell = self.cell.slot();
        cell.acked.store(0, Ordering::SeqCst);
        cell.live.store(token, Ordering::SeqCst);
        let withdraw = Withdraw(&self.cell);
        let gather: [&[u8]; 3] = [&self.heads[..at], head, &self.heads[at..]];
        self.out.put(&gather).await?;
        self.out.wait_acked(cell, 1).await?;
        drop(withdraw);
        match cell.acked.load(Ordering::SeqCst) {
            1 => Ok(true),
            DECLINED => Ok(false),
            DECLINED_FOR_GOOD => {
                log::info!(
                    "same-host peer process {} cannot open this process's GPU memory: staging \
                     it through host memory on this connection",
                    self.out.peer
                );
                self.device = DeviceRecords::None;
                Ok(false)
            }
            v => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("process {} answered a device part with {v}", self.out.peer),
            )),
        }
    }

    /// Send every byte of `parts`, in order: runs of small parts inline in the socket, each
    /// large part as a description the peer pulls. Returns once the peer has taken every
    /// pulled part (the caller may reuse the memory then), or fails after `op_timeout`.
    pub(crate) async fn send_all(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        self.heads.clear();
        let mut pieces: Vec<Piece> = Vec::with_capacity(parts.len() + 4);
        let token = loop {
            let t: u64 = rand::random();
            if t != 0 {
                break t;
            }
        };
        let cell = self.cell.slot();
        let mut pulls = 0u32;
        let mut i = 0;
        while i < parts.len() {
            if parts[i].len() >= self.pull_min {
                pulls += 1;
                let at = self.heads.len();
                let p = Pull {
                    addr: parts[i].as_ptr() as u64,
                    len: parts[i].len() as u64,
                    cell: self.cell.addr(),
                    token,
                    index: pulls,
                };
                put_pull(&p, &mut self.heads);
                pieces.push(Piece::Head(at, self.heads.len()));
                i += 1;
                continue;
            }
            // A run of small parts: one INLINE record.
            let start = i;
            let mut len = 0usize;
            while i < parts.len()
                && parts[i].len() < self.pull_min
                && len + parts[i].len() <= MAX_INLINE
            {
                len += parts[i].len();
                i += 1;
            }
            if len == 0 {
                continue;
            }
            let at = self.heads.len();
            put_inline(len, &mut self.heads);
            pieces.push(Piece::Head(at, self.heads.len()));
            pieces.extend(
                (start..i)
                    .filter(|&k| !parts[k].is_empty())
                    .map(Piece::Part),
            );
        }
        if pieces.is_empty() {
            return Ok(());
        }
        let withdraw = (pulls > 0).then(|| {
            cell.acked.store(0, Ordering::SeqCst);
            cell.live.store(token, Ordering::SeqCst);
            Withdraw(&self.cell)
        });
        let gather: Vec<&[u8]> = pieces
            .iter()
            .map(|p| match *p {
                Piece::Head(a, b) => &self.heads[a..b],
                Piece::Part(k) => parts[k],
            })
            .collect();
        self.out.put(&gather).await?;
        if pulls > 0 {
            self.out.wait_acked(cell, pulls).await?;
        }
        drop(withdraw);
        Ok(())
    }
}

impl Drop for LocalTx {
    /// Express writes stop before the doorbell socket closes (it closes with this half).
    fn drop(&mut self) {
        if let Some((ring, _)) = &self.out.ring {
            ring.close_express();
        }
    }
}

/// The pull threshold of a connection whose records go through a ring of `cap` bytes: a
/// quarter of the ring, at most 256 KiB (`MORIO_SAME_HOST_PULL_MIN` sets another, for A/B
/// runs). Through a ring an inline part costs two memory copies and no system call, while a
/// pulled one costs a cross-memory copy, an acknowledgement and a wake, and its lane has one
/// send in flight: on the dev VM parts of 64 KiB and 128 KiB × 256 moved 15–30 % faster
/// inline (docs/perf/same-host-rings-dev-vm.md). Larger parts keep the single copy.
fn ring_pull_min(cap: usize) -> usize {
    static ENV: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let env = *ENV.get_or_init(|| {
        std::env::var("MORIO_SAME_HOST_PULL_MIN")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n >= PULL_MIN_BYTES)
    });
    env.unwrap_or((cap / 4).min(256 << 10))
}

impl Out {
    /// Put the record bytes `gather` into the stream: into the peer's ring when there is one
    /// (ringing its doorbell if it waits for one; waiting, woken by the peer, while the ring
    /// is full, for `stall` at most), else into the socket.
    async fn put(&mut self, gather: &[&[u8]]) -> io::Result<()> {
        let Some((shared, bell)) = &self.ring else {
            return self.w.send_all(gather).await;
        };
        let (mut idx, mut off) = (0usize, 0usize);
        loop {
            let room = {
                let mut st = shared.lock();
                if st.is_broken() {
                    // Closed when its lane died (or a write found the peer's index
                    // impossible): what the lane still had to send fails with it.
                    return Err(io::Error::other("the same-host ring was closed"));
                }
                let wrote = st.ring.write(gather, &mut idx, &mut off).inspect_err(|_| {
                    SharedRing::set_broken(&mut st);
                })?;
                if wrote > 0 && st.ring.doorbell_wanted() {
                    ring_doorbell(bell.as_ref().map_or(self.w.raw_fd(), AsRawFd::as_raw_fd));
                }
                if idx == gather.len() {
                    return Ok(());
                }
                st.ring.wait_room()
            };
            if room {
                continue;
            }
            super::ring::count_full_wait();
            let stall = self.stall;
            wait_for(
                &mut self.waker,
                stall,
                self.w.raw_fd(),
                || shared.lock().ring.wait_room(),
                || format!("the same-host peer took no bytes out of its ring within {stall:?}"),
            )
            .await?;
        }
    }

    /// Wait until the peer acknowledged `n` pulled parts. The peer writes the cell from its
    /// own process, then sends a byte on the wake socket it took from this one.
    async fn wait_acked(&mut self, cell: &super::Slot, n: u32) -> io::Result<()> {
        let (peer, stall) = (self.peer, self.stall);
        wait_for(
            &mut self.waker,
            stall,
            self.w.raw_fd(),
            || cell.acked.load(Ordering::SeqCst) >= n as u64,
            || format!("process {peer} did not take a same-host send within {stall:?}"),
        )
        .await
    }
}

/// How long a sender whose peer wakes it waits between checks anyway (a lost wake costs
/// this, never a transfer).
const WOKEN_NAP: Duration = Duration::from_millis(2);

/// Wait until `done()` holds, for `stall` at most (then a timeout error saying `what`), or
/// until the connection (socket `fd`) is closed: the peer went away (it will never answer) or
/// this side closed it. The peer wakes this side through `waker` after it changed what
/// `done` looks at (and its end closes when the peer dies); a peer that could not take the
/// wake socket (an old kernel, a security policy) is checked on a timer instead, the naps
/// growing from a few µs (a part of a megabyte is pulled in tens of µs) to a fraction of a
/// millisecond. Giving up is safe: the caller withdraws its token, so a late copy by the
/// peer fails its check.
async fn wait_for(
    waker: &mut Option<(rt::UnixReader, bool)>,
    stall: Duration,
    fd: std::os::fd::RawFd,
    mut done: impl FnMut() -> bool,
    what: impl FnOnce() -> String,
) -> io::Result<()> {
    let deadline = Instant::now() + stall;
    let mut nap = Duration::from_micros(2);
    loop {
        if done() {
            return Ok(());
        }
        if closed(fd) {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the same-host connection closed while a send waited for the peer",
            ));
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(io::ErrorKind::TimedOut, what()));
        }
        nap_or_wake(waker, nap).await;
        nap = (nap * 2).min(Duration::from_micros(200));
    }
}

/// Whether the connection's socket `fd` is closed: shut down here, reset, or ended by the
/// peer (which never half-closes: its end means it is gone).
fn closed(fd: std::os::fd::RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one pollfd we own; a zero timeout never blocks.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}

/// Wait for the peer's wake (a byte on `waker`, once it has shown it sends them) or `nap`,
/// whichever comes first; the caller checks what it waits for again either way.
async fn nap_or_wake(waker: &mut Option<(rt::UnixReader, bool)>, nap: Duration) {
    let mut scratch = [0u8; 64];
    match waker {
        Some((s, woken)) => {
            let wait = if *woken { WOKEN_NAP } else { nap };
            match rt::timeout(wait, s.read(&mut scratch)).await {
                Some(Ok(k)) if k > 0 => *woken = true,
                // The channel broke: timers from now on.
                Some(_) => *waker = None,
                None => {}
            }
        }
        None => rt::sleep(nap).await,
    }
}
