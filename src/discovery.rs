//! Discovery on etcd (feature `etcd`): engines publish their packed descriptors under a lease
//! and watch each other's.
//!
//! Layout under a deployment's `prefix` (e.g. `/morio`):
//!
//! * `{prefix}/engines/{key}`: the engine's packed [`EngineDesc`];
//! * `{prefix}/regions/{key}/{name}`: the packed [`MemoryDesc`] of each named region.
//!
//! Every key a [`Discovery`] handle publishes rides on one lease that the handle keeps alive;
//! closing or dropping the handle revokes it (the keys go at once), and a process that dies
//! stops refreshing it (the keys go when the lease's TTL runs out). [`Discovery::watch`]
//! turns those puts and deletes into [`IoEngine::register_remote_engine`] and
//! [`IoEngine::deregister_remote_engine`] calls on a local engine: a restarted peer (a new
//! descriptor) is registered again, a peer that went away is forgotten and its transfers fail.
//!
//! A production etcd asks for a user ([`EtcdAuth`]: etcd's user and password authentication,
//! the token renewed by itself when etcd forgets it) and speaks TLS ([`EtcdTls`]: the CA of
//! etcd's server certificates and, for `--client-cert-auth`, this client's certificate and
//! key; PEM files read at connect).
//!
//! The etcd client runs on a small tokio runtime on one background thread owned by the
//! handle, never on an engine's shards; the calls here block the calling thread until etcd
//! answers or the handle's timeout passes (so call them, and drop the handle, outside any
//! tokio runtime of your own).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use etcd_client::{
    Certificate, Client, ConnectOptions, EventType, GetOptions, Identity, LeaseKeepAliveStream,
    LeaseKeeper, PutOptions, TlsOptions, WatchOptions, WatchStream, Watcher,
};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

use crate::desc::{DescError, EngineDesc, MemoryDesc};
use crate::engine::remote::{deregister, register};
use crate::engine::IoEngine;
use crate::submit::Core;

