//! `morio bench --loopback` end to end, as a user runs it: two processes, validated rows, the
//! JSON report; host memory, GPU memory through the fake runtime, and a missing GPU runtime.

use std::process::Command;

fn bench(args: &[&str], json: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_morio"))
        .args([
            "bench",
            "--loopback",
            "--no-pin",
            "--shards",
            "1",
            "--buffer-size",
            "64KiB",
            "--transfer-batch-size",
            "8",
            "--enable-batch-transfer",
            "--iters",
            "4",
            "--no-ceiling",
            "--json",
        ])
        .arg(json)
        .args(args)
        .output()
        .expect("run morio bench")
}

fn rows(json: &std::path::Path) -> Vec<serde_json::Value> {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(json).expect("JSON report")).unwrap();
    v["rows"].as_array().expect("rows").clone()
}

#[test]
fn bench_moves_validated_rows_between_host_and_gpu_memory() {
    let dir = std::env::temp_dir().join(format!("morio-bench-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, extra) in [
        ("cpu-write", &["--op-type", "write"][..]),
        (
            "gpu-write",
            &[
                "--op-type",
                "write",
                "--mem-type",
                "gpu",
                "--gpu-runtime",
                "fake",
            ],
        ),
        (
            "gpu-write-scattered",
            &[
                "--op-type",
                "write",
                "--mem-type",
                "gpu",
                "--gpu-runtime",
                "fake",
                "--batch-scattered",
            ],
        ),
        (
            "gpu-read-cpu",
            &[
                "--op-type",
                "read",
                "--initiator-mem-type",
                "gpu",
                "--target-mem-type",
                "cpu",
                "--gpu-runtime",
                "fake",
                "--gpu-slot-bytes",
                "16KiB",
            ],
        ),
    ] {
        let json = dir.join(format!("{name}.json"));
        let out = bench(extra, &json);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{name}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rows = rows(&json);
        assert_eq!(rows.len(), 1, "{name}");
        assert_eq!(rows[0]["validated"], true, "{name}");
        assert!(rows[0]["avg_bw_gbps"].as_f64().unwrap() > 0.0, "{name}");
        // The row's raw-TCP floor: its 512 KiB over plain streams, the way the data goes.
        let f = &rows[0]["floor"];
        let (streams, up, down) = (
            f["shape"]["streams"].as_u64().unwrap(),
            f["shape"]["up"].as_u64().unwrap(),
            f["shape"]["down"].as_u64().unwrap(),
        );
        let (share, ask) = if name.contains("write") {
            (up, down)
        } else {
            (down, up)
        };
        assert!(streams >= 1 && share * streams >= 512 << 10, "{name}: {f}");
        assert_eq!(ask, if name.contains("write") { 1 } else { 8 }, "{name}");
        assert!(f["p50_us"].as_f64().unwrap() > 0.0, "{name}: {f}");
        assert!(rows[0]["p50_over_floor"].as_f64().unwrap() > 0.0, "{name}");
        if name.ends_with("scattered") {
            let v: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
            assert_eq!(v["config"]["batch_scattered"], true, "{name}: {v}");
        }
        if name.starts_with("gpu") {
            assert!(
                stdout.contains("GPU staging (initiator)"),
                "{name}: {stdout}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bench_without_a_gpu_runtime_fails_cleanly() {
    if morio::gpu::detect().is_ok() {
        return; // This machine has a GPU: the case below cannot happen here.
    }
    let json = std::env::temp_dir().join(format!("morio-bench-nogpu-{}.json", std::process::id()));
    let out = bench(&["--mem-type", "gpu"], &json);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("GPU"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `MORIO_TRACE=DIR`: both processes leave a CSV, and every timed transfer of a spinning run
/// passes every stage, in order, on one clock: through owner shards, and as express writes
/// (which have no owner stages).
#[test]
fn trace_records_every_stage_of_every_transfer() {
    trace_run(false);
    trace_run(true);
}

/// One traced run, with express writes on or off (the engines share this host and rings).
fn trace_run(express: bool) {
    let dir = std::env::temp_dir().join(format!(
        "morio-bench-trace-{}-{express}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("row.json");
    let out = Command::new(env!("CARGO_BIN_EXE_morio"))
        .env("MORIO_TRACE", &dir)
        .env("MORIO_EXPRESS", if express { "1" } else { "0" })
        .env("MORIO_SAME_HOST_RING", "on")
        .env("MORIO_SAME_HOST", "auto")
        .args([
            "bench",
            "--loopback",
            "--no-pin",
            "--shards",
            "1",
            "--op-type",
            "write",
            "--buffer-size",
            "8",
            "--transfer-batch-size",
            "1",
            "--iters",
            "20",
            "--spin-us",
            "20000",
            "--no-ceiling",
            "--json",
        ])
        .arg(&json)
        .output()
        .expect("run morio bench");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The row says what both engines' shards did: express writes (or none), counted once
    // (a write finding its lane's sender busy, or its ring's lock held by a preempted shard,
    // takes the usual path: on a loaded 2-core machine a 20-iteration row once counted 9, so
    // only "some" is asserted; the stages below hold for either path).
    let row = &rows(&json)[0];
    let express_writes = row["initiator_counters"]["express_writes"]
        .as_u64()
        .unwrap();
    if express {
        assert!(express_writes > 0, "{row}");
    } else {
        assert_eq!(express_writes, 0, "{row}");
    }
    assert_eq!(
        row["target_counters"]["express_writes"].as_u64(),
        Some(0),
        "{row}"
    );
    let mut stages: std::collections::HashMap<u64, Vec<(u64, u64)>> = Default::default();
    let mut files = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "csv") {
            files += 1;
            let text = std::fs::read_to_string(&p).unwrap();
            for line in text.lines().skip(1) {
                let v: Vec<u64> = line.split(',').map(|x| x.parse().unwrap()).collect();
                stages.entry(v[0]).or_default().push((v[1], v[2]));
            }
        }
    }
    assert_eq!(files, 2, "one CSV per process");
    use morio::trace::stage::*;
    // Express writes skip the owner and its hand-off to the lane.
    const EXPRESS_SKIPS: [u8; 3] = [OWNER, PLANNED, HANDED];
    let has = |s: &[(u64, u64)], st: u8| s.iter().any(|&(x, _)| x == u64::from(st));
    let complete = |s: &[(u64, u64)], skipped: &[u8]| {
        (CALL..=WOKE)
            .filter(|st| !skipped.contains(st))
            .all(|st| has(s, st))
    };
    let owned: Vec<_> = stages.values().filter(|s| complete(s, &[])).collect();
    let express_done: Vec<_> = stages
        .values()
        .filter(|s| !has(s, OWNER) && complete(s, &EXPRESS_SKIPS))
        .collect();
    // Warm-up transfers are not marked CALL/WOKE by the bench; the 20 timed ones are.
    assert!(
        owned.len() + express_done.len() >= 20,
        "{} + {} complete of {}",
        owned.len(),
        express_done.len(),
        stages.len()
    );
    if express {
        assert!(express_done.len() >= 10, "{} express", express_done.len());
    } else {
        assert!(express_done.is_empty(), "express writes with express off");
    }
    // Stages that cause the next are in order on the one clock. SENT and T_SENT are marked
    // when a send returns, which on loopback may be after the peer already took the bytes
    // up, so they are checked against what precedes them on their own side only.
    for (set, skipped) in [(owned, &[][..]), (express_done, &EXPRESS_SKIPS[..])] {
        let causal: Vec<u8> = ORDER
            .iter()
            .copied()
            .filter(|&st| st != SENT && st != T_SENT && !skipped.contains(&st))
            .collect();
        for s in set {
            let at = |st: u8| {
                s.iter()
                    .find(|&&(x, _)| x == u64::from(st))
                    .map(|&(_, t)| t)
                    .unwrap()
            };
            let times: Vec<u64> = causal.iter().map(|&st| at(st)).collect();
            assert!(
                times.windows(2).all(|w| w[0] <= w[1]),
                "stages out of order: {times:?}"
            );
            assert!(at(PUSHED) <= at(SENT), "SENT before PUSHED: {s:?}");
            assert!(at(T_PLACED) <= at(T_SENT), "T_SENT before T_PLACED: {s:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `--role target` process started from `args`, and the side-channel port it printed.
fn start_target(args: &[&str]) -> (std::process::Child, u16) {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_morio"))
        .args(["bench", "--role", "target", "--no-pin", "--shards", "1"])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the target");
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let port = line
        .strip_prefix("MORIO_BENCH_TARGET ")
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    (child, port)
}

fn initiator(port: u16, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_morio"))
        .args(["bench", "--role", "initiator", "--no-pin", "--shards", "1"])
        .args(["--connect", &format!("127.0.0.1:{port}")])
        .args(["--iters", "4", "--no-ceiling", "--no-floor"])
        .args(args)
        .output()
        .expect("run the initiator")
}

/// The target allocates what the initiator's rows need, whatever size options it was
/// started with; beyond its `--max-buffer-size` it refuses, and both sides say why.
#[test]
fn the_target_is_sized_by_the_initiator() {
    let (mut target, port) = start_target(&["--buffer-size", "8", "--transfer-batch-size", "1"]);
    let out = initiator(
        port,
        &[
            "--op-type",
            "write",
            "--buffer-size",
            "64KiB",
            "--transfer-batch-size",
            "8",
            "--enable-batch-transfer",
        ],
    );
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(target.wait().unwrap().success());

    let (target, port) = start_target(&["--max-buffer-size", "64KiB"]);
    let out = initiator(
        port,
        &["--buffer-size", "1MiB", "--transfer-batch-size", "8"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("the target refuses a 8388616-byte buffer")
            && err.contains("--max-buffer-size"),
        "{err}"
    );
    let t = target.wait_with_output().unwrap();
    assert!(!t.status.success());
    assert!(String::from_utf8_lossy(&t.stderr).contains("refuses"));
}

/// No target: the initiator says so at once. A target that is slow to answer: the
/// initiator says what it waits for.
#[test]
fn an_absent_or_slow_target_is_said_clearly() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    let t0 = std::time::Instant::now();
    let out = initiator(port, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "no morio bench target at 127.0.0.1:{port}: connection refused"
        )),
        "{err}"
    );
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        t0.elapsed()
    );

    // A "target" that accepts and answers nothing for 3 s, then hangs up.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let slow = std::thread::spawn(move || {
        let (c, _) = l.accept().unwrap();
        std::thread::sleep(std::time::Duration::from_secs(3));
        drop(c);
    });
    let out = initiator(port, &[]);
    slow.join().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "waiting for the target at 127.0.0.1:{port} to set up"
        )),
        "{err}"
    );
    assert!(err.contains("closed by the peer"), "{err}");
}

/// The two roles over IPv6 loopback: the target prints the `--connect` address to use (the
/// address in brackets), the initiator connects with it, rows move verified bytes with the
/// ceiling and the floor measured over `::1`, and its report names the target in brackets.
#[test]
fn the_two_roles_work_over_ipv6_loopback() {
    use std::io::BufRead;
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("skipped: no IPv6 loopback here");
        return;
    }
    let mut target = Command::new(env!("CARGO_BIN_EXE_morio"))
        .args(["bench", "--role", "target", "--no-pin", "--shards", "1"])
        .args(["--host", "::1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the target");
    let mut err = std::io::BufReader::new(target.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    let connect = line
        .split("--connect ")
        .nth(1)
        .and_then(|s| s.split('`').next())
        .unwrap_or_else(|| panic!("no --connect in {line:?}"))
        .to_string();
    assert!(connect.starts_with("[::1]:"), "{line}");
    let out = Command::new(env!("CARGO_BIN_EXE_morio"))
        .args(["bench", "--role", "initiator", "--no-pin", "--shards", "1"])
        .args(["--host", "::1", "--connect", &connect, "--iters", "4"])
        .args(["--op-type", "write", "--buffer-size", "4KiB"])
        .args(["--transfer-batch-size", "8", "--enable-batch-transfer"])
        .args(["--ceiling-bytes", "4MiB"])
        .output()
        .expect("run the initiator");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("at [::1]:"), "{text}");
    assert!(text.contains("Latency floor"), "{text}");
    assert!(target.wait().unwrap().success());
}
