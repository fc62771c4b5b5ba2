//! The etcd connection of a discovery handle: requests bounded by its timeouts, a login
//! renewed once when etcd forgot its token, errors that say what to change.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use etcd_client::Client;

use super::options::{DiscoveryError, DiscoveryOptions, EtcdAuth};

/// What the handle and its keep-alive task share.
#[derive(Default)]
pub(super) struct Shared {
    /// The lease the published keys ride on (granted on first publish).
    pub(super) lease: Mutex<Option<i64>>,
    /// Every key published and its value: put again on a new lease if the lease is lost.
    pub(super) published: Mutex<BTreeMap<String, Vec<u8>>>,
    /// Set (under `lease`'s lock) when the handle closes: no new lease then.
    pub(super) closing: AtomicBool,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The etcd client and, with authentication, the user to authenticate as again when etcd no
/// longer takes the client's token (its TTL ran out, or etcd restarted and lost it).
#[derive(Clone)]
pub(super) struct Conn {
    pub(super) client: Client,
    pub(super) auth: Option<Arc<Renewal>>,
}

/// The user of an authenticated handle, and its token's renewals: one at a time, so that the
/// tasks that find the token stale together authenticate once.
pub(super) struct Renewal {
    pub(super) auth: EtcdAuth,
    /// Held while authenticating.
    pub(super) lock: tokio::sync::Mutex<()>,
    /// Renewals so far.
    pub(super) generation: AtomicU64,
}

impl Conn {
    pub(super) fn new(client: Client, auth: Option<EtcdAuth>) -> Self {
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
    pub(super) fn generation(&self) -> u64 {
        self.auth
            .as_ref()
            .map_or(0, |r| r.generation.load(Ordering::Acquire))
    }

    /// `f` on a clone of the client; once more after authenticating again if etcd no longer
    /// takes the token.
    pub(super) async fn call<T, F, Fut>(&self, mut f: F) -> Result<T, etcd_client::Error>
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
    pub(super) async fn renew(&self, e: &etcd_client::Error, generation: u64) -> bool {
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
pub(super) fn token_refused(m: &str) -> bool {
    m.contains("invalid auth token")
        || m.contains("revision of auth store is old")
        || m.contains("user name is empty")
}

/// The message etcd answered with, if `e` is a gRPC status.
pub(super) fn grpc_message(e: &etcd_client::Error) -> Option<&str> {
    match e {
        etcd_client::Error::GRpcStatus(s) => Some(s.message()),
        _ => None,
    }
}

/// `e` and the errors beneath it, "a: b: c".
pub(super) fn chain(e: &dyn std::error::Error) -> String {
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
pub(super) fn request_err(
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
pub(super) fn describe(e: &etcd_client::Error) -> String {
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
pub(super) fn connect_err(
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
    // etcd turned our certificate (or its absence) away: rustls reports the server's alert.
    // Whether it arrives as an alert or as a closed connection depends on timing (with TLS
    // 1.3 the client's handshake ends before the server has checked its certificate).
    if text.contains("received fatal alert") {
        return failed(match &opts.tls {
            Some(t) if t.cert_file.is_none() => format!(
                "TLS: {text}: etcd refused the connection; if it asks clients for a \
                 certificate (--client-cert-auth), give cert_file and key_file"
            ),
            _ => format!(
                "TLS: {text}: etcd refused the client certificate (is cert_file signed by a \
                 CA etcd trusts, --trusted-ca-file?)"
            ),
        });
    }
    // We turned etcd's certificate away.
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