/// Errors of [`Discovery`].
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
    user: String,
    password: String,
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
    fn options(&self, endpoints: &str) -> Result<TlsOptions, DiscoveryError> {
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
fn read_pem(what: &'static str, path: &Path, label: &str) -> Result<Vec<u8>, DiscoveryError> {
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

/// Timeouts, the lease TTL, authentication and TLS of a [`Discovery`] handle.
#[derive(Clone, Debug)]
pub struct DiscoveryOptions {
    /// Lease TTL of the published keys: how long a peer that died stays visible (etcd's
    /// minimum is its own, usually a few seconds; whole seconds).
    pub lease_ttl: Duration,
    /// Bound on reaching etcd in [`Discovery::connect_with`].
    pub connect_timeout: Duration,
    /// Bound on every later request.
    pub request_timeout: Duration,
    /// The etcd user to authenticate as (none: etcd without authentication).
    pub auth: Option<EtcdAuth>,
    /// TLS to etcd (none: plain HTTP/2).
    pub tls: Option<EtcdTls>,
}

impl Default for DiscoveryOptions {
    fn default() -> Self {
        Self {
            lease_ttl: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            auth: None,
            tls: None,
        }
    }
}

/// A connection to etcd that publishes engines and watches peers (see the module docs).
pub struct Discovery {
    conn: Conn,
    /// The endpoints, comma-separated (for errors).
    endpoints: String,
    prefix: String,
    opts: DiscoveryOptions,
    rt: Handle,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Discovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discovery")
            .field("prefix", &self.prefix)
            .finish()
    }
}

/// What the handle and its keep-alive task share.
#[derive(Default)]
struct Shared {
    /// The lease the published keys ride on (granted on first publish).
    lease: Mutex<Option<i64>>,
    /// Every key published and its value: put again on a new lease if the lease is lost.
    published: Mutex<BTreeMap<String, Vec<u8>>>,
    /// Set (under `lease`'s lock) when the handle closes: no new lease then.
    closing: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The etcd client and, with authentication, the user to authenticate as again when etcd no
/// longer takes the client's token (its TTL ran out, or etcd restarted and lost it).
#[derive(Clone)]
struct Conn {
    client: Client,
    auth: Option<Arc<Renewal>>,
}

/// The user of an authenticated handle, and its token's renewals: one at a time, so that the
/// tasks that find the token stale together authenticate once.
struct Renewal {
    auth: EtcdAuth,
    /// Held while authenticating.
    lock: tokio::sync::Mutex<()>,
    /// Renewals so far.
    generation: AtomicU64,
}

impl Conn {
    fn new(client: Client, auth: Option<EtcdAuth>) -> Self {
        Self {
            client,
            auth: auth.map(|auth| {
                Arc::new(Renewal {
                    auth,
                    lock: tokio::sync::Mutex::new(()),
                    generation: AtomicU64::new(0),
                })
            }),
        }
    }

    /// Which token requests go out with now (a renewal count), for [`Self::renew`].
    fn generation(&self) -> u64 {
        self.auth
            .as_ref()
            .map_or(0, |r| r.generation.load(Ordering::Acquire))
    }

    /// `f` on a clone of the client; once more after authenticating again if etcd no longer
    /// takes the token.
    async fn call<T, F, Fut>(&self, mut f: F) -> Result<T, etcd_client::Error>
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let generation = self.generation();
        match f(self.client.clone()).await {
            Err(e) if self.renew(&e, generation).await => f(self.client.clone()).await,
            r => r,
        }
    }

    /// If `e` (the answer to a request sent with token `generation`) says etcd no longer
    /// takes the token and this handle has a user, authenticate again, unless another task
    /// already did; whether the token is fresh now. Every clone of the client sends the new
    /// one.
    async fn renew(&self, e: &etcd_client::Error, generation: u64) -> bool {
        let Some(r) = &self.auth else {
            return false;
        };
        if !grpc_message(e).is_some_and(token_refused) {
            return false;
        }
        let _one = r.lock.lock().await;
        if r.generation.load(Ordering::Acquire) != generation {
            return true;
        }
        let mut ac = self.client.auth_client();
        // etcd checks a token that comes with the request before the password: send none.
        ac.remove_client_auth();
        let (user, password) = (r.auth.user.clone(), r.auth.password.clone());
        match ac.set_client_auth(user, password).await {
            Ok(()) => {
                r.generation.fetch_add(1, Ordering::Release);
                log::info!("etcd: authenticated again as {:?}", r.auth.user);
                true
            }
            Err(e) => {
                log::warn!("etcd: authenticating again as {:?}: {e}", r.auth.user);
                false
            }
        }
    }
}

/// Whether etcd's answer `m` says the request's token is no longer taken: unknown (its TTL
/// ran out, etcd restarted), from before a change of users or roles, or missing (sent while
/// another task was authenticating again, or after that failed).
fn token_refused(m: &str) -> bool {
    m.contains("invalid auth token")
        || m.contains("revision of auth store is old")
        || m.contains("user name is empty")
}

/// The message etcd answered with, if `e` is a gRPC status.
fn grpc_message(e: &etcd_client::Error) -> Option<&str> {
    match e {
        etcd_client::Error::GRpcStatus(s) => Some(s.message()),
        _ => None,
    }
}

/// `e` and the errors beneath it, "a: b: c".
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let m = s.to_string();
        if !out.contains(&m) {
            out.push_str(": ");
            out.push_str(&m);
        }
        cur = s.source();
    }
    out
}

/// A failed request as the error that says what to change: etcd turning away a missing or
/// refused user is [`DiscoveryError::Auth`], the rest [`DiscoveryError::Etcd`].
fn request_err(
    endpoints: &str,
    auth: Option<&EtcdAuth>,
    op: &'static str,
    e: etcd_client::Error,
) -> DiscoveryError {
    let auth_err = |message: String| DiscoveryError::Auth {
        endpoints: endpoints.to_string(),
        message,
    };
    match grpc_message(&e) {
        Some(m) if m.contains("user name is empty") && auth.is_none() => auth_err(format!(
            "{op}: etcd has authentication on and this handle gives no user: give a user and \
             its password ({m})"
        )),
        Some(m) if m.contains("authentication failed") => auth_err(format!(
            "user {:?} was refused: wrong user name or password ({m})",
            auth.map_or("", |a| &a.user)
        )),
        Some(m) if token_refused(m) => auth_err(format!(
            "{op}: etcd no longer accepts this handle's token and authenticating again failed \
             ({m})"
        )),
        Some(m) if m.contains("permission denied") => DiscoveryError::Etcd {
            op,
            message: format!(
                "{m}: the role of user {:?} must read and write the keys under the prefix",
                auth.map_or("", |a| &a.user)
            ),
        },
        _ => DiscoveryError::Etcd {
            op,
            message: chain(&e),
        },
    }
}

