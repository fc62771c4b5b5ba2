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
