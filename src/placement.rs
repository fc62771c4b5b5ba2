//! Where shards run: the embedding policy for CPUs, the topology plan for this machine within
//! the process affinity mask, and host-wide CPU claims.
//!
//! # The policy
//!
//! An engine is often made inside an application that shares the host with others (vLLM or
//! SGLang run one process per GPU), so what the library does by default must be safe there:
//!
//! - **Library engines float.** [`TcpBackendConfig::default`] has `pin_shards: false`: shard
//!   threads are not pinned and the kernel places them next to the application's threads.
//!   Their number is `num_shards`, or by default one per CPU of the process affinity mask, at
//!   most `num_data_conns` (every shard then runs at least one lane of every peer). A process
//!   that wants fewer threads sets `num_shards` (or narrows its affinity mask).
//! - **Pinned engines claim their CPUs host-wide.** With `pin_shards: true` and no explicit
//!   `cpus`, the engine plans its shards ([`morio_topology::plan_shards`]: physical cores
//!   before SMT siblings) over the allowed CPUs that no other pinned morio engine on the host
//!   holds, and claims the planned CPUs with an exclusive `flock` on one lock file per CPU in
//!   the claim directory ([`TcpBackendConfig::cpu_claim_dir`], else `$MORIO_CPU_CLAIM_DIR`,
//!   else `/dev/shm/morio-cpus`; see `cpu_claim.rs`). The backend holds its claims for its
//!   lifetime: `remove_backend` and dropping the engine release them, and the kernel does when
//!   the process dies. Two pinned engines, in one process or in two, never share a CPU. If
//!   another engine claims a planned CPU first, the engine plans again (a few times). When
//!   fewer CPUs are free than shards wanted, it runs fewer shards on the free ones (at least
//!   one); when none is free it runs its shards unpinned, with one warning. When the claim
//!   directory cannot be created or opened, no claims are possible: the engine plans over
//!   every allowed CPU as before claims existed, with one warning. Claims are seen only by
//!   engines that use the same directory: containers usually get a `/dev/shm` of their own,
//!   so engines in different containers on one host need a shared directory mounted and named
//!   by `MORIO_CPU_CLAIM_DIR`. A child forked without `exec` inherits the lock files (they
//!   are close-on-exec) and keeps the CPUs claimed while it lives.
//! - **Explicit CPUs are the user's decision.** `cpus: Some(..)` pins one shard to each, in
//!   order, exactly as given (whatever `pin_shards` says); each is claimed too where free, so
//!   claiming engines avoid it, and one already claimed by another engine gets a warning.
//! - **The `morio` command owns its host**: `morio serve`, `morio bench` and `morio loopback`
//!   pin by default (`--no-pin` / `pin_shards = false` to float), and so claim their CPUs.
//!
//! [`crate::IoEngine::shard_cpus`] reports the CPU each shard actually runs on.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use morio_topology::{plan_shards, CpuSet, ShardRequest, Topology, TopologyError};

use crate::config::TcpBackendConfig;
use crate::cpu_claim::{self, ClaimDir, CpuClaim};
use crate::error::EngineError;

pub use crate::cpu_claim::{CLAIM_DIR_ENV, DEFAULT_CLAIM_DIR};

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

/// Shard count before claims: `num_shards`, else one per explicit CPU, else one per allowed
/// CPU, at most one per lane.
pub(crate) fn default_shards(cfg: &TcpBackendConfig) -> usize {
    cfg.num_shards
        .or_else(|| cfg.cpus.as_ref().map(Vec::len))
        .unwrap_or_else(|| allowed_cpus().len().min(cfg.num_data_conns))
        .max(1)
}

/// Where a backend's shards run, and the CPU claims it holds while they do.
#[derive(Debug)]
pub(crate) struct ShardPlacement {
    /// One entry per shard: its CPU, or `None` when unpinned.
    pub cpus: Vec<Option<usize>>,
    /// Host-wide claims, held for the backend's lifetime.
    pub claims: Vec<CpuClaim>,
}

impl ShardPlacement {
    fn unpinned(n: usize) -> Self {
        Self {
            cpus: vec![None; n],
            claims: Vec::new(),
        }
    }

    fn pinned(cpus: &[usize], claims: Vec<CpuClaim>) -> Self {
        Self {
            cpus: cpus.iter().map(|&c| Some(c)).collect(),
            claims,
        }
    }
}

