//! Discovery's options (timeouts, etcd authentication and TLS) and its errors.

use std::path::{Path, PathBuf};
use std::time::Duration;

use etcd_client::{Certificate, Identity, TlsOptions};

use crate::desc::DescError;

/// Errors of [`Discovery`](super::Discovery).
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// No endpoint answered within the connect timeout.
    #[error("etcd at {endpoints} did not answer within {timeout:?}: is etcd running there?")]
    Unreachable {
        /// The endpoints tried, comma-separated.
        endpoints: String,
        /// The bound on connecting.
        timeout: Duration,
    },
    /// A request failed or did not finish within the request timeout.
    #[error("etcd {op}: {message}")]
    Etcd {
        /// What was asked.
        op: &'static str,
        /// What went wrong.
        message: String,
    },
    /// A stored value is not a descriptor.
    #[error("etcd key {key}: {source}")]
    Decode {
        /// The etcd key.
        key: String,
        /// Why it does not unpack.
        source: DescError,
    },
    /// A region name that cannot be a key segment (empty or containing `/`).
    #[error("region name {0:?} must be non-empty and contain no '/'")]
    RegionName(String),
    /// An engine key that cannot be a key segment (containing `/`): its regions would be
    /// mistaken for another engine's.
    #[error("engine key {0:?} contains '/', which discovery keys cannot hold")]
    EngineKey(String),
    /// etcd refused the user or password, or asked for a user this handle does not give.
    #[error("etcd at {endpoints}: {message}")]
    Auth {
        /// The endpoints tried, comma-separated.
        endpoints: String,
        /// What etcd said, and what to change.
        message: String,
    },
    /// A file of the options (a password or a TLS certificate or key) cannot be read or does
    /// not hold what it should.
    #[error("etcd {what} {}: {message}", path.display())]
    File {
        /// Which file: `password_file`, `ca_file`, `cert_file` or `key_file`.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// Options that cannot work: an empty user, a client certificate without its key, TLS
    /// with an `http://` endpoint or an `https://` endpoint without TLS.
    #[error("etcd at {endpoints}: {message}")]
    Config {
        /// The endpoints, comma-separated.
        endpoints: String,
        /// What is wrong.
        message: String,
    },
    /// etcd was reached but the connection failed before it answered: most often TLS (etcd's
    /// certificate not signed by the CA given or not naming the host, a client certificate
    /// etcd asks for and did not get, or TLS spoken to one side only).
    #[error("etcd at {endpoints}: {message}")]
    Connect {
        /// The endpoints, comma-separated.
        endpoints: String,
        /// What failed, and what to check.
        message: String,
    },
    /// The background runtime could not start.
    #[error("discovery runtime: {0}")]
    Runtime(#[from] std::io::Error),
}

/// A user of etcd's authentication (`etcdctl user add`, a role granting read and write on the
/// prefix) and its password. `Debug` never shows the password.
#[derive(Clone)]
pub struct EtcdAuth {
    pub(super) user: String,
    pub(super) password: String,
}

impl EtcdAuth {
    /// `user` with `password`.
    pub fn new(user: impl Into<String>, password: impl Into<String>) -> Self {
        Self {
            user: user.into(),
            password: password.into(),
        }
    }

    /// `user` with the password held in the file at `path` (a trailing newline is ignored):
    /// deployments keep passwords out of configuration files and command lines.
    pub fn from_password_file(
        user: impl Into<String>,
        path: impl AsRef<Path>,
    ) -> Result<Self, DiscoveryError> {
        let path = path.as_ref();
        let file_err = |message: String| DiscoveryError::File {
            what: "password_file",
            path: path.to_path_buf(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| file_err(e.to_string()))?;
        let password = text
            .strip_suffix('\n')
            .map(|t| t.strip_suffix('\r').unwrap_or(t))
            .unwrap_or(&text);
        if password.is_empty() {
            return Err(file_err("the file is empty".into()));
        }
        Ok(Self::new(user, password))
    }

    /// The user's name.
    pub fn user(&self) -> &str {
        &self.user
    }
}

impl std::fmt::Debug for EtcdAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdAuth")
            .field("user", &self.user)
            .field("password", &"<hidden>")
            .finish()
    }
}

