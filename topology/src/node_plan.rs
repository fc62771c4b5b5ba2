//! NUMA-aware placement around a NIC or GPU: IRQ CPUs, shard CPUs and application CPUs ([`plan_node`]).

use std::collections::BTreeMap;

use crate::cpulist::CpuSet;
use crate::error::TopologyError;
use crate::model::Topology;

/// What [`plan_node`] should place, and around which device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodePlanRequest {
    /// The NIC (interface name) whose NUMA node to use.
    pub nic: Option<String>,
    /// The GPU (PCI address) whose NUMA node to use when there is no NIC or
    /// its node is unknown.
    pub gpu: Option<String>,
    /// How many shards; `None` means one per physical core left on the
    /// node after the IRQ CPUs.
    pub n_shards: Option<usize>,
    /// How many CPUs to reserve for the device's IRQs; `None` means every
    /// allowed thread of one physical core (none when only one core is
    /// allowed).
    pub n_irq_cpus: Option<usize>,
}

/// A placement of IRQs, shards and the rest of the application.
///
/// The three CPU lists are disjoint and together are exactly the usable
/// (online and allowed) CPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodePlan {
    /// The NUMA node the plan is built around: the NIC's, else the GPU's;
    /// `None` when no device was given or its node is unknown.
    pub node: Option<usize>,
    /// The NIC asked for.
    pub nic: Option<String>,
    /// The GPU asked for, as its normalized PCI address.
    pub gpu: Option<String>,
    /// One CPU per shard, in shard order, each on its own physical core.
    pub shard_cpus: Vec<usize>,
    /// The CPUs for the device's IRQs, ascending.
    pub irq_cpus: Vec<usize>,
    /// Everything else allowed (other nodes, SMT siblings), ascending.
    pub app_cpus: Vec<usize>,
}

/// Plans IRQ, shard and application CPUs around a NIC's or GPU's NUMA node.
///
/// Only CPUs online in `topo` and in `allowed` are used. Nodes are visited
/// home node first (the device's), then by distance from it (ties and
/// unknown distances by id); without a known home node, by id. Within a
/// node, physical cores (sibling groups) are taken in order of their lowest
/// usable CPU. Then, deterministically:
///
/// 1. IRQ CPUs: the first `n_irq_cpus` usable threads, core by core
///    (default: all usable threads of the first core);
/// 2. shard CPUs: the lowest usable thread of each core not touched by
///    IRQs, in visiting order — so shards spill to the nearest node when the
///    home node is too small, and never share a core; the default count is
///    the untouched cores of the first node that has any;
/// 3. application CPUs: everything usable that is left.
///
/// # Errors
///
/// [`TopologyError::ZeroShards`] (`n_shards == Some(0)`),
/// [`TopologyError::UnknownNic`], [`TopologyError::UnknownGpu`],
/// [`TopologyError::UnknownNode`] (a device's node is not in `topo`),
/// [`TopologyError::NoCpus`] (nothing online is allowed),
/// [`TopologyError::TooManyIrqCpus`], and [`TopologyError::TooManyShards`]
/// when fewer untouched physical cores remain than shards are needed.
pub fn plan_node(
    topo: &Topology,
    allowed: &CpuSet,
    req: &NodePlanRequest,
) -> Result<NodePlan, TopologyError> {
    if req.n_shards == Some(0) {
        return Err(TopologyError::ZeroShards);
    }
    let nic = match &req.nic {
        Some(name) => Some(
            topo.nic(name)
                .ok_or_else(|| TopologyError::UnknownNic { name: name.clone() })?,
        ),
        None => None,
    };
    let gpu = match &req.gpu {
        Some(bus_id) => Some(topo.gpu(bus_id).ok_or_else(|| TopologyError::UnknownGpu {
            bus_id: bus_id.clone(),
        })?),
        None => None,
    };
    let node = nic
        .and_then(|nic| nic.node)
        .or_else(|| gpu.and_then(|gpu| gpu.node));
    if let Some(node) = node {
        if topo.node(node).is_none() {
            return Err(TopologyError::UnknownNode { node });
        }
    }
    let usable = topo.online().intersection(allowed);
    if usable.is_empty() {
        return Err(TopologyError::NoCpus);
    }

    let cores = ordered_cores(topo, &usable, node);
    let n_irq = req.n_irq_cpus.unwrap_or(match cores.as_slice() {
        [(_, first), _, ..] => first.len(),
        _ => 0,
    });
    if n_irq > usable.len() {
        return Err(TopologyError::TooManyIrqCpus {
            requested: n_irq,
            available: usable.len(),
        });
    }
    let mut irq_cpus = Vec::with_capacity(n_irq);
    let mut untouched = Vec::new();
    for (core_node, threads) in &cores {
        if irq_cpus.len() < n_irq {
            let take = (n_irq - irq_cpus.len()).min(threads.len());
            irq_cpus.extend_from_slice(&threads[..take]);
        } else {
            untouched.push((*core_node, threads[0]));
        }
    }
    irq_cpus.sort_unstable();

    let default = untouched.first().map_or(0, |&(first, _)| {
        untouched.iter().filter(|(n, _)| *n == first).count()
    });
    let n_shards = req.n_shards.unwrap_or(default.max(1));
    if n_shards > untouched.len() {
        return Err(TopologyError::TooManyShards {
            requested: n_shards,
            available: untouched.len(),
        });
    }
    let shard_cpus: Vec<usize> = untouched[..n_shards].iter().map(|&(_, cpu)| cpu).collect();
    let taken: CpuSet = irq_cpus.iter().chain(&shard_cpus).copied().collect();
    let app_cpus = usable.iter().filter(|&cpu| !taken.contains(cpu)).collect();
    Ok(NodePlan {
        node,
        nic: nic.map(|nic| nic.name.clone()),
        gpu: gpu.map(|gpu| gpu.bus_id.clone()),
        shard_cpus,
        irq_cpus,
        app_cpus,
    })
}

