//! The `morio` command's edges, as a new user meets them: bad option values are one clear
//! error and an exit status of 1 or 2, never a panic; an error is said once; `morio
//! loopback` says what it is doing as it goes.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn morio(args: &[&str]) -> (Output, Duration) {
    morio_env(args, &[])
}

/// [`morio`] with these environment variables set.
fn morio_env(args: &[&str], env: &[(&str, &str)]) -> (Output, Duration) {
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_morio"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .env_remove("RUST_LOG")
        .env_remove("MORIO_LOG")
        .envs(env.iter().copied())
        .output()
        .expect("run morio");
    (out, t.elapsed())
}

/// `morio check` says whether shards busy-poll after their work, as engines will decide.
#[test]
fn check_reports_busy_polling() {
    let (out, _) = morio_env(
        &["check"],
        &[("MORIO_BUSY_POLL_US", "150"), ("MORIO_BUSY_YIELD_US", "")],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(
            "ok: shards busy-poll 150 us after their work, then yield their CPU between polls \
             for 1000 us"
        ) && text.contains("(MORIO_BUSY_POLL_US)"),
        "{text}"
    );
    let (out, _) = morio_env(
        &["check"],
        &[("MORIO_BUSY_POLL_US", "150"), ("MORIO_BUSY_YIELD_US", "0")],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("ok: shards busy-poll 150 us after their work, then park,"),
        "{text}"
    );
    let (out, _) = morio_env(&["check"], &[("MORIO_BUSY_POLL_US", "0")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("note: shards park right after their work (MORIO_BUSY_POLL_US;"),
        "{text}"
    );
    let (out, _) = morio_env(&["check"], &[("MORIO_BUSY_POLL_US", "soon")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("MORIO_BUSY_POLL_US must be a number of microseconds")
            && text.contains("engines will refuse to start"),
        "{text}"
    );
    // Unset: the default for this host's CPUs.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (out, _) = morio_env(&["check"], &[("MORIO_BUSY_POLL_US", "")]);
    let text = String::from_utf8_lossy(&out.stdout);
    let want = if cpus >= 8 {
        "ok: shards busy-poll 100 us"
    } else {
        "note: shards park right after their work (the default with"
    };
    assert!(text.contains(want), "{cpus} CPUs: {text}");
}

/// `morio check` says whether the same-host transport is available, as the library finds.
#[test]
fn check_reports_the_same_host_transport() {
    let (out, _) = morio(&["check"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    match morio::check_same_host() {
        Ok(()) => assert!(
            text.contains("ok: the same-host transport is available"),
            "{text}"
        ),
        Err(why) => assert!(text.contains(&why), "{text}"),
    }
    // Whether small transfers go through shared-memory rings, and with the switch off, why not.
    if morio::check_same_host().is_ok() {
        assert!(
            text.contains("ok: small same-host transfers go through shared-memory rings")
                == morio::check_same_host_rings().is_ok(),
            "{text}"
        );
        let (out, _) = morio_env(&["check"], &[("MORIO_SAME_HOST_RING", "off")]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("note: no same-host rings here (turned off"),
            "{text}"
        );
    }
    // And whether GPU memory moves device to device (never here without a GPU runtime).
    match morio::gpu::check_ipc() {
        Ok(rt) => assert!(
            text.contains(&rt) && text.contains("device to device"),
            "{text}"
        ),
        Err(why) => assert!(
            text.contains("note: GPU memory between engines of this host is staged")
                && text.contains(&why),
            "{text}"
        ),
    }
}

#[test]
fn bad_values_are_clear_errors_not_panics() {
    let bench = |extra: &[&'static str]| {
        let mut v = vec!["bench", "--loopback", "--no-pin"];
        v.extend_from_slice(extra);
        v
    };
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["loopback", "--conns", "0"], "--conns"),
        (vec!["loopback", "--conns", "17"], "--conns"),
        (
            vec!["loopback", "--conns", "99999999999999999999"],
            "--conns",
        ),
        (vec!["loopback", "--shards", "0"], "--shards"),
        (vec!["loopback", "--shards", "100000"], "--shards"),
        (vec!["loopback", "--size", "0"], "--size"),
        (vec!["loopback", "--size", "1000000G"], "--size"),
        (vec!["loopback", "--size", "18446744073709551615"], "--size"),
        (vec!["loopback", "--chunk", "0"], "--chunk"),
        (vec!["loopback", "--chunk", "1000000G"], "--chunk"),
        (vec!["loopback", "--size", "1Q"], "--size"),
        (bench(&["--shards", "0"]), "--shards"),
        (
            bench(&["--gpu-staging-bytes", "12KiB"]),
            "gpu_staging_bytes",
        ),
        (bench(&["--num-data-conns", "0"]), "num_data_conns"),
        (bench(&["--buffer-size", "0"]), "--buffer-size"),
        (bench(&["--buffer-size", "1000000G"]), "buffer"),
        (
            bench(&["--transfer-batch-size", "0"]),
            "--transfer-batch-size",
        ),
        (bench(&["--iters", "0"]), "--iters"),
        (bench(&["--chunk-bytes", "0"]), "chunk_bytes"),
        (bench(&["--gpu-slot-bytes", "0"]), "gpu_slot_bytes"),
        (bench(&["--gpu-chunk-bytes", "100"]), "gpu_chunk_bytes"),
        (bench(&["--ceiling-bytes", "0"]), "--ceiling-bytes"),
        (bench(&["--port", "70000"]), "--port"),
        (vec!["bench", "--role", "initiator"], "--connect"),
    ];
    for (args, names) in cases {
        let (out, took) = morio(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        let code = out.status.code();
        assert!(
            matches!(code, Some(1 | 2)),
            "{args:?}: exit {code:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!err.contains("backtrace"), "{args:?}: {err}");
        assert!(err.contains(names), "{args:?}: no {names:?} in: {err}");
        assert!(took < Duration::from_secs(20), "{args:?}: {took:?}");
    }
}

/// An error whose cause is also in its own words is said once, in one line.
#[test]
fn errors_are_said_once() {
    let dir = std::env::temp_dir().join(format!("morio-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("bad-host.toml");
    std::fs::write(
        &cfg,
        "[engine]\nkey = \"k\"\nhost = \"localhost\"\n[control]\nlisten = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    let (out, _) = morio(&["serve", "--config", cfg.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(
        err.matches("is not a numeric IP address").count(),
        1,
        "said more than once: {err}"
    );
    assert!(!err.contains("Caused by"), "{err}");
    // The bench target cannot listen on an address this host does not have: the target
    // says why (once), the launcher that it failed.
    let (out, _) = morio(&[
        "bench",
        "--loopback",
        "--no-pin",
        "--shards",
        "1",
        "--host",
        "192.0.2.1",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(
        err.matches("ssign requested address").count(),
        1,
        "said more than once: {err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `morio loopback` prints a line per phase as it goes, and verifies both directions.
#[test]
fn loopback_reports_each_phase() {
    let (out, _) = morio(&[
        "loopback", "--size", "8MiB", "--no-pin", "--shards", "1", "--conns", "2",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut at = 0;
    for phase in [
        "plain TCP, 1 stream:",
        "engines up:",
        "buffers registered:",
        "write:",
        "write verified",
        "read:",
        "read verified",
        "verified: 8388608 bytes written and 8388608 bytes read back",
    ] {
        let i = text[at..]
            .find(phase)
            .unwrap_or_else(|| panic!("no {phase:?} after byte {at}: {text}"));
        at += i + phase.len();
    }
}

/// `--log-level` and `--log-format json`: the library's records come out as JSON objects
/// naming their module; a bad level is one clear error.
#[test]
fn logs_are_leveled_and_can_be_json() {
    let (out, _) = morio(&[
        "loopback",
        "--size",
        "8MiB",
        "--no-pin",
        "--log-level",
        "info",
        "--log-format",
        "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let records: Vec<serde_json::Value> = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(
        records.iter().any(|r| r["level"] == "INFO"
            && r["target"] == "morio::engine::backend"
            && r["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("listening on port"))),
        "{err}"
    );
    // The default level shows no info records.
    let (quiet, _) = morio(&["loopback", "--size", "8MiB", "--no-pin"]);
    assert!(!String::from_utf8_lossy(&quiet.stderr).contains("listening on port"));
    let (bad, _) = morio(&["check", "--log-level", "warn,["]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--log-level"));
}
