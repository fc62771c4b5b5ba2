//! `tune.sh` against fixture /proc, /sys and /etc trees built in a scratch directory: dry
//! run, `--check` and `--apply`, values already higher, failed writes, a dual-socket host,
//! the plan from `morio topology` (a stand-in, then the real command on the committed
//! two-socket fixture).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::{deploy, read, root, run, run_ok, scratch, stderr, stdout, testdata, write};

/// The change lines of tune.sh's output (not the '#' context), with `prefix` removed.
fn changes(out: &str, prefix: &Path) -> Vec<String> {
    out.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.replace(&prefix.display().to_string(), ""))
        .collect()
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
