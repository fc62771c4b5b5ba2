//! Discovery on a real etcd (Debian's `etcd-server`), started by each test on free loopback
//! ports with a temporary data directory and killed after: engines publish under a lease, a
//! watcher registers and forgets them, transfers follow. Production settings too: etcd's
//! user and password authentication (enabled through etcd-client's own API) and TLS (a CA
//! and certificates made at test time with the `openssl` command; those tests say so and
//! pass without it).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use morio::discovery::{Discovery, DiscoveryError, DiscoveryOptions, EtcdAuth, EtcdTls};
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
    /// `host:port` of its peer URL (`[::1]:port` on IPv6).
    peer: String,
    /// Serving TLS: its certificates, and whether it asks clients for theirs.
    tls: Option<(Pki, bool)>,
    /// The user `connect` authenticates as, once authentication is on.
    auth: Option<EtcdAuth>,
}

impl Etcd {
    fn start() -> Etcd {
        Self::start_with(None)
    }

    /// An etcd listening on IPv6 loopback only (`[::1]`).
    fn start_v6() -> Etcd {
        Self::start_on("[::1]", None)
    }

    /// An etcd serving TLS with `pki`'s server certificate; with `client_certs`, it also
    /// requires clients to present a certificate `pki`'s CA signed.
    fn start_tls(pki: Pki, client_certs: bool) -> Etcd {
        Self::start_with(Some((pki, client_certs)))
    }

    fn start_with(tls: Option<(Pki, bool)>) -> Etcd {
        Self::start_on("127.0.0.1", tls)
    }

    /// An etcd on `host` (`127.0.0.1`, or `[::1]`).
    fn start_on(host: &str, tls: Option<(Pki, bool)>) -> Etcd {
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
        let endpoint = format!("{host}:{client}");
        let mut etcd = Etcd {
            child: Command::new("true").spawn().unwrap(),
            dir,
            endpoint,
            peer: format!("{host}:{peer}"),
            tls,
            auth: None,
        };
        etcd.child = etcd.spawn();
        etcd.wait_ready();
        etcd
    }

    fn spawn(&self) -> Child {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let c = format!("{scheme}://{}", self.endpoint);
        let p = format!("http://{}", self.peer);
        let mut cmd = Command::new(ETCD);
        cmd.args(["--name", "morio-test", "--data-dir"])
            .arg(&self.dir)
            .args(["--listen-client-urls", &c, "--advertise-client-urls", &c])
            .args([
                "--listen-peer-urls",
                &p,
                "--initial-advertise-peer-urls",
                &p,
            ])
            .args(["--initial-cluster", &format!("morio-test={p}")])
            // With authentication on, a token unused for a second is forgotten: handles
            // authenticate again (a production etcd's default is 5 minutes).
            .args(["--auth-token-ttl", "1"]);
        if let Some((pki, client_certs)) = &self.tls {
            cmd.arg("--cert-file")
                .arg(&pki.server_cert)
                .arg("--key-file")
                .arg(&pki.server_key);
            if *client_certs {
                cmd.arg("--client-cert-auth")
                    .arg("--trusted-ca-file")
                    .arg(&pki.ca);
            }
        }
        cmd.stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start etcd")
    }

    /// The TLS settings a client of this etcd needs (a client certificate where it asks).
    fn client_tls(&self) -> Option<EtcdTls> {
        self.tls.as_ref().map(|(pki, client_certs)| {
            let t = EtcdTls::new(&pki.ca);
            if *client_certs {
                t.with_client_cert(&pki.client_cert, &pki.client_key)
            } else {
                t
            }
        })
    }

