//! The transport seam: how a shard reaches a peer and what a connection offers the service.
//!
//! The service never names a socket. It dials ([`dial`]) or accepts ([`Listener::accept`]) a
//! [`Conn`], exchanges the handshake on it whole ([`Conn::send`], [`framed::read_frame_exact`]),
//! may hand it to the shard that serves its lane ([`Conn::hand_off`] / [`Handoff::adopt`]),
//! then splits it ([`Conn::split`]) into a receiving half that places payloads straight into
//! registered memory ([`Rx`], read through [`framed::FrameReader`]), a sending half that sends a
//! frame followed by slices of registered memory in one gather ([`Tx`], written through
//! [`framed::FrameWriter`]), and a [`Closer`] that shuts it down from anywhere on the shard.
//!
//! TCP ([`tcp`]) is the first implementation; the same-host transport ([`local`]) the second:
//! a TCP connection to a process of this host, upgraded after its handshake, whose large
//! payloads the receiver copies out of the sender's memory instead of the socket; in-process
//! pipes (`mem`, built for tests) run the engine's shards with no socket at all. Another
//! (RDMA, AF_XDP) is a new file here and one more variant of these types; nothing in
//! `service/` changes.

pub(crate) mod abort;
pub(crate) mod express_port;
pub(crate) mod framed;
pub(crate) mod local;
#[cfg(any(test, feature = "testing"))]
pub(crate) mod mem;
pub(crate) mod tcp;

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_lite::AsyncRead;
use morio_shards::rt;

use crate::config::TcpBackendConfig;

/// Which transport an engine's backend uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Kind {
    /// TCP.
    #[default]
    Tcp,
    /// Pipes between engines of one process ([`mem`]; tests only).
    #[cfg(any(test, feature = "testing"))]
    InProcess,
}

/// A connection, whole (before it is split): for the handshake and the hand-off.
#[derive(Debug)]
pub(crate) enum Conn {
    /// A TCP stream.
    Tcp(rt::TcpStream),
    /// A same-host connection.
    Local(local::LocalConn),
    /// An in-process pipe pair.
    #[cfg(any(test, feature = "testing"))]
    Mem(mem::MemConn),
}

/// A connection on its way to another shard (`Send`, unlike [`Conn`]).
#[derive(Debug)]
pub(crate) enum Handoff {
    /// A TCP socket.
    Tcp(std::os::fd::OwnedFd),
    /// A same-host connection's socket and what upgraded it.
    Local(local::LocalHandoff),
    /// An in-process connection.
    #[cfg(any(test, feature = "testing"))]
    Mem(mem::MemConn),
}

/// The receiving half of a connection.
#[derive(Debug)]
pub(crate) enum Rx {
    /// TCP.
    Tcp(rt::ReadHalf),
    /// Same host (boxed: it carries its buffer's bookkeeping and ring).
    Local(Box<local::LocalRx>),
    /// In-process.
    #[cfg(any(test, feature = "testing"))]
    Mem(mem::MemRx),
}

/// The sending half of a connection.
#[derive(Debug)]
pub(crate) enum Tx {
    /// TCP (with its express port).
    Tcp(tcp::TcpTx),
    /// Same host (boxed, as its receiving half).
    Local(Box<local::LocalTx>),
    /// In-process.
    #[cfg(any(test, feature = "testing"))]
    Mem(mem::MemTx),
}

/// Shuts a connection down: its peer sees it closed and its own receiving half wakes with
/// an error. Cheap to clone; valid while the connection's halves live (closing a TCP
/// connection that is gone is a harmless no-op only as long as its descriptor was not
/// reused, so the owner drops its closers with the connection).
#[derive(Clone, Debug)]
pub(crate) enum Closer {
    /// A TCP socket's descriptor.
    Tcp(std::os::fd::RawFd),
    /// An in-process connection or listener.
    #[cfg(any(test, feature = "testing"))]
    Mem(mem::MemCloser),
}

/// Accepts connections peers open to this engine.
#[derive(Debug)]
pub(crate) enum Listener {
    /// A listening TCP socket.
    Tcp(rt::TcpListener),
    /// An in-process address.
    #[cfg(any(test, feature = "testing"))]
    Mem(mem::MemListener),
}

/// What the engine binds before its shards start (taken by the shard that accepts).
#[derive(Debug)]
pub(crate) enum Bound {
    /// A listening TCP socket.
    Tcp(socket2::Socket),
    /// An in-process address.
    #[cfg(any(test, feature = "testing"))]
    Mem(mem::MemBound),
}

/// Dial the engine at `addr` within the configured timeout.
pub(crate) async fn dial(
    addr: SocketAddr,
    cfg: &TcpBackendConfig,
    kind: Kind,
) -> Result<Conn, String> {
    match kind {
        Kind::Tcp => tcp::dial(addr, cfg).await.map(Conn::Tcp),
        #[cfg(any(test, feature = "testing"))]
        Kind::InProcess => mem::dial(addr).map(Conn::Mem),
    }
}

