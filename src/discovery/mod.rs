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

mod conn;
mod options;
mod tasks;

use conn::*;
pub use options::*;
use tasks::*;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions, PutOptions, WatchStream, Watcher};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

use crate::desc::{EngineDesc, MemoryDesc};
use crate::engine::IoEngine;
use crate::submit::Core;

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
        let connect = self.connect_peers();
        self.rt.spawn(watch_loop(
            conn, dir, own, core, known, watcher, stream, timeout, connect,
        ));
        Ok(())
    }

    /// How long to wait for a registered peer's connections, when they are opened at all
    /// ([`DiscoveryOptions::connect_peers`]).
    fn connect_peers(&self) -> Option<Duration> {
        self.opts
            .connect_peers
            .then(|| self.opts.request_timeout.max(Duration::from_secs(10)))
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
        let connect = self.connect_peers();
        let generation = conn.generation();
        match self.rt.block_on(async move {
            tokio::time::timeout(t, async {
                match resync(&mut c, dir, own, core, known, connect).await {
                    Err(e) if conn.renew(&e, generation).await => {
                        resync(&mut c, dir, own, core, known, connect).await
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
