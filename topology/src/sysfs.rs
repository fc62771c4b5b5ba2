//! Reading a [`Topology`] from a sysfs tree whose root is a parameter (never a hard-coded `/sys`).

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::cpulist::{parse_cpu_list, CpuSet};
use crate::error::TopologyError;
use crate::model::{Cpu, NumaNode, Topology};

impl Topology {
    /// Reads the topology from the sysfs tree under `root` (the directory
    /// that contains `devices/system/...`; `/sys` on a live machine).
    ///
    /// Reads `devices/system/cpu/online`, then for each online CPU
    /// `devices/system/cpu/cpuN/topology/{core_id,physical_package_id}`, and
    /// each `devices/system/node/nodeN/cpulist`. Without a node directory (or
    /// with no `nodeN` in it) every CPU is on node 0. Node CPU lists are
    /// restricted to online CPUs. An id of `-1` (which some platforms report
    /// for unknown values) means package 0, or for `core_id` a core of its
    /// own (the CPU's id).
    ///
    /// # Errors
    ///
    /// - [`TopologyError::Io`] when a needed file or directory is unreadable
    ///   (including a missing `online` or `cpuN/topology/*` file);
    /// - [`TopologyError::Parse`] when a file's content is malformed, a CPU
    ///   is in two nodes, or an online CPU is in no node;
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
            }],
        };

        let mut node_of = BTreeMap::new();
        for node in &nodes {
            for cpu in &node.cpus {
                if let Some(other) = node_of.insert(cpu, node.id) {
                    return Err(TopologyError::Parse {
                        path: node_dir.join(format!("node{}", node.id)).join("cpulist"),
                        detail: format!("CPU {cpu} is also listed in node {other}"),
                    });
                }
            }
        }

        let mut cpus = Vec::with_capacity(online.len());
        for id in &online {
            let topo_dir = cpu_dir.join(format!("cpu{id}")).join("topology");
            let core = read_id(&topo_dir.join("core_id"), id)?;
            let package = read_id(&topo_dir.join("physical_package_id"), 0)?;
            let Some(&node) = node_of.get(&id) else {
                return Err(TopologyError::Parse {
                    path: node_dir,
                    detail: format!("online CPU {id} is in no node's cpulist"),
                });
            };
            cpus.push(Cpu {
                id,
                core,
                package,
                node,
            });
        }
        Ok(Topology { cpus, nodes })
    }
}

/// The `nodeN` directories under `dir`, each with its online CPUs, sorted by
/// id; `None` when `dir` does not exist or holds no `nodeN`.
fn read_nodes(dir: &Path, online: &CpuSet) -> Result<Option<Vec<NumaNode>>, TopologyError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(io_error(dir, source)),
    };
    let mut ids = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| io_error(dir, source))?;
        let name = entry.file_name();
        let Some(digits) = name.to_str().and_then(|n| n.strip_prefix("node")) else {
            continue;
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let id = digits.parse::<usize>().map_err(|_| TopologyError::Parse {
            path: entry.path(),
            detail: "node number out of range".to_owned(),
        })?;
        ids.push(id);
    }
    if ids.is_empty() {
        return Ok(None);
    }
    ids.sort_unstable();
    ids.dedup();
    let mut nodes = Vec::with_capacity(ids.len());
    for id in ids {
        let cpus = read_cpu_list(&dir.join(format!("node{id}")).join("cpulist"))?;
        nodes.push(NumaNode {
            id,
            cpus: cpus.intersection(online),
        });
    }
    Ok(Some(nodes))
}

fn read_text(path: &Path) -> Result<String, TopologyError> {
    let bytes = fs::read(path).map_err(|source| io_error(path, source))?;
    String::from_utf8(bytes).map_err(|_| TopologyError::Parse {
        path: path.to_owned(),
        detail: "not valid UTF-8".to_owned(),
    })
}

fn read_cpu_list(path: &Path) -> Result<CpuSet, TopologyError> {
    parse_cpu_list(&read_text(path)?).map_err(|e| match e {
        TopologyError::InvalidCpuList { detail, .. } => TopologyError::Parse {
            path: path.to_owned(),
            detail,
        },
        other => other,
    })
}

/// Reads a non-negative id, or `-1` meaning "unknown" (then `if_unknown`).
fn read_id(path: &Path, if_unknown: usize) -> Result<usize, TopologyError> {
    let text = read_text(path)?;
    let text = text.trim();
    match text.parse::<i64>() {
        Ok(-1) => Ok(if_unknown),
        Ok(value) => usize::try_from(value).map_err(|_| TopologyError::Parse {
            path: path.to_owned(),
            detail: format!("{value} is not a valid id"),
        }),
        Err(_) => Err(TopologyError::Parse {
            path: path.to_owned(),
            detail: format!("{text:?} is not an integer"),
        }),
    }
}

fn io_error(path: &Path, source: io::Error) -> TopologyError {
    TopologyError::Io {
        path: PathBuf::from(path),
        source,
    }
}