/// Plan the shards of a backend with `cfg` under the policy of this module.
pub(crate) fn place_shards(cfg: &TcpBackendConfig) -> Result<ShardPlacement, EngineError> {
    if !cfg.pin_shards && cfg.cpus.is_none() {
        return Ok(ShardPlacement::unpinned(default_shards(cfg)));
    }
    let topo = Topology::from_sysfs(Path::new("/sys")).unwrap_or_else(|e| {
        log::warn!("cannot read CPU topology ({e}); assuming a flat machine");
        Topology::flat(std::thread::available_parallelism().map_or(1, |n| n.get()))
    });
    let allowed = allowed_cpus();
    let dir = claim_dir(cfg);
    if let Some(explicit) = &cfg.cpus {
        let req = ShardRequest {
            cpus: Some(explicit.clone()),
            ..Default::default()
        };
        let cpus = plan_shards(&topo, &allowed, &req)?.cpus;
        let claims = dir.map_or_else(Vec::new, |d| claim_explicit(&d, &cpus));
        return Ok(ShardPlacement::pinned(&cpus, claims));
    }
    let want = default_shards(cfg);
    let plan = |free: &CpuSet, n: usize| -> Result<Vec<usize>, TopologyError> {
        let req = ShardRequest {
            n_shards: Some(n),
            ..Default::default()
        };
        Ok(plan_shards(&topo, free, &req)?.cpus)
    };
    let Some(dir) = dir else {
        return Ok(ShardPlacement::pinned(&plan(&allowed, want)?, Vec::new()));
    };
    // The CPUs that exist and may be used; asking for more shards than that is an error, as
    // it is without claims.
    let usable: CpuSet = topo
        .cpus
        .iter()
        .map(|c| c.id)
        .filter(|&c| allowed.contains(c))
        .collect();
    if want > usable.len() {
        return Err(TopologyError::TooManyShards {
            requested: want,
            available: usable.len(),
        }
        .into());
    }
    // Without an explicit shard count, one CPU stays free for the application's threads: a
    // busy-polling shard on every core leaves the thread that submits and waits none (two
    // loopback engines of a 16-core host pinned 8 + 8; now 8 + 7, docs/perf/h100-s31.md).
    let spare = usize::from(cfg.num_shards.is_none());
    let claims = dir.claim_planned(&usable, want, spare, plan)?;
    if claims.is_empty() {
        log::warn!(
            "every allowed CPU ({allowed}) is claimed by another pinned morio engine on this \
             host (claims in {}); running {want} shards unpinned",
            dir.path().display()
        );
        return Ok(ShardPlacement::unpinned(want));
    }
    let cpus: Vec<usize> = claims.iter().map(CpuClaim::cpu).collect();
    if cpus.len() < want {
        let msg = format!(
            "only {} of the allowed CPUs are not claimed by another pinned morio engine on \
             this host; running {} shards instead of {want}",
            cpus.len(),
            cpus.len()
        );
        if cfg.num_shards.is_some() {
            log::warn!("{msg}");
        } else {
            log::info!("{msg}");
        }
    }
    Ok(ShardPlacement::pinned(&cpus, claims))
}

/// Claim each explicit CPU that is free; warn once about those another engine holds.
fn claim_explicit(dir: &ClaimDir, cpus: &[usize]) -> Vec<CpuClaim> {
    let mut claims = Vec::new();
    let mut taken = CpuSet::new();
    for &c in cpus {
        match dir.try_claim(c) {
            Ok(Some(claim)) => claims.push(claim),
            Ok(None) => {
                taken.insert(c);
            }
            Err(e) => log::debug!("cannot claim CPU {c} in {}: {e}", dir.path().display()),
        }
    }
    if !taken.is_empty() {
        log::warn!(
            "CPUs {taken} are claimed by another pinned morio engine on this host (claims in \
             {}); pinning shards there anyway, as the configured cpus say",
            dir.path().display()
        );
    }
    claims
}

/// Warned once per process that claims are impossible.
static WARNED_NO_CLAIMS: AtomicBool = AtomicBool::new(false);

