//! The shape of `src/`, kept: no file over 800 lines, no function over 100 (a `#[cfg(test)]` module at the
//! end of a file aside), and no import circle between files.
//!
//! An import is a path a file names: `crate::a::b::Item` or `super::x::Item` (a `use` or inline, groups
//! included) is an import of the file that path reaches, its longest prefix that is a module (so `super::Item`
//! from a child is an import of its parent's file). A parent's own `mod` and `pub use` lines are how Rust
//! declares a module, not imports. Files that import each other, directly or round a longer loop, are a
//! circle: each can be read only with the others, and none can move alone.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 800;
const MAX_FN_LINES: usize = 100;

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// The module path of a file: `src/hub/stream/mod.rs` is `["hub", "stream"]`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let mut parts: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// A file's text before its `#[cfg(test)]` module, without `//` comments.
fn code_of(text: &str) -> String {
    let code = text.split("#[cfg(test)]").next().unwrap_or(text);
    code.lines().map(|line| line.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// The paths a file names from `crate::` or `super::`, as module segments from the crate root; a group
/// (`super::{a, b::C}`) gives one path per member.
fn named_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let bytes = code.as_bytes();
    for head in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(at) = code[from..].find(head) {
            let start = from + at;
            from = start + head.len();
            if start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_') {
                continue;
            }
            let mut base: Vec<String> =
                if head == "crate::" { Vec::new() } else { module[..module.len().saturating_sub(1)].to_vec() };
            let rest = &code[from..];
            let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(rest.len());
            let mut segments: Vec<String> =
                rest[..end].split("::").filter(|s| !s.is_empty()).map(str::to_owned).collect();
            while segments.first().is_some_and(|s| s == "super") {
                segments.remove(0);
                base.pop();
            }
            base.extend(segments);
            if rest[end..].starts_with('{') {
                let group = &rest[end + 1..rest[end..].find('}').map_or(rest.len(), |close| end + close)];
                for member in group.split(',') {
                    let first = member.trim().split("::").next().unwrap_or("").trim();
                    if !first.is_empty() && first != "self" {
                        paths.push(base.iter().cloned().chain([first.to_owned()]).collect());
                    }
                }
            }
            paths.push(base);
        }
    }
    paths
}

/// The functions of `code` longer than `MAX_FN_LINES`, as (name, lines).
fn long_functions(code: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut long = Vec::new();
    for (at, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let signature = trimmed
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub(super) ")
            .trim_start_matches("pub ")
            .trim_start_matches("const ")
            .trim_start_matches("async ");
        let Some(name) = signature.strip_prefix("fn ") else { continue };
        let name: String = name.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let closing = lines[at + 1..]
            .iter()
            .position(|l| l.starts_with(&format!("{}}}", " ".repeat(indent))) && !l[indent..].starts_with("} else"));
        if let Some(closing) = closing
            && closing + 2 > MAX_FN_LINES
        {
            long.push((name, closing + 2));
        }
    }
    long
}

/// The strongly connected groups of more than one file (Tarjan's algorithm).
fn circles(edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'a PathBuf, (usize, usize)>,
        stack: Vec<&'a PathBuf>,
        found: Vec<Vec<PathBuf>>,
    }
    fn visit<'a>(walk: &mut Walk<'a>, file: &'a PathBuf) {
        let next = walk.index.len();
        walk.index.insert(file, (next, next));
        walk.stack.push(file);
        for to in walk.edges.get(file).into_iter().flatten() {
            if !walk.index.contains_key(to) {
                visit(walk, to);
                let low = walk.index[to].1;
                walk.index.entry(file).and_modify(|(_, l)| *l = (*l).min(low));
            } else if walk.stack.contains(&to) {
                let seen = walk.index[to].0;
                walk.index.entry(file).and_modify(|(_, l)| *l = (*l).min(seen));
            }
        }
        let (number, low) = walk.index[file];
        if number == low {
            let mut group = Vec::new();
            while let Some(member) = walk.stack.pop() {
                group.push(member.clone());
                if member == file {
                    break;
                }
            }
            if group.len() > 1 {
                group.sort();
                walk.found.push(group);
            }
        }
    }
    let mut walk = Walk { edges, index: BTreeMap::new(), stack: Vec::new(), found: Vec::new() };
    for file in edges.keys() {
        if !walk.index.contains_key(file) {
            visit(&mut walk, file);
        }
    }
    walk.found
}

#[test]
fn src_has_no_long_file_no_long_function_and_no_import_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> =
        files.iter().filter(|f| !f.ends_with("main.rs")).map(|f| (module_of(&src, f), f.clone())).collect();
    let mut problems = Vec::new();
    let mut edges: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        let shown = file.strip_prefix(&src).unwrap_or(file).display().to_string();
        if text.lines().count() > MAX_FILE_LINES {
            problems.push(format!("{shown}: {} lines (at most {MAX_FILE_LINES})", text.lines().count()));
        }
        let code = code_of(&text);
        for (name, lines) in long_functions(&code) {
            problems.push(format!("{shown}: fn {name} is {lines} lines (at most {MAX_FN_LINES})"));
        }
        if file.ends_with("main.rs") {
            continue;
        }
        let module = module_of(&src, file);
        let imports = edges.entry(file.clone()).or_default();
        for path in named_paths(&code, &module) {
            let reached = (0..=path.len()).rev().find_map(|n| modules.get(&path[..n]));
            if let Some(reached) = reached.filter(|r| *r != file) {
                imports.insert(reached.clone());
            }
        }
    }
    for circle in circles(&edges) {
        let names: Vec<_> = circle.iter().map(|f| f.strip_prefix(&src).unwrap_or(f).display().to_string()).collect();
        problems.push(format!("import circle: {}", names.join(", ")));
    }
    let imports: usize = edges.values().map(BTreeSet::len).sum();
    assert!(imports > 300, "the scan found only {imports} imports between files: it no longer reads src/");
    assert!(problems.is_empty(), "the shape of src/ ({} files):\n{}", files.len(), problems.join("\n"));
}
