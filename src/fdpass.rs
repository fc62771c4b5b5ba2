//! Descriptors of other processes of this host, duplicated into this one (`pidfd_getfd`):
//! the same-host transport's wake, doorbell and ring descriptors, and GPU memory exported as
//! file descriptors.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A duplicate of descriptor `fd` of process `pid` (`pidfd_getfd`, which asks for the same
/// permission as reading its memory).
pub(crate) fn take_fd(pid: libc::pid_t, fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: raw system calls with integer arguments; each returned descriptor is owned here.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid, 0);
        if pidfd < 0 {
            return Err(io::Error::last_os_error());
        }
        let pidfd = OwnedFd::from_raw_fd(pidfd as RawFd);
        let got = libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0);
        if got < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(got as RawFd))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_a_descriptor_of_this_process_and_refuses_a_closed_one() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let got = take_fd(std::process::id() as libc::pid_t, a.as_raw_fd()).unwrap();
        assert_ne!(got.as_raw_fd(), a.as_raw_fd());
        let e = take_fd(std::process::id() as libc::pid_t, 1 << 20).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF));
    }
}
