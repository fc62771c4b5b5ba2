//! Small file-reading helpers shared by the sysfs and device readers: every failure a typed error.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::cpulist::{parse_cpu_list, CpuSet};
use crate::error::TopologyError;

pub(crate) fn io_error(path: &Path, source: io::Error) -> TopologyError {
    TopologyError::Io {
        path: PathBuf::from(path),
        source,
    }
}

pub(crate) fn parse_error(path: &Path, detail: String) -> TopologyError {
    TopologyError::Parse {
        path: path.to_owned(),
        detail,
    }
}

pub(crate) fn read_text(path: &Path) -> Result<String, TopologyError> {
    let bytes = fs::read(path).map_err(|source| io_error(path, source))?;
    String::from_utf8(bytes).map_err(|_| parse_error(path, "not valid UTF-8".to_owned()))
}

/// Like [`read_text`], but a missing file is `None`.
pub(crate) fn read_text_opt(path: &Path) -> Result<Option<String>, TopologyError> {
    match read_text(path) {
        Ok(text) => Ok(Some(text)),
        Err(TopologyError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Parses `text` (read from `path`) as a CPU list, reporting errors against the file.
pub(crate) fn cpu_list_at(path: &Path, text: &str) -> Result<CpuSet, TopologyError> {
    parse_cpu_list(text).map_err(|e| match e {
        TopologyError::InvalidCpuList { detail, .. } => parse_error(path, detail),
        other => other,
    })
}

pub(crate) fn read_cpu_list(path: &Path) -> Result<CpuSet, TopologyError> {
    cpu_list_at(path, &read_text(path)?)
}

/// Parses a decimal integer that may be negative (`-1` is sysfs's "unknown").
pub(crate) fn parse_int(path: &Path, text: &str) -> Result<i64, TopologyError> {
    let text = text.trim();
    text.parse::<i64>()
        .map_err(|_| parse_error(path, format!("{text:?} is not an integer")))
}

/// Reads a non-negative id, or `-1` meaning "unknown" (then `if_unknown`).
pub(crate) fn read_id(path: &Path, if_unknown: usize) -> Result<usize, TopologyError> {
    match parse_int(path, &read_text(path)?)? {
        -1 => Ok(if_unknown),
        value => usize::try_from(value)
            .map_err(|_| parse_error(path, format!("{value} is not a valid id"))),
    }
}

/// The UTF-8 entry names of directory `dir`, sorted; `None` when it does not exist.
pub(crate) fn dir_names(dir: &Path) -> Result<Option<Vec<String>>, TopologyError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(io_error(dir, source)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| io_error(dir, source))?;
        if let Ok(name) = entry.file_name().into_string() {
            names.push(name);
        }
    }
    names.sort_unstable();
    Ok(Some(names))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_int_accepts_signs_and_whitespace() {
        let p = Path::new("x");
        assert_eq!(parse_int(p, " -1\n").unwrap(), -1);
        assert_eq!(parse_int(p, "42").unwrap(), 42);
        assert!(matches!(
            parse_int(p, "4 2"),
            Err(TopologyError::Parse { .. })
        ));
        assert!(matches!(parse_int(p, ""), Err(TopologyError::Parse { .. })));
    }

    #[test]
    fn missing_paths() {
        let p = Path::new("/nonexistent-morio-topology/x");
        assert!(read_text_opt(p).unwrap().is_none());
        assert!(dir_names(p).unwrap().is_none());
        assert!(matches!(read_text(p), Err(TopologyError::Io { .. })));
    }
}