/// What went wrong, without the wrappers: etcd's answer, or why the connection failed.
fn describe(e: &etcd_client::Error) -> String {
    match e {
        etcd_client::Error::GRpcStatus(s) => match std::error::Error::source(s) {
            Some(cause) => {
                let beneath = chain(cause);
                if beneath.contains(s.message()) {
                    beneath
                } else {
                    format!("{}: {beneath}", s.message())
                }
            }
            None => s.message().to_string(),
        },
        etcd_client::Error::TransportError(t) => chain(t),
        other => other.to_string(),
    }
}

/// Why connecting failed, as the error that says what to change.
fn connect_err(
    endpoints: &str,
    opts: &DiscoveryOptions,
    before_dialing: bool,
    e: etcd_client::Error,
) -> DiscoveryError {
    let text = describe(&e);
    let config = |message: String| DiscoveryError::Config {
        endpoints: endpoints.to_string(),
        message,
    };
    let etcd_client::Error::GRpcStatus(s) = &e else {
        return if before_dialing {
            config(text)
        } else {
            DiscoveryError::Etcd {
                op: "connect",
                message: text,
            }
        };
    };
    if std::error::Error::source(s).is_none() {
        // etcd answered: a refused user, say.
        return request_err(endpoints, opts.auth.as_ref(), "connect", e);
    }
    // The connection failed.
    let failed = |message: String| DiscoveryError::Connect {
        endpoints: endpoints.to_string(),
        message,
    };
    if text.contains("tcp connect error") {
        return DiscoveryError::Unreachable {
            endpoints: endpoints.to_string(),
            timeout: opts.connect_timeout,
        };
    }
    if text.contains("certificate") || text.contains("Certificate") {
        return failed(format!(
            "TLS: {text} (is ca_file the CA that signed etcd's certificate, and does that name \
             the host dialed?)"
        ));
    }
    failed(match &opts.tls {
        None => format!(
            "the connection failed ({text}): if etcd serves TLS there, give the CA of its \
             certificate (ca_file)"
        ),
        Some(t) if t.cert_file.is_none() => format!(
            "the connection failed ({text}): if etcd asks clients for a certificate \
             (--client-cert-auth), give cert_file and key_file"
        ),
        Some(_) => format!("the connection failed ({text})"),
    })
}

impl Discovery {
    /// Connect to etcd at `endpoints` (`host:port`, or URLs) with default options; keys live
    /// under `prefix` (a trailing `/` is ignored).
    pub fn connect<E: AsRef<str>>(endpoints: &[E], prefix: &str) -> Result<Self, DiscoveryError> {
        Self::connect_with(endpoints, prefix, DiscoveryOptions::default())
    }

