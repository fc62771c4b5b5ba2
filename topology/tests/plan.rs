//! `plan_shards` on the fixture machines: SMT avoidance, node preference, affinity masks, explicit CPUs, errors.

mod common;

use std::collections::BTreeSet;

use common::load;
use morio_topology::{plan_shards, CpuSet, ShardRequest, Topology, TopologyError};

fn set(ids: &[usize]) -> CpuSet {
    ids.iter().copied().collect()
}

fn auto(n: Option<usize>, prefer_node: Option<usize>) -> ShardRequest {
    ShardRequest {
        n_shards: n,
        cpus: None,
        prefer_node,
    }
}

fn explicit(cpus: &[usize]) -> ShardRequest {
    ShardRequest {
        cpus: Some(cpus.to_vec()),
        ..ShardRequest::default()
    }
}

fn plan(topo: &Topology, allowed: &CpuSet, req: &ShardRequest) -> Vec<usize> {
    plan_shards(topo, allowed, req).unwrap().cpus
}

#[test]
fn h200_default_is_one_shard_per_core() {
    let topo = load("h200-1s16c");
    let cpus = plan(&topo, &topo.online(), &ShardRequest::default());
    assert_eq!(cpus, (0..16).collect::<Vec<_>>());
    assert_eq!(
        plan(&topo, &topo.online(), &auto(Some(4), None)),
        [0, 1, 2, 3]
    );
    assert_eq!(
        plan(&topo, &topo.online(), &auto(Some(4), Some(0))),
        [0, 1, 2, 3]
    );
}

#[test]
fn dual_socket_default_skips_smt_siblings() {
    let topo = load("dual-socket-smt");
    let cpus = plan(&topo, &topo.online(), &ShardRequest::default());
    assert_eq!(cpus, [0, 1, 2, 3, 4, 5, 6, 7]);
}

#[test]
fn dual_socket_siblings_only_when_needed() {
    let topo = load("dual-socket-smt");
    let all = topo.online();
    assert_eq!(
        plan(&topo, &all, &auto(Some(8), None)),
        [0, 1, 2, 3, 4, 5, 6, 7]
    );
    assert_eq!(
        plan(&topo, &all, &auto(Some(10), None)),
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    );
    assert_eq!(
        plan(&topo, &all, &auto(Some(16), None)),
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    );
}

#[test]
fn prefer_node_comes_first() {
    let topo = load("dual-socket-smt");
    let all = topo.online();
    assert_eq!(plan(&topo, &all, &auto(Some(4), Some(1))), [4, 5, 6, 7]);
    // Node 1's cores, then node 0's cores, before any sibling.
    assert_eq!(
        plan(&topo, &all, &auto(Some(6), Some(1))),
        [4, 5, 6, 7, 0, 1]
    );
    assert_eq!(
        plan(&topo, &all, &auto(None, Some(1))),
        [4, 5, 6, 7, 0, 1, 2, 3]
    );
    // Siblings: preferred node's first.
    assert_eq!(
        plan(&topo, &all, &auto(Some(16), Some(1))),
        [4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11]
    );
    assert_eq!(plan(&topo, &all, &auto(Some(4), Some(0))), [0, 1, 2, 3]);
}

#[test]
fn prefer_unknown_node_is_an_error() {
    let topo = load("dual-socket-smt");
    assert!(matches!(
        plan_shards(&topo, &topo.online(), &auto(None, Some(2))),
        Err(TopologyError::UnknownNode { node: 2 })
    ));
    let topo = load("dev-2c");
    assert!(matches!(
        plan_shards(&topo, &topo.online(), &auto(None, Some(1))),
        Err(TopologyError::UnknownNode { node: 1 })
    ));
}

#[test]
fn affinity_mask_restricts_placement() {
    let topo = load("dual-socket-smt");
    // cpu2 and cpu10 are siblings (pkg0 core2); cpu3 is pkg0 core3.
    let allowed = set(&[2, 3, 10]);
    assert_eq!(plan(&topo, &allowed, &ShardRequest::default()), [2, 3]);
    assert_eq!(plan(&topo, &allowed, &auto(Some(3), None)), [2, 3, 10]);
    assert_eq!(plan(&topo, &allowed, &auto(Some(2), Some(1))), [2, 3]);
    assert!(matches!(
        plan_shards(&topo, &allowed, &auto(Some(4), None)),
        Err(TopologyError::TooManyShards {
            requested: 4,
            available: 3
        })
    ));
    // Only a sibling thread allowed: it counts as its core's first thread.
    assert_eq!(
        plan(&topo, &set(&[9, 12]), &ShardRequest::default()),
        [9, 12]
    );
}

#[test]
fn allowed_cpus_outside_topology_are_ignored() {
    let topo = load("dev-2c");
    assert_eq!(
        plan(&topo, &set(&[1, 5, 100]), &ShardRequest::default()),
        [1]
    );
    assert!(matches!(
        plan_shards(&topo, &set(&[5, 100]), &ShardRequest::default()),
        Err(TopologyError::NoCpus)
    ));
    assert!(matches!(
        plan_shards(&topo, &CpuSet::new(), &auto(Some(1), None)),
        Err(TopologyError::NoCpus)
    ));
}

