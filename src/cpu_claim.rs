//! Host-wide CPU claims: a pinned engine holds an exclusive `flock` on one lock file per shard
//! CPU, so pinned engines on one host (in one process or in several) never share a CPU.
//!
//! A claim directory (default [`DEFAULT_CLAIM_DIR`], on tmpfs so it never outlives a boot)
//! holds one empty file per CPU, `cpu-<id>.lock`. Claiming CPU `c` is a non-blocking
//! `flock(LOCK_EX)` on its own open file description of `cpu-<c>.lock`; the claim lasts as long
//! as that description is open: the engine keeps it for the backend's lifetime, and the kernel
//! drops it when the process dies, however it dies. Because a lock belongs to an open file
//! description, two engines of one process conflict exactly as two processes do. Nothing is
//! ever written into the files, and nothing is deleted, so there is no stale state to clean
//! up. The directory is created world-writable with the sticky bit (like `/tmp`) so the
//! engines of several users share it.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use morio_topology::{CpuSet, TopologyError};

/// Where engines claim CPUs unless configured otherwise.
pub const DEFAULT_CLAIM_DIR: &str = "/dev/shm/morio-cpus";

/// Environment variable naming another claim directory (used when the backend configuration
/// names none).
pub const CLAIM_DIR_ENV: &str = "MORIO_CPU_CLAIM_DIR";

/// How many times planning and claiming is tried before settling for what is held.
const ATTEMPTS: usize = 8;

/// One claimed CPU, held until dropped (or until the process ends).
#[derive(Debug)]
pub(crate) struct CpuClaim {
    cpu: usize,
    // Holding the open file description holds the lock.
    _file: File,
}

impl CpuClaim {
    /// The claimed CPU.
    pub fn cpu(&self) -> usize {
        self.cpu
    }
}

/// The claim directory to use: the configured one, else `$MORIO_CPU_CLAIM_DIR` (when set and
/// not empty), else [`DEFAULT_CLAIM_DIR`].
pub(crate) fn resolve_dir(configured: Option<&Path>) -> PathBuf {
    if let Some(p) = configured {
        return p.to_path_buf();
    }
    match std::env::var_os(CLAIM_DIR_ENV) {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => PathBuf::from(DEFAULT_CLAIM_DIR),
    }
}

/// An existing (or freshly created) claim directory.
#[derive(Debug, Clone)]
pub(crate) struct ClaimDir {
    path: PathBuf,
}

