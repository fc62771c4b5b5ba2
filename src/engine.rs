//! `IoEngine`: MORI-IO's engine object over morio's thread-per-core TCP data plane.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, RwLock};
use std::time::Duration;

use morio_shards::{Mesh, PoolConfig, ShardPool};

use crate::config::{ConfigError, IoEngineConfig, TcpBackendConfig};
use crate::cpu_claim::CpuClaim;
use crate::desc::{BackendType, EngineDesc, MemoryDesc, MemoryLocationType};
use crate::error::EngineError;
use crate::gpu::{self, GpuRuntime};
use crate::inbound_status::InboundStatuses;
use crate::placement;
use crate::proto::frame::Op;
use crate::proto::limits::MAX_KEY_BYTES;
use crate::proto::plan;
use crate::region::{Backing, DeviceMem, Region, SharedRegion};
use crate::service::{self, now_ns, Peer, ShardMsg, Shared, Submission};
use crate::session::IoEngineSession;
use crate::stats::{EngineStats, ShardStats};
use crate::status::{wait_all, StatusCode, TransferStatus};

/// The TCP backend: its shards and what belongs to them. Application threads hold an `Arc`
/// of it for the length of a call; stopping it does not wait for them (their messages fail).
struct Backend {
    /// Every shard's inbox; closed when the backend stops, so late messages fail at once.
    mesh: Mesh<ShardMsg>,
    shared: Arc<Shared>,
    cpus: Vec<Option<usize>>,
    /// The running pool and the backend's CPU claims, until [`Backend::stop`].
    running: Mutex<Option<Running>>,
}

struct Running {
    pool: ShardPool<ShardMsg>,
    /// Released after the pool has stopped: no shard runs on a CPU it no longer claims.
    claims: Vec<CpuClaim>,
}

impl Backend {
    fn n_shards(&self) -> usize {
        self.mesh.n_shards()
    }

    /// Stop the shards (every transfer they own fails with `ERR_BAD_STATE`, their
    /// connections and the listener close), join their threads, then release the CPU claims.
    /// Idempotent; returns once the shards are gone.
    fn stop(&self) {
        let running = lock(&self.running).take();
        if let Some(r) = running {
            let Running { pool, claims } = r;
            pool.shutdown();
            drop(claims);
        }
    }
}

pub(crate) struct Inner {
    key: String,
    cfg: IoEngineConfig,
    desc: Mutex<EngineDesc>,
    /// Serialises `create_backend` and `remove_backend` (and the engine's drop): a backend
    /// created right after a removal finds the old one's listener and claims released.
    lifecycle: Mutex<()>,
    backend: RwLock<Option<Arc<Backend>>>,
    next_mem_id: AtomicU32,
    next_uid: AtomicU64,
    regions: RwLock<HashMap<u32, SharedRegion>>,
    remotes: RwLock<HashMap<String, Arc<Peer>>>,
    inbound: Mutex<Option<Arc<InboundStatuses>>>,
    gpu: Mutex<Option<Arc<dyn GpuRuntime>>>,
}

/// One engine per process endpoint, named by a unique key (MORI-IO's `IOEngine`).
///
/// Create it, add the TCP backend, register memory, exchange [`EngineDesc`] and
/// [`MemoryDesc`] with peers out of band, then read and write their memory. Every transfer
/// call returns at once with a [`TransferStatus`] already `IN_PROGRESS` (or terminal, for
/// argument errors); completion happens on the engine's shards. Dropping the engine (like
/// [`Self::remove_backend`]) fails everything in flight with `ERR_BAD_STATE` and joins every
/// shard thread.
pub struct IoEngine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for IoEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoEngine")
            .field("key", &self.inner.key)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
fn read<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|e| e.into_inner())
}
fn write<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|e| e.into_inner())
}

fn failed(code: StatusCode, msg: &str) -> Arc<TransferStatus> {
    let s = Arc::new(TransferStatus::new());
    s.update(code, msg);
    s
}

