//! The receiving half of a same-host connection: inline bytes from this side's ring (or the
//! socket, until the peer's RING record and on connections before version 9), pulled parts
//! copied out of the peer's memory straight into the caller's buffers.

use std::io::{self, IoSliceMut};
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_lite::AsyncRead;
use morio_shards::rt;

use super::records::{
    parse, BadRecord, Device, DeviceRecords, Pull, Record, DECLINED, DECLINED_FOR_GOOD, DEVICES,
    RING,
};
use super::ring::Inbound;
use super::{read_peer, wake, write_peer_word, ACKED_OFFSET};
use crate::gpu::IpcKind;

/// Socket bytes buffered at most (record heads and inline bytes).
const BUF_BYTES: usize = 64 << 10;
/// Inline bytes read from the socket straight into the caller's buffer when it wants at least
/// this many (no copy through ours).
const DIRECT_READ_BYTES: usize = 4 << 10;
/// Ring bytes buffered per read at most (record heads, frame heads, small payloads; larger
/// payloads are read straight into their destination): on the dev VM 16 KiB × 256 writes took
/// 407–422 µs against 559–629 µs when each read took all the ring held
/// (docs/perf/same-host-rings-dev-vm.md).
const RING_FILL_BYTES: usize = DIRECT_READ_BYTES;
/// Local buffers one pull fills at most (the kernel takes up to 1024 vectors; one more is
/// the token check).
const MAX_PULL_IOV: usize = 1023;

/// What the stream is in the middle of.
#[derive(Debug)]
enum Cur {
    /// Between records.
    Idle,
    /// This many inline bytes of the current record are still to come.
    Inline(usize),
    /// A part being pulled, and how much of it is in already.
    Pull(Pull, u64),
    /// Device parts offered, not yet taken or declined.
    Device(Device),
}

/// What the receiver did with offered device parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Copied into their destination (on the device, complete).
    Taken,
    /// Not this time (the destination is host memory): the bytes follow as usual.
    Declined,
    /// Never on this connection (the handles cannot be opened here): the bytes follow.
    DeclinedForGood,
}

/// Where the record stream's bytes come from.
enum Src {
    /// The socket.
    Socket,
    /// This side's ring (the socket brings doorbells, and says when the peer is gone).
    Ring {
        ring: Inbound,
        probe: rt::Probe,
        /// This side's doorbell socket (the peer took its other end), if one was made.
        bell: Option<rt::UnixStream>,
        /// The last poll found the ring empty on a busy shard and left the socket to the
        /// busy poller: drain what it may hold (doorbells, its end) before waiting again.
        watched: bool,
        /// The peer closed its end: end of stream once the ring is empty.
        eof: bool,
    },
}

impl std::fmt::Debug for Src {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Src::Socket => "Socket",
            Src::Ring { .. } => "Ring",
        })
    }
}

/// The receiving half.
#[derive(Debug)]
pub(crate) struct LocalRx {
    r: rt::ReadHalf,
    src: Src,
    /// The ring offered to the peer (and its doorbell), until the peer's RING record switches
    /// the stream to it.
    offered: Option<(Inbound, Option<super::Wake>)>,
    /// The end of this side's wake socket that the peer takes in the handshake: closed once
    /// the peer's first record shows it has (it takes what it takes before it sends).
    handed: Option<std::os::fd::OwnedFd>,
    peer: libc::pid_t,
    /// The peer's wake socket, written after each acknowledgement.
    wake: Option<std::os::fd::OwnedFd>,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    cur: Cur,
    /// The device records the connection's version has (others are refused).
    device: DeviceRecords,
    /// Kinds of export this side could not open from the peer (offers of them are declined
    /// without trying again), by [`IpcKind`] bit.
    refused: u8,
}

