//! The runtime surface shards' services use: sockets, timers, tasks (a thin seam over glommio).

use std::cell::RefCell;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_lite::{AsyncRead, AsyncWrite};

pub use glommio::net::{TcpListener, TcpStream, UnixStream};
pub use glommio::{spawn_local, yield_if_needed, Task};

/// Sleep for `d` on the calling shard (a sleep under a millisecond also keeps a busy-polling
/// shard's runtime round trips frequent enough for it to fire on time).
pub async fn sleep(d: Duration) {
    crate::busy::sleep(d).await
}

/// How many socket reads the calling shard's busy poller has woken (0 unless the pool was
/// started with `spin_before_park`).
pub fn busy_poll_wakes() -> u64 {
    crate::busy::wakes()
}

/// How many times the calling shard's busy poller stopped because the shard was preempted.
pub fn busy_poll_backoffs() -> u64 {
    crate::busy::backoffs()
}

/// How many times the calling shard's busy poller, offering its CPU while it had nothing to
/// do, found another thread had taken it (a thread sharing the shard's CPU).
pub fn busy_poll_handoffs() -> u64 {
    crate::busy::handoffs()
}

/// Tell the calling shard's busy poller that a task here has just been woken by another, so
/// that its next turn lets that task run before it polls the sockets (a no-op unless the
/// shard busy-polls).
pub fn note_runnable() {
    crate::busy::note_runnable()
}

pub use crate::busy::Probe;

/// A reader of shared memory found it empty: `true` if it should wake itself and return
/// `Pending` (looking again on the executor's next round, without a wake-up from the poller:
/// only on a shard configured to spin, while busy, within 30 µs of its last event), `false`
/// if it should wait as usual ([`busy_wait_probe`]).
pub fn busy_self_poll() -> bool {
    crate::busy::self_poll()
}

/// How long a shard that busy-polls by default stays awake after its busy window, yielding
/// its CPU between polls (`MORIO_BUSY_YIELD_US`; zero: it parks at the window's end).
pub fn busy_yield_tail() -> std::time::Duration {
    crate::busy::yield_tail()
}

/// Time the busy poller's wakes of shared-memory readers from now on, in every shard of the
/// process (for latency tracing; a clock read per wake).
pub fn note_wake_times() {
    crate::busy::note_wake_times()
}

/// CLOCK_MONOTONIC ns at which the calling shard's busy poller last woke a shared-memory
/// reader (0: none since the last call, or wakes are not timed).
pub fn take_probe_wake_ns() -> u64 {
    crate::busy::take_probe_wake_ns()
}

/// A reader of shared memory (a same-host ring) found it empty. On a busy-polling shard that
/// is busy, its poller checks `probe` every turn (no system call) and, now and then, `fd`
/// (the connection's socket, which says when the peer is gone), and wakes the caller when
/// either has something: `true`, return `Pending`. Otherwise `false`: the caller arranges
/// its own wake-up (a doorbell on `fd`, through the runtime).
pub fn busy_wait_probe(probe: &Probe, fd: std::os::fd::RawFd, cx: &Context<'_>) -> bool {
    crate::busy::wait_probe(probe, cx) && crate::busy::watch_readable(fd, cx)
}

/// A reader of shared memory now waits on the runtime for a doorbell (the shard is idle): if
/// the shard turns busy first, its poller checks `probe` every turn and wakes the reader
/// once it says yes, without waiting for the doorbell's completion.
pub fn note_armed_probe(probe: &Probe, cx: &Context<'_>) {
    crate::busy::note_armed_probe(probe, cx)
}

/// Bytes arrived through shared memory: the calling shard is (still) busy.
pub fn note_activity() {
    crate::busy::note_activity()
}

/// The reading end of a Unix-domain stream whose reads a busy shard's poller watches: an
/// empty socket on a busy shard is polled by the poller (the reader wakes on its next turn);
/// otherwise the runtime waits on its readiness, which the poller also watches should the
/// shard turn busy first. A plain glommio read on a busy shard is noticed only when the
/// poller next sends the executor round its loop, up to a millisecond later.
#[derive(Debug)]
pub struct UnixReader {
    s: UnixStream,
    fd: std::os::fd::RawFd,
}

