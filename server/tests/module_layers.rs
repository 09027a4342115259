//! Every crate's modules import each other in layers, without circles (issue
//! 38, every crate of the workspace since issue 56): neither between the
//! top-level modules of a crate (in salus-node, leaves such as `http2` and
//! `wire` under `error`, `tenant` and `runtime`, the admin front end over
//! those, then `supervisor` on top; in salus-server, `tf` under the runtime's
//! jobs, the front ends over those, `server`, then `executor`) nor between
//! any two files. A circle makes a newcomer read everything to understand
//! anything; this test names the one it finds. Which crate may use which is
//! crate_layers.rs's.
//!
//! Read from the sources: every `crate::a::b` path and `use crate::{..}` tree
//! outside comments and outside the `#[cfg(test)]` module at a file's end
//! (tests may reach any module), and `super::x` paths. Doc links are comments.

mod workspace;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `runtime/executor.rs` -> ["runtime", "executor"]; `runtime/mod.rs` -> ["runtime"].
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts
        .last()
        .is_some_and(|p| p == "mod" || p == "lib" || p == "main")
    {
        parts.pop();
    }
    parts
}

/// The code of a file that production builds compile: comments dropped, and
/// the trailing `#[cfg(test)]` module cut off.
fn production_code(text: &str) -> String {
    let mut code = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]"
            && lines.peek().is_some_and(|next| next.starts_with("mod "))
        {
            break;
        }
        let line = match line.find("//") {
            // Not inside a string: "//" in code is always a comment here but
            // for URLs in strings, which name no module either way.
            Some(at) => &line[..at],
            None => line,
        };
        code.push_str(line);
        code.push('\n');
    }
    code
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every module path under `crate::` that `code` names, use trees expanded
/// (`crate::{a::b, c::{d, e}}` gives a::b, c::d, c::e).
fn crate_paths(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let bytes: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i + 7 <= bytes.len() {
        let before_ok = i == 0 || !is_ident(bytes[i - 1]);
        if before_ok && bytes[i..i + 7].iter().collect::<String>() == "crate::" {
            i += 7;
            tree(&bytes, &mut i, Vec::new(), &mut paths);
        } else {
            i += 1;
        }
    }
    paths
}

/// Parses one use tree at `bytes[*i..]` with `prefix` before it.
fn tree(bytes: &[char], i: &mut usize, mut prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    loop {
        skip_space(bytes, i);
        if *i < bytes.len() && bytes[*i] == '{' {
            *i += 1;
            loop {
                tree(bytes, i, prefix.clone(), out);
                skip_space(bytes, i);
                match bytes.get(*i) {
                    Some(',') => *i += 1,
                    Some('}') => {
                        *i += 1;
                        return;
                    }
                    _ => return,
                }
                skip_space(bytes, i);
                if bytes.get(*i) == Some(&'}') {
                    *i += 1;
                    return;
                }
            }
        }
        let start = *i;
        while *i < bytes.len() && is_ident(bytes[*i]) {
            *i += 1;
        }
        if *i == start {
            break;
        }
        prefix.push(bytes[start..*i].iter().collect());
        if bytes[*i..].starts_with(&[':', ':']) {
            *i += 2;
        } else {
            break;
        }
    }
    if !prefix.is_empty() {
        out.push(prefix);
    }
}

fn skip_space(bytes: &[char], i: &mut usize) {
    while *i < bytes.len() && bytes[*i].is_whitespace() {
        *i += 1;
    }
}

/// `super::x` paths, made absolute against `module` (the file's).
fn super_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    // A file's module is its path, a mod.rs's its folder's: either way
    // `super` is that path less its last part.
    let parent = &module[..module.len().saturating_sub(1)];
    let mut out = Vec::new();
    for (at, _) in code.match_indices("super::") {
        if at > 0 && is_ident(code[..at].chars().last().unwrap()) {
            continue;
        }
        let rest: String = code[at + 7..]
            .chars()
            .take_while(|&c| is_ident(c))
            .collect();
        if !rest.is_empty() {
            let mut path = parent.to_vec();
            path.push(rest);
            out.push(path);
        }
    }
    out
}

/// A circle in `edges`, if there is one (depth-first search).
fn find_circle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_string(), 1);
        stack.push(node.to_string());
        for next in edges.get(node).into_iter().flatten() {
            match state.get(next.as_str()) {
                Some(1) => {
                    let from = stack.iter().position(|n| n == next).unwrap();
                    let mut circle = stack[from..].to_vec();
                    circle.push(next.clone());
                    return Some(circle);
                }
                Some(_) => {}
                None => {
                    if let Some(circle) = visit(next, edges, state, stack) {
                        return Some(circle);
                    }
                }
            }
        }
        stack.pop();
        state.insert(node.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in edges.keys() {
        if !state.contains_key(node.as_str()) {
            if let Some(circle) = visit(node, edges, &mut state, &mut Vec::new()) {
                return Some(circle);
            }
        }
    }
    None
}