impl LocalRx {
    pub(crate) fn new(
        r: rt::ReadHalf,
        peer: libc::pid_t,
        wake: Option<std::os::fd::OwnedFd>,
        device: DeviceRecords,
        offered: Option<(Inbound, Option<super::Wake>)>,
        handed: Option<std::os::fd::OwnedFd>,
    ) -> Self {
        // The first byte tells the peer's sender we took its wake socket.
        if let Some(w) = &wake {
            super::wake(w);
        }
        Self {
            r,
            src: Src::Socket,
            offered,
            handed,
            peer,
            wake,
            buf: vec![0u8; BUF_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
            cur: Cur::Idle,
            device,
            refused: 0,
        }
    }

    /// Whether stream bytes wait to be read now, without waiting or consuming any: buffered
    /// here, or in the ring once the peer moved there, else in the socket.
    pub(crate) fn input_queued(&self) -> bool {
        self.end > self.start
            || match &self.src {
                Src::Socket => self.r.queued() > 0,
                Src::Ring { ring, .. } => ring.has_bytes(),
            }
    }

    /// Whether exports of `kind` from the peer could not be opened here before.
    pub(crate) fn refused(&self, kind: IpcKind) -> bool {
        self.refused & (1 << kind as u8) != 0
    }

    /// Remember that exports of `kind` from the peer cannot be opened here.
    pub(crate) fn refuse(&mut self, kind: IpcKind) {
        self.refused |= 1 << kind as u8;
    }

    /// The record head at the start of the buffer (see [`parse`]); a DEVICE record on a
    /// connection whose version has none is refused. A RING record switches the stream to
    /// this side's ring (whatever follows it in the socket is doorbells) and reads on there.
    fn next_record(&mut self) -> Result<Option<(Record, usize)>, BadRecord> {
        let rec = parse(&self.buf[self.start..self.end])?;
        if rec.is_some() {
            self.handed = None;
        }
        match rec {
            Some((Record::Device(_), _)) => {
                let tag = self.buf[self.start];
                let needs = if tag == DEVICES {
                    DeviceRecords::Sets
                } else {
                    DeviceRecords::Single
                };
                if self.device < needs {
                    return Err(BadRecord(tag));
                }
                Ok(rec)
            }
            Some((Record::Ring, _)) => {
                let (mut ring, bell) = self.offered.take().ok_or(BadRecord(RING))?;
                // The peer took the files in the handshake, before sending anything: close
                // this side's copies of what it took.
                ring.taken();
                let bell = bell.map(|b| rt::unix_stream_from_fd(b.rx));
                let probe: rt::Probe = std::rc::Rc::new(ring.probe());
                self.src = Src::Ring {
                    ring,
                    probe,
                    bell,
                    watched: false,
                    eof: false,
                };
                self.start = 0;
                self.end = 0;
                Ok(None)
            }
            r => Ok(r),
        }
    }

    /// Read stream bytes into `out`: from the socket, or from the ring once the peer moved
    /// there. `Ok(0)`: the stream ended.
    fn poll_src(&mut self, cx: &mut Context<'_>, out: &mut [u8]) -> Poll<io::Result<usize>> {
        let Src::Ring {
            ring,
            probe,
            bell,
            watched,
            eof,
        } = &mut self.src
        else {
            return Pin::new(&mut self.r).poll_read(cx, out);
        };
        let fd = self.r.raw_fd();
        loop {
            let n = ring.read(out)?;
            if n > 0 {
                ring.unpark();
                *watched = false;
                rt::note_activity();
                if ring.producer_waits() {
                    if let Some(w) = &self.wake {
                        wake(w);
                    }
                }
                return Poll::Ready(Ok(n));
            }
            if *eof {
                return Poll::Ready(Ok(0));
            }
            if *watched {
                // Woken with the ring empty: the socket may hold doorbells or its end.
                *watched = false;
                match drain(fd) {
                    Ok(true) => {}
                    Ok(false) => *eof = true,
                    Err(e) => return Poll::Ready(Err(e)),
                }
                continue;
            }
            if self_poll_on() && rt::busy_self_poll() {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            if rt::busy_wait_probe(probe, fd, cx) {
                *watched = true;
                return Poll::Pending;
            }
            // Ask for a doorbell, unless bytes came meanwhile.
            if ring.park() {
                continue;
            }
            // Should the shard turn busy while this reader waits for the doorbell, its poller
            // looks at the ring itself.
            rt::note_armed_probe(probe, cx);
            let mut scratch = [0u8; 64];
            if let Some(b) = bell {
                match Pin::new(b).poll_read(cx, &mut scratch) {
                    Poll::Ready(Ok(n)) if n > 0 => continue,
                    // The peer's end closed (it is going away; the socket says so) or broke:
                    // its doorbells come through the socket from now on.
                    Poll::Ready(_) => {
                        *bell = None;
                        continue;
                    }
                    Poll::Pending => {}
                }
            }
            // The socket: the peer's end, or doorbells from a peer without the socket pair.
            match self.r.poll_read_quiet(cx, &mut scratch) {
                Poll::Ready(Ok(0)) => *eof = true,
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Read more stream bytes into the buffer (after what it holds).
    fn fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let mut buf = std::mem::take(&mut self.buf);
        // From a ring, take little at a time: a read costs no system call, and what stays in
        // the ring reaches a large destination in one copy (straight from the ring) instead of
        // two (through this buffer).
        let top = match self.src {
            Src::Ring { .. } => buf.len().min(self.end + RING_FILL_BYTES),
            Src::Socket => buf.len(),
        };
        let p = self.poll_src(cx, &mut buf[self.end..top]);
        self.buf = buf;
        if let Poll::Ready(Ok(n)) = p {
            self.end += n;
        }
        p
    }

    /// Pull up to what `bufs` hold of part `p` from its `off`-th byte, then check the part
    /// was still the peer's to give; acknowledge it once it is all in.
    fn pull(&mut self, p: Pull, off: u64, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        let mut want = (p.len - off) as usize;
        let mut local: Vec<libc::iovec> = Vec::with_capacity(bufs.len().min(MAX_PULL_IOV) + 1);
        for b in bufs.iter_mut() {
            if want == 0 || local.len() == MAX_PULL_IOV {
                break;
            }
            let k = b.len().min(want);
            if k == 0 {
                continue;
            }
            local.push(libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: k,
            });
            want -= k;
        }
        let n: usize = local.iter().map(|v| v.iov_len).sum();
        let mut token = [0u8; 8];
        local.push(libc::iovec {
            iov_base: token.as_mut_ptr().cast(),
            iov_len: 8,
        });
        let remote = [
            libc::iovec {
                iov_base: (p.addr + off) as *mut libc::c_void,
                iov_len: n,
            },
            libc::iovec {
                iov_base: p.cell as *mut libc::c_void,
                iov_len: 8,
            },
        ];
        let got = read_peer(self.peer, &mut local, &remote).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("same-host read from process {}: {e}", self.peer),
            )
        })?;
        if got != n + 8 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("short same-host read from process {}", self.peer),
            ));
        }
        if u64::from_ne_bytes(token) != p.token {
            // The peer gave up on this send (its side failed or timed out): what was read may
            // be anything, so the connection ends here.
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                format!("process {} withdrew a same-host send", self.peer),
            ));
        }
        if off + n as u64 == p.len {
            write_peer_word(self.peer, p.cell + ACKED_OFFSET, p.index as u64)?;
            if let Some(w) = &self.wake {
                wake(w);
            }
            self.cur = Cur::Idle;
        } else {
            self.cur = Cur::Pull(p, off + n as u64);
        }
        Ok(n)
    }
}

