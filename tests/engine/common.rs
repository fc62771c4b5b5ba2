//! Helpers: engine pairs on 127.0.0.1 (or ::1), random buffers, waiting with a bound.

use std::time::Duration;

use morio::{
    IoEngine, IoEngineConfig, RegisteredBuffer, StatusCode, TcpBackendConfig, TransferStatus,
};
use rand::{Rng, SeedableRng};

/// A small config for tests: 2 shards, unpinned (many engines share this machine).
pub fn test_cfg() -> TcpBackendConfig {
    TcpBackendConfig {
        num_shards: Some(2),
        pin_shards: false,
        op_timeout: Duration::from_secs(20),
        ..Default::default()
    }
}

pub fn engine(key: &str, cfg: TcpBackendConfig) -> IoEngine {
    engine_at(key, "127.0.0.1", cfg)
}

/// An engine listening on `host` (a loopback address).
pub fn engine_at(key: &str, host: &str, cfg: TcpBackendConfig) -> IoEngine {
    let e = IoEngine::new(key, IoEngineConfig::new(host, 0)).expect("engine");
    e.create_backend(cfg).expect("backend");
    e
}

/// Two engines `{prefix}_a` and `{prefix}_b`, each registered with the other.
pub fn pair(prefix: &str, cfg: TcpBackendConfig) -> (IoEngine, IoEngine) {
    let a = engine(&format!("{prefix}_a"), cfg.clone());
    let b = engine(&format!("{prefix}_b"), cfg);
    a.register_remote_engine(&b.engine_desc()).unwrap();
    b.register_remote_engine(&a.engine_desc()).unwrap();
    (a, b)
}

pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut v = vec![0u8; n];
    rng.fill(&mut v[..]);
    v
}

pub fn random_buffer(e: &IoEngine, n: usize, seed: u64) -> RegisteredBuffer {
    e.register_buffer(random_bytes(n, seed)).unwrap()
}

/// Wait (bounded) and return the final code.
pub fn wait(s: &TransferStatus) -> StatusCode {
    let c = s.wait_for(Duration::from_secs(60));
    assert_ne!(c, StatusCode::InProgress, "transfer did not finish in 60 s");
    c
}

/// Wait for the target's inbound status of `uid` from `key` (it exists before the
/// initiator's SUCCESS, so no retry loop is needed: one pop must find it).
pub fn inbound(e: &IoEngine, key: &str, uid: u64) -> StatusCode {
    e.pop_inbound_transfer_status(key, uid)
        .map(|s| s.code())
        .expect("inbound status recorded")
}

// ---------------------------------------------------------------------------------------
// Added for mori_cases, sizes, concurrency and failures.

/// `test_cfg()` changed by `f`.
pub fn cfg_with(f: impl FnOnce(&mut TcpBackendConfig)) -> TcpBackendConfig {
    let mut c = test_cfg();
    f(&mut c);
    c
}

/// Random bytes, fast enough for hundreds of MiB in a debug build: 4 KiB pieces copied from
/// a 1 MiB random pool at random offsets, each stamped with its index, so no two pieces are
/// equal and a misplaced chunk shows. Small sizes come straight from [`random_bytes`].
pub fn random_big(n: usize, seed: u64) -> Vec<u8> {
    const POOL: usize = 1 << 20;
    const PIECE: usize = 4096;
    if n <= POOL {
        return random_bytes(n, seed);
    }
    let pool = random_bytes(POOL + PIECE, seed);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15);
    let mut v = vec![0u8; n];
    for (i, piece) in v.chunks_mut(PIECE).enumerate() {
        let at = rng.gen_range(0..POOL);
        piece.copy_from_slice(&pool[at..at + piece.len()]);
        let stamp = (i as u64 ^ seed.rotate_left(17)).to_le_bytes();
        let k = piece.len().min(8);
        piece[..k].copy_from_slice(&stamp[..k]);
    }
    v
}

/// Byte-for-byte comparison that reports the first difference instead of dumping buffers.
#[track_caller]
pub fn assert_bytes_eq(actual: &[u8], expected: &[u8], what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: length differs");
    if actual == expected {
        return;
    }
    let first = actual
        .iter()
        .zip(expected)
        .position(|(a, e)| a != e)
        .unwrap();
    let n_diff = actual.iter().zip(expected).filter(|(a, e)| a != e).count();
    panic!(
        "{what}: {n_diff} of {} bytes differ; first at {first}: got {:#04x}, want {:#04x}",
        actual.len(),
        actual[first],
        expected[first]
    );
}

/// `len` bytes of `buf` at `off`.
pub fn bytes_at(buf: &RegisteredBuffer, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    assert!(
        buf.read_at(off, &mut v),
        "range {off}+{len} outside the buffer"
    );
    v
}

/// Wait at most `limit` and return the terminal code (fails the test if still in progress).
#[track_caller]
pub fn wait_within(s: &TransferStatus, limit: Duration) -> StatusCode {
    let c = s.wait_for(limit);
    assert_ne!(
        c,
        StatusCode::InProgress,
        "transfer did not end within {limit:?}"
    );
    c
}

