//! `IoEngine`: MORI-IO's engine object over morio's thread-per-core TCP data plane. This file
//! holds the object itself (construction, identity, drop); its calls are grouped by concern:
//! [`backend`] (create and remove the TCP backend, statistics), [`memory`] (local and GPU
//! memory), [`remote`] (peers), [`transfer`] (reads, writes, sessions, statuses) and
//! [`buffer`] ([`RegisteredBuffer`]). The state it shares with its sessions and the
//! submission path live in [`crate::submit`].

mod backend;
mod buffer;
mod memory;
mod remote;
mod transfer;

use std::net::IpAddr;
use std::sync::Arc;

use crate::config::{ConfigError, IoEngineConfig};
use crate::desc::EngineDesc;
use crate::error::EngineError;
use crate::proto::limits::MAX_KEY_BYTES;
use crate::submit::{lock, Core};

pub use buffer::RegisteredBuffer;
pub use memory::RegisterOptions;

/// One engine per process endpoint, named by a unique key (MORI-IO's `IOEngine`).
///
/// Create it, add the TCP backend, register memory, exchange [`EngineDesc`] and
/// [`crate::MemoryDesc`] with peers out of band, then read and write their memory. Every
/// transfer call returns at once with a [`crate::TransferStatus`] already `IN_PROGRESS` (or
/// terminal, for argument errors); completion happens on the engine's shards. Dropping the
/// engine (like [`Self::remove_backend`]) fails everything in flight with `ERR_BAD_STATE` and
/// joins every shard thread.
pub struct IoEngine {
    core: Arc<Core>,
}

impl std::fmt::Debug for IoEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoEngine")
            .field("key", &self.core.key)
            .finish()
    }
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
        Ok(Self {
            core: Arc::new(Core::new(key, cfg)),
        })
    }

    /// This engine's key.
    pub fn key(&self) -> &str {
        &self.core.key
    }

    /// The engine's descriptor, to hand to peers (fetch it after `create_backend`).
    pub fn engine_desc(&self) -> EngineDesc {
        lock(&self.core.desc).clone()
    }
}

impl Drop for IoEngine {
    fn drop(&mut self) {
        // Sessions may hold the engine's core; the shards go now regardless. Stopping joins
        // the shard threads (no polling here).
        backend::stop(&self.core);
    }
}
