//! `morio serve` end to end: start the binary, fetch its descriptors from the HTTP control
//! port (msgpack and JSON), move verified bytes into and out of its memory, read its stats,
//! metrics (parsed as Prometheus text) and health, ask through `morio ctl`, survive a flood
//! of silent connections, require proofs with a secret, stop it with SIGTERM.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use morio::{EngineDesc, IoEngine, IoEngineConfig, MemoryDesc, StatusCode, TcpBackendConfig};
use serde::Deserialize;

#[derive(Deserialize)]
struct Descriptors {
    #[serde(with = "serde_bytes")]
    engine: Vec<u8>,
    memory: Vec<NamedDesc>,
}

#[derive(Deserialize)]
struct NamedDesc {
    name: String,
    #[serde(with = "serde_bytes")]
    desc: Vec<u8>,
}

/// An HTTP reply: status, head (lower-cased) and body.
struct Reply {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Reply {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// `GET target` with extra header lines, over a plain socket (written here, independent of
/// the command's own client), reading to the end (the service closes every connection).
fn get(addr: SocketAddr, target: &str, headers: &[String]) -> Reply {
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
fn proof(addr: SocketAddr, path: &str, secret: &[u8]) -> String {
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
fn metrics(text: &str) -> HashMap<String, f64> {
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

fn control_addr(out: &mut impl BufRead) -> SocketAddr {
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
fn ctl(addr: SocketAddr, args: &[&str]) -> (bool, String) {
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

#[test]
fn serve_hands_out_descriptors_moves_bytes_reports_stats_and_stops_on_sigterm() {
    let dir = std::env::temp_dir().join(format!("morio-serve-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("serve.toml");
    std::fs::write(
        &cfg,
        r#"
[engine]
key = "serve-node"
host = "127.0.0.1"
[tcp]
shards = 2
pin_shards = false
op_timeout_ms = 10000
[control]
listen = "127.0.0.1:0"
[stats]
interval_s = 0
[[memory]]
name = "kv"
size = "8MiB"
[[memory]]
name = "aux"
size = 4096
"#,
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_morio"))
        .args(["serve", "--config"])
        .arg(&cfg)
        .env_remove(morio::AUTH_SECRET_ENV)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let addr = control_addr(&mut out);

    let h = get(addr, "/healthz", &[]);
    assert_eq!((h.status, h.text()), (200, "ok\n".to_string()));
    let packed = get(
        addr,
        "/descriptors",
        &["Accept: application/msgpack".into()],
    );
    assert_eq!(packed.status, 200);
    assert!(packed.head.contains("content-type: application/msgpack"));
    let d: Descriptors = rmp_serde::from_slice(&packed.body).unwrap();
    let node = EngineDesc::unpack(&d.engine).unwrap();
    assert_eq!(node.key, "serve-node");
    assert!(node.port > 0);
    let names: Vec<&str> = d.memory.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["kv", "aux"]);
    let kv = MemoryDesc::unpack(&d.memory[0].desc).unwrap();
    assert_eq!(kv.size, 8 << 20);
    // The same as JSON, the packed bytes in hex.
    let j = get(addr, "/descriptors", &[]);
    assert!(
        j.head.contains("content-type: application/json"),
        "{}",
        j.head
    );
    let j: serde_json::Value = serde_json::from_slice(&j.body).unwrap();
    assert_eq!(j["engine"]["key"], "serve-node");
    assert_eq!(j["engine"]["port"], node.port);
    assert_eq!(j["memory"]["aux"]["size"], 4096);
    assert_eq!(j["memory"]["kv"]["id"], kv.id);
    let hex: String = d.memory[0]
        .desc
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect();
    assert_eq!(j["memory"]["kv"]["packed"], hex);

    let me = IoEngine::new("serve-client", IoEngineConfig::new("127.0.0.1", 0)).unwrap();
    me.create_backend(TcpBackendConfig {
        num_shards: Some(2),
        pin_shards: false,
        ..Default::default()
    })
    .unwrap();
    me.register_remote_engine(&node).unwrap();
    let n = 5 << 20;
    let data: Vec<u8> = (0..n).map(|i| (i * 31 % 251) as u8).collect();
    let src = me.register_buffer(data.clone()).unwrap();
    let back = me.alloc_buffer(n).unwrap();
    let st = me.write(src.desc(), 0, &kv, 1000, n, me.allocate_transfer_uid());
    assert_eq!(
        st.wait_for(Duration::from_secs(30)),
        StatusCode::Success,
        "{}",
        st.message()
    );
    let st = me.read(back.desc(), 0, &kv, 1000, n, me.allocate_transfer_uid());
    assert_eq!(
        st.wait_for(Duration::from_secs(30)),
        StatusCode::Success,
        "{}",
        st.message()
    );
    assert!(
        back.to_vec() == data,
        "bytes read back from the node differ"
    );

    let stats: serde_json::Value = serde_json::from_slice(&get(addr, "/stats", &[]).body).unwrap();
    assert_eq!(stats["engine"], "serve-node");
    assert_eq!(stats["total"]["inbound_bytes_written"], n as u64, "{stats}");
    assert_eq!(stats["total"]["inbound_bytes_read"], n as u64, "{stats}");
    assert_eq!(stats["total"]["inbound_transfers"], 2, "{stats}");
    assert_eq!(stats["shards"].as_array().map(Vec::len), Some(2));
    // Per peer: the one client, as initiator of both transfers.
    let client = &stats["peers"]["serve-client"];
    assert_eq!(client["inbound_bytes_written"], n as u64, "{stats}");
    assert_eq!(client["inbound_bytes_read"], n as u64, "{stats}");
    assert_eq!(client["inbound_transfers"], 2, "{stats}");
    assert_eq!(client["transfers_ok"], 0, "{stats}");
    assert_eq!(stats["peers"].as_object().map(|p| p.len()), Some(1));
    assert_eq!(get(addr, "/bogus", &[]).status, 404);

    let m = get(addr, "/metrics", &[]);
    assert_eq!(m.status, 200);
    assert!(
        m.head.contains("content-type: text/plain; version=0.0.4"),
        "{}",
        m.head
    );
    let text = m.text();
    let v = metrics(&text);
    let at = |name: &str| {
        *v.get(name)
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    };
    assert_eq!(at("morio_backend_up"), 1.0);
    assert_eq!(at("morio_shards"), 2.0);
    assert_eq!(at("morio_inbound_written_bytes_total"), n as f64);
    assert_eq!(at("morio_inbound_read_bytes_total"), n as f64);
    assert_eq!(at("morio_inbound_transfers_total"), 2.0);
    // The node started no transfer: its outbound series are there, and zero.
    assert_eq!(at("morio_outbound_transfers_total"), 0.0);
    assert_eq!(at("morio_outbound_latency_seconds_count"), 0.0);
    assert!(v.contains_key("morio_outbound_latency_seconds"), "{text}");
    assert!(
        !text.contains("serve-node"),
        "the engine key in open metrics"
    );
    // Without a secret, the per-peer series are served too.
    let line = format!("morio_peer_inbound_written_bytes_total{{peer=\"serve-client\"}} {n}");
    assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
    assert_eq!(at("morio_peer_inbound_transfers_total"), 2.0);

    // `morio ctl`, given a host name.
    let (ok, out_ctl) = ctl(addr, &["metrics"]);
    assert!(
        ok && out_ctl.contains("morio_inbound_transfers_total"),
        "{out_ctl}"
    );
    let (ok, out_ctl) = ctl(addr, &["descriptors"]);
    assert!(ok && out_ctl.contains("memory \"kv\""), "{out_ctl}");
    let (ok, out_ctl) = ctl(addr, &["healthz"]);
    assert!(ok && out_ctl.trim() == "ok", "{out_ctl}");

    // A flood of silent connections: the service closes what it cannot hold and answers
    // again once their head deadline passed.
    let flood: Vec<TcpStream> = (0..150)
        .filter_map(|_| TcpStream::connect(addr).ok())
        .collect();
    let t0 = Instant::now();
    loop {
        let ok = TcpStream::connect(addr).is_ok_and(|mut s| {
            let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
            let mut r = String::new();
            s.write_all(b"GET /healthz HTTP/1.1\r\n\r\n").is_ok()
                && s.read_to_string(&mut r).is_ok()
                && r.starts_with("HTTP/1.1 200 ")
        });
        if ok {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no answer after the flood"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(flood);

    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "serve did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(status.success(), "exit {status:?}: {rest}");
    assert!(rest.contains("shut down cleanly"), "{rest}");
    assert!(rest.contains("2 shards on CPUs unpinned,"), "{rest}");
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(
        err.contains("WARNING: no deployment secret"),
        "no warning without a secret: {err}"
    );
    // The transfer node is gone: a new transfer to it fails instead of hanging.
    let st = me.write(src.desc(), 0, &kv, 0, 4096, me.allocate_transfer_uid());
    assert_eq!(
        st.wait_for(Duration::from_secs(15)),
        StatusCode::ErrBadState
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dump_config_is_the_commented_default_and_bad_configs_fail_clearly() {
    let out = Command::new(env!("CARGO_BIN_EXE_morio"))
        .args(["serve", "--dump-config"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("[engine]") && text.contains("# "), "{text}");
    let dir = std::env::temp_dir().join(format!("morio-serve-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("bad.toml");
    std::fs::write(
        &cfg,
        text.replace("num_data_conns = 8", "num_data_conns = 0"),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_morio"))
        .args(["serve", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("num_data_conns"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// With `[auth] secret_file`, the node serves a peer holding the secret, refuses one that
/// does not (nothing placed), and does not warn.
#[test]
fn serve_with_a_secret_serves_only_peers_that_hold_it() {
    let dir = std::env::temp_dir().join(format!("morio-serve-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret = b"serve node secret, long enough";
    std::fs::write(dir.join("secret"), secret).unwrap();
    let cfg = dir.join("serve.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
[engine]
key = "auth-node"
host = "127.0.0.1"
[tcp]
shards = 2
pin_shards = false
op_timeout_ms = 5000
[auth]
secret_file = {:?}
[control]
listen = "127.0.0.1:0"
[stats]
interval_s = 0
[[memory]]
name = "kv"
size = "1MiB"
"#,
            dir.join("secret").display().to_string()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_morio"))
        .args(["serve", "--config"])
        .arg(&cfg)
        .env_remove(morio::AUTH_SECRET_ENV)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let addr = control_addr(&mut out);
    // Without the secret, the control service hands out nothing: 401 and one fixed line.
    for path in ["/descriptors", "/stats", "/descriptors?format=msgpack"] {
        let r = get(addr, path, &[]);
        assert_eq!(r.status, 401, "{path}");
        assert_eq!(r.text(), "authentication required\n");
        assert!(!r.head.contains("auth-node"));
    }
    let wrong = proof(addr, "/descriptors", b"not the node's secret, long");
    assert_eq!(get(addr, "/descriptors", &[wrong]).status, 401);
    // A proof for one path does not open another.
    let for_stats = proof(addr, "/stats", secret);
    assert_eq!(get(addr, "/descriptors", &[for_stats]).status, 401);
    // Open: health and metrics, which name neither the engine nor its memory.
    assert_eq!(get(addr, "/healthz", &[]).status, 200);
    let m = get(addr, "/metrics", &[]).text();
    assert!(m.contains("morio_backend_up 1"), "{m}");
    assert!(!m.contains("auth-node") && !m.contains("kv"), "{m}");
    // With a proof: 200, once.
    let good = proof(addr, "/descriptors", secret);
    let r = get(
        addr,
        "/descriptors?format=msgpack",
        std::slice::from_ref(&good),
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        get(addr, "/descriptors", &[good]).status,
        401,
        "a replayed nonce"
    );
    let stats = get(addr, "/stats", &[proof(addr, "/stats", secret)]);
    assert_eq!(stats.status, 200);
    assert!(stats.text().contains("auth-node"));
    // The documented curl recipe (ARCHITECTURE.md), where curl and openssl are installed.
    let tools = Command::new("sh")
        .args(["-c", "command -v curl && command -v openssl"])
        .output()
        .is_ok_and(|o| o.status.success());
    if tools {
        let recipe = r#"n=$(curl -s $A/nonce)
p=$(printf 'morio control\0%sGET/stats' "$n" | openssl dgst -sha256 -hmac "$(cat $S)" -r | cut -c1-64)
curl -s -H "Authorization: Morio-HMAC nonce=$n, proof=$p" $A/stats"#;
        let o = Command::new("bash")
            .args(["-c", recipe])
            .env("A", addr.to_string())
            .env("S", dir.join("secret"))
            .output()
            .unwrap();
        let body = String::from_utf8_lossy(&o.stdout);
        assert!(body.contains("\"engine\": \"auth-node\""), "{body}");
    }
    // `morio ctl` proves the secret from its file, and gets nothing without it.
    let secret_file = dir.join("secret").display().to_string();
    let (ok, o) = ctl(addr, &["descriptors", "--secret-file", &secret_file]);
    assert!(ok && o.contains("memory \"kv\""), "{o}");
    let (ok, o) = ctl(addr, &["stats"]);
    assert!(!ok && o.contains("401"), "{o}");
    let d: Descriptors = rmp_serde::from_slice(&r.body).unwrap();
    let node = EngineDesc::unpack(&d.engine).unwrap();
    let kv = MemoryDesc::unpack(&d.memory[0].desc).unwrap();
    let client = |key: &str, secret: Option<&[u8]>| {
        let e = IoEngine::new(key, IoEngineConfig::new("127.0.0.1", 0)).unwrap();
        e.create_backend(TcpBackendConfig {
            num_shards: Some(1),
            pin_shards: false,
            op_timeout: Duration::from_secs(5),
            auth_secret: secret.map(morio::AuthSecret::new),
            ..Default::default()
        })
        .unwrap();
        e.register_remote_engine(&node).unwrap();
        e
    };
    let n = 64 << 10;
    let outsider = client("outsider", None);
    let junk = outsider.register_buffer(vec![0xEE; n]).unwrap();
    let st = outsider.write(junk.desc(), 0, &kv, 0, n, 1);
    assert_ne!(st.wait_for(Duration::from_secs(30)), StatusCode::Success);
    assert!(
        st.message().contains("requires authentication"),
        "{}",
        st.message()
    );
    let member = client("member", Some(secret));
    let back = member.alloc_buffer(n).unwrap();
    let st = member.read(back.desc(), 0, &kv, 0, n, 1);
    assert_eq!(
        st.wait_for(Duration::from_secs(30)),
        StatusCode::Success,
        "{}",
        st.message()
    );
    assert!(
        back.to_vec().iter().all(|&x| x == 0),
        "the outsider's bytes landed"
    );
    let data: Vec<u8> = (0..n).map(|i| (i % 253) as u8).collect();
    let src = member.register_buffer(data.clone()).unwrap();
    let st = member.write(src.desc(), 0, &kv, 0, n, 2);
    assert_eq!(
        st.wait_for(Duration::from_secs(30)),
        StatusCode::Success,
        "{}",
        st.message()
    );
    let st = member.read(back.desc(), 0, &kv, 0, n, 3);
    assert_eq!(
        st.wait_for(Duration::from_secs(30)),
        StatusCode::Success,
        "{}",
        st.message()
    );
    assert!(back.to_vec() == data);
    // With a secret, the open metrics name no peer by default; the guarded stats do.
    let m = get(addr, "/metrics", &[]).text();
    assert!(m.contains("morio_inbound_transfers_total"), "{m}");
    assert!(!m.contains("member") && !m.contains("morio_peer_"), "{m}");
    let stats = get(addr, "/stats", &[proof(addr, "/stats", secret)]);
    let stats: serde_json::Value = serde_json::from_slice(&stats.body).unwrap();
    assert_eq!(stats["peers"]["member"]["inbound_transfers"], 3, "{stats}");
    assert_eq!(
        stats["peers"]["member"]["inbound_bytes_written"], n as u64,
        "{stats}"
    );
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    assert!(status.success(), "exit {status:?}");
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!err.contains("WARNING"), "warned with a secret: {err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A node on IPv6 loopback: the control service on `[::1]`, descriptors that name `::1`,
/// `morio ctl` with a bracketed address, a client engine that moves bytes to the node, and
/// the startup line with the address in brackets.
#[test]
fn serve_works_on_ipv6_loopback() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("skipped: no IPv6 loopback here");
        return;
    }
    let dir = std::env::temp_dir().join(format!("morio-serve-v6-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("serve.toml");
    std::fs::write(
        &cfg,
        r#"
[engine]
key = "v6-node"
host = "::1"
[tcp]
shards = 1
pin_shards = false
[control]
listen = "[::1]:0"
[stats]
interval_s = 0
[[memory]]
name = "kv"
size = "1MiB"
"#,
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_morio"))
        .args(["serve", "--config"])
        .arg(&cfg)
        .env_remove(morio::AUTH_SECRET_ENV)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let addr = control_addr(&mut out);
    assert!(addr.is_ipv6(), "{addr}");
    let mut started = String::new();
    out.read_line(&mut started).unwrap();
    assert!(started.contains("on [::1]:"), "{started}");
    assert_eq!(get(addr, "/healthz", &[]).status, 200);
    let (ok, text) = Command::new(env!("CARGO_BIN_EXE_morio"))
        .args(["ctl", "--connect", &addr.to_string(), "descriptors"])
        .env_remove(morio::AUTH_SECRET_ENV)
        .output()
        .map(|o| {
            (
                o.status.success(),
                String::from_utf8_lossy(&o.stdout).into_owned(),
            )
        })
        .unwrap();
    assert!(ok && text.contains("at [::1]:"), "{text}");

    let d: Descriptors = rmp_serde::from_slice(
        &get(
            addr,
            "/descriptors",
            &["Accept: application/msgpack".into()],
        )
        .body,
    )
    .unwrap();
    let node = EngineDesc::unpack(&d.engine).unwrap();
    assert_eq!(node.host, "::1");
    let kv = MemoryDesc::unpack(&d.memory[0].desc).unwrap();
    let me = IoEngine::new("v6-client", IoEngineConfig::new("::1", 0)).unwrap();
    me.create_backend(TcpBackendConfig {
        num_shards: Some(1),
        pin_shards: false,
        ..Default::default()
    })
    .unwrap();
    me.register_remote_engine(&node).unwrap();
    let data: Vec<u8> = (0..1 << 20).map(|i| (i * 7 % 253) as u8).collect();
    let src = me.register_buffer(data.clone()).unwrap();
    let back = me.alloc_buffer(1 << 20).unwrap();
    // One after the other: the read must see the write's bytes.
    let st = me.write(src.desc(), 0, &kv, 0, 1 << 20, me.allocate_transfer_uid());
    let done = st.wait_for(Duration::from_secs(30));
    assert_eq!(done, StatusCode::Success, "write: {}", st.message());
    let st = me.read(back.desc(), 0, &kv, 0, 1 << 20, me.allocate_transfer_uid());
    let done = st.wait_for(Duration::from_secs(30));
    assert_eq!(done, StatusCode::Success, "read: {}", st.message());
    assert!(
        back.to_vec() == data,
        "bytes read back from the node differ"
    );

    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    assert!(child.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A write that failed by its deadline while the node's process was stopped (SIGSTOP) is not
/// placed when the node runs again: its initiator reset the lane before reporting the
/// failure, and the node, reading after the gap, checks for that before placing. Without the
/// check the bytes its kernel had accepted (megabytes) landed on resume, over whatever the
/// application had written there since.
#[test]
fn a_write_failed_while_the_node_was_stopped_is_not_placed_when_it_resumes() {
    for mode in [morio::SameHost::Off, morio::SameHost::Require] {
        stopped_node_drops_a_failed_write(mode);
    }
}

fn stopped_node_drops_a_failed_write(mode: morio::SameHost) {
    let dir =
        std::env::temp_dir().join(format!("morio-serve-stop-{}-{mode:?}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("serve.toml");
    std::fs::write(
        &cfg,
        r#"
[engine]
key = "stop-node"
host = "127.0.0.1"
[tcp]
shards = 1
pin_shards = false
op_timeout_ms = 2000
[control]
listen = "127.0.0.1:0"
[stats]
interval_s = 0
[[memory]]
name = "kv"
size = "16MiB"
"#,
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_morio"))
        .args(["serve", "--config"])
        .arg(&cfg)
        .env_remove(morio::AUTH_SECRET_ENV)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    // Killed (and continued) however the test ends.
    struct Kill(u32);
    impl Drop for Kill {
        fn drop(&mut self) {
            // SAFETY: kill(2) on our own child's pid (it may be stopped: continue it too).
            unsafe {
                libc::kill(self.0 as i32, libc::SIGKILL);
                libc::kill(self.0 as i32, libc::SIGCONT);
            }
        }
    }
    let _kill = Kill(child.id());
    let addr = control_addr(&mut out);
    let d: Descriptors = rmp_serde::from_slice(
        &get(
            addr,
            "/descriptors",
            &["Accept: application/msgpack".into()],
        )
        .body,
    )
    .unwrap();
    let node = EngineDesc::unpack(&d.engine).unwrap();
    let kv = MemoryDesc::unpack(&d.memory[0].desc).unwrap();
    let me = IoEngine::new("stop-client", IoEngineConfig::new("127.0.0.1", 0)).unwrap();
    me.create_backend(TcpBackendConfig {
        num_shards: Some(1),
        num_data_conns: 1,
        pin_shards: false,
        op_timeout: Duration::from_secs(1),
        same_host: Some(mode),
        ..Default::default()
    })
    .unwrap();
    me.register_remote_engine(&node).unwrap();
    let n = 16 << 20;
    let zeros = me.register_buffer(vec![0u8; 8]).unwrap();
    let st = me.write(zeros.desc(), 0, &kv, 0, 8, me.allocate_transfer_uid());
    assert_eq!(st.wait_for(Duration::from_secs(10)), StatusCode::Success);
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) }, 0);
    // Every thread of it stopped before the write starts.
    let stopped = || {
        let task = format!("/proc/{}/task", child.id());
        std::fs::read_dir(&task).unwrap().all(|t| {
            let stat = std::fs::read_to_string(t.unwrap().path().join("stat")).unwrap_or_default();
            let state = stat.rsplit(") ").next().and_then(|r| r.chars().next());
            state == Some('T')
        })
    };
    let t0 = std::time::Instant::now();
    while !stopped() {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the node did not stop"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let old = me.register_buffer(vec![0xAB; n]).unwrap();
    let st = me.write(old.desc(), 0, &kv, 0, n, me.allocate_transfer_uid());
    let code = st.wait_for(Duration::from_secs(10));
    assert_eq!(code, StatusCode::ErrBadState, "{}", st.message());
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGCONT) }, 0);
    std::thread::sleep(Duration::from_secs(1));
    let back = me.alloc_buffer(n).unwrap();
    let t0 = std::time::Instant::now();
    loop {
        let st = me.read(back.desc(), 0, &kv, 0, n, me.allocate_transfer_uid());
        if st.wait_for(Duration::from_secs(10)) == StatusCode::Success {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{}", st.message());
    }
    let landed = back.to_vec().iter().filter(|&&b| b == 0xAB).count();
    assert_eq!(
        landed, 0,
        "{mode:?}: {landed} bytes of the failed write were placed on resume"
    );
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // The node says why it dropped them (the check, not something else, kept them out).
    assert!(
        err.contains("the initiator reset this lane while it was not read for"),
        "{mode:?}: {err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