/// Bind where the engine accepts connections; the address it got.
pub(crate) fn bind(
    addr: SocketAddr,
    cfg: &TcpBackendConfig,
    kind: Kind,
) -> io::Result<(Bound, SocketAddr)> {
    match kind {
        Kind::Tcp => {
            let (sock, addr) = tcp::bind(addr, cfg)?;
            Ok((Bound::Tcp(sock), addr))
        }
        #[cfg(any(test, feature = "testing"))]
        Kind::InProcess => {
            let (b, addr) = mem::bind(addr)?;
            Ok((Bound::Mem(b), addr))
        }
    }
}

impl Bound {
    /// Start accepting on the current shard.
    pub(crate) fn into_listener(self) -> Listener {
        match self {
            Bound::Tcp(s) => Listener::Tcp(rt::listener_from_socket(s)),
            #[cfg(any(test, feature = "testing"))]
            Bound::Mem(b) => Listener::Mem(b.into_listener()),
        }
    }

    /// Its closer (shutdown wakes a pending accept).
    pub(crate) fn closer(&self) -> Closer {
        match self {
            Bound::Tcp(s) => Closer::Tcp(std::os::fd::AsRawFd::as_raw_fd(s)),
            #[cfg(any(test, feature = "testing"))]
            Bound::Mem(b) => Closer::Mem(b.closer()),
        }
    }
}

impl Listener {
    /// The next connection a peer opened.
    pub(crate) async fn accept(&self) -> io::Result<Conn> {
        match self {
            Listener::Tcp(l) => l.accept().await.map(Conn::Tcp).map_err(io::Error::from),
            #[cfg(any(test, feature = "testing"))]
            Listener::Mem(l) => l.accept().await.map(Conn::Mem),
        }
    }
}

impl Conn {
    /// Send all of `bytes` (the handshake, before the connection is split).
    pub(crate) async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        use futures_lite::AsyncWriteExt;
        match self {
            Conn::Tcp(s) => s.write_all(bytes).await,
            Conn::Local(c) => c.stream.write_all(bytes).await,
            #[cfg(any(test, feature = "testing"))]
            Conn::Mem(c) => c.send_all(&[bytes]).await,
        }
    }

    /// Its closer.
    pub(crate) fn closer(&self) -> Closer {
        match self {
            Conn::Tcp(s) => Closer::Tcp(std::os::fd::AsRawFd::as_raw_fd(s)),
            Conn::Local(c) => Closer::Tcp(std::os::fd::AsRawFd::as_raw_fd(&c.stream)),
            #[cfg(any(test, feature = "testing"))]
            Conn::Mem(c) => Closer::Mem(c.closer()),
        }
    }

    /// Ready it for another shard (which calls [`Handoff::adopt`]).
    pub(crate) fn hand_off(self) -> io::Result<Handoff> {
        match self {
            Conn::Tcp(s) => tcp::hand_off(s).map(Handoff::Tcp),
            Conn::Local(c) => {
                let fd = tcp::hand_off(c.stream)?;
                Ok(Handoff::Local(local::LocalHandoff { fd, up: c.up }))
            }
            #[cfg(any(test, feature = "testing"))]
            Conn::Mem(c) => Ok(Handoff::Mem(c)),
        }
    }

    /// Set the options a data connection carries (an accepted one; dialed ones have them).
    pub(crate) fn configure(&self, cfg: &TcpBackendConfig) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => tcp::configure_accepted(s, cfg),
            Conn::Local(c) => tcp::configure_accepted(&c.stream, cfg),
            #[cfg(any(test, feature = "testing"))]
            Conn::Mem(_) => Ok(()),
        }
    }

    /// Whether it is a same-host connection.
    pub(crate) fn is_local(&self) -> bool {
        matches!(self, Conn::Local(_))
    }

    /// The same-host connection this TCP one becomes after a handshake that proved its peer
    /// is process `up.peer` of this host; any other connection is returned unchanged.
    pub(crate) fn into_local(self, up: local::Upgrade) -> Conn {
        match self {
            Conn::Tcp(stream) => Conn::Local(local::LocalConn { stream, up }),
            other => other,
        }
    }

    /// Its receiving half, sending half and closer.
    pub(crate) fn split(self) -> (Rx, Tx, Closer) {
        let closer = self.closer();
        match self {
            Conn::Tcp(s) => {
                let (r, w) = rt::split(s);
                (Rx::Tcp(r), Tx::Tcp(tcp::TcpTx::new(w)), closer)
            }
            Conn::Local(c) => {
                let (r, w) = c.split();
                (Rx::Local(Box::new(r)), Tx::Local(Box::new(w)), closer)
            }
            #[cfg(any(test, feature = "testing"))]
            Conn::Mem(c) => {
                let (r, w, _) = c.split();
                (Rx::Mem(r), Tx::Mem(w), closer)
            }
        }
    }
}

