//! HTTP/1.1 for the control service: a server of one request per connection (request heads
//! parsed by `httparse`, every reply `Connection: close` with a `Content-Length`) and the
//! client `morio ctl` uses.
//!
//! The server is a fixed pool of [`WORKERS`] threads fed by one accepting thread through a
//! queue of [`QUEUE`] connections: a connection that finds the queue full is closed at once,
//! so a flood delays the service but never makes it start a thread or stop. A client has
//! [`HEAD_TIMEOUT`] from its connection's accept to send its whole request head (a slow or
//! silent client is closed, a trickle of bytes does not extend it) and [`WRITE_TIMEOUT`] to
//! take the reply. Request bodies are refused. (tiny_http was the first choice; it starts a
//! thread per connection with no bound and has no read timeout, which a flood turns into
//! threads without end.)

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// Threads that serve requests.
pub const WORKERS: usize = 8;
/// Connections waiting for a worker; more are closed at once.
pub const QUEUE: usize = 32;
/// How long a client has, from its accept, to send its request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a client has to take its reply.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest request head accepted (431 past it).
const MAX_HEAD_BYTES: usize = 8 << 10;
/// Most header lines in a request.
const MAX_HEADERS: usize = 32;
/// Largest reply the client accepts.
const MAX_REPLY_BYTES: usize = 16 << 20;

/// A parsed request head.
#[derive(Debug, Clone)]
pub struct Request {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The target's path (`/stats`), without its query.
    pub path: String,
    /// The target's query (after `?`), if any.
    pub query: Option<String>,
    /// Header lines, names as sent.
    pub headers: Vec<(String, String)>,
}

impl Request {
    /// The first header named `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The value of query parameter `key` (`?key=value&...`; no percent-decoding).
    pub fn query_param(&self, key: &str) -> Option<&str> {
        self.query
            .as_deref()?
            .split('&')
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
    }
}

/// A reply.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// `Content-Type`.
    pub content_type: String,
    /// Further header lines.
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// A reply of `status` with `body` of type `content_type`.
    pub fn new(status: u16, content_type: &str, body: impl Into<Vec<u8>>) -> Self {
        Self {
            status,
            content_type: content_type.to_string(),
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// A plain-text reply.
    pub fn text(status: u16, body: impl Into<String>) -> Self {
        Self::new(status, "text/plain; charset=utf-8", body.into())
    }

    /// This reply with one more header line.
    pub fn with(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }
}

/// Maps a request to its reply.
pub type Handler = Arc<dyn Fn(&Request) -> Response + Send + Sync>;

/// Serve `listener` with `handler` until `stop` is set: an accepting thread and [`WORKERS`]
/// serving ones. The returned handle joins them all.
pub fn serve(
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    handler: Handler,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    listener
        .set_nonblocking(true)
        .context("control listener non-blocking")?;
    let (tx, rx) = mpsc::sync_channel::<(TcpStream, Instant)>(QUEUE);
    let rx = Arc::new(Mutex::new(rx));
    let mut workers = Vec::with_capacity(WORKERS);
    for i in 0..WORKERS {
        let (rx, handler) = (rx.clone(), handler.clone());
        let w = std::thread::Builder::new()
            .name(format!("morio-ctl-{i}"))
            .spawn(move || loop {
                let next = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                let Ok((s, accepted)) = next else { return };
                if let Err(e) = one(s, accepted, &*handler) {
                    log::debug!("control request: {e:#}");
                }
            })
            .context("start the control service's threads")?;
        workers.push(w);
    }
    let accept = std::thread::Builder::new()
        .name("morio-ctl".into())
        .spawn(move || {
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
                        if let Err(mpsc::TrySendError::Full((s, _))) =
                            tx.try_send((s, Instant::now()))
                        {
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

/// What reading a request head gave.
enum Head {
    Request(Request),
    /// A reply to send without calling the handler (malformed, too large, a body).
    Refuse(Response),
    /// Nothing to answer (timed out, closed).
    Gone,
}

/// Serve one connection: read its head by the deadline, answer, close.
fn one(
    s: TcpStream,
    accepted: Instant,
    handler: &dyn Fn(&Request) -> Response,
) -> anyhow::Result<()> {
    s.set_nonblocking(false)?;
    // A connection that waited in the queue still gets a moment to have its head read.
    let deadline = (accepted + HEAD_TIMEOUT).max(Instant::now() + Duration::from_millis(50));
    let reply = match read_head(&s, deadline)? {
        Head::Request(req) => handler(&req),
        Head::Refuse(r) => r,
        Head::Gone => return Ok(()),
    };
    write_reply(&s, &reply, Instant::now() + WRITE_TIMEOUT)?;
    let _ = s.shutdown(Shutdown::Write);
    Ok(())
}

fn read_head(mut s: &TcpStream, deadline: Instant) -> anyhow::Result<Head> {
    let mut buf = vec![0u8; MAX_HEAD_BYTES];
    let mut len = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(Head::Gone);
        }
        s.set_read_timeout(Some(left))?;
        let n = match s.read(&mut buf[len..]) {
            Ok(0) => return Ok(Head::Gone),
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(Head::Gone)
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        len += n;
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf[..len]) {
            Ok(httparse::Status::Complete(_)) => return Ok(head(&req)),
            Ok(httparse::Status::Partial) if len == buf.len() => {
                return Ok(Head::Refuse(Response::text(
                    431,
                    "request head too large\n",
                )))
            }
            Ok(httparse::Status::Partial) => {}
            Err(httparse::Error::TooManyHeaders) => {
                return Ok(Head::Refuse(Response::text(431, "too many headers\n")))
            }
            Err(e) => {
                return Ok(Head::Refuse(Response::text(
                    400,
                    format!("bad request: {e}\n"),
                )))
            }
        }
    }
}

fn head(req: &httparse::Request) -> Head {
    let (Some(method), Some(target)) = (req.method, req.path) else {
        return Head::Refuse(Response::text(400, "bad request\n"));
    };
    let headers: Vec<(String, String)> = req
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_string(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    let has_body = headers.iter().any(|(n, v)| {
        (n.eq_ignore_ascii_case("content-length") && v.trim() != "0")
            || n.eq_ignore_ascii_case("transfer-encoding")
    });
    if has_body {
        return Head::Refuse(Response::text(413, "request bodies are not accepted\n"));
    }
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q.to_string())),
        None => (target, None),
    };
    Head::Request(Request {
        method: method.to_string(),
        path: path.to_string(),
        query,
        headers,
    })
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "",
    }
}

