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
//! The etcd client runs on a small tokio runtime on one background thread owned by the
//! handle, never on an engine's shards; the calls here block the calling thread until etcd
//! answers or the handle's timeout passes (so call them, and drop the handle, outside any
//! tokio runtime of your own).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use etcd_client::{
    Client, ConnectOptions, EventType, GetOptions, LeaseKeepAliveStream, LeaseKeeper, PutOptions,
    WatchOptions, WatchStream, Watcher,
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
    /// The background runtime could not start.
    #[error("discovery runtime: {0}")]
    Runtime(#[from] std::io::Error),
}

/// Timeouts and the lease TTL of a [`Discovery`] handle.
#[derive(Clone, Debug)]
pub struct DiscoveryOptions {
    /// Lease TTL of the published keys: how long a peer that died stays visible (etcd's
    /// minimum is its own, usually a few seconds; whole seconds).
    pub lease_ttl: Duration,
    /// Bound on reaching etcd in [`Discovery::connect_with`].
    pub connect_timeout: Duration,
    /// Bound on every later request.
    pub request_timeout: Duration,
}

impl Default for DiscoveryOptions {
    fn default() -> Self {
        Self {
            lease_ttl: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
        }
    }
}

/// A connection to etcd that publishes engines and watches peers (see the module docs).
pub struct Discovery {
    client: Client,
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

fn etcd_err(op: &'static str) -> impl FnOnce(etcd_client::Error) -> DiscoveryError {
    move |e| DiscoveryError::Etcd {
        op,
        message: e.to_string(),
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
        let unreachable = || DiscoveryError::Unreachable {
            endpoints: endpoints.join(","),
            timeout: opts.connect_timeout,
        };
        let co = ConnectOptions::new()
            .with_connect_timeout(opts.connect_timeout)
            .with_timeout(opts.request_timeout);
        let connected = rt.block_on(async {
            let fut = async {
                let mut c = Client::connect(&endpoints, Some(co)).await?;
                // The channel may connect lazily: one request proves etcd answers.
                c.status().await?;
                Ok::<_, etcd_client::Error>(c)
            };
            tokio::time::timeout(opts.connect_timeout, fut).await
        });
        let client = match connected {
            Ok(Ok(c)) => c,
            _ => {
                let _ = stop_tx.send(());
                let _ = thread.join();
                return Err(unreachable());
            }
        };
        Ok(Self {
            client,
            prefix: prefix.trim_end_matches('/').to_string(),
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

    /// Run `fut` on the handle's runtime, bounded by the request timeout.
    fn run<T>(
        &self,
        op: &'static str,
        fut: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, DiscoveryError> {
        let t = self.opts.request_timeout;
        match self
            .rt
            .block_on(async { tokio::time::timeout(t, fut).await })
        {
            Ok(r) => r.map_err(etcd_err(op)),
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
        let mut c = self.client.clone();
        let id = self
            .run("lease grant", async move { c.lease_grant(ttl, None).await })?
            .id();
        let mut c = self.client.clone();
        let (keeper, stream) =
            self.run(
                "lease keep-alive",
                async move { c.lease_keep_alive(id).await },
            )?;
        let every = Duration::from_millis((ttl as u64 * 1000 / 3).max(200));
        let client = self.client.clone();
        let shared = self.shared.clone();
        self.rt
            .spawn(keep_alive(client, shared, ttl, id, keeper, stream, every));
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
        let mut c = self.client.clone();
        let (p, st) = (puts.clone(), stale.clone());
        self.run("put", async move {
            // Regions first: a watcher that sees the engine finds its regions.
            for (k, v) in p.into_iter().rev() {
                c.put(k, v, Some(PutOptions::new().with_lease(lease)))
                    .await?;
            }
            for k in st {
                c.delete(k, None).await?;
            }
            Ok(())
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
        let mut c = self.client.clone();
        let kk = k.clone();
        let r = self.run("get", async move { c.get(kk, None).await })?;
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
        let mut c = self.client.clone();
        let pp = p.clone();
        let r = self.run("get", async move {
            c.get(pp, Some(GetOptions::new().with_prefix())).await
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
        let client = self.client.clone();
        let timeout = self.opts.request_timeout;
        self.rt.spawn(watch_loop(
            client, dir, own, core, known, watcher, stream, timeout,
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
        let mut c = self.client.clone();
        let d = dir.to_string();
        let t = self.opts.request_timeout;
        match self.rt.block_on(async move {
            tokio::time::timeout(t, resync(&mut c, &d, own, core, known)).await
        }) {
            Ok(r) => r.map_err(etcd_err("watch")),
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
            let mut c = self.client.clone();
            r = self
                .run("lease revoke", async move { c.lease_revoke(id).await })
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
    mut c: Client,
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
                    match regrant(&mut c, &shared, ttl).await {
                        Ok(Some((nid, k, s))) => {
                            (id, keeper, stream) = (nid, k, s);
                            break;
                        }
                        Ok(None) => return, // closing
                        Err(e) => {
                            log::warn!("etcd: a new lease: {e}; retrying");
                            tokio::time::sleep(every).await;
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
                match c.lease_keep_alive(id).await {
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
    mut c: Client,
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
                    let r = tokio::time::timeout(
                        timeout,
                        resync(&mut c, &dir, &own, &core, &mut known),
                    )
                    .await;
                    if let Ok(Ok((w, s))) = r {
                        _watcher = w;
                        stream = s;
                        break;
                    }
                }
            }
        }
    }
}