    fn wait_ready(&self) {
        let t0 = Instant::now();
        loop {
            let o = DiscoveryOptions {
                connect_timeout: Duration::from_millis(500),
                tls: self.client_tls(),
                auth: self.auth.clone(),
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
        self.child = self.spawn();
        self.wait_ready();
    }

    /// A handle with this etcd's TLS settings and user, a 2 s lease.
    fn options(&self) -> DiscoveryOptions {
        DiscoveryOptions {
            lease_ttl: Duration::from_secs(2),
            tls: self.client_tls(),
            auth: self.auth.clone(),
            ..Default::default()
        }
    }

    fn connect(&self, prefix: &str) -> Discovery {
        Discovery::connect_with(&[&self.endpoint], prefix, self.options()).expect("connect to etcd")
    }

    /// Run `f` with a raw etcd-client connection (as user `root` once authentication is on).
    fn admin<T>(&self, f: impl AsyncFnOnce(&mut etcd_client::Client) -> T) -> T {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut co = etcd_client::ConnectOptions::new();
            if let Some((pki, client_certs)) = &self.tls {
                let mut t = etcd_client::TlsOptions::new().ca_certificate(
                    etcd_client::Certificate::from_pem(std::fs::read(&pki.ca).unwrap()),
                );
                if *client_certs {
                    t = t.identity(etcd_client::Identity::from_pem(
                        std::fs::read(&pki.client_cert).unwrap(),
                        std::fs::read(&pki.client_key).unwrap(),
                    ));
                }
                co = co.with_tls(t);
            }
            if self.auth.is_some() {
                co = co.with_user("root", ROOT_PASSWORD);
            }
            let mut c = etcd_client::Client::connect([&self.endpoint], Some(co))
                .await
                .unwrap();
            f(&mut c).await
        })
    }

    /// Turn etcd's authentication on, as an operator would: user `root` (role `root`), and
    /// user `morio` whose role `morio` may read and write keys under `prefix` only; `connect`
    /// authenticates as `morio` from then on.
    fn enable_auth(&mut self, prefix: &str) {
        self.admin(async |c| {
            c.user_add("root", ROOT_PASSWORD, None).await.unwrap();
            c.user_grant_role("root", "root").await.unwrap();
            c.role_add("morio").await.unwrap();
            c.role_grant_permission(
                "morio",
                etcd_client::Permission::read_write(format!("{prefix}/")).with_prefix(),
            )
            .await
            .unwrap();
            c.user_add("morio", MORIO_PASSWORD, None).await.unwrap();
            c.user_grant_role("morio", "morio").await.unwrap();
            c.auth_enable().await.unwrap();
        });
        self.auth = Some(EtcdAuth::new("morio", MORIO_PASSWORD));
    }
}

const ROOT_PASSWORD: &str = "root-pw-7f3a";
const MORIO_PASSWORD: &str = "morio-pw-91c2";

