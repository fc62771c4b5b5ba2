//! The command's logs: the library's `log` records and the command's own, through the
//! `tracing` ecosystem, as human-readable lines or JSON objects on stderr, at the level
//! `--log-level` (or `MORIO_LOG`, then `RUST_LOG`) asks for.

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// One readable line per record.
    #[default]
    Human,
    /// One JSON object per record (timestamp, level, target, message).
    Json,
}

/// Route every record to stderr: `level` (a level like `info`, or a filter such as
/// `warn,morio::service=debug`), else `MORIO_LOG`, else `RUST_LOG`, else `warn`.
pub fn init(level: Option<&str>, format: Format) -> anyhow::Result<()> {
    let spec = level
        .map(str::to_string)
        .or_else(|| std::env::var("MORIO_LOG").ok())
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| "warn".to_string());
    let filter =
        EnvFilter::try_new(&spec).map_err(|e| anyhow::anyhow!("--log-level {spec:?}: {e}"))?;
    // The library logs through the `log` facade: `try_init` also forwards its records to
    // tracing (tracing-subscriber's `tracing-log` feature), where the filter applies.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(true);
    let installed = match format {
        Format::Human => builder.with_ansi(false).try_init(),
        Format::Json => builder.json().try_init(),
    };
    installed.map_err(|e| anyhow::anyhow!("logging: {e}"))
}
