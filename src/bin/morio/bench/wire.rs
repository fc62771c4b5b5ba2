//! The bench side channel between initiator and target: frames of a u32 big-endian length
//! and that many bytes, each a msgpack message. The initiator opens with a [`Setup`] (the
//! buffer its rows need); the target answers with a [`Welcome`]: its packed `EngineDesc`, the
//! packed `MemoryDesc` of a buffer of that size and a [`TargetInfo`], or why it refuses. The
//! initiator sends its packed `EngineDesc`; then it sends [`Request`]s and the target answers
//! each with one [`Reply`].
//!
//! Both ends bound how long a dead network can hold them: sends, unacknowledged data and
//! keepalive probes give up after the link timeout (the engines' `op_timeout`), and the
//! initiator waits at most [`REPLY_TIMEOUT`] for a reply.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::{bail, Context};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Largest frame either side accepts.
pub const MAX_FRAME: usize = 64 << 20;
/// How long the initiator waits for any reply (the target waits for requests as long as the
/// connection lives: a row may run for a long time).
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(600);
/// How long the initiator waits for a TCP connection to the target.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// What both sides say first, so a side channel never talks to something else.
pub const MAGIC: &str = "morio-bench/2";

/// Initiator → target, first: what the run needs.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Setup {
    /// [`MAGIC`].
    pub magic: String,
    /// Bytes of the target's buffer (the largest row's extent).
    pub buffer_len: u64,
}

/// Target → initiator, the answer to [`Setup`].
#[derive(Serialize, Deserialize, Debug, Clone)]
pub enum Welcome {
    /// Ready: the engine and the buffer to use.
    Ready {
        /// [`MAGIC`].
        magic: String,
        /// Its packed `EngineDesc`.
        #[serde(with = "serde_bytes")]
        engine: Vec<u8>,
        /// The packed `MemoryDesc` of its buffer.
        #[serde(with = "serde_bytes")]
        memory: Vec<u8>,
        /// About the target.
        info: TargetInfo,
    },
    /// The target cannot serve this run (and exits).
    Refused {
        /// Why.
        message: String,
    },
}

/// What the target tells the initiator about itself, after the descriptors.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct TargetInfo {
    /// Shards its engine runs.
    pub shards: usize,
    /// CPUs its shards and ceiling receivers are pinned to (`None`: unpinned / planned).
    pub cpus: Option<Vec<usize>>,
    /// Its process id.
    pub pid: u32,
}

/// Initiator → target.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Fill the first `len` bytes of the buffer from `seed`.
    Scramble { seed: u64, len: u64 },
    /// xxh3 of these (offset, length) segments, concatenated in order.
    Hash { segs: Vec<(u64, u64)> },
    /// Listen for `streams` raw TCP connections, each sending `bytes_per_stream` bytes.
    CeilingStart { streams: u32, bytes_per_stream: u64 },
    /// Wait for the ceiling receivers (or the floor's servers) and report how they ended.
    CeilingJoin,
    /// Listen for a row's latency floor: `streams` raw TCP connections, each answering
    /// `rounds` requests of `up` bytes with `down` bytes from a busy-polling thread.
    FloorStart {
        /// Streams, and bytes each way per stream and round.
        shape: super::floor::Shape,
        /// Rounds, warm-up included.
        rounds: u32,
    },
    /// Start a one-connection echo server for the raw-TCP round-trip floor (`spin`: it
    /// busy-polls a non-blocking socket).
    EchoStart {
        /// Busy-poll instead of blocking in `recv`.
        spin: bool,
    },
    /// How much pinned GPU staging the target's engine holds.
    Staging,
    /// The target engine's shard counters.
    Counters,
    /// The run is over; exit.
    Done,
}

/// Target → initiator, one per request.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Done as asked.
    Ok,
    /// The hash asked for.
    Hash { xxh3: u64 },
    /// The ceiling receivers listen on this port.
    CeilingReady { port: u16 },
    /// Pinned GPU staging bytes held, and the most in use at once.
    Staging { pinned: u64, peak: u64 },
    /// The target engine's shard counters.
    Counters(super::stats::Counters),
    /// The request failed on the target.
    Error { message: String },
}

/// One side-channel connection.
#[derive(Debug)]
pub struct Channel {
    stream: TcpStream,
    /// The peer, for messages.
    peer: SocketAddr,
    /// How long the network may be gone before the channel fails.
    link_timeout: Duration,
    /// How long a reply may take (`None`: forever).
    reply_timeout: Option<Duration>,
}

