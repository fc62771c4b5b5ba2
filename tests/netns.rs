//! Engines as two hosts: each in a network namespace of its own (made here, with `ip netns`),
//! joined by a veth pair, so bytes cross a real link (1500-byte MTU, the kernel's full TCP
//! path between two stacks) and the link can be cut, narrowed or its MTU changed. Checks that
//! every transfer shape moves verified bytes over IPv4 and IPv6, that a cut link fails the
//! transfers on it within their deadline (no hang, no lost completion) and that the peer is
//! reached again once the link is back, and that a link too slow for a deadline fails only
//! what it must.
//!
//! Needs root (namespaces) and iproute2's `ip` and `tc`; without them every test says it is
//! skipped and passes. Each engine is made on a thread that joined its namespace first, so its
//! shards (threads it spawns) and sockets live there; the test's own thread submits and waits.

use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use morio::{
    IoEngine, IoEngineConfig, RegisteredBuffer, SameHost, StatusCode, TcpBackendConfig,
    TransferStatus,
};

/// Two namespaces `a` and `b`, a veth pair between them (`10.201.N.1/30` and `.2`,
/// `fd00:201:N::1/64` and `::2`); removed on drop.
struct Net {
    ns: [String; 2],
    dev: [String; 2],
    v4: [String; 2],
    v6: [String; 2],
}