impl LocalRx {
    /// The device parts the peer offers next, if the next record offers some (they stay
    /// offered until [`Self::settle_device`]); `None` if the next bytes come another way.
    pub(crate) fn poll_device(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Device>>> {
        loop {
            match &self.cur {
                Cur::Device(d) => return Poll::Ready(Ok(Some(d.clone()))),
                Cur::Inline(_) | Cur::Pull(..) => return Poll::Ready(Ok(None)),
                Cur::Idle => match self.next_record() {
                    Ok(Some((Record::Device(d), used))) => {
                        self.start += used;
                        self.cur = Cur::Device(d);
                    }
                    Ok(Some(_)) => return Poll::Ready(Ok(None)),
                    Ok(None) => match self.fill(cx) {
                        Poll::Ready(Ok(0)) => {
                            return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()))
                        }
                        Poll::Ready(Ok(_)) => {}
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Pending => return Poll::Pending,
                    },
                    Err(e) => {
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            e.to_string(),
                        )))
                    }
                },
            }
        }
    }

    /// Answer the offered device parts. Taken: the sender's token is checked first (it
    /// still waited for this copy, so the bytes copied were its to give), then the copy is
    /// acknowledged. Declined: the same bytes follow as ordinary records.
    pub(crate) fn settle_device(&mut self, v: Verdict) -> io::Result<()> {
        let Cur::Device(d) = std::mem::replace(&mut self.cur, Cur::Idle) else {
            return Err(io::Error::other("no device parts are offered"));
        };
        let word = match v {
            Verdict::Taken => {
                let mut token = [0u8; 8];
                let got = read_peer(
                    self.peer,
                    &mut [libc::iovec {
                        iov_base: token.as_mut_ptr().cast(),
                        iov_len: 8,
                    }],
                    &[libc::iovec {
                        iov_base: d.cell as *mut libc::c_void,
                        iov_len: 8,
                    }],
                )?;
                if got != 8 || u64::from_ne_bytes(token) != d.token {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        format!("process {} withdrew a same-host device send", self.peer),
                    ));
                }
                1
            }
            Verdict::Declined => DECLINED,
            Verdict::DeclinedForGood => DECLINED_FOR_GOOD,
        };
        write_peer_word(self.peer, d.cell + ACKED_OFFSET, word)?;
        if let Some(w) = &self.wake {
            wake(w);
        }
        Ok(())
    }

    /// The peer process.
    pub(crate) fn peer(&self) -> u32 {
        self.peer as u32
    }
}

