//! `morio serve` end to end: start the binary, fetch its descriptors from the control port,
//! move verified bytes into and out of its memory, read its stats, stop it with SIGTERM.

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

fn ask(addr: SocketAddr, what: &str) -> Vec<u8> {
    ask_as(addr, what, None)
}

/// A control request, with the proof of `secret` when given (the service's nonce first).
fn ask_as(addr: SocketAddr, what: &str, secret: Option<&[u8]>) -> Vec<u8> {
    use hmac::Mac;
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut nonce = [0u8; 16];
    s.read_exact(&mut nonce).unwrap();
    let line = match secret {
        Some(k) => {
            let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(k).unwrap();
            mac.update(b"morio control\0");
            mac.update(&nonce);
            mac.update(what.as_bytes());
            let p: String = mac
                .finalize()
                .into_bytes()
                .iter()
                .map(|x| format!("{x:02x}"))
                .collect();
            format!("{what} {p}\n")
        }
        None => format!("{what}\n"),
    };
    s.write_all(line.as_bytes()).unwrap();
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).unwrap();
    body
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
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    let addr: SocketAddr = first
        .strip_prefix("MORIO_SERVE_CONTROL ")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .trim()
        .parse()
        .unwrap();

    let d: Descriptors = rmp_serde::from_slice(&ask(addr, "descriptors")).unwrap();
    let node = EngineDesc::unpack(&d.engine).unwrap();
    assert_eq!(node.key, "serve-node");
    assert!(node.port > 0);
    let names: Vec<&str> = d.memory.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["kv", "aux"]);
    let kv = MemoryDesc::unpack(&d.memory[0].desc).unwrap();
    assert_eq!(kv.size, 8 << 20);

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

    let stats: serde_json::Value = serde_json::from_slice(&ask(addr, "stats")).unwrap();
    assert_eq!(stats["engine"], "serve-node");
    assert_eq!(stats["total"]["inbound_bytes_written"], n as u64, "{stats}");
    assert_eq!(stats["total"]["inbound_bytes_read"], n as u64, "{stats}");
    assert_eq!(stats["total"]["inbound_transfers"], 2, "{stats}");
    assert_eq!(stats["shards"].as_array().map(Vec::len), Some(2));
    let bad = String::from_utf8(ask(addr, "bogus")).unwrap();
    assert!(bad.starts_with("error: "), "{bad}");

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
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    let addr: SocketAddr = first
        .strip_prefix("MORIO_SERVE_CONTROL ")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .trim()
        .parse()
        .unwrap();
    // Without the secret, the control service hands out nothing.
    let refused = String::from_utf8(ask(addr, "descriptors")).unwrap();
    assert_eq!(refused, "error: authentication required");
    let refused = String::from_utf8(ask(addr, "stats")).unwrap();
    assert_eq!(refused, "error: authentication required");
    let d: Descriptors = rmp_serde::from_slice(&ask_as(addr, "descriptors", Some(secret))).unwrap();
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
