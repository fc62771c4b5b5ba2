//! The TCP backend's lifecycle on an engine: create it (listener, placement, shards, every
//! registered region), remove it, and ask its shards (shard count and CPUs, statistics,
//! registry changes broadcast to every shard).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::AtomicU64;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use morio_shards::{PoolConfig, ShardPool};

use crate::config::{ConfigError, IoEngineConfig, TcpBackendConfig};
use crate::desc::BackendType;
use crate::error::EngineError;
use crate::inbound_status::{InboundStatuses, StatusCaps};
use crate::placement;
use crate::proto::join::JoinCaps;
use crate::region::SharedRegion;
use crate::service::{self, ShardMsg, Shared};
use crate::stats::{EngineStats, ShardStats};
use crate::submit::{lock, read_lock, write_lock, Backend, Core};
use crate::transport::Kind;

use super::IoEngine;

impl IoEngine {
    /// Create the TCP backend: bind the listener (port 0 picks an ephemeral port, which the
    /// engine descriptor then carries), place and start the shards (pinned or not, see
    /// [`crate::placement`]) and give them every registered memory region. A second call
    /// while a backend exists is ignored with a warning, as in MORI-IO; after
    /// [`Self::remove_backend`] it creates a new one. On error nothing is left running.
    pub fn create_backend(&self, cfg: TcpBackendConfig) -> Result<(), EngineError> {
        self.create_backend_over(cfg, Kind::Tcp)
    }

    /// [`Self::create_backend`] over in-process pipes instead of TCP: the engine binds a port
    /// in the process's own table and reaches only engines of this process that did the
    /// same. For tests of the engine without sockets.
    #[cfg(any(test, feature = "testing"))]
    #[doc(hidden)]
    pub fn create_backend_in_process(&self, cfg: TcpBackendConfig) -> Result<(), EngineError> {
        self.create_backend_over(cfg, Kind::InProcess)
    }

    fn create_backend_over(
        &self,
        mut cfg: TcpBackendConfig,
        kind: Kind,
    ) -> Result<(), EngineError> {
        if cfg.auth_secret.is_none() {
            cfg.auth_secret = crate::config::AuthSecret::from_env();
        }
        if cfg.same_host.is_none() {
            cfg.same_host = Some(crate::config::SameHost::from_env()?.unwrap_or_default());
        }
        if cfg.gpu_ipc.is_none() {
            cfg.gpu_ipc = Some(crate::config::gpu_ipc_from_env()?.unwrap_or(true));
        }
        if cfg.busy_poll.is_none() {
            cfg.busy_poll = crate::config::busy_poll_from_env()?;
        }
        cfg.validate()?;
        // Connections take descriptors (a same-host one four or five): make room up front.
        crate::host::grow_fd_table(4096);
        let core = &self.core;
        let _life = lock(&core.lifecycle);
        let mut slot = write_lock(&core.backend);
        if slot.is_some() {
            log::warn!(
                "TCP backend already created for engine {}; ignoring",
                core.key
            );
            return Ok(());
        }
        let (listener, port) = listen(&core.cfg, &cfg, kind)?;
        let placed = placement::place_shards(&cfg)?;
        let n_shards = placed.cpus.len();
        cfg.check_staging(n_shards)?;
        let inbound = Arc::new(InboundStatuses::new(
            (cfg.op_timeout * 4).max(Duration::from_secs(60)),
            StatusCaps {
                per_peer: cfg.max_inbound_statuses_per_peer,
                total: cfg.max_inbound_statuses,
            },
        ));
        let shared = Arc::new(Shared {
            key: core.key.clone(),
            instance: rand::random(),
            cfg: cfg.clone(),
            transport: kind,
            inbound: inbound.clone(),
            listener: Mutex::new(Some(listener)),
            low_water: (0..n_shards).map(|_| AtomicU64::new(0)).collect(),
            joins: service::Joins::new(JoinCaps {
                per_peer: cfg.max_joins_per_peer,
                total: cfg.max_joins,
            }),
            placing: service::Placing::new(n_shards),
            admission: Arc::new(service::admission_for(&cfg)),
            same_host_failed: Mutex::new(Default::default()),
        });
        let mut pool_cfg = PoolConfig::unpinned(0, "morio-shard");
        pool_cfg.cpus = placed.cpus.clone();
        pool_cfg.spin_before_park = cfg.spin_before_park;
        pool_cfg.busy_window = crate::config::busy_window(
            cfg.busy_poll,
            std::thread::available_parallelism().map_or(1, |n| n.get()),
        );
        let sh = shared.clone();
        let pool = ShardPool::start(pool_cfg, move |ctx| service::run(ctx, sh.clone()))?;
        let backend = Arc::new(Backend::new(pool, shared, placed.cpus, placed.claims));
        let regions: Vec<SharedRegion> = read_lock(&core.regions).values().cloned().collect();
        for r in regions {
            if let Err(e) = broadcast(&backend, |ack| ShardMsg::AddRegion(r.clone(), ack)) {
                backend.stop();
                return Err(e);
            }
        }
        lock(&core.desc).port = port;
        *lock(&core.inbound) = Some(inbound);
        *slot = Some(backend);
        log::info!("engine {} listening on port {port}", core.key);
        Ok(())
    }

