//! Repository rules checked as a test: module docs, the purity of `src/proto`, glommio
//! confined to `morio-shards`, and the library's public boundary.

use std::fs;
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            if p.file_name()
                .is_some_and(|n| n == "fixtures" || n == "target")
            {
                continue;
            }
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn every_module_starts_with_a_doc_line() {
    let mut files = Vec::new();
    for d in [
        "src",
        "shards/src",
        "topology/src",
        "tests",
        "benches",
        "topology/tests",
        "shards/tests",
    ] {
        rust_files(&root().join(d), &mut files);
    }
    assert!(files.len() > 20, "found only {} files", files.len());
    let bad: Vec<_> = files
        .iter()
        .filter(|f| !fs::read_to_string(f).unwrap_or_default().starts_with("//!"))
        .collect();
    assert!(bad.is_empty(), "files without a leading //! line: {bad:?}");
}

#[test]
fn proto_does_no_io_and_reads_no_clock() {
    let mut files = Vec::new();
    rust_files(&root().join("src/proto"), &mut files);
    assert!(!files.is_empty());
    let forbidden = [
        "std::net",
        "std::fs",
        "std::io",
        "Instant",
        "SystemTime",
        "glommio",
        "morio_shards",
        "socket2",
        "libc",
        "std::thread",
        "println!",
        "log::",
    ];
    for f in files {
        let text = fs::read_to_string(&f).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for word in forbidden {
                assert!(
                    !code.contains(word),
                    "{}:{}: src/proto must not use {word}",
                    f.display(),
                    i + 1
                );
            }
            if let Some(pos) = code.find("crate::") {
                assert!(
                    code[pos..].starts_with("crate::proto"),
                    "{}:{}: src/proto may only name crate::proto",
                    f.display(),
                    i + 1
                );
            }
        }
    }
}

#[test]
fn glommio_is_named_only_in_morio_shards() {
    let mut files = Vec::new();
    for d in ["src", "topology/src", "tests", "benches"] {
        rust_files(&root().join(d), &mut files);
    }
    for f in files {
        if f.ends_with("tidy.rs") {
            continue;
        }
        let text = fs::read_to_string(&f).unwrap();
        assert!(
            !text.contains("glommio::"),
            "{} names glommio; go through morio_shards::rt",
            f.display()
        );
    }
    let root_toml = fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let pkg = root_toml.split("[package]").nth(1).unwrap_or("");
    assert!(
        !pkg.contains("\nglommio"),
        "the root package must not depend on glommio"
    );
    let topo = fs::read_to_string(root().join("topology/Cargo.toml")).unwrap();
    assert!(
        !topo.contains("glommio") && !topo.contains("morio-shards"),
        "topology is pure"
    );
}

/// The API is the root's re-exports and the modules `gpu`, `placement`, `status` and
/// `discovery` (feature `etcd`); every
/// other module is private, or public only as a hidden item under the `testing` feature (for
/// this package's tests and benches), or hidden for the `morio` command (`trace`). Nothing the
/// default features build turns `testing` on.
#[test]
fn internals_are_public_only_under_testing() {
    const API: [&str; 4] = ["gpu", "placement", "status", "discovery"];
    const COMMAND: [&str; 1] = ["trace"];
    let lib = fs::read_to_string(root().join("src/lib.rs")).unwrap();
    let mut attrs: Vec<&str> = Vec::new();
    let mut public = Vec::new();
    for (i, line) in lib.lines().enumerate() {
        let line = line.trim();
        if line.starts_with("#[") {
            attrs.push(line);
            continue;
        }
        if line.starts_with("//") || line.is_empty() {
            continue;
        }
        let hidden = attrs.contains(&"#[doc(hidden)]");
        let testing = attrs.contains(&"#[cfg(feature = \"testing\")]");
        let at = format!("src/lib.rs:{}: `{line}`", i + 1);
        if let Some(name) = line.strip_prefix("pub mod ") {
            let name = name.trim_end_matches(';');
            public.push(name.to_string());
            if API.contains(&name) {
                assert!(!hidden, "{at}: an API module is documented");
            } else if COMMAND.contains(&name) {
                assert!(hidden, "{at}: the command's module is #[doc(hidden)]");
            } else {
                assert!(
                    hidden && testing,
                    "{at}: an internal module is public only as \
                     #[cfg(feature = \"testing\")] #[doc(hidden)] (and private otherwise)"
                );
            }
        } else if line.starts_with("pub(crate) mod ") || line.starts_with("pub(super) mod ") {
            panic!("{at}: write a private module as `mod`");
        } else if let Some(path) = line.strip_prefix("pub use ") {
            let module = path.split("::").next().unwrap_or("");
            assert!(
                hidden || !["proto", "trace", "service", "region"].contains(&module),
                "{at}: an internal item re-exported visibly"
            );
        }
        attrs.clear();
    }
    for m in API {
        assert!(
            public.iter().any(|p| p == m),
            "src/lib.rs: `pub mod {m}` is gone"
        );
    }
    let toml = fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let features = toml
        .split("\n[features]\n")
        .nth(1)
        .and_then(|f| f.split("\n[").next())
        .expect("Cargo.toml has [features]");
    // `name = [ ... ]` entries, comments dropped, lists possibly over several lines.
    let text: String = features
        .lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .collect();
    for entry in text.split(']').filter(|e| e.contains('=')) {
        let (name, list) = entry.split_once('=').unwrap();
        assert!(
            name.trim() == "testing" || !list.contains("\"testing\""),
            "Cargo.toml: feature `{}` turns on `testing`",
            name.trim()
        );
    }
    assert!(
        toml.contains("morio = { path = \".\", features = [\"testing\"] }"),
        "the tests and benches reach the internals through the dev-dependency on the package \
         itself with `testing`"
    );
}
