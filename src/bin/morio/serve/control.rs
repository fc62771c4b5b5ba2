//! The control service of `morio serve`: initiators fetch descriptors and operators read stats
//! over a tiny request/response protocol, and `morio ctl` is its client.
//!
//! On connect the service sends a 16-byte nonce. The client sends one request line: the word,
//! and, when the node has a deployment secret, a space and the hex HMAC-SHA-256 of
//! `"morio control\0" ‖ nonce ‖ word` keyed with the secret. The reply is a u32 big-endian
//! length and the body. A node with a secret answers a request without a valid proof with
//! `error: authentication required` and nothing else. Requests are served by a fixed pool
//! of threads from a bounded queue: a connection that finds the queue full is closed at once,
//! so a flood delays the service but cannot exhaust the node's threads or stop it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// Largest request line accepted (a word, a space and a 64-digit proof).
const MAX_REQUEST_BYTES: u64 = 128;
/// Largest reply a client accepts.
const MAX_REPLY_BYTES: u32 = 16 << 20;
/// Threads that serve requests.
const WORKERS: usize = 8;
/// Connections waiting for a worker; more are closed at once.
const QUEUE: usize = 32;
/// How long one client may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// The nonce the service sends on connect.
const NONCE_BYTES: usize = 16;

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

/// The proof of a request `word` on a connection that sent `nonce`.
fn proof(secret: &[u8], nonce: &[u8], word: &str) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap_or_else(|_| unreachable!());
    mac.update(b"morio control\0");
    mac.update(nonce);
    mac.update(word.as_bytes());
    mac
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Answers requests until `stop` is set: an accepting thread and [`WORKERS`] serving ones.
pub fn serve(
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    secret: Option<morio::AuthSecret>,
    answer: Answer,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    let (tx, rx) = mpsc::sync_channel::<TcpStream>(QUEUE);
    let rx = Arc::new(Mutex::new(rx));
    let mut workers = Vec::with_capacity(WORKERS);
    for i in 0..WORKERS {
        let (rx, answer, secret) = (rx.clone(), answer.clone(), secret.clone());
        let w = std::thread::Builder::new()
            .name(format!("morio-ctl-{i}"))
            .spawn(move || loop {
                let next = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                let Ok(s) = next else { return };
                if let Err(e) = one(s, secret.as_ref(), &*answer) {
                    log::debug!("control request failed: {e:#}");
                }
            })
            .context("start the control service's threads")?;
        workers.push(w);
    }
    let accept = std::thread::Builder::new()
        .name("morio-ctl".into())
        .spawn(move || {
            let _ = listener.set_nonblocking(true);
            let mut last_warn: Option<Instant> = None;
            let mut warn = |msg: String| {
                if last_warn.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                    log::warn!("{msg}");
                    last_warn = Some(Instant::now());
                }
            };
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, peer)) => {
                        if let Err(mpsc::TrySendError::Full(s)) = tx.try_send(s) {
                            warn(format!(
                                "control service busy: closing a connection from {peer}"
                            ));
                            drop(s);
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => {
                        warn(format!("control accept: {e}"));
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
            drop(tx);
            for w in workers {
                let _ = w.join();
            }
        })
        .context("start the control service")?;
    Ok(accept)
}

fn one(
    s: TcpStream,
    secret: Option<&morio::AuthSecret>,
    answer: &dyn Fn(&str) -> anyhow::Result<Vec<u8>>,
) -> anyhow::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    let nonce: [u8; NONCE_BYTES] = rand::random();
    (&s).write_all(&nonce)?;
    let mut line = String::new();
    BufReader::new((&s).take(MAX_REQUEST_BYTES)).read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let word = parts.next().unwrap_or("");
    let authentic = match secret {
        None => true,
        Some(k) => parts
            .next()
            .and_then(unhex)
            .is_some_and(|p| proof(k.as_bytes(), &nonce, word).verify_slice(&p).is_ok()),
    };
    let body = if !authentic {
        b"error: authentication required".to_vec()
    } else {
        match answer(word) {
            Ok(b) => b,
            Err(e) => format!("error: {e:#}").into_bytes(),
        }
    };
    let mut w = &s;
    w.write_all(&(body.len() as u32).to_be_bytes())?;
    w.write_all(&body)?;
    Ok(())
}

