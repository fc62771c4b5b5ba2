//! What the serve tests share: the descriptors' wire form, `GET` over a plain socket, the
//! `Authorization` proof of a secret, Prometheus text summed by metric, the control address
//! the node prints first, `morio serve` started on a config, and `morio ctl`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use serde::Deserialize;

#[derive(Deserialize)]
pub struct Descriptors {
    #[serde(with = "serde_bytes")]
    pub engine: Vec<u8>,
    pub memory: Vec<NamedDesc>,
}

#[derive(Deserialize)]
pub struct NamedDesc {
    pub name: String,
    #[serde(with = "serde_bytes")]
    pub desc: Vec<u8>,
}

/// An HTTP reply: status, head (lower-cased) and body.
pub struct Reply {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// `GET target` with extra header lines, over a plain socket (written here, independent of
/// the command's own client), reading to the end (the service closes every connection).
pub fn get(addr: SocketAddr, target: &str, headers: &[String]) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!("GET {target} HTTP/1.1\r\nHost: {addr}\r\n");
    for h in headers {
        req.push_str(&format!("{h}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let at = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {:?}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8(raw[..at].to_vec())
        .unwrap()
        .to_lowercase();
    let status = head
        .strip_prefix("http/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad status line in {head:?}"));
    Reply {
        status,
        head,
        body: raw[at + 4..].to_vec(),
    }
}

/// The `Authorization` header proving `secret` for `GET path`, with a fresh nonce.
pub fn proof(addr: SocketAddr, path: &str, secret: &[u8]) -> String {
    use hmac::Mac;
    let n = get(addr, "/nonce", &[]);
    assert_eq!(n.status, 200);
    let nonce = n.text().trim().to_string();
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).unwrap();
    mac.update(b"morio control\0");
    mac.update(nonce.as_bytes());
    mac.update(b"GET");
    mac.update(path.as_bytes());
    let p: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect();
    format!("Authorization: Morio-HMAC nonce={nonce}, proof={p}")
}

/// Every sample of a Prometheus exposition, summed over shards, by metric name (histograms:
/// their count, as `NAME_count`, comes in as an untyped sample).
pub fn metrics(text: &str) -> HashMap<String, f64> {
    let s = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    let mut out = HashMap::new();
    for x in s.samples {
        let v = match x.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            prometheus_parse::Value::Histogram(_) => 0.0,
            _ => continue,
        };
        *out.entry(x.metric).or_insert(0.0) += v;
    }
    out
}

pub fn control_addr(out: &mut impl BufRead) -> SocketAddr {
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    first
        .strip_prefix("MORIO_SERVE_CONTROL ")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .trim()
        .parse()
        .unwrap()
}

/// `morio ctl --connect localhost:PORT ARGS...`: its exit status and stdout.
pub fn ctl(addr: SocketAddr, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_morio"))
        .args(["ctl", "--connect", &format!("localhost:{}", addr.port())])
        .args(args)
        .env_remove(morio::AUTH_SECRET_ENV)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr);
    (out.status.success(), format!("{text}{err}"))
}

/// `morio serve --config cfg` (without `MORIO_AUTH_SECRET` from the test's environment), and
/// a reader of its standard output.
pub fn spawn_serve(cfg: &Path) -> (Child, BufReader<ChildStdout>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_morio"))
        .args(["serve", "--config"])
        .arg(cfg)
        .env_remove(morio::AUTH_SECRET_ENV)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}
