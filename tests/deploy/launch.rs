//! `launch.sh`: the exact command it prints for each plan and `--numactl` setting, running it
//! for real (with `/bin/echo` as morio), and the systemd unit it renders.

use std::path::Path;
use std::process::Command;

use crate::common::{
    first_allowed_cpu, read, root, run, run_ok, scratch, stderr, stdout, testdata, write,
};

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