static NEXT: AtomicU32 = AtomicU32::new(1);

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Net {
    /// The namespaces and their link, or `None` (with a line saying why) where they cannot
    /// be made here.
    fn new() -> Option<Net> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: network namespaces need root");
            return None;
        }
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id() % 100_000;
        let net = Net {
            ns: [format!("morio-{pid}-{n}-a"), format!("morio-{pid}-{n}-b")],
            dev: [format!("mo{pid}x{n}a"), format!("mo{pid}x{n}b")],
            v4: [format!("10.201.{n}.1"), format!("10.201.{n}.2")],
            v6: [format!("fd00:201:{n}::1"), format!("fd00:201:{n}::2")],
        };
        match net.set_up() {
            Ok(()) => Some(net),
            Err(e) => {
                eprintln!("skipped: cannot make network namespaces here ({e})");
                None
            }
        }
    }

    fn set_up(&self) -> Result<(), String> {
        for ns in &self.ns {
            ip(&["netns", "add", ns])?;
        }
        ip(&[
            "link",
            "add",
            &self.dev[0],
            "type",
            "veth",
            "peer",
            "name",
            &self.dev[1],
        ])?;
        for i in 0..2 {
            let (ns, dev) = (&self.ns[i], &self.dev[i]);
            ip(&["link", "set", dev, "netns", ns])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{}/30", self.v4[i]),
                "dev",
                dev,
            ])?;
            let v6 = format!("{}/64", self.v6[i]);
            ip(&["-n", ns, "addr", "add", &v6, "dev", dev, "nodad"])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        Ok(())
    }

    /// Bring side `i`'s end of the link up or down (down: what the other side sends is lost,
    /// as on a cut cable; nothing tells it).
    fn link(&self, i: usize, up: bool) {
        let state = if up { "up" } else { "down" };
        ip(&["-n", &self.ns[i], "link", "set", &self.dev[i], state]).unwrap();
    }

    /// Set the link's MTU on both ends.
    fn mtu(&self, mtu: u32) {
        for i in 0..2 {
            let m = mtu.to_string();
            ip(&["-n", &self.ns[i], "link", "set", &self.dev[i], "mtu", &m]).unwrap();
        }
    }

    /// `tc qdisc VERB dev DEV root QDISC...` in side `i`'s namespace, on its end of the link.
    fn tc(&self, i: usize, args: &[&str]) {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns[i], "tc", "qdisc", args[0]])
            .args(["dev", &self.dev[i], "root"])
            .args(&args[1..])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tc qdisc {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Narrow what side `i` sends to `rate` (a token bucket, e.g. "200mbit").
    fn rate(&self, i: usize, rate: &str) {
        let tbf = ["tbf", "rate", rate, "burst", "256kb", "latency", "100ms"];
        self.tc(i, &[&["replace"][..], &tbf[..]].concat());
    }

    /// Cut the link (or mend it) in the middle, as a failed switch or cable does: every packet
    /// either way is lost, silently, and neither end's interface changes state (a token
    /// bucket too small for any packet on both ends; mended, the ends' default queueing).
    fn cut(&self, cut: bool) {
        for i in 0..2 {
            if cut {
                self.tc(
                    i,
                    &[
                        "replace", "tbf", "rate", "8bit", "burst", "1", "latency", "1ms",
                    ],
                );
            } else {
                self.tc(i, &["del"]);
            }
        }
    }

    /// An engine of side `i` listening on `host`, made inside that side's namespace.
    fn engine(&self, i: usize, key: &str, host: &str, cfg: TcpBackendConfig) -> IoEngine {
        let path = format!("/run/netns/{}", self.ns[i]);
        let (key, host) = (key.to_string(), host.to_string());
        std::thread::spawn(move || {
            let f = std::fs::File::open(&path).unwrap();
            // SAFETY: setns on this thread with a namespace file we hold open.
            let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
            let e = IoEngine::new(&key, IoEngineConfig::new(&host, 0)).unwrap();
            e.create_backend(cfg).unwrap();
            e
        })
        .join()
        .unwrap()
    }

    /// Engines `a` (side 0) and `b` (side 1) on the link's IPv4 or IPv6 addresses, each
    /// registered with the other.
    fn pair(&self, tag: &str, v6: bool, cfg: TcpBackendConfig) -> (IoEngine, IoEngine) {
        let hosts = if v6 { &self.v6 } else { &self.v4 };
        let a = self.engine(0, &format!("{tag}_a"), &hosts[0], cfg.clone());
        let b = self.engine(1, &format!("{tag}_b"), &hosts[1], cfg);
        a.register_remote_engine(&b.engine_desc()).unwrap();
        b.register_remote_engine(&a.engine_desc()).unwrap();
        (a, b)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in &self.ns {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// Over the link, never through the same-host transport (both namespaces are on one host).
fn cfg(op_timeout: Duration) -> TcpBackendConfig {
    TcpBackendConfig {
        num_shards: Some(2),
        num_data_conns: 4,
        pin_shards: false,
        op_timeout,
        same_host: Some(SameHost::Off),
        ..Default::default()
    }
}

fn filled(e: &IoEngine, n: usize, seed: u64) -> RegisteredBuffer {
    let b = e.alloc_buffer(n).unwrap();
    let bytes: Vec<u8> = (0..n as u64)
        .map(|i| (i.wrapping_mul(0x9E37_79B9) >> 7) as u8 ^ seed as u8)
        .collect();
    b.write_at(0, &bytes);
    b
}

fn wait(st: &TransferStatus, what: &str) -> StatusCode {
    let code = st.wait_for(Duration::from_secs(60));
    assert_ne!(
        code,
        StatusCode::InProgress,
        "{what}: still in progress after 60 s"
    );
    code
}

fn ok(st: &TransferStatus, what: &str) {
    assert_eq!(
        wait(st, what),
        StatusCode::Success,
        "{what}: {}",
        st.message()
    );
}

/// A small (express), a striped and a batched write from `a` to `b` and reads back, each
/// verified.
fn round_trips(a: &IoEngine, b: &IoEngine, seed: u64) {
    let n = 24 << 20;
    let src = filled(a, n, seed);
    let dst = b.alloc_buffer(n).unwrap();
    let back = a.alloc_buffer(n).unwrap();
    for len in [8usize, 4096, 300 << 10, 16 << 20] {
        let uid = a.allocate_transfer_uid();
        ok(&a.write(src.desc(), 0, dst.desc(), 0, len, uid), "write");
        let uid = a.allocate_transfer_uid();
        ok(&a.read(back.desc(), 0, dst.desc(), 0, len, uid), "read");
        assert!(
            back.to_vec()[..len] == src.to_vec()[..len],
            "{len} bytes read back differ"
        );
    }
    let offs: Vec<usize> = (0..256).map(|i| i * 8192).collect();
    let sizes = vec![4096; 256];
    let uid = a.allocate_transfer_uid();
    let sts = a.batch_write(
        &[src.desc().clone()],
        std::slice::from_ref(&offs),
        &[dst.desc().clone()],
        std::slice::from_ref(&offs),
        &[sizes],
        &[uid],
    );
    ok(&sts[0], "batch of 256 x 4 KiB");
    let (s, d) = (src.to_vec(), dst.to_vec());
    for &o in &offs {
        assert!(s[o..o + 4096] == d[o..o + 4096], "batch piece at {o}");
    }
}

/// Every shape moves verified bytes across the link over IPv4 and IPv6, at the veth's
/// 1500-byte MTU and at IPv6's smallest, 1280.
#[test]
fn engines_on_two_hosts_move_verified_bytes_over_ipv4_and_ipv6() {
    let Some(net) = Net::new() else { return };
    let (a, b) = net.pair("ns4", false, cfg(Duration::from_secs(20)));
    round_trips(&a, &b, 1);
    round_trips(&b, &a, 2);
    net.mtu(1280);
    let (c, d) = net.pair("ns6", true, cfg(Duration::from_secs(20)));
    assert_eq!(d.engine_desc().host, net.v6[1]);
    round_trips(&c, &d, 3);
    round_trips(&a, &b, 4);
    let t = a.stats().unwrap().total();
    assert_eq!(t.lane_connects_same_host, 0, "{t:?}");
    assert_eq!(t.lane_failures, 0, "{t:?}");
}

/// A link cut (every packet lost, silently; `down`: the peer's own interface goes down
/// instead) under transfers: each fails within its deadline, none hangs; when the link is back,
/// the same engines reach each other again.
#[test]
fn a_cut_link_fails_its_transfers_within_the_deadline_and_the_peer_is_reached_again() {
    for down in [false, true] {
        cut_and_mend(down);
    }
}

fn cut_and_mend(down: bool) {
    let Some(net) = Net::new() else { return };
    let deadline = Duration::from_secs(2);
    let (a, b) = net.pair("nscut", false, cfg(deadline));
    let n = 16 << 20;
    let src = filled(&a, n, 5);
    let dst = b.alloc_buffer(n).unwrap();
    // The lanes are up before the cut.
    ok(
        &a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()),
        "before the cut",
    );
    let mend = |cut: bool| {
        if down {
            net.link(1, !cut)
        } else {
            net.cut(cut)
        }
    };
    mend(true);
    let t0 = Instant::now();
    let sts = [
        a.write(src.desc(), 0, dst.desc(), 0, 8, a.allocate_transfer_uid()),
        a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid()),
        a.read(
            src.desc(),
            0,
            dst.desc(),
            0,
            64 << 10,
            a.allocate_transfer_uid(),
        ),
    ];
    for (i, st) in sts.iter().enumerate() {
        let code = wait(st, "across the cut link");
        assert!(
            code as u32 > StatusCode::ERR_BEGIN,
            "transfer {i}: {code:?}"
        );
    }
    let took = t0.elapsed();
    eprintln!(
        "cut link (down {down}): failed in {took:?}: {}",
        sts[1].message()
    );
    assert!(
        took < deadline + Duration::from_secs(3),
        "transfers on a cut link took {took:?} to fail (deadline {deadline:?})"
    );
    mend(false);
    // Back: a new transfer gets through (on lanes dialed again if the old ones were given up).
    let t0 = Instant::now();
    loop {
        let st = a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid());
        if wait(&st, "after the link is back") == StatusCode::Success {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the peer is still unreachable 30 s after the link came back: {}",
            st.message()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "cut link (down {down}): reached again after {:?}",
        t0.elapsed()
    );
    assert!(
        dst.to_vec() == src.to_vec(),
        "bytes after the link came back"
    );
}

/// A link narrowed to 200 Mbit/s: a transfer that fits its deadline moves verified bytes; one
/// that cannot (64 MiB in 1 s needs 537 Mbit/s) fails within the deadline and leaves the
/// engines working.
#[test]
fn a_slow_link_keeps_bytes_whole_and_deadlines_kept() {
    let Some(net) = Net::new() else { return };
    net.rate(0, "200mbit");
    let (a, b) = net.pair("nsslow", false, cfg(Duration::from_secs(1)));
    let n = 64 << 20;
    let src = filled(&a, n, 6);
    let dst = b.alloc_buffer(n).unwrap();
    let small = 2 << 20; // about 84 ms at 200 Mbit/s
    ok(
        &a.write(
            src.desc(),
            0,
            dst.desc(),
            0,
            small,
            a.allocate_transfer_uid(),
        ),
        "2 MiB",
    );
    assert!(dst.to_vec()[..small] == src.to_vec()[..small]);
    let t0 = Instant::now();
    let st = a.write(src.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid());
    let code = wait(&st, "64 MiB on a slow link");
    let took = t0.elapsed();
    eprintln!("slow link: 64 MiB {code:?} in {took:?}: {}", st.message());
    assert!(code as u32 > StatusCode::ERR_BEGIN, "{code:?} in {took:?}");
    assert!(
        took < Duration::from_secs(4),
        "failed after {took:?} against a 1 s deadline"
    );
    // The engines still work (the lane the late chunks rode may be dialed again).
    let t0 = Instant::now();
    loop {
        let st = a.write(
            src.desc(),
            0,
            dst.desc(),
            0,
            4096,
            a.allocate_transfer_uid(),
        );
        if wait(&st, "after the late transfer") == StatusCode::Success {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no transfer gets through after the late one: {}",
            st.message()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// No stale bytes after a cut: a write that failed on the cut link must not land later over
/// what newer, successful writes to the same place put there once the link was back. The old
/// write rides one lane (no striping) and the new ones the others (each transfer takes the
/// next lane), which were idle during the cut and so deliver at once, while the old lane's
/// retransmissions wait on timers that backed off during the cut.
#[test]
fn a_transfer_that_failed_on_a_cut_link_never_lands_over_a_later_one() {
    let Some(net) = Net::new() else { return };
    let deadline = Duration::from_secs(2);
    let mut c = cfg(deadline);
    c.striping_threshold_bytes = 1 << 30;
    let (a, b) = net.pair("nsstale", false, c);
    let n = 4 << 20;
    let old = filled(&a, n, 7);
    let new = filled(&a, n, 8);
    assert!(old.to_vec() != new.to_vec());
    let dst = b.alloc_buffer(n).unwrap();
    for _ in 0..4 {
        let uid = a.allocate_transfer_uid();
        ok(&a.write(new.desc(), 0, dst.desc(), 0, 8, uid), "lanes up");
    }
    net.cut(true);
    let st = a.write(old.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid());
    let code = wait(&st, "the old write");
    assert!(code as u32 > StatusCode::ERR_BEGIN, "{code:?}");
    net.cut(false);
    let t0 = Instant::now();
    let mut landed = 0;
    while landed < 3 {
        let st = a.write(new.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid());
        let code = wait(&st, "a new write");
        eprintln!(
            "new write after {:?}: {code:?} {}",
            t0.elapsed(),
            st.message()
        );
        if code == StatusCode::Success {
            landed += 1;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{}", st.message());
    }
    // Long enough for the old connection's retransmissions (its timer backed off during the
    // cut) to have come through, had it been kept.
    std::thread::sleep(Duration::from_secs(5));
    let (got, want) = (dst.to_vec(), new.to_vec());
    if got != want {
        let bad = got.iter().zip(&want).filter(|(g, w)| g != w).count();
        let first = got.iter().zip(&want).position(|(g, w)| g != w).unwrap();
        panic!("{bad} bytes of the successful writes were overwritten later (first at {first})");
    }
}

/// No stale bytes after a deadline on a slow link: a write that failed by its deadline while
/// its bytes were still flowing (the link narrowed, acknowledgements still coming) must not
/// land later over what a newer, successful write to the same place put there.
#[test]
fn a_late_transfer_never_lands_over_a_later_one() {
    let Some(net) = Net::new() else { return };
    net.rate(0, "200mbit");
    let mut c = cfg(Duration::from_secs(1));
    c.striping_threshold_bytes = 1 << 30;
    let (a, b) = net.pair("nslate", false, c);
    let n = 64 << 20;
    let old = filled(&a, n, 9);
    let new = filled(&a, n, 10);
    let dst = b.alloc_buffer(n).unwrap();
    for _ in 0..4 {
        let uid = a.allocate_transfer_uid();
        ok(&a.write(new.desc(), 0, dst.desc(), 0, 8, uid), "lanes up");
    }
    // 64 MiB at 200 Mbit/s needs 2.7 s: it fails after 1 s with most of it still to come.
    let st = a.write(old.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid());
    let code = wait(&st, "the old write");
    assert!(code as u32 > StatusCode::ERR_BEGIN, "{code:?}");
    // The tail the old write had not reached, written anew on other lanes.
    let (off, len) = (n - (1 << 20), 1 << 20);
    let t0 = Instant::now();
    let mut landed = 0;
    while landed < 3 {
        let uid = a.allocate_transfer_uid();
        let st = a.write(new.desc(), off, dst.desc(), off, len, uid);
        let code = wait(&st, "a new write");
        eprintln!(
            "new write after {:?}: {code:?} {}",
            t0.elapsed(),
            st.message()
        );
        landed += usize::from(code == StatusCode::Success);
        assert!(t0.elapsed() < Duration::from_secs(30), "{}", st.message());
    }
    std::thread::sleep(Duration::from_secs(5));
    let (got, want) = (dst.to_vec(), new.to_vec());
    let o = old.to_vec();
    let old_landed = got[..off]
        .iter()
        .zip(&o[..off])
        .filter(|(g, w)| g == w)
        .count();
    let t = a.stats().unwrap().total();
    eprintln!(
        "old bytes at the target: {old_landed} of {off}; lane failures {}",
        t.lane_failures
    );
    let (got, want) = (&got[off..off + len], &want[off..off + len]);
    if got != want {
        let bad = got.iter().zip(want).filter(|(g, w)| g != w).count();
        panic!("{bad} bytes of the successful writes were overwritten later by the failed one");
    }
}

/// A deadline that passes while whole frames of the transfer still wait in the socket's
/// send buffer (none half sent, so nothing closes the lane for framing's sake) on a slow link.
#[test]
fn whole_frames_of_a_late_transfer_never_land_over_a_later_one() {
    let Some(net) = Net::new() else { return };
    net.rate(0, "40mbit");
    let mut c = cfg(Duration::from_millis(500));
    c.striping_threshold_bytes = 1 << 30;
    c.chunk_bytes = 64 << 10;
    let (a, b) = net.pair("nswhole", false, c);
    let n = 6 << 20;
    let old = filled(&a, n, 11);
    let new = filled(&a, n, 12);
    let dst = b.alloc_buffer(n).unwrap();
    for _ in 0..4 {
        let uid = a.allocate_transfer_uid();
        ok(&a.write(new.desc(), 0, dst.desc(), 0, 8, uid), "lanes up");
    }
    // 6 MiB at 5 MB/s: it fails after 0.5 s, its frames queued whole in the socket.
    let st = a.write(old.desc(), 0, dst.desc(), 0, n, a.allocate_transfer_uid());
    let code = wait(&st, "the old write");
    assert!(code as u32 > StatusCode::ERR_BEGIN, "{code:?}");
    let (off, len) = (n - (64 << 10), 64 << 10);
    let t0 = Instant::now();
    let mut landed = 0;
    while landed < 1 {
        let uid = a.allocate_transfer_uid();
        let st = a.write(new.desc(), off, dst.desc(), off, len, uid);
        let code = wait(&st, "a new write");
        eprintln!(
            "new write after {:?}: {code:?} {}",
            t0.elapsed(),
            st.message()
        );
        landed += usize::from(code == StatusCode::Success);
        assert!(t0.elapsed() < Duration::from_secs(30), "{}", st.message());
    }
    std::thread::sleep(Duration::from_secs(5));
    let (got, want) = (dst.to_vec(), new.to_vec());
    let o = old.to_vec();
    let old_landed = got[..off]
        .iter()
        .zip(&o[..off])
        .filter(|(g, w)| g == w)
        .count();
    let t = a.stats().unwrap().total();
    eprintln!(
        "old bytes at the target: {old_landed} of {off}; lane failures {}",
        t.lane_failures
    );
    let (got, want) = (&got[off..off + len], &want[off..off + len]);
    if got != want {
        let bad = got.iter().zip(want).filter(|(g, w)| g != w).count();
        panic!("{bad} bytes of the successful writes were overwritten later by the failed one");
    }
}

/// A read that failed by its deadline on a slow link never writes into the application's
/// buffer later: its data still on the way is dropped when it comes (the lane no longer waits
/// for it), so the buffer keeps what the application put there after the failure.
#[test]
fn a_late_read_never_lands_in_a_reused_buffer() {
    let Some(net) = Net::new() else { return };
    net.rate(1, "200mbit"); // what b sends: the read's data
    let mut c = cfg(Duration::from_secs(1));
    c.striping_threshold_bytes = 1 << 30;
    let (a, b) = net.pair("nsread", false, c);
    let n = 64 << 20;
    let far = filled(&b, n, 13);
    let back = a.alloc_buffer(n).unwrap();
    ok(
        &a.read(back.desc(), 0, far.desc(), 0, 8, a.allocate_transfer_uid()),
        "lanes up",
    );
    // 64 MiB at 200 Mbit/s needs 2.7 s.
    let st = a.read(back.desc(), 0, far.desc(), 0, n, a.allocate_transfer_uid());
    let code = wait(&st, "the slow read");
    assert!(code as u32 > StatusCode::ERR_BEGIN, "{code:?}");
    // The application reuses its buffer at once.
    let mine = vec![0x5Au8; n];
    back.write_at(0, &mine);
    let before = b.stats().unwrap().total().inbound_bytes_read;
    std::thread::sleep(Duration::from_secs(4));
    eprintln!(
        "read data the target sent after the failure: {} bytes",
        b.stats().unwrap().total().inbound_bytes_read - before
    );
    let got = back.to_vec();
    if got != mine {
        let bad = got.iter().filter(|&&g| g != 0x5A).count();
        panic!("{bad} bytes of the reused buffer were overwritten by the failed read");
    }
    // The engines still work.
    let t0 = Instant::now();
    loop {
        let st = a.read(
            back.desc(),
            0,
            far.desc(),
            0,
            4096,
            a.allocate_transfer_uid(),
        );
        if wait(&st, "a read afterwards") == StatusCode::Success {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{}", st.message());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(back.to_vec()[..4096] == far.to_vec()[..4096]);
}

/// Two processes of one host as pods (a network and a PID namespace each, as Kubernetes
/// gives them): the same-host transport cannot prove the peer (its pid names nothing here),
/// so `auto` falls back to TCP, saying so in one log line, and moves verified bytes, while
/// `require` fails with the reason. (`morio bench`'s two roles, the target under `unshare`.)
#[test]
fn engines_in_separate_pid_namespaces_fall_back_to_tcp() {
    use std::io::BufRead;
    let Some(net) = Net::new() else { return };
    if Command::new("unshare").arg("--version").output().is_err() {
        eprintln!("skipped: no unshare(1) here");
        return;
    }
    let bin = env!("CARGO_BIN_EXE_morio");
    for (mode, works) in [("auto", true), ("require", false)] {
        let mut target = Command::new("ip")
            .args([
                "netns",
                "exec",
                &net.ns[0],
                "unshare",
                "--pid",
                "--fork",
                "--mount-proc",
            ])
            .args([
                bin, "bench", "--role", "target", "--no-pin", "--shards", "1",
            ])
            .args(["--host", &net.v4[0]])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(target.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port: u16 = line
            .strip_prefix("MORIO_BENCH_TARGET ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        let json =
            std::env::temp_dir().join(format!("morio-netns-pod-{}.json", std::process::id()));
        let out = Command::new("ip")
            .args(["netns", "exec", &net.ns[1]])
            .args([
                bin,
                "bench",
                "--role",
                "initiator",
                "--no-pin",
                "--shards",
                "1",
            ])
            .args([
                "--host",
                &net.v4[1],
                "--connect",
                &format!("{}:{port}", net.v4[0]),
            ])
            .args([
                "--iters",
                "8",
                "--op-type",
                "write",
                "--buffer-size",
                "64KiB",
            ])
            .args(["--transfer-batch-size", "16", "--enable-batch-transfer"])
            .args(["--same-host", mode, "--no-ceiling", "--no-floor", "--json"])
            .arg(&json)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        let _ = target.kill();
        let t = target.wait_with_output().unwrap();
        let terr = String::from_utf8_lossy(&t.stderr);
        if works {
            assert!(out.status.success(), "{err}");
            let rep: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
            let row = &rep["rows"][0];
            assert_eq!(row["transport"], "tcp", "{row}");
            assert_eq!(row["validated"], true, "{row}");
            let said = terr.matches("same-host transport with").count();
            assert_eq!(said, 1, "one log line for the fallback:\n{terr}");
            assert!(terr.contains("using TCP"), "{terr}");
        } else {
            assert!(!out.status.success(), "require moved bytes: {err}");
            assert!(err.contains("same-host transport required"), "{err}");
        }
        let _ = std::fs::remove_file(&json);
    }
}

/// An engine listening on every interface (MORI-IO's empty host, `0.0.0.0`, `::`) advertises
/// the address its default route leaves from, and a peer on the other host reaches it there.
#[test]
fn an_engine_on_all_interfaces_advertises_the_address_peers_reach() {
    let Some(net) = Net::new() else { return };
    for i in 0..2 {
        let ns = &net.ns[i];
        ip(&["-n", ns, "route", "add", "default", "via", &net.v4[1 - i]]).unwrap();
        ip(&[
            "-n",
            ns,
            "-6",
            "route",
            "add",
            "default",
            "via",
            &net.v6[1 - i],
        ])
        .unwrap();
    }
    for (host, v6) in [("", false), ("0.0.0.0", false), ("::", true)] {
        let tag = format!("nsall{}", host.len());
        let a = net.engine(0, &format!("{tag}_a"), host, cfg(Duration::from_secs(20)));
        let want = if v6 { &net.v6[0] } else { &net.v4[0] };
        assert_eq!(&a.engine_desc().host, want, "listening on {host:?}");
        let b_host = if v6 { &net.v6[1] } else { &net.v4[1] };
        let b = net.engine(1, &format!("{tag}_b"), b_host, cfg(Duration::from_secs(20)));
        b.register_remote_engine(&a.engine_desc()).unwrap();
        a.register_remote_engine(&b.engine_desc()).unwrap();
        round_trips(&b, &a, 20);
    }
}
