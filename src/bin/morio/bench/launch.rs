//! `morio bench --loopback`: run this executable twice, as target and initiator, on disjoint
//! halves of the allowed CPUs (both unpinned when there are too few), wire the port from the
//! target's first stdout line, forward output, and return the initiator's exit status. No
//! child outlives this process: they are killed on every error path, and they die with it.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, ExitCode, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::args::{Args, Role};

/// How long the target may take to print its port.
const TARGET_START: Duration = Duration::from_secs(120);
/// How long the target may take to exit after a successful initiator.
const TARGET_EXIT: Duration = Duration::from_secs(30);

/// A child process that is killed and reaped if dropped while running.
struct Guard {
    name: &'static str,
    child: Option<Child>,
}

impl Guard {
    fn spawn(name: &'static str, cmd: &mut Command) -> anyhow::Result<Self> {
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start the {name} process"))?;
        Ok(Self {
            name,
            child: Some(child),
        })
    }

    fn wait(&mut self) -> anyhow::Result<ExitStatus> {
        let c = self.child.as_mut().context("child already reaped")?;
        let st = c
            .wait()
            .with_context(|| format!("waiting for the {}", self.name))?;
        self.child = None;
        Ok(st)
    }

    /// Wait up to `limit`, then kill; `None` if it had to be killed.
    fn wait_or_kill(&mut self, limit: Duration) -> anyhow::Result<Option<ExitStatus>> {
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            if let Some(c) = self.child.as_mut() {
                if let Some(st) = c.try_wait()? {
                    self.child = None;
                    return Ok(Some(st));
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        Ok(None)
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// CPUs of (initiator, target), and whether both run unpinned.
fn split(a: &Args) -> (Option<Vec<usize>>, Option<Vec<usize>>, bool) {
    if a.no_pin {
        return (None, None, true);
    }
    let pool: Vec<usize> = match &a.cpus {
        Some(c) => c.0.clone(),
        None => morio::placement::allowed_cpus().iter().collect(),
    };
    let per = a
        .shards
        .unwrap_or_else(|| (pool.len() / 2).clamp(1, a.num_data_conns));
    if pool.len() < 2 * per {
        eprintln!(
            "morio bench: {} CPUs cannot give each side {per} of its own; running both unpinned",
            pool.len()
        );
        return (None, None, true);
    }
    (
        Some(pool[..per].to_vec()),
        Some(pool[per..2 * per].to_vec()),
        false,
    )
}

/// Read the target's first line (its port) within `TARGET_START`, then keep forwarding the
/// rest of its stdout to our stderr.
fn read_port(out: ChildStdout, target: &mut Guard) -> anyhow::Result<u16> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(out).lines();
        let first = lines.next();
        let _ = tx.send(first);
        for line in lines.map_while(Result::ok) {
            eprintln!("[target] {line}");
        }
    });
    let t0 = Instant::now();
    loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(Some(Ok(line))) => {
                return line
                    .strip_prefix("MORIO_BENCH_TARGET ")
                    .and_then(|p| p.trim().parse().ok())
                    .with_context(|| format!("unexpected first line from the target: {line:?}"));
            }
            Ok(_) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                let st = target.wait_or_kill(Duration::from_secs(5))?;
                let how = st.map_or("did not exit; killed".to_string(), |s| s.to_string());
                bail!("the target process failed before it was ready ({how}; its error is above)");
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if t0.elapsed() > TARGET_START {
                    bail!("the target printed no port within {TARGET_START:?}");
                }
            }
        }
    }
}

fn command(exe: &Path, args: Vec<std::ffi::OsString>) -> Command {
    let mut c = Command::new(exe);
    c.arg("bench").args(args).stdin(Stdio::null());
    c
}

/// Run both sides; the exit code is the initiator's.
pub fn run(a: &Args) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("cannot find this executable")?;
    let (icpus, tcpus, unpin) = split(a);
    let mut tcmd = command(
        &exe,
        a.child_args(Role::Target, tcpus.as_deref(), unpin, None),
    );
    tcmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut target = Guard::spawn("target", &mut tcmd)?;
    let out = target
        .child
        .as_mut()
        .and_then(|c| c.stdout.take())
        .context("no stdout from the target")?;
    let port = read_port(out, &mut target)?;
    let ip: IpAddr = a.host.parse().context("--host")?;
    let ip = match ip {
        IpAddr::V4(v) if v.is_unspecified() => IpAddr::from([127, 0, 0, 1]),
        IpAddr::V6(v) if v.is_unspecified() => IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    let connect = SocketAddr::new(ip, port).to_string();
    let iargs = a.child_args(Role::Initiator, icpus.as_deref(), unpin, Some(&connect));
    let mut icmd = command(&exe, iargs);
    icmd.stdout(Stdio::inherit()).stderr(Stdio::inherit());
    let mut initiator = Guard::spawn("initiator", &mut icmd)?;
    let ist = initiator.wait()?;
    let _ = std::io::stdout().flush();
    if !ist.success() {
        target.kill();
        return Ok(exit_code(ist));
    }
    match target.wait_or_kill(TARGET_EXIT)? {
        Some(st) if st.success() => Ok(ExitCode::SUCCESS),
        Some(st) => bail!("the target failed: {st}"),
        None => bail!("the target did not exit within {TARGET_EXIT:?}; killed"),
    }
}

fn exit_code(st: ExitStatus) -> ExitCode {
    match st.code() {
        Some(c) => ExitCode::from(u8::try_from(c).unwrap_or(1).max(1)),
        None => {
            eprintln!("morio bench: the initiator was killed ({st})");
            ExitCode::FAILURE
        }
    }
}
