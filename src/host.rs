//! What an engine needs from the machine, checked up front: io_uring (blocked by the default
//! seccomp profiles of Docker and containerd) and enough locked memory.

use crate::error::EngineError;

/// Check that this host (or container) can run an engine's shards; the error says what to
/// change. `create_backend` checks the same before it starts anything; this lets a program
/// (or `morio check`) find out at its own start.
pub fn check_host() -> Result<(), EngineError> {
    morio_shards::preflight::check().map_err(|e| EngineError::Shards(e.into()))
}

/// Whether engines of this process could use the same-host transport with engines of the
/// same user on this host (ARCHITECTURE.md, "Transports"); `Err` says why not. Not a
/// requirement: without it, those engines use TCP.
pub fn check_same_host() -> Result<(), String> {
    crate::transport::local::readiness()
}

/// Whether same-host connections of this process carry their small frames through
/// shared-memory rings (protocol v9; a sealed memfd per direction): `Err` says why not (a
/// seccomp profile without `memfd_create`, say), and they then keep them in the socket.
pub fn check_same_host_rings() -> Result<(), String> {
    crate::transport::local::ring_readiness()
}

/// Grow this process's descriptor table to hold at least `n` descriptors (up to its
/// `RLIMIT_NOFILE`), now rather than in the middle of traffic: growing it in a multi-threaded
/// process waits for an RCU grace period (tens of ms on the H200 host), which a connection's
/// set-up would otherwise pay when it crosses a power of two (docs/perf/h200-stop26.md).
pub(crate) fn grow_fd_table(n: usize) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into `lim`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return;
    }
    let top = (n as u64).min(lim.rlim_cur).saturating_sub(1);
    if top < 64 {
        return;
    }
    // SAFETY: plain descriptor calls on descriptors opened here; the duplicate (at the lowest
    // free number >= top, which makes the kernel grow the table) and the source are closed.
    unsafe {
        let src = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if src < 0 {
            return;
        }
        let dup = libc::fcntl(src, libc::F_DUPFD_CLOEXEC, top as libc::c_int);
        if dup >= 0 {
            libc::close(dup);
        }
        libc::close(src);
    }
}

#[cfg(test)]
mod tests {
    /// The table holds the descriptors asked for afterwards (FDSize in /proc/self/status).
    #[test]
    fn the_descriptor_table_grows_up_front() {
        super::grow_fd_table(2048);
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let size: usize = status
            .lines()
            .find_map(|l| l.strip_prefix("FDSize:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap();
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into `lim`.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert!(size >= 2048.min(lim.rlim_cur as usize), "FDSize {size}");
    }
}
