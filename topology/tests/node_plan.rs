//! `plan_node` on the fixtures and synthetic machines: NIC/GPU-driven nodes, IRQ cores, shard spill, affinity, errors.

mod common;

use std::collections::BTreeSet;

use common::discover;
use morio_topology::{
    plan_node, Cpu, CpuSet, NodePlan, NodePlanRequest, NumaNode, Topology, TopologyError,
};

fn set(text: &str) -> CpuSet {
    text.parse().unwrap()
}

fn ids(text: &str) -> Vec<usize> {
    set(text).iter().collect()
}

fn nic(name: &str) -> NodePlanRequest {
    NodePlanRequest {
        nic: Some(name.to_owned()),
        ..NodePlanRequest::default()
    }
}

/// The plan's invariants: disjoint lists covering the usable CPUs, one shard per core.
fn check(topo: &Topology, allowed: &CpuSet, plan: &NodePlan) {
    let mut all: Vec<usize> = plan.irq_cpus.clone();
    all.extend(&plan.shard_cpus);
    all.extend(&plan.app_cpus);
    all.sort_unstable();
    let usable: Vec<usize> = topo.online().intersection(allowed).iter().collect();
    assert_eq!(all, usable, "partition of the usable CPUs: {plan:?}");
    let mut cores = BTreeSet::new();
    for &cpu in &plan.shard_cpus {
        let siblings = &topo.cpu(cpu).unwrap().siblings;
        assert!(
            cores.insert(siblings.to_string()),
            "shards share a core: {plan:?}"
        );
        for &irq in &plan.irq_cpus {
            assert!(!siblings.contains(irq), "shard {cpu} beside IRQ CPU {irq}");
        }
    }
}

fn plan(topo: &Topology, allowed: &CpuSet, req: &NodePlanRequest) -> NodePlan {
    let plan = plan_node(topo, allowed, req).unwrap();
    check(topo, allowed, &plan);
    assert_eq!(
        plan_node(topo, allowed, req).unwrap(),
        plan,
        "deterministic"
    );
    plan
}

#[test]
fn nic_on_node_one_uses_node_one() {
    let topo = discover("2s-smt-8gpu-8nic");
    let p = plan(&topo, &topo.online(), &nic("eth5"));
    assert_eq!(p.node, Some(1));
    assert_eq!(p.nic.as_deref(), Some("eth5"));
    assert_eq!(p.gpu, None);
    assert_eq!(p.irq_cpus, [16, 48], "first core of node 1 and its sibling");
    assert_eq!(p.shard_cpus, ids("17-31"));
    assert_eq!(p.app_cpus, ids("0-15,32-47,49-63"));
}

#[test]
fn gpu_driven_plan() {
    let topo = discover("2s-smt-8gpu-8nic");
    let req = NodePlanRequest {
        gpu: Some("3A:00.0".to_owned()),
        ..NodePlanRequest::default()
    };
    let p = plan(&topo, &topo.online(), &req);
    assert_eq!((p.node, p.gpu.as_deref()), (Some(0), Some("0000:3a:00.0")));
    assert_eq!(p.irq_cpus, [0, 32]);
    assert_eq!(p.shard_cpus, ids("1-15"));
    // With a NIC too, the NIC's node wins.
    let req = NodePlanRequest {
        nic: Some("eth6".to_owned()),
        ..req
    };
    let p = plan(&topo, &topo.online(), &req);
    assert_eq!(p.node, Some(1));
    assert_eq!(p.irq_cpus, [16, 48]);
}

