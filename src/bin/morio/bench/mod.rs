//! `morio bench`: MORI-IO benchmark.py's table over morio's TCP engine, with hdrhistogram
//! percentiles, per-row validation and the raw-TCP ceiling of the same run. Two processes
//! (`--role target`, `--role initiator --connect`) talk over a side channel of their own;
//! `--loopback` starts both.

mod args;
pub(crate) mod argv;
mod ceiling;
mod data;
mod floor;
mod initiator;
mod launch;
mod report;
mod runner;
mod scrape;
mod stats;
mod target;
mod wire;

use std::process::ExitCode;

pub use args::Args;
use args::Role;
pub(crate) use data::alloc;

/// Run `morio bench` with parsed options.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    if !a.summarize.is_empty() {
        report::summarize(&a.summarize)?;
        return Ok(ExitCode::SUCCESS);
    }
    a.check()?;
    if let Some(ppid) = a.parent_pid {
        die_with_parent(ppid);
    }
    if a.loopback {
        return launch::run(&a);
    }
    match a.role {
        Some(Role::Target) => target::run(&a)?,
        Some(Role::Initiator) => initiator::run(&a)?,
        None => anyhow::bail!("choose --loopback or --role"),
    }
    Ok(ExitCode::SUCCESS)
}

/// A loopback child: get SIGKILL when the launching process dies, and exit now if it
/// already has.
fn die_with_parent(ppid: u32) {
    // SAFETY: prctl(PR_SET_PDEATHSIG) and getppid have no memory-safety preconditions.
    let parent = unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
        libc::getppid()
    };
    if u32::try_from(parent).ok() != Some(ppid) {
        eprintln!("morio bench: the launching process {ppid} is gone; exiting");
        std::process::exit(1);
    }
}