impl Channel {
    /// Wrap an accepted or connected stream: no delay, and a dead network fails it within
    /// about `link_timeout` (unacknowledged sends and keepalive probes give up then, and a
    /// blocked send as well); a read waits at most `reply_timeout`.
    pub fn new(
        stream: TcpStream,
        link_timeout: Duration,
        reply_timeout: Option<Duration>,
    ) -> anyhow::Result<Self> {
        let peer = stream.peer_addr().context("side channel: peer address")?;
        stream.set_nodelay(true)?;
        let link = link_timeout.max(Duration::from_secs(1));
        let sock = socket2::SockRef::from(&stream);
        sock.set_tcp_user_timeout(Some(link))?;
        let probe = (link / 10).max(Duration::from_secs(1));
        let ka = socket2::TcpKeepalive::new()
            .with_time((link / 2).max(Duration::from_secs(1)))
            .with_interval(probe)
            .with_retries(5);
        sock.set_tcp_keepalive(&ka)?;
        stream.set_write_timeout(Some(link))?;
        stream.set_read_timeout(reply_timeout)?;
        Ok(Self {
            stream,
            peer,
            link_timeout: link,
            reply_timeout,
        })
    }

    /// Connect to the target at `addr` at once: a refused connection (no target there) is
    /// an error now, not a wait. Links and replies as in [`Self::new`], replies within
    /// [`REPLY_TIMEOUT`].
    pub fn connect(addr: &str, link_timeout: Duration) -> anyhow::Result<Self> {
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .with_context(|| format!("--connect {addr:?} is not HOST:PORT"))?
            .collect();
        let mut last = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, CONNECT_TIMEOUT) {
                Ok(s) => return Self::new(s, link_timeout, Some(REPLY_TIMEOUT)),
                Err(e) => last = Some(e),
            }
        }
        let why = match last {
            Some(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                "connection refused (start `morio bench --role target` there first; it prints \
                 MORIO_BENCH_TARGET <port>)"
                    .to_string()
            }
            Some(e) if is_timeout(&e) => format!("no answer within {CONNECT_TIMEOUT:?}"),
            Some(e) => e.to_string(),
            None => "no address".to_string(),
        };
        bail!("no morio bench target at {addr}: {why}")
    }

    /// Wait at most `t` for each reply from now on (`None`: forever).
    pub fn set_reply_timeout(&mut self, t: Option<Duration>) {
        if self.stream.set_read_timeout(t).is_ok() {
            self.reply_timeout = t;
        }
    }

    /// The peer's address.
    pub fn peer(&self) -> anyhow::Result<SocketAddr> {
        Ok(self.peer)
    }

    /// What went wrong on the stream, in words.
    fn failed(&self, what: &str, e: std::io::Error) -> anyhow::Error {
        let peer = self.peer;
        let link = self.link_timeout;
        if e.raw_os_error() == Some(libc::ETIMEDOUT) {
            anyhow::anyhow!(
                "side channel to {peer}: {what}: the network path failed (nothing got \
                 through for {link:?}: {e})"
            )
        } else if is_timeout(&e) {
            match self.reply_timeout {
                Some(r) if what.starts_with("receive") => {
                    anyhow::anyhow!("side channel to {peer}: no reply within {r:?}")
                }
                _ => anyhow::anyhow!(
                    "side channel to {peer}: {what}: blocked for {link:?} (the peer stopped \
                     reading, or the network is down)"
                ),
            }
        } else if e.kind() == std::io::ErrorKind::UnexpectedEof {
            anyhow::anyhow!("side channel closed by the peer ({peer})")
        } else if e.kind() == std::io::ErrorKind::ConnectionReset {
            anyhow::anyhow!("side channel closed by the peer ({peer}: reset)")
        } else {
            anyhow::anyhow!("side channel to {peer}: {what}: {e}")
        }
    }

    /// Send one frame.
    pub fn send_frame(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        let len = u32::try_from(bytes.len())
            .ok()
            .filter(|&l| l as usize <= MAX_FRAME)
            .with_context(|| format!("side-channel frame of {} bytes is too large", bytes.len()))?;
        let mut buf = Vec::with_capacity(4 + bytes.len());
        buf.extend_from_slice(&len.to_be_bytes());
        buf.extend_from_slice(bytes);
        self.stream
            .write_all(&buf)
            .map_err(|e| self.failed("send", e))
    }

    /// Receive one frame.
    pub fn recv_frame(&mut self) -> anyhow::Result<Vec<u8>> {
        let mut len = [0u8; 4];
        self.stream
            .read_exact(&mut len)
            .map_err(|e| self.failed("receive", e))?;
        let len = u32::from_be_bytes(len) as usize;
        if len > MAX_FRAME {
            bail!("side channel: frame of {len} bytes exceeds {MAX_FRAME}");
        }
        let mut buf = vec![0u8; len];
        self.stream
            .read_exact(&mut buf)
            .map_err(|e| self.failed("receive (mid-frame)", e))?;
        Ok(buf)
    }

    /// Send a msgpack message.
    pub fn send<T: Serialize>(&mut self, msg: &T) -> anyhow::Result<()> {
        let bytes = rmp_serde::to_vec(msg).context("side channel: encode")?;
        self.send_frame(&bytes)
    }

    /// Receive a msgpack message.
    pub fn recv<T: DeserializeOwned>(&mut self) -> anyhow::Result<T> {
        let bytes = self.recv_frame()?;
        rmp_serde::from_slice(&bytes).context("side channel: malformed message")
    }

    /// Send a request and wait for its reply; a target-side error becomes an error here.
    pub fn call(&mut self, req: &Request) -> anyhow::Result<Reply> {
        self.send(req)?;
        match self.recv::<Reply>()? {
            Reply::Error { message } => bail!("target: {message}"),
            r => Ok(r),
        }
    }
}