fn write_reply(mut s: &TcpStream, r: &Response, deadline: Instant) -> anyhow::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        r.status,
        reason(r.status),
        r.content_type,
        r.body.len()
    );
    for (n, v) in &r.headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    for mut part in [head.as_bytes(), &r.body[..]] {
        while !part.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("client too slow to take its reply");
            }
            s.set_write_timeout(Some(left))?;
            match s.write(part) {
                Ok(0) => bail!("connection closed"),
                Ok(n) => part = &part[n..],
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

/// A reply as the client got it.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// Header lines.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Reply {
    /// The first header named `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Resolve `HOST:PORT` (a name or an address) to the addresses to try.
pub fn resolve(hostport: &str) -> anyhow::Result<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> = hostport
        .to_socket_addrs()
        .with_context(|| format!("resolve {hostport:?} (want HOST:PORT)"))?
        .collect();
    if addrs.is_empty() {
        bail!("{hostport:?} resolves to no address");
    }
    Ok(addrs)
}

/// `GET target` from the first of `addrs` that accepts, with `headers`; `host` is the
/// `Host` header.
pub fn get(
    addrs: &[SocketAddr],
    host: &str,
    target: &str,
    headers: &[(&str, String)],
) -> anyhow::Result<Reply> {
    let mut last = None;
    let mut conn = None;
    for a in addrs {
        match TcpStream::connect_timeout(a, Duration::from_secs(5)) {
            Ok(s) => {
                conn = Some(s);
                break;
            }
            Err(e) => last = Some(anyhow::Error::new(e).context(format!("connect to {a}"))),
        }
    }
    let Some(mut s) = conn else {
        return Err(last.unwrap_or_else(|| anyhow::anyhow!("no address to connect to")));
    };
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_write_timeout(Some(Duration::from_secs(10)))?;
    let mut req = format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).context("send the request")?;
    let mut raw = Vec::new();
    (&mut s)
        .take((MAX_REPLY_BYTES + MAX_HEAD_BYTES) as u64 + 1)
        .read_to_end(&mut raw)
        .context("read the reply")?;
    parse_reply(&raw)
}

