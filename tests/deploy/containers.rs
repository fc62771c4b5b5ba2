//! Containers and clusters: the Kubernetes DaemonSet is Guaranteed QoS with IPC_LOCK,
//! `verify.sh --host` checks io_uring and locked memory, and the seccomp profile denies by
//! default yet allows every system call morio makes (seen with strace).

use std::collections::BTreeSet;
use std::fs;
use std::process::Command;

use crate::common::{deploy, read, run_ok, scratch, stderr};

#[test]
fn daemonset_is_guaranteed_qos_with_ipc_lock() {
    let y = read(&deploy("k8s/daemonset.yaml"));
    // requests == limits, integer CPUs: the lines under each block, compared as text.
    let block = |key: &str| -> Vec<String> {
        let start = y
            .find(&format!("{key}:\n"))
            .unwrap_or_else(|| panic!("no {key}:"));
        y[start..]
            .lines()
            .skip(1)
            .take(2)
            .map(|l| l.trim().to_string())
            .collect()
    };
    let (req, lim) = (block("requests"), block("limits"));
    assert_eq!(req, lim);
    let cpu = req.iter().find_map(|l| l.strip_prefix("cpu: ")).unwrap();
    assert!(
        cpu.trim_matches('"').parse::<u32>().is_ok(),
        "cpu {cpu} is not an integer"
    );
    for want in [
        "kind: DaemonSet",
        "kind: ConfigMap",
        "hostNetwork: true",
        "add: [\"IPC_LOCK\"]",
        "cpuManagerPolicy: static",
        "nodeSelector:",
        "morio.toml: |",
        "/opt/morio/deploy/launch.sh",
        "path: /healthz",
        "prometheus.io/path: /metrics",
    ] {
        assert!(y.contains(want), "daemonset.yaml lacks {want}");
    }
    assert!(!y.contains('\t'), "tabs in YAML");
}

/// `verify.sh --host` runs `morio check`: ok here; with too little locked memory, exit 1 and
/// what to change.
#[test]
fn verify_host_checks_io_uring_and_locked_memory() {
    let morio = env!("CARGO_BIN_EXE_morio");
    let out = run_ok("verify.sh", &["--host", "--morio", morio]);
    assert!(out.contains("ok: io_uring is available"), "{out}");
    let low = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -l 128 && exec {} --host --morio {morio}",
            deploy("verify.sh").display()
        ))
        .output()
        .unwrap();
    assert_eq!(low.status.code(), Some(1), "{}", stderr(&low));
    assert!(
        stderr(&low).contains("ulimit -l unlimited"),
        "{}",
        stderr(&low)
    );
}

/// The system calls the profile allows.
fn profile_allows() -> BTreeSet<String> {
    let text = fs::read_to_string(deploy("seccomp-morio.json")).unwrap();
    let p: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    assert_eq!(p["defaultAction"], "SCMP_ACT_ERRNO", "deny by default");
    let mut allowed = BTreeSet::new();
    for rule in p["syscalls"].as_array().unwrap() {
        assert_eq!(rule["action"], "SCMP_ACT_ALLOW");
        for n in rule["names"].as_array().unwrap() {
            allowed.insert(n.as_str().unwrap().to_string());
        }
    }
    allowed
}

#[test]
fn the_seccomp_profile_denies_by_default_and_allows_io_uring() {
    let allowed = profile_allows();
    for s in ["io_uring_setup", "io_uring_enter", "io_uring_register"] {
        assert!(allowed.contains(s), "{s} is not allowed");
    }
    // The Kubernetes example uses it, the Dockerfile documents it.
    let ds = fs::read_to_string(deploy("k8s/daemonset.yaml")).unwrap();
    assert!(ds.contains("localhostProfile: morio.json"), "daemonset");
    let df = fs::read_to_string(deploy("Dockerfile")).unwrap();
    assert!(df.contains("seccomp=deploy/seccomp-morio.json") && df.contains("memlock=-1"));
    assert!(df.contains("cargo build --release --locked --bin morio"));
}

/// Every system call `morio` makes moving verified data (and checking the host) is in the
/// profile, seen with strace (installed by `.ci/run`).
#[test]
fn the_seccomp_profile_allows_every_call_morio_makes() {
    if Command::new("strace").arg("-V").output().is_err() {
        panic!("strace is needed for this test (apt install strace; .ci/run installs it)");
    }
    let can_trace = Command::new("strace")
        .args(["-f", "-qq", "-o", "/dev/null", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !can_trace {
        // A sandbox that forbids ptrace: nothing to learn here.
        eprintln!("note: strace cannot trace in this sandbox; profile coverage not checked");
        return;
    }
    let dir = scratch("strace");
    let log = dir.join("calls");
    let morio = env!("CARGO_BIN_EXE_morio");
    for args in [
        &["loopback", "--size", "16MiB", "--no-pin"][..],
        &["check"][..],
    ] {
        let o = Command::new("strace")
            .args(["-f", "-qq", "-o"])
            .arg(&log)
            .arg(morio)
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "morio {args:?}: {}", stderr(&o));
        let text = fs::read_to_string(&log).unwrap();
        let allowed = profile_allows();
        let missing: BTreeSet<String> = text
            .lines()
            .filter_map(|l| {
                let rest = l.split_once(' ')?.1.trim_start();
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                (rest[name.len()..].starts_with('(') && !name.is_empty()).then_some(name)
            })
            .filter(|n| !allowed.contains(n))
            .collect();
        assert!(
            missing.is_empty(),
            "morio {args:?} calls {missing:?}, not in the profile"
        );
    }
}
