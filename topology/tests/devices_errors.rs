//! Device discovery on scratch trees: unknown and missing values, virtual devices, malformed files as typed errors.

mod common;

use std::path::Path;

use common::{minimal, scratch, write};
use morio_topology::{GpuVendor, Topology, TopologyError};

/// A two-CPU, two-node scratch tree (cpu0 on node 0, cpu1 on node 1).
fn two_nodes(name: &str) -> std::path::PathBuf {
    let root = minimal(name, 2);
    write(&root, "devices/system/node/node0/cpulist", b"0\n");
    write(&root, "devices/system/node/node0/distance", b"10 20\n");
    write(&root, "devices/system/node/node1/cpulist", b"1\n");
    write(&root, "devices/system/node/node1/distance", b"20 10\n");
    root
}

fn parse_error_file(sys: &Path, proc: Option<&Path>) -> String {
    match Topology::discover(sys, proc) {
        Err(TopologyError::Parse { path, detail }) => {
            assert!(!detail.is_empty());
            let base = proc.filter(|p| path.starts_with(p)).unwrap_or(sys);
            path.strip_prefix(base).unwrap().display().to_string()
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
}

#[test]
fn unknown_numa_node_and_speed() {
    let root = two_nodes("unknown_numa_node");
    write(&root, "class/net/eth0/device/numa_node", b"-1\n");
    write(&root, "class/net/eth0/speed", b"-1\n");
    write(&root, "class/net/eth1/device/vendor", b"0x8086\n"); // no numa_node, no speed
    write(&root, "class/net/eth2/device/numa_node", b"1\n");
    write(&root, "class/net/eth2/speed", b"25000\n");
    write(&root, "class/net/veth9/speed", b"10000\n"); // no device link: virtual
    let topo = Topology::discover(&root, None).unwrap();
    let nics: Vec<_> = topo
        .nics
        .iter()
        .map(|n| (n.name.as_str(), n.node, n.speed_mbps, n.irqs.len()))
        .collect();
    assert_eq!(
        nics,
        [
            ("eth0", None, None, 0),
            ("eth1", None, None, 0),
            ("eth2", Some(1), Some(25_000), 0)
        ]
    );
}

#[test]
fn unknown_numa_node_on_one_node_is_that_node() {
    let root = minimal("unknown_numa_one_node", 2);
    write(&root, "class/net/eth0/device/numa_node", b"-1\n");
    write(&root, "bus/pci/devices/0000:C1:00.0/class", b"0x038000\n");
    write(&root, "bus/pci/devices/0000:C1:00.0/vendor", b"0x1002\n");
    let topo = Topology::discover(&root, None).unwrap();
    assert_eq!(topo.nics[0].node, Some(0));
    let gpu = &topo.gpus[0];
    assert_eq!(gpu.vendor, GpuVendor::Amd);
    assert_eq!(gpu.bus_id, "0000:c1:00.0", "lower-cased");
    assert_eq!(gpu.node, Some(0), "missing numa_node on one node");
}

#[test]
fn pci_devices_without_class_or_vendor_are_skipped() {
    let root = minimal("pci_without_class", 1);
    write(&root, "bus/pci/devices/0000:01:00.0/vendor", b"0x10de\n");
    write(&root, "bus/pci/devices/0000:02:00.0/class", b"0x030000\n");
    let topo = Topology::discover(&root, None).unwrap();
    assert!(topo.gpus.is_empty());
}

#[test]
fn malformed_device_files() {
    let cases: [(&str, &[u8], &str); 7] = [
        ("class/net/eth0/device/numa_node", b"zero\n", "numa_node"),
        ("class/net/eth0/device/numa_node", b"-2\n", "numa_node"),
        ("class/net/eth0/speed", b"fast\n", "speed"),
        (
            "class/net/eth0/device/msi_irqs/abc",
            b"msix\n",
            "msi_irqs/abc",
        ),
        ("bus/pci/devices/0000:01:00.0/class", b"display\n", "class"),
        (
            "bus/pci/devices/0000:01:00.0/vendor",
            b"0xnvidia\n",
            "vendor",
        ),
        (
            "bus/pci/devices/0000:01:00.0/numa_node",
            b"1.5\n",
            "numa_node",
        ),
    ];
    for (i, (rel, content, file)) in cases.into_iter().enumerate() {
        let root = minimal(&format!("malformed_device_{i}"), 1);
        write(&root, "class/net/eth0/device/numa_node", b"0\n");
        write(&root, "bus/pci/devices/0000:01:00.0/class", b"0x030200\n");
        write(&root, "bus/pci/devices/0000:01:00.0/vendor", b"0x10de\n");
        write(&root, rel, content);
        let got = parse_error_file(&root, None);
        assert!(got.ends_with(file), "{rel}: {got}");
    }
}

#[test]
fn malformed_irq_affinity() {
    let root = minimal("malformed_affinity", 1);
    let proc = scratch("malformed_affinity_proc");
    write(&root, "class/net/eth0/device/msi_irqs/7", b"msix\n");
    write(&proc, "irq/7/smp_affinity_list", b"0-\n");
    assert_eq!(
        parse_error_file(&root, Some(&proc)),
        "irq/7/smp_affinity_list"
    );
    write(&proc, "irq/7/smp_affinity_list", b"0\n");
    let topo = Topology::discover(&root, Some(&proc)).unwrap();
    assert_eq!(topo.nics[0].irq_affinity[&7].to_string(), "0");
}

#[test]
fn malformed_topology_files() {
    let root = two_nodes("malformed_distance");
    write(&root, "devices/system/node/node1/distance", b"20 ten\n");
    assert_eq!(
        parse_error_file(&root, None),
        "devices/system/node/node1/distance"
    );
    write(&root, "devices/system/node/node1/distance", b"20 10 30\n");
    assert_eq!(
        parse_error_file(&root, None),
        "devices/system/node/node1/distance"
    );
    write(&root, "devices/system/node/node1/distance", b"20 10\n");
    write(
        &root,
        "devices/system/cpu/cpu0/topology/thread_siblings_list",
        b"0,x\n",
    );
    assert_eq!(
        parse_error_file(&root, None),
        "devices/system/cpu/cpu0/topology/thread_siblings_list"
    );
    // Offline siblings are dropped; the CPU itself is always its own sibling.
    write(
        &root,
        "devices/system/cpu/cpu0/topology/thread_siblings_list",
        b"4\n",
    );
    assert_eq!(
        Topology::from_sysfs(&root).unwrap().cpus[0]
            .siblings
            .to_string(),
        "0"
    );
}