#[test]
fn shard_and_irq_counts() {
    let topo = discover("2s-smt-8gpu-8nic");
    let all = topo.online();
    let with = |n_shards, n_irq_cpus| NodePlanRequest {
        n_shards,
        n_irq_cpus,
        ..nic("eth4")
    };
    // Too many for node 1: spill to node 0's cores, still one per core.
    let p = plan(&topo, &all, &with(Some(20), None));
    assert_eq!(p.shard_cpus[..15], ids("17-31"));
    assert_eq!(p.shard_cpus[15..], [0, 1, 2, 3, 4]);
    assert_eq!(p.irq_cpus, [16, 48]);
    let p = plan(&topo, &all, &with(Some(4), None));
    assert_eq!(p.shard_cpus, [17, 18, 19, 20]);
    let p = plan(&topo, &all, &with(None, Some(4)));
    assert_eq!(
        (p.irq_cpus, p.shard_cpus),
        (vec![16, 17, 48, 49], ids("18-31"))
    );
    // One IRQ CPU: its sibling is not a shard, it goes to the application.
    let p = plan(&topo, &all, &with(None, Some(1)));
    assert_eq!((p.irq_cpus, p.shard_cpus), (vec![16], ids("17-31")));
    assert!(p.app_cpus.contains(&48));
    let p = plan(&topo, &all, &with(None, Some(0)));
    assert!(p.irq_cpus.is_empty());
    assert_eq!(p.shard_cpus, ids("16-31"));
    // Every physical core.
    let p = plan(&topo, &all, &with(Some(31), None));
    assert_eq!(p.shard_cpus.len(), 31);
}

#[test]
fn affinity_restriction_is_respected() {
    let topo = discover("2s-smt-8gpu-8nic");
    // Part of node 1: cores 20-27 with their siblings.
    let allowed = set("20-27,52-59");
    let p = plan(&topo, &allowed, &nic("eth4"));
    assert_eq!(p.irq_cpus, [20, 52]);
    assert_eq!(p.shard_cpus, ids("21-27"));
    assert_eq!(p.app_cpus, ids("53-59"));
    // Part of node 1 without siblings: the IRQ core has one thread.
    let allowed = set("16-23");
    let p = plan(&topo, &allowed, &nic("eth4"));
    assert_eq!((p.irq_cpus, p.shard_cpus), (vec![16], ids("17-23")));
    assert!(p.app_cpus.is_empty());
    // Only node 0 allowed for a node-1 NIC: everything spills to node 0.
    let allowed = set("0-15,32-47");
    let p = plan(&topo, &allowed, &nic("eth7"));
    assert_eq!(p.node, Some(1));
    assert_eq!((p.irq_cpus, p.shard_cpus), (vec![0, 32], ids("1-15")));
    // CPUs outside the machine are ignored.
    let p = plan(&topo, &set("16-19,200-300"), &nic("eth4"));
    assert_eq!((p.irq_cpus, p.shard_cpus), (vec![16], ids("17-19")));
}

#[test]
fn h200_and_small_machines() {
    let topo = discover("h200-1s16c");
    let p = plan(&topo, &topo.online(), &nic("eth0"));
    assert_eq!((p.node, p.irq_cpus.clone()), (Some(0), vec![0]));
    assert_eq!(p.shard_cpus, ids("1-15"));
    // No device: node unknown, planned from the lowest node.
    let p = plan(&topo, &topo.online(), &NodePlanRequest::default());
    assert_eq!(
        (p.node, p.irq_cpus, p.shard_cpus.len()),
        (None, vec![0], 15)
    );
    let two = Topology::flat(2);
    let p = plan(&two, &two.online(), &NodePlanRequest::default());
    assert_eq!((p.irq_cpus, p.shard_cpus), (vec![0], vec![1]));
    // One core: no CPU is set aside for IRQs by default.
    let one = Topology::flat(1);
    let p = plan(&one, &one.online(), &NodePlanRequest::default());
    assert_eq!((p.irq_cpus, p.shard_cpus), (vec![], vec![0]));
}

/// Three nodes of two single-thread CPUs; node 2 is nearer node 0 than node 1 is.
fn three_nodes() -> Topology {
    let cpus = (0..6)
        .map(|id| Cpu {
            id,
            core: id,
            package: id / 2,
            node: id / 2,
            siblings: [id].into_iter().collect(),
        })
        .collect();
    let rows = [vec![10, 30, 15], vec![30, 10, 30], vec![15, 30, 10]];
    let nodes = rows
        .into_iter()
        .enumerate()
        .map(|(id, distances)| NumaNode {
            id,
            cpus: [2 * id, 2 * id + 1].into_iter().collect(),
            distances,
        })
        .collect();
    let mut topo = Topology {
        cpus,
        nodes,
        ..Topology::default()
    };
    let mut nic = discover("h200-1s16c").nics.remove(0);
    nic.node = Some(0);
    topo.nics.push(nic);
    topo
}

