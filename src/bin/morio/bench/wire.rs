//! The bench side channel between initiator and target: frames of a u32 big-endian length
//! and that many bytes. The target opens with its packed `EngineDesc`, its packed `MemoryDesc`
//! and a msgpack [`TargetInfo`]; the initiator answers with its packed `EngineDesc`; then the
//! initiator sends msgpack [`Request`]s and the target answers each with one [`Reply`].

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Largest frame either side accepts.
pub const MAX_FRAME: usize = 64 << 20;
/// How long the initiator waits for any reply (the target waits for requests forever: a row
/// may run for a long time).
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(600);

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
    /// The request failed on the target.
    Error { message: String },
}

/// One side-channel connection.
#[derive(Debug)]
pub struct Channel {
    stream: TcpStream,
}

impl Channel {
    /// Wrap an accepted or connected stream.
    pub fn new(stream: TcpStream) -> anyhow::Result<Self> {
        stream.set_nodelay(true)?;
        Ok(Self { stream })
    }

    /// Connect to `addr`, retrying refused connections until `patience` has passed (so the
    /// initiator may be started just after the target). Replies must come within
    /// [`REPLY_TIMEOUT`].
    pub fn connect(addr: &str, patience: Duration) -> anyhow::Result<Self> {
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .with_context(|| format!("--connect {addr:?} is not HOST:PORT"))?
            .collect();
        let t0 = Instant::now();
        loop {
            let mut last = None;
            for a in &addrs {
                match TcpStream::connect_timeout(a, Duration::from_secs(5)) {
                    Ok(s) => {
                        s.set_read_timeout(Some(REPLY_TIMEOUT))?;
                        return Self::new(s);
                    }
                    Err(e) => last = Some(e),
                }
            }
            if t0.elapsed() > patience {
                let e = last.map_or("no address".to_string(), |e| e.to_string());
                bail!("cannot reach the target's side channel at {addr}: {e}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The peer's address.
    pub fn peer(&self) -> anyhow::Result<SocketAddr> {
        Ok(self.stream.peer_addr()?)
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
            .context("side channel: send failed")
    }

    /// Receive one frame.
    pub fn recv_frame(&mut self) -> anyhow::Result<Vec<u8>> {
        let mut len = [0u8; 4];
        self.stream
            .read_exact(&mut len)
            .context("side channel closed by the peer")?;
        let len = u32::from_be_bytes(len) as usize;
        if len > MAX_FRAME {
            bail!("side channel: frame of {len} bytes exceeds {MAX_FRAME}");
        }
        let mut buf = vec![0u8; len];
        self.stream
            .read_exact(&mut buf)
            .context("side channel closed mid-frame")?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn messages_round_trip_and_limits_hold() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let h = std::thread::spawn(move || {
            let mut c = Channel::new(l.accept().unwrap().0).unwrap();
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
        let mut c = Channel::connect(&addr, Duration::from_secs(5)).unwrap();
        let segs = vec![(1, 2)];
        assert_eq!(
            c.call(&Request::Hash { segs }).unwrap(),
            Reply::Hash { xxh3: 7 }
        );
        assert!(c.call(&Request::Done).is_err());
        assert!(c.recv_frame().is_err());
        h.join().unwrap();
    }
}