/// Assert success (with the status message on failure).
#[track_caller]
pub fn assert_ok(s: &TransferStatus, what: &str) {
    let c = wait(s);
    assert_eq!(c, StatusCode::Success, "{what}: {}", s.message());
}

/// Run `f` on its own thread and fail the test if it takes longer than `limit` (a watchdog
/// for calls that could hang: drops, unbounded waits).
#[track_caller]
pub fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: still running after {limit:?}")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("{what}: panicked"),
    }
}

/// A port on 127.0.0.1 that nothing listens on (bound, then released).
pub fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    port
}

/// An engine descriptor for `key` at 127.0.0.1:`port` (for fake or unreachable peers).
pub fn desc_at(key: &str, port: u16) -> morio::EngineDesc {
    let mut d = morio::EngineDesc::local(key, "127.0.0.1", port);
    d.port = port;
    d
}

// --- raw protocol helpers, for fake peers and hostile clients --------------------------

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use morio::proto::frame::{Frame, Hello, HelloAck};
use morio::proto::limits::{HEADER_BYTES, VERSION};

/// `frame` encoded, announcing `payload_len` payload bytes (not included).
pub fn encode(frame: &Frame, payload_len: u64) -> Vec<u8> {
    let mut v = Vec::new();
    frame.encode(payload_len, &mut v);
    v
}

/// A HELLO from `src` to `dst` on lane 0 of 1.
pub fn hello(src: &str, dst: &str) -> Vec<u8> {
    encode(
        &Frame::Hello(Hello {
            version: VERSION,
            lane: 0,
            n_lanes: 1,
            src_key: src.into(),
            dst_key: dst.into(),
            instance: 1,
            nonce: [0; 16],
            host_tag: None,
        }),
        0,
    )
}

/// A fake target's lane: the next connection on `l`, its HELLO read and answered as engine
/// `key`.
pub fn accept_lane(l: &std::net::TcpListener, key: &str) -> TcpStream {
    let (mut c, _) = l.accept().unwrap();
    match try_read_frame(&mut c, Duration::from_secs(5)) {
        Ok(Frame::Hello(_)) => {}
        other => panic!("expected HELLO, got {other:?}"),
    }
    std::io::Write::write_all(&mut c, &hello_ack(key)).unwrap();
    c
}

/// A successful HELLO_ACK from engine `key`.
pub fn hello_ack(key: &str) -> Vec<u8> {
    encode(
        &Frame::HelloAck(HelloAck {
            version: VERSION,
            code: 0,
            key: key.into(),
            msg: String::new(),
            nonce: [0; 16],
            proof: None,
            same_host: false,
        }),
        0,
    )
}

/// A raw client connected to 127.0.0.1:`port`.
pub fn raw_connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_nodelay(true).unwrap();
    s
}

/// How the other side ended a connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Closed {
    /// Orderly close.
    Eof,
    /// Reset (it closed with unread data, or aborted).
    Reset,
}

/// Read until the peer closes; everything read, and how it closed. Fails the test if the
/// connection is still open after `limit`.
#[track_caller]
pub fn read_until_closed(s: &mut TcpStream, limit: Duration) -> (Vec<u8>, Closed) {
    let deadline = std::time::Instant::now() + limit;
    let mut got = Vec::new();
    let mut buf = [0u8; 64 << 10];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        assert!(
            !left.is_zero(),
            "connection still open after {limit:?} ({} bytes read)",
            got.len()
        );
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut buf) {
            Ok(0) => return (got, Closed::Eof),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return (got, Closed::Reset)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                panic!(
                    "connection still open after {limit:?} ({} bytes read)",
                    got.len()
                )
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => panic!("unexpected read error: {e}"),
        }
    }
}

/// Read exactly one frame (header + body; no payload expected), waiting at most `limit`.
#[track_caller]
pub fn read_frame(s: &mut TcpStream, limit: Duration) -> Frame {
    try_read_frame(s, limit).expect("read a frame")
}

/// [`read_frame`] that reports errors (timeouts, closes, undecodable bytes) instead of failing.
pub fn try_read_frame(s: &mut TcpStream, limit: Duration) -> std::io::Result<Frame> {
    let bad = |e: morio::proto::decode::DecodeError| std::io::Error::other(e.to_string());
    s.set_read_timeout(Some(limit))?;
    let mut h = [0u8; HEADER_BYTES];
    s.read_exact(&mut h)?;
    let header = morio::proto::decode::decode_header(&h).map_err(bad)?;
    let mut body = vec![0u8; header.body_len as usize];
    s.read_exact(&mut body)?;
    if header.payload_len != 0 {
        return Err(std::io::Error::other("unexpected payload"));
    }
    morio::proto::decode::decode_body(&header, &body).map_err(bad)
}

/// Read exactly one frame and its payload (READ_DATA's bytes), waiting at most `limit`.
#[track_caller]
pub fn read_frame_and_payload(s: &mut TcpStream, limit: Duration) -> (Frame, Vec<u8>) {
    try_read_frame_and_payload(s, limit).expect("read a frame and its payload")
}