/// Read and drop what the socket `fd` holds (doorbells): `Ok(false)` if the peer closed it.
fn drain(fd: std::os::fd::RawFd) -> io::Result<bool> {
    let mut bell = [0u8; 64];
    loop {
        // SAFETY: a non-blocking receive into a live local buffer on the connection's socket.
        let r = unsafe { libc::recv(fd, bell.as_mut_ptr().cast(), bell.len(), libc::MSG_DONTWAIT) };
        match r {
            0 => return Ok(false),
            1.. => continue,
            _ => {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock => Ok(true),
                    io::ErrorKind::Interrupted => continue,
                    _ => Err(e),
                };
            }
        }
    }
}

/// Copy `src` into `bufs`, in order; the bytes copied.
fn scatter(src: &[u8], bufs: &mut [IoSliceMut<'_>]) -> usize {
    let mut done = 0;
    for b in bufs.iter_mut() {
        if done == src.len() {
            break;
        }
        let k = b.len().min(src.len() - done);
        crate::small_copy::copy(&mut b[..k], &src[done..done + k]);
        done += k;
    }
    done
}

impl AsyncRead for LocalRx {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_read_vectored(cx, &mut [IoSliceMut::new(buf)])
    }

    fn poll_read_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if bufs.iter().all(|b| b.is_empty()) {
            return Poll::Ready(Ok(0));
        }
        loop {
            match &this.cur {
                Cur::Device(_) => {
                    // A reader of bytes (its destination is host memory): the same bytes
                    // follow as ordinary records.
                    if let Err(e) = this.settle_device(Verdict::Declined) {
                        return Poll::Ready(Err(e));
                    }
                }
                &Cur::Pull(p, off) => return Poll::Ready(this.pull(p, off, bufs)),
                &Cur::Inline(left) => {
                    if this.start == this.end {
                        // Nothing buffered: a large enough first buffer takes the bytes
                        // straight from the socket.
                        if let Some(b) = bufs.iter_mut().find(|b| !b.is_empty()) {
                            if b.len() >= DIRECT_READ_BYTES {
                                let k = b.len().min(left);
                                let n = match this.poll_src(cx, &mut b[..k]) {
                                    Poll::Ready(Ok(n)) => n,
                                    other => return other,
                                };
                                if n > 0 {
                                    this.cur = if n == left {
                                        Cur::Idle
                                    } else {
                                        Cur::Inline(left - n)
                                    };
                                }
                                return Poll::Ready(Ok(n));
                            }
                        }
                        match this.fill(cx) {
                            Poll::Ready(Ok(0)) => return Poll::Ready(Ok(0)),
                            Poll::Ready(Ok(_)) => {}
                            other => return other,
                        }
                    }
                    let have = (this.end - this.start).min(left);
                    let n = scatter(&this.buf[this.start..this.start + have], bufs);
                    this.start += n;
                    this.cur = if n == left {
                        Cur::Idle
                    } else {
                        Cur::Inline(left - n)
                    };
                    return Poll::Ready(Ok(n));
                }
                Cur::Idle => match this.next_record() {
                    Ok(Some((rec, used))) => {
                        this.start += used;
                        this.cur = match rec {
                            Record::Inline(n) => Cur::Inline(n as usize),
                            Record::Pull(p) => Cur::Pull(p, 0),
                            Record::Device(d) => Cur::Device(d),
                            // Handled by `next_record`, which never returns it.
                            Record::Ring => Cur::Idle,
                        };
                    }
                    Ok(None) => match this.fill(cx) {
                        // EOF: clean between records (the frame reader decides whether it was
                        // between frames too).
                        Poll::Ready(Ok(0)) => return Poll::Ready(Ok(0)),
                        Poll::Ready(Ok(_)) => {}
                        other => return other,
                    },
                    Err(e) => {
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            e.to_string(),
                        )))
                    }
                },
            }
        }
    }
}

/// Whether ring readers poll themselves while their shard is busy (`rt::busy_self_poll`):
/// on, unless `MORIO_SELF_POLL=0` (for A/B runs).
fn self_poll_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MORIO_SELF_POLL").map_or(true, |v| v.trim() != "0"))
}
