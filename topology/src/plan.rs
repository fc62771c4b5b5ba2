//! Shard placement: choosing one CPU per shard from a [`Topology`] and an affinity mask.

use std::collections::{BTreeMap, BTreeSet};

use crate::cpulist::CpuSet;
use crate::error::TopologyError;
use crate::model::{Cpu, Topology};

/// What the caller wants placed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardRequest {
    /// How many shards; `None` means one per allowed physical core.
    pub n_shards: Option<usize>,
    /// An explicit CPU per shard, in shard order; overrides automatic
    /// placement (if `n_shards` is also given it must equal the length).
    pub cpus: Option<Vec<usize>>,
    /// The NUMA node whose CPUs to use first (ignored for explicit `cpus`,
    /// but must still exist).
    pub prefer_node: Option<usize>,
}

/// The result of planning: where each shard runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPlan {
    /// One CPU per shard, in shard order.
    pub cpus: Vec<usize>,
}

impl ShardPlan {
    /// The number of shards.
    pub fn len(&self) -> usize {
        self.cpus.len()
    }

    /// Whether the plan has no shards (never true for a plan returned by
    /// [`plan_shards`]).
    pub fn is_empty(&self) -> bool {
        self.cpus.is_empty()
    }
}

/// Chooses a CPU for each shard.
///
/// Only CPUs that are in `topo` (i.e. online) and in `allowed` (the process
/// affinity mask) are used. With an explicit `req.cpus`, that list is
/// validated and returned as is. Otherwise CPUs are taken in this order,
/// which is deterministic:
///
/// 1. the first thread (lowest usable id) of every physical core — a core is
///    a `(package, core)` pair — before any second SMT thread, any second
///    before any third, and so on;
/// 2. within that, CPUs of `prefer_node` first, then the other nodes in id
///    order;
/// 3. within a node, ascending CPU id.
///
/// So SMT siblings are only used once every usable physical core has a
/// shard, even if that means leaving the preferred node.
///
/// # Errors
///
/// - [`TopologyError::UnknownNode`]: `prefer_node` is not in `topo.nodes`;
/// - [`TopologyError::ZeroShards`]: `n_shards == Some(0)` or `cpus` is empty;
/// - [`TopologyError::ShardCountMismatch`]: `n_shards` and `cpus` disagree;
/// - [`TopologyError::UnknownCpu`], [`TopologyError::CpuNotAllowed`],
///   [`TopologyError::DuplicateCpu`]: an explicit CPU is not online, not
///   allowed, or repeated (checked in list order, in that order);
/// - [`TopologyError::NoCpus`]: no CPU is online and allowed;
/// - [`TopologyError::TooManyShards`]: `n_shards` exceeds the usable CPUs.
pub fn plan_shards(
    topo: &Topology,
    allowed: &CpuSet,
    req: &ShardRequest,
) -> Result<ShardPlan, TopologyError> {
    if let Some(node) = req.prefer_node {
        if topo.node(node).is_none() {
            return Err(TopologyError::UnknownNode { node });
        }
    }
    if req.n_shards == Some(0) {
        return Err(TopologyError::ZeroShards);
    }
    let by_id: BTreeMap<usize, &Cpu> = topo.cpus.iter().map(|cpu| (cpu.id, cpu)).collect();
    if let Some(explicit) = &req.cpus {
        return plan_explicit(&by_id, allowed, explicit, req.n_shards);
    }

    // (thread rank within its core, node rank, node, cpu id), sorted.
    let mut threads_seen: BTreeMap<(usize, usize), usize> = BTreeMap::new();
    let mut ranked = Vec::new();
    for cpu in by_id.values().filter(|cpu| allowed.contains(cpu.id)) {
        let seen = threads_seen.entry((cpu.package, cpu.core)).or_insert(0);
        let thread_rank = *seen;
        *seen += 1;
        let node_rank = usize::from(req.prefer_node != Some(cpu.node));
        ranked.push((thread_rank, node_rank, cpu.node, cpu.id));
    }
    if ranked.is_empty() {
        return Err(TopologyError::NoCpus);
    }
    ranked.sort_unstable();

    let requested = req.n_shards.unwrap_or(threads_seen.len());
    if requested > ranked.len() {
        return Err(TopologyError::TooManyShards {
            requested,
            available: ranked.len(),
        });
    }
    Ok(ShardPlan {
        cpus: ranked
            .into_iter()
            .take(requested)
            .map(|(_, _, _, id)| id)
            .collect(),
    })
}

