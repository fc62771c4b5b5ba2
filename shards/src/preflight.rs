//! What the runtime needs from the host, checked before any executor starts, with messages
//! that say what to change: io_uring (blocked by the default seccomp profiles of Docker and
//! containerd, or by `kernel.io_uring_disabled`) and enough locked memory for the rings.

use std::io;

/// The least `RLIMIT_MEMLOCK` an executor starts with (glommio refuses less).
pub const MIN_MEMLOCK_BYTES: u64 = 512 << 10;

/// Why the host cannot run shards.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Preflight {
    /// `io_uring_setup` failed.
    #[error(
        "io_uring is unavailable here (io_uring_setup: {0}). Container runtimes block it in \
         their default seccomp profile: run with a profile that allows io_uring_setup, \
         io_uring_enter and io_uring_register (deploy/seccomp-morio.json: Docker \
         `--security-opt seccomp=deploy/seccomp-morio.json`, Kubernetes \
         `securityContext.seccompProfile: {{type: Localhost, localhostProfile: \
         morio.json}}`); on a host, check `sysctl kernel.io_uring_disabled` (must be 0)"
    )]
    NoIoUring(String),
    /// `RLIMIT_MEMLOCK` below [`MIN_MEMLOCK_BYTES`].
    #[error(
        "the locked-memory limit is {have} bytes; morio's shards need at least {need} \
         (raise it: `ulimit -l unlimited`, systemd `LimitMEMLOCK=infinity`, Docker \
         `--ulimit memlock=-1`, Kubernetes: the container runtime's default ulimits)"
    )]
    MemLock {
        /// The soft limit.
        have: u64,
        /// [`MIN_MEMLOCK_BYTES`].
        need: u64,
    },
}

/// Check the host once (the answer does not change while the process runs, except by
/// `setrlimit`, so each call checks again: it costs two system calls).
pub fn check() -> Result<(), Preflight> {
    check_memlock()?;
    check_io_uring()
}

fn check_memlock() -> Result<(), Preflight> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 {
        return Ok(()); // Unknown: let the executor report what it finds.
    }
    if r.rlim_cur != libc::RLIM_INFINITY && r.rlim_cur < MIN_MEMLOCK_BYTES {
        return Err(Preflight::MemLock {
            have: r.rlim_cur,
            need: MIN_MEMLOCK_BYTES,
        });
    }
    Ok(())
}

fn check_io_uring() -> Result<(), Preflight> {
    // struct io_uring_params is 120 bytes; a zeroed one asks for defaults.
    let mut params = [0u8; 120];
    // SAFETY: io_uring_setup reads and writes `params` (of its documented size) and returns a
    // new descriptor or -1; nothing else is touched.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
    if fd < 0 {
        return Err(Preflight::NoIoUring(io::Error::last_os_error().to_string()));
    }
    // SAFETY: `fd` is the ring descriptor just returned to us, closed once.
    unsafe {
        libc::close(fd as libc::c_int);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_host_passes() {
        // The test machines run io_uring with enough locked memory (CI raises the limit).
        assert_eq!(check(), Ok(()));
    }

    #[test]
    fn messages_say_what_to_change() {
        let m = Preflight::MemLock {
            have: 65536,
            need: MIN_MEMLOCK_BYTES,
        }
        .to_string();
        assert!(m.contains("ulimit -l") && m.contains("LimitMEMLOCK"), "{m}");
        let u = Preflight::NoIoUring("Operation not permitted (os error 1)".into()).to_string();
        assert!(
            u.contains("seccomp") && u.contains("io_uring_disabled"),
            "{u}"
        );
    }
}
