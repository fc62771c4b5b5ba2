//! morio: a thread-per-core engine that moves data between processes over plain TCP, with
//! AMD MORI-IO's engine API (engines, descriptors, read/write/batch/session, statuses).
//!
//! ```no_run
//! use morio::{IoEngine, IoEngineConfig, TcpBackendConfig, StatusCode};
//!
//! let a = IoEngine::new("a", IoEngineConfig::new("127.0.0.1", 0)).unwrap();
//! let b = IoEngine::new("b", IoEngineConfig::new("127.0.0.1", 0)).unwrap();
//! a.create_backend(TcpBackendConfig::default()).unwrap();
//! b.create_backend(TcpBackendConfig::default()).unwrap();
//! // Descriptors travel out of band (here: in-process); pack()/unpack() give their bytes.
//! a.register_remote_engine(&b.engine_desc()).unwrap();
//! let src = a.register_buffer(vec![7u8; 1 << 20]).unwrap();
//! let dst = b.alloc_buffer(1 << 20).unwrap();
//! let uid = a.allocate_transfer_uid();
//! let st = a.write(src.desc(), 0, dst.desc(), 0, 1 << 20, uid);
//! assert_eq!(st.wait(), StatusCode::Success);
//! assert_eq!(b.pop_inbound_transfer_status("a", uid).unwrap().code(), StatusCode::Success);
//! ```
//!
//! See `ARCHITECTURE.md` for the code map and invariants, `PROTOCOL.md` for the wire format.

// The API is the items re-exported here plus the modules `gpu`, `placement` and `status`;
// the other modules are internals. `proto` is public (hidden) only under the `testing`
// feature, which this package's own tests and benches turn on; `trace` and `stripe_bytes`
// are hidden public items the `morio` command uses (tests/tidy.rs keeps this list closed).
mod config;
mod cpu_claim;
mod desc;
#[cfg(feature = "etcd")]
pub mod discovery;
mod engine;
mod error;
mod fdpass;
pub mod gpu;
mod host;
mod inbound_status;
mod metrics;
pub mod placement;
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod proto;
#[cfg(not(feature = "testing"))]
mod proto;
mod region;
mod service;
mod session;
mod small_copy;
mod stats;
pub mod status;
mod submit;
mod sync;
#[cfg(test)]
mod test_alloc;
#[doc(hidden)]
pub mod trace;
mod transport;

pub use config::{
    busy_poll_from_env, busy_window, AuthSecret, ConfigError, IoEngineConfig, SameHost,
    TcpBackendConfig, AUTH_SECRET_ENV, BUSY_POLL_ENV, BUSY_POLL_MIN_CPUS, DEFAULT_BUSY_POLL,
    MIN_AUTH_SECRET_BYTES, SAME_HOST_ENV,
};
pub use desc::{
    host_port, AccessKey, BackendType, DescError, EngineDesc, EngineKey, MemoryDesc,
    MemoryLocationType, MemoryUniqueId, TransferUniqueId, HANDLE_LEN, NODE_ID_ENV,
};
pub use engine::{IoEngine, LaneTransport, RegisterOptions, RegisteredBuffer};
pub use error::EngineError;
pub use host::{check_host, check_same_host, check_same_host_rings};
pub use metrics::METRICS_CONTENT_TYPE;
pub use session::IoEngineSession;
pub use stats::{EngineStats, LaneStats, PeerMap, PeerStats, ShardStats};
pub use status::{wait_all, StatusCode, TransferStatus};

/// Test hook: express sends over TCP put at most this many bytes of a frame (see
/// `transport::express_port`).
#[cfg(feature = "testing")]
#[doc(hidden)]
pub use transport::express_port::limit_express_sends;

/// The stripe size a striped transfer uses (for the `morio` command's raw-TCP floor).
#[doc(hidden)]
pub use proto::plan::stripe_bytes;
