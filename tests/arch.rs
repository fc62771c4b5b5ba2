//! Architecture rules checked as a test: the library's module graph has no cycles between
//! sibling modules, and the transport seam holds (nothing outside `src/transport/` and the
//! engine's binding names a socket).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The library's source files (not the command's), as module paths: `src/service/lane/mod.rs`
/// is `["service", "lane"]`, `src/lib.rs` is `[]`.
fn modules() -> BTreeMap<Vec<String>, String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n != "bin") {
                    walk(&p, out);
                }
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let src = root().join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    files
        .into_iter()
        .map(|f| {
            let rel = f.strip_prefix(&src).unwrap().with_extension("");
            let mut m: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(m.last().map(String::as_str), Some("mod" | "lib")) {
                m.pop();
            }
            (m, fs::read_to_string(&f).unwrap())
        })
        .collect()
}

/// Paths a file names: `crate::a::b` and `super::c` (relative paths resolved), including the
/// members of one level of braces (`use crate::a::{b, c::d}`).
fn named_paths(module: &[String], text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        for start in ["crate::", "super::"] {
            let mut rest = code;
            while let Some(i) = rest.find(start) {
                // Not part of a longer identifier (e.g. `morio_crate::`).
                let ok = i == 0 || !rest.as_bytes()[i - 1].is_ascii_alphanumeric();
                let tail = &rest[i..];
                rest = &rest[i + start.len()..];
                if !ok {
                    continue;
                }
                let path: String = tail
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                    .collect();
                let mut segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
                // The parent of this file's module: for `a/b.rs` that is `a`; for `a/b/mod.rs`
                // too (`super` of module a::b is a).
                let mut base: Vec<String> = Vec::new();
                if segs.first() == Some(&"crate") {
                    segs.remove(0);
                } else {
                    base = module.to_vec();
                    while segs.first() == Some(&"super") {
                        segs.remove(0);
                        base.pop();
                    }
                }
                let mut full = base.clone();
                full.extend(segs.iter().map(|s| s.to_string()));
                // Braced members: `crate::a::{b, c}` names a::b and a::c.
                let after = &tail[path.len()..];
                if let Some(inner) = after.strip_prefix('{') {
                    let inner = inner.split('}').next().unwrap_or("");
                    for m in inner.split(',') {
                        let m = m.trim().split(" as ").next().unwrap_or("").trim();
                        let mut p = full.clone();
                        p.extend(
                            m.split("::")
                                .filter(|s| !s.is_empty() && *s != "self")
                                .map(String::from),
                        );
                        out.push(p);
                    }
                }
                out.push(full);
            }
        }
    }
    out
}

/// The module among `mods` that `path` names: its longest prefix that is a module.
fn resolve(mods: &BTreeSet<Vec<String>>, path: &[String]) -> Vec<String> {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|p| mods.contains(p))
        .unwrap_or_default()
}

#[test]
fn sibling_modules_import_each_other_in_no_cycle() {
    let files = modules();
    let mods: BTreeSet<Vec<String>> = files.keys().cloned().collect();
    assert!(mods.len() > 30, "found only {} modules", mods.len());
    // Edges between siblings: a file in subtree `p::a` naming something in subtree `p::b`
    // (`a != b`) is an edge a -> b under parent p. A parent and its children depend on each
    // other by design (the parent dispatches, the children use its types): not counted.
    let mut edges: BTreeMap<Vec<String>, BTreeSet<(String, String)>> = BTreeMap::new();
    for (m, text) in &files {
        for p in named_paths(m, text) {
            let target = resolve(&mods, &p);
            let common = m.iter().zip(&target).take_while(|(a, b)| a == b).count();
            if common < m.len() && common < target.len() {
                edges
                    .entry(m[..common].to_vec())
                    .or_default()
                    .insert((m[common].clone(), target[common].clone()));
            }
        }
    }
    for (parent, es) in &edges {
        // Kahn's algorithm: whatever cannot be ordered lies on a cycle.
        let nodes: BTreeSet<&String> = es.iter().flat_map(|(a, b)| [a, b]).collect();
        let mut indeg: BTreeMap<&String, usize> = nodes.iter().map(|n| (*n, 0)).collect();
        for (_, b) in es {
            *indeg.get_mut(b).unwrap() += 1;
        }
        let mut ready: Vec<&String> = indeg
            .iter()
            .filter(|(_, d)| **d == 0)
            .map(|(n, _)| *n)
            .collect();
        let mut done = 0;
        while let Some(n) = ready.pop() {
            done += 1;
            for (a, b) in es {
                if a == n {
                    let d = indeg.get_mut(b).unwrap();
                    *d -= 1;
                    if *d == 0 {
                        ready.push(b);
                    }
                }
            }
        }
        let stuck: BTreeSet<&str> = indeg
            .iter()
            .filter(|(_, d)| **d > 0)
            .map(|(n, _)| n.as_str())
            .collect();
        assert!(
            stuck.is_empty(),
            "modules under `crate::{}` import each other in a cycle: {:?}",
            parent.join("::"),
            one_cycle(es, &stuck)
        );
        assert_eq!(done, nodes.len());
    }
}

/// One cycle among the modules left after ordering: each of them still has a predecessor
/// among them, so walking predecessors must come back to a module already seen.
fn one_cycle(es: &BTreeSet<(String, String)>, stuck: &BTreeSet<&str>) -> Vec<String> {
    let mut path: Vec<&str> = vec![*stuck.iter().next().unwrap()];
    loop {
        let at = *path.last().unwrap();
        let prev = es
            .iter()
            .find(|(a, b)| b == at && stuck.contains(a.as_str()))
            .map(|(a, _)| a.as_str())
            .unwrap();
        if let Some(i) = path.iter().position(|p| *p == prev) {
            // Forward: path[i] -> path[last] -> ... -> path[i + 1] -> path[i].
            let mut c = vec![prev.to_string()];
            c.extend(path[i + 1..].iter().rev().map(|s| s.to_string()));
            c.push(prev.to_string());
            return c;
        }
        path.push(prev);
    }
}

#[test]
fn only_the_transport_names_sockets() {
    let forbidden = [
        "socket2",
        "libc::",
        "RawFd",
        "TcpStream",
        "TcpListener",
        "ReadHalf",
        "WriteHalf",
    ];
    for (m, text) in modules() {
        if m.first().map(String::as_str) != Some("service") {
            continue;
        }
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for w in forbidden {
                assert!(
                    !code.contains(w),
                    "src/{}: line {}: the service must go through crate::transport, not {w}",
                    m.join("/"),
                    i + 1
                );
            }
        }
    }
}
