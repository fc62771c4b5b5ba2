//! TCP, the first transport: dialing with the socket options set before the SYN, the
//! listening socket, accepted connections, hand-off of a socket between shards, shutdown.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use morio_shards::rt;

use super::express_port::SharedSocket;
use crate::config::TcpBackendConfig;

/// Connect to `addr` (buffer sizes and connection options set first) within the configured
/// operation timeout.
pub(crate) async fn dial(
    addr: SocketAddr,
    cfg: &TcpBackendConfig,
) -> Result<rt::TcpStream, String> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )
    .map_err(|e| format!("socket: {e}"))?;
    configure_buffers(&sock, cfg)
        .and_then(|_| configure_conn(&socket2::SockRef::from(&sock), cfg))
        .map_err(|e| format!("socket options: {e}"))?;
    rt::connect(sock, addr, cfg.op_timeout)
        .await
        .map_err(|e| format!("connect to {addr}: {e}"))
}

/// A listening socket on `addr` (address reuse, buffer sizes set before `listen` so accepted
/// connections inherit them), and the address it got (port 0 picks one).
pub(crate) fn bind(
    addr: SocketAddr,
    cfg: &TcpBackendConfig,
) -> io::Result<(socket2::Socket, SocketAddr)> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    sock.set_reuse_address(true)?;
    configure_buffers(&sock, cfg)?;
    sock.bind(&addr.into())?;
    sock.listen(1024)?;
    let local = sock
        .local_addr()?
        .as_socket()
        .ok_or_else(|| io::Error::other("no local address"))?;
    Ok((sock, local))
}

/// Options an accepted connection gets (a dialed one got them before connecting).
pub(crate) fn configure_accepted(s: &rt::TcpStream, cfg: &TcpBackendConfig) -> io::Result<()> {
    // SAFETY: the fd is open while `s` lives, which outlasts this borrow.
    let fd = unsafe { BorrowedFd::borrow_raw(s.as_raw_fd()) };
    configure_conn(&socket2::SockRef::from(&fd), cfg)
}

/// A duplicate of the stream's socket for another shard; the stream itself is dropped (and
/// its descriptor closed) here.
pub(crate) fn hand_off(s: rt::TcpStream) -> io::Result<OwnedFd> {
    // SAFETY: the fd is open for as long as `s` lives.
    let dup = unsafe { BorrowedFd::borrow_raw(s.as_raw_fd()) }.try_clone_to_owned();
    drop(s);
    dup
}

/// Take over a socket another shard handed off.
pub(crate) fn adopt(fd: OwnedFd) -> io::Result<rt::TcpStream> {
    // SAFETY: we own `fd`; the socket takes it over.
    let sock = unsafe { socket2::Socket::from_raw_fd(fd.into_raw_fd()) };
    rt::stream_from_socket(sock)
}

/// shutdown(2) both directions: the peer sees EOF, a pending read or accept here wakes.
pub(crate) fn shutdown(fd: RawFd) {
    // SAFETY: the caller's connection (and so its descriptor) is alive (see
    // `super::Closer`); shutdown neither closes nor frees it, and failure is harmless.
    unsafe {
        libc::shutdown(fd, libc::SHUT_RDWR);
    }
}

/// Reset a connection at once (`connect` with `AF_UNSPEC`, which disconnects a TCP socket):
/// the kernel sends a reset, drops the send and receive queues unsent and unread, and wakes
/// every pending read and write with an error. `shutdown` would instead send what is queued
/// and then a FIN; closing with a zero linger would reset only when the last descriptor
/// closes, after the lane's tasks end, while the queue keeps draining.
pub(crate) fn abort(fd: RawFd) {
    let unspec = libc::sockaddr {
        sa_family: libc::AF_UNSPEC as libc::sa_family_t,
        sa_data: [0; 14],
    };
    // SAFETY: as for `shutdown`: the descriptor is alive; `unspec` is a valid sockaddr of
    // the length given. Failure (a socket already closed by the peer) is harmless.
    unsafe {
        libc::connect(
            fd,
            &unspec,
            std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
        );
        libc::shutdown(fd, libc::SHUT_RDWR);
    }
}

/// Whether the peer reset the connection (a RST arrived: the socket is closed, though what
/// it received before may still wait to be read). `false` where the kernel does not say.
pub(crate) fn reset_by_peer(fd: RawFd) -> bool {
    // SAFETY: TCP_INFO fills at most `len` bytes of a struct we own; the descriptor is alive.
    unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let r = libc::getsockopt(
            fd,
            libc::SOL_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        );
        r == 0 && len > 0 && info.tcpi_state == TCP_CLOSE
    }
}

/// `TCP_CLOSE` in the kernel's `tcpi_state`.
const TCP_CLOSE: u8 = 7;

/// Options every connection gets (both ends): nodelay, keepalive, and a user timeout so a
/// peer that stops acknowledging data fails the connection instead of hanging it.
pub(crate) fn configure_conn(
    sock: &socket2::SockRef<'_>,
    cfg: &TcpBackendConfig,
) -> io::Result<()> {
    sock.set_tcp_nodelay(cfg.enable_ctrl_nodelay)?;
    if cfg.enable_keepalive {
        let ka = socket2::TcpKeepalive::new()
            .with_time(cfg.keepalive_idle)
            .with_interval(cfg.keepalive_intvl)
            .with_retries(cfg.keepalive_cnt);
        sock.set_tcp_keepalive(&ka)?;
    }
    sock.set_tcp_user_timeout(Some(cfg.op_timeout))?;
    Ok(())
}

/// Buffer sizes, set before connect/listen so window scaling follows them.
pub(crate) fn configure_buffers(sock: &socket2::Socket, cfg: &TcpBackendConfig) -> io::Result<()> {
    if cfg.sock_sndbuf_bytes > 0 {
        sock.set_send_buffer_size(cfg.sock_sndbuf_bytes)?;
    }
    if cfg.sock_rcvbuf_bytes > 0 {
        sock.set_recv_buffer_size(cfg.sock_rcvbuf_bytes)?;
    }
    Ok(())
}

/// A TCP connection's sending half, and the port through which application threads may send
/// express frames on its socket while its writer is idle (closed before the socket can
/// close: the port goes first when this drops, the socket with the last of its halves).
#[derive(Debug)]
pub(crate) struct TcpTx {
    pub(crate) w: rt::WriteHalf,
    pub(crate) port: Arc<SharedSocket>,
}

impl TcpTx {
    pub(crate) fn new(w: rt::WriteHalf) -> Self {
        let port = Arc::new(SharedSocket::new(w.raw_fd()));
        Self { w, port }
    }
}

impl Drop for TcpTx {
    fn drop(&mut self) {
        self.port.close();
    }
}
