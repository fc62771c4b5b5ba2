//! The `morio` command: `morio loopback` runs two engines over loopback and verifies a
//! striped write and read, beside a plain single-stream TCP copy of the same size; `morio
//! bench` runs MORI-IO's benchmark table between two processes, with the raw-TCP ceiling.

mod bench;
mod logs;
mod loopback;
mod serve;
mod topology;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    name = "morio",
    version,
    about = "Thread-per-core TCP transfer engine (MORI-IO API)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// Log level (`error`, `warn`, `info`, `debug`, `trace`) or a filter such as
    /// `warn,morio::service=debug`; default: `MORIO_LOG`, then `RUST_LOG`, then `warn`.
    #[arg(long, global = true, value_name = "LEVEL")]
    log_level: Option<String>,
    /// Log lines as readable text or as JSON objects (on stderr).
    #[arg(long, global = true, value_enum, default_value_t = logs::Format::Human)]
    log_format: logs::Format,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Two engines in this process: a verified striped write and read, and the TCP ceiling.
    Loopback(loopback::Args),
    /// MORI's benchmark table (target and initiator processes, or --loopback for both),
    /// with latency percentiles, per-row validation and the raw-TCP ceiling.
    Bench(Box<bench::Args>),
    /// A long-running transfer node: registers memory from a TOML config, serves peers,
    /// hands out descriptors, stats and metrics over HTTP on its control port, stops cleanly
    /// on SIGTERM.
    Serve(serve::Args),
    /// Ask a running `morio serve` (over HTTP) for its stats, descriptors, metrics or health.
    Ctl(serve::CtlArgs),
    /// The machine's CPUs, NUMA nodes, NICs and GPUs, and a NUMA-aware placement plan.
    Topology(topology::Args),
    /// Check that this host or container can run engines (io_uring, locked memory); exit 1
    /// with what to change if not.
    Check,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = logs::init(cli.log_level.as_deref(), cli.log_format) {
        eprintln!("morio: error: {e}");
        return ExitCode::from(2);
    }
    let r = match cli.cmd {
        Cmd::Loopback(a) => loopback::run(a).map(|()| ExitCode::SUCCESS),
        Cmd::Bench(a) => bench::run(*a),
        Cmd::Serve(a) => serve::run(a).map(|()| ExitCode::SUCCESS),
        Cmd::Ctl(a) => serve::ctl(a).map(|()| ExitCode::SUCCESS),
        Cmd::Topology(a) => topology::run(a).map(|()| ExitCode::SUCCESS),
        Cmd::Check => Ok(match morio::check_host() {
            Ok(()) => {
                println!("ok: io_uring is available and the locked-memory limit is enough");
                match morio::check_same_host() {
                    Ok(()) => {
                        println!(
                            "ok: the same-host transport is available to engines of this user"
                        );
                        match morio::check_same_host_rings() {
                            Ok(()) => println!(
                                "ok: small same-host transfers go through shared-memory rings"
                            ),
                            Err(why) => println!(
                                "note: no same-host rings here ({why}); small same-host \
                                 transfers go through the socket"
                            ),
                        }
                    }
                    Err(why) => println!(
                        "note: no same-host transport here ({why}); engines of this host use TCP"
                    ),
                }
                match morio::gpu::check_ipc() {
                    Ok(rt) => println!(
                        "ok: GPU memory ({rt}) moves device to device between engines of this \
                         host (IPC handles export)"
                    ),
                    Err(why) => {
                        println!("note: GPU memory between engines of this host is staged ({why})")
                    }
                }
                println!("{}", busy_poll_line());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("morio check: {e}");
                ExitCode::FAILURE
            }
        }),
    };
    r.unwrap_or_else(|e| {
        eprintln!("morio: error: {}", render(&e));
        ExitCode::FAILURE
    })
}

/// What engines started here do after their shards' work: busy-poll (and for how long, and
/// why) or park at once.
fn busy_poll_line() -> String {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    match morio::busy_poll_from_env() {
        Err(e) => format!("note: {e}; engines will refuse to start"),
        Ok(set) => {
            let why = match set {
                Some(_) => morio::BUSY_POLL_ENV.to_string(),
                None => format!("the default with {cpus} CPUs"),
            };
            match morio::busy_window(set, cpus) {
                Some(d) => {
                    let tail = match morio_shards::rt::busy_yield_tail().as_micros() {
                        0 => "park".to_string(),
                        us => format!("yield their CPU between polls for {us} us"),
                    };
                    format!(
                        "ok: shards busy-poll {} us after their work, then {tail}, stepping \
                         aside when preempted ({why})",
                        d.as_micros()
                    )
                }
                None => format!(
                    "note: shards park right after their work ({why}; busy polling by default \
                     needs 8 CPUs); {}=100 turns it on",
                    morio::BUSY_POLL_ENV
                ),
            }
        }
    }
}

/// An error and its causes on one line, each said once. Library errors name their cause in
/// their own message ("invalid configuration: host ... is not a numeric IP address") and
/// also return it as their source, so printing the chain as-is would say it twice.
fn render(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let m = cause.to_string();
        if out.contains(m.trim()) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(m.trim_end());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::render;
    use anyhow::Context;

    #[test]
    fn each_cause_is_said_once() {
        let lib = morio::EngineError::from(morio::ConfigError::Host("localhost".into()));
        let e = Err::<(), _>(lib)
            .context("start the TCP backend")
            .unwrap_err();
        assert_eq!(
            render(&e),
            "start the TCP backend: invalid configuration: host \"localhost\" is not a \
             numeric IP address"
        );
    }
}