/// The usable physical cores as `(node, usable threads ascending)`, in
/// visiting order: nodes by [`node_order`], cores by lowest usable thread.
fn ordered_cores(
    topo: &Topology,
    usable: &CpuSet,
    home: Option<usize>,
) -> Vec<(usize, Vec<usize>)> {
    // Key: (node, lowest sibling id) identifies a physical core.
    let mut by_core: BTreeMap<(usize, usize), Vec<usize>> = BTreeMap::new();
    for cpu in topo.cpus.iter().filter(|cpu| usable.contains(cpu.id)) {
        let key = cpu.siblings.iter().next().unwrap_or(cpu.id);
        by_core.entry((cpu.node, key)).or_default().push(cpu.id);
    }
    let mut cores = Vec::with_capacity(by_core.len());
    for node in node_order(topo, home) {
        let mut here: Vec<Vec<usize>> = by_core
            .range((node, 0)..=(node, usize::MAX))
            .map(|(_, threads)| threads.clone())
            .collect();
        here.sort_unstable();
        cores.extend(here.into_iter().map(|threads| (node, threads)));
    }
    cores
}

/// Node ids: `home` first, then by distance from it (unknown last), ties by
/// id; without `home`, by id.
fn node_order(topo: &Topology, home: Option<usize>) -> Vec<usize> {
    let mut ids: Vec<usize> = topo.nodes.iter().map(|node| node.id).collect();
    // CPUs whose node is missing from `nodes` (synthetic topologies) still count.
    for cpu in &topo.cpus {
        if !ids.contains(&cpu.node) {
            ids.push(cpu.node);
        }
    }
    ids.sort_unstable();
    ids.dedup();
    if let Some(home) = home {
        ids.sort_by_key(|&id| {
            let distance = if id == home {
                0
            } else {
                topo.distance(home, id).map_or(u64::MAX, u64::from)
            };
            (id != home, distance, id)
        });
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::NumaNode;

    fn nodes(rows: &[&[u32]]) -> Topology {
        let nodes = rows
            .iter()
            .enumerate()
            .map(|(id, row)| NumaNode {
                id,
                cpus: CpuSet::new(),
                distances: row.to_vec(),
            })
            .collect();
        Topology {
            nodes,
            ..Topology::default()
        }
    }

    #[test]
    fn order_by_distance_then_id() {
        let topo = nodes(&[&[10, 20, 20, 12], &[], &[], &[]]);
        assert_eq!(node_order(&topo, Some(0)), [0, 3, 1, 2]);
        // Node 1 has no distance row: home first, then by id.
        assert_eq!(node_order(&topo, Some(1)), [1, 0, 2, 3]);
        assert_eq!(node_order(&topo, None), [0, 1, 2, 3]);
        // A short row leaves the missing distances unknown (last).
        let topo = nodes(&[&[10, 30], &[30, 10], &[]]);
        assert_eq!(node_order(&topo, Some(0)), [0, 1, 2]);
    }

    #[test]
    fn empty_topology_has_no_cpus() {
        let topo = Topology::default();
        let err = plan_node(&topo, &(0..4).collect(), &NodePlanRequest::default());
        assert!(matches!(err, Err(TopologyError::NoCpus)));
    }
}
