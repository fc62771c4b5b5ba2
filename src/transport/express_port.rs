//! Express ports: where an application thread may put one small frame of its own straight
//! onto a lane's connection while the lane's writer is idle (express writes,
//! [`crate::service::express`]): the peer's shared-memory ring ([`local::SharedRing`]) or
//! the TCP socket itself ([`SharedSocket`]). Both keep the stream whole: a lock around the
//! write, and a gate the lane's writer holds closed while its own frames are under way.

use std::os::fd::RawFd;
#[cfg(feature = "testing")]
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::local;
pub(crate) use super::local::Declined;

/// A lane's connection as express writers see it.
#[derive(Clone, Debug)]
pub(crate) enum ExpressPort {
    /// Same host: the peer's ring.
    Ring(Arc<local::SharedRing>),
    /// TCP: the socket.
    Socket(Arc<SharedSocket>),
}

/// What became of a frame an express writer put.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Put {
    /// All of it went in.
    Whole,
    /// Only its start went in (the socket filled up): the rest waits in the port, the
    /// stream stands in the middle of the frame, and the lane's writer must be woken to send
    /// the rest ([`ExpressPort::begin`]) before anything else.
    Spilled,
}

impl ExpressPort {
    /// Put `frame` (one whole frame), never waiting: all of it, or (a socket only) its start
    /// with the rest kept for the writer, or nothing (`Err`: send it the usual way).
    pub(crate) fn put_frame(&self, frame: &[u8]) -> Result<Put, Declined> {
        match self {
            ExpressPort::Ring(r) => r.put_frame(frame).map(|()| Put::Whole),
            ExpressPort::Socket(s) => s.put_frame(frame),
        }
    }

    /// The writer starts a run of its own frames: no express write goes in until
    /// [`Self::end`]. Returns the bytes of a spilled frame, which must leave first.
    pub(crate) fn begin(&self) -> Vec<u8> {
        match self {
            ExpressPort::Ring(r) => {
                r.set_sender_busy(true);
                Vec::new()
            }
            ExpressPort::Socket(s) => s.begin(),
        }
    }

    /// The writer's run is over (the stream stands between frames).
    pub(crate) fn end(&self) {
        match self {
            ExpressPort::Ring(r) => r.set_sender_busy(false),
            ExpressPort::Socket(s) => s.end(),
        }
    }

    /// Whether a spilled frame waits for the writer.
    pub(crate) fn has_spill(&self) -> bool {
        match self {
            ExpressPort::Ring(_) => false,
            ExpressPort::Socket(s) => !s.lock().spill.is_empty(),
        }
    }

    /// Close the port for good (its lane is going away): once this returns, no express
    /// write goes in.
    pub(crate) fn close(&self) {
        match self {
            ExpressPort::Ring(r) => r.close_express(),
            ExpressPort::Socket(s) => s.close(),
        }
    }

    /// Whether each express write costs its caller a system call (a socket's `send`): then
    /// only a write with none other in flight to its peer goes express, and a burst leaves
    /// through the lane's writer, in one `send` for many frames.
    pub(crate) fn one_at_a_time(&self) -> bool {
        matches!(self, ExpressPort::Socket(_))
    }
}

/// Express sends over TCP take at most this many bytes of a frame (0: all the socket takes).
#[cfg(feature = "testing")]
static SEND_LIMIT: AtomicUsize = AtomicUsize::new(0);

/// Test hook: from now on, express sends over TCP in this process put at most `n` bytes of
/// a frame on the socket (0: no limit), so that frames spill and the lanes' writers send the
/// rest, as they do when a socket fills up.
#[cfg(feature = "testing")]
pub fn limit_express_sends(n: usize) {
    SEND_LIMIT.store(n, Ordering::Relaxed);
}

/// How much of a `len`-byte frame one express send may put.
fn send_len(len: usize) -> usize {
    #[cfg(feature = "testing")]
    {
        let limit = SEND_LIMIT.load(Ordering::Relaxed);
        if limit > 0 {
            return len.min(limit);
        }
    }
    len
}

/// A TCP connection's socket shared by its lane's writer and express writers.
#[derive(Debug)]
pub(crate) struct SharedSocket {
    state: Mutex<SockState>,
    /// The socket, owned by the connection's sending half, which closes this port before
    /// the socket can close ([`super::tcp::TcpTx`]); used only under the lock while the
    /// port is open.
    fd: RawFd,
}

