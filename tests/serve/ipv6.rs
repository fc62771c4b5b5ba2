//! A node on IPv6 loopback: its control service, descriptors, `morio ctl` and a client engine
//! all on `::1` (skipped where the host has no IPv6 loopback).

use std::io::BufRead;
use std::process::Command;
use std::time::Duration;

use morio::{EngineDesc, IoEngine, IoEngineConfig, MemoryDesc, StatusCode, TcpBackendConfig};

use crate::common::*;

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
    let (mut child, mut out) = spawn_serve(&cfg);
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