/// [`read_frame_and_payload`] that reports errors instead of failing.
pub fn try_read_frame_and_payload(
    s: &mut TcpStream,
    limit: Duration,
) -> std::io::Result<(Frame, Vec<u8>)> {
    let bad = |e: morio::proto::decode::DecodeError| std::io::Error::other(e.to_string());
    s.set_read_timeout(Some(limit))?;
    let mut h = [0u8; HEADER_BYTES];
    s.read_exact(&mut h)?;
    let header = morio::proto::decode::decode_header(&h).map_err(bad)?;
    let mut body = vec![0u8; header.body_len as usize];
    s.read_exact(&mut body)?;
    let frame = morio::proto::decode::decode_body(&header, &body).map_err(bad)?;
    let mut payload = vec![0u8; header.payload_len as usize];
    s.read_exact(&mut payload)?;
    Ok((frame, payload))
}

/// Every frame in `bytes` (payloads skipped); panics on bytes that are not frames.
pub fn parse_frames(mut bytes: &[u8]) -> Vec<Frame> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let (f, payload, used) = morio::proto::decode::decode_frame(bytes)
            .expect("valid frame")
            .expect("complete frame");
        out.push(f);
        bytes = &bytes[used + payload as usize..];
    }
    out
}

/// How a [`FakePeer`] treats each connection after reading its HELLO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FakeMode {
    /// Never answer the HELLO.
    Silent,
    /// Answer HELLO_ACK (as engine `key`), then never answer anything.
    AckThenSilent,
}

/// A listener on 127.0.0.1 that accepts connections, reads their HELLO and then behaves per
/// [`FakeMode`]; it keeps every connection open until dropped.
pub struct FakePeer {
    pub port: u16,
    pub hellos: Arc<std::sync::Mutex<Vec<Hello>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakePeer {
    pub fn start(key: &str, mode: FakeMode) -> FakePeer {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let hellos = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (st, hs, key) = (stop.clone(), hellos.clone(), key.to_string());
        let thread = std::thread::spawn(move || {
            let mut keep = Vec::new();
            for conn in l.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(mut c) = conn else { continue };
                match try_read_frame(&mut c, Duration::from_secs(5)) {
                    Ok(Frame::Hello(h)) => hs.lock().unwrap().push(h),
                    _ => continue,
                }
                if mode == FakeMode::AckThenSilent {
                    let _ = c.write_all(&hello_ack(&key));
                }
                keep.push(c);
            }
        });
        FakePeer {
            port,
            hellos,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for FakePeer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A listening port whose accept queue is full, so a connect to it hangs (SYNs are dropped)
/// until the dialer's own timeout: a peer that is down without refusing connections.
pub struct BlackHole {
    pub port: u16,
    _listener: socket2::Socket,
    _fill: Vec<socket2::Socket>,
}

impl BlackHole {
    pub fn new() -> BlackHole {
        use socket2::{Domain, Socket, Type};
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        let l = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        l.bind(&addr.into()).unwrap();
        l.listen(0).unwrap();
        let port = l.local_addr().unwrap().as_socket().unwrap().port();
        let to = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let fill = (0..4)
            .map(|_| {
                let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
                s.set_nonblocking(true).unwrap();
                let _ = s.connect(&to.into());
                s
            })
            .collect();
        // Check the premise: a further connect does hang.
        let probe = TcpStream::connect_timeout(&to, Duration::from_millis(200));
        assert!(probe.is_err(), "the black hole accepted a connection");
        BlackHole {
            port,
            _listener: l,
            _fill: fill,
        }
    }
}

/// TCP connections (IPv4, from /proc/net/tcp) in ESTABLISHED state whose local port is
/// `port`: for an engine's listening port, the connections it accepted and still holds.
pub fn established_on_local_port(port: u16) -> usize {
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    tcp.lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local_port = f
                .get(1)
                .and_then(|a| a.split(':').nth(1))
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            local_port == Some(port) && f.get(3) == Some(&"01")
        })
        .count()
}

/// Run the ignored test `case` (module path, e.g. `auth::some_case`) alone in a child
/// process of this test binary and require it to pass: for tests that measure the whole
/// process (its memory, its sockets), which tests running beside them on other threads of a
/// `cargo test` process would disturb.
pub fn run_alone(case: &str) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            case,
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("1 passed"), "the case did not run: {text}");
}

/// Whether this run's engines use same-host rings (`MORIO_SAME_HOST_RING=off` runs the suite
/// with same-host records in the socket instead).
pub fn rings_on() -> bool {
    !matches!(
        std::env::var("MORIO_SAME_HOST_RING").as_deref(),
        Ok("off" | "0" | "false")
    )
}

/// `f()` once it equals `want`, or its last value after 5 s. Counters a lane's shard bumps
/// when the peer took a chunk can trail the transfer's status (which another lane completed).
pub fn settled<T: PartialEq>(f: impl Fn() -> T, want: &T) -> T {
    let t0 = std::time::Instant::now();
    loop {
        let got = f();
        if &got == want || t0.elapsed() > Duration::from_secs(5) {
            return got;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}
