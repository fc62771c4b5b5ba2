//! Rust logs into Python's `logging` (logger "morio" and its children), with MORI's
//! `set_log_level` and the `MORIO_LOG_LEVEL` environment variable.

use std::sync::OnceLock;

use log::LevelFilter;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

static RESET: OnceLock<pyo3_log::ResetHandle> = OnceLock::new();

/// Environment variables read at import, first set wins (MORI's names after morio's own).
pub const LEVEL_ENV: [&str; 3] = [
    "MORIO_LOG_LEVEL",
    "MORI_IO_LOG_LEVEL",
    "MORI_GLOBAL_LOG_LEVEL",
];

/// The Python loggers of morio's crates (Rust targets `morio::…`, `morio_shards::…`,
/// `morio_topology::…` arrive as `morio.…` and so on).
const LOGGERS: [&str; 3] = ["morio", "morio_shards", "morio_topology"];

/// Level used when neither `set_log_level` nor the environment says otherwise.
const DEFAULT_LEVEL: &str = "warning";

fn parse(level: &str) -> Option<(LevelFilter, u32)> {
    // (Rust filter, Python logging level)
    Some(match level.to_ascii_lowercase().as_str() {
        "trace" => (LevelFilter::Trace, 5),
        "debug" => (LevelFilter::Debug, 10),
        "info" => (LevelFilter::Info, 20),
        "warning" | "warn" => (LevelFilter::Warn, 30),
        "error" => (LevelFilter::Error, 40),
        "critical" => (LevelFilter::Error, 50),
        "off" => (LevelFilter::Off, 60),
        _ => return None,
    })
}

/// Set the level of morio's logs: "trace", "debug", "info", "warning", "error", "critical"
/// or "off". Sets the level of the Python loggers "morio", "morio_shards" and
/// "morio_topology" too; when neither they nor the root logger have a handler, a stderr
/// handler is added to each so the logs show (as MORI's do).
#[pyfunction]
pub fn set_log_level(py: Python<'_>, level: &str) -> PyResult<()> {
    let (filter, pylevel) = parse(level).ok_or_else(|| {
        PyValueError::new_err(format!(
            "unknown log level {level:?} (trace, debug, info, warning, error, critical, off)"
        ))
    })?;
    let logging = py.import("logging")?;
    if pylevel == 5
        && logging
            .call_method1("getLevelName", (5,))?
            .extract::<String>()?
            != "TRACE"
    {
        logging.call_method1("addLevelName", (5, "TRACE"))?;
    }
    let root = logging.call_method0("getLogger")?;
    let root_has = root.getattr("handlers")?.len()? > 0;
    for name in LOGGERS {
        let logger = logging.call_method1("getLogger", (name,))?;
        logger.call_method1("setLevel", (pylevel,))?;
        if !root_has && logger.getattr("handlers")?.len()? == 0 {
            let h = logging.call_method0("StreamHandler")?;
            let fmt = logging.call_method1(
                "Formatter",
                ("[%(asctime)s] [%(process)d] [%(name)s] [%(levelname)s] %(message)s",),
            )?;
            h.call_method1("setFormatter", (fmt,))?;
            logger.call_method1("addHandler", (h,))?;
        }
    }
    log::set_max_level(filter);
    if let Some(r) = RESET.get() {
        r.reset();
    }
    Ok(())
}

/// Install the bridge at import; level from the environment, else the default.
pub fn init(py: Python<'_>) -> PyResult<()> {
    if RESET.get().is_none() {
        let logger = pyo3_log::Logger::new(py, pyo3_log::Caching::LoggersAndLevels)?
            .filter(LevelFilter::Trace);
        if let Ok(h) = logger.install() {
            let _ = RESET.set(h);
        }
    }
    let from_env = LEVEL_ENV
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.trim().is_empty()));
    match from_env {
        Some(l) if parse(l.trim()).is_some() => set_log_level(py, l.trim()),
        Some(l) => {
            set_log_level(py, DEFAULT_LEVEL)?;
            log::warn!("ignoring unknown log level {l:?} from the environment");
            Ok(())
        }
        None => {
            // Only the Rust-side gate: leave Python's logger configuration to the app.
            log::set_max_level(LevelFilter::Warn);
            let logging = py.import("logging")?;
            for name in LOGGERS {
                let logger = logging.call_method1("getLogger", (name,))?;
                if logger.getattr("level")?.extract::<u32>()? == 0 {
                    logger.call_method1("setLevel", (30,))?;
                }
            }
            Ok(())
        }
    }
}