impl ClaimDir {
    /// Open `path`, creating it (and its parents) when missing; a new directory is made
    /// mode 1777 so every user's engines can claim in it.
    pub fn open(path: &Path) -> io::Result<Self> {
        if !path.exists() {
            match std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o1777)
                .create(path)
            {
                Ok(()) => {
                    // The mode above is filtered by the umask; widen it (best effort: another
                    // user may have created it first, and then it is theirs to set).
                    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o1777));
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        if !std::fs::metadata(path)?.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{} is not a directory", path.display()),
            ));
        }
        Ok(Self {
            path: path.to_path_buf(),
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Claim `cpu`: `Ok(None)` when another engine holds it.
    pub fn try_claim(&self, cpu: usize) -> io::Result<Option<CpuClaim>> {
        let path = self.path.join(format!("cpu-{cpu}.lock"));
        // Read-only is enough for flock, and works on a file another user created.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CREAT | libc::O_CLOEXEC)
            .mode(0o666)
            .open(&path)?;
        loop {
            // SAFETY: flock on a descriptor this function owns.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc == 0 {
                return Ok(Some(CpuClaim { cpu, _file: file }));
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EWOULDBLOCK) => return Ok(None),
                _ => return Err(e),
            }
        }
    }

    /// Whether `cpu` is free right now (claimed and released at once; the answer may be stale
    /// by the time it is used). A CPU whose lock file cannot be used counts as taken.
    fn is_free(&self, cpu: usize) -> bool {
        match self.try_claim(cpu) {
            Ok(c) => c.is_some(),
            Err(e) => {
                log::debug!(
                    "cannot claim CPU {cpu} in {}: {e}; leaving it",
                    self.path.display()
                );
                false
            }
        }
    }

    /// Claim CPUs for up to `want` shards among `usable`: plan over the CPUs no other engine
    /// holds (`plan(free, n)` chooses `n` of them, in shard order), claim the plan, and plan
    /// again when another engine took one of them in between. Returns the claims in shard
    /// order: `want` of them when that many are free (and `spare` more stay free), fewer when
    /// not (the last free CPU is taken rather than none), none when every usable CPU is
    /// claimed.
    pub fn claim_planned(
        &self,
        usable: &CpuSet,
        want: usize,
        spare: usize,
        plan: impl Fn(&CpuSet, usize) -> Result<Vec<usize>, TopologyError>,
    ) -> Result<Vec<CpuClaim>, TopologyError> {
        let mut held: Vec<CpuClaim> = Vec::new();
        for attempt in 0..ATTEMPTS {
            let free: CpuSet = usable
                .iter()
                .filter(|&c| held.iter().any(|h| h.cpu == c) || self.is_free(c))
                .collect();
            let n = want
                .min(free.len().saturating_sub(spare))
                .max(usize::from(!free.is_empty()).min(want));
            if n == 0 {
                // Another engine probing a CPU holds it for an instant; look twice more
                // before concluding that every CPU is taken.
                if attempt < 2 {
                    pause(attempt);
                    continue;
                }
                return Ok(Vec::new());
            }
            let cpus = plan(&free, n)?;
            held.retain(|h| cpus.contains(&h.cpu));
            let mut lost = false;
            for &c in &cpus {
                if held.iter().any(|h| h.cpu == c) {
                    continue;
                }
                match self.try_claim(c) {
                    Ok(Some(claim)) => held.push(claim),
                    Ok(None) | Err(_) => lost = true,
                }
            }
            if !lost {
                return Ok(order(held, &cpus));
            }
            // Another engine claimed one of them since we looked: look again, after a short
            // random pause so two engines starting together stop colliding.
            log::debug!("a planned CPU was claimed by another engine; planning again");
            pause(attempt);
        }
        // Still colliding: keep what is held, in the order a plan over it gives.
        if held.is_empty() {
            return Ok(held);
        }
        let set: CpuSet = held.iter().map(CpuClaim::cpu).collect();
        let cpus = plan(&set, set.len())?;
        Ok(order(held, &cpus))
    }
}

/// A short random pause, longer with each attempt.
fn pause(attempt: usize) {
    let us = rand::random::<u64>() % (500 * (attempt as u64 + 1));
    std::thread::sleep(Duration::from_micros(us));
}

/// `held` sorted into the order of `cpus` (which names each of them once).
fn order(mut held: Vec<CpuClaim>, cpus: &[usize]) -> Vec<CpuClaim> {
    held.sort_by_key(|h| cpus.iter().position(|&c| c == h.cpu).unwrap_or(usize::MAX));
    held
}

/// A claim directory of a test's own.
#[cfg(test)]
pub(crate) mod test_dir {
    use std::path::PathBuf;

    /// A fresh path under the system temp dir, removed (with what is in it) on drop.
    pub(crate) struct TempDir(pub PathBuf);