fn plan_explicit(
    by_id: &BTreeMap<usize, &Cpu>,
    allowed: &CpuSet,
    explicit: &[usize],
    n_shards: Option<usize>,
) -> Result<ShardPlan, TopologyError> {
    if explicit.is_empty() {
        return Err(TopologyError::ZeroShards);
    }
    if let Some(requested) = n_shards {
        if requested != explicit.len() {
            return Err(TopologyError::ShardCountMismatch {
                requested,
                cpus: explicit.len(),
            });
        }
    }
    let mut seen = BTreeSet::new();
    for &cpu in explicit {
        if !by_id.contains_key(&cpu) {
            return Err(TopologyError::UnknownCpu { cpu });
        }
        if !allowed.contains(cpu) {
            return Err(TopologyError::CpuNotAllowed { cpu });
        }
        if !seen.insert(cpu) {
            return Err(TopologyError::DuplicateCpu { cpu });
        }
    }
    Ok(ShardPlan {
        cpus: explicit.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(topo: &Topology) -> CpuSet {
        topo.online()
    }

    fn req(n: Option<usize>) -> ShardRequest {
        ShardRequest {
            n_shards: n,
            ..ShardRequest::default()
        }
    }

    #[test]
    fn flat_defaults_to_every_cpu() {
        let topo = Topology::flat(4);
        let plan = plan_shards(&topo, &all(&topo), &req(None)).unwrap();
        assert_eq!(plan.cpus, vec![0, 1, 2, 3]);
        assert_eq!(plan.len(), 4);
        assert!(!plan.is_empty());
    }

    #[test]
    fn flat_zero_has_no_cpus() {
        let topo = Topology::flat(0);
        assert!(matches!(
            plan_shards(&topo, &CpuSet::new(), &req(None)),
            Err(TopologyError::NoCpus)
        ));
    }

    #[test]
    fn smt_pair_uses_sibling_last() {
        // Two cores, two threads each: cpu0/2 on core 0, cpu1/3 on core 1.
        let cpus = (0..4)
            .map(|id| Cpu {
                id,
                core: id % 2,
                package: 0,
                node: 0,
                siblings: [id % 2, id % 2 + 2].into_iter().collect(),
            })
            .collect();
        let topo = Topology {
            cpus,
            nodes: vec![crate::NumaNode {
                id: 0,
                cpus: (0..4).collect(),
                distances: vec![10],
            }],
            ..Topology::default()
        };
        let allowed = all(&topo);
        assert_eq!(
            plan_shards(&topo, &allowed, &req(None)).unwrap().cpus,
            [0, 1]
        );
        assert_eq!(
            plan_shards(&topo, &allowed, &req(Some(3))).unwrap().cpus,
            [0, 1, 2]
        );
        // With cpu0 disallowed, cpu2 is core 0's first usable thread.
        let allowed: CpuSet = [1, 2, 3].into_iter().collect();
        assert_eq!(
            plan_shards(&topo, &allowed, &req(None)).unwrap().cpus,
            [1, 2]
        );
    }

    #[test]
    fn explicit_count_mismatch() {
        let topo = Topology::flat(4);
        let request = ShardRequest {
            n_shards: Some(3),
            cpus: Some(vec![0, 1]),
            prefer_node: None,
        };
        assert!(matches!(
            plan_shards(&topo, &all(&topo), &request),
            Err(TopologyError::ShardCountMismatch {
                requested: 3,
                cpus: 2
            })
        ));
    }
}