    /// MORI-IO's `RemoveBackend`. For [`BackendType::Tcp`]: take the backend out of the
    /// engine and stop it. Transfers in flight end with `ERR_BAD_STATE` (so do submissions
    /// racing the removal), its shard threads are joined, its connections and listening
    /// socket closed, its CPU claims released, and its inbound-status store is dropped with it
    /// (as in MORI-IO: statuses not yet popped are gone). Returns once all of that is done.
    ///
    /// Afterwards transfers fail at once with `ERR_BAD_STATE` ("No available backend found,
    /// create backend first"), [`Self::create_session`] returns `None`, [`Self::n_shards`] is
    /// 0 and [`Self::engine_desc`] carries the configured port again; registered memory and
    /// remote engines stay registered, and [`Self::create_backend`] makes a new backend (a new
    /// listener: with port 0 a new ephemeral port, so peers need the new descriptor) that
    /// gets every registered region. Sessions made before stay valid and work again once a
    /// backend exists.
    ///
    /// Removing a backend that does not exist, or a type morio does not implement (RDMA,
    /// XGMI, FABRIC, Unknown), does nothing and is `Ok`, as MORI-IO erases a map entry. Safe
    /// to call while other threads submit transfers, wait on statuses or use sessions.
    pub fn remove_backend(&self, ty: BackendType) -> Result<(), EngineError> {
        if ty == BackendType::Tcp {
            stop(&self.core);
        }
        Ok(())
    }

    /// Number of shards the backend runs (0 without a backend).
    pub fn n_shards(&self) -> usize {
        self.core.backend().map_or(0, |b| b.n_shards())
    }

    /// Every shard's statistics (counters and latency histograms), collected by message;
    /// `None` without a backend.
    pub fn stats(&self) -> Option<EngineStats> {
        let b = self.core.backend()?;
        let (tx, rx) = mpsc::channel();
        let n = b.n_shards();
        for s in 0..n {
            b.mesh.send(s, ShardMsg::Stats(tx.clone())).ok()?;
        }
        // Only the shards hold senders now: a backend stopping meanwhile ends the wait.
        drop(tx);
        let mut shards: Vec<ShardStats> = (0..n)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).ok())
            .collect::<Option<_>>()?;
        shards.sort_by_key(|s| s.shard);
        Some(EngineStats { shards })
    }

    /// The CPU each shard actually runs pinned to (`None` entries when unpinned: by default,
    /// or when every allowed CPU was claimed by another engine); empty without a backend.
    pub fn shard_cpus(&self) -> Vec<Option<usize>> {
        self.core
            .backend()
            .map_or_else(Vec::new, |b| b.cpus.clone())
    }
}

/// Take the backend out of the engine and stop it (`remove_backend` and drop). New calls
/// find no backend from the moment it is taken out; calls that already hold it fail their
/// messages once its inboxes close, and nothing here waits for them.
pub(super) fn stop(core: &Core) {
    let _life = lock(&core.lifecycle);
    let Some(b) = write_lock(&core.backend).take() else {
        return;
    };
    // MORI-IO drops the inbound statuses with the backend.
    *lock(&core.inbound) = None;
    lock(&core.desc).port = core.cfg.port;
    b.stop();
    log::info!("engine {}: TCP backend removed", core.key);
}

/// Send a registry change to every shard and wait until each has applied it.
pub(super) fn broadcast(
    b: &Backend,
    msg: impl Fn(mpsc::Sender<()>) -> ShardMsg,
) -> Result<(), EngineError> {
    let (tx, rx) = mpsc::channel();
    let n = b.n_shards();
    for s in 0..n {
        b.mesh
            .send(s, msg(tx.clone()))
            .map_err(|_| EngineError::ShuttingDown)?;
    }
    // Only the messages hold senders now: one dropped unanswered (the backend stopping)
    // ends the wait at once.
    drop(tx);
    for _ in 0..n {
        rx.recv_timeout(Duration::from_secs(30))
            .map_err(|e| match e {
                mpsc::RecvTimeoutError::Disconnected => EngineError::ShuttingDown,
                mpsc::RecvTimeoutError::Timeout => {
                    EngineError::Busy("a shard did not acknowledge a registry change".into())
                }
            })?;
    }
    Ok(())
}

/// Bind where the engine accepts connections (the transport's listener, with the backend's
/// socket buffers); what was bound and the port it got.
fn listen(
    ecfg: &IoEngineConfig,
    cfg: &TcpBackendConfig,
    kind: Kind,
) -> Result<(crate::transport::Bound, u16), EngineError> {
    let ip: IpAddr = if ecfg.host.is_empty() {
        IpAddr::from([0, 0, 0, 0])
    } else {
        crate::desc::parse_ip(&ecfg.host).ok_or_else(|| ConfigError::Host(ecfg.host.clone()))?
    };
    let addr = SocketAddr::new(ip, ecfg.port);
    let bind_err = |source| EngineError::Bind {
        addr: addr.to_string(),
        source,
    };
    let (bound, local) = crate::transport::bind(addr, cfg, kind).map_err(bind_err)?;
    Ok((bound, local.port()))
}