/// A CA, a server certificate it signed for 127.0.0.1 and a client certificate, made by the
/// `openssl` command in a temporary directory (removed on drop).
struct Pki {
    dir: PathBuf,
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

impl Pki {
    /// `None` (and a line saying why) where there is no `openssl` command.
    fn make(name: &str) -> Option<Pki> {
        let found = Command::new("openssl")
            .arg("version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            println!("skipped: no `openssl` command to make the test's TLS certificates");
            return None;
        }
        let dir = std::env::temp_dir().join(format!(
            "morio-etcd-pki-{name}-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let pki = Pki {
            ca: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server-key.pem"),
            client_cert: dir.join("client.pem"),
            client_key: dir.join("client-key.pem"),
            dir,
        };
        let ca_key = pki.dir.join("ca-key.pem");
        make_ca(&pki.ca, &ca_key, "morio-test-ca");
        pki.issue("server", &pki.server_cert, &pki.server_key, &ca_key);
        pki.issue("client", &pki.client_cert, &pki.client_key, &ca_key);
        Some(pki)
    }

    /// A certificate for 127.0.0.1 (server and client use) that the CA signed.
    fn issue(&self, name: &str, cert: &Path, key: &Path, ca_key: &Path) {
        let csr = self.dir.join(format!("{name}.csr"));
        let ext = self.dir.join(format!("{name}.ext"));
        std::fs::write(
            &ext,
            "basicConstraints = critical, CA:FALSE\n\
             keyUsage = critical, digitalSignature\n\
             extendedKeyUsage = serverAuth, clientAuth\n\
             subjectAltName = IP:127.0.0.1\n",
        )
        .unwrap();
        openssl(
            &format!("req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=morio-{name}"),
            &[("-keyout", key), ("-out", &csr)],
        );
        openssl(
            &format!("x509 -req -days 2 -set_serial {}", rand::random::<u32>()),
            &[
                ("-in", &csr),
                ("-CA", &self.ca),
                ("-CAkey", ca_key),
                ("-extfile", &ext),
                ("-out", cert),
            ],
        );
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A self-signed CA certificate and its key.
fn make_ca(cert: &Path, key: &Path, cn: &str) {
    openssl(
        &format!(
            "req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
             -subj /CN={cn} -addext basicConstraints=critical,CA:TRUE \
             -addext keyUsage=critical,keyCertSign"
        ),
        &[("-keyout", key), ("-out", cert)],
    );
}

/// `openssl` with the words of `args`, then each file flag and its path.
fn openssl(args: &str, files: &[(&str, &Path)]) {
    let mut cmd = Command::new("openssl");
    cmd.args(args.split_whitespace());
    for (flag, path) in files {
        cmd.arg(flag).arg(path);
    }
    let o = cmd.output().unwrap();
    assert!(
        o.status.success(),
        "openssl {args} {files:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn engine(key: &str) -> IoEngine {
    engine_at(key, "127.0.0.1")
}

fn engine_at(key: &str, host: &str) -> IoEngine {
    let e = IoEngine::new(key, IoEngineConfig::new(host, 0)).unwrap();
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

/// An etcd on IPv6 loopback (`[::1]:port` endpoints) and engines on `::1`: published,
/// looked up and watched as on IPv4, and the watcher's engine moves verified bytes to both.
#[test]
fn discovery_works_over_ipv6() {
    if TcpListener::bind("[::1]:0").is_err() {
        eprintln!("skipped: no IPv6 loopback here");
        return;
    }
    let etcd = Etcd::start_v6();
    assert!(etcd.endpoint.starts_with("[::1]:"), "{}", etcd.endpoint);
    let n = 64 << 10;
    let (a, b) = (
        engine_at("disc6_a", "::1"),
        engine_at("disc6_b", "127.0.0.1"),
    );
    let c = engine_at("disc6_c", "::1");
    let (ra, rb) = (a.alloc_buffer(n).unwrap(), b.alloc_buffer(n).unwrap());
    let da = etcd.connect("/t6");
    da.publish(&a, &[("kv", ra.desc())]).unwrap();
    let db = etcd.connect("/t6");
    db.publish(&b, &[("kv", rb.desc())]).unwrap();
    let dc = etcd.connect("/t6");
    let found = dc.lookup("disc6_a").unwrap().expect("a published");
    assert_eq!(
        (found.host.as_str(), found.address()),
        ("::1", format!("[::1]:{}", found.port))
    );
    dc.watch(&c).unwrap();
    let src = filled(&c, n, 9);
    assert_eq!(write_to(&dc, &c, &src, "disc6_a"), StatusCode::Success);
    assert_eq!(write_to(&dc, &c, &src, "disc6_b"), StatusCode::Success);
    assert_eq!(ra.to_vec(), src.to_vec());
    assert_eq!(rb.to_vec(), src.to_vec());
    da.close().unwrap();
    drop(db);
}

/// With `connect_peers`, the watcher opens every connection to each peer it registers,
/// before any transfer: one already published (the snapshot) and one that appears later.
#[test]
fn watchers_that_connect_peers_open_their_lanes_before_any_transfer() {
    let etcd = Etcd::start();
    let (a, b, c) = (engine("conn_a"), engine("conn_b"), engine("conn_c"));
    let da = etcd.connect("/t9");
    da.publish(&a, &[]).unwrap();
    let o = DiscoveryOptions {
        connect_peers: true,
        ..etcd.options()
    };
    let dc = Discovery::connect_with(&[&etcd.endpoint], "/t9", o).unwrap();
    dc.publish(&c, &[]).unwrap();
    dc.watch(&c).unwrap();
    let lanes = TcpBackendConfig::default().num_data_conns as u64;
    let up_to = |peer: &str| {
        c.stats()
            .unwrap()
            .per_peer()
            .get(peer)
            .map_or(0, |p| p.lane_connects)
    };
    let wait_for = |peer: &str| {
        let t0 = Instant::now();
        while up_to(peer) < lanes {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{} of {lanes} lanes to {peer} after {:?}",
                up_to(peer),
                t0.elapsed()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for("conn_a");
    let db = etcd.connect("/t9");
    db.publish(&b, &[]).unwrap();
    wait_for("conn_b");
    // Each lane once: the later put did not open a's again.
    assert_eq!(up_to("conn_a"), lanes);
    // A watcher without the option opens nothing until a transfer needs it.
    let plain = etcd.connect("/t9");
    let d = engine("conn_d");
    plain.watch(&d).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(d.stats().unwrap().total().lane_connects, 0);
    drop((da, db, dc, plain));
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

/// A directory of this test's own, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!(
            "morio-etcd-{name}-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `f` returns within `bound`.
fn within<T>(bound: Duration, f: impl FnOnce() -> T) -> T {
    let t0 = Instant::now();
    let r = f();
    assert!(t0.elapsed() < bound, "took {:?}", t0.elapsed());
    r
}

/// etcd with authentication on: user `morio` (read and write under `/t6/` only), its
/// password from a file, publishes, looks up, watches and moves data; outside its prefix etcd
/// denies it. A wrong password or an unknown user is refused at connect, no user at all fails
/// at the first request, each with a clear error and within the timeouts. etcd restarting
/// (it forgets every auth token) does not stop the handles: they authenticate again.
#[test]
fn etcd_authentication_admits_the_right_password_only() {
    let mut etcd = Etcd::start();
    etcd.enable_auth("/t6");
    let dir = TempDir::new("auth");
    let pw = dir.0.join("password");
    std::fs::write(&pw, format!("{MORIO_PASSWORD}\n")).unwrap();
    let auth = EtcdAuth::from_password_file("morio", &pw).unwrap();
    let opts = DiscoveryOptions {
        auth: Some(auth),
        ..etcd.options()
    };
    let shown = format!("{opts:?}");
    assert!(
        shown.contains("morio") && !shown.contains(MORIO_PASSWORD),
        "{shown}"
    );

    let n = 4096;
    let (a, c) = (engine("auth_a"), engine("auth_c"));
    let ra = a.alloc_buffer(n).unwrap();
    let da = Discovery::connect_with(&[&etcd.endpoint], "/t6", opts).unwrap();
    da.publish(&a, &[("kv", ra.desc())]).unwrap();
    let dc = etcd.connect("/t6");
    assert_eq!(dc.lookup("auth_a").unwrap(), Some(a.engine_desc()));
    dc.watch(&c).unwrap();
    let src = filled(&c, n, 11);
    assert_eq!(write_to(&dc, &c, &src, "auth_a"), StatusCode::Success);
    assert_eq!(ra.to_vec(), src.to_vec());

    // Outside its role's prefix etcd denies the user, and says so.
    let other = etcd.connect("/other");
    let e = other.publish(&c, &[]).unwrap_err();
    assert!(e.to_string().contains("permission denied"), "{e}");
    drop(other);

    // A wrong password, an unknown user: refused at connect, naming the user.
    for (user, password) in [("morio", "not-the-password"), ("nobody", MORIO_PASSWORD)] {
        let o = DiscoveryOptions {
            auth: Some(EtcdAuth::new(user, password)),
            ..etcd.options()
        };
        let e = within(Duration::from_secs(3), || {
            Discovery::connect_with(&[&etcd.endpoint], "/t6", o).unwrap_err()
        });
        assert!(matches!(e, DiscoveryError::Auth { .. }), "{e:?}");
        let m = e.to_string();
        assert!(m.contains(user) && m.contains("password"), "{m}");
        assert!(!m.contains(password), "{m}");
    }
    // No user at all: etcd answers but asks for one, which the first request says plainly.
    let o = DiscoveryOptions {
        auth: None,
        ..etcd.options()
    };
    let e = within(Duration::from_secs(3), || {
        match Discovery::connect_with(&[&etcd.endpoint], "/t6", o) {
            Err(e) => e,
            Ok(d) => d.publish(&c, &[]).unwrap_err(),
        }
    });
    assert!(matches!(e, DiscoveryError::Auth { .. }), "{e:?}");
    assert!(e.to_string().contains("authentication"), "{e}");

    // etcd restarts and forgets the handles' tokens: they authenticate again by themselves
    // (the lease kept alive or published again, lookups and the watch answered).
    etcd.restart(Duration::from_millis(300));
    let t0 = Instant::now();
    while dc.lookup("auth_a").unwrap().is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "a not published again"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let b = engine("auth_b");
    let rb = b.alloc_buffer(n).unwrap();
    let db = etcd.connect("/t6");
    db.publish(&b, &[("kv", rb.desc())]).unwrap();
    let t0 = Instant::now();
    while write_to(&dc, &c, &src, "auth_b") != StatusCode::Success {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the watch did not resume"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(rb.to_vec(), src.to_vec());
    // Idle past the token's 1 s TTL: the next request authenticates again by itself.
    std::thread::sleep(Duration::from_millis(2500));
    da.close().unwrap();
    assert_eq!(dc.lookup("auth_a").unwrap(), None);
}

/// etcd serving TLS: a handle given the CA of its certificate connects and publishes; without
/// TLS, with an `https://` endpoint but no CA, or trusting another CA it fails clearly within
/// the connect timeout; unreadable or non-PEM files are named.
#[test]
fn etcd_over_tls_needs_its_ca() {
    let Some(pki) = Pki::make("tls") else {
        return;
    };
    let etcd = Etcd::start_tls(pki, false);
    let pki = &etcd.tls.as_ref().unwrap().0;
    let a = engine("tls_a");
    let d = etcd.connect("/t7");
    d.publish(&a, &[]).unwrap();
    let url = format!("https://{}", etcd.endpoint);
    let d2 = Discovery::connect_with(&[&url], "/t7", etcd.options()).unwrap();
    assert_eq!(d2.lookup("tls_a").unwrap(), Some(a.engine_desc()));

    let fails = |endpoint: &str, tls: Option<EtcdTls>| {
        let o = DiscoveryOptions {
            tls,
            connect_timeout: Duration::from_secs(2),
            ..etcd.options()
        };
        let e = within(Duration::from_secs(4), || {
            Discovery::connect_with(&[endpoint], "/t7", o).unwrap_err()
        });
        println!("{endpoint}: {e}");
        e
    };
    // Plain HTTP/2 to a TLS port.
    let e = fails(&etcd.endpoint, None);
    assert!(matches!(e, DiscoveryError::Connect { .. }), "{e:?}");
    assert!(e.to_string().contains(&etcd.endpoint), "{e}");
    assert!(e.to_string().contains("ca_file"), "{e}");
    // https:// without a CA: said before dialing.
    let e = fails(&url, None);
    assert!(matches!(e, DiscoveryError::Config { .. }), "{e:?}");
    assert!(e.to_string().contains("ca_file"), "{e}");
    // TLS with http://.
    let e = fails(&format!("http://{}", etcd.endpoint), etcd.client_tls());
    assert!(matches!(e, DiscoveryError::Config { .. }), "{e:?}");
    // Another CA: etcd's certificate is not trusted.
    let (other_ca, other_key) = (pki.dir.join("other-ca.pem"), pki.dir.join("other-key.pem"));
    make_ca(&other_ca, &other_key, "another-ca");
    let e = fails(&etcd.endpoint, Some(EtcdTls::new(&other_ca)));
    assert!(matches!(e, DiscoveryError::Connect { .. }), "{e:?}");
    assert!(e.to_string().contains("UnknownIssuer"), "{e}");

    // Files: missing, not PEM, a key without its certificate.
    let missing = pki.dir.join("missing.pem");
    let e = fails(&etcd.endpoint, Some(EtcdTls::new(&missing)));
    assert!(
        matches!(
            e,
            DiscoveryError::File {
                what: "ca_file",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains(&s(&missing)), "{e}");
    let e = fails(
        &etcd.endpoint,
        Some(EtcdTls::new(&pki.ca).with_client_cert(&pki.ca, &pki.server_cert)),
    );
    assert!(
        matches!(
            e,
            DiscoveryError::File {
                what: "key_file",
                ..
            }
        ),
        "{e:?}"
    );
    let mut half = EtcdTls::new(&pki.ca);
    half.key_file = Some(pki.client_key.clone());
    let e = fails(&etcd.endpoint, Some(half));
    assert!(e.to_string().contains("cert_file"), "{e}");
}

/// `morio serve` against a production-like etcd: TLS with client certificates and
/// authentication, from `[discovery]`'s user, password_file, ca_file, cert_file and key_file.
/// It publishes itself where a peer finds it; a handle without a client certificate is
/// turned away; on SIGTERM it unpublishes.
#[test]
fn serve_publishes_in_an_etcd_with_client_certificates_and_authentication() {
    use std::io::{BufRead, BufReader};
    let Some(pki) = Pki::make("mtls") else {
        return;
    };
    let mut etcd = Etcd::start_tls(pki, true);
    etcd.enable_auth("/t8");
    let pki = &etcd.tls.as_ref().unwrap().0;

    // No client certificate: etcd ends the handshake.
    let o = DiscoveryOptions {
        tls: Some(EtcdTls::new(&pki.ca)),
        connect_timeout: Duration::from_secs(2),
        ..etcd.options()
    };
    let e = within(Duration::from_secs(4), || {
        Discovery::connect_with(&[&etcd.endpoint], "/t8", o).unwrap_err()
    });
    println!("no client certificate: {e}");
    assert!(matches!(e, DiscoveryError::Connect { .. }), "{e:?}");
    assert!(e.to_string().contains("cert_file"), "{e}");

    let dir = TempDir::new("serve-mtls");
    let pw = dir.0.join("password");
    std::fs::write(&pw, format!("{MORIO_PASSWORD}\n")).unwrap();
    let cfg = dir.0.join("serve.toml");
    std::fs::write(
        &cfg,
        format!(
            "[engine]\nkey = \"serve-mtls\"\nhost = \"127.0.0.1\"\n[tcp]\nshards = 1\n\
             pin_shards = false\n[control]\nlisten = \"127.0.0.1:0\"\n[stats]\ninterval_s = 0\n\
             [discovery]\netcd = [\"{}\"]\nprefix = \"/t8\"\nlease_ttl_s = 2\n\
             user = \"morio\"\npassword_file = {:?}\nca_file = {:?}\ncert_file = {:?}\n\
             key_file = {:?}\n[[memory]]\nname = \"kv\"\nsize = 4096\n",
            etcd.endpoint,
            s(&pw),
            s(&pki.ca),
            s(&pki.client_cert),
            s(&pki.client_key),
        ),
    )
    .unwrap();
    let log = dir.0.join("serve.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_morio"))
        .args(["serve", "--config"])
        .arg(&cfg)
        .env_remove(morio::AUTH_SECRET_ENV)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let published = (&mut out)
        .lines()
        .map_while(Result::ok)
        .any(|l| l.contains("published in etcd"));
    if !published {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "serve did not publish itself: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    let x = engine("serve-mtls-peer");
    let d = etcd.connect("/t8");
    d.watch(&x).unwrap();
    let src = filled(&x, 4096, 13);
    assert_eq!(write_to(&d, &x, &src, "serve-mtls"), StatusCode::Success);
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(child.wait().unwrap().success(), "{rest}");
    assert_eq!(d.lookup("serve-mtls").unwrap(), None);
}

fn s(p: &Path) -> String {
    p.display().to_string()
}
