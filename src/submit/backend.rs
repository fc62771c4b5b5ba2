//! The running TCP backend as the engine core holds it: every shard's inbox, the state the
//! shards share, their CPUs, and how it stops. `engine::backend` creates it.

use std::sync::{Arc, Mutex};

use morio_shards::{Mesh, ShardPool};

use crate::cpu_claim::CpuClaim;
use crate::service::{ShardMsg, Shared};

use super::lock;

/// The TCP backend: its shards and what belongs to them. Application threads hold an `Arc`
/// of it for the length of a call; stopping it does not wait for them (their messages fail).
pub(crate) struct Backend {
    /// Every shard's inbox; closed when the backend stops, so late messages fail at once.
    pub mesh: Mesh<ShardMsg>,
    /// What every shard shares (configuration, inbound statuses, joins).
    pub shared: Arc<Shared>,
    /// The CPU each shard is pinned to (`None`: unpinned).
    pub cpus: Vec<Option<usize>>,
    /// The running pool and the backend's CPU claims, until [`Backend::stop`].
    running: Mutex<Option<Running>>,
}

struct Running {
    pool: ShardPool<ShardMsg>,
    /// Released after the pool has stopped: no shard runs on a CPU it no longer claims.
    claims: Vec<CpuClaim>,
}

impl Backend {
    /// The handle of a started `pool`, which runs on `cpus` and holds `claims` until it
    /// stops.
    pub fn new(
        pool: ShardPool<ShardMsg>,
        shared: Arc<Shared>,
        cpus: Vec<Option<usize>>,
        claims: Vec<CpuClaim>,
    ) -> Self {
        Self {
            mesh: pool.mesh().clone(),
            shared,
            cpus,
            running: Mutex::new(Some(Running { pool, claims })),
        }
    }

    /// How many shards it runs.
    pub fn n_shards(&self) -> usize {
        self.mesh.n_shards()
    }

    /// Stop the shards (every transfer they own fails with `ERR_BAD_STATE`, their
    /// connections and the listener close), join their threads, then release the CPU claims.
    /// Idempotent; returns once the shards are gone.
    pub fn stop(&self) {
        let running = lock(&self.running).take();
        if let Some(Running { pool, claims }) = running {
            pool.shutdown();
            drop(claims);
        }
    }
}