impl Handoff {
    /// Take over a connection another shard handed off, on the current shard.
    pub(crate) fn adopt(self) -> io::Result<Conn> {
        match self {
            Handoff::Tcp(fd) => tcp::adopt(fd).map(Conn::Tcp),
            Handoff::Local(h) => Ok(Conn::Local(local::LocalConn {
                stream: tcp::adopt(h.fd)?,
                up: h.up,
            })),
            #[cfg(any(test, feature = "testing"))]
            Handoff::Mem(c) => Ok(Conn::Mem(c)),
        }
    }
}

impl Closer {
    /// Shut the connection down (both directions).
    pub(crate) fn close(&self) {
        match self {
            Closer::Tcp(fd) => tcp::shutdown(*fd),
            #[cfg(any(test, feature = "testing"))]
            Closer::Mem(c) => c.close(),
        }
    }

    /// Whether the peer reset the connection ([`tcp::reset_by_peer`]; `false` for in-process
    /// pipes).
    pub(crate) fn reset_by_peer(&self) -> bool {
        match self {
            Closer::Tcp(fd) => tcp::reset_by_peer(*fd),
            #[cfg(any(test, feature = "testing"))]
            Closer::Mem(_) => false,
        }
    }

    /// Reset the connection now: what its send queue still holds is dropped, never sent,
    /// and the peer gets a reset instead of the rest of the stream ([`tcp::abort`]).
    pub(crate) fn abort(&self) {
        match self {
            Closer::Tcp(fd) => tcp::abort(*fd),
            #[cfg(any(test, feature = "testing"))]
            Closer::Mem(c) => c.close(),
        }
    }
}

impl Tx {
    /// Whether its bytes travel through a shared-memory ring (same host, version 9).
    pub(crate) fn rides_ring(&self) -> bool {
        matches!(self, Tx::Local(w) if w.rides_ring())
    }

    /// Where express writers may put frames of their own: a TCP socket, or the peer's ring
    /// when the bytes travel through one (`None`: a same-host connection whose records go
    /// through its socket, in-process pipes).
    pub(crate) fn express_port(&self) -> Option<express_port::ExpressPort> {
        match self {
            Tx::Tcp(w) => Some(express_port::ExpressPort::Socket(w.port.clone())),
            Tx::Local(w) => w.shared_ring().map(express_port::ExpressPort::Ring),
            #[cfg(any(test, feature = "testing"))]
            Tx::Mem(_) => None,
        }
    }

    /// Which device records GPU memory may be offered in (a same-host connection whose peer
    /// takes them; `None` elsewhere).
    pub(crate) fn offers_device(&self) -> local::DeviceRecords {
        match self {
            Tx::Local(w) => w.offers_device(),
            _ => local::DeviceRecords::None,
        }
    }

    /// Send `head`, then offer `parts` of `allocs` as the payload after it; `Ok(false)` when
    /// the peer declined (or the transport has no device parts): send the bytes then.
    pub(crate) async fn send_device(
        &mut self,
        head: &[u8],
        allocs: &[crate::gpu::IpcExport],
        parts: &[local::DevicePart],
    ) -> io::Result<bool> {
        match self {
            Tx::Local(w) => w.send_device(head, allocs, parts).await,
            // No device parts here: the head leaves alone, the bytes follow as usual.
            other => other.send_all(&[head]).await.map(|()| false),
        }
    }

    /// Send every byte of `parts`, in order, gathered into as few sends as the transport
    /// takes: a frame header and payload slices of registered memory leave without being
    /// copied into one buffer.
    pub(crate) async fn send_all(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        match self {
            Tx::Tcp(w) => w.w.send_all(parts).await,
            Tx::Local(w) => w.send_all(parts).await,
            #[cfg(any(test, feature = "testing"))]
            Tx::Mem(w) => w.send_all(parts).await,
        }
    }
}

impl Rx {
    /// Whether bytes wait to be read now, without waiting or consuming any: a TCP socket's
    /// receive queue, a same-host connection's buffer, ring or socket; in-process pipes say no.
    pub(crate) fn input_queued(&self) -> bool {
        match self {
            Rx::Tcp(r) => r.queued() > 0,
            Rx::Local(r) => r.input_queued(),
            #[cfg(any(test, feature = "testing"))]
            Rx::Mem(_) => false,
        }
    }
}

impl AsyncRead for Rx {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Rx::Tcp(r) => Pin::new(r).poll_read(cx, buf),
            Rx::Local(r) => Pin::new(r).poll_read(cx, buf),
            #[cfg(any(test, feature = "testing"))]
            Rx::Mem(r) => Pin::new(r).poll_read_vectored(cx, &mut [io::IoSliceMut::new(buf)]),
        }
    }

    fn poll_read_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &mut [io::IoSliceMut<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Rx::Tcp(r) => Pin::new(r).poll_read_vectored(cx, bufs),
            Rx::Local(r) => Pin::new(r).poll_read_vectored(cx, bufs),
            #[cfg(any(test, feature = "testing"))]
            Rx::Mem(r) => Pin::new(r).poll_read_vectored(cx, bufs),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Local(c) => Pin::new(&mut c.stream).poll_read(cx, buf),
            #[cfg(any(test, feature = "testing"))]
            Conn::Mem(c) => c.poll_read(cx, buf),
        }
    }
}
