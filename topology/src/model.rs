//! The machine model: [`Cpu`], [`NumaNode`] and [`Topology`] (reading it from sysfs lives in `sysfs.rs`).

use crate::cpulist::CpuSet;
use crate::device::{normalize_bus_id, Gpu, Nic};

/// One online logical CPU (hardware thread).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Cpu {
    /// The kernel's logical CPU number (`cpuN`).
    pub id: usize,
    /// The physical core id (`topology/core_id`); unique only within a
    /// package. CPUs with the same `(package, core)` are SMT siblings.
    pub core: usize,
    /// The physical package (socket) id (`topology/physical_package_id`).
    pub package: usize,
    /// The NUMA node the CPU belongs to.
    pub node: usize,
    /// The online SMT threads of this CPU's physical core, itself included
    /// (`topology/thread_siblings_list`; without that file, the online CPUs
    /// with the same `(package, core)`).
    pub siblings: CpuSet,
}

/// A NUMA node and its online CPUs. A node may have no CPUs (memory-only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumaNode {
    /// The node number (`nodeN`).
    pub id: usize,
    /// The online CPUs on this node.
    pub cpus: CpuSet,
    /// The node's row of the distance matrix (`nodeN/distance`): entry `i`
    /// is the distance to the `i`-th node of [`Topology::nodes`] (10 = local).
    /// Empty when unknown.
    pub distances: Vec<u32>,
}

/// The CPUs, NUMA nodes, NICs and GPUs of a machine.
///
/// Built by [`Topology::from_sysfs`] (CPUs and nodes), [`Topology::discover`]
/// (also NICs and GPUs) or [`Topology::flat`]; `cpus` is sorted by id,
/// `nodes` by id, `nics` by name and `gpus` by bus id. The fields are public so tests and callers can
/// build synthetic machines; [`plan_shards`](crate::plan_shards) takes each
/// CPU's node from [`Cpu::node`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    /// The online CPUs, sorted by id.
    pub cpus: Vec<Cpu>,
    /// The NUMA nodes, sorted by id.
    pub nodes: Vec<NumaNode>,
    /// The physical network interfaces, sorted by name (empty unless read by
    /// [`Topology::discover`]).
    pub nics: Vec<Nic>,
    /// The NVIDIA and AMD GPUs, sorted by bus id (empty unless read by
    /// [`Topology::discover`]).
    pub gpus: Vec<Gpu>,
}

impl Topology {
    /// A synthetic single-node machine of `n_cpus` CPUs, each its own core
    /// on package 0 and node 0 — for when sysfs is unreadable.
    ///
    /// `flat(0)` has no CPUs (planning on it fails with
    /// [`TopologyError::NoCpus`](crate::TopologyError::NoCpus)) but still has
    /// node 0.
    pub fn flat(n_cpus: usize) -> Topology {
        let cpus = (0..n_cpus)
            .map(|id| Cpu {
                id,
                core: id,
                package: 0,
                node: 0,
                siblings: [id].into_iter().collect(),
            })
            .collect();
        let nodes = vec![NumaNode {
            id: 0,
            cpus: (0..n_cpus).collect(),
            distances: vec![10],
        }];
        Topology {
            cpus,
            nodes,
            ..Topology::default()
        }
    }

    /// The CPU with logical id `id`, if it is in the topology.
    pub fn cpu(&self, id: usize) -> Option<&Cpu> {
        self.cpus.iter().find(|cpu| cpu.id == id)
    }

    /// The node with id `id`, if it exists.
    pub fn node(&self, id: usize) -> Option<&NumaNode> {
        self.nodes.iter().find(|node| node.id == id)
    }

    /// The NIC named `name`, if any.
    pub fn nic(&self, name: &str) -> Option<&Nic> {
        self.nics.iter().find(|nic| nic.name == name)
    }

    /// The GPU at PCI address `bus_id`, if any. Case is ignored, and the
    /// domain may be left out (`18:00.0` is `0000:18:00.0`).
    pub fn gpu(&self, bus_id: &str) -> Option<&Gpu> {
        let wanted = normalize_bus_id(bus_id);
        self.gpus.iter().find(|gpu| gpu.bus_id == wanted)
    }

    /// The NUMA distance from node `from` to node `to`, when both exist and
    /// `from`'s distance row is known.
    pub fn distance(&self, from: usize, to: usize) -> Option<u32> {
        let index = self.nodes.iter().position(|node| node.id == to)?;
        self.node(from)?.distances.get(index).copied()
    }

    /// The ids of all CPUs in the topology (all online).
    pub fn online(&self) -> CpuSet {
        self.cpus.iter().map(|cpu| cpu.id).collect()
    }

    /// The number of distinct physical cores (`(package, core)` pairs).
    pub fn physical_cores(&self) -> usize {
        let cores: std::collections::BTreeSet<(usize, usize)> = self
            .cpus
            .iter()
            .map(|cpu| (cpu.package, cpu.core))
            .collect();
        cores.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_machine() {
        let topo = Topology::flat(4);
        assert_eq!(topo.cpus.len(), 4);
        assert_eq!(topo.physical_cores(), 4);
        assert_eq!(topo.nodes.len(), 1);
        assert_eq!(topo.nodes[0].cpus.to_string(), "0-3");
        assert_eq!(topo.online().to_string(), "0-3");
        assert_eq!(topo.cpu(2).map(|c| c.core), Some(2));
        assert_eq!(
            topo.cpu(2).map(|c| c.siblings.to_string()).as_deref(),
            Some("2")
        );
        assert_eq!(topo.distance(0, 0), Some(10));
        assert_eq!(topo.distance(0, 1), None);
        assert!(topo.nics.is_empty() && topo.gpus.is_empty());
        assert!(topo.cpu(4).is_none());
        assert!(topo.node(0).is_some() && topo.node(1).is_none());
    }

    #[test]
    fn flat_zero() {
        let topo = Topology::flat(0);
        assert!(topo.cpus.is_empty());
        assert_eq!(topo.nodes.len(), 1);
        assert!(topo.nodes[0].cpus.is_empty());
    }
}
