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

pub mod config;
mod cpu_claim;
pub mod desc;
mod engine;
pub mod error;
pub mod gpu;
mod inbound_status;
pub mod placement;
pub mod proto;
mod region;
mod service;
mod session;
pub mod stats;
pub mod status;
mod submit;
pub mod trace;
mod transport;

pub use config::{ConfigError, IoEngineConfig, TcpBackendConfig};
pub use desc::{BackendType, DescError, EngineDesc, MemoryDesc, MemoryLocationType};
pub use engine::{IoEngine, RegisteredBuffer};
pub use error::EngineError;
pub use session::IoEngineSession;
pub use stats::{EngineStats, ShardStats};
pub use status::{wait_all, StatusCode, TransferStatus};
