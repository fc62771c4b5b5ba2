//! The `deploy/` scripts, run for real: shellcheck, `--help` and bad options, `tune.sh` dry
//! run and `--apply` against fixture /proc and /sys trees built in a temporary directory,
//! `launch.sh --print` and `--unit`, and `verify.sh` on a pinned `morio-shard-0` thread of
//! this test process.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::mpsc;

const SCRIPTS: [&str; 3] = ["tune.sh", "launch.sh", "verify.sh"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn deploy(name: &str) -> PathBuf {
    root().join("deploy").join(name)
}

fn testdata(name: &str) -> String {
    deploy("testdata").join(name).display().to_string()
}

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("deploy-{name}"));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn run(script: &str, args: &[&str]) -> Output {
    Command::new(deploy(script))
        .args(args)
        .env_remove("MORIO")
        .output()
        .unwrap_or_else(|e| panic!("run deploy/{script}: {e}"))
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs a script that must succeed; its stdout.
fn run_ok(script: &str, args: &[&str]) -> String {
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

/// The change lines of tune.sh's output (not the '#' context), with `prefix` removed.
fn changes(out: &str, prefix: &Path) -> Vec<String> {
    out.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.replace(&prefix.display().to_string(), ""))
        .collect()
}

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// A fixture root: DIR/proc with the tuned sysctls at common distribution defaults and the
/// NIC's IRQs on every CPU, DIR/sys with the NIC's queues (RPS and XPS off), DIR/etc empty.
fn fixture(dir: &Path, nic: &str, irqs: &[u32], all_cpus: &str, queues: usize) {
    let sys = |name: &str, v: &str| write(&dir.join("proc/sys").join(name), &format!("{v}\n"));
    sys("net/core/rmem_max", "212992");
    sys("net/core/wmem_max", "212992");
    sys("net/ipv4/tcp_rmem", "4096\t131072\t6291456");
    sys("net/ipv4/tcp_wmem", "4096\t16384\t4194304");
    sys("net/core/netdev_max_backlog", "1000");
    sys("net/ipv4/tcp_mtu_probing", "0");
    sys("net/ipv4/tcp_slow_start_after_idle", "1");
    for irq in irqs {
        write(
            &dir.join(format!("proc/irq/{irq}/smp_affinity_list")),
            &format!("{all_cpus}\n"),
        );
    }
    let q = dir.join("sys/class/net").join(nic).join("queues");
    for i in 0..queues {
        write(&q.join(format!("rx-{i}/rps_cpus")), "0000\n");
        write(&q.join(format!("tx-{i}/xps_cpus")), "0000\n");
    }
    fs::create_dir_all(dir.join("etc")).unwrap();
}

/// tune.sh's options for a fixture root.
fn roots(dir: &Path) -> Vec<String> {
    vec![
        "--sysfs-root".into(),
        dir.join("sys").display().to_string(),
        "--proc-root".into(),
        dir.join("proc").display().to_string(),
        "--etc-dir".into(),
        dir.join("etc").display().to_string(),
    ]
}

fn tune(dir: &Path, extra: &[&str]) -> Output {
    let mut args = roots(dir);
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run("tune.sh", &args)
}

fn tune_ok(dir: &Path, extra: &[&str]) -> String {
    let o = tune(dir, extra);
    assert!(
        o.status.success() && o.stderr.is_empty(),
        "tune.sh {extra:?} failed ({}):\n{}{}",
        o.status,
        stdout(&o),
        stderr(&o)
    );
    stdout(&o)
}

const H200_DRY_RUN: &str = "\
would set /proc/sys/net/core/rmem_max: 212992 -> 67108864
would set /proc/sys/net/core/wmem_max: 212992 -> 67108864
would set /proc/sys/net/ipv4/tcp_rmem: 4096 131072 6291456 -> 4096 131072 67108864
would set /proc/sys/net/ipv4/tcp_wmem: 4096 16384 4194304 -> 4096 16384 67108864
would set /proc/sys/net/core/netdev_max_backlog: 1000 -> 250000
would set /proc/sys/net/ipv4/tcp_mtu_probing: 0 -> 1
would set /proc/sys/net/ipv4/tcp_slow_start_after_idle: 1 -> 0
would set /etc/security/limits.d/60-morio.conf: (absent) -> morio - memlock unlimited
would set /proc/irq/45/smp_affinity_list: 0-15 -> 0-1
would set /proc/irq/46/smp_affinity_list: 0-15 -> 0-1
would set /proc/irq/47/smp_affinity_list: 0-15 -> 0-1
would set /proc/irq/48/smp_affinity_list: 0-15 -> 0-1
would set /sys/class/net/eth0/queues/rx-0/rps_cpus: 0000 -> 0003
would set /sys/class/net/eth0/queues/rx-1/rps_cpus: 0000 -> 0003
would set /sys/class/net/eth0/queues/rx-2/rps_cpus: 0000 -> 0003
would set /sys/class/net/eth0/queues/rx-3/rps_cpus: 0000 -> 0003
would set /sys/class/net/eth0/queues/tx-0/xps_cpus: 0000 -> 000f
would set /sys/class/net/eth0/queues/tx-1/xps_cpus: 0000 -> 00f0
would set /sys/class/net/eth0/queues/tx-2/xps_cpus: 0000 -> 0f00
would set /sys/class/net/eth0/queues/tx-3/xps_cpus: 0000 -> f000";

fn h200_fixture(name: &str) -> PathBuf {
    let dir = scratch(name);
    fixture(&dir, "eth0", &[45, 46, 47, 48], "0-15", 4);
    dir
}

#[test]
fn shellcheck_passes_on_every_script() {
    if Command::new("shellcheck")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("note: shellcheck is not installed; skipping (.ci/run installs it)");
        return;
    }
    let mut files: Vec<String> = fs::read_dir(root().join("deploy"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "sh"))
        .map(|p| p.display().to_string())
        .collect();
    files.sort();
    files.push(testdata("fake-morio"));
    assert!(files.len() >= 4, "found only {files:?}");
    // deploy/.shellcheckrc lets it follow `. lib.sh`.
    let o = Command::new("shellcheck")
        .arg("-x")
        .args(&files)
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "shellcheck:\n{}{}",
        stdout(&o),
        stderr(&o)
    );
}

