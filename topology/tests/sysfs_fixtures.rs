//! Reading each committed fixture sysfs tree into a `Topology`.

mod common;

use common::load;
use morio_topology::{Cpu, Topology};

#[test]
fn h200_one_socket_sixteen_cores() {
    let topo = load("h200-1s16c");
    assert_eq!(topo.cpus.len(), 16);
    assert_eq!(topo.physical_cores(), 16);
    assert_eq!(topo.nodes.len(), 1);
    assert_eq!(topo.nodes[0].id, 0);
    assert_eq!(topo.nodes[0].cpus.to_string(), "0-15");
    for (i, cpu) in topo.cpus.iter().enumerate() {
        assert_eq!(
            *cpu,
            Cpu {
                id: i,
                core: i,
                package: 0,
                node: 0,
                siblings: [i].into_iter().collect(),
            }
        );
    }
}

#[test]
fn dual_socket_smt() {
    let topo = load("dual-socket-smt");
    assert_eq!(topo.cpus.len(), 16);
    assert_eq!(topo.physical_cores(), 8);
    let node_ids: Vec<usize> = topo.nodes.iter().map(|n| n.id).collect();
    assert_eq!(node_ids, [0, 1]);
    assert_eq!(topo.nodes[0].cpus.to_string(), "0-3,8-11");
    assert_eq!(topo.nodes[1].cpus.to_string(), "4-7,12-15");
    for cpu in &topo.cpus {
        let package = (cpu.id / 4) % 2;
        assert_eq!(cpu.package, package, "cpu{}", cpu.id);
        assert_eq!(cpu.core, cpu.id % 4, "cpu{}", cpu.id);
        assert_eq!(cpu.node, package, "cpu{}", cpu.id);
    }
    // cpu9 is the SMT sibling of cpu1.
    let (a, b) = (topo.cpu(1).unwrap(), topo.cpu(9).unwrap());
    assert_eq!((a.package, a.core), (b.package, b.core));
}

#[test]
fn dev_two_cpus_without_node_dir_is_one_node() {
    let topo = load("dev-2c");
    assert_eq!(topo.cpus.len(), 2);
    assert_eq!(topo.nodes.len(), 1);
    assert_eq!(topo.nodes[0].id, 0);
    assert_eq!(topo.nodes[0].cpus.to_string(), "0-1");
    assert!(topo.cpus.iter().all(|c| c.node == 0 && c.package == 0));
    assert_eq!(topo.physical_cores(), 2);
}

#[test]
fn fixtures_are_sorted_and_consistent() {
    for name in ["h200-1s16c", "dual-socket-smt", "dev-2c"] {
        let topo = load(name);
        assert!(topo.cpus.windows(2).all(|w| w[0].id < w[1].id), "{name}");
        assert!(topo.nodes.windows(2).all(|w| w[0].id < w[1].id), "{name}");
        for cpu in &topo.cpus {
            assert!(topo.node(cpu.node).unwrap().cpus.contains(cpu.id), "{name}");
        }
        let total: usize = topo.nodes.iter().map(|n| n.cpus.len()).sum();
        assert_eq!(total, topo.cpus.len(), "{name}");
    }
}

#[test]
fn flat_matches_fixture_without_nodes() {
    // dev-2c has no SMT and no node dir: exactly the synthetic flat machine.
    assert_eq!(load("dev-2c"), Topology::flat(2));
}