/// TLS to etcd (its `--cert-file`/`--key-file`): the PEM file of the CA that signed etcd's
/// server certificates and, where etcd checks clients' certificates (`--client-cert-auth`),
/// this client's certificate and key, both or neither. Read at connect; endpoints are then
/// `host:port` or `https://` URLs, and etcd's certificate must name the host dialed (an IP
/// address as an IP SAN).
#[derive(Clone, Debug)]
pub struct EtcdTls {
    /// PEM certificate(s) of the CA to trust (no system roots are used).
    pub ca_file: PathBuf,
    /// PEM certificate of this client, for etcd's `--client-cert-auth`.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
}

impl EtcdTls {
    /// TLS trusting the CA in `ca_file`, without a client certificate.
    pub fn new(ca_file: impl Into<PathBuf>) -> Self {
        Self {
            ca_file: ca_file.into(),
            cert_file: None,
            key_file: None,
        }
    }

    /// The same, presenting the client certificate in `cert_file` with its key in `key_file`.
    pub fn with_client_cert(
        mut self,
        cert_file: impl Into<PathBuf>,
        key_file: impl Into<PathBuf>,
    ) -> Self {
        self.cert_file = Some(cert_file.into());
        self.key_file = Some(key_file.into());
        self
    }

    /// The client's TLS settings from the files (each read and checked to hold PEM).
    pub(super) fn options(&self, endpoints: &str) -> Result<TlsOptions, DiscoveryError> {
        let ca = read_pem("ca_file", &self.ca_file, "CERTIFICATE")?;
        let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(ca));
        match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => {
                let cert = read_pem("cert_file", cert, "CERTIFICATE")?;
                let key = read_pem("key_file", key, "PRIVATE KEY")?;
                tls = tls.identity(Identity::from_pem(cert, key));
            }
            (None, None) => {}
            (c, _) => {
                return Err(DiscoveryError::Config {
                    endpoints: endpoints.to_string(),
                    message: format!(
                        "TLS: a client certificate needs both cert_file and key_file (only {} \
                         given)",
                        if c.is_some() { "cert_file" } else { "key_file" }
                    ),
                })
            }
        }
        Ok(tls)
    }
}

/// The file at `path`, which must hold a PEM block whose label ends with `label`.
pub(super) fn read_pem(
    what: &'static str,
    path: &Path,
    label: &str,
) -> Result<Vec<u8>, DiscoveryError> {
    let file_err = |message: String| DiscoveryError::File {
        what,
        path: path.to_path_buf(),
        message,
    };
    let pem = std::fs::read(path).map_err(|e| file_err(e.to_string()))?;
    let text = String::from_utf8_lossy(&pem);
    let found = text.lines().any(|l| {
        l.strip_prefix("-----BEGIN ")
            .and_then(|l| l.strip_suffix("-----"))
            .is_some_and(|l| l.ends_with(label))
    });
    if !found {
        return Err(file_err(format!("no PEM \"{label}\" block in it")));
    }
    Ok(pem)
}

/// Timeouts, the lease TTL, authentication and TLS of a [`Discovery`](super::Discovery) handle.
#[derive(Clone, Debug)]
pub struct DiscoveryOptions {
    /// Lease TTL of the published keys: how long a peer that died stays visible (etcd's
    /// minimum is its own, usually a few seconds; whole seconds).
    pub lease_ttl: Duration,
    /// Bound on reaching etcd in [`Discovery::connect_with`](super::Discovery::connect_with).
    pub connect_timeout: Duration,
    /// Bound on every later request.
    pub request_timeout: Duration,
    /// The etcd user to authenticate as (none: etcd without authentication).
    pub auth: Option<EtcdAuth>,
    /// TLS to etcd (none: plain HTTP/2).
    pub tls: Option<EtcdTls>,
    /// Open every connection to each peer [`watch`](super::Discovery::watch) registers, in
    /// the background, as [`IoEngine::connect_remote_engine`](crate::IoEngine::connect_remote_engine)
    /// does (bounded by `request_timeout`, at least 10 s): peers' first transfers pay no
    /// set-up, and one that cannot be reached or refuses this engine is logged when it
    /// appears. Off by default (a fleet of N engines would open N × (N - 1) × lanes
    /// connections).
    pub connect_peers: bool,
}

impl Default for DiscoveryOptions {
    fn default() -> Self {
        Self {
            lease_ttl: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            auth: None,
            tls: None,
            connect_peers: false,
        }
    }
}