    /// [`Self::connect`] with explicit timeouts and lease TTL. Fails with
    /// [`DiscoveryError::Unreachable`] when etcd does not answer within
    /// `opts.connect_timeout`.
    pub fn connect_with<E: AsRef<str>>(
        endpoints: &[E],
        prefix: &str,
        opts: DiscoveryOptions,
    ) -> Result<Self, DiscoveryError> {
        let endpoints: Vec<String> = endpoints.iter().map(|e| e.as_ref().to_string()).collect();
        let joined = endpoints.join(",");
        let config = |message: String| DiscoveryError::Config {
            endpoints: joined.clone(),
            message,
        };
        let mut co = ConnectOptions::new()
            .with_connect_timeout(opts.connect_timeout)
            .with_timeout(opts.request_timeout);
        if let Some(a) = &opts.auth {
            if a.user.is_empty() {
                return Err(config("the etcd user name is empty".into()));
            }
            co = co.with_user(a.user.clone(), a.password.clone());
        }
        if let Some(tls) = &opts.tls {
            if let Some(e) = endpoints.iter().find(|e| e.starts_with("http://")) {
                return Err(config(format!(
                    "TLS is configured but endpoint {e} is http://: give host:port or an \
                     https:// URL"
                )));
            }
            co = co.with_tls(tls.options(&joined)?);
        } else if let Some(e) = endpoints.iter().find(|e| e.starts_with("https://")) {
            return Err(config(format!(
                "endpoint {e} is https:// but no TLS is configured: give the CA of etcd's \
                 certificates (ca_file)"
            )));
        }
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("morio-etcd".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = handle_tx.send(Err(e));
                        return;
                    }
                };
                let _ = handle_tx.send(Ok(rt.handle().clone()));
                // Drive the client's tasks until the handle goes.
                let _ = rt.block_on(stop_rx);
            })?;
        let rt = match handle_rx.recv() {
            Ok(Ok(h)) => h,
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => return Err(std::io::Error::other("runtime thread ended").into()),
        };
        let prefix = prefix.trim_end_matches('/').to_string();
        let probe = format!("{prefix}/engines/");
        let anonymous = opts.auth.is_none();
        let connected = rt.block_on(async {
            let fut = async {
                // Building the channel (TLS settings, URLs) fails before dialing; with a
                // user, so does authenticating (a wrong password).
                let mut c = Client::connect(&endpoints, Some(co)).await.map_err(|e| {
                    let before_dialing = !matches!(e, etcd_client::Error::GRpcStatus(_));
                    (e, before_dialing)
                })?;
                // The channel may connect lazily: one request proves etcd answers.
                c.status().await.map_err(|e| (e, false))?;
                // Without a user, one read says whether etcd wants one (its status does not).
                if anonymous {
                    let o = GetOptions::new().with_prefix().with_count_only();
                    c.get(probe, Some(o)).await.map_err(|e| (e, false))?;
                }
                Ok::<_, (etcd_client::Error, bool)>(c)
            };
            tokio::time::timeout(opts.connect_timeout, fut).await
        });
        let client = match connected {
            Ok(Ok(c)) => c,
            failed => {
                let _ = stop_tx.send(());
                let _ = thread.join();
                return Err(match failed {
                    Ok(Err((e, before_dialing))) => connect_err(&joined, &opts, before_dialing, e),
                    _ => DiscoveryError::Unreachable {
                        endpoints: joined,
                        timeout: opts.connect_timeout,
                    },
                });
            }
        };
        Ok(Self {
            conn: Conn::new(client, opts.auth.clone()),
            endpoints: joined,
            prefix,
            opts,
            rt,
            shared: Arc::default(),
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    fn engine_key(&self, key: &str) -> String {
        format!("{}/engines/{key}", self.prefix)
    }

    fn regions_prefix(&self, key: &str) -> String {
        format!("{}/regions/{key}/", self.prefix)
    }

    /// Run the future `f` makes of a client on the handle's runtime, bounded by the request
    /// timeout (once more after authenticating again if etcd no longer knows the token).
    fn run<T, F, Fut>(&self, op: &'static str, f: F) -> Result<T, DiscoveryError>
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let t = self.opts.request_timeout;
        match self
            .rt
            .block_on(async { tokio::time::timeout(t, self.conn.call(f)).await })
        {
            Ok(r) => r.map_err(|e| request_err(&self.endpoints, self.opts.auth.as_ref(), op, e)),
            Err(_) => Err(DiscoveryError::Etcd {
                op,
                message: format!("no answer within {t:?}"),
            }),
        }
    }

    /// The handle's lease, granted (and kept alive on the background runtime) on first use.
    fn lease(&self) -> Result<i64, DiscoveryError> {
        let mut slot = lock(&self.shared.lease);
        if let Some(id) = *slot {
            return Ok(id);
        }
        let ttl = self.opts.lease_ttl.as_secs().max(1) as i64;
        let id = self
            .run("lease grant", |mut c| async move {
                c.lease_grant(ttl, None).await
            })?
            .id();
        let (keeper, stream) = self.run("lease keep-alive", |mut c| async move {
            c.lease_keep_alive(id).await
        })?;
        let every = Duration::from_millis((ttl as u64 * 1000 / 3).max(200));
        let conn = self.conn.clone();
        let shared = self.shared.clone();
        self.rt
            .spawn(keep_alive(conn, shared, ttl, id, keeper, stream, every));
        *slot = Some(id);
        Ok(id)
    }

    /// Publish `engine`'s descriptor under `{prefix}/engines/{key}` and each named region's
    /// under `{prefix}/regions/{key}/{name}`, on this handle's lease. Publishing again
    /// replaces the values and removes regions no longer named (call it after
    /// `create_backend`, so the descriptor has its port). If the lease is ever lost (etcd
    /// unreachable for longer than its TTL), the handle takes a new one and publishes again.
    pub fn publish(
        &self,
        engine: &IoEngine,
        regions: &[(&str, &MemoryDesc)],
    ) -> Result<(), DiscoveryError> {
        if engine.key().contains('/') {
            return Err(DiscoveryError::EngineKey(engine.key().to_string()));
        }
        if let Some((name, _)) = regions
            .iter()
            .find(|(n, _)| n.is_empty() || n.contains('/'))
        {
            return Err(DiscoveryError::RegionName(name.to_string()));
        }
        let lease = self.lease()?;
        let desc = engine.engine_desc();
        let mut puts = vec![(self.engine_key(&desc.key), desc.pack())];
        let rp = self.regions_prefix(&desc.key);
        puts.extend(
            regions
                .iter()
                .map(|(name, md)| (format!("{rp}{name}"), md.pack())),
        );
        let stale: Vec<String> = lock(&self.shared.published)
            .keys()
            .filter(|k| k.starts_with(&rp) && !puts.iter().any(|(p, _)| p == *k))
            .cloned()
            .collect();
        self.run("put", |mut c| {
            let (p, st) = (puts.clone(), stale.clone());
            async move {
                // Regions first: a watcher that sees the engine finds its regions.
                for (k, v) in p.into_iter().rev() {
                    c.put(k, v, Some(PutOptions::new().with_lease(lease)))
                        .await?;
                }
                for k in st {
                    c.delete(k, None).await?;
                }
                Ok(())
            }
        })?;
        let mut published = lock(&self.shared.published);
        for k in stale {
            published.remove(&k);
        }
        published.extend(puts);
        Ok(())
    }

    /// The descriptor engine `key` published, if it is there.
    pub fn lookup(&self, key: &str) -> Result<Option<EngineDesc>, DiscoveryError> {
        if key.contains('/') {
            return Err(DiscoveryError::EngineKey(key.to_string()));
        }
        let k = self.engine_key(key);
        let r = self.run("get", |mut c| {
            let k = k.clone();
            async move { c.get(k, None).await }
        })?;
        match r.kvs().first() {
            None => Ok(None),
            Some(kv) => EngineDesc::unpack(kv.value())
                .map(Some)
                .map_err(|source| DiscoveryError::Decode { key: k, source }),
        }
    }

    /// The named regions engine `key` published (sorted by name).
    pub fn regions(&self, key: &str) -> Result<Vec<(String, MemoryDesc)>, DiscoveryError> {
        if key.contains('/') {
            return Err(DiscoveryError::EngineKey(key.to_string()));
        }
        let p = self.regions_prefix(key);
        let r = self.run("get", |mut c| {
            let p = p.clone();
            async move { c.get(p, Some(GetOptions::new().with_prefix())).await }
        })?;
        let mut out = Vec::new();
        for kv in r.kvs() {
            let k = String::from_utf8_lossy(kv.key()).into_owned();
            let name = &k[p.len().min(k.len())..];
            if name.is_empty() || name.contains('/') {
                continue; // another engine's, whose key extends this one's with '/'
            }
            let md = MemoryDesc::unpack(kv.value()).map_err(|source| DiscoveryError::Decode {
                key: k.clone(),
                source,
            })?;
            out.push((name.to_string(), md));
        }
        Ok(out)
    }

    /// Keep `engine`'s peers in step with `{prefix}/engines/`: every engine there now or later
    /// (but `engine` itself) is registered, registered again when its descriptor changes (a
    /// restarted peer), and deregistered when its key is deleted or its lease expires (its
    /// transfers then fail). Returns once the engines there now are registered; the watch
    /// runs in the background until this handle or the engine goes.
    pub fn watch(&self, engine: &IoEngine) -> Result<(), DiscoveryError> {
        let own = engine.key().to_string();
        let core = engine.weak_core();
        let dir = format!("{}/engines/", self.prefix);
        let mut known: HashMap<String, EngineDesc> = HashMap::new();
        let (watcher, stream) = self.snapshot_and_watch(&dir, &own, &core, &mut known)?;
        let conn = self.conn.clone();
        let timeout = self.opts.request_timeout;
        self.rt.spawn(watch_loop(
            conn, dir, own, core, known, watcher, stream, timeout,
        ));
        Ok(())
    }

    fn snapshot_and_watch(
        &self,
        dir: &str,
        own: &str,
        core: &Weak<Core>,
        known: &mut HashMap<String, EngineDesc>,
    ) -> Result<(Watcher, WatchStream), DiscoveryError> {
        let conn = &self.conn;
        let mut c = conn.client.clone();
        let t = self.opts.request_timeout;
        let generation = conn.generation();
        match self.rt.block_on(async move {
            tokio::time::timeout(t, async {
                match resync(&mut c, dir, own, core, known).await {
                    Err(e) if conn.renew(&e, generation).await => {
                        resync(&mut c, dir, own, core, known).await
                    }
                    r => r,
                }
            })
            .await
        }) {
            Ok(r) => {
                r.map_err(|e| request_err(&self.endpoints, self.opts.auth.as_ref(), "watch", e))
            }
            Err(_) => Err(DiscoveryError::Etcd {
                op: "watch",
                message: format!("no answer within {t:?}"),
            }),
        }
    }

    /// Revoke the lease (every key this handle published goes at once) and stop the
    /// background runtime. Dropping the handle does the same, ignoring errors.
    pub fn close(mut self) -> Result<(), DiscoveryError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), DiscoveryError> {
        let lease = {
            let mut slot = lock(&self.shared.lease);
            self.shared.closing.store(true, Ordering::Relaxed);
            slot.take()
        };
        let mut r = Ok(());
        if let Some(id) = lease {
            r = self
                .run(
                    "lease revoke",
                    |mut c| async move { c.lease_revoke(id).await },
                )
                .map(|_| ());
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        r
    }
}

impl Drop for Discovery {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            log::warn!("discovery: {e}");
        }
    }
}

