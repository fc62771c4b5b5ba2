//! Discovery on a real etcd (Debian's `etcd-server`), started by each test on free loopback
//! ports with a temporary data directory and killed after: engines publish under a lease, a
//! watcher registers and forgets them, transfers follow.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use morio::discovery::{Discovery, DiscoveryError, DiscoveryOptions};
use morio::{IoEngine, IoEngineConfig, RegisteredBuffer, StatusCode, TcpBackendConfig};

const ETCD: &str = "etcd";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An etcd of this test's own; killed (and its data removed) on drop.
struct Etcd {
    child: Child,
    dir: PathBuf,
    endpoint: String,
    peer: u16,
}

impl Etcd {
    fn start() -> Etcd {
        let found = Command::new(ETCD)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            found,
            "no `etcd` binary on PATH: these tests start a real etcd. Install it \
             (`apt-get install etcd-server` on Debian, then make sure no system etcd service \
             keeps running) or run .ci/run, which does"
        );
        let (client, peer) = (free_port(), free_port());
        let dir = std::env::temp_dir().join(format!(
            "morio-etcd-{}-{client}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let endpoint = format!("127.0.0.1:{client}");
        let child = Self::spawn(&dir, &endpoint, peer);
        let etcd = Etcd {
            child,
            dir,
            endpoint,
            peer,
        };
        etcd.wait_ready();
        etcd
    }

    fn spawn(dir: &PathBuf, endpoint: &str, peer: u16) -> Child {
        let c = format!("http://{endpoint}");
        let p = format!("http://127.0.0.1:{peer}");
        Command::new(ETCD)
            .args(["--name", "morio-test", "--data-dir"])
            .arg(dir)
            .args(["--listen-client-urls", &c, "--advertise-client-urls", &c])
            .args([
                "--listen-peer-urls",
                &p,
                "--initial-advertise-peer-urls",
                &p,
            ])
            .args(["--initial-cluster", &format!("morio-test={p}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start etcd")
    }

    fn wait_ready(&self) {
        let t0 = Instant::now();
        loop {
            let o = DiscoveryOptions {
                connect_timeout: Duration::from_millis(500),
                ..Default::default()
            };
            match Discovery::connect_with(&[&self.endpoint], "/probe", o) {
                Ok(_) => break,
                Err(e) if t0.elapsed() > Duration::from_secs(20) => {
                    panic!("etcd did not come up: {e}")
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Kill etcd, wait `down`, start it again on the same ports and data.
    fn restart(&mut self, down: Duration) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::thread::sleep(down);
        self.child = Self::spawn(&self.dir, &self.endpoint, self.peer);
        self.wait_ready();
    }

    fn connect(&self, prefix: &str) -> Discovery {
        let o = DiscoveryOptions {
            lease_ttl: Duration::from_secs(2),
            ..Default::default()
        };
        Discovery::connect_with(&[&self.endpoint], prefix, o).expect("connect to etcd")
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn engine(key: &str) -> IoEngine {
    let e = IoEngine::new(key, IoEngineConfig::new("127.0.0.1", 0)).unwrap();
    e.create_backend(TcpBackendConfig {
        num_shards: Some(2),
        pin_shards: false,
        op_timeout: Duration::from_secs(10),
        ..Default::default()
    })
    .unwrap();
    e
}

fn filled(e: &IoEngine, n: usize, seed: u8) -> RegisteredBuffer {
    let b = e.alloc_buffer(n).unwrap();
    let bytes: Vec<u8> = (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
    b.write_at(0, &bytes);
    b
}

/// Write `n` bytes from `src` into `remote`'s region published as `kv` by engine `key`
/// (looked up in etcd) and return the status code.
fn write_to(d: &Discovery, me: &IoEngine, src: &RegisteredBuffer, key: &str) -> StatusCode {
    let regions = d.regions(key).unwrap();
    let (_, dst) = regions.iter().find(|(n, _)| n == "kv").expect("kv region");
    let st = me.write(src.desc(), 0, dst, 0, src.len(), me.allocate_transfer_uid());
    st.wait_for(Duration::from_secs(10));
    st.code()
}

#[test]
fn unreachable_etcd_is_a_clear_error_within_the_connect_timeout() {
    let port = free_port(); // nothing listens there now
    let t0 = Instant::now();
    let o = DiscoveryOptions {
        connect_timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let e = Discovery::connect_with(&[format!("127.0.0.1:{port}")], "/morio", o).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(matches!(e, DiscoveryError::Unreachable { .. }), "{e:?}");
    assert!(e.to_string().contains(&port.to_string()), "{e}");
}

#[test]
fn engines_publish_are_watched_move_data_and_are_forgotten_when_their_lease_goes() {
    let etcd = Etcd::start();
    let n = 256 << 10;
    let (a, b, c) = (engine("disc_a"), engine("disc_b"), engine("disc_c"));
    let (ra, rb) = (a.alloc_buffer(n).unwrap(), b.alloc_buffer(n).unwrap());
    let da = etcd.connect("/t1");
    da.publish(&a, &[("kv", ra.desc())]).unwrap();
    let db = etcd.connect("/t1");
    db.publish(&b, &[("kv", rb.desc())]).unwrap();
    assert!(matches!(
        db.publish(&b, &[("a/b", rb.desc())]),
        Err(DiscoveryError::RegionName(_))
    ));
    // Engine keys with '/' would make one engine's keys look like another's.
    let slashed = engine("disc/slashed");
    assert!(matches!(
        db.publish(&slashed, &[]),
        Err(DiscoveryError::EngineKey(_))
    ));
    assert!(matches!(
        db.lookup("disc/slashed"),
        Err(DiscoveryError::EngineKey(_))
    ));

    // Lookups see what was published.
    let dc = etcd.connect("/t1");
    assert_eq!(dc.lookup("disc_a").unwrap(), Some(a.engine_desc()));
    assert_eq!(dc.lookup("nobody").unwrap(), None);
    let regions = dc.regions("disc_b").unwrap();
    assert_eq!(regions.len(), 1);
    assert_eq!(regions[0].0, "kv");
    assert_eq!(&regions[0].1, rb.desc());

    // The watcher registers both peers on c; data moves, verified.
    dc.watch(&c).unwrap();
    let src = filled(&c, n, 7);
    assert_eq!(write_to(&dc, &c, &src, "disc_a"), StatusCode::Success);
    assert_eq!(write_to(&dc, &c, &src, "disc_b"), StatusCode::Success);
    assert_eq!(ra.to_vec(), src.to_vec());
    assert_eq!(rb.to_vec(), src.to_vec());
    let a_region = dc.regions("disc_a").unwrap().remove(0).1;

    // a's handle goes (its lease is revoked): c forgets a within the TTL; b still works.
    drop(da);
    let t0 = Instant::now();
    loop {
        let st = c.write(src.desc(), 0, &a_region, 0, n, c.allocate_transfer_uid());
        st.wait_for(Duration::from_secs(10));
        if st.code() != StatusCode::Success {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "c still reaches a {:?} after a's lease went",
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(dc.lookup("disc_a").unwrap(), None);
    assert!(dc.regions("disc_a").unwrap().is_empty());
    assert_eq!(write_to(&dc, &c, &src, "disc_b"), StatusCode::Success);

    // a restarts (a new engine, a new port, new regions): c registers it again.
    drop(ra);
    drop(a);
    let a2 = engine("disc_a");
    let ra2 = a2.alloc_buffer(n).unwrap();
    let da2 = etcd.connect("/t1");
    da2.publish(&a2, &[("kv", ra2.desc())]).unwrap();
    let t0 = Instant::now();
    while write_to(&dc, &c, &src, "disc_a") != StatusCode::Success {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "restarted a unreachable"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(ra2.to_vec(), src.to_vec());
    da2.close().unwrap();
    drop(db);
}

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

/// etcd restarts under a live handle: the keep-alive and the watch reconnect by themselves,
/// so the published engine stays (well past its TTL) and a peer published after the restart
/// is registered by the watcher.
#[test]
fn keep_alive_and_watch_survive_an_etcd_restart() {
    let mut etcd = Etcd::start();
    let n = 4096;
    let (a, b, c) = (engine("rs_a"), engine("rs_b"), engine("rs_c"));
    let ra = a.alloc_buffer(n).unwrap();
    let da = etcd.connect("/t4");
    da.publish(&a, &[("kv", ra.desc())]).unwrap();
    let dc = etcd.connect("/t4");
    dc.watch(&c).unwrap();
    etcd.restart(Duration::from_millis(500));
    std::thread::sleep(Duration::from_secs(5)); // more than twice the 2 s TTL
    assert!(
        dc.lookup("rs_a").unwrap().is_some(),
        "a's lease was not kept alive"
    );
    let rb = b.alloc_buffer(n).unwrap();
    let db = etcd.connect("/t4");
    db.publish(&b, &[("kv", rb.desc())]).unwrap();
    let src = filled(&c, n, 9);
    let t0 = Instant::now();
    while write_to(&dc, &c, &src, "rs_b") != StatusCode::Success {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the watch did not resume"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(rb.to_vec(), src.to_vec());
    assert_eq!(write_to(&dc, &c, &src, "rs_a"), StatusCode::Success);
}

/// Revoke every lease `etcd` holds (as an expiry during a long outage would end them).
fn revoke_all_leases(endpoint: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = etcd_client::Client::connect([endpoint], None)
            .await
            .unwrap();
        let ids: Vec<i64> = c
            .leases()
            .await
            .unwrap()
            .leases()
            .iter()
            .map(|l| l.id())
            .collect();
        assert!(!ids.is_empty());
        for id in ids {
            c.lease_revoke(id).await.unwrap();
        }
    });
}

/// A handle whose lease is lost while it lives takes a new one and publishes everything
/// again (the watcher sees the engine go and come back); publishing again with fewer regions
/// removes the ones no longer named.
#[test]
fn a_lost_lease_is_replaced_and_everything_published_again() {
    let etcd = Etcd::start();
    let n = 4096;
    let (a, c) = (engine("lost_a"), engine("lost_c"));
    let (r1, r2) = (a.alloc_buffer(n).unwrap(), a.alloc_buffer(n).unwrap());
    let da = etcd.connect("/t5");
    da.publish(&a, &[("kv", r1.desc()), ("extra", r2.desc())])
        .unwrap();
    da.publish(&a, &[("kv", r1.desc())]).unwrap();
    let dc = etcd.connect("/t5");
    let names: Vec<String> = dc
        .regions("lost_a")
        .unwrap()
        .into_iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(names, ["kv"]);
    dc.watch(&c).unwrap();
    revoke_all_leases(&etcd.endpoint);
    let t0 = Instant::now();
    while dc.lookup("lost_a").unwrap().is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(4),
            "not published again on a new lease"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(dc.regions("lost_a").unwrap().len(), 1);
    let src = filled(&c, n, 4);
    let t0 = Instant::now();
    while write_to(&dc, &c, &src, "lost_a") != StatusCode::Success {
        assert!(
            t0.elapsed() < Duration::from_secs(4),
            "not registered again"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(r1.to_vec(), src.to_vec());
}