/// Ask `addr` for `what` (proving `secret` when given) and return the reply body.
pub fn query(
    addr: SocketAddr,
    what: &str,
    secret: Option<&morio::AuthSecret>,
) -> anyhow::Result<Vec<u8>> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .with_context(|| format!("connect to the control service at {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut nonce = [0u8; NONCE_BYTES];
    s.read_exact(&mut nonce)
        .context("read the control service's nonce")?;
    let line = match secret {
        Some(k) => {
            let p = proof(k.as_bytes(), &nonce, what).finalize().into_bytes();
            format!("{what} {}\n", hex(&p))
        }
        None => format!("{what}\n"),
    };
    s.write_all(line.as_bytes())?;
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
pub fn fetch_descriptors(
    addr: SocketAddr,
    secret: Option<&morio::AuthSecret>,
) -> anyhow::Result<Descriptors> {
    let body = query(addr, "descriptors", secret)?;
    rmp_serde::from_slice(&body).context("decode descriptors")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ping(
        secret: Option<morio::AuthSecret>,
    ) -> (SocketAddr, Arc<AtomicBool>, std::thread::JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let h = serve(
            l,
            stop.clone(),
            secret,
            Arc::new(|w: &str| match w {
                "ping" => Ok(b"pong".to_vec()),
                other => bail!("unknown request {other:?}"),
            }),
        )
        .unwrap();
        (addr, stop, h)
    }

    #[test]
    fn request_reply_and_bad_requests() {
        let (addr, stop, h) = ping(None);
        assert_eq!(query(addr, "ping", None).unwrap(), b"pong");
        let e = query(addr, "nope", None).unwrap_err();
        assert!(format!("{e:#}").contains("unknown request"), "{e:#}");
        // A request line longer than the limit is cut, answered as unknown, not buffered.
        assert!(query(addr, &"x".repeat(10_000), None).is_err());
        stop.store(true, Ordering::Relaxed);
        h.join().unwrap();
    }

    #[test]
    fn with_a_secret_only_proven_requests_are_answered() {
        let k = morio::AuthSecret::new(b"control secret, long enough".to_vec());
        let (addr, stop, h) = ping(Some(k.clone()));
        assert_eq!(query(addr, "ping", Some(&k)).unwrap(), b"pong");
        let e = query(addr, "ping", None).unwrap_err();
        assert!(
            format!("{e:#}").contains("authentication required"),
            "{e:#}"
        );
        let wrong = morio::AuthSecret::new(b"another secret, long enough".to_vec());
        assert!(query(addr, "ping", Some(&wrong)).is_err());
        stop.store(true, Ordering::Relaxed);
        h.join().unwrap();
    }

    /// Far more silent clients than workers and queue: the service closes what it cannot
    /// hold, keeps its threads, and answers again once they are gone.
    #[test]
    fn a_flood_of_silent_clients_does_not_stop_the_service() {
        let (addr, stop, h) = ping(None);
        let flood: Vec<TcpStream> = (0..200)
            .filter_map(|_| TcpStream::connect(addr).ok())
            .collect();
        assert!(flood.len() > WORKERS + QUEUE);
        // The silent ones time out (REQUEST_TIMEOUT) or are closed at once; then it answers.
        let t0 = Instant::now();
        let mut ok = false;
        while t0.elapsed() < Duration::from_secs(60) {
            if query(addr, "ping", None).is_ok_and(|b| b == b"pong") {
                ok = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(ok, "the service never answered again");
        drop(flood);
        stop.store(true, Ordering::Relaxed);
        h.join().unwrap();
    }
}
