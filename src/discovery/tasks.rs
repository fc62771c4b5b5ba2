//! Discovery's background tasks: the lease kept alive (and granted again), the watch that
//! turns peers' puts and deletes into registrations.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use etcd_client::{
    Client, EventType, GetOptions, LeaseKeepAliveStream, LeaseKeeper, PutOptions, WatchOptions,
    WatchStream, Watcher,
};

use crate::desc::EngineDesc;
use crate::engine::remote::{deregister, register};
use crate::submit::Core;

use super::conn::{lock, Conn, Shared};

/// Refresh lease `id` every `every` until the handle closes. A broken keep-alive stream (a
/// lost connection, an etcd restart) is opened again; a lease that expired anyway is replaced
/// by a new one with every published key put again.
pub(super) async fn keep_alive(
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
pub(super) async fn regrant(
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
pub(super) async fn resync(
    c: &mut Client,
    dir: &str,
    own: &str,
    core: &Weak<Core>,
    known: &mut HashMap<String, EngineDesc>,
    connect: Option<Duration>,
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
                apply_put(&core, d, connect);
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

pub(super) fn decode(key: &[u8], value: &[u8], dir: &str, own: &str) -> Option<EngineDesc> {
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

/// Register `d`; with `connect` (a timeout), open its connections in the background and log
/// how that went.
pub(super) fn apply_put(core: &Arc<Core>, d: &EngineDesc, connect: Option<Duration>) {
    match register(core, d) {
        Ok(()) => log::info!("discovery: engine {} at {}", d.key, d.address()),
        Err(e) => return log::warn!("discovery: engine {}: {e}", d.key),
    }
    let Some(timeout) = connect else { return };
    let (core, key) = (core.clone(), d.key.clone());
    // It waits for the lanes: on a thread of its own (not the runtime's blocking pool, which
    // closing the handle would wait for), which holds the engine at most `timeout`.
    let spawned = std::thread::Builder::new()
        .name("morio-connect".into())
        .stack_size(128 << 10)
        .spawn(
            move || match crate::engine::connect::connect(&core, &key, timeout) {
                Ok(lanes) => {
                    let same = lanes.iter().filter(|t| t.is_same_host()).count();
                    log::info!(
                        "discovery: engine {key}: {} connections up ({same} same-host)",
                        lanes.len()
                    );
                }
                Err(e) => log::warn!("discovery: {e}"),
            },
        );
    if let Err(e) = spawned {
        log::warn!("discovery: engine {}: no thread to connect it: {e}", d.key);
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn watch_loop(
    conn: Conn,
    dir: String,
    own: String,
    core: Weak<Core>,
    mut known: HashMap<String, EngineDesc>,
    mut _watcher: Watcher,
    mut stream: WatchStream,
    timeout: Duration,
    connect: Option<Duration>,
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
                                    apply_put(&core, &d, connect);
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
                        resync(&mut c, &dir, &own, &core, &mut known, connect),
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
