//! Helpers shared by the integration tests: fixture paths and scratch sysfs trees.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};

use morio_topology::Topology;

/// The root of the committed fixture tree `name`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("fixtures")
        .join(name)
}

/// Loads the committed fixture tree `name`.
pub fn load(name: &str) -> Topology {
    Topology::from_sysfs(&fixture(name)).unwrap()
}

/// A fresh, empty scratch directory unique to `name`.
pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("morio-topology")
        .join(name);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes `content` to `root/rel`, creating parent directories.
pub fn write(root: &Path, rel: &str, content: &[u8]) {
    let path = root.join(rel);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, content).unwrap();
}

/// A scratch tree with `n` online CPUs (own core each, package 0), no node dir.
pub fn minimal(name: &str, n: usize) -> PathBuf {
    let root = scratch(name);
    write(
        &root,
        "devices/system/cpu/online",
        format!("0-{}\n", n - 1).as_bytes(),
    );
    for i in 0..n {
        let dir = format!("devices/system/cpu/cpu{i}/topology");
        write(
            &root,
            &format!("{dir}/core_id"),
            format!("{i}\n").as_bytes(),
        );
        write(&root, &format!("{dir}/physical_package_id"), b"0\n");
    }
    root
}

/// The sysfs and proc roots of a committed machine fixture with devices.
pub fn roots(name: &str) -> (PathBuf, PathBuf) {
    match name {
        "h200-1s16c" => (fixture(name), fixture("h200-1s16c-proc")),
        _ => (fixture(name).join("sys"), fixture(name).join("proc")),
    }
}

/// Discovers the whole machine (CPUs, nodes, NICs, GPUs, IRQ affinity) of a fixture.
pub fn discover(name: &str) -> Topology {
    let (sys, proc) = roots(name);
    Topology::discover(&sys, Some(&proc)).unwrap()
}
