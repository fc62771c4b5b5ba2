//! The crate's single error type, [`TopologyError`], and when each variant arises.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong while reading a topology or planning shards.
///
/// No function in this crate panics on bad input; every failure is reported
/// as one of these variants.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TopologyError {
    /// A sysfs file or directory that [`Topology::from_sysfs`] needs could not
    /// be read (missing, permission denied, not a directory, ...).
    ///
    /// [`Topology::from_sysfs`]: crate::Topology::from_sysfs
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file or directory that could not be read.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: io::Error,
    },

    /// A sysfs file was read but its content is malformed (not UTF-8, not a
    /// number, not a CPU list), or the files contradict each other (a CPU in
    /// two NUMA nodes, an online CPU in no node).
    #[error("malformed {}: {detail}", path.display())]
    Parse {
        /// The offending file (or directory, for cross-file inconsistencies).
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },

    /// A string passed to [`parse_cpu_list`](crate::parse_cpu_list) is not a
    /// valid CPU list. (When the string comes from a sysfs file,
    /// [`TopologyError::Parse`] is reported instead, naming the file.)
    #[error("invalid CPU list {input:?}: {detail}")]
    InvalidCpuList {
        /// The text that failed to parse.
        input: String,
        /// What is wrong with it.
        detail: String,
    },

    /// There is no CPU to place anything on: sysfs lists no online CPU, or
    /// no online CPU is in the allowed (affinity) set given to
    /// [`plan_shards`](crate::plan_shards).
    #[error("no usable CPU: none is both online and allowed")]
    NoCpus,

    /// An explicitly requested CPU is online but not in the allowed
    /// (affinity) set.
    #[error("CPU {cpu} is not in the allowed CPU set")]
    CpuNotAllowed {
        /// The requested CPU id.
        cpu: usize,
    },

    /// An explicitly requested CPU is not an online CPU of the topology.
    #[error("CPU {cpu} is not an online CPU of this machine")]
    UnknownCpu {
        /// The requested CPU id.
        cpu: usize,
    },

    /// An explicit CPU list names the same CPU twice.
    #[error("CPU {cpu} is listed more than once")]
    DuplicateCpu {
        /// The repeated CPU id.
        cpu: usize,
    },

    /// `prefer_node`, or the `numa_node` of the NIC or GPU given to
    /// [`plan_node`](crate::plan_node), names a NUMA node the topology does
    /// not have.
    #[error("NUMA node {node} does not exist")]
    UnknownNode {
        /// The requested node id.
        node: usize,
    },

    /// More shards were requested than there are usable (online and
    /// allowed) CPUs — for [`plan_node`](crate::plan_node), usable physical
    /// cores left after the IRQ CPUs.
    #[error("{requested} shards requested but only {available} usable CPUs")]
    TooManyShards {
        /// The requested shard count.
        requested: usize,
        /// How many CPUs (for `plan_node`: physical cores) are usable.
        available: usize,
    },

    /// [`plan_node`](crate::plan_node) was asked for a NIC the topology
    /// does not have.
    #[error("no network interface named {name:?}")]
    UnknownNic {
        /// The requested interface name.
        name: String,
    },

    /// [`plan_node`](crate::plan_node) was asked for a GPU the topology
    /// does not have.
    #[error("no GPU at PCI address {bus_id:?}")]
    UnknownGpu {
        /// The requested PCI address, as given.
        bus_id: String,
    },

    /// More IRQ CPUs were requested than there are usable (online and
    /// allowed) CPUs.
    #[error("{requested} IRQ CPUs requested but only {available} usable CPUs")]
    TooManyIrqCpus {
        /// The requested IRQ CPU count.
        requested: usize,
        /// How many CPUs are online and allowed.
        available: usize,
    },

    /// Zero shards were requested (`n_shards == Some(0)`, or an empty
    /// explicit CPU list).
    #[error("zero shards requested")]
    ZeroShards,

    /// Both `n_shards` and an explicit `cpus` list were given, and they
    /// disagree on the shard count.
    #[error("{requested} shards requested but {cpus} CPUs listed explicitly")]
    ShardCountMismatch {
        /// The requested shard count.
        requested: usize,
        /// The length of the explicit CPU list.
        cpus: usize,
    },
}