/// A socket timeout (`SO_RCVTIMEO` / `SO_SNDTIMEO` report `WouldBlock` on Linux).
fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::time::Instant;

    const LINK: Duration = Duration::from_secs(30);

    #[test]
    fn messages_round_trip_and_limits_hold() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let h = std::thread::spawn(move || {
            let mut c = Channel::new(l.accept().unwrap().0, LINK, None).unwrap();
            let r: Request = c.recv().unwrap();
            c.send(&Reply::Hash { xxh3: 7 }).unwrap();
            assert_eq!(r, Request::Hash { segs: vec![(1, 2)] });
            let r: Request = c.recv().unwrap();
            assert_eq!(r, Request::Done);
            c.send(&Reply::Error {
                message: "no".into(),
            })
            .unwrap();
            // A hostile length is refused before anything is allocated.
            c.stream.write_all(&u32::MAX.to_be_bytes()).unwrap();
        });
        let mut c = Channel::connect(&addr, LINK).unwrap();
        let segs = vec![(1, 2)];
        assert_eq!(
            c.call(&Request::Hash { segs }).unwrap(),
            Reply::Hash { xxh3: 7 }
        );
        assert!(c.call(&Request::Done).is_err());
        assert!(c.recv_frame().is_err());
        h.join().unwrap();
    }

    /// No target listening: an error at once, naming the address and the refusal.
    #[test]
    fn an_absent_target_is_an_error_at_once() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let t0 = Instant::now();
        let e = Channel::connect(&addr, LINK).unwrap_err().to_string();
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        assert!(
            e.starts_with(&format!(
                "no morio bench target at {addr}: connection refused"
            )),
            "{e}"
        );
    }

    /// The socket carries what bounds a dead network: TCP_USER_TIMEOUT, keepalive, a send
    /// timeout; a silent peer is a clear error after the reply timeout.
    #[test]
    fn a_dead_link_or_a_silent_peer_fails_the_channel() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let s = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let _peer = l.accept().unwrap();
        let mut c =
            Channel::new(s, Duration::from_secs(12), Some(Duration::from_millis(200))).unwrap();
        let sock = socket2::SockRef::from(&c.stream);
        assert_eq!(
            sock.tcp_user_timeout().unwrap(),
            Some(Duration::from_secs(12))
        );
        assert!(sock.keepalive().unwrap());
        assert_eq!(sock.tcp_keepalive_time().unwrap(), Duration::from_secs(6));
        assert_eq!(
            sock.tcp_keepalive_interval().unwrap(),
            Duration::from_secs(1)
        );
        assert_eq!(
            c.stream.write_timeout().unwrap(),
            Some(Duration::from_secs(12))
        );
        let e = c.recv_frame().unwrap_err().to_string();
        assert!(e.contains("no reply within 200ms"), "{e}");
    }
}
