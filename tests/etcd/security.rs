//! Production settings: etcd's user and password authentication, TLS that needs its CA,
//! and `morio serve` against an etcd with client certificates and authentication.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use morio::discovery::{Discovery, DiscoveryError, DiscoveryOptions, EtcdAuth, EtcdTls};
use morio::StatusCode;

use crate::common::{engine, filled, s, within, write_to, TempDir};
use crate::pki::{make_ca, Pki};
use crate::server::{Etcd, MORIO_PASSWORD};

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