    impl TempDir {
        pub fn new(tag: &str) -> Self {
            Self(std::env::temp_dir().join(format!(
                "morio-claims-{tag}-{}-{:x}",
                std::process::id(),
                rand::random::<u64>()
            )))
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_dir::TempDir;
    use super::*;
    use morio_topology::{plan_shards, ShardRequest, Topology};

    fn flat_plan(n_cpus: usize) -> impl Fn(&CpuSet, usize) -> Result<Vec<usize>, TopologyError> {
        let topo = Topology::flat(n_cpus);
        move |free: &CpuSet, n: usize| {
            let req = ShardRequest {
                n_shards: Some(n),
                ..Default::default()
            };
            Ok(plan_shards(&topo, free, &req)?.cpus)
        }
    }

    fn cpus(c: &[CpuClaim]) -> Vec<usize> {
        c.iter().map(CpuClaim::cpu).collect()
    }

    #[test]
    fn the_directory_is_created_shareable_and_a_file_is_refused() {
        let t = TempDir::new("mk");
        let nested = t.0.join("a/b");
        let d = ClaimDir::open(&nested).unwrap();
        let mode = std::fs::metadata(d.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o1777, "{mode:o}");
        // Opening again is fine.
        ClaimDir::open(&nested).unwrap();
        let file = t.0.join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(ClaimDir::open(&file).is_err());
        assert!(ClaimDir::open(&file.join("below")).is_err());
    }

    #[test]
    fn a_claimed_cpu_is_refused_until_its_claim_is_dropped() {
        let t = TempDir::new("one");
        let d = ClaimDir::open(&t.0).unwrap();
        let c = d.try_claim(3).unwrap().expect("free");
        assert_eq!(c.cpu(), 3);
        // A second open file description conflicts, in the same process too.
        assert!(d.try_claim(3).unwrap().is_none());
        assert!(!d.is_free(3));
        assert!(d.is_free(4));
        drop(c);
        assert!(d.is_free(3));
        assert!(d.try_claim(3).unwrap().is_some());
    }

    #[test]
    fn two_claimers_get_disjoint_cpus() {
        let t = TempDir::new("two");
        let d = ClaimDir::open(&t.0).unwrap();
        let usable: CpuSet = (0..8).collect();
        let plan = flat_plan(8);
        let a = d.claim_planned(&usable, 3, 0, &plan).unwrap();
        let b = d.claim_planned(&usable, 3, 0, &plan).unwrap();
        assert_eq!(cpus(&a), [0, 1, 2]);
        assert_eq!(cpus(&b), [3, 4, 5]);
        // Only two are left for a third claimer that wants three.
        let c = d.claim_planned(&usable, 3, 0, &plan).unwrap();
        assert_eq!(cpus(&c), [6, 7]);
        // All taken: nothing for a fourth.
        assert!(d.claim_planned(&usable, 1, 0, &plan).unwrap().is_empty());
        // A dropped claim frees its CPUs for the next claimer.
        drop(b);
        let e = d.claim_planned(&usable, 8, 0, &plan).unwrap();
        assert_eq!(cpus(&e), [3, 4, 5]);
        drop((a, c, e));
        assert_eq!(
            cpus(&d.claim_planned(&usable, 8, 0, &plan).unwrap()),
            (0..8).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_spare_cpu_stays_free_until_only_one_is_left() {
        let t = TempDir::new("spare");
        let d = ClaimDir::open(&t.0).unwrap();
        let usable: CpuSet = (0..8).collect();
        let plan = flat_plan(8);
        let a = d.claim_planned(&usable, 4, 1, &plan).unwrap();
        assert_eq!(cpus(&a), [0, 1, 2, 3]);
        // Four free, four wanted: one stays free.
        let b = d.claim_planned(&usable, 4, 1, &plan).unwrap();
        assert_eq!(cpus(&b), [4, 5, 6]);
        // One left: taken rather than none.
        let c = d.claim_planned(&usable, 4, 1, &plan).unwrap();
        assert_eq!(cpus(&c), [7]);
        assert!(d.claim_planned(&usable, 4, 1, &plan).unwrap().is_empty());
        drop((a, b, c));
    }

    #[test]
    fn claimers_racing_on_threads_never_share_a_cpu() {
        let t = TempDir::new("race");
        let d = ClaimDir::open(&t.0).unwrap();
        let usable: CpuSet = (0..16).collect();
        let claims: Vec<Vec<CpuClaim>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..6)
                .map(|_| s.spawn(|| d.claim_planned(&usable, 3, 0, flat_plan(16)).unwrap()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut all: Vec<usize> = claims.iter().flat_map(|c| cpus(c)).collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "a CPU was claimed twice: {claims:?}");
        assert!(claims.iter().all(|c| c.len() <= 3), "{claims:?}");
    }

    #[test]
    fn the_plan_orders_the_claims_and_its_errors_pass_through() {
        let t = TempDir::new("order");
        let d = ClaimDir::open(&t.0).unwrap();
        let usable: CpuSet = (0..4).collect();
        let reversed = |free: &CpuSet, n: usize| -> Result<Vec<usize>, TopologyError> {
            Ok(free.iter().rev().take(n).collect())
        };
        assert_eq!(
            cpus(&d.claim_planned(&usable, 3, 0, reversed).unwrap()),
            [3, 2, 1]
        );
        let failing = |_: &CpuSet, _: usize| -> Result<Vec<usize>, TopologyError> {
            Err(TopologyError::NoCpus)
        };
        assert!(d.claim_planned(&usable, 1, 0, failing).is_err());
    }
}
