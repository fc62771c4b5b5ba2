//! Spinning shards (`spin_before_park`): sockets are busy-polled while traffic flows, handed
//! back to the runtime when it stops, and data stays exact across both states.

use std::sync::Arc;
use std::time::Duration;

use super::common::*;
use morio::{StatusCode, TransferStatus};

/// The spin window: long enough to span the gaps inside a burst on a loaded 2-core machine,
/// short enough to stop burning its cores soon after the test.
const WINDOW: Duration = Duration::from_millis(20);

/// One shard and one lane per engine, spinning [`WINDOW`] before parking; 64 KiB chunks,
/// so a large transfer is a stream of chunks and answers.
fn spin_cfg() -> morio::TcpBackendConfig {
    cfg_with(|c| {
        c.num_shards = Some(1);
        c.num_data_conns = 1;
        c.chunk_bytes = 64 << 10;
        c.same_host_chunk_bytes = 64 << 10;
        c.spin_before_park = Some(WINDOW);
    })
}

fn wait_ok(sts: &[Arc<TransferStatus>]) {
    for st in sts {
        assert_eq!(wait(st), StatusCode::Success, "{}", st.message());
    }
}

#[test]
fn spinning_shards_busy_poll_and_fall_back_when_idle() {
    busy_rounds("spin", spin_cfg());
}

/// The same with the busy poller alone (`busy_poll`, the default on hosts of 8 CPUs or
/// more): no glommio spin, and the poller still wakes the readers.
#[test]
fn busy_polling_shards_poll_and_fall_back_when_idle() {
    let mut c = spin_cfg();
    c.spin_before_park = None;
    c.busy_poll = Some(WINDOW);
    busy_rounds("busy", c);
}

/// Three rounds of small and large transfers, each after a pause longer than the window,
/// verified, then the pollers' wakes checked.
fn busy_rounds(prefix: &str, cfg: morio::TcpBackendConfig) {
    let (a, b) = pair(prefix, cfg);
    let n = 8 << 20;
    let half = n / 2;
    let src = random_buffer(&a, n, 41);
    let dst = b.alloc_buffer(n).unwrap();
    let back = a.alloc_buffer(n).unwrap();
    // Rounds separated by pauses longer than the spin window: each starts idle (readers
    // wait on the runtime), turns busy with its first bytes, and ends idle again.
    for round in 0..3usize {
        // A burst of small writes in flight at once, then reads of what they wrote.
        let offs: Vec<usize> = (0..64).map(|i| (round * 64 + i) * 8).collect();
        let sts: Vec<_> = offs
            .iter()
            .map(|&o| a.write(src.desc(), o, dst.desc(), o, 8, a.allocate_transfer_uid()))
            .collect();
        wait_ok(&sts);
        let sts: Vec<_> = offs
            .iter()
            .map(|&o| a.read(back.desc(), o, dst.desc(), o, 8, a.allocate_transfer_uid()))
            .collect();
        wait_ok(&sts);
        // A batch of 256 scattered 8-byte segments.
        let segs: Vec<usize> = (0..256).map(|k| 64 * 1024 + k * 64 + round * 8).collect();
        let st = a.batch_write(
            std::slice::from_ref(src.desc()),
            std::slice::from_ref(&segs),
            std::slice::from_ref(dst.desc()),
            std::slice::from_ref(&segs),
            &[vec![8; 256]],
            &[a.allocate_transfer_uid()],
        );
        wait_ok(&st);
        // Large transfers: 64 chunks and 64 answers each way.
        let st = a.write(
            src.desc(),
            half,
            dst.desc(),
            half,
            half,
            a.allocate_transfer_uid(),
        );
        wait_ok(&[st]);
        let st = a.read(
            back.desc(),
            half,
            dst.desc(),
            half,
            half,
            a.allocate_transfer_uid(),
        );
        wait_ok(&[st]);
        std::thread::sleep(4 * WINDOW);
    }
    let small = 3 * 64 * 8;
    let s = src.to_vec();
    let d = dst.to_vec();
    assert_bytes_eq(&d[..small], &s[..small], "small writes");
    assert_bytes_eq(&bytes_at(&back, 0, small), &s[..small], "small reads");
    for k in 0..256 {
        for round in 0..3 {
            let o = 64 * 1024 + k * 64 + round * 8;
            assert_bytes_eq(&d[o..o + 8], &s[o..o + 8], "batch segment");
        }
    }
    assert_bytes_eq(&d[half..], &s[half..], "large write");
    assert_bytes_eq(&bytes_at(&back, half, half), &s[half..], "large read");
    // A busy poller (not a configured spin) steps aside while its shard is preempted, which
    // on a small, loaded machine may be every time: then it must have said so.
    let woke = |e: &morio::IoEngine| {
        let t = e.stats().unwrap().total();
        t.busy_poll_wakes + t.busy_poll_backoffs
    };
    assert!(woke(&a) > 0, "the initiator's poller never woke a reader");
    assert!(woke(&b) > 0, "the target's poller never woke a reader");
    // Between engines of one host (unless the run turned it off) the pollers watched rings:
    // the large transfers' 64 KiB chunks streamed through them, filling them many times.
    let t = a.stats().unwrap().total();
    if t.lane_connects_same_host > 0 {
        assert_eq!(t.lane_connects_ring > 0, rings_on(), "{t:?}");
    }
}

