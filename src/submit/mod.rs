//! The engine core that `IoEngine` and its sessions share: the engine's state ([`Core`]:
//! key, registries, backend slot, counters), the running backend's handle ([`Backend`]), and
//! the path from a transfer's arguments to a `Submission` on its owner shard ([`xfer`]).
//!
//! It names neither `engine` nor `session`: the module graph is engine → session → submit
//! and engine → submit.

mod backend;
mod uid;
mod xfer;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::config::IoEngineConfig;
use crate::desc::EngineDesc;
use crate::gpu::GpuRuntime;
use crate::inbound_status::InboundStatuses;
use crate::region::SharedRegion;
use crate::service::Peer;

pub(crate) use backend::Backend;
pub(crate) use xfer::{Batch, Segments, Xfer};

/// An engine's state, shared (`Arc`) by the `IoEngine` and every session made from it, so a
/// session outlives neither its registries nor its backend slot.
pub(crate) struct Core {
    /// The engine's key.
    pub key: String,
    /// The configuration it was made with (where to listen).
    pub cfg: IoEngineConfig,
    /// The descriptor handed to peers (its port follows the backend).
    pub desc: Mutex<EngineDesc>,
    /// Serialises `create_backend` and `remove_backend` (and the engine's drop): a backend
    /// created right after a removal finds the old one's listener and claims released.
    pub lifecycle: Mutex<()>,
    /// The running backend, if any.
    pub backend: RwLock<Option<Arc<Backend>>>,
    /// Where transfer uids come from (`uid`: a thread's uids meet its home owner shard).
    pub uids: uid::UidSource,
    /// Registered memory by id (the table every new backend's shards receive whole). Ids
    /// are drawn at random (`region::random_mem_id`), not counted.
    pub regions: RwLock<HashMap<u32, SharedRegion>>,
    /// Registered remote engines by key.
    pub remotes: RwLock<HashMap<String, Arc<Peer>>>,
    /// The backend's inbound-status store (dropped with the backend, as in MORI-IO).
    pub inbound: Mutex<Option<Arc<InboundStatuses>>>,
    /// The GPU runtime, set explicitly or detected at the first GPU registration.
    pub gpu: Mutex<Option<Arc<dyn GpuRuntime>>>,
}

impl Core {
    /// The state of a new engine named `key` (already checked) with no backend.
    pub fn new(key: &str, cfg: IoEngineConfig) -> Self {
        let desc = EngineDesc::local(key, &cfg.host, cfg.port);
        Self {
            key: key.to_string(),
            cfg,
            desc: Mutex::new(desc),
            lifecycle: Mutex::new(()),
            backend: RwLock::new(None),
            uids: uid::UidSource::default(),
            regions: RwLock::new(HashMap::new()),
            remotes: RwLock::new(HashMap::new()),
            inbound: Mutex::new(None),
            gpu: Mutex::new(None),
        }
    }

    /// A fresh transfer uid: unique in this engine, from 0, increasing per thread, its
    /// owner the calling thread's home shard unless the thread issues a burst (`uid`).
    pub fn allocate_uid(&self) -> u64 {
        self.uids.allocate(|| {
            self.backend()
                .map_or(1, |b| b.shared.n_owners(b.n_shards()))
        })
    }

    /// The running backend, held for the length of a call.
    pub fn backend(&self) -> Option<Arc<Backend>> {
        read_lock(&self.backend).clone()
    }

    /// Whether a backend runs.
    pub fn has_backend(&self) -> bool {
        read_lock(&self.backend).is_some()
    }
}

/// Lock `m`, ignoring poisoning (every critical section leaves its data consistent).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Read-lock `m`, ignoring poisoning.
pub(crate) fn read_lock<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|e| e.into_inner())
}

/// Write-lock `m`, ignoring poisoning.
pub(crate) fn write_lock<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|e| e.into_inner())
}