#[test]
fn spill_follows_distance() {
    let topo = three_nodes();
    let req = NodePlanRequest {
        n_shards: Some(4),
        ..nic("eth0")
    };
    let p = plan(&topo, &topo.online(), &req);
    assert_eq!(p.irq_cpus, [0]);
    assert_eq!(
        p.shard_cpus,
        [1, 4, 5, 2],
        "node 0, then node 2 (15), then node 1 (30)"
    );
    // Node 0 not allowed: IRQs go to the nearest node with CPUs.
    let p = plan(&topo, &set("2-5"), &nic("eth0"));
    assert_eq!((p.irq_cpus, p.shard_cpus), (vec![4], vec![5]));
}

#[test]
fn errors_are_typed() {
    let topo = discover("2s-smt-8gpu-8nic");
    let all = topo.online();
    let err = |allowed: &CpuSet, req: NodePlanRequest| plan_node(&topo, allowed, &req).unwrap_err();
    assert!(matches!(
        err(&all, nic("eth9")),
        TopologyError::UnknownNic { name } if name == "eth9"
    ));
    assert!(matches!(
        err(&all, nic("lo")),
        TopologyError::UnknownNic { .. }
    ));
    let gpu = NodePlanRequest {
        gpu: Some("0000:05:00.0".to_owned()),
        ..NodePlanRequest::default()
    };
    assert!(matches!(
        err(&all, gpu),
        TopologyError::UnknownGpu { bus_id } if bus_id == "0000:05:00.0"
    ));
    assert!(matches!(
        err(&CpuSet::new(), nic("eth0")),
        TopologyError::NoCpus
    ));
    assert!(matches!(
        err(&set("64-70"), nic("eth0")),
        TopologyError::NoCpus
    ));
    let shards = |n| NodePlanRequest {
        n_shards: Some(n),
        ..nic("eth0")
    };
    assert!(matches!(err(&all, shards(0)), TopologyError::ZeroShards));
    assert!(matches!(
        err(&all, shards(32)),
        TopologyError::TooManyShards {
            requested: 32,
            available: 31
        }
    ));
    let irqs = |n| NodePlanRequest {
        n_irq_cpus: Some(n),
        ..nic("eth0")
    };
    assert!(matches!(
        err(&all, irqs(65)),
        TopologyError::TooManyIrqCpus {
            requested: 65,
            available: 64
        }
    ));
    assert!(matches!(
        err(&all, irqs(64)),
        TopologyError::TooManyShards {
            requested: 1,
            available: 0
        }
    ));
    // A device on a node the topology lacks.
    let mut odd = topo.clone();
    odd.nics[0].node = Some(7);
    assert!(matches!(
        plan_node(&odd, &all, &nic("eth0")),
        Err(TopologyError::UnknownNode { node: 7 })
    ));
}

#[test]
fn every_sampled_mask_keeps_the_invariants() {
    let topo = discover("2s-smt-8gpu-8nic");
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    for round in 0..300 {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        let allowed: CpuSet = (0..64).filter(|i| (state >> (i % 64)) & 1 == 1).collect();
        let req = NodePlanRequest {
            nic: Some(format!("eth{}", round % 8)),
            n_irq_cpus: (round % 3 == 0).then_some(round % 5),
            ..NodePlanRequest::default()
        };
        match plan_node(&topo, &allowed, &req) {
            Ok(p) => check(&topo, &allowed, &p),
            Err(e) => assert!(
                matches!(
                    e,
                    TopologyError::NoCpus
                        | TopologyError::TooManyShards { .. }
                        | TopologyError::TooManyIrqCpus { .. }
                ),
                "{e:?}"
            ),
        }
    }
}