impl UnixReader {
    /// Wrap a connected Unix-domain socket on the current shard.
    pub fn from_fd(fd: std::os::fd::OwnedFd) -> Self {
        use std::os::fd::AsRawFd;
        let raw = fd.as_raw_fd();
        Self {
            s: unix_stream_from_fd(fd),
            fd: raw,
        }
    }
}

impl AsyncRead for UnixReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        // SAFETY: fd is the stream's open socket; buf is a valid writable slice.
        let r = unsafe {
            libc::recv(
                this.fd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if let Some(p) = received(r, this.fd, cx) {
            return p;
        }
        armed(
            Pin::new(&mut this.s).poll_read(cx, buf),
            this.fd,
            libc::POLLIN,
            cx,
        )
    }
}

/// Wrap an already-listening socket (built with socket2 so options precede `listen`).
pub fn listener_from_socket(sock: socket2::Socket) -> TcpListener {
    // SAFETY: we own the fd and hand its ownership to the glommio listener.
    unsafe { TcpListener::from_raw_fd(sock.into_raw_fd()) }
}

/// Wrap a connected Unix-domain socket into a glommio stream on the current shard.
pub fn unix_stream_from_fd(fd: std::os::fd::OwnedFd) -> UnixStream {
    // SAFETY: we own the fd and hand its ownership to the glommio stream.
    unsafe { UnixStream::from_raw_fd(fd.into_raw_fd()) }
}

/// Wrap a connected socket into a glommio stream on the current shard.
pub fn stream_from_socket(sock: socket2::Socket) -> io::Result<TcpStream> {
    sock.set_nonblocking(true)?;
    // SAFETY: we own the fd and hand its ownership to the glommio stream.
    Ok(unsafe { TcpStream::from_raw_fd(sock.into_raw_fd()) })
}

