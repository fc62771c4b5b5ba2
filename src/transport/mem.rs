//! In-process connections (tests only): byte pipes between engines of one process, so shard
//! tests run without a socket, and the proof that the service sees nothing of TCP. Engines
//! bind a port in a process-wide table (its own port space) and dial each other there.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll, Waker};

/// Bytes a pipe holds before its writer waits.
const PIPE_BYTES: usize = 4 << 20;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One direction of a connection.
#[derive(Debug, Default)]
struct PipeState {
    buf: VecDeque<u8>,
    /// The writer is gone: the reader sees EOF once `buf` is drained.
    writer_gone: bool,
    /// The connection was shut down, or the reader is gone: nothing more moves.
    shut: bool,
    reader: Option<Waker>,
    writer: Option<Waker>,
}

#[derive(Debug, Default)]
struct Pipe(Mutex<PipeState>);

impl Pipe {
    fn wake_all(s: &mut PipeState) {
        for w in [s.reader.take(), s.writer.take()].into_iter().flatten() {
            w.wake();
        }
    }

    fn shut(&self) {
        let mut s = lock(&self.0);
        s.shut = true;
        s.buf.clear();
        Self::wake_all(&mut s);
    }

    fn writer_gone(&self) {
        let mut s = lock(&self.0);
        s.writer_gone = true;
        Self::wake_all(&mut s);
    }