#[test]
fn explicit_cpus_are_returned_in_order() {
    let topo = load("dual-socket-smt");
    let all = topo.online();
    assert_eq!(plan(&topo, &all, &explicit(&[9, 1, 15])), [9, 1, 15]);
    let mut req = explicit(&[9, 1]);
    req.n_shards = Some(2);
    req.prefer_node = Some(1);
    assert_eq!(plan(&topo, &all, &req), [9, 1]);
}

#[test]
fn explicit_cpus_are_validated() {
    let topo = load("dual-socket-smt");
    let allowed = set(&[2, 3, 10]);
    assert!(matches!(
        plan_shards(&topo, &allowed, &explicit(&[2, 16])),
        Err(TopologyError::UnknownCpu { cpu: 16 })
    ));
    assert!(matches!(
        plan_shards(&topo, &allowed, &explicit(&[2, 4])),
        Err(TopologyError::CpuNotAllowed { cpu: 4 })
    ));
    assert!(matches!(
        plan_shards(&topo, &allowed, &explicit(&[2, 3, 2])),
        Err(TopologyError::DuplicateCpu { cpu: 2 })
    ));
    assert!(matches!(
        plan_shards(&topo, &allowed, &explicit(&[])),
        Err(TopologyError::ZeroShards)
    ));
    let mut req = explicit(&[2, 3]);
    req.n_shards = Some(1);
    assert!(matches!(
        plan_shards(&topo, &allowed, &req),
        Err(TopologyError::ShardCountMismatch {
            requested: 1,
            cpus: 2
        })
    ));
    req.n_shards = Some(0);
    assert!(matches!(
        plan_shards(&topo, &allowed, &req),
        Err(TopologyError::ZeroShards)
    ));
    req.n_shards = None;
    req.prefer_node = Some(7);
    assert!(matches!(
        plan_shards(&topo, &allowed, &req),
        Err(TopologyError::UnknownNode { node: 7 })
    ));
}

#[test]
fn count_errors() {
    let topo = load("h200-1s16c");
    let all = topo.online();
    assert!(matches!(
        plan_shards(&topo, &all, &auto(Some(0), None)),
        Err(TopologyError::ZeroShards)
    ));
    assert!(matches!(
        plan_shards(&topo, &all, &auto(Some(17), None)),
        Err(TopologyError::TooManyShards {
            requested: 17,
            available: 16
        })
    ));
    let err = plan_shards(&topo, &all, &auto(Some(17), None)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "17 shards requested but only 16 usable CPUs"
    );
}

#[test]
fn dev_box() {
    let topo = load("dev-2c");
    assert_eq!(
        plan(&topo, &topo.online(), &ShardRequest::default()),
        [0, 1]
    );
    assert_eq!(plan(&topo, &topo.online(), &auto(Some(1), Some(0))), [0]);
}

/// Every affinity mask of the dual-socket machine, every shard count: the plan is
/// valid, deterministic, and never uses a sibling while a core is unused.
#[test]
fn property_all_masks_dual_socket() {
    let topo = load("dual-socket-smt");
    let core_of = |id: usize| {
        let cpu = topo.cpu(id).unwrap();
        (cpu.package, cpu.core)
    };
    for mask in 0u32..(1 << 16) {
        let allowed: CpuSet = (0..16).filter(|i| mask & (1 << i) != 0).collect();
        let cores: BTreeSet<_> = allowed.iter().map(core_of).collect();
        // Default request: exactly one CPU per allowed physical core.
        match plan_shards(&topo, &allowed, &auto(None, Some((mask % 2) as usize))) {
            Ok(plan) => {
                assert_eq!(plan.len(), cores.len(), "mask {mask:#x}");
                let used: BTreeSet<_> = plan.cpus.iter().map(|&c| core_of(c)).collect();
                assert_eq!(used, cores, "mask {mask:#x}");
            }
            Err(TopologyError::NoCpus) => assert!(allowed.is_empty()),
            Err(e) => panic!("mask {mask:#x}: {e}"),
        }
        // Spot-check every count on a subset of masks (all counts is slow in debug).
        if mask % 97 != 0 {
            continue;
        }
        for n in 1..=17 {
            let req = auto(Some(n), Some(1));
            match plan_shards(&topo, &allowed, &req) {
                Ok(plan) => {
                    assert_eq!(plan, plan_shards(&topo, &allowed, &req).unwrap());
                    assert_eq!(plan.len(), n);
                    let distinct: BTreeSet<_> = plan.cpus.iter().copied().collect();
                    assert_eq!(distinct.len(), n);
                    assert!(plan.cpus.iter().all(|&c| allowed.contains(c)));
                    let used: BTreeSet<_> = plan.cpus.iter().map(|&c| core_of(c)).collect();
                    assert_eq!(used.len(), n.min(cores.len()), "mask {mask:#x} n {n}");
                }
                Err(TopologyError::TooManyShards {
                    requested,
                    available,
                }) => {
                    assert_eq!((requested, available), (n, allowed.len()));
                    assert!(n > allowed.len());
                }
                Err(TopologyError::NoCpus) => assert!(allowed.is_empty()),
                Err(e) => panic!("mask {mask:#x} n {n}: {e}"),
            }
        }
    }
}
