//! A node stopped with SIGSTOP while a write to it fails by its deadline: the write is not
//! placed when the node resumes, over TCP and over the same-host transport.

use std::time::Duration;

use morio::{EngineDesc, IoEngine, IoEngineConfig, MemoryDesc, StatusCode, TcpBackendConfig};

use crate::common::*;

/// A write that failed by its deadline while the node's process was stopped (SIGSTOP) is not
/// placed when the node runs again: its initiator reset the lane before reporting the
/// failure, and the node, reading chunks that waited in its receive queue, checks for that
/// before placing. Without the check the bytes its kernel had accepted (megabytes) landed on
/// resume, over whatever the application had written there since; without the reset, a small
/// write the node's kernel held whole (the initiator's socket had nothing left) did.
#[test]
fn a_write_failed_while_the_node_was_stopped_is_not_placed_when_it_resumes() {
    // A small write too: its node's kernel holds all of it (nothing is left in the
    // initiator's socket), and it goes express (from the submitting thread).
    for (mode, n) in [
        (morio::SameHost::Off, 16 << 20),
        (morio::SameHost::Require, 16 << 20),
        (morio::SameHost::Off, 4096),
    ] {
        stopped_node_drops_a_failed_write(mode, n);
    }
}

fn stopped_node_drops_a_failed_write(mode: morio::SameHost, n: usize) {
    let dir = std::env::temp_dir().join(format!(
        "morio-serve-stop-{}-{mode:?}-{n}",
        std::process::id()
    ));
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
    let (child, mut out) = spawn_serve(&cfg);
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
        err.contains("the initiator reset this lane while its WRITE chunks waited here unread"),
        "{mode:?}: {err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