fn parse_reply(raw: &[u8]) -> anyhow::Result<Reply> {
    let mut hs = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut hs);
    let at = match resp.parse(raw).context("malformed reply")? {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => bail!("the reply ended within its head"),
    };
    let headers: Vec<(String, String)> = resp
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_string(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    let mut body = raw[at..].to_vec();
    if body.len() > MAX_REPLY_BYTES {
        bail!("reply larger than {MAX_REPLY_BYTES} bytes");
    }
    let reply = Reply {
        status: resp.code.unwrap_or(0),
        headers,
        body: Vec::new(),
    };
    if let Some(n) = reply.header("content-length") {
        let n: usize = n.trim().parse().context("bad Content-Length")?;
        if body.len() < n {
            bail!("the reply ended after {} of {n} bytes", body.len());
        }
        body.truncate(n);
    }
    Ok(Reply { body, ..reply })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echo() -> (SocketAddr, Arc<AtomicBool>, std::thread::JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let h = serve(
            l,
            stop.clone(),
            Arc::new(|r: &Request| {
                Response::text(
                    200,
                    format!(
                        "{} {} {:?} {:?}",
                        r.method,
                        r.path,
                        r.query_param("format"),
                        r.header("x-test")
                    ),
                )
            }),
        )
        .unwrap();
        (addr, stop, h)
    }

    fn raw(addr: SocketAddr, bytes: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(bytes).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn requests_and_malformed_requests() {
        let (addr, stop, h) = echo();
        let r = get(
            &[addr],
            "x",
            "/a/b?q=1&format=json",
            &[("X-Test", "yes".into())],
        )
        .unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(
            String::from_utf8(r.body.clone()).unwrap(),
            "GET /a/b Some(\"json\") Some(\"yes\")"
        );
        assert_eq!(r.header("connection"), Some("close"));
        assert!(raw(addr, b"NOT HTTP\r\n\r\n").starts_with("HTTP/1.1 400 "));
        let big = format!(
            "GET / HTTP/1.1\r\nX: {}\r\n\r\n",
            "y".repeat(MAX_HEAD_BYTES)
        );
        assert!(raw(addr, big.as_bytes()).starts_with("HTTP/1.1 431 "));
        let body = b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc";
        assert!(raw(addr, body).starts_with("HTTP/1.1 413 "));
        stop.store(true, Ordering::Relaxed);
        h.join().unwrap();
    }

    /// A client that trickles its head one byte at a time is closed at the head deadline,
    /// not kept as long as it keeps sending.
    #[test]
    fn a_trickling_client_is_cut_off_at_the_deadline() {
        let (addr, stop, h) = echo();
        let mut s = TcpStream::connect(addr).unwrap();
        let t0 = Instant::now();
        let mut closed = false;
        for b in b"GET / HTTP/1.1\r\nX-Slow: "
            .iter()
            .chain([b'z'; 200].iter())
        {
            if s.write_all(&[*b]).is_err() {
                closed = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
            if t0.elapsed() > HEAD_TIMEOUT * 3 {
                break;
            }
        }
        if !closed {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut out = Vec::new();
            closed = matches!(s.read_to_end(&mut out), Ok(0) | Err(_)) && out.is_empty();
        }
        assert!(closed, "the trickling client was still served");
        assert!(t0.elapsed() < HEAD_TIMEOUT * 3);
        stop.store(true, Ordering::Relaxed);
        h.join().unwrap();
    }

    /// Far more silent clients than workers and queue: the service closes what it cannot
    /// hold, keeps its threads, and answers again once they are gone.
    #[test]
    fn a_flood_of_silent_clients_does_not_stop_the_service() {
        let (addr, stop, h) = echo();
        let flood: Vec<TcpStream> = (0..200)
            .filter_map(|_| TcpStream::connect(addr).ok())
            .collect();
        assert!(flood.len() > WORKERS + QUEUE);
        let t0 = Instant::now();
        let mut ok = false;
        while t0.elapsed() < Duration::from_secs(60) {
            if get(&[addr], "x", "/ping", &[]).is_ok_and(|r| r.status == 200) {
                ok = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(ok, "the service never answered again");
        // The queued silent ones were cut at their deadline from accept: well within
        // (flood / workers) head timeouts.
        assert!(t0.elapsed() < HEAD_TIMEOUT * 5, "{:?}", t0.elapsed());
        drop(flood);
        stop.store(true, Ordering::Relaxed);
        h.join().unwrap();
    }

    #[test]
    fn resolve_takes_names() {
        assert!(resolve("localhost:7070")
            .unwrap()
            .iter()
            .all(|a| a.port() == 7070 && a.ip().is_loopback()));
        assert!(resolve("no-port").is_err());
    }
}
