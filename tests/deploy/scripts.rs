//! What every `deploy/` script must do: pass shellcheck, be executable and strict, print
//! its usage for `--help`, and fail clearly on bad options and bad plan JSON.

use std::fs;
use std::process::Command;

use crate::common::{deploy, read, root, run, run_ok, scratch, stderr, stdout, testdata, write};

const SCRIPTS: [&str; 3] = ["tune.sh", "launch.sh", "verify.sh"];

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
