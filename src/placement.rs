//! Where shards run: the topology plan for this machine, within the process affinity mask.

use std::path::Path;

use morio_topology::{plan_shards, CpuSet, ShardRequest, Topology};

use crate::config::TcpBackendConfig;
use crate::error::EngineError;

/// CPUs this process may run on (its affinity mask).
pub fn allowed_cpus() -> CpuSet {
    // SAFETY: sched_getaffinity fills a cpu_set_t we own.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
            return (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &set))
                .collect();
        }
    }
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    (0..n).collect()
}

/// Shard count when the config leaves it open: one per allowed CPU, at most one per lane.
pub(crate) fn default_shards(cfg: &TcpBackendConfig) -> usize {
    cfg.num_shards
        .or_else(|| cfg.cpus.as_ref().map(Vec::len))
        .unwrap_or_else(|| allowed_cpus().len().min(cfg.num_data_conns))
        .max(1)
}

/// The CPU of each shard, or `None` when shards are not pinned.
pub(crate) fn shard_cpus(cfg: &TcpBackendConfig) -> Result<Option<Vec<usize>>, EngineError> {
    if !cfg.pin_shards {
        return Ok(None);
    }
    let topo = Topology::from_sysfs(Path::new("/sys")).unwrap_or_else(|e| {
        log::warn!("cannot read CPU topology ({e}); assuming a flat machine");
        Topology::flat(std::thread::available_parallelism().map_or(1, |n| n.get()))
    });
    let req = ShardRequest {
        n_shards: if cfg.cpus.is_some() {
            None
        } else {
            Some(default_shards(cfg))
        },
        cpus: cfg.cpus.clone(),
        prefer_node: None,
    };
    Ok(Some(plan_shards(&topo, &allowed_cpus(), &req)?.cpus))
}
