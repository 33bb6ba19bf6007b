//! No import circle among the operator crate's modules: a module never depends, through
//! `crate::`, `super::` or `self::` paths (in `use` items or written out in code), on a
//! module that depends back on it. Lower layers (children, caches, manifests) stay below
//! the reconcile shells that use them, so each can be read — and changed — on its own.
//! Test modules (`#[cfg(test)] mod … { }`) are left out: tests may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `src/a/b.rs` and `src/a/b/mod.rs` are module `a::b`; `src/lib.rs` is the crate root "".
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts.join("::")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The file without its `#[cfg(test)]` modules (each to its closing brace at column 0) and
/// without comments.
fn without_tests(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]"
            && lines.peek().is_some_and(|next| {
                let next = next.trim_start();
                (next.starts_with("mod ") || next.starts_with("pub(crate) mod "))
                    && next.ends_with('{')
            })
        {
            let indent = lines
                .peek()
                .map(|l| l.len() - l.trim_start().len())
                .unwrap_or(0);
            let close = format!("{}}}", " ".repeat(indent));
            for inner in lines.by_ref() {
                if inner == close {
                    break;
                }
            }
            continue;
        }
        let code = match line.find("//") {
            // Not inside a string on that line (an even number of quotes before it).
            Some(at) if line[..at].matches('"').count() % 2 == 0 => &line[..at],
            _ => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// Every path a `use` tree names, flattened: `crate::{a::{b, c}, d}` gives `crate::a::b`,
/// `crate::a::c`, `crate::d`.
fn use_paths(tree: &str) -> Vec<String> {
    fn expand(prefix: &str, tree: &str, out: &mut Vec<String>) {
        let tree = tree.trim();
        if let Some(open) = tree.find('{') {
            let head = tree[..open].trim().trim_end_matches("::");
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            let base = join(prefix, head);
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(&base, &inner[start..i], out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            expand(&base, &inner[start..], out);
        } else if !tree.is_empty() {
            let path = tree.split(" as ").next().unwrap_or(tree).trim();
            let path = path.strip_suffix("::self").unwrap_or(path);
            out.push(join(prefix, path));
        }
    }
    fn join(prefix: &str, path: &str) -> String {
        match (prefix.is_empty(), path.is_empty() || path == "self") {
            (_, true) => prefix.to_string(),
            (true, false) => path.to_string(),
            (false, false) => format!("{prefix}::{path}"),
        }
    }
    let mut out = Vec::new();
    expand("", tree, &mut out);
    out
}

/// The paths a file's code names: its `use` items, and `crate::…`/`super::…`/`self::…`
/// written out elsewhere.
fn named_paths(code: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = code;
    // `use` items (possibly `pub use`, `pub(crate) use`), up to their semicolon.
    while let Some(at) = rest.find("use ") {
        let before = rest[..at].chars().last();
        let after = &rest[at + 4..];
        rest = after;
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(end) = after.find(';') {
            let tree = &after[..end];
            if tree
                .chars()
                .all(|c| !c.is_control() || c == '\n' || c == ' ')
            {
                paths.extend(use_paths(tree));
            }
        }
    }
    // Paths written out in code.
    let bytes = code.as_bytes();
    for prefix in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(at) = code[from..].find(prefix) {
            let start = from + at;
            from = start + prefix.len();
            if start > 0
                && (bytes[start - 1].is_ascii_alphanumeric()
                    || bytes[start - 1] == b'_'
                    || bytes[start - 1] == b':')
            {
                continue;
            }
            let end = code[start..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .map(|e| start + e)
                .unwrap_or(code.len());
            paths.push(code[start..end].trim_end_matches(':').to_string());
        }
    }
    paths.sort();
    paths.dedup();
    paths
}

/// The module a path names from within module `from`: the longest known module prefix of
/// the absolute path (`None` for paths outside the crate).
fn target_module(from: &str, path: &str, modules: &BTreeSet<String>) -> Option<String> {
    let mut segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let mut base: Vec<&str> = if from.is_empty() {
        vec![]
    } else {
        from.split("::").collect()
    };
    match segments.first().copied() {
        Some("crate") => {
            base.clear();
            segments.remove(0);
        }
        Some("self") => {
            segments.remove(0);
        }
        Some("super") => {
            while segments.first() == Some(&"super") {
                segments.remove(0);
                base.pop();
            }
        }
        // A child module of this one named first (2018 paths).
        Some(first) if modules.contains(&[base.clone(), vec![first]].concat().join("::")) => {}
        _ => return None,
    }
    let absolute: Vec<&str> = base.into_iter().chain(segments).collect();
    (0..=absolute.len())
        .rev()
        .map(|n| absolute[..n].join("::"))
        .find(|candidate| modules.contains(candidate))
}

/// Strongly connected components with more than one module (Tarjan).
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        next: usize,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, node: &'a str) {
        s.index.insert(node, s.next);
        s.low.insert(node, s.next);
        s.next += 1;
        s.stack.push(node);
        s.on_stack.insert(node);
        if let Some(targets) = s.edges.get(node) {
            for target in targets {
                let target = target.as_str();
                if !s.index.contains_key(target) {
                    visit(s, target);
                    let low = s.low[node].min(s.low[target]);
                    s.low.insert(node, low);
                } else if s.on_stack.contains(target) {
                    let low = s.low[node].min(s.index[target]);
                    s.low.insert(node, low);
                }
            }
        }
        if s.low[node] == s.index[node] {
            let mut component = Vec::new();
            while let Some(top) = s.stack.pop() {
                s.on_stack.remove(top);
                component.push(top.to_string());
                if top == node {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut state = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for node in edges.keys() {
        if !state.index.contains_key(node.as_str()) {
            visit(&mut state, node);
        }
    }
    state.found
}

#[test]
fn the_operator_crate_has_no_import_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(&src, f)).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut why: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let from = module_of(&src, file);
        let code = without_tests(&std::fs::read_to_string(file).unwrap());
        for path in named_paths(&code) {
            let Some(to) = target_module(&from, &path, &modules) else {
                continue;
            };
            // A module's own items, and its parent's or ancestors' (which declare it), are
            // not an import of another layer.
            if to == from || from.starts_with(&format!("{to}::")) || to.is_empty() {
                continue;
            }
            edges.entry(from.clone()).or_default().insert(to.clone());
            why.entry((from.clone(), to)).or_default().insert(path);
        }
    }
    let found = circles(&edges);
    let explain = |component: &[String]| {
        let mut lines = Vec::new();
        for from in component {
            for to in edges.get(from).into_iter().flatten() {
                if component.contains(to) {
                    let names = why[&(from.clone(), to.clone())]
                        .iter()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ");
                    lines.push(format!("  {from} -> {to}: {names}"));
                }
            }
        }
        lines.join("\n")
    };
    assert!(
        found.is_empty(),
        "import circles among the operator's modules:\n{}",
        found
            .iter()
            .map(|c| format!("{}\n{}", c.join(" <-> "), explain(c)))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn use_trees_and_written_paths_are_read() {
    assert_eq!(
        use_paths("crate::{a::{b, c as d}, e, f::self}"),
        ["crate::a::b", "crate::a::c", "crate::e", "crate::f"]
    );
    let modules: BTreeSet<String> = ["", "a", "a::b", "a::c", "d"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(
        target_module("a::b", "super::c::X", &modules).as_deref(),
        Some("a::c")
    );
    assert_eq!(
        target_module("a::b", "crate::d::f", &modules).as_deref(),
        Some("d")
    );
    assert_eq!(
        target_module("a", "b::X", &modules).as_deref(),
        Some("a::b")
    );
    assert_eq!(target_module("a", "std::sync", &modules), None);
    let code = "use crate::a::b;\nfn f() { crate::d::g(); super::x(); }\n";
    assert_eq!(
        named_paths(code),
        ["crate::a::b", "crate::d::g", "super::x"]
    );
    let edges: BTreeMap<String, BTreeSet<String>> =
        [("a", vec!["b"]), ("b", vec!["a", "c"]), ("c", vec![])]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
            .collect();
    assert_eq!(circles(&edges), [vec!["a".to_string(), "b".to_string()]]);
}
