//! A node's whole life over loopback: descriptors (msgpack and JSON), verified bytes in and
//! out of its memory, stats, Prometheus metrics, health, `morio ctl`, a flood of silent
//! connections, and SIGTERM.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use morio::{EngineDesc, IoEngine, IoEngineConfig, MemoryDesc, StatusCode, TcpBackendConfig};

use crate::common::*;

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
    let (mut child, mut out) = spawn_serve(&cfg);
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
