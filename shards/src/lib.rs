//! Thread-per-core substrate: pinned glommio executors, a message mesh, foreign-thread submission.
//!
//! `morio-shards` is the only crate of the workspace that names glommio. It knows nothing about
//! transfers: it starts one pinned executor per planned CPU, builds each shard's `!Send` service
//! *on* that shard from a `Send` factory, and gives every shard (and every application thread)
//! a [`Mesh`] of `Send` inboxes so that shards talk by message passing only.
//!
//! ```no_run
//! use morio_shards::{PoolConfig, ShardPool};
//! let pool = ShardPool::<u64>::start(PoolConfig::unpinned(2, "demo"), |ctx| async move {
//!     while let Ok(v) = ctx.inbox.recv().await {
//!         println!("shard {} got {v}", ctx.id);
//!     }
//! })
//! .unwrap();
//! pool.mesh().send(1, 7).unwrap();
//! pool.shutdown();
//! ```

mod busy;
mod pool;
pub mod preflight;
pub mod rt;

pub use pool::{Mesh, PoolConfig, ShardCtx, ShardError, ShardId, ShardPool};
