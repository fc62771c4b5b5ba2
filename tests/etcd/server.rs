//! An etcd of the test's own (Debian's `etcd-server`): started on free loopback ports (IPv4
//! or IPv6) with a temporary data directory, optionally serving TLS and asking for client
//! certificates, restarted in place, with authentication turned on as an operator would;
//! killed and its data removed on drop.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use morio::discovery::{Discovery, DiscoveryOptions, EtcdAuth, EtcdTls};

use crate::pki::Pki;

const ETCD: &str = "etcd";

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An etcd of this test's own; killed (and its data removed) on drop.
pub struct Etcd {
    child: Child,
    dir: PathBuf,
    pub endpoint: String,
    /// `host:port` of its peer URL (`[::1]:port` on IPv6).
    peer: String,
    /// Serving TLS: its certificates, and whether it asks clients for theirs.
    pub tls: Option<(Pki, bool)>,
    /// The user `connect` authenticates as, once authentication is on.
    auth: Option<EtcdAuth>,
}

impl Etcd {
    pub fn start() -> Etcd {
        Self::start_with(None)
    }

    /// An etcd listening on IPv6 loopback only (`[::1]`).
    pub fn start_v6() -> Etcd {
        Self::start_on("[::1]", None)
    }

    /// An etcd serving TLS with `pki`'s server certificate; with `client_certs`, it also
    /// requires clients to present a certificate `pki`'s CA signed.
    pub fn start_tls(pki: Pki, client_certs: bool) -> Etcd {
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
    pub fn client_tls(&self) -> Option<EtcdTls> {
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
    pub fn restart(&mut self, down: Duration) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::thread::sleep(down);
        self.child = self.spawn();
        self.wait_ready();
    }

    /// A handle with this etcd's TLS settings and user, a 2 s lease.
    pub fn options(&self) -> DiscoveryOptions {
        DiscoveryOptions {
            lease_ttl: Duration::from_secs(2),
            tls: self.client_tls(),
            auth: self.auth.clone(),
            ..Default::default()
        }
    }

    pub fn connect(&self, prefix: &str) -> Discovery {
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
    pub fn enable_auth(&mut self, prefix: &str) {
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
pub const MORIO_PASSWORD: &str = "morio-pw-91c2";

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