#[test]
fn scripts_are_executable_and_strict() {
    use std::os::unix::fs::PermissionsExt;
    for s in SCRIPTS {
        let p = deploy(s);
        let mode = fs::metadata(&p).unwrap().permissions().mode();
        assert!(mode & 0o111 != 0, "deploy/{s} is not executable");
        let text = read(&p);
        assert!(text.starts_with("#!/usr/bin/env bash\n"), "deploy/{s}");
        assert!(text.contains("\nset -euo pipefail\n"), "deploy/{s}");
    }
}

#[test]
fn help_prints_usage_for_every_script() {
    for s in SCRIPTS {
        for flag in ["--help", "-h"] {
            let out = run_ok(s, &[flag]);
            assert!(
                out.contains(&format!("usage: {s}")),
                "{s} {flag} prints no usage line:\n{out}"
            );
            assert!(!out.contains("set -euo"), "{s} {flag} printed code:\n{out}");
        }
    }
}

#[test]
fn bad_options_fail_clearly() {
    for s in SCRIPTS {
        let o = run(s, &["--frobnicate"]);
        assert_eq!(o.status.code(), Some(2), "{s} --frobnicate");
        let err = stderr(&o);
        assert!(
            err.contains("unknown option '--frobnicate'") && err.contains("--help"),
            "{s}: {err}"
        );
        assert!(
            stdout(&o).is_empty(),
            "{s} printed to stdout: {}",
            stdout(&o)
        );
    }
    for (s, args, says) in [
        ("tune.sh", &["--nic"][..], "option --nic needs a value"),
        (
            "tune.sh",
            &["--irq-cpus", "two"][..],
            "--irq-cpus wants a number",
        ),
        ("launch.sh", &["--print"][..], "--config FILE is required"),
        (
            "launch.sh",
            &["--config", "x", "--numactl", "maybe"][..],
            "--numactl wants",
        ),
        ("verify.sh", &["--pid", "1", "--name", "x"][..], "not both"),
        (
            "verify.sh",
            &["--pid", "me"][..],
            "--pid wants a process id",
        ),
    ] {
        let o = run(s, args);
        assert_eq!(o.status.code(), Some(2), "{s} {args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{s} {args:?}: {}", stderr(&o));
    }
    // Failures that are not about the command line: exit 1 with the reason.
    for (s, args, says) in [
        (
            "tune.sh",
            &["--plan-json", "/nonexistent/plan.json"][..],
            "cannot read --plan-json /nonexistent/plan.json",
        ),
        (
            "launch.sh",
            &["--config", "x", "--morio", "/nonexistent/morio"][..],
            "/nonexistent/morio topology --json",
        ),
        (
            "verify.sh",
            &["--name", "no-such-morio-x"][..],
            "no process named",
        ),
    ] {
        let o = run(s, args);
        assert_eq!(o.status.code(), Some(1), "{s} {args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{s} {args:?}: {}", stderr(&o));
    }
}