    fn poll_read_into(
        &self,
        cx: &Context<'_>,
        bufs: &mut [io::IoSliceMut<'_>],
    ) -> Poll<io::Result<usize>> {
        let mut s = lock(&self.0);
        if s.shut {
            return Poll::Ready(Ok(0));
        }
        if s.buf.is_empty() {
            if s.writer_gone {
                return Poll::Ready(Ok(0));
            }
            s.reader = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let mut n = 0;
        for b in bufs.iter_mut() {
            let take = b.len().min(s.buf.len());
            for (d, v) in b[..take].iter_mut().zip(s.buf.drain(..take)) {
                *d = v;
            }
            n += take;
            if s.buf.is_empty() {
                break;
            }
        }
        if let Some(w) = s.writer.take() {
            w.wake();
        }
        Poll::Ready(Ok(n))
    }

    fn poll_write_from(
        &self,
        cx: &Context<'_>,
        parts: &[&[u8]],
        done: &mut usize,
    ) -> Poll<io::Result<()>> {
        let mut s = lock(&self.0);
        let total: usize = parts.iter().map(|p| p.len()).sum();
        while *done < total {
            if s.shut {
                return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
            }
            let room = PIPE_BYTES.saturating_sub(s.buf.len());
            if room == 0 {
                s.writer = Some(cx.waker().clone());
                return Poll::Pending;
            }
            // The next bytes not yet written.
            let (mut skip, mut left) = (*done, room);
            for p in parts {
                if skip >= p.len() {
                    skip -= p.len();
                    continue;
                }
                let chunk = &p[skip..p.len().min(skip + left)];
                s.buf.extend(chunk);
                *done += chunk.len();
                left -= chunk.len();
                skip = 0;
                if left == 0 {
                    break;
                }
            }
            if let Some(w) = s.reader.take() {
                w.wake();
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// Both directions of one end of a connection.
#[derive(Debug)]
struct Ends {
    rx: Arc<Pipe>,
    tx: Arc<Pipe>,
}

/// One end of an in-process connection (`None` once split into its halves).
#[derive(Debug)]
pub(crate) struct MemConn(Option<Ends>);

/// Its receiving half.
#[derive(Debug)]
pub(crate) struct MemRx(Arc<Pipe>);

/// Its sending half.
#[derive(Debug)]
pub(crate) struct MemTx(Arc<Pipe>);

/// Shuts a connection down from anywhere.
#[derive(Clone, Debug)]
pub(crate) struct MemCloser(Option<(Arc<Pipe>, Arc<Pipe>)>, Option<Arc<Backlog>>);

impl Drop for MemRx {
    fn drop(&mut self) {
        // Nobody reads any more: the peer's writes fail.
        self.0.shut();
    }
}

impl Drop for MemTx {
    fn drop(&mut self) {
        self.0.writer_gone();
    }
}

impl Drop for MemConn {
    fn drop(&mut self) {
        // Dropped whole (never split): both directions end.
        if let Some(e) = self.0.take() {
            e.rx.shut();
            e.tx.writer_gone();
        }
    }
}

impl MemConn {
    fn pair() -> (Self, Self) {
        let (a, b) = (Arc::new(Pipe::default()), Arc::new(Pipe::default()));
        (
            Self(Some(Ends {
                rx: a.clone(),
                tx: b.clone(),
            })),
            Self(Some(Ends { rx: b, tx: a })),
        )
    }

    /// Its halves and closer.
    fn ends(&self) -> io::Result<&Ends> {
        self.0
            .as_ref()
            .ok_or_else(|| io::Error::other("connection already split"))
    }

    /// Its halves and closer.
    pub(crate) fn split(mut self) -> (MemRx, MemTx, MemCloser) {
        let closer = self.closer();
        // The halves take over; the whole end no longer ends the connection as it goes.
        let e = self.0.take().expect("a connection is split once");
        (MemRx(e.rx), MemTx(e.tx), closer)
    }

    /// Its closer.
    pub(crate) fn closer(&self) -> MemCloser {
        MemCloser(self.0.as_ref().map(|e| (e.rx.clone(), e.tx.clone())), None)
    }

    /// Send all of `parts`.
    pub(crate) async fn send_all(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        send_all(&self.ends()?.tx, parts).await
    }

    /// Read into `buf`.
    pub(crate) fn poll_read(&self, cx: &Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        match self.ends() {
            Ok(e) => e.rx.poll_read_into(cx, &mut [io::IoSliceMut::new(buf)]),
            Err(err) => Poll::Ready(Err(err)),
        }
    }
}

async fn send_all(pipe: &Pipe, parts: &[&[u8]]) -> io::Result<()> {
    let mut done = 0;
    std::future::poll_fn(|cx| pipe.poll_write_from(cx, parts, &mut done)).await
}

impl MemTx {
    /// Send all of `parts`, waiting while the pipe is full.
    pub(crate) async fn send_all(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        send_all(&self.0, parts).await
    }
}

impl MemRx {
    /// Read into `bufs`, in order.
    pub(crate) fn poll_read_vectored(
        self: Pin<&mut Self>,
        cx: &Context<'_>,
        bufs: &mut [io::IoSliceMut<'_>],
    ) -> Poll<io::Result<usize>> {
        self.0.poll_read_into(cx, bufs)
    }
}

impl MemCloser {
    /// Shut the connection (or listener) down.
    pub(crate) fn close(&self) {
        if let Some((rx, tx)) = &self.0 {
            rx.shut();
            tx.shut();
        }
        if let Some(b) = &self.1 {
            b.close();
        }
    }
}

/// Connections dialed to a listener, waiting for its accept.
#[derive(Debug, Default)]
struct BacklogState {
    conns: VecDeque<MemConn>,
    closed: bool,
    acceptor: Option<Waker>,
}

#[derive(Debug)]
pub(crate) struct Backlog {
    addr: SocketAddr,
    state: Mutex<BacklogState>,
}

impl Backlog {
    fn close(&self) {
        let mut s = lock(&self.state);
        s.closed = true;
        s.conns.clear();
        if let Some(w) = s.acceptor.take() {
            w.wake();
        }
        drop(s);
        let mut t = lock(table());
        if t.get(&self.addr)
            .is_some_and(|b| std::ptr::eq(b.as_ptr(), self))
        {
            t.remove(&self.addr);
        }
    }
}

/// A bound in-process address, before its shard accepts on it.
#[derive(Debug)]
pub(crate) struct MemBound(Arc<Backlog>);

/// Accepts in-process connections.
#[derive(Debug)]
pub(crate) struct MemListener(Arc<Backlog>);

impl Drop for MemListener {
    fn drop(&mut self) {
        self.0.close();
    }
}

impl MemBound {
    /// Start accepting.
    pub(crate) fn into_listener(self) -> MemListener {
        MemListener(self.0.clone())
    }

    /// Its closer.
    pub(crate) fn closer(&self) -> MemCloser {
        MemCloser(None, Some(self.0.clone()))
    }
}

impl MemListener {
    /// The next connection dialed to this address.
    pub(crate) async fn accept(&self) -> io::Result<MemConn> {
        std::future::poll_fn(|cx| {
            let mut s = lock(&self.0.state);
            if s.closed {
                return Poll::Ready(Err(io::Error::other("listener closed")));
            }
            match s.conns.pop_front() {
                Some(c) => Poll::Ready(Ok(c)),
                None => {
                    s.acceptor = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        })
        .await
    }
}

/// The process's in-process addresses.
fn table() -> &'static Mutex<HashMap<SocketAddr, std::sync::Weak<Backlog>>> {
    static T: OnceLock<Mutex<HashMap<SocketAddr, std::sync::Weak<Backlog>>>> = OnceLock::new();
    T.get_or_init(Default::default)
}

/// Bind `addr` in the process's in-process table (port 0: the next free one from 1).
pub(crate) fn bind(addr: SocketAddr) -> io::Result<(MemBound, SocketAddr)> {
    let mut t = lock(table());
    t.retain(|_, b| b.strong_count() > 0);
    let mut at = addr;
    if at.ip().is_unspecified() {
        // What an engine bound to every interface advertises.
        at.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    if at.port() == 0 {
        let port = (1..=u16::MAX)
            .find(|p| !t.contains_key(&SocketAddr::new(at.ip(), *p)))
            .ok_or_else(|| io::Error::from(io::ErrorKind::AddrInUse))?;
        at.set_port(port);
    } else if t.contains_key(&at) {
        return Err(io::ErrorKind::AddrInUse.into());
    }
    let b = Arc::new(Backlog {
        addr: at,
        state: Mutex::default(),
    });
    t.insert(at, Arc::downgrade(&b));
    Ok((MemBound(b), at))
}

/// Dial the engine bound at `addr` in this process.
pub(crate) fn dial(addr: SocketAddr) -> Result<MemConn, String> {
    let b = lock(table())
        .get(&addr)
        .and_then(|w| w.upgrade())
        .ok_or_else(|| format!("connect to {addr}: no in-process engine there"))?;
    let (mine, theirs) = MemConn::pair();
    let mut s = lock(&b.state);
    if s.closed {
        return Err(format!("connect to {addr}: listener closed"));
    }
    s.conns.push_back(theirs);
    if let Some(w) = s.acceptor.take() {
        w.wake();
    }
    Ok(mine)
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_lite::future::{block_on, poll_once};

    #[test]
    fn bytes_cross_in_order_and_close_ends_both_ways() {
        let (bound, addr) = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let l = bound.into_listener();
        let a = dial(addr).unwrap();
        let b = block_on(l.accept()).unwrap();
        let (mut arx, mut atx, aclose) = a.split();
        let (mut brx, _btx, _) = b.split();
        block_on(atx.send_all(&[b"he", b"llo"])).unwrap();
        let mut buf = [0u8; 8];
        let cx = &mut Context::from_waker(Waker::noop());
        let mut bufs = [io::IoSliceMut::new(&mut buf)];
        let n = Pin::new(&mut brx).poll_read_vectored(cx, &mut bufs);
        assert!(matches!(n, Poll::Ready(Ok(5))));
        assert_eq!(&buf[..5], b"hello");
        // Nothing more: the reader waits.
        let mut bufs = [io::IoSliceMut::new(&mut buf)];
        assert!(Pin::new(&mut brx)
            .poll_read_vectored(cx, &mut bufs)
            .is_pending());
        aclose.close();
        let mut bufs = [io::IoSliceMut::new(&mut buf)];
        assert!(matches!(
            Pin::new(&mut brx).poll_read_vectored(cx, &mut bufs),
            Poll::Ready(Ok(0))
        ));
        assert!(block_on(atx.send_all(&[b"x"])).is_err());
        let mut bufs = [io::IoSliceMut::new(&mut buf)];
        assert!(matches!(
            Pin::new(&mut arx).poll_read_vectored(cx, &mut bufs),
            Poll::Ready(Ok(0))
        ));
    }

    #[test]
    fn a_full_pipe_makes_the_writer_wait_until_read() {
        let (a, b) = MemConn::pair();
        let (_arx, mut atx, _) = a.split();
        let (mut brx, _btx, _) = b.split();
        let big = vec![7u8; PIPE_BYTES + 10];
        let parts = [&big[..]];
        let mut send = Box::pin(atx.send_all(&parts));
        assert!(
            block_on(poll_once(send.as_mut())).is_none(),
            "waits for room"
        );
        let mut buf = vec![0u8; 64];
        let cx = &mut Context::from_waker(Waker::noop());
        let mut bufs = [io::IoSliceMut::new(&mut buf)];
        assert!(matches!(
            Pin::new(&mut brx).poll_read_vectored(cx, &mut bufs),
            Poll::Ready(Ok(64))
        ));
        assert!(matches!(block_on(poll_once(send.as_mut())), Some(Ok(()))));
    }

    #[test]
    fn addresses_are_unique_and_freed_with_their_listener() {
        let (b1, a1) = bind("127.0.0.9:0".parse().unwrap()).unwrap();
        assert!(bind(a1).is_err(), "taken");
        let (_b2, a2) = bind("127.0.0.9:0".parse().unwrap()).unwrap();
        assert_ne!(a1, a2);
        drop(b1.into_listener());
        assert!(dial(a1).is_err(), "gone with its listener");
        assert!(bind(a1).is_ok());
    }
}