impl IoEngine {
    /// A new engine named `key` (1..=1024 bytes) that will listen on `cfg.host:cfg.port`.
    pub fn new(key: &str, cfg: IoEngineConfig) -> Result<Self, EngineError> {
        if key.is_empty() || key.len() > MAX_KEY_BYTES {
            return Err(ConfigError::Key.into());
        }
        if !cfg.host.is_empty() && cfg.host.parse::<IpAddr>().is_err() {
            return Err(ConfigError::Host(cfg.host.clone()).into());
        }
        let desc = EngineDesc::local(key, &cfg.host, cfg.port);
        Ok(Self {
            inner: Arc::new(Inner {
                key: key.to_string(),
                cfg,
                desc: Mutex::new(desc),
                lifecycle: Mutex::new(()),
                backend: RwLock::new(None),
                next_mem_id: AtomicU32::new(0),
                next_uid: AtomicU64::new(0),
                regions: RwLock::new(HashMap::new()),
                remotes: RwLock::new(HashMap::new()),
                inbound: Mutex::new(None),
                gpu: Mutex::new(None),
            }),
        })
    }

    /// This engine's key.
    pub fn key(&self) -> &str {
        &self.inner.key
    }

    /// Create the TCP backend: bind the listener (port 0 picks an ephemeral port, which the
    /// engine descriptor then carries), place and start the shards (pinned or not, see
    /// [`crate::placement`]) and give them every registered memory region. A second call
    /// while a backend exists is ignored with a warning, as in MORI-IO; after
    /// [`Self::remove_backend`] it creates a new one. On error nothing is left running.
    pub fn create_backend(&self, cfg: TcpBackendConfig) -> Result<(), EngineError> {
        cfg.validate()?;
        let _life = lock(&self.inner.lifecycle);
        let mut slot = write(&self.inner.backend);
        if slot.is_some() {
            log::warn!(
                "TCP backend already created for engine {}; ignoring",
                self.inner.key
            );
            return Ok(());
        }
        let (listener, port) = listen(&self.inner.cfg, &cfg)?;
        let placed = placement::place_shards(&cfg)?;
        let n_shards = placed.cpus.len();
        cfg.check_staging(n_shards)?;
        let inbound = Arc::new(InboundStatuses::new(
            (cfg.op_timeout * 4).max(Duration::from_secs(60)),
        ));
        let shared = Arc::new(Shared {
            key: self.inner.key.clone(),
            instance: rand::random(),
            cfg: cfg.clone(),
            inbound: inbound.clone(),
            listener: Mutex::new(Some(listener)),
            low_water: (0..n_shards).map(|_| AtomicU64::new(0)).collect(),
            joins: Default::default(),
        });
        let mut pool_cfg = PoolConfig::unpinned(0, "morio-shard");
        pool_cfg.cpus = placed.cpus.clone();
        pool_cfg.spin_before_park = cfg.spin_before_park;
        let sh = shared.clone();
        let pool = ShardPool::start(pool_cfg, move |ctx| service::run(ctx, sh.clone()))?;
        let backend = Arc::new(Backend {
            mesh: pool.mesh().clone(),
            shared,
            cpus: placed.cpus,
            running: Mutex::new(Some(Running {
                pool,
                claims: placed.claims,
            })),
        });
        let regions: Vec<SharedRegion> = read(&self.inner.regions).values().cloned().collect();
        for r in regions {
            if let Err(e) = broadcast(&backend, |ack| ShardMsg::AddRegion(r.clone(), ack)) {
                backend.stop();
                return Err(e);
            }
        }
        lock(&self.inner.desc).port = port;
        *lock(&self.inner.inbound) = Some(inbound);
        *slot = Some(backend);
        log::info!("engine {} listening on port {port}", self.inner.key);
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
            self.inner.stop_backend();
        }
        Ok(())
    }

    /// The engine's descriptor, to hand to peers (fetch it after `create_backend`).
    pub fn engine_desc(&self) -> EngineDesc {
        lock(&self.inner.desc).clone()
    }

    /// Number of shards the backend runs (0 without a backend).
    pub fn n_shards(&self) -> usize {
        self.backend().map_or(0, |b| b.n_shards())
    }

    /// Make a peer reachable by its descriptor (a later call with the same key replaces it;
    /// open connections to an old address are closed on next use).
    ///
    /// As in MORI-IO, the descriptor of a peer that has no backend yet (port 0) is accepted:
    /// transfers to it fail with an error status naming the cause until its descriptor is
    /// registered again after its `create_backend`. An empty host (an engine listening on
    /// all interfaces) is reached at 127.0.0.1.
    pub fn register_remote_engine(&self, desc: &EngineDesc) -> Result<(), EngineError> {
        let bad = || EngineError::BadRemoteAddress {
            key: desc.key.clone(),
            host: desc.host.clone(),
            port: desc.port,
        };
        let ip: IpAddr = if desc.host.is_empty() {
            IpAddr::from([127, 0, 0, 1])
        } else {
            desc.host.parse().map_err(|_| bad())?
        };
        if desc.key.is_empty() {
            return Err(bad());
        }
        let peer = Arc::new(Peer {
            key: desc.key.as_str().into(),
            addr: SocketAddr::new(ip, desc.port),
        });
        write(&self.inner.remotes).insert(desc.key.clone(), peer);
        Ok(())
    }

    /// Forget a peer and close its connections; its transfers in flight fail.
    pub fn deregister_remote_engine(&self, desc: &EngineDesc) {
        if write(&self.inner.remotes).remove(&desc.key).is_some() {
            if let Some(b) = self.backend() {
                for s in 0..b.n_shards() {
                    let _ = b.mesh.send(s, ShardMsg::DropPeer(desc.key.as_str().into()));
                }
            }
        }
    }

    /// Register host memory that the caller owns.
    ///
    /// # Safety
    /// `ptr..ptr+size` must stay valid for reads and writes until [`Self::deregister_memory`]
    /// for it has returned `Ok`. Peers may read and write it at any time in between.
    pub unsafe fn register_memory(
        &self,
        ptr: *mut u8,
        size: usize,
        device_id: i32,
        loc: MemoryLocationType,
    ) -> Result<MemoryDesc, EngineError> {
        match loc {
            MemoryLocationType::Cpu if device_id == -1 => {
                let id = self.inner.next_mem_id.fetch_add(1, Ordering::Relaxed);
                // SAFETY: forwarded from the caller's contract.
                let region = Arc::new(unsafe { Region::from_raw(id, ptr, size) });
                self.add_region(region)
            }
            MemoryLocationType::Gpu => {
                let dm = self.device_mem(device_id, ptr as u64, size)?;
                let id = self.inner.next_mem_id.fetch_add(1, Ordering::Relaxed);
                // SAFETY: checked to be device memory of `device_id`; it stays allocated
                // until deregistration by the caller's contract.
                let region =
                    Arc::new(unsafe { Region::from_device(id, ptr as u64, size, dm, None) });
                self.add_region(region)
            }
            _ => Err(EngineError::UnsupportedMemory(format!(
                "{loc} memory on device {device_id} (CPU memory takes device -1, GPU memory a \
                 device ordinal)"
            ))),
        }
    }

    /// Use `rt` for GPU memory (for example [`gpu::fake::FakeGpu`] in tests). Without this
    /// call the engine detects the runtime at the first GPU registration ([`gpu::detect`]).
    /// Fails once another runtime is in use.
    pub fn set_gpu_runtime(&self, rt: Arc<dyn GpuRuntime>) -> Result<(), EngineError> {
        let mut slot = lock(&self.inner.gpu);
        match &*slot {
            Some(cur) if !Arc::ptr_eq(cur, &rt) => Err(EngineError::UnsupportedMemory(format!(
                "GPU runtime {} already in use",
                cur.name()
            ))),
            _ => {
                *slot = Some(rt);
                Ok(())
            }
        }
    }

    /// The engine's GPU runtime, detected on first use.
    pub fn gpu_runtime(&self) -> Result<Arc<dyn GpuRuntime>, EngineError> {
        let mut slot = lock(&self.inner.gpu);
        if let Some(rt) = &*slot {
            return Ok(rt.clone());
        }
        let rt = gpu::detect()?;
        *slot = Some(rt.clone());
        Ok(rt)
    }

    fn device_mem(&self, dev: i32, ptr: u64, size: usize) -> Result<DeviceMem, EngineError> {
        let gpu = self.gpu_runtime()?;
        let info = gpu.device_info(dev)?;
        gpu.check_device_range(dev, ptr, size)?;
        Ok(DeviceMem {
            dev,
            bus_id: info.bus_id,
            gpu,
        })
    }

    /// Allocate `size` bytes on GPU `dev` and register them (the safe form of GPU
    /// registration; copy data in and out through the returned [`RegisteredBuffer`]).
    pub fn alloc_gpu_buffer(&self, dev: i32, size: usize) -> Result<RegisteredBuffer, EngineError> {
        let gpu = self.gpu_runtime()?;
        let buf = gpu.clone().alloc_device(dev, size)?;
        let ptr = buf.ptr();
        let dm = self.device_mem(dev, ptr, size)?;
        let backing = Backing::device(buf);
        let id = self.inner.next_mem_id.fetch_add(1, Ordering::Relaxed);
        // SAFETY: `backing` owns the allocation and outlives both regions.
        let (reg, handle) = unsafe {
            (
                Region::from_device(id, ptr, size, dm.clone(), Some(backing.clone())),
                Region::from_device(id, ptr, size, dm, Some(backing)),
            )
        };
        let desc = self.add_region(Arc::new(reg))?;
        Ok(RegisteredBuffer {
            desc,
            region: Arc::new(handle),
        })
    }

    /// Register a buffer the engine owns (the safe form). Access it through the returned
    /// [`RegisteredBuffer`].
    pub fn register_buffer(&self, buf: Vec<u8>) -> Result<RegisteredBuffer, EngineError> {
        let id = self.inner.next_mem_id.fetch_add(1, Ordering::Relaxed);
        let backing = Backing::new(buf.into_boxed_slice());
        let desc = self.add_region(Arc::new(Region::owned(id, backing.clone())))?;
        // The handle gets its own view: it keeps the memory alive without counting as a user
        // of the registered region, so deregistration never waits for it.
        let region = Arc::new(Region::owned(id, backing));
        Ok(RegisteredBuffer { desc, region })
    }

    /// A zero-filled registered buffer of `size` bytes.
    pub fn alloc_buffer(&self, size: usize) -> Result<RegisteredBuffer, EngineError> {
        self.register_buffer(vec![0u8; size])
    }

    fn add_region(&self, region: SharedRegion) -> Result<MemoryDesc, EngineError> {
        let mut desc = MemoryDesc::cpu(
            &self.inner.key,
            region.id,
            region.addr(),
            region.len() as u64,
        );
        if let Some(dm) = region.device() {
            desc.device_id = dm.dev;
            desc.device_bus_id = dm.bus_id.clone();
            desc.loc = MemoryLocationType::Gpu;
        }
        write(&self.inner.regions).insert(region.id, region.clone());
        if let Some(b) = self.backend() {
            match broadcast(&b, |ack| ShardMsg::AddRegion(region.clone(), ack)) {
                // The backend is being removed: the region stays in the engine's table, which
                // the next backend's shards receive whole.
                Ok(()) | Err(EngineError::ShuttingDown) => {}
                Err(e) => {
                    write(&self.inner.regions).remove(&region.id);
                    return Err(e);
                }
            }
        }
        Ok(desc)
    }

    /// Deregister memory. Safe with transfers in flight: new transfers cannot resolve it once
    /// this returns, and it returns only when no chunk is placing into or sending from it.
    /// Transfers that were using it complete or fail within their deadline.
    pub fn deregister_memory(&self, desc: &MemoryDesc) -> Result<(), EngineError> {
        if desc.engine_key != self.inner.key {
            return Err(EngineError::UnknownMemory(desc.id));
        }
        let region = write(&self.inner.regions)
            .remove(&desc.id)
            .ok_or(EngineError::UnknownMemory(desc.id))?;
        let mut limit = Duration::from_secs(5);
        if let Some(b) = self.backend() {
            match broadcast(&b, |ack| ShardMsg::RemoveRegion(desc.id, ack)) {
                // A backend being removed drops every replica as its shards stop.
                Ok(()) | Err(EngineError::ShuttingDown) => {}
                Err(e) => return Err(e),
            }
            limit = b.shared.cfg.op_timeout * 3;
        }
        // Wait for the chunks still holding it: the region signals when its last `Arc` drops.
        let released = region.released();
        let weak = Arc::downgrade(&region);
        drop(region);
        if released.wait(limit) {
            return Ok(());
        }
        match weak.upgrade() {
            // Released between the timeout and this look.
            None => Ok(()),
            Some(region) => {
                // Keep it alive forever rather than free it under a placement.
                std::mem::forget(region);
                Err(EngineError::Busy(format!(
                    "memory {} still in use after {limit:?}",
                    desc.id
                )))
            }
        }
    }

    /// A fresh transfer uid (engine-wide counter from 0; 64-bit, so it does not wrap where
    /// MORI-IO's 32-bit counter does).
    pub fn allocate_transfer_uid(&self) -> u64 {
        self.inner.allocate_uid()
    }

    /// Read `size` bytes at `remote_off` of `remote` into `local` at `local_off`.
    pub fn read(
        &self,
        local: &MemoryDesc,
        local_off: usize,
        remote: &MemoryDesc,
        remote_off: usize,
        size: usize,
        uid: u64,
    ) -> Arc<TransferStatus> {
        self.inner
            .submit_one(Op::Read, local, local_off, remote, remote_off, size, uid)
    }

    /// Write `size` bytes at `local_off` of `local` to `remote` at `remote_off`.
    pub fn write(
        &self,
        local: &MemoryDesc,
        local_off: usize,
        remote: &MemoryDesc,
        remote_off: usize,
        size: usize,
        uid: u64,
    ) -> Arc<TransferStatus> {
        self.inner
            .submit_one(Op::Write, local, local_off, remote, remote_off, size, uid)
    }

    /// MORI's `batch_read`: entry *i* of every outer list forms one transfer (its own uid and
    /// status) of the segments `local_offs[i][j]`, `remote_offs[i][j]`, `sizes[i][j]`.
    pub fn batch_read(
        &self,
        local: &[MemoryDesc],
        local_offs: &[Vec<usize>],
        remote: &[MemoryDesc],
        remote_offs: &[Vec<usize>],
        sizes: &[Vec<usize>],
        uids: &[u64],
    ) -> Vec<Arc<TransferStatus>> {
        self.inner.submit_pairs(
            Op::Read,
            local,
            local_offs,
            remote,
            remote_offs,
            sizes,
            uids,
        )
    }

    /// MORI's `batch_write`, shaped as [`Self::batch_read`].
    pub fn batch_write(
        &self,
        local: &[MemoryDesc],
        local_offs: &[Vec<usize>],
        remote: &[MemoryDesc],
        remote_offs: &[Vec<usize>],
        sizes: &[Vec<usize>],
        uids: &[u64],
    ) -> Vec<Arc<TransferStatus>> {
        self.inner.submit_pairs(
            Op::Write,
            local,
            local_offs,
            remote,
            remote_offs,
            sizes,
            uids,
        )
    }

    /// A session over a (local, remote) pair; `None` without a backend (MORI-IO).
    pub fn create_session(
        &self,
        local: &MemoryDesc,
        remote: &MemoryDesc,
    ) -> Option<IoEngineSession> {
        self.backend()?;
        Some(IoEngineSession::new(
            self.inner.clone(),
            local.clone(),
            remote.clone(),
        ))
    }

    /// Remove and return how transfer `uid` from engine `remote_key` ended here (as target).
    /// `None` if it has not ended, was popped already, or aged out.
    pub fn pop_inbound_transfer_status(
        &self,
        remote_key: &str,
        uid: u64,
    ) -> Option<TransferStatus> {
        let store = lock(&self.inner.inbound).clone()?;
        let (code, msg) = store.pop(remote_key, uid)?;
        let s = TransferStatus::new();
        s.set_message(msg);
        s.set_code(code);
        Some(s)
    }

    /// MORI's `WaitAll`: see [`crate::status::wait_all`].
    pub fn wait_all(&self, statuses: &[Arc<TransferStatus>], timeout_ms: i64) -> StatusCode {
        wait_all(statuses, timeout_ms)
    }

    /// Every shard's statistics (counters and latency histograms), collected by message;
    /// `None` without a backend.
    pub fn stats(&self) -> Option<EngineStats> {
        let b = self.backend()?;
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
        self.backend().map_or_else(Vec::new, |b| b.cpus.clone())
    }

    fn backend(&self) -> Option<Arc<Backend>> {
        self.inner.backend()
    }
}

