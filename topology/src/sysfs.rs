//! Reading a [`Topology`] from a sysfs tree whose root is a parameter (never a hard-coded `/sys`).

use std::collections::BTreeMap;
use std::path::Path;

use crate::cpulist::CpuSet;
use crate::device::{read_gpus, read_nics};
use crate::error::TopologyError;
use crate::model::{Cpu, NumaNode, Topology};
use crate::read::{cpu_list_at, dir_names, parse_error, read_cpu_list, read_id, read_text_opt};

impl Topology {
    /// Reads the CPUs and NUMA nodes from the sysfs tree under `root` (the
    /// directory that contains `devices/system/...`; `/sys` on a live
    /// machine). `nics` and `gpus` are left empty (see [`Topology::discover`]).
    ///
    /// Reads `devices/system/cpu/online`, then for each online CPU
    /// `devices/system/cpu/cpuN/topology/{core_id,physical_package_id}` and,
    /// where present, `thread_siblings_list`; and each
    /// `devices/system/node/nodeN/{cpulist,distance}` (`distance` optional).
    /// Without a node directory (or with no `nodeN` in it) every CPU is on
    /// node 0, at distance 10 from itself. Node CPU lists and sibling lists
    /// are restricted to online CPUs. An id of `-1` (which some platforms
    /// report for unknown values) means package 0, or for `core_id` a core of
    /// its own (the CPU's id).
    ///
    /// # Errors
    ///
    /// - [`TopologyError::Io`] when a needed file or directory is unreadable
    ///   (including a missing `online` or `cpuN/topology/*` file);
    /// - [`TopologyError::Parse`] when a file's content is malformed, a CPU
    ///   is in two nodes, an online CPU is in no node, or a distance row's
    ///   length differs from the number of nodes;
    /// - [`TopologyError::NoCpus`] when no CPU is online.
    pub fn from_sysfs(root: &Path) -> Result<Topology, TopologyError> {
        let cpu_dir = root.join("devices").join("system").join("cpu");
        let online = read_cpu_list(&cpu_dir.join("online"))?;
        if online.is_empty() {
            return Err(TopologyError::NoCpus);
        }

        let node_dir = root.join("devices").join("system").join("node");
        let nodes = match read_nodes(&node_dir, &online)? {
            Some(nodes) => nodes,
            None => vec![NumaNode {
                id: 0,
                cpus: online.clone(),
                distances: vec![10],
            }],
        };

        let mut node_of = BTreeMap::new();
        for node in &nodes {
            for cpu in &node.cpus {
                if let Some(other) = node_of.insert(cpu, node.id) {
                    return Err(parse_error(
                        &node_dir.join(format!("node{}", node.id)).join("cpulist"),
                        format!("CPU {cpu} is also listed in node {other}"),
                    ));
                }
            }
        }

        let mut cpus = Vec::with_capacity(online.len());
        let mut listed = BTreeMap::new();
        for id in &online {
            let topo_dir = cpu_dir.join(format!("cpu{id}")).join("topology");
            let core = read_id(&topo_dir.join("core_id"), id)?;
            let package = read_id(&topo_dir.join("physical_package_id"), 0)?;
            let Some(&node) = node_of.get(&id) else {
                return Err(parse_error(
                    &node_dir,
                    format!("online CPU {id} is in no node's cpulist"),
                ));
            };
            let siblings_path = topo_dir.join("thread_siblings_list");
            if let Some(text) = read_text_opt(&siblings_path)? {
                listed.insert(id, cpu_list_at(&siblings_path, &text)?);
            }
            cpus.push(Cpu {
                id,
                core,
                package,
                node,
                siblings: CpuSet::new(),
            });
        }
        fill_siblings(&mut cpus, &online, listed);
        Ok(Topology {
            cpus,
            nodes,
            ..Topology::default()
        })
    }

