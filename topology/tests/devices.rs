//! `Topology::discover` on the fixtures: SMT siblings, NUMA distances, NICs, GPUs and IRQ affinity.

mod common;

use common::{discover, roots};
use morio_topology::{GpuVendor, Topology};

fn list(set: Option<&morio_topology::CpuSet>) -> Option<String> {
    set.map(ToString::to_string)
}

#[test]
fn h200_nic_gpu_and_irq_affinity() {
    let topo = discover("h200-1s16c");
    assert_eq!(topo.cpus.len(), 16);
    assert_eq!(topo.nodes[0].distances, [10]);
    // lo and docker0 have no device link; eth0's numa_node is -1 on one node.
    let names: Vec<&str> = topo.nics.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["eth0"]);
    let eth0 = topo.nic("eth0").unwrap();
    assert_eq!(eth0.node, Some(0));
    assert_eq!(eth0.speed_mbps, Some(100_000));
    assert_eq!(eth0.irqs, [45, 46, 47, 48]);
    assert_eq!(list(eth0.irq_affinity.get(&45)).as_deref(), Some("0-15"));
    assert_eq!(list(eth0.irq_affinity.get(&46)).as_deref(), Some("1"));
    assert_eq!(list(eth0.irq_affinity.get(&47)).as_deref(), Some("2-3,8"));
    assert!(!eth0.irq_affinity.contains_key(&48), "no proc entry");
    // The ASPEED VGA, the bridge and the NIC function are not GPUs.
    assert_eq!(topo.gpus.len(), 1);
    let gpu = &topo.gpus[0];
    assert_eq!(
        (gpu.vendor, gpu.bus_id.as_str(), gpu.node),
        (GpuVendor::Nvidia, "0000:18:00.0", Some(0))
    );
    assert_eq!(topo.gpu("18:00.0"), Some(gpu));
}

#[test]
fn without_proc_root_there_is_no_affinity() {
    let (sys, _) = roots("h200-1s16c");
    let topo = Topology::discover(&sys, None).unwrap();
    assert!(topo.nic("eth0").unwrap().irq_affinity.is_empty());
    // from_sysfs reads CPUs and nodes only.
    let plain = Topology::from_sysfs(&sys).unwrap();
    assert!(plain.nics.is_empty() && plain.gpus.is_empty());
    assert_eq!(plain.cpus, topo.cpus);
}

#[test]
fn two_socket_cpus_siblings_and_distances() {
    let topo = discover("2s-smt-8gpu-8nic");
    assert_eq!(topo.cpus.len(), 64);
    assert_eq!(topo.physical_cores(), 32);
    assert_eq!(topo.nodes.len(), 2);
    assert_eq!(topo.nodes[0].cpus.to_string(), "0-15,32-47");
    assert_eq!(topo.nodes[1].cpus.to_string(), "16-31,48-63");
    assert_eq!(topo.nodes[0].distances, [10, 21]);
    assert_eq!(topo.nodes[1].distances, [21, 10]);
    assert_eq!(topo.distance(1, 0), Some(21));
    assert_eq!(topo.distance(1, 2), None);
    for cpu in &topo.cpus {
        let first = cpu.id % 32;
        assert_eq!(cpu.siblings.to_string(), format!("{first},{}", first + 32));
        assert_eq!(cpu.node, first / 16, "cpu{}", cpu.id);
        assert_eq!(cpu.package, first / 16, "cpu{}", cpu.id);
    }
}

#[test]
fn two_socket_nics_and_gpus() {
    let topo = discover("2s-smt-8gpu-8nic");
    let nics: Vec<(&str, Option<usize>)> = topo
        .nics
        .iter()
        .map(|n| (n.name.as_str(), n.node))
        .collect();
    let expected: Vec<(String, Option<usize>)> =
        (0..8).map(|i| (format!("eth{i}"), Some(i / 4))).collect();
    let expected: Vec<(&str, Option<usize>)> = expected
        .iter()
        .map(|(n, node)| (n.as_str(), *node))
        .collect();
    assert_eq!(nics, expected, "lo, docker0 and bond0 are virtual");
    for (i, nic) in topo.nics.iter().enumerate() {
        let base = 100 + 10 * i as u32;
        assert_eq!(nic.irqs, [base, base + 1, base + 2, base + 3]);
        assert_eq!(nic.speed_mbps, Some(400_000));
        let want = if i < 4 { "0-15,32-47" } else { "16-31,48-63" };
        for irq in &nic.irqs {
            if (i, *irq) != (7, 173) {
                assert_eq!(list(nic.irq_affinity.get(irq)).as_deref(), Some(want));
            }
        }
    }
    assert!(!topo.nic("eth7").unwrap().irq_affinity.contains_key(&173));

    let gpus: Vec<(&str, Option<usize>)> = topo
        .gpus
        .iter()
        .map(|g| (g.bus_id.as_str(), g.node))
        .collect();
    assert_eq!(
        gpus,
        [
            ("0000:18:00.0", Some(0)),
            ("0000:2a:00.0", Some(0)),
            ("0000:3a:00.0", Some(0)),
            ("0000:5d:00.0", Some(0)),
            ("0000:9a:00.0", Some(1)),
            ("0000:ab:00.0", Some(1)),
            ("0000:ba:00.0", Some(1)),
            ("0000:db:00.0", Some(1)),
        ],
        "NVSwitch (0x0680) and ASPEED VGA are not GPUs"
    );
    assert!(topo.gpus.iter().all(|g| g.vendor == GpuVendor::Nvidia));
    assert_eq!(topo.gpu("0000:AB:00.0").map(|g| g.node), Some(Some(1)));
    assert!(topo.gpu("0000:05:00.0").is_none());
}

#[test]
fn old_fixtures_discover_without_devices() {
    for name in ["dual-socket-smt", "dev-2c"] {
        let root = common::fixture(name);
        let topo = Topology::discover(&root, Some(&root.join("no-proc"))).unwrap();
        assert!(topo.nics.is_empty() && topo.gpus.is_empty(), "{name}");
        assert_eq!(topo.cpus, Topology::from_sysfs(&root).unwrap().cpus);
    }
    // dual-socket-smt has no distance files: unknown, not an error.
    let topo = common::load("dual-socket-smt");
    assert!(topo.nodes.iter().all(|n| n.distances.is_empty()));
    assert_eq!(topo.cpu(1).unwrap().siblings.to_string(), "1,9");
    // dev-2c has no thread_siblings_list: siblings come from (package, core).
    assert_eq!(
        common::load("dev-2c").cpu(1).unwrap().siblings.to_string(),
        "1"
    );
}
