//! Errors of the engine's synchronous calls (creation, registration). Transfer outcomes are
//! not errors of this kind: they are [`crate::StatusCode`]s on a [`crate::TransferStatus`].

use crate::config::ConfigError;

/// What went wrong in a synchronous engine call.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A configuration value is invalid; nothing was started.
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    /// The listening socket could not be created or bound; nothing was started.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The shard executors could not start (bad CPU, memlock limit, io_uring unavailable).
    #[error("cannot start shards: {0}")]
    Shards(#[from] morio_shards::ShardError),
    /// The shard placement plan could not be made from the machine's topology.
    #[error("cannot plan shard placement: {0}")]
    Topology(#[from] morio_topology::TopologyError),
    /// A memory descriptor that this engine did not register (or already deregistered).
    #[error("memory {0} is not registered with this engine")]
    UnknownMemory(u32),
    /// Memory that cannot be registered as described.
    #[error("unsupported memory: {0}")]
    UnsupportedMemory(String),
    /// A host memory region larger than this machine's physical memory: it cannot all be
    /// backed, so peers must not be let at it.
    #[error(
        "host memory region of {size} bytes is larger than this machine's physical memory \
         ({ram} bytes)"
    )]
    RegionTooLarge {
        /// The size asked for.
        size: u64,
        /// Total physical memory.
        ram: u64,
    },
    /// The GPU runtime is missing or refused (no driver, no such device, not device memory).
    #[error("GPU: {0}")]
    Gpu(#[from] crate::gpu::GpuError),
    /// A remote engine whose host is not a numeric IP address.
    #[error("remote engine {key:?} has an unusable address {host:?}:{port}")]
    BadRemoteAddress {
        /// The engine key.
        key: String,
        /// Its host field.
        host: String,
        /// Its port.
        port: u16,
    },
    /// The shards did not acknowledge a registry change in time, or a region stayed in use.
    #[error("{0}")]
    Busy(String),
    /// The operating system's random source failed (a region's id and access key are drawn
    /// from it at registration).
    #[error("cannot draw a memory id or access key: {0}")]
    Random(String),
    /// The engine is shutting down.
    #[error("engine is shutting down")]
    ShuttingDown,
    /// A remote engine key that was never registered (or was deregistered).
    #[error("remote engine {0:?} is not registered with this engine")]
    UnknownRemote(String),
    /// The call needs the TCP backend, and `create_backend` has not made it.
    #[error("no backend: call create_backend first")]
    NoBackend,
    /// A connection to a remote engine could not be opened.
    #[error("cannot connect to remote engine {key:?} at {addr} (lane {lane}): {message}")]
    Connect {
        /// The engine key.
        key: String,
        /// The address dialed.
        addr: String,
        /// The lane that failed first.
        lane: usize,
        /// Why.
        message: String,
    },
}