/// Refresh lease `id` every `every` until the handle closes. A broken keep-alive stream (a
/// lost connection, an etcd restart) is opened again; a lease that expired anyway is replaced
/// by a new one with every published key put again.
async fn keep_alive(
    conn: Conn,
    shared: Arc<Shared>,
    ttl: i64,
    mut id: i64,
    mut keeper: LeaseKeeper,
    mut stream: LeaseKeepAliveStream,
    every: Duration,
) {
    loop {
        let answer = match keeper.keep_alive().await {
            Ok(()) => stream.message().await,
            Err(e) => Err(e),
        };
        match answer {
            Ok(Some(r)) if r.ttl() > 0 => tokio::time::sleep(every).await,
            Ok(Some(_)) => {
                if shared.closing.load(Ordering::Relaxed) {
                    return;
                }
                log::warn!("etcd lease {id:x} expired: publishing again on a new lease");
                loop {
                    let generation = conn.generation();
                    match regrant(&mut conn.client.clone(), &shared, ttl).await {
                        Ok(Some((nid, k, s))) => {
                            (id, keeper, stream) = (nid, k, s);
                            break;
                        }
                        Ok(None) => return, // closing
                        Err(e) => {
                            log::warn!("etcd: a new lease: {e}; retrying");
                            if !conn.renew(&e, generation).await {
                                tokio::time::sleep(every).await;
                            }
                        }
                    }
                }
            }
            Ok(None) | Err(_) => {
                if shared.closing.load(Ordering::Relaxed) {
                    return;
                }
                log::warn!("etcd lease {id:x}: keep-alive stream lost; reopening");
                tokio::time::sleep(every).await;
                let reopened = conn
                    .call(|mut c| async move { c.lease_keep_alive(id).await })
                    .await;
                match reopened {
                    Ok((k, s)) => (keeper, stream) = (k, s),
                    Err(e) => log::warn!("etcd lease {id:x}: {e}"),
                }
            }
        }
    }
}

