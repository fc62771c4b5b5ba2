//! `Topology::from_sysfs` on missing, malformed and inconsistent scratch trees: typed errors, never panics.

mod common;

use std::path::Path;

use common::{minimal, scratch, write};
use morio_topology::{Topology, TopologyError};

fn parse_error_file(root: &Path) -> String {
    match Topology::from_sysfs(root) {
        Err(TopologyError::Parse { path, detail }) => {
            assert!(!detail.is_empty());
            path.strip_prefix(root).unwrap().display().to_string()
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
}

#[test]
fn missing_root_is_io_error() {
    let root = scratch("missing_root").join("nope");
    match Topology::from_sysfs(&root) {
        Err(TopologyError::Io { path, .. }) => assert!(path.ends_with("devices/system/cpu/online")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn missing_core_id_is_io_error() {
    let root = minimal("missing_core_id", 2);
    std::fs::remove_file(root.join("devices/system/cpu/cpu1/topology/core_id")).unwrap();
    match Topology::from_sysfs(&root) {
        Err(TopologyError::Io { path, source }) => {
            assert!(path.ends_with("cpu1/topology/core_id"));
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn empty_online_is_no_cpus() {
    let root = scratch("empty_online");
    write(&root, "devices/system/cpu/online", b"\n");
    assert!(matches!(
        Topology::from_sysfs(&root),
        Err(TopologyError::NoCpus)
    ));
}

#[test]
fn malformed_online() {
    for (i, bad) in [
        &b"0-a\n"[..],
        b"3-1",
        b"0,,1",
        b"\xff\xfe",
        b"0-99999999999",
    ]
    .into_iter()
    .enumerate()
    {
        let root = minimal(&format!("malformed_online_{i}"), 2);
        write(&root, "devices/system/cpu/online", bad);
        assert_eq!(parse_error_file(&root), "devices/system/cpu/online");
    }
}

#[test]
fn malformed_ids() {
    for (i, bad) in [&b"x\n"[..], b"", b"-2", b"1.0", b"99999999999999999999999"]
        .into_iter()
        .enumerate()
    {
        let root = minimal(&format!("malformed_core_{i}"), 2);
        write(&root, "devices/system/cpu/cpu1/topology/core_id", bad);
        assert_eq!(
            parse_error_file(&root),
            "devices/system/cpu/cpu1/topology/core_id"
        );
        let root = minimal(&format!("malformed_pkg_{i}"), 2);
        write(
            &root,
            "devices/system/cpu/cpu0/topology/physical_package_id",
            bad,
        );
        assert_eq!(
            parse_error_file(&root),
            "devices/system/cpu/cpu0/topology/physical_package_id"
        );
    }
}

#[test]
fn minus_one_ids_mean_unknown() {
    let root = minimal("minus_one", 2);
    for i in 0..2 {
        write(
            &root,
            &format!("devices/system/cpu/cpu{i}/topology/core_id"),
            b"-1\n",
        );
        write(
            &root,
            &format!("devices/system/cpu/cpu{i}/topology/physical_package_id"),
            b"-1\n",
        );
    }
    let topo = Topology::from_sysfs(&root).unwrap();
    assert_eq!(topo, Topology::flat(2));
}

#[test]
fn malformed_node_cpulist() {
    let root = minimal("malformed_node", 2);
    write(&root, "devices/system/node/node0/cpulist", b"0-1,x\n");
    assert_eq!(parse_error_file(&root), "devices/system/node/node0/cpulist");
}

#[test]
fn missing_node_cpulist_is_io_error() {
    let root = minimal("missing_node_cpulist", 2);
    std::fs::create_dir_all(root.join("devices/system/node/node0")).unwrap();
    assert!(matches!(
        Topology::from_sysfs(&root),
        Err(TopologyError::Io { .. })
    ));
}

#[test]
fn cpu_in_two_nodes() {
    let root = minimal("cpu_in_two_nodes", 2);
    write(&root, "devices/system/node/node0/cpulist", b"0-1\n");
    write(&root, "devices/system/node/node1/cpulist", b"1\n");
    assert_eq!(parse_error_file(&root), "devices/system/node/node1/cpulist");
}

#[test]
fn online_cpu_in_no_node() {
    let root = minimal("cpu_in_no_node", 2);
    write(&root, "devices/system/node/node0/cpulist", b"0\n");
    assert_eq!(parse_error_file(&root), "devices/system/node");
}

#[test]
fn node_dir_without_nodes_means_one_node() {
    let root = minimal("node_dir_no_nodes", 2);
    write(&root, "devices/system/node/online", b"0\n");
    write(&root, "devices/system/node/nodeX/cpulist", b"garbage\n");
    assert_eq!(Topology::from_sysfs(&root).unwrap(), Topology::flat(2));
}

#[test]
fn offline_cpus_are_left_out() {
    // cpu1 offline: no topology dir, but still in the node's cpulist.
    let root = minimal("offline", 3);
    write(&root, "devices/system/cpu/online", b"0,2\n");
    std::fs::remove_dir_all(root.join("devices/system/cpu/cpu1")).unwrap();
    write(&root, "devices/system/node/node0/cpulist", b"0-2\n");
    write(&root, "devices/system/node/node2/cpulist", b"\n"); // memory-only node
    let topo = Topology::from_sysfs(&root).unwrap();
    let ids: Vec<usize> = topo.cpus.iter().map(|c| c.id).collect();
    assert_eq!(ids, [0, 2]);
    assert_eq!(topo.nodes.len(), 2);
    assert_eq!(topo.nodes[0].cpus.to_string(), "0,2");
    assert_eq!(topo.nodes[1].id, 2);
    assert!(topo.nodes[1].cpus.is_empty());
}

#[test]
fn error_messages_name_the_file() {
    let root = minimal("error_message", 1);
    write(&root, "devices/system/cpu/cpu0/topology/core_id", b"zz\n");
    let err = Topology::from_sysfs(&root).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("core_id") && text.contains("zz"), "{text}");
}