    /// Reads the whole machine: [`Topology::from_sysfs`] on `sysfs_root`,
    /// then the physical NICs under `class/net` and the NVIDIA/AMD GPUs
    /// under `bus/pci/devices`, and, with a `proc_root` (`/proc` on a live
    /// machine), each NIC IRQ's `irq/N/smp_affinity_list`.
    ///
    /// Missing `class/net`, `bus/pci/devices`, `msi_irqs`, `numa_node`,
    /// `speed` or proc files mean no such devices or unknown values, not
    /// errors; symbolic links and plain directories read the same.
    ///
    /// # Errors
    ///
    /// As [`Topology::from_sysfs`], plus [`TopologyError::Parse`] for a
    /// malformed device file (`numa_node`, `speed`, `class`, `vendor`, an
    /// `msi_irqs` entry, an affinity list) and [`TopologyError::Io`] for an
    /// unreadable device directory.
    pub fn discover(
        sysfs_root: &Path,
        proc_root: Option<&Path>,
    ) -> Result<Topology, TopologyError> {
        let mut topo = Topology::from_sysfs(sysfs_root)?;
        let single = match topo.nodes.as_slice() {
            [only] => Some(only.id),
            _ => None,
        };
        topo.nics = read_nics(sysfs_root, proc_root, single)?;
        topo.gpus = read_gpus(sysfs_root, single)?;
        Ok(topo)
    }
}

/// Sets each CPU's siblings: its `thread_siblings_list` (online part, plus
/// itself) where read, else the online CPUs sharing its `(package, core)`.
fn fill_siblings(cpus: &mut [Cpu], online: &CpuSet, mut listed: BTreeMap<usize, CpuSet>) {
    let mut by_core: BTreeMap<(usize, usize), CpuSet> = BTreeMap::new();
    for cpu in cpus.iter() {
        by_core
            .entry((cpu.package, cpu.core))
            .or_default()
            .insert(cpu.id);
    }
    for cpu in cpus.iter_mut() {
        cpu.siblings = match listed.remove(&cpu.id) {
            Some(list) => {
                let mut set = list.intersection(online);
                set.insert(cpu.id);
                set
            }
            None => by_core
                .get(&(cpu.package, cpu.core))
                .cloned()
                .unwrap_or_default(),
        };
    }
}

/// The `nodeN` directories under `dir`, each with its online CPUs and its
/// distance row, sorted by id; `None` when `dir` does not exist or holds no
/// `nodeN`.
fn read_nodes(dir: &Path, online: &CpuSet) -> Result<Option<Vec<NumaNode>>, TopologyError> {
    let Some(names) = dir_names(dir)? else {
        return Ok(None);
    };
    let mut ids = Vec::new();
    for name in names {
        let Some(digits) = name.strip_prefix("node") else {
            continue;
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let id = digits
            .parse::<usize>()
            .map_err(|_| parse_error(&dir.join(&name), "node number out of range".to_owned()))?;
        ids.push(id);
    }
    if ids.is_empty() {
        return Ok(None);
    }
    ids.sort_unstable();
    ids.dedup();
    let mut nodes = Vec::with_capacity(ids.len());
    for &id in &ids {
        let node_dir = dir.join(format!("node{id}"));
        let cpus = read_cpu_list(&node_dir.join("cpulist"))?;
        let distances = read_distances(&node_dir.join("distance"), ids.len())?;
        nodes.push(NumaNode {
            id,
            cpus: cpus.intersection(online),
            distances,
        });
    }
    Ok(Some(nodes))
}

/// A `distance` row (`"10 21\n"`); empty when the file is missing.
fn read_distances(path: &Path, n_nodes: usize) -> Result<Vec<u32>, TopologyError> {
    let Some(text) = read_text_opt(path)? else {
        return Ok(Vec::new());
    };
    let row = text
        .split_whitespace()
        .map(|word| {
            word.parse::<u32>()
                .map_err(|_| parse_error(path, format!("{word:?} is not a distance")))
        })
        .collect::<Result<Vec<u32>, TopologyError>>()?;
    if !row.is_empty() && row.len() != n_nodes {
        return Err(parse_error(
            path,
            format!("{} distances for {n_nodes} nodes", row.len()),
        ));
    }
    Ok(row)
}
