//! Certificates for the TLS tests, made at test time with the `openssl` command: a CA, a
//! server certificate for 127.0.0.1 and a client certificate, in a temporary directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A CA, a server certificate it signed for 127.0.0.1 and a client certificate, made by the
/// `openssl` command in a temporary directory (removed on drop).
pub struct Pki {
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl Pki {
    /// `None` (and a line saying why) where there is no `openssl` command.
    pub fn make(name: &str) -> Option<Pki> {
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
pub fn make_ca(cert: &Path, key: &Path, cn: &str) {
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