#[test]
fn bad_plan_json_is_refused_with_the_reason() {
    let dir = scratch("bad-plan");
    let plan = dir.join("plan.json");
    write(
        &plan,
        r#"{"cpus": [], "nodes": [], "nics": [], "plan": {"node": 0}}"#,
    );
    let o = run(
        "launch.sh",
        &[
            "--config",
            "x",
            "--print",
            "--plan-json",
            plan.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("missing \"allowed_cpus\""), "{err}");
    assert!(err.contains("plan: missing \"shard_cpus\""), "{err}");
    write(&plan, "{not json");
    let o = run("tune.sh", &["--plan-json", plan.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("bad plan JSON"), "{}", stderr(&o));
}

#[test]
fn tune_dry_run_prints_every_change_and_changes_nothing() {
    let dir = h200_fixture("tune-dry");
    let before = read(&dir.join("proc/irq/45/smp_affinity_list"));
    let out = tune_ok(&dir, &["--plan-json", &testdata("h200-1s16c.json")]);
    assert_eq!(changes(&out, &dir).join("\n"), H200_DRY_RUN, "{out}");
    assert!(out.starts_with("# morio tune.sh: dry run"), "{out}");
    assert!(
        out.contains("node 0, nic eth0, irq cpus 0-1, shard cpus 2-15"),
        "{out}"
    );
    assert!(
        out.ends_with("# 20 changes to make: run again with --apply\n"),
        "{out}"
    );
    assert_eq!(read(&dir.join("proc/irq/45/smp_affinity_list")), before);
    assert_eq!(read(&dir.join("proc/sys/net/core/rmem_max")), "212992\n");
    assert!(!dir.join("etc/security").exists());
    // --check: the same output, and exit 1 because something would change.
    let o = tune(
        &dir,
        &["--check", "--plan-json", &testdata("h200-1s16c.json")],
    );
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(changes(&stdout(&o), &dir).join("\n"), H200_DRY_RUN);
}

#[test]
fn tune_apply_writes_the_files_then_everything_is_ok() {
    let dir = h200_fixture("tune-apply");
    let plan = testdata("h200-1s16c.json");
    let out = tune_ok(&dir, &["--apply", "--plan-json", &plan]);
    let want = H200_DRY_RUN.replace("would set ", "set ");
    assert_eq!(changes(&out, &dir).join("\n"), want, "{out}");
    assert!(out.ends_with("# applied 20 changes\n"), "{out}");

    let f = |p: &str| read(&dir.join(p));
    assert_eq!(f("proc/sys/net/core/rmem_max"), "67108864\n");
    assert_eq!(f("proc/sys/net/core/wmem_max"), "67108864\n");
    assert_eq!(f("proc/sys/net/ipv4/tcp_rmem"), "4096\t131072\t67108864\n");
    assert_eq!(f("proc/sys/net/ipv4/tcp_wmem"), "4096\t16384\t67108864\n");
    assert_eq!(f("proc/sys/net/core/netdev_max_backlog"), "250000\n");
    assert_eq!(f("proc/sys/net/ipv4/tcp_mtu_probing"), "1\n");
    assert_eq!(f("proc/sys/net/ipv4/tcp_slow_start_after_idle"), "0\n");
    assert_eq!(
        f("etc/security/limits.d/60-morio.conf"),
        "morio - memlock unlimited\n"
    );
    for irq in 45..=48 {
        assert_eq!(f(&format!("proc/irq/{irq}/smp_affinity_list")), "0-1\n");
    }
    for q in 0..4 {
        assert_eq!(
            f(&format!("sys/class/net/eth0/queues/rx-{q}/rps_cpus")),
            "0003\n"
        );
    }
    let xps: Vec<String> = (0..4)
        .map(|q| f(&format!("sys/class/net/eth0/queues/tx-{q}/xps_cpus")))
        .collect();
    assert_eq!(xps, ["000f\n", "00f0\n", "0f00\n", "f000\n"]);

    // Second run: nothing left to do, and --check agrees.
    let again = tune_ok(&dir, &["--check", "--plan-json", &plan]);
    let lines = changes(&again, &dir);
    assert_eq!(lines.len(), 20, "{again}");
    assert!(
        lines.iter().all(|l| l.starts_with("ok ")),
        "not all ok after --apply:\n{again}"
    );
    assert!(lines.contains(&"ok /proc/irq/45/smp_affinity_list already 0-1".to_string()));
    assert!(
        lines.contains(&"ok /proc/sys/net/ipv4/tcp_rmem already 4096 131072 67108864".to_string())
    );
    assert!(again.ends_with("# nothing to change\n"), "{again}");
}

#[test]
fn tune_keeps_values_that_are_already_higher() {
    let dir = h200_fixture("tune-higher");
    write(&dir.join("proc/sys/net/core/rmem_max"), "268435456\n");
    write(&dir.join("proc/sys/net/ipv4/tcp_mtu_probing"), "2\n");
    write(
        &dir.join("proc/sys/net/ipv4/tcp_wmem"),
        "8192\t65536\t134217728\n",
    );
    fs::remove_file(dir.join("proc/sys/net/core/netdev_max_backlog")).unwrap();
    write(&dir.join("proc/irq/46/smp_affinity_list"), "0-1\n");
    fs::remove_dir_all(dir.join("proc/irq/47")).unwrap();
    write(&dir.join("proc/812/comm"), "irqbalance\n");
    write(&dir.join("proc/813/comm"), "sshd\n");
    let out = tune_ok(&dir, &["--plan-json", &testdata("h200-1s16c.json")]);
    assert!(
        out.contains("# warning: irqbalance (pid 812) is running and will move these IRQs again"),
        "{out}"
    );
    let lines = changes(&out, &dir);
    for want in [
        "ok /proc/sys/net/core/rmem_max already 268435456",
        "ok /proc/sys/net/ipv4/tcp_mtu_probing already 2",
        "ok /proc/sys/net/ipv4/tcp_wmem already 8192 65536 134217728",
        "skip /proc/sys/net/core/netdev_max_backlog: not present",
        "ok /proc/irq/46/smp_affinity_list already 0-1",
        "skip /proc/irq/47/smp_affinity_list: not present",
        "would set /proc/irq/48/smp_affinity_list: 0-15 -> 0-1",
    ] {
        assert!(lines.iter().any(|l| l == want), "no '{want}' in:\n{out}");
    }
}

#[test]
fn tune_reports_a_failed_write_and_exits_1() {
    let dir = h200_fixture("tune-fail");
    // --etc-dir under a regular file: limits.d cannot be created, even as root.
    write(&dir.join("not-a-dir"), "x\n");
    let mut args = roots(&dir);
    args.truncate(4);
    let etc = dir.join("not-a-dir").display().to_string();
    let plan = testdata("h200-1s16c.json");
    args.extend(["--etc-dir", &etc, "--apply", "--plan-json", &plan].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = run("tune.sh", &args);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let out = stdout(&o);
    assert!(
        out.contains("failed ")
            && out.contains("not-a-dir/security/limits.d/60-morio.conf: (absent) -> morio - memlock unlimited ("),
        "{out}"
    );
    assert!(out.ends_with("# 1 of 20 changes failed\n"), "{out}");
    // The other changes were still made.
    assert_eq!(read(&dir.join("proc/irq/45/smp_affinity_list")), "0-1\n");
}

#[test]
fn tune_on_a_dual_socket_host_uses_the_nic_s_node() {
    let dir = scratch("tune-dual");
    // ens5f0np0 (node 1, IRQs 108-109, 12 queues) and ens1f0np0 (node 0, IRQs 100-101).
    fixture(&dir, "ens5f0np0", &[108, 109], "4-7,12-15", 12);
    fixture(&dir, "ens1f0np0", &[100, 101], "0-3,8-11", 2);
    let plan = testdata("dual-socket-smt-8nic.json");
    let out = tune_ok(&dir, &["--plan-json", &plan]);
    assert!(
        out.contains("node 1, nic ens5f0np0, irq cpus 4,12, shard cpus 5-7"),
        "{out}"
    );
    let lines = changes(&out, &dir);
    for want in [
        "would set /proc/irq/108/smp_affinity_list: 4-7,12-15 -> 4,12",
        "would set /proc/irq/109/smp_affinity_list: 4-7,12-15 -> 4,12",
        "would set /sys/class/net/ens5f0np0/queues/rx-0/rps_cpus: 0000 -> 1010",
        "would set /sys/class/net/ens5f0np0/queues/rx-11/rps_cpus: 0000 -> 1010",
    ] {
        assert!(lines.iter().any(|l| l == want), "no '{want}' in:\n{out}");
    }
    // Queues in numeric order (rx-2 before rx-10), every one of them.
    let rx: Vec<u32> = lines
        .iter()
        .filter(|l| l.contains("/rps_cpus:"))
        .map(|l| {
            l.split("/rx-")
                .nth(1)
                .unwrap()
                .split('/')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert_eq!(rx, (0..12).collect::<Vec<_>>(), "{out}");
    // XPS: every CPU in exactly one TX queue, siblings and nodes kept together.
    let xps: Vec<u32> = lines
        .iter()
        .filter(|l| l.contains("/xps_cpus:"))
        .map(|l| u32::from_str_radix(l.rsplit(" -> ").next().unwrap(), 16).unwrap())
        .collect();
    assert_eq!(xps.len(), 12);
    assert_eq!(xps.iter().fold(0, |a, m| a | m), 0xffff);
    assert_eq!(xps.iter().map(|m| m.count_ones()).sum::<u32>(), 16);
    assert_eq!(xps[0], 0x0001, "cpu 0 first: {out}");
    assert_eq!(xps[11], 0x8080, "cpu 7 and its sibling 15 last: {out}");
    // Queues with two CPUs hold SMT siblings (c and c + 8 in this topology).
    for m in xps.iter().filter(|m| m.count_ones() == 2) {
        assert_eq!(m >> 8, m & 0xff, "{m:#06x} splits a core: {out}");
    }

    // Another NIC by --nic: its own IRQs, same IRQ CPUs (the plan's).
    let out = tune_ok(&dir, &["--plan-json", &plan, "--nic", "ens1f0np0"]);
    assert!(
        changes(&out, &dir)
            .contains(&"would set /proc/irq/100/smp_affinity_list: 0-3,8-11 -> 4,12".to_string()),
        "{out}"
    );
    assert!(
        out.contains("# warning: NIC ens1f0np0 is on node 0, the plan is built around node 1"),
        "{out}"
    );
    assert!(!out.contains("/irq/108/"), "{out}");
    // A NIC the plan does not know: refused, naming the ones it knows.
    let o = tune(&dir, &["--plan-json", &plan, "--nic", "bogus0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("NIC bogus0 is not in the plan's nics (have: ens1f0np0 ens1f1np1"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn tune_asks_morio_topology_for_the_plan() {
    let dir = h200_fixture("tune-morio");
    let args_file = dir.join("morio-args");
    let mut args = roots(&dir);
    args.extend(
        [
            "--morio",
            &testdata("fake-morio"),
            "--nic",
            "eth0",
            "--irq-cpus",
            "2",
        ]
        .map(String::from),
    );
    let o = Command::new(deploy("tune.sh"))
        .args(&args)
        .env("FAKE_MORIO_JSON", testdata("h200-1s16c.json"))
        .env("FAKE_MORIO_ARGS", &args_file)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(changes(&stdout(&o), &dir).join("\n"), H200_DRY_RUN);
    let sys = dir.join("sys").display().to_string();
    let proc_ = dir.join("proc").display().to_string();
    assert_eq!(
        read(&args_file).lines().collect::<Vec<_>>(),
        [
            "topology",
            "--json",
            "--sysfs-root",
            &sys,
            "--proc-root",
            &proc_,
            "--nic",
            "eth0",
            "--irq-cpus",
            "2"
        ]
    );
    // $MORIO works too (and --morio is not needed).
    let o = Command::new(deploy("launch.sh"))
        .args([
            "--config",
            "/etc/morio.toml",
            "--print",
            "--numactl",
            "never",
        ])
        .env("MORIO", testdata("fake-morio"))
        .env("FAKE_MORIO_JSON", testdata("dual-socket-smt-8nic.json"))
        .env("FAKE_MORIO_ARGS", &args_file)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        format!(
            "taskset -c 5-7 {} serve --config /etc/morio.toml --cpus 5,6,7\n",
            testdata("fake-morio")
        )
    );
}

#[test]
fn launch_prints_the_exact_command() {
    let h200 = testdata("h200-1s16c.json");
    let base = [
        "--config",
        "/etc/morio/morio.toml",
        "--morio",
        "/usr/local/bin/morio",
        "--print",
    ];
    let with = |extra: &[&str]| {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        run_ok("launch.sh", &a)
    };
    assert_eq!(
        with(&["--plan-json", &h200, "--numactl", "always"]),
        "numactl --cpunodebind=0 --membind=0 taskset -c 2-15 /usr/local/bin/morio serve \
         --config /etc/morio/morio.toml --cpus 2,3,4,5,6,7,8,9,10,11,12,13,14,15\n"
    );
    assert_eq!(
        with(&["--plan-json", &h200, "--numactl", "never"]),
        "taskset -c 2-15 /usr/local/bin/morio serve --config /etc/morio/morio.toml \
         --cpus 2,3,4,5,6,7,8,9,10,11,12,13,14,15\n"
    );
    // The dual-socket plan: node 1; arguments after -- go to morio, quoted where needed.
    assert_eq!(
        with(&[
            "--plan-json",
            &testdata("dual-socket-smt-8nic.json"),
            "--numactl=always",
            "--",
            "--log",
            "a b",
        ]),
        "numactl --cpunodebind=1 --membind=1 taskset -c 5-7 /usr/local/bin/morio serve \
         --config /etc/morio/morio.toml --cpus 5,6,7 --log 'a b'\n"
    );
    // auto: numactl only when installed.
    let auto = with(&["--plan-json", &h200]);
    let has_numactl = Command::new("sh")
        .args(["-c", "command -v numactl"])
        .output()
        .unwrap()
        .status
        .success();
    assert_eq!(auto.starts_with("numactl "), has_numactl, "{auto}");
}

#[test]
fn launch_really_runs_the_command() {
    // /bin/echo as morio: proves the exec path, taskset included, on any machine (the plan
    // uses one CPU this process may run on).
    let dir = scratch("launch-run");
    let cpu = first_allowed_cpu();
    let plan = dir.join("plan.json");
    write(
        &plan,
        &format!(
            r#"{{"sysfs_root": "/sys", "allowed_cpus": "{cpu}",
                "cpus": [{{"id": {cpu}, "core": 0, "package": 0, "node": 0, "siblings": "{cpu}"}}],
                "nodes": [{{"id": 0, "cpus": "{cpu}", "distances": [10]}}],
                "nics": [], "gpus": [],
                "plan": {{"node": 0, "nic": null, "gpu": null, "shard_cpus": "{cpu}",
                         "irq_cpus": "", "app_cpus": "", "shards": [{cpu}]}}}}"#
        ),
    );
    let config = dir.join("morio.toml");
    write(&config, "# empty\n");
    let o = run(
        "launch.sh",
        &[
            "--config",
            config.to_str().unwrap(),
            "--morio",
            "/bin/echo",
            "--numactl",
            "never",
            "--plan-json",
            plan.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        format!("serve --config {} --cpus {cpu}\n", config.display())
    );
    assert!(
        stderr(&o).contains(&format!("launch.sh: exec taskset -c {cpu} /bin/echo serve")),
        "{}",
        stderr(&o)
    );
    // A missing config is caught before anything runs.
    let o = run(
        "launch.sh",
        &[
            "--config",
            "/nonexistent.toml",
            "--morio",
            "/bin/echo",
            "--plan-json",
            plan.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("cannot read --config /nonexistent.toml"));
}

#[test]
fn launch_renders_the_systemd_unit() {
    let out = run_ok(
        "launch.sh",
        &[
            "--unit",
            "--config",
            "/etc/morio/morio.toml",
            "--morio",
            "/usr/local/bin/morio",
            "--plan-json",
            &testdata("dual-socket-smt-8nic.json"),
        ],
    );
    let deploy_dir = root().join("deploy").display().to_string();
    for want in [
        "User=morio".to_string(),
        "ExecStart=/usr/local/bin/morio serve --config /etc/morio/morio.toml --cpus 5,6,7".into(),
        format!(
            "ExecStartPre=-+{deploy_dir}/tune.sh --apply --morio /usr/local/bin/morio --user morio \
             --nic ens5f0np0 --plan-json {}",
            testdata("dual-socket-smt-8nic.json")
        ),
        "CPUAffinity=5-7".into(),
        "NUMAPolicy=bind".into(),
        "NUMAMask=1".into(),
        "LimitMEMLOCK=infinity".into(),
        "AmbientCapabilities=CAP_IPC_LOCK".into(),
    ] {
        assert!(out.lines().any(|l| l == want), "no '{want}' in:\n{out}");
    }
    for l in out.lines().filter(|l| !l.starts_with('#')) {
        assert!(!l.contains('@'), "placeholder left: {l}");
    }
    // No NUMA node in the plan: the NUMA lines come out commented, the rest stays.
    let dir = scratch("launch-unit");
    let plan = dir.join("plan.json");
    let h200 = read(Path::new(&testdata("h200-1s16c.json")));
    write(
        &plan,
        &h200.replace(
            r#""plan": {"node": 0, "nic": "eth0""#,
            r#""plan": {"node": null, "nic": "eth0""#,
        ),
    );
    let out = run_ok(
        "launch.sh",
        &[
            "--unit",
            "--config",
            "/etc/m.toml",
            "--morio",
            "/usr/bin/morio",
            "--user",
            "xfer",
            "--plan-json",
            plan.to_str().unwrap(),
        ],
    );
    assert!(
        out.contains("\n# (not in the plan) NUMAMask=@NODE@\n"),
        "{out}"
    );
    assert!(
        out.contains("\n# (not in the plan) NUMAPolicy=@NUMA_POLICY@\n"),
        "{out}"
    );
    assert!(
        out.contains("\nCPUAffinity=2-15\n") && out.contains("\nUser=xfer\n"),
        "{out}"
    );
    // A relative morio cannot go into a unit.
    let o = run(
        "launch.sh",
        &[
            "--unit",
            "--config",
            "/m.toml",
            "--morio",
            "morio",
            "--plan-json",
            plan.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("absolute morio path"), "{}", stderr(&o));
}

/// A thread named morio-shard-0, pinned to `cpu`; returns its TID and a sender that ends it.
fn pinned_shard_thread(cpu: usize) -> (i32, mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (tid_tx, tid_rx) = mpsc::channel();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let h = std::thread::Builder::new()
        .name("morio-shard-0".into())
        .spawn(move || {
            // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes inside it; the call reads it.
            let rc = unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
            };
            assert_eq!(rc, 0, "sched_setaffinity({cpu})");
            // SAFETY: gettid has no preconditions.
            tid_tx.send(unsafe { libc::gettid() }).unwrap();
            let _ = stop_rx.recv();
        })
        .unwrap();
    (tid_rx.recv().unwrap(), stop_tx, h)
}

/// The first CPU this process may run on.
fn first_allowed_cpu() -> usize {
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

fn plan_with_shards(dir: &Path, shards: &[usize]) -> String {
    let list: Vec<String> = shards.iter().map(|c| c.to_string()).collect();
    let path = dir.join(format!("plan-{}.json", list.join("-")));
    let h200 = read(Path::new(&testdata("h200-1s16c.json")));
    let plan_at = h200.find(r#""plan": "#).unwrap();
    write(
        &path,
        &format!(
            "{}\"plan\": {{\"node\": 0, \"nic\": null, \"gpu\": null, \"shard_cpus\": \"{}\", \
             \"irq_cpus\": \"\", \"app_cpus\": \"\", \"shards\": [{}]}}\n}}\n",
            &h200[..plan_at],
            list.join(","),
            list.join(", ")
        ),
    );
    path.display().to_string()
}

#[test]
fn verify_finds_this_process_s_pinned_shard() {
    let cpu = first_allowed_cpu();
    let (tid, stop, handle) = pinned_shard_thread(cpu);
    let dir = scratch("verify");
    let pid = std::process::id().to_string();

    // Every thread, without a plan: the shard shows pinned, this (main) thread too.
    let out = run_ok("verify.sh", &["--pid", &pid]);
    let mut lines = out.lines();
    assert!(
        lines.next().unwrap().starts_with(&format!("# pid {pid} (")),
        "{out}"
    );
    assert_eq!(
        lines.next().unwrap().split_whitespace().collect::<Vec<_>>(),
        ["TID", "NAME", "CPU", "ALLOWED", "PLANNED", "STATUS"]
    );
    let row = |out: &str, name: &str| -> Vec<String> {
        out.lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name))
            .unwrap_or_else(|| panic!("no {name} row in:\n{out}"))
            .split_whitespace()
            .map(String::from)
            .collect()
    };
    let c = cpu.to_string();
    let t = tid.to_string();
    assert_eq!(
        row(&out, "morio-shard-0"),
        [&t, "morio-shard-0", &c, &c, "-", "pinned"]
    );
    assert!(
        out.lines().count() > 4,
        "the test harness has more threads:\n{out}"
    );
    assert!(
        out.ends_with(
            "# 1 shard threads (no plan given: --plan-json FILE or --plan to check placement)\n"
        ),
        "{out}"
    );

    // Against a plan that puts shard 0 on this CPU: ok, exit 0.
    let good = plan_with_shards(&dir, &[cpu]);
    let out = run_ok(
        "verify.sh",
        &["--pid", &pid, "--shards-only", "--plan-json", &good],
    );
    assert_eq!(
        out.lines().skip(2).collect::<Vec<_>>().len(),
        2,
        "one shard row and the summary:\n{out}"
    );
    assert_eq!(
        row(&out, "morio-shard-0"),
        [&t, "morio-shard-0", &c, &c, &c, "ok"]
    );
    assert!(
        out.ends_with("# 1 shard threads, 1 planned: all ok\n"),
        "{out}"
    );

    // A plan that wants shard 0 elsewhere and a shard 1 too: flagged, exit 1.
    let other = cpu + 1;
    let bad = plan_with_shards(&dir, &[other, cpu]);
    let o = run(
        "verify.sh",
        &["--pid", &pid, "--shards-only", "--plan-json", &bad],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let out = stdout(&o);
    let o_s = other.to_string();
    assert_eq!(
        row(&out, "morio-shard-0"),
        [&t, "morio-shard-0", &c, &c, &o_s, "unpinned"]
    );
    assert_eq!(
        row(&out, "morio-shard-1"),
        ["-", "morio-shard-1", "-", "-", &c, "missing"]
    );
    assert!(
        out.ends_with("# 1 shard threads, 2 planned: 2 not ok\n"),
        "{out}"
    );

    stop.send(()).unwrap();
    handle.join().unwrap();
}

/// Parses "0-3,8,10-11".
fn cpus(list: &str) -> BTreeSet<u64> {
    let mut out = BTreeSet::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        out.extend(a.parse::<u64>().unwrap()..=b.parse::<u64>().unwrap());
    }
    out
}

#[test]
fn testdata_plans_are_consistent() {
    for name in ["h200-1s16c.json", "dual-socket-smt-8nic.json"] {
        let v: serde_json::Value = serde_json::from_str(&read(Path::new(&testdata(name)))).unwrap();
        let plan = &v["plan"];
        let s = |x: &serde_json::Value| cpus(x.as_str().unwrap());
        let all: BTreeSet<u64> = v["cpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_u64().unwrap())
            .collect();
        assert_eq!(s(&v["allowed_cpus"]), all, "{name}");
        let (shard, irq, app) = (
            s(&plan["shard_cpus"]),
            s(&plan["irq_cpus"]),
            s(&plan["app_cpus"]),
        );
        let shards: BTreeSet<u64> = plan["shards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_u64().unwrap())
            .collect();
        assert_eq!(shards, shard, "{name}: shards and shard_cpus differ");
        assert!(
            shard.is_disjoint(&irq) && shard.is_disjoint(&app) && irq.is_disjoint(&app),
            "{name}"
        );
        let union: BTreeSet<u64> = shard.iter().chain(&irq).chain(&app).copied().collect();
        assert_eq!(union, all, "{name}: the three lists must cover every CPU");
        // Every CPU is in its node's list; the plan's node, NIC and NIC node agree.
        for c in v["cpus"].as_array().unwrap() {
            let node = &v["nodes"][c["node"].as_u64().unwrap() as usize];
            assert!(
                s(&node["cpus"]).contains(&c["id"].as_u64().unwrap()),
                "{name}: {c}"
            );
        }
        let nic = v["nics"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == plan["nic"])
            .unwrap_or_else(|| panic!("{name}: the plan's NIC is not in nics"));
        assert_eq!(nic["node"], plan["node"], "{name}");
        let node = &v["nodes"][plan["node"].as_u64().unwrap() as usize];
        assert!(
            irq.is_subset(&s(&node["cpus"])),
            "{name}: IRQ CPUs off the NIC's node"
        );
        let irqs: Vec<u64> = v["nics"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|n| {
                n["irqs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|i| i.as_u64().unwrap())
            })
            .collect();
        assert_eq!(
            irqs.len(),
            irqs.iter().collect::<BTreeSet<_>>().len(),
            "{name}: IRQ reused"
        );
    }
    let dual: serde_json::Value =
        serde_json::from_str(&read(Path::new(&testdata("dual-socket-smt-8nic.json")))).unwrap();
    assert_eq!(dual["nics"].as_array().unwrap().len(), 8);
    assert_eq!(dual["nodes"].as_array().unwrap().len(), 2);
}

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

/// The real pipeline: `morio topology --json` over the committed 2-socket fixture drives a
/// dry run of tune.sh, which moves the node-1 NIC's IRQs onto that node's first core (both
/// SMT threads) and changes nothing (the fixture is read only here).
#[test]
fn tune_dry_run_with_the_real_topology_command_on_the_two_socket_fixture() {
    let fx = root().join("topology/tests/fixtures/2s-smt-8gpu-8nic");
    let sys = fx.join("sys");
    let proc_ = fx.join("proc");
    let before = read(&proc_.join("irq/150/smp_affinity_list"));
    let out = run_ok(
        "tune.sh",
        &[
            "--morio",
            env!("CARGO_BIN_EXE_morio"),
            "--sysfs-root",
            sys.to_str().unwrap(),
            "--proc-root",
            proc_.to_str().unwrap(),
            "--etc-dir",
            scratch("tune-real-topology-etc").to_str().unwrap(),
            "--nic",
            "eth5",
            "--allowed",
            "0-63",
        ],
    );
    assert!(
        out.contains("node 1, nic eth5, irq cpus 16,48, shard cpus 17-31"),
        "{out}"
    );
    for irq in 150..=153 {
        let line = format!(
            "would set {}/irq/{irq}/smp_affinity_list: 16-31,48-63 -> 16,48",
            proc_.display()
        );
        assert!(out.contains(&line), "missing {line:?} in\n{out}");
    }
    assert_eq!(
        read(&proc_.join("irq/150/smp_affinity_list")),
        before,
        "a dry run changed a file"
    );
}

// --- containers: the host check, the seccomp profile, the Dockerfile -------------------------

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
