//! The same-host transport between processes, as deployed: bench rows say which transport
//! carried them; a peer whose memory may not be read (another user) is reached over TCP
//! whichever side cannot read the other, unless the same-host transport is required; a
//! same-host peer killed in the middle of copies fails its own transfers promptly and no other.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use morio::{EngineDesc, IoEngine, IoEngineConfig, MemoryDesc, SameHost, StatusCode};

const NOBODY: &str = "65534";

/// `morio ARGS`, as user nobody when `nobody`.
fn morio(nobody: bool) -> Command {
    let bin = env!("CARGO_BIN_EXE_morio");
    if nobody {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid",
            NOBODY,
            "--regid",
            NOBODY,
            "--clear-groups",
            "--",
            bin,
        ]);
        c
    } else {
        Command::new(bin)
    }
}

/// Whether this machine lets the tests run a process as another user (root and setpriv,
/// and the binary reachable by nobody); says why not otherwise.
fn can_run_as_nobody() -> bool {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        eprintln!("skipped: needs root to start a process as another user");
        return false;
    }
    match morio(true).arg("--version").output() {
        Ok(o) if o.status.success() => true,
        other => {
            eprintln!("skipped: cannot run morio as nobody here: {other:?}");
            false
        }
    }
}

/// A bench target (as nobody when `nobody`) and its side-channel port.
fn bench_target(nobody: bool) -> (Child, u16) {
    let mut child = morio(nobody)
        .args(["bench", "--role", "target", "--no-pin", "--shards", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the target");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .strip_prefix("MORIO_BENCH_TARGET ")
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    (child, port)
}

/// A validated bench initiator run of 1 MiB × 4 writes against `port`.
fn bench_initiator(nobody: bool, port: u16, same_host: &str) -> Output {
    bench_initiator_env(nobody, port, same_host, &[])
}

/// [`bench_initiator`] with these environment variables.
fn bench_initiator_env(nobody: bool, port: u16, same_host: &str, env: &[(&str, &str)]) -> Output {
    morio(nobody)
        .envs(env.iter().copied())
        .args(["bench", "--role", "initiator", "--no-pin", "--shards", "1"])
        .args(["--connect", &format!("127.0.0.1:{port}")])
        .args(["--iters", "4", "--no-ceiling", "--no-floor"])
        .args(["--buffer-size", "1MiB", "--transfer-batch-size", "4"])
        .args(["--enable-batch-transfer", "--same-host", same_host])
        .output()
        .expect("run the initiator")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The Transport column of the bench table's rows.
fn transports(o: &Output) -> Vec<String> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.starts_with('|') && l.contains("1048576"))
        .filter_map(|l| l.trim_end_matches('|').rsplit('|').next())
        .map(|c| c.trim().to_string())
        .collect()
}

#[test]
fn bench_rows_say_which_transport_carried_them() {
    for (mode, rings, want) in [
        ("require", "on", "same-host"),
        ("off", "on", "tcp"),
        ("auto", "on", "same-host"),
        ("require", "off", "same-host:socket"),
    ] {
        let (mut target, port) = bench_target(false);
        let out = bench_initiator_env(false, port, mode, &[("MORIO_SAME_HOST_RING", rings)]);
        assert!(out.status.success(), "{mode}: {}", text(&out));
        assert_eq!(transports(&out), [want], "{mode}: {}", text(&out));
        assert!(target.wait().unwrap().success());
    }
}

/// The target runs as another user and cannot read the initiator: it declines in the
/// handshake and the connection stays TCP; an initiator that requires the same-host
/// transport fails, saying so.
#[test]
fn a_peer_that_cannot_read_us_is_served_over_tcp() {
    if !can_run_as_nobody() {
        return;
    }
    let (target, port) = bench_target(true);
    let out = bench_initiator(false, port, "auto");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(transports(&out), ["tcp"], "{}", text(&out));
    let t = target.wait_with_output().unwrap();
    assert!(t.status.success());
    let log = String::from_utf8_lossy(&t.stderr);
    assert_eq!(
        log.matches("same-host transport with").count(),
        1,
        "one log line for the fallback: {log}"
    );
    let (mut target, port) = bench_target(true);
    let out = bench_initiator(false, port, "require");
    assert!(!out.status.success());
    assert!(
        text(&out).contains("same-host transport required"),
        "{}",
        text(&out)
    );
    let _ = target.kill();
    let _ = target.wait();
}

/// The initiator runs as another user and cannot read the target, which could read it and
/// switched: the initiator dials again offering TCP only, and every row is validated.
#[test]
fn a_peer_we_cannot_read_is_reached_over_tcp() {
    if !can_run_as_nobody() {
        return;
    }
    let (mut target, port) = bench_target(false);
    let out = bench_initiator(true, port, "auto");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(transports(&out), ["tcp"], "{}", text(&out));
    assert!(target.wait().unwrap().success());
}

/// `GET /descriptors` (JSON) from a serve node's control port: its engine and its `kv` region.
fn descriptors(addr: SocketAddr) -> (EngineDesc, MemoryDesc) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /descriptors HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let at = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let j: serde_json::Value = serde_json::from_slice(&raw[at + 4..]).unwrap();
    let unhex = |v: &serde_json::Value| -> Vec<u8> {
        let h = v.as_str().unwrap();
        (0..h.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
            .collect()
    };
    (
        EngineDesc::unpack(&unhex(&j["engine"]["packed"])).unwrap(),
        MemoryDesc::unpack(&unhex(&j["memory"]["kv"]["packed"])).unwrap(),
    )
}

/// A `morio serve` node on this host, killed while same-host copies into and out of it (and
/// small transfers through its rings) are in flight: every one of its transfers ends within seconds (op_timeout is 30 s), says the
/// connection was lost, and transfers to another peer go on.
#[test]
fn a_same_host_peer_killed_mid_copy_fails_only_its_transfers() {
    let dir = std::env::temp_dir().join(format!("morio-same-host-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("serve.toml");
    std::fs::write(
        &cfg,
        "[engine]\nkey = \"sh-node\"\nhost = \"127.0.0.1\"\n[tcp]\nshards = 2\npin_shards = false\n\
         [control]\nlisten = \"127.0.0.1:0\"\n[stats]\ninterval_s = 0\n\
         [[memory]]\nname = \"kv\"\nsize = \"64MiB\"\n",
    )
    .unwrap();
    let mut node = Command::new(env!("CARGO_BIN_EXE_morio"))
        .args(["serve", "--config"])
        .arg(&cfg)
        .env_remove(morio::AUTH_SECRET_ENV)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Kept open while the node runs (it prints more).
    let mut out = BufReader::new(node.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    let control: SocketAddr = first
        .strip_prefix("MORIO_SERVE_CONTROL ")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .trim()
        .parse()
        .unwrap();
    let (node_desc, kv) = descriptors(control);

    let backend = morio::TcpBackendConfig {
        num_shards: Some(2),
        pin_shards: false,
        same_host: Some(SameHost::Require),
        ..Default::default()
    };
    let me = IoEngine::new("sh-client", IoEngineConfig::new("127.0.0.1", 0)).unwrap();
    me.create_backend(backend.clone()).unwrap();
    let other = IoEngine::new("sh-other", IoEngineConfig::new("127.0.0.1", 0)).unwrap();
    other.create_backend(backend).unwrap();
    me.register_remote_engine(&node_desc).unwrap();
    me.register_remote_engine(&other.engine_desc()).unwrap();
    let n = 16 << 20;
    let src = me
        .register_buffer((0..n).map(|i| (i % 253) as u8).collect())
        .unwrap();
    let dst = other.alloc_buffer(n).unwrap();
    let st = me.write(src.desc(), 0, &kv, 0, n, me.allocate_transfer_uid());
    assert_eq!(wait(&st, 30), StatusCode::Success, "{}", st.message());
    let t = me.stats().unwrap().total();
    assert!(t.lane_connects_same_host >= 1, "{t:?}");
    let rings_off = std::env::var("MORIO_SAME_HOST_RING").is_ok_and(|v| v == "off");
    assert_eq!(t.lane_connects_ring >= 1, !rings_off, "{t:?}");

    // Keep the node busy both ways, then kill it.
    let back = me.alloc_buffer(n).unwrap();
    let src_kill = me
        .register_buffer((0..n).map(|i| (i % 251) as u8).collect())
        .unwrap();
    let mut sts = Vec::new();
    for i in 0..64 {
        sts.push(if i % 2 == 0 {
            me.write(
                src_kill.desc(),
                0,
                &kv,
                (i % 4) * n,
                n,
                me.allocate_transfer_uid(),
            )
        } else {
            me.read(
                back.desc(),
                0,
                &kv,
                (i % 4) * n,
                n,
                me.allocate_transfer_uid(),
            )
        });
    }
    // And small ones, which travel inline through the shared-memory rings.
    for k in 0..1024 {
        sts.push(me.write(
            src_kill.desc(),
            k * 4096,
            &kv,
            k * 4096,
            4096,
            me.allocate_transfer_uid(),
        ));
    }
    std::thread::sleep(Duration::from_millis(20));
    node.kill().unwrap();
    let killed = Instant::now();
    node.wait().unwrap();
    let mut failed = 0;
    for st in &sts {
        let c = wait(st, 20);
        assert_ne!(c, StatusCode::Init, "a transfer hung after the kill");
        if c != StatusCode::Success {
            failed += 1;
            let m = st.message();
            assert!(
                !m.contains("timed out"),
                "a killed peer is a lost connection, not a timeout: {m}"
            );
        }
    }
    assert!(
        failed > 0,
        "the kill came after every transfer: make them longer"
    );
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "the node's transfers took {:?} to fail",
        killed.elapsed()
    );
    // The memory those transfers sent from is released soon too: no send keeps waiting for
    // a dead peer's acknowledgement (or for room in its ring) until op_timeout.
    let t0 = Instant::now();
    me.deregister_memory(back.desc()).unwrap();
    me.deregister_memory(src_kill.desc()).unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "deregistration waited {:?} for sends to a dead peer",
        t0.elapsed()
    );
    // Another peer is unaffected.
    let st = me.write(src.desc(), 0, dst.desc(), 0, n, me.allocate_transfer_uid());
    assert_eq!(wait(&st, 30), StatusCode::Success, "{}", st.message());
    assert!(
        dst.to_vec() == src.to_vec(),
        "bytes to the other peer differ"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn wait(st: &morio::TransferStatus, secs: u64) -> StatusCode {
    st.wait_for(Duration::from_secs(secs))
}