/// The claim directory, or `None` (warned once) when it cannot be used.
fn claim_dir(cfg: &TcpBackendConfig) -> Option<ClaimDir> {
    let path = cpu_claim::resolve_dir(cfg.cpu_claim_dir.as_deref());
    match ClaimDir::open(&path) {
        Ok(d) => Some(d),
        Err(e) => {
            if !WARNED_NO_CLAIMS.swap(true, Ordering::Relaxed) {
                log::warn!(
                    "cannot use the CPU claim directory {} ({e}); pinned engines plan over \
                     every allowed CPU without claiming them, and may share CPUs",
                    path.display()
                );
            }
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu_claim::test_dir::TempDir;

    fn pinned_cfg(dir: &TempDir) -> TcpBackendConfig {
        TcpBackendConfig {
            pin_shards: true,
            cpu_claim_dir: Some(dir.0.clone()),
            ..Default::default()
        }
    }

    fn want() -> usize {
        allowed_cpus()
            .len()
            .min(TcpBackendConfig::default().num_data_conns)
    }

    #[test]
    fn unpinned_by_default_one_shard_per_allowed_cpu_at_most_one_per_lane() {
        let p = place_shards(&TcpBackendConfig::default()).unwrap();
        assert_eq!(p.cpus, vec![None; want()]);
        assert!(p.claims.is_empty());
        let p = place_shards(&TcpBackendConfig {
            num_shards: Some(3),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(p.cpus, vec![None; 3]);
    }

    #[test]
    fn pinned_claims_what_it_plans_and_a_full_set_falls_back_to_unpinned() {
        let dir = TempDir::new("place");
        let cfg = pinned_cfg(&dir);
        let a = place_shards(&cfg).unwrap();
        let cpus: Vec<usize> = a.cpus.iter().flatten().copied().collect();
        // One CPU stays free for the application (where there are two or more).
        let n = allowed_cpus().len();
        assert_eq!(
            cpus.len(),
            want().min(n - usize::from(n > 1)),
            "{:?}",
            a.cpus
        );
        assert_eq!(a.claims.iter().map(CpuClaim::cpu).collect::<Vec<_>>(), cpus);
        // Take whatever is left, then nothing is.
        let rest = place_shards(&TcpBackendConfig {
            num_shards: Some(allowed_cpus().len() - cpus.len()).filter(|&n| n > 0),
            ..cfg.clone()
        })
        .unwrap();
        let full = place_shards(&cfg).unwrap();
        assert_eq!(full.cpus, vec![None; want()], "every CPU is claimed");
        assert!(full.claims.is_empty());
        // Asking for more shards than the machine has is still an error.
        let too_many = TcpBackendConfig {
            num_shards: Some(allowed_cpus().len() + 1),
            ..cfg.clone()
        };
        assert!(matches!(
            place_shards(&too_many),
            Err(EngineError::Topology(TopologyError::TooManyShards { .. }))
        ));
        // Released claims are free again.
        drop((a, rest));
        assert_eq!(place_shards(&cfg).unwrap().claims.len(), cpus.len());
    }

    #[test]
    fn without_a_claim_directory_pinned_engines_plan_as_before() {
        let dir = TempDir::new("noclaims");
        std::fs::write(&dir.0, b"not a directory").unwrap();
        let cfg = pinned_cfg(&dir);
        let p = place_shards(&cfg).unwrap();
        let topo = Topology::from_sysfs(Path::new("/sys"))
            .unwrap_or_else(|_| Topology::flat(allowed_cpus().len()));
        let req = ShardRequest {
            n_shards: Some(want()),
            ..Default::default()
        };
        let before = plan_shards(&topo, &allowed_cpus(), &req).unwrap().cpus;
        assert_eq!(p.cpus, before.iter().map(|&c| Some(c)).collect::<Vec<_>>());
        assert!(p.claims.is_empty());
        // Twice: no claims, so the same CPUs again.
        assert_eq!(place_shards(&cfg).unwrap().cpus, p.cpus);
        let _ = std::fs::remove_file(&dir.0);
    }

    #[test]
    fn explicit_cpus_pin_as_given_and_are_claimed_where_free() {
        let dir = TempDir::new("explicit");
        let first = allowed_cpus().iter().next().unwrap();
        let cfg = TcpBackendConfig {
            cpus: Some(vec![first]),
            cpu_claim_dir: Some(dir.0.clone()),
            ..Default::default()
        };
        // pin_shards is off, but explicit CPUs pin.
        let a = place_shards(&cfg).unwrap();
        assert_eq!(a.cpus, vec![Some(first)]);
        assert_eq!(a.claims.len(), 1);
        // Claimed by `a`: used anyway, not claimed a second time.
        let b = place_shards(&cfg).unwrap();
        assert_eq!(b.cpus, vec![Some(first)]);
        assert!(b.claims.is_empty());
        // A claiming engine avoids it.
        let c = place_shards(&TcpBackendConfig {
            num_shards: Some(1),
            ..pinned_cfg(&dir)
        })
        .unwrap();
        assert_ne!(c.cpus, vec![Some(first)]);
    }
}