impl Drop for IoEngine {
    fn drop(&mut self) {
        // Sessions may hold the engine's inner state; the shards go now regardless.
        self.inner.stop_backend();
    }
}

impl Inner {
    /// Take the backend out of the engine and stop it (`remove_backend` and drop). New calls
    /// find no backend from the moment it is taken out; calls that already hold it fail their
    /// messages once its inboxes close, and nothing here waits for them.
    fn stop_backend(&self) {
        let _life = lock(&self.lifecycle);
        let Some(b) = write(&self.backend).take() else {
            return;
        };
        // MORI-IO drops the inbound statuses with the backend.
        *lock(&self.inbound) = None;
        lock(&self.desc).port = self.cfg.port;
        b.stop();
        log::info!("engine {}: TCP backend removed", self.key);
    }

    pub(crate) fn allocate_uid(&self) -> u64 {
        self.next_uid.fetch_add(1, Ordering::Relaxed)
    }

    fn backend(&self) -> Option<Arc<Backend>> {
        read(&self.backend).clone()
    }

    pub(crate) fn has_backend(&self) -> bool {
        read(&self.backend).is_some()
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn submit_one(
        &self,
        op: Op,
        local: &MemoryDesc,
        local_off: usize,
        remote: &MemoryDesc,
        remote_off: usize,
        size: usize,
        uid: u64,
    ) -> Arc<TransferStatus> {
        self.submit(
            op,
            local,
            &[local_off as u64],
            remote,
            &[remote_off as u64],
            &[size as u64],
            uid,
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn submit_pairs(
        &self,
        op: Op,
        local: &[MemoryDesc],
        local_offs: &[Vec<usize>],
        remote: &[MemoryDesc],
        remote_offs: &[Vec<usize>],
        sizes: &[Vec<usize>],
        uids: &[u64],
    ) -> Vec<Arc<TransferStatus>> {
        let n = uids.len();
        if [
            local.len(),
            local_offs.len(),
            remote.len(),
            remote_offs.len(),
            sizes.len(),
        ]
        .iter()
        .any(|&l| l != n)
        {
            return (0..n.max(1))
                .map(|_| failed(StatusCode::ErrInvalidArgs, "batch vector size mismatch"))
                .collect();
        }
        (0..n)
            .map(|i| {
                self.submit(
                    op,
                    &local[i],
                    &as_u64s(&local_offs[i]),
                    &remote[i],
                    &as_u64s(&remote_offs[i]),
                    &as_u64s(&sizes[i]),
                    uids[i],
                )
            })
            .collect()
    }

    /// Validate synchronously, then hand the transfer to its owner shard without blocking.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn submit(
        &self,
        op: Op,
        local: &MemoryDesc,
        local_offs: &[u64],
        remote: &MemoryDesc,
        remote_offs: &[u64],
        sizes: &[u64],
        uid: u64,
    ) -> Arc<TransferStatus> {
        let Some(backend) = self.backend() else {
            return failed(
                StatusCode::ErrBadState,
                "No available backend found, create backend first",
            );
        };
        if local.engine_key != self.key {
            return failed(
                StatusCode::ErrInvalidArgs,
                "local memory belongs to another engine",
            );
        }
        let known =
            |m: &MemoryDesc| matches!(m.loc, MemoryLocationType::Cpu | MemoryLocationType::Gpu);
        if !known(local) || !known(remote) {
            return failed(
                StatusCode::ErrInvalidArgs,
                "memory location must be CPU or GPU",
            );
        }
        let Some(region) = read(&self.regions).get(&local.id).cloned() else {
            return failed(StatusCode::ErrNotFound, "local memory not registered");
        };
        let Some(peer) = read(&self.remotes).get(&remote.engine_key).cloned() else {
            return failed(StatusCode::ErrNotFound, "remote engine not registered");
        };
        crate::trace::mark(uid, crate::trace::stage::RESOLVED);
        let layout = match plan::normalize_layout(
            local_offs,
            remote_offs,
            sizes,
            region.len() as u64,
            remote.size,
        ) {
            Ok(p) => p,
            Err(e) => return failed(StatusCode::ErrInvalidArgs, &e.to_string()),
        };
        crate::trace::mark(uid, crate::trace::stage::NORMALIZED);
        let total = layout.total_bytes();
        if total == 0 {
            return failed(StatusCode::Success, "");
        }
        let status = Arc::new(TransferStatus::started());
        let shared = &backend.shared;
        let owner = owner_of(uid, shared.n_owners(backend.n_shards()));
        let sub = Submission {
            peer,
            op,
            uid,
            local: region,
            remote_mem: remote.id,
            layout,
            total,
            deadline_ns: now_ns() + shared.cfg.op_timeout.as_nanos() as u64,
            status: status.clone(),
        };
        crate::trace::mark(uid, crate::trace::stage::SUBMIT);
        if backend
            .mesh
            .send(owner, ShardMsg::Submit(Box::new(sub)))
            .is_err()
        {
            status.update(StatusCode::ErrBadState, "engine shut down");
        }
        status
    }
}

/// `usize` offsets and sizes as `u64`: the same memory on 64-bit targets (no copy per
/// call, which matters for batches of hundreds of segments), converted elsewhere.
pub(crate) fn as_u64s(v: &[usize]) -> std::borrow::Cow<'_, [u64]> {
    #[cfg(target_pointer_width = "64")]
    {
        // SAFETY: on 64-bit targets usize and u64 have the same size, alignment and valid
        // bit patterns, so the slice's memory is a valid [u64] of the same length.
        std::borrow::Cow::Borrowed(unsafe {
            std::slice::from_raw_parts(v.as_ptr().cast::<u64>(), v.len())
        })
    }
    #[cfg(not(target_pointer_width = "64"))]
    {
        std::borrow::Cow::Owned(v.iter().map(|&x| x as u64).collect())
    }
}

/// Uids per owner block: consecutive uids share an owner shard, so a caller issuing transfers
/// one after another keeps finding that shard awake (waking an idle shard costs more than the
/// whole transfer), while concurrent and later transfers still spread over every shard.
const OWNER_BLOCK: u64 = 16;

/// The owner shard of transfer `uid` (derived from the uid alone, so every submission of one
/// uid meets the same owner table and duplicates are caught there).
fn owner_of(uid: u64, n_owners: usize) -> usize {
    ((uid / OWNER_BLOCK) % n_owners.max(1) as u64) as usize
}

/// Send a registry change to every shard and wait until each has applied it.
fn broadcast(b: &Backend, msg: impl Fn(mpsc::Sender<()>) -> ShardMsg) -> Result<(), EngineError> {
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

fn listen(
    ecfg: &IoEngineConfig,
    cfg: &TcpBackendConfig,
) -> Result<(socket2::Socket, u16), EngineError> {
    let ip: IpAddr = if ecfg.host.is_empty() {
        IpAddr::from([0, 0, 0, 0])
    } else {
        ecfg.host
            .parse()
            .map_err(|_| ConfigError::Host(ecfg.host.clone()))?
    };
    let addr = SocketAddr::new(ip, ecfg.port);
    let bind_err = |source| EngineError::Bind {
        addr: addr.to_string(),
        source,
    };
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )
    .map_err(bind_err)?;
    sock.set_reuse_address(true).map_err(bind_err)?;
    service::configure_buffers(&sock, cfg).map_err(bind_err)?;
    sock.bind(&addr.into()).map_err(bind_err)?;
    sock.listen(1024).map_err(bind_err)?;
    let port = sock
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .map(|a| a.port())
        .ok_or_else(|| bind_err(std::io::Error::other("no local address")))?;
    Ok((sock, port))
}

/// A registered buffer the engine owns. Copy data in and out with [`Self::write_at`] and
/// [`Self::read_at`]; peers may access it concurrently, exactly like RDMA-registered memory.
#[derive(Debug, Clone)]
pub struct RegisteredBuffer {
    desc: MemoryDesc,
    region: SharedRegion,
}

impl RegisteredBuffer {
    /// Its descriptor (to pass to transfers, or pack and send to peers).
    pub fn desc(&self) -> &MemoryDesc {
        &self.desc
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.region.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.region.is_empty()
    }

