//! Pure machine-topology model and placement for morio.
//!
//! This crate reads CPUs (with their SMT siblings) and NUMA nodes (with
//! their distance rows) from a sysfs tree whose root is a parameter
//! ([`Topology::from_sysfs`]; it never touches a hard-coded `/sys` path),
//! plus NICs, GPUs and — from a proc root, also a parameter — NIC IRQ
//! affinity ([`Topology::discover`]), or builds a synthetic machine
//! ([`Topology::flat`]). It computes two deterministic placements:
//! [`plan_shards`] (one CPU per shard, one per physical core before any SMT
//! sibling, preferred NUMA node first) and [`plan_node`] (IRQ, shard and
//! application CPUs around a NIC's or GPU's NUMA node, spilling to the
//! nearest node), both restricted to the affinity mask the caller passes in.
//!
//! It has no runtime dependencies besides `thiserror`, performs no syscalls
//! other than reading files under the given roots, and never panics on
//! malformed input: every failure is a [`TopologyError`].
//!
//! Layout: `cpulist` (the kernel list format, [`CpuSet`]); `model` (types);
//! `device` ([`Nic`], [`Gpu`] and reading them); `sysfs` (reading CPUs and
//! nodes); `read` (file helpers); `plan` ([`plan_shards`]); `node_plan`
//! ([`plan_node`]); `error` ([`TopologyError`]).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod cpulist;
mod device;
mod error;
mod model;
mod node_plan;
mod plan;
mod read;
mod sysfs;

pub use cpulist::{parse_cpu_list, CpuSet, MAX_CPU_ID};
pub use device::{Gpu, GpuVendor, Nic};
pub use error::TopologyError;
pub use model::{Cpu, NumaNode, Topology};
pub use node_plan::{plan_node, NodePlan, NodePlanRequest};
pub use plan::{plan_shards, ShardPlan, ShardRequest};