/// Connect `sock` (already configured, e.g. buffer sizes set before the SYN so window scaling
/// follows them) to `addr` within `timeout`, without blocking the executor: a non-blocking
/// `connect`, then the runtime waits for writability (a zero-byte send parks on POLLOUT
/// while the handshake is in progress), then `SO_ERROR` tells the outcome.
pub async fn connect(
    sock: socket2::Socket,
    addr: SocketAddr,
    timeout: Duration,
) -> io::Result<TcpStream> {
    use futures_lite::AsyncWriteExt;
    sock.set_nonblocking(true)?;
    match sock.connect(&addr.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    let probe = sock.try_clone()?;
    let mut stream = stream_from_socket(sock)?;
    let wait = async {
        loop {
            match stream.write(&[]).await {
                Ok(_) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        match probe.take_error()? {
            Some(e) => Err(e),
            None => Ok(()),
        }
    };
    match self::timeout(timeout, wait).await {
        Some(Ok(())) => {
            // Writable and no error pending: make sure the handshake really completed.
            probe.peer_addr()?;
            Ok(stream)
        }
        Some(Err(e)) => Err(e),
        None => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("connect to {addr} timed out"),
        )),
    }
}

/// Run `fut` with a deadline; `None` if it did not finish in time.
pub async fn timeout<F: std::future::Future>(dur: Duration, fut: F) -> Option<F::Output> {
    futures_lite::future::or(async { Some(fut.await) }, async {
        sleep(dur).await;
        None
    })
    .await
}

/// Split a stream into a reading half and a writing half that two tasks of the same shard can
/// drive at once (glommio keeps separate readiness sources for each direction).
pub fn split(stream: TcpStream) -> (ReadHalf, WriteHalf) {
    let s = Rc::new(RefCell::new(stream));
    (ReadHalf(s.clone()), WriteHalf(s))
}

/// The reading half of a split stream.
#[derive(Debug)]
pub struct ReadHalf(Rc<RefCell<TcpStream>>);

/// The writing half of a split stream.
#[derive(Debug)]
pub struct WriteHalf(Rc<RefCell<TcpStream>>);

impl WriteHalf {
    /// Shut both directions down: the peer sees EOF and our reading half wakes with an error.
    pub fn shutdown_both(&self) {
        use std::os::fd::AsRawFd;
        let fd = self.0.borrow().as_raw_fd();
        // SAFETY: shutdown(2) on a fd we own; failure (already closed) is harmless.
        unsafe {
            libc::shutdown(fd, libc::SHUT_RDWR);
        }
    }
}

impl ReadHalf {
    /// The socket's descriptor (valid while the connection lives).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&*self.0.borrow())
    }

    /// Bytes waiting in the socket's receive queue (`FIONREAD`), without reading any; 0 if
    /// the kernel does not say.
    pub fn queued(&self) -> usize {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int, ours; the descriptor is open while we are.
        let r = unsafe { libc::ioctl(self.raw_fd(), libc::FIONREAD, &mut n) };
        if r == 0 {
            usize::try_from(n).unwrap_or(0)
        } else {
            0
        }
    }

    /// Read like [`AsyncRead::poll_read`], but an empty socket is left to the runtime alone:
    /// the busy poller does not watch it (for a socket whose bytes are rare and never
    /// urgent, such as a same-host connection's, whose data comes through shared memory; a
    /// busy poller would otherwise poll it on every turn until it closes).
    pub fn poll_read_quiet(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        self.read_or_arm(cx, buf, false)
    }

    /// Try the socket first. glommio arms a readiness poll after every short read and then
    /// waits for that poll's completion before trying again, even when bytes are already
    /// queued; going to the socket directly keeps a busy stream free of that round trip.
    /// Only when the socket is empty does the runtime park us on readiness (which a busy
    /// poller also watches when `watch`).
    fn read_or_arm(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut [u8],
        watch: bool,
    ) -> Poll<io::Result<usize>> {
        use std::os::fd::AsRawFd;
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let fd = self.0.borrow().as_raw_fd();
        // SAFETY: fd is our open socket; buf is a valid writable slice.
        let r = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if let Some(p) = received(r, fd, cx) {
            return p;
        }
        let p = Pin::new(&mut *self.0.borrow_mut()).poll_read(cx, buf);
        if watch {
            armed(p, fd, libc::POLLIN, cx)
        } else {
            p
        }
    }
}

impl WriteHalf {
    /// The socket's descriptor (valid while the connection lives).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&*self.0.borrow())
    }

    /// Send every byte of `parts`, in order, gathering them into as few `sendmsg` calls as
    /// the socket takes (one, usually): a frame header and its payload slices leave together
    /// without being copied into one buffer first. Waits for writability through the runtime
    /// only when the socket is full.
    pub async fn send_all(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        use futures_lite::AsyncWriteExt;
        use std::os::fd::AsRawFd;
        const MAX_IOV: usize = 64;
        let fd = self.0.borrow().as_raw_fd();
        let (mut idx, mut off) = (0usize, 0usize);
        while idx < parts.len() {
            if off == parts[idx].len() {
                idx += 1;
                off = 0;
                continue;
            }
            let mut iov = [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; MAX_IOV];
            let mut n_iov = 0;
            for (i, p) in parts[idx..].iter().enumerate() {
                if n_iov == MAX_IOV {
                    break;
                }
                let p = if i == 0 { &p[off..] } else { p };
                if p.is_empty() {
                    continue;
                }
                iov[n_iov] = libc::iovec {
                    iov_base: p.as_ptr() as *mut libc::c_void,
                    iov_len: p.len(),
                };
                n_iov += 1;
            }
            // SAFETY: a zeroed msghdr is valid; it points at `iov`, which outlives the call.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = iov.as_mut_ptr();
            msg.msg_iovlen = n_iov as _;
            // SAFETY: fd is our open socket; the iovecs point into live slices.
            let r = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
            let mut sent = if r >= 0 {
                r as usize
            } else {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::Interrupted => continue,
                    // Full: a busy shard's poller watches for room; otherwise let the runtime
                    // wait for writability while it sends what it can.
                    io::ErrorKind::WouldBlock if crate::busy::writable(fd).await => continue,
                    io::ErrorKind::WouldBlock => self.write(&parts[idx][off..]).await?,
                    _ => return Err(e),
                }
            };
            while sent > 0 && idx < parts.len() {
                let left = parts[idx].len() - off;
                if sent < left {
                    off += sent;
                    sent = 0;
                } else {
                    sent -= left;
                    idx += 1;
                    off = 0;
                }
            }
        }
        Ok(())
    }
}

