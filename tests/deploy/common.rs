//! What the deploy tests share: the repository's paths, running a `deploy/` script (and
//! requiring it to succeed), scratch directories, file helpers, and a CPU this process may
//! run on.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn deploy(name: &str) -> PathBuf {
    root().join("deploy").join(name)
}

pub fn testdata(name: &str) -> String {
    deploy("testdata").join(name).display().to_string()
}

/// A fresh scratch directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("deploy-{name}"));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn run(script: &str, args: &[&str]) -> Output {
    Command::new(deploy(script))
        .args(args)
        .env_remove("MORIO")
        .output()
        .unwrap_or_else(|e| panic!("run deploy/{script}: {e}"))
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs a script that must succeed; its stdout.
pub fn run_ok(script: &str, args: &[&str]) -> String {
    let o = run(script, args);
    assert!(
        o.status.success(),
        "deploy/{script} {args:?} failed ({}):\n{}{}",
        o.status,
        stdout(&o),
        stderr(&o)
    );
    stdout(&o)
}

pub fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

pub fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The first CPU this process may run on.
pub fn first_allowed_cpu() -> usize {
    // SAFETY: sched_getaffinity fills a cpu_set_t we own.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
            0
        );
        (0..libc::CPU_SETSIZE as usize)
            .find(|&c| libc::CPU_ISSET(c, &set))
            .unwrap()
    }
}