type Kept = (i64, LeaseKeeper, LeaseKeepAliveStream);

/// A new lease with every published key put again on it (`None`: the handle is closing).
async fn regrant(
    c: &mut Client,
    shared: &Shared,
    ttl: i64,
) -> Result<Option<Kept>, etcd_client::Error> {
    let id = c.lease_grant(ttl, None).await?.id();
    let puts: Vec<(String, Vec<u8>)> = lock(&shared.published)
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    // Regions before engines: a watcher that sees an engine finds its regions.
    let (engines, regions): (Vec<_>, Vec<_>) =
        puts.into_iter().partition(|(k, _)| k.contains("/engines/"));
    for (k, v) in regions.into_iter().chain(engines) {
        c.put(k, v, Some(PutOptions::new().with_lease(id))).await?;
    }
    let (keeper, stream) = c.lease_keep_alive(id).await?;
    {
        let mut slot = lock(&shared.lease);
        if !shared.closing.load(Ordering::Relaxed) {
            *slot = Some(id);
            return Ok(Some((id, keeper, stream)));
        }
    }
    c.lease_revoke(id).await?;
    Ok(None)
}

/// Register every engine under `dir` (but `own`), forget those in `known` that are gone, and
/// open a watch from the revision after the snapshot.
async fn resync(
    c: &mut Client,
    dir: &str,
    own: &str,
    core: &Weak<Core>,
    known: &mut HashMap<String, EngineDesc>,
) -> Result<(Watcher, WatchStream), etcd_client::Error> {
    let r = c.get(dir, Some(GetOptions::new().with_prefix())).await?;
    let rev = r.header().map_or(0, |h| h.revision());
    let mut seen = HashMap::new();
    for kv in r.kvs() {
        if let Some(desc) = decode(kv.key(), kv.value(), dir, own) {
            seen.insert(desc.key.clone(), desc);
        }
    }
    if let Some(core) = core.upgrade() {
        for (k, d) in known.iter() {
            if !seen.contains_key(k) {
                deregister(&core, d);
            }
        }
        for d in seen.values() {
            if known.get(&d.key) != Some(d) {
                apply_put(&core, d);
            }
        }
    }
    *known = seen;
    // The watcher (the request side of the stream) lives as long as the stream is read.
    c.watch(
        dir,
        Some(
            WatchOptions::new()
                .with_prefix()
                .with_start_revision(rev + 1),
        ),
    )
    .await
}