/// What a non-blocking receive that returned `r` means: bytes, EOF or an error (`Ready`); an
/// empty socket that a busy shard's poller now watches (`Pending`); or an empty socket that
/// the runtime must wait for (`None`).
fn received(r: isize, fd: std::os::fd::RawFd, cx: &Context<'_>) -> Option<Poll<io::Result<usize>>> {
    if r > 0 {
        crate::busy::note_activity();
    }
    if r >= 0 {
        crate::busy::forget_armed(fd, libc::POLLIN);
        return Some(Poll::Ready(Ok(r as usize)));
    }
    let e = io::Error::last_os_error();
    if e.kind() != io::ErrorKind::WouldBlock && e.kind() != io::ErrorKind::Interrupted {
        crate::busy::forget_armed(fd, libc::POLLIN);
        return Some(Poll::Ready(Err(e)));
    }
    crate::busy::wait_readable(fd, cx).then_some(Poll::Pending)
}

/// The runtime's answer `p` for `fd`: when it is `Pending`, the runtime now waits on a
/// readiness poll, which the busy poller also watches should the shard turn busy first.
fn armed<T>(p: Poll<T>, fd: std::os::fd::RawFd, events: i16, cx: &Context<'_>) -> Poll<T> {
    if p.is_pending() {
        crate::busy::note_armed(fd, events, cx);
    } else {
        crate::busy::forget_armed(fd, events);
    }
    p
}

impl AsyncRead for ReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().read_or_arm(cx, buf, true)
    }

    /// Scatter the socket's bytes over `bufs` in one `recvmsg` (a payload bound for many
    /// separate places arrives in one syscall instead of one per place).
    fn poll_read_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &mut [io::IoSliceMut<'_>],
    ) -> Poll<io::Result<usize>> {
        use std::os::fd::AsRawFd;
        const MAX_IOV: usize = 256;
        let n = bufs.len().min(MAX_IOV);
        if bufs[..n].iter().all(|b| b.is_empty()) {
            return Poll::Ready(Ok(0));
        }
        let fd = self.0.borrow().as_raw_fd();
        // SAFETY: a zeroed msghdr is valid; IoSliceMut is ABI-compatible with iovec, and the
        // buffers it points at are live and writable for the duration of the call.
        let r = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = bufs.as_mut_ptr().cast::<libc::iovec>();
            msg.msg_iovlen = n as _;
            libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT)
        };
        if let Some(p) = received(r, fd, cx) {
            return p;
        }
        // Let the runtime wait for the socket, reading into the first buffer when it can.
        match bufs[..n].iter_mut().find(|b| !b.is_empty()) {
            Some(first) => armed(
                Pin::new(&mut *self.0.borrow_mut()).poll_read(cx, first),
                fd,
                libc::POLLIN,
                cx,
            ),
            None => Poll::Ready(Ok(0)),
        }
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        use std::os::fd::AsRawFd;
        let fd = self.0.borrow().as_raw_fd();
        armed(
            Pin::new(&mut *self.0.borrow_mut()).poll_write(cx, buf),
            fd,
            libc::POLLOUT,
            cx,
        )
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_flush(cx)
    }
    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_close(cx)
    }
}
