//! `morio serve` with `[discovery]`: it publishes itself and its regions, unpublishes on
//! SIGTERM, and when killed it expires with its lease and watchers forget it.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use morio::StatusCode;

use crate::common::{engine, filled, write_to};
use crate::server::Etcd;

/// `morio serve` with `[discovery]`: it publishes itself and its regions, a peer finds it in
/// etcd and moves verified data, and on SIGTERM it unpublishes (the peer's transfers fail).
#[test]
fn serve_publishes_itself_in_etcd_and_unpublishes_on_sigterm() {
    use std::io::{BufRead, BufReader, Read};
    let etcd = Etcd::start();
    let dir = std::env::temp_dir().join(format!("morio-etcd-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("serve.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
[engine]
key = "serve-etcd"
host = "127.0.0.1"
[tcp]
shards = 2
pin_shards = false
[control]
listen = "127.0.0.1:0"
[stats]
interval_s = 0
[discovery]
etcd = ["{}"]
prefix = "/t2"
lease_ttl_s = 2
[[memory]]
name = "kv"
size = "1MiB"
"#,
            etcd.endpoint
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_morio"))
        .args(["serve", "--config"])
        .arg(&cfg)
        .env_remove(morio::AUTH_SECRET_ENV)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut published = false;
    for line in (&mut out).lines() {
        let line = line.unwrap();
        if line.contains("published in etcd") {
            published = true;
            break;
        }
    }
    assert!(published, "serve did not say it published itself");

    let x = engine("serve-etcd-peer");
    let d = etcd.connect("/t2");
    d.watch(&x).unwrap();
    let node = d.lookup("serve-etcd").unwrap().expect("serve published");
    assert!(node.port > 0);
    let n = 1 << 20;
    let src = filled(&x, n, 3);
    assert_eq!(write_to(&d, &x, &src, "serve-etcd"), StatusCode::Success);
    let back = x.alloc_buffer(n).unwrap();
    let kv = d.regions("serve-etcd").unwrap().remove(0).1;
    let st = x.read(back.desc(), 0, &kv, 0, n, x.allocate_transfer_uid());
    assert_eq!(st.wait_for(Duration::from_secs(10)), StatusCode::Success);
    assert_eq!(back.to_vec(), src.to_vec());

    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(status.success(), "exit {status:?}: {rest}");
    let t0 = Instant::now();
    while d.lookup("serve-etcd").unwrap().is_some() {
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "serve still published"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let st = x.write(src.desc(), 0, &kv, 0, n, x.allocate_transfer_uid());
    assert_ne!(st.wait_for(Duration::from_secs(10)), StatusCode::Success);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A node that dies without unpublishing (SIGKILL: its lease is not revoked) disappears when
/// its lease expires, and a watching peer deregisters it: its transfers then fail as
/// "remote engine not registered" (not merely as a refused connection).
#[test]
fn a_killed_serve_expires_with_its_lease_and_watchers_forget_it() {
    use std::io::{BufRead, BufReader};
    let etcd = Etcd::start();
    let dir = std::env::temp_dir().join(format!("morio-etcd-kill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("serve.toml");
    std::fs::write(
        &cfg,
        format!(
            "[engine]\nkey = \"serve-killed\"\nhost = \"127.0.0.1\"\n[tcp]\nshards = 1\n\
             pin_shards = false\n[control]\nlisten = \"127.0.0.1:0\"\n[stats]\ninterval_s = 0\n\
             [discovery]\netcd = [\"{}\"]\nprefix = \"/t3\"\nlease_ttl_s = 2\n\
             [[memory]]\nname = \"kv\"\nsize = 4096\n",
            etcd.endpoint
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_morio"))
        .args(["serve", "--config"])
        .arg(&cfg)
        .env_remove(morio::AUTH_SECRET_ENV)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    assert!(
        out.lines()
            .any(|l| l.unwrap().contains("published in etcd")),
        "serve did not say it published itself"
    );
    let x = engine("killed-peer");
    let d = etcd.connect("/t3");
    d.watch(&x).unwrap();
    let src = filled(&x, 4096, 5);
    assert_eq!(write_to(&d, &x, &src, "serve-killed"), StatusCode::Success);
    let kv = d.regions("serve-killed").unwrap().remove(0).1;

    child.kill().unwrap();
    child.wait().unwrap();
    let t0 = Instant::now();
    while d.lookup("serve-killed").unwrap().is_some() {
        assert!(
            t0.elapsed() < Duration::from_secs(6),
            "the killed node's lease did not expire"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let expired = t0.elapsed();
    let t1 = Instant::now();
    loop {
        let st = x.write(src.desc(), 0, &kv, 0, 4096, x.allocate_transfer_uid());
        st.wait_for(Duration::from_secs(10));
        if st.message().contains("remote engine not registered") {
            break;
        }
        assert!(
            t1.elapsed() < Duration::from_secs(2),
            "not deregistered after the lease expired ({expired:?}): {}",
            st.message()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