    /// Copy `src` into the buffer at `off`; `false` if out of range (or a GPU copy failed).
    pub fn write_at(&self, off: usize, src: &[u8]) -> bool {
        if let Some(dm) = self.region.device() {
            if off.checked_add(src.len()).is_none_or(|e| e > self.len()) {
                return false;
            }
            let at = self.region.device_addr(off as u64);
            // SAFETY: in range of the live device allocation this handle keeps registered.
            return unsafe { dm.gpu.copy_to_device(dm.dev, at, src) }.is_ok();
        }
        // SAFETY: bounds-checked; concurrent peer access is the registered-memory contract.
        match unsafe { self.region.slice_mut(off as u64, src.len() as u64) } {
            Some(d) => {
                d.copy_from_slice(src);
                true
            }
            None => false,
        }
    }

    /// Copy from the buffer at `off` into `dst`; `false` if out of range (or a GPU copy
    /// failed).
    pub fn read_at(&self, off: usize, dst: &mut [u8]) -> bool {
        if let Some(dm) = self.region.device() {
            if off.checked_add(dst.len()).is_none_or(|e| e > self.len()) {
                return false;
            }
            let at = self.region.device_addr(off as u64);
            // SAFETY: in range of the live device allocation this handle keeps registered.
            return unsafe { dm.gpu.copy_from_device(dm.dev, dst, at) }.is_ok();
        }
        // SAFETY: bounds-checked; concurrent peer access is the registered-memory contract.
        match unsafe { self.region.slice(off as u64, dst.len() as u64) } {
            Some(s) => {
                dst.copy_from_slice(s);
                true
            }
            None => false,
        }
    }