fn decode(key: &[u8], value: &[u8], dir: &str, own: &str) -> Option<EngineDesc> {
    let k = String::from_utf8_lossy(key);
    let name = k.strip_prefix(dir)?;
    if name == own {
        return None;
    }
    match EngineDesc::unpack(value) {
        Ok(d) if d.key == name => Some(d),
        Ok(d) => {
            log::warn!(
                "etcd key {k} holds the descriptor of engine {:?}; ignored",
                d.key
            );
            None
        }
        Err(e) => {
            log::warn!("etcd key {k}: {e}; ignored");
            None
        }
    }
}

fn apply_put(core: &Core, d: &EngineDesc) {
    match register(core, d) {
        Ok(()) => log::info!("discovery: engine {} at {}:{}", d.key, d.host, d.port),
        Err(e) => log::warn!("discovery: engine {}: {e}", d.key),
    }
}

#[allow(clippy::too_many_arguments)]
async fn watch_loop(
    conn: Conn,
    dir: String,
    own: String,
    core: Weak<Core>,
    mut known: HashMap<String, EngineDesc>,
    mut _watcher: Watcher,
    mut stream: WatchStream,
    timeout: Duration,
) {
    loop {
        match stream.message().await {
            Ok(Some(resp)) if !resp.canceled() => {
                let Some(core) = core.upgrade() else { return };
                for ev in resp.events() {
                    let Some(kv) = ev.kv() else { continue };
                    match ev.event_type() {
                        EventType::Put => {
                            if let Some(d) = decode(kv.key(), kv.value(), &dir, &own) {
                                if known.get(&d.key) != Some(&d) {
                                    apply_put(&core, &d);
                                    known.insert(d.key.clone(), d);
                                }
                            }
                        }
                        EventType::Delete => {
                            let k = String::from_utf8_lossy(kv.key());
                            if let Some(name) = k.strip_prefix(dir.as_str()) {
                                if let Some(d) = known.remove(name) {
                                    log::info!("discovery: engine {name} went away");
                                    deregister(&core, &d);
                                }
                            }
                        }
                    }
                }
            }
            other => {
                if core.strong_count() == 0 {
                    return;
                }
                if let Err(e) = other {
                    log::warn!("discovery: watch on {dir}: {e}; resyncing");
                }
                // The stream ended (etcd restarted, compaction, a lost connection): take a new
                // snapshot and watch from there, retrying until etcd answers.
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    if core.strong_count() == 0 {
                        return;
                    }
                    let mut c = conn.client.clone();
                    let generation = conn.generation();
                    let r = tokio::time::timeout(
                        timeout,
                        resync(&mut c, &dir, &own, &core, &mut known),
                    )
                    .await;
                    match r {
                        Ok(Ok((w, s))) => {
                            _watcher = w;
                            stream = s;
                            break;
                        }
                        // etcd forgot the token (a restart): authenticate, then try again.
                        Ok(Err(e)) => {
                            conn.renew(&e, generation).await;
                        }
                        Err(_) => {}
                    }
                }
            }
        }
    }
}
