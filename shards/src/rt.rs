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

pub use glommio::net::{TcpListener, TcpStream};
pub use glommio::timer::sleep;
pub use glommio::{spawn_local, yield_if_needed, Task};

/// Wrap an already-listening socket (built with socket2 so options precede `listen`).
pub fn listener_from_socket(sock: socket2::Socket) -> TcpListener {
    // SAFETY: we own the fd and hand its ownership to the glommio listener.
    unsafe { TcpListener::from_raw_fd(sock.into_raw_fd()) }
}

/// Wrap a connected socket into a glommio stream on the current shard.
pub fn stream_from_socket(sock: socket2::Socket) -> io::Result<TcpStream> {
    sock.set_nonblocking(true)?;
    // SAFETY: we own the fd and hand its ownership to the glommio stream.
    Ok(unsafe { TcpStream::from_raw_fd(sock.into_raw_fd()) })
}

/// Connect `sock` (already configured, e.g. buffer sizes set before the SYN so window scaling
/// follows them) to `addr` within `timeout`, without blocking the executor: the blocking
/// `connect` runs on the shard's helper thread.
pub async fn connect(
    sock: socket2::Socket,
    addr: SocketAddr,
    timeout: Duration,
) -> io::Result<TcpStream> {
    let sock = glommio::executor()
        .spawn_blocking(move || sock.connect_timeout(&addr.into(), timeout).map(|_| sock))
        .await?;
    stream_from_socket(sock)
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

impl AsyncRead for ReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_read(cx, buf)
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_flush(cx)
    }
    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_close(cx)
    }
}