    /// The whole buffer as a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len()];
        self.read_at(0, &mut v);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_come_in_blocks_of_consecutive_uids_and_cover_every_shard() {
        assert!((0..OWNER_BLOCK).all(|u| owner_of(u, 4) == 0));
        assert_eq!(owner_of(OWNER_BLOCK, 4), 1);
        assert_eq!(owner_of(4 * OWNER_BLOCK, 4), 0);
        assert_eq!(owner_of(u64::MAX, 1), 0);
        assert_eq!(owner_of(7, 0), 0, "no owners is treated as one");
        let mut seen = [0usize; 8];
        for u in 0..8 * OWNER_BLOCK * 10 {
            seen[owner_of(u, 8)] += 1;
        }
        assert!(seen.iter().all(|&n| n == (OWNER_BLOCK * 10) as usize));
    }

    /// `deregister_memory` blocks while a transfer still holds the region and returns `Ok`
    /// once the last holder drops. Without the release signal it would block until its limit
    /// (three `op_timeout`s, half an hour here) and trip the watchdog; one that does not wait
    /// answers before the holder drops (in the window, or with the flag unset).
    #[test]
    fn deregister_returns_once_the_last_in_flight_holder_drops_and_not_before() {
        use std::sync::atomic::AtomicBool;
        let engine = IoEngine::new("dereg_signal", IoEngineConfig::new("127.0.0.1", 0)).unwrap();
        engine
            .create_backend(TcpBackendConfig {
                num_shards: Some(1),
                op_timeout: Duration::from_secs(600),
                ..Default::default()
            })
            .unwrap();
        let engine = Arc::new(engine);
        let mut mem = vec![0u8; 64];
        // SAFETY: `mem` outlives the registration (deregistration returns before the end).
        let md = unsafe {
            engine.register_memory(mem.as_mut_ptr(), mem.len(), -1, MemoryLocationType::Cpu)
        }
        .unwrap();
        // What a chunk on a shard holds while it places into or sends from the region.
        let in_flight = read(&engine.inner.regions)[&md.id].clone();
        let holder_dropped = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        {
            let (engine, md, flag) = (engine.clone(), md.clone(), holder_dropped.clone());
            std::thread::spawn(move || {
                let r = engine.deregister_memory(&md);
                let _ = tx.send((r, flag.load(Ordering::SeqCst)));
            });
        }
        // Once it is out of the table, new transfers cannot resolve it; the holder remains.
        while read(&engine.inner.regions).contains_key(&md.id) {
            std::thread::yield_now();
        }
        // A window in which a deregistration that does not wait would answer (a correct one
        // cannot: the holder is alive), then the holder goes.
        assert!(
            rx.recv_timeout(Duration::from_millis(50)).is_err(),
            "deregister returned while a transfer still held the region"
        );
        holder_dropped.store(true, Ordering::SeqCst);
        drop(in_flight);
        let (r, seen) = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("deregister still blocked a minute after the last holder dropped");
        r.expect("deregister once the holder dropped");
        assert!(
            seen,
            "deregister returned while a transfer still held the region"
        );
        drop(mem);
    }
}
