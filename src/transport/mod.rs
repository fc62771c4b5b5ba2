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
//! TCP ([`tcp`]) is the first implementation. Another (shared memory, RDMA, AF_XDP) is a new
//! file here and one more variant of these types; nothing in `service/` changes.

pub(crate) mod framed;
pub(crate) mod tcp;

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_lite::AsyncRead;
use morio_shards::rt;

use crate::config::TcpBackendConfig;

/// A connection, whole (before it is split): for the handshake and the hand-off.
#[derive(Debug)]
pub(crate) enum Conn {
    /// A TCP stream.
    Tcp(rt::TcpStream),
}

/// A connection on its way to another shard (`Send`, unlike [`Conn`]).
#[derive(Debug)]
pub(crate) enum Handoff {
    /// A TCP socket.
    Tcp(std::os::fd::OwnedFd),
}

/// The receiving half of a connection.
#[derive(Debug)]
pub(crate) enum Rx {
    /// TCP.
    Tcp(rt::ReadHalf),
}

/// The sending half of a connection.
#[derive(Debug)]
pub(crate) enum Tx {
    /// TCP.
    Tcp(rt::WriteHalf),
}

/// Shuts a connection down: its peer sees it closed and its own receiving half wakes with
/// an error. Cheap to copy; valid while the connection's halves live (closing a connection
/// that is gone is a harmless no-op only as long as its descriptor was not reused, so the
/// owner drops its closers with the connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Closer {
    /// A TCP socket's descriptor.
    Tcp(std::os::fd::RawFd),
}

/// Accepts connections peers open to this engine.
#[derive(Debug)]
pub(crate) enum Listener {
    /// A listening TCP socket.
    Tcp(rt::TcpListener),
}

/// What the engine binds before its shards start (taken by the shard that accepts).
#[derive(Debug)]
pub(crate) enum Bound {
    /// A listening TCP socket.
    Tcp(socket2::Socket),
}

/// Dial the engine at `addr` within the configured timeout.
pub(crate) async fn dial(addr: SocketAddr, cfg: &TcpBackendConfig) -> Result<Conn, String> {
    tcp::dial(addr, cfg).await.map(Conn::Tcp)
}

/// Bind where the engine accepts connections; the address it got.
pub(crate) fn bind(addr: SocketAddr, cfg: &TcpBackendConfig) -> io::Result<(Bound, SocketAddr)> {
    let (sock, addr) = tcp::bind(addr, cfg)?;
    Ok((Bound::Tcp(sock), addr))
}

impl Bound {
    /// Start accepting on the current shard.
    pub(crate) fn into_listener(self) -> Listener {
        match self {
            Bound::Tcp(s) => Listener::Tcp(rt::listener_from_socket(s)),
        }
    }

    /// Its closer (shutdown wakes a pending accept).
    pub(crate) fn closer(&self) -> Closer {
        match self {
            Bound::Tcp(s) => Closer::Tcp(std::os::fd::AsRawFd::as_raw_fd(s)),
        }
    }
}

impl Listener {
    /// The next connection a peer opened.
    pub(crate) async fn accept(&self) -> io::Result<Conn> {
        match self {
            Listener::Tcp(l) => l.accept().await.map(Conn::Tcp).map_err(io::Error::from),
        }
    }
}

impl Conn {
    /// Send all of `bytes` (the handshake, before the connection is split).
    pub(crate) async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        use futures_lite::AsyncWriteExt;
        match self {
            Conn::Tcp(s) => s.write_all(bytes).await,
        }
    }

    /// Its closer.
    pub(crate) fn closer(&self) -> Closer {
        match self {
            Conn::Tcp(s) => Closer::Tcp(std::os::fd::AsRawFd::as_raw_fd(s)),
        }
    }

    /// Ready it for another shard (which calls [`Handoff::adopt`]).
    pub(crate) fn hand_off(self) -> io::Result<Handoff> {
        match self {
            Conn::Tcp(s) => tcp::hand_off(s).map(Handoff::Tcp),
        }
    }

    /// Set the options a data connection carries (an accepted one; dialed ones have them).
    pub(crate) fn configure(&self, cfg: &TcpBackendConfig) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => tcp::configure_accepted(s, cfg),
        }
    }

    /// Its receiving half, sending half and closer.
    pub(crate) fn split(self) -> (Rx, Tx, Closer) {
        let closer = self.closer();
        match self {
            Conn::Tcp(s) => {
                let (r, w) = rt::split(s);
                (Rx::Tcp(r), Tx::Tcp(w), closer)
            }
        }
    }
}

impl Handoff {
    /// Take over a connection another shard handed off, on the current shard.
    pub(crate) fn adopt(self) -> io::Result<Conn> {
        match self {
            Handoff::Tcp(fd) => tcp::adopt(fd).map(Conn::Tcp),
        }
    }
}

impl Closer {
    /// Shut the connection down (both directions).
    pub(crate) fn close(self) {
        match self {
            Closer::Tcp(fd) => tcp::shutdown(fd),
        }
    }
}

impl Tx {
    /// Send every byte of `parts`, in order, gathered into as few sends as the transport
    /// takes: a frame header and payload slices of registered memory leave without being
    /// copied into one buffer.
    pub(crate) async fn send_all(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        match self {
            Tx::Tcp(w) => w.send_all(parts).await,
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
        }
    }

    fn poll_read_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &mut [io::IoSliceMut<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Rx::Tcp(r) => Pin::new(r).poll_read_vectored(cx, bufs),
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
        }
    }
}
