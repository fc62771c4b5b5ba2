//! The `morio` command: `morio loopback` runs two engines over loopback and verifies a
//! striped write and read, beside a plain single-stream TCP copy of the same size.

mod loopback;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "morio",
    version,
    about = "Thread-per-core TCP transfer engine (MORI-IO API)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Two engines in this process: a verified striped write and read, and the TCP ceiling.
    Loopback(loopback::Args),
}

fn main() -> anyhow::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    match Cli::parse().cmd {
        Cmd::Loopback(a) => loopback::run(a),
    }
}
