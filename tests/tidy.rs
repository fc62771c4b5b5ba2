//! Repository rules checked as a test: module docs, the purity of `src/proto`, and glommio
//! confined to `morio-shards`.

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
