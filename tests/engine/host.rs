//! A host that cannot run shards is told what to change: too little locked memory, or
//! io_uring blocked the way container runtimes' default seccomp profiles block it. Each case
//! runs in a child process of this test binary (limits and seccomp filters are per process).

use super::common::*;
use morio::{IoEngine, IoEngineConfig};

/// Run `case` of this binary in a child through `sh -c PRELUDE`, with `env` set.
fn child(prelude: &str, case: &str, env: &[(&str, &str)]) {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{prelude} exec \"$0\" --exact {case} --ignored --nocapture"
        ))
        .arg(exe)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("1 passed"), "the case did not run: {text}");
}

fn backend_error() -> String {
    let e = IoEngine::new("host_check", IoEngineConfig::new("127.0.0.1", 0)).unwrap();
    match e.create_backend(test_cfg()) {
        Ok(()) => panic!("the backend started"),
        Err(err) => err.to_string(),
    }
}

#[test]
fn too_little_locked_memory_is_refused_with_what_to_change() {
    child("ulimit -l 256 &&", "host::memlock_case", &[]);
}

#[test]
#[ignore = "run by too_little_locked_memory_is_refused_with_what_to_change"]
fn memlock_case() {
    let m = backend_error();
    assert!(
        m.contains("locked-memory limit is 262144 bytes") && m.contains("ulimit -l unlimited"),
        "{m}"
    );
}

#[test]
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn io_uring_blocked_by_seccomp_is_refused_with_what_to_change() {
    child("", "host::no_io_uring_case", &[]);
}

#[test]
#[ignore = "run by io_uring_blocked_by_seccomp_is_refused_with_what_to_change"]
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn no_io_uring_case() {
    block_io_uring_setup();
    let m = backend_error();
    assert!(
        m.contains("io_uring is unavailable") && m.contains("seccomp"),
        "{m}"
    );
}

/// Install a seccomp filter on this thread (inherited by the threads it starts) that fails
/// `io_uring_setup` with EPERM, as Docker's and containerd's default profiles do.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn block_io_uring_setup() {
    const IO_URING_SETUP: u32 = 425; // The same on x86_64 and aarch64.
    let stmt = |code: u16, k: u32| libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    // BPF_LD|BPF_W|BPF_ABS, offset 0: the syscall number of `struct seccomp_data`.
    let mut prog = [
        stmt(0x20, 0),
        // BPF_JMP|BPF_JEQ|BPF_K: io_uring_setup? next : skip one.
        libc::sock_filter {
            code: 0x15,
            jt: 0,
            jf: 1,
            k: IO_URING_SETUP,
        },
        // BPF_RET|BPF_K: SECCOMP_RET_ERRNO | EPERM.
        stmt(0x06, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
        // BPF_RET|BPF_K: SECCOMP_RET_ALLOW.
        stmt(0x06, libc::SECCOMP_RET_ALLOW),
    ];
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    // SAFETY: prctl with documented arguments; the filter program outlives the call (the
    // kernel copies it).
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &fprog as *const libc::sock_fprog
            ),
            0,
            "seccomp: {}",
            std::io::Error::last_os_error()
        );
    }
}
