//! The control service of `morio serve`: initiators fetch descriptors and operators read stats
//! over a tiny request/response protocol (one request line; a u32 big-endian length and the
//! body back), and `morio ctl` is its client.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

/// Largest request line accepted.
const MAX_REQUEST_BYTES: u64 = 64;
/// Largest reply a client accepts.
const MAX_REPLY_BYTES: u32 = 16 << 20;

/// What `descriptors` returns: the packed `EngineDesc` and every region's packed `MemoryDesc`
/// by name (msgpack map).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Descriptors {
    #[serde(with = "serde_bytes")]
    pub engine: Vec<u8>,
    pub memory: Vec<NamedDesc>,
}

/// One region's packed descriptor.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct NamedDesc {
    pub name: String,
    #[serde(with = "serde_bytes")]
    pub desc: Vec<u8>,
}

/// Maps a request word to its reply body.
pub type Answer = Arc<dyn Fn(&str) -> anyhow::Result<Vec<u8>> + Send + Sync>;

/// Answers requests until `stop` is set.
pub fn serve(
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    answer: Answer,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let _ = listener.set_nonblocking(true);
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((s, _)) => {
                    let answer = answer.clone();
                    std::thread::spawn(move || {
                        if let Err(e) = one(s, &*answer) {
                            log::debug!("control request failed: {e:#}");
                        }
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    log::warn!("control accept: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    })
}

fn one(s: TcpStream, answer: &dyn Fn(&str) -> anyhow::Result<Vec<u8>>) -> anyhow::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut line = String::new();
    BufReader::new((&s).take(MAX_REQUEST_BYTES)).read_line(&mut line)?;
    let body = match answer(line.trim()) {
        Ok(b) => b,
        Err(e) => format!("error: {e:#}").into_bytes(),
    };
    let mut w = &s;
    w.write_all(&(body.len() as u32).to_be_bytes())?;
    w.write_all(&body)?;
    Ok(())
}

/// Ask `addr` for `what` and return the reply body.
pub fn query(addr: SocketAddr, what: &str) -> anyhow::Result<Vec<u8>> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .with_context(|| format!("connect to the control service at {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(format!("{what}\n").as_bytes())?;
    let mut len = [0u8; 4];
    s.read_exact(&mut len).context("read the reply length")?;
    let len = u32::from_be_bytes(len);
    if len > MAX_REPLY_BYTES {
        bail!("reply of {len} bytes is larger than {MAX_REPLY_BYTES}");
    }
    let mut body = vec![0u8; len as usize];
    s.read_exact(&mut body).context("read the reply")?;
    if body.starts_with(b"error: ") {
        bail!("{}", String::from_utf8_lossy(&body));
    }
    Ok(body)
}

/// Fetch and decode the descriptors of the node at `addr`.
pub fn fetch_descriptors(addr: SocketAddr) -> anyhow::Result<Descriptors> {
    let body = query(addr, "descriptors")?;
    rmp_serde::from_slice(&body).context("decode descriptors")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_reply_and_bad_requests() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let h = serve(
            l,
            stop.clone(),
            Arc::new(|w: &str| match w {
                "ping" => Ok(b"pong".to_vec()),
                other => bail!("unknown request {other:?}"),
            }),
        );
        assert_eq!(query(addr, "ping").unwrap(), b"pong");
        let e = query(addr, "nope").unwrap_err();
        assert!(format!("{e:#}").contains("unknown request"), "{e:#}");
        // A request line longer than the limit is cut, answered as unknown, not buffered.
        assert!(query(addr, &"x".repeat(10_000)).is_err());
        stop.store(true, Ordering::Relaxed);
        h.join().unwrap();
    }
}
