//! A node with `[auth] secret_file`: it serves a peer holding the secret, refuses one that does
//! not (nothing placed), requires proofs on its control port, and does not warn.

use std::io::Read;
use std::process::Command;
use std::time::Duration;

use morio::{EngineDesc, IoEngine, IoEngineConfig, MemoryDesc, StatusCode, TcpBackendConfig};

use crate::common::*;

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
    let (mut child, mut out) = spawn_serve(&cfg);
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