#[derive(Debug, Default)]
struct SockState {
    /// The writer has a run of frames under way.
    sender_busy: bool,
    /// Closed, or a send failed: nobody writes through the port again.
    broken: bool,
    /// The rest of a frame whose start went in; the writer sends it first.
    spill: Vec<u8>,
}

impl SharedSocket {
    /// Share the socket `fd`, which the caller keeps open until it called [`Self::close`].
    pub(crate) fn new(fd: RawFd) -> Self {
        Self {
            state: Mutex::new(SockState::default()),
            fd,
        }
    }

    fn lock(&self) -> MutexGuard<'_, SockState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn put_frame(&self, frame: &[u8]) -> Result<Put, Declined> {
        let Ok(mut st) = self.state.try_lock() else {
            return Err(Declined::Busy);
        };
        if st.broken {
            return Err(Declined::Broken);
        }
        if st.sender_busy || !st.spill.is_empty() {
            return Err(Declined::Busy);
        }
        if frame.is_empty() {
            return Err(Declined::Full);
        }
        loop {
            // SAFETY: the port is open (checked under the lock, which `close` takes), so
            // the socket is; `frame` is a live slice.
            let r = unsafe {
                libc::send(
                    self.fd,
                    frame.as_ptr().cast(),
                    send_len(frame.len()),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if r > 0 {
                let n = r as usize;
                if n == frame.len() {
                    return Ok(Put::Whole);
                }
                st.spill.extend_from_slice(&frame[n..]);
                return Ok(Put::Spilled);
            }
            let e = std::io::Error::last_os_error();
            match e.kind() {
                std::io::ErrorKind::Interrupted if r < 0 => continue,
                std::io::ErrorKind::WouldBlock if r < 0 => return Err(Declined::Full),
                _ => {
                    // Shut down or failed: the lane learns it from its own reads and writes.
                    st.broken = true;
                    return Err(Declined::Broken);
                }
            }
        }
    }

    fn begin(&self) -> Vec<u8> {
        let mut st = self.lock();
        st.sender_busy = true;
        std::mem::take(&mut st.spill)
    }

    fn end(&self) {
        self.lock().sender_busy = false;
    }

    /// Close the port for good (see [`ExpressPort::close`]).
    pub(crate) fn close(&self) {
        self.lock().broken = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    fn port() -> (ExpressPort, UnixStream, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let p = ExpressPort::Socket(Arc::new(SharedSocket::new(a.as_raw_fd())));
        (p, a, b)
    }

    #[test]
    fn a_socket_port_sends_whole_frames_only_while_the_writer_is_idle() {
        let (p, _a, mut b) = port();
        assert_eq!(p.put_frame(b"one"), Ok(Put::Whole));
        assert!(p.begin().is_empty());
        assert_eq!(p.put_frame(b"two"), Err(Declined::Busy), "the writer runs");
        p.end();
        assert_eq!(p.put_frame(b"three"), Ok(Put::Whole));
        let mut got = [0u8; 8];
        b.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"onethree");
        p.close();
        assert_eq!(p.put_frame(b"four"), Err(Declined::Broken));
    }

    #[test]
    fn a_frame_the_socket_takes_in_part_is_finished_by_the_writer_first() {
        let (p, a, mut b) = port();
        // A small send buffer: a 64 KiB frame goes in only in part.
        socket2::SockRef::from(&a)
            .set_send_buffer_size(8 << 10)
            .unwrap();
        let frame: Vec<u8> = (0..64 << 10).map(|i| (i % 251) as u8).collect();
        match p.put_frame(&frame) {
            Ok(Put::Spilled) => {}
            other => panic!("expected a spilled frame, got {other:?}"),
        }
        assert!(p.has_spill());
        assert_eq!(
            p.put_frame(b"x"),
            Err(Declined::Busy),
            "nothing after a spill"
        );
        let rest = p.begin();
        assert!(!rest.is_empty() && rest.len() < frame.len());
        assert!(!p.has_spill());
        // The reader sees the frame whole once the writer sent the rest.
        let want = frame.clone();
        let reader = std::thread::spawn(move || {
            let mut all = vec![0u8; want.len()];
            b.read_exact(&mut all).unwrap();
            assert_eq!(all, want);
            b
        });
        a.set_nonblocking(false).unwrap();
        (&a).write_all(&rest).unwrap();
        let _b = reader.join().unwrap();
        p.end();
        assert_eq!(p.put_frame(b"y"), Ok(Put::Whole));
    }
}