/// Each workspace crate's name and the folders of its targets' roots (`src`;
/// `fuzz_targets`, `benches`, ... hold roots of their own, which import
/// nothing of each other), from `cargo metadata` (offline).
fn crate_sources() -> Vec<(String, Vec<PathBuf>)> {
    let value = workspace::cargo_metadata(&["--no-deps"]);
    let mut crates = Vec::new();
    for package in value["packages"].as_array().unwrap() {
        let mut roots = BTreeSet::new();
        for target in package["targets"].as_array().unwrap() {
            let kinds = target["kind"].as_array().unwrap();
            // Integration tests, benches and examples may reach anything.
            if kinds.iter().any(|k| {
                ["lib", "bin", "cdylib", "rlib", "staticlib"].contains(&k.as_str().unwrap())
            }) {
                let root = Path::new(target["src_path"].as_str().unwrap());
                roots.insert(root.parent().unwrap().to_path_buf());
            }
        }
        crates.push((
            package["name"].as_str().unwrap().to_string(),
            roots.into_iter().collect(),
        ));
    }
    crates
}

/// The module graph of the crate whose sources are under `src`, cut at
/// `depth` path segments (1: top-level modules; 9: files), without edges
/// between a module and its own parent or children.
fn graph(src: &Path, depth: usize) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(src, f)).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let module = module_of(src, file);
        if module.is_empty() {
            continue; // lib.rs declares every module; main.rs is the binary
        }
        let code = production_code(&std::fs::read_to_string(file).unwrap());
        let mut named = crate_paths(&code);
        named.extend(super_paths(&code, &module));
        for path in named {
            // The longest prefix that is a module of this crate (sched, units: other crates).
            let Some(target) = (1..=path.len())
                .rev()
                .map(|k| path[..k].to_vec())
                .find(|p| modules.contains(p))
            else {
                continue;
            };
            let (from, to) = (
                module.iter().take(depth).cloned().collect::<Vec<_>>(),
                target.iter().take(depth).cloned().collect::<Vec<_>>(),
            );
            if from.starts_with(&to) || to.starts_with(&from) {
                continue;
            }
            edges
                .entry(from.join("::"))
                .or_default()
                .insert(to.join("::"));
        }
    }
    edges
}

/// The first circle in any crate's graph cut at `depth`, named with its crate.
fn circles(depth: usize) -> (Vec<String>, usize) {
    let mut found = Vec::new();
    let mut edges_seen = 0;
    for (name, roots) in crate_sources() {
        for src in roots {
            let edges = graph(&src, depth);
            edges_seen += edges.len();
            if let Some(circle) = find_circle(&edges) {
                found.push(format!(
                    "{name} ({}): {}",
                    src.display(),
                    circle.join(" -> ")
                ));
            }
        }
    }
    (found, edges_seen)
}

#[test]
fn top_level_modules_import_each_other_without_circles() {
    let (found, edges_seen) = circles(1);
    assert!(
        edges_seen > 20,
        "the reader found too few imports to judge: {edges_seen}"
    );
    assert!(
        found.is_empty(),
        "import circles between a crate's top-level modules:\n{}",
        found.join("\n")
    );
}

#[test]
fn files_import_each_other_without_circles() {
    let (found, _) = circles(usize::MAX);
    assert!(
        found.is_empty(),
        "import circles between a crate's files:\n{}",
        found.join("\n")
    );
}

#[test]
fn every_crate_is_read() {
    let crates = crate_sources();
    let names: Vec<&str> = crates.iter().map(|(name, _)| name.as_str()).collect();
    for name in [
        "salus-server",
        "salus-node",
        "salus-supervisor",
        "salus-sched",
        "salus-cli",
        "salus-proto",
    ] {
        assert!(names.contains(&name), "{name} is not read: {names:?}");
    }
    let node = &crates
        .iter()
        .find(|(name, _)| name == "salus-node")
        .unwrap()
        .1;
    assert!(
        graph(&node[0], 1).len() > 8,
        "salus-node's imports are not read"
    );
}

#[test]
fn the_reader_sees_use_trees_comments_and_test_modules() {
    let code = production_code(
        "use crate::{a::b, c::{d, e}};\n// crate::commented\nfn f() { crate::g::h(); }\n#[cfg(test)]\nmod tests {\n    use crate::z;\n}\n",
    );
    let paths: Vec<String> = crate_paths(&code).iter().map(|p| p.join("::")).collect();
    assert_eq!(paths, ["a::b", "c::d", "c::e", "g::h"]);
    let circle = BTreeMap::from([
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["a".to_string()])),
    ]);
    assert_eq!(
        find_circle(&circle),
        Some(vec!["a".into(), "b".into(), "a".into()])
    );
}
