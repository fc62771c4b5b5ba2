//! The fixture: two network namespaces joined by a veth pair, the link cut, narrowed, taken
//! down or its MTU changed (with `ip` and `tc`), and engines made inside either namespace.

use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use morio::{IoEngine, IoEngineConfig, TcpBackendConfig};

/// Two namespaces `a` and `b`, a veth pair between them (`10.201.N.1/30` and `.2`,
/// `fd00:201:N::1/64` and `::2`); removed on drop.
pub struct Net {
    pub ns: [String; 2],
    pub dev: [String; 2],
    pub v4: [String; 2],
    pub v6: [String; 2],
}

static NEXT: AtomicU32 = AtomicU32::new(1);

pub fn ip(args: &[&str]) -> Result<(), String> {
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
    pub fn new() -> Option<Net> {
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
    pub fn link(&self, i: usize, up: bool) {
        let state = if up { "up" } else { "down" };
        ip(&["-n", &self.ns[i], "link", "set", &self.dev[i], state]).unwrap();
    }

    /// Set the link's MTU on both ends.
    pub fn mtu(&self, mtu: u32) {
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
    pub fn rate(&self, i: usize, rate: &str) {
        let tbf = ["tbf", "rate", rate, "burst", "256kb", "latency", "100ms"];
        self.tc(i, &[&["replace"][..], &tbf[..]].concat());
    }

    /// Cut the link (or mend it) in the middle, as a failed switch or cable does: every packet
    /// either way is lost, silently, and neither end's interface changes state (a token
    /// bucket too small for any packet on both ends; mended, the ends' default queueing).
    pub fn cut(&self, cut: bool) {
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
    pub fn engine(&self, i: usize, key: &str, host: &str, cfg: TcpBackendConfig) -> IoEngine {
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
    pub fn pair(&self, tag: &str, v6: bool, cfg: TcpBackendConfig) -> (IoEngine, IoEngine) {
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
