//! The module graph of every crate has no circles: within a crate, no top-level module reaches
//! itself through `crate::` paths (a module's children count as the module; comments and test
//! modules do not count).
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("source folder") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Top-level module -> the top-level modules it names through `crate::`.
fn edges(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let is_module = |m: &str| src.join(format!("{m}.rs")).exists() || src.join(m).is_dir();
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(src).expect("under src");
        let first = rel.components().next().expect("a file").as_os_str();
        let top = first.to_string_lossy().trim_end_matches(".rs").to_string();
        if top == "lib" || top == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&f).expect("source");
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            let mut names: Vec<String> = line
                .match_indices("crate::")
                .map(|(i, _)| {
                    line[i + 7..]
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                        .collect()
                })
                .collect();
            if let Some(group) = line.split("use crate::{").nth(1) {
                let group = group.split('}').next().unwrap_or("");
                names.extend(
                    group
                        .split(',')
                        .map(|p| p.trim().split("::").next().unwrap_or("").to_string()),
                );
            }
            for n in names {
                if !n.is_empty() && n != top && is_module(&n) {
                    out.entry(top.clone()).or_default().insert(n);
                }
            }
        }
    }
    out
}

/// A circle through `start`, if any (depth-first).
fn circle(edges: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    let mut stack = vec![(start.to_string(), vec![start.to_string()])];
    let mut seen = BTreeSet::new();
    while let Some((node, path)) = stack.pop() {
        for next in edges.get(&node).into_iter().flatten() {
            if next == start {
                return Some(path.clone());
            }
            if seen.insert(next.clone()) {
                let mut p = path.clone();
                p.push(next.clone());
                stack.push((next.clone(), p));
            }
        }
    }
    None
}

#[test]
fn no_crate_has_an_import_circle() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut circles = Vec::new();
    for e in std::fs::read_dir(&crates).expect("crates") {
        let src = e.expect("entry").path().join("src");
        if !src.is_dir() {
            continue;
        }
        let g = edges(&src);
        for m in g.keys() {
            if let Some(c) = circle(&g, m) {
                circles.push(format!("{}: {}", src.display(), c.join(" -> ")));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}
