//! `verify.sh` on this test process: a thread named `morio-shard-0` pinned to a CPU, checked
//! without a plan, against a plan that agrees, and against one that does not.

use std::path::Path;
use std::sync::mpsc;

use crate::common::{
    first_allowed_cpu, read, run, run_ok, scratch, stderr, stdout, testdata, write,
};

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
