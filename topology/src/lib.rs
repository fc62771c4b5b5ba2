//! Pure machine-topology model and shard placement for morio.
//!
//! This crate reads CPUs and NUMA nodes from a sysfs tree whose root is a
//! parameter ([`Topology::from_sysfs`]; it never touches a hard-coded `/sys`
//! path), or builds a synthetic machine ([`Topology::flat`]), and computes a
//! deterministic shard placement ([`plan_shards`]): one CPU per shard, one
//! per physical core before any SMT sibling, preferred NUMA node first,
//! restricted to the process affinity mask the caller passes in.
//!
//! It has no runtime dependencies besides `thiserror`, performs no syscalls
//! other than reading files under the given root, and never panics on
//! malformed input: every failure is a [`TopologyError`].
//!
//! Layout: `cpulist` (the kernel list format, [`CpuSet`]); `model` (types);
//! `sysfs` (reading); `plan` (placement); `error` ([`TopologyError`]).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod cpulist;
mod error;
mod model;
mod plan;
mod sysfs;

pub use cpulist::{parse_cpu_list, CpuSet, MAX_CPU_ID};
pub use error::TopologyError;
pub use model::{Cpu, NumaNode, Topology};
pub use plan::{plan_shards, ShardPlan, ShardRequest};