#[test]
fn shards_that_do_not_spin_never_busy_poll() {
    let (a, b) = pair(
        "nospin",
        cfg_with(|c| {
            c.num_shards = Some(1);
            c.busy_poll = Some(Duration::ZERO);
        }),
    );
    let src = random_buffer(&a, 4096, 42);
    let dst = b.alloc_buffer(4096).unwrap();
    for i in 0..16 {
        let st = a.write(
            src.desc(),
            i * 8,
            dst.desc(),
            i * 8,
            8,
            a.allocate_transfer_uid(),
        );
        assert_eq!(wait(&st), StatusCode::Success);
    }
    assert_eq!(a.stats().unwrap().total().busy_poll_wakes, 0);
    assert_eq!(b.stats().unwrap().total().busy_poll_wakes, 0);
}

/// CPU time this process has used (user and system).
fn cpu_time() -> Duration {
    // SAFETY: getrusage writes one struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) }, 0);
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU time each thread of this process has used so far (ns, from `schedstat`), by thread
/// id and name.
fn thread_cpu() -> Vec<(String, u64)> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|t| {
            let sched = std::fs::read_to_string(t.path().join("schedstat")).ok()?;
            let ns = sched.split(' ').next()?.parse::<u64>().ok()?;
            let name = std::fs::read_to_string(t.path().join("comm")).ok()?;
            Some((
                format!("{}:{}", t.file_name().to_string_lossy(), name.trim()),
                ns,
            ))
        })
        .collect()
}

/// The threads that used CPU since `before` (µs), busiest first.
fn cpu_since(before: &[(String, u64)]) -> Vec<(String, u64)> {
    let mut d: Vec<(String, u64)> = thread_cpu()
        .into_iter()
        .map(|(t, n)| {
            let was = before.iter().find(|(b, _)| *b == t).map_or(0, |(_, n)| *n);
            (t, n.saturating_sub(was) / 1000)
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    d.sort_by_key(|t| std::cmp::Reverse(t.1));
    d
}

/// After traffic (small transfers waited on, so the waiters' spin window has adapted to
/// them, and large ones), engines with default settings and engines whose shards spin use
/// no core once no transfer has run for 10 ms. Measured in a process of its own.
#[test]
fn idle_engines_burn_no_cpu() {
    run_alone("spin::idle_engines_burn_no_cpu_case");
}

#[test]
#[ignore = "run alone by idle_engines_burn_no_cpu (measures this process's CPU time)"]
fn idle_engines_burn_no_cpu_case() {
    let default = pair("idle_default", test_cfg());
    let spinning = pair(
        "idle_spin",
        cfg_with(|c| c.spin_before_park = Some(Duration::from_millis(2))),
    );
    let busy = pair(
        "idle_busy",
        cfg_with(|c| c.busy_poll = Some(Duration::from_millis(2))),
    );
    for (what, (a, b)) in [
        ("default", &default),
        ("spinning", &spinning),
        ("busy polling", &busy),
    ] {
        let src = random_buffer(a, 4 << 20, 5);
        let dst = b.alloc_buffer(4 << 20).unwrap();
        for i in 0..300usize {
            let uid = a.allocate_transfer_uid();
            assert_ok(&a.write(src.desc(), i * 8, dst.desc(), i * 8, 8, uid), what);
        }
        for _ in 0..4 {
            let uid = a.allocate_transfer_uid();
            assert_ok(&a.write(src.desc(), 0, dst.desc(), 0, 4 << 20, uid), what);
        }
        std::thread::sleep(Duration::from_millis(10));
        let (t0, c0, th0) = (std::time::Instant::now(), cpu_time(), thread_cpu());
        std::thread::sleep(Duration::from_millis(300));
        let (wall, used) = (t0.elapsed(), cpu_time() - c0);
        // Idle shards tick once a second (`IDLE_TICK`): about 1 ms of CPU in all here, where
        // ticking every 20 ms cost 37 ms; one busy core would cost all of `wall`.
        assert!(
            used < wall / 30,
            "{what}: {used:?} of CPU in {wall:?} with no transfer running; by thread \
             (µs): {:?}",
            cpu_since(&th0)
        );
    }
}
