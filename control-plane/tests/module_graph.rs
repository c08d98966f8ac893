//! No import cycle between the control plane's modules, nor between the filter core's.
//!
//! Reads every file of the library (`src/`, `main.rs` aside: it only calls the library), takes
//! the module paths each one names outside comments and string literals (`crate::…`,
//! `super::…`, `self::…`, a child module's name, `use` trees expanded; test modules included)
//! and checks that three graphs have no cycle:
//! - the folders, one node per top-level module (`config`, `store`, `keys`, `engine`, `api`,
//!   `serve`, ...): the layers of the architecture;
//! - the files, one node per module, so that no two files of a folder lean on each other either;
//! - the files of the filter's decision crate (`filter-core/src`), with what only tests build
//!   left out (`#[cfg(test)]` items and files): a stage's tests drive it through the fake host,
//!   which sits above every module, as a test harness does.
//!
//! A failure names the cycle and, for each step, the file and line that makes it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// A module path from the crate root (`["keys", "store"]`); the root is empty.
type ModulePath = Vec<String>;

/// Where a dependency comes from: the file and the line naming the other module.
#[derive(Debug, Clone)]
struct Site {
    file: String,
    line: usize,
}

/// module -> module it names -> the first place it does.
type Graph = BTreeMap<String, BTreeMap<String, Site>>;

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    PathSep,
    Open,
    Close,
    Comma,
    Semi,
    Star,
    Other,
}

/// The end of the char literal opening at `start` (a `'`), or `None` for a lifetime.
fn skip_char_literal(chars: &[char], start: usize) -> Option<usize> {
    let mut i = start + 1;
    match chars.get(i) {
        Some('\\') => i += 2,
        Some(_) if chars.get(i + 1) == Some(&'\'') => i += 1,
        _ => return None,
    }
    while i < chars.len() && chars[i] != '\'' {
        i += 1;
    }
    Some(i + 1)
}

/// The tokens of a Rust source with their line, comments and literals left out.
fn tokens(source: &str) -> Vec<(Token, usize)> {
    let chars: Vec<char> = source.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        match c {
            '\n' => {
                line += 1;
                i += 1;
            }
            '/' if next == Some('/') => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '/' if next == Some('*') => {
                let mut depth = 0;
                while i < chars.len() {
                    if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                        depth += 1;
                        i += 2;
                    } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        if chars[i] == '\n' {
                            line += 1;
                        }
                        i += 1;
                    }
                }
            }
            '"' => {
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    if chars[i] == '\\' {
                        i += 1;
                    }
                    if chars.get(i) == Some(&'\n') {
                        line += 1;
                    }
                    i += 1;
                }
                i += 1;
                out.push((Token::Other, line));
            }
            '\'' => {
                // A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a).
                match skip_char_literal(&chars, i) {
                    Some(end) => i = end,
                    None => {
                        i += 1;
                        while i < chars.len() && is_ident(chars[i]) {
                            i += 1;
                        }
                    }
                }
                out.push((Token::Other, line));
            }
            ':' if next == Some(':') => {
                out.push((Token::PathSep, line));
                i += 2;
            }
            '{' => {
                out.push((Token::Open, line));
                i += 1;
            }
            '}' => {
                out.push((Token::Close, line));
                i += 1;
            }
            ',' => {
                out.push((Token::Comma, line));
                i += 1;
            }
            ';' => {
                out.push((Token::Semi, line));
                i += 1;
            }
            '*' => {
                out.push((Token::Star, line));
                i += 1;
            }
            c if is_ident(c) => {
                let start = i;
                while i < chars.len() && is_ident(chars[i]) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                // Raw strings: r"..", r#".."#, br"..", not raw identifiers (r#type).
                let hashes = chars[i..].iter().take_while(|c| **c == '#').count();
                let raw = (word == "r" || word == "br") && chars.get(i + hashes) == Some(&'"');
                if raw {
                    i += hashes + 1;
                    loop {
                        match chars.get(i) {
                            None => break,
                            Some('"') if (1..=hashes).all(|h| chars.get(i + h) == Some(&'#')) => {
                                i += 1 + hashes;
                                break;
                            }
                            Some('\n') => line += 1,
                            Some(_) => {}
                        }
                        i += 1;
                    }
                    out.push((Token::Other, line));
                } else if word == "b" && chars.get(i) == Some(&'\'') {
                    // A byte literal: b'x', b'\n'.
                    i = skip_char_literal(&chars, i).unwrap_or(i + 1);
                    out.push((Token::Other, line));
                } else if word == "r" && hashes == 1 {
                    // A raw identifier: r#type.
                    i += 1;
                } else {
                    out.push((Token::Ident(word), line));
                }
            }
            c if c.is_whitespace() => i += 1,
            _ => {
                out.push((Token::Other, line));
                i += 1;
            }
        }
    }
    out
}

/// The paths of one `use` tree (`a::{b, c::{self, d}}`), from the token after `use` to `;`.
fn use_paths(tree: &[(Token, usize)]) -> Vec<Vec<String>> {
    fn walk(tree: &[(Token, usize)], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let mut path: Vec<String> = prefix.to_vec();
        while *i < tree.len() {
            match &tree[*i].0 {
                // `{self, ..}`: the group's own prefix.
                Token::Ident(word) if word == "self" && !prefix.is_empty() => {}
                Token::Ident(word) if word == "as" => {
                    // `as name`: the alias is not a path.
                    *i += 1;
                }
                Token::Ident(word) => path.push(word.clone()),
                Token::PathSep | Token::Star => {}
                Token::Open => {
                    *i += 1;
                    loop {
                        walk(tree, i, &path, out);
                        match tree.get(*i).map(|t| &t.0) {
                            Some(Token::Comma) => *i += 1,
                            _ => break,
                        }
                    }
                    // The group's `}`.
                    *i += 1;
                    return;
                }
                Token::Comma | Token::Close | Token::Semi => break,
                Token::Other => {}
            }
            *i += 1;
        }
        out.push(path);
    }
    let mut out = Vec::new();
    let mut i = 0;
    walk(tree, &mut i, &[], &mut out);
    out
}

/// The module a file defines, from its path under `src/`.
fn module_of(relative: &Path) -> ModulePath {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if let Some(last) = parts.last_mut() {
        *last = last.trim_end_matches(".rs").to_owned();
    }
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The module `path` lands in: the longest prefix that is a file module; `None` outside the
/// crate (a dependency) or at its root.
fn target(
    path: &[String],
    current: &[String],
    modules: &BTreeSet<ModulePath>,
) -> Option<ModulePath> {
    let first = path.first()?;
    let mut absolute: Vec<String> = match first.as_str() {
        "crate" => Vec::new(),
        "self" => current.to_vec(),
        "super" => current.to_vec(),
        _ => {
            let mut child = current.to_vec();
            child.push(first.clone());
            if !modules.contains(&child) {
                return None;
            }
            current.to_vec()
        }
    };
    let mut rest = match first.as_str() {
        "crate" | "self" => &path[1..],
        _ => path,
    };
    while rest.first().map(String::as_str) == Some("super") {
        absolute.pop();
        rest = &rest[1..];
    }
    absolute.extend(rest.iter().cloned());
    (1..=absolute.len())
        .rev()
        .map(|n| absolute[..n].to_vec())
        .find(|prefix| modules.contains(prefix))
}

/// Whether the items only tests build count (`#[cfg(test)]` modules, functions, files).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Tests {
    Included,
    Left,
}

/// Whether `tokens` open with `#[cfg(test)]`.
fn is_cfg_test(tokens: &[(Token, usize)]) -> bool {
    let ident =
        |i: usize, name: &str| matches!(tokens.get(i), Some((Token::Ident(w), _)) if w == name);
    let other = |i: usize| matches!(tokens.get(i), Some((Token::Other, _)));
    other(0) && other(1) && ident(2, "cfg") && other(3) && ident(4, "test") && other(5) && other(6)
}

/// The token after the item whose attributes start at `start`: past its `;` or its `{ .. }`.
fn end_of_item(tokens: &[(Token, usize)], start: usize) -> usize {
    let mut i = start;
    while i < tokens.len() {
        match tokens[i].0 {
            Token::Semi => return i + 1,
            Token::Open => {
                let mut depth = 0usize;
                while i < tokens.len() {
                    match tokens[i].0 {
                        Token::Open => depth += 1,
                        Token::Close => {
                            depth -= 1;
                            if depth == 0 {
                                return i + 1;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    i
}

/// The files (under `src/`) of the modules declared `#[cfg(test)] mod name;`, with or without
/// a `#[path = ".."]`.
fn test_files(files: &[(PathBuf, String)]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for (path, source) in files {
        let dir = path.parent().unwrap_or(Path::new(""));
        for (at, _) in source.match_indices("#[cfg(test)]") {
            let mut rest = source[at + "#[cfg(test)]".len()..].trim_start();
            let mut file = None;
            if let Some(after) = rest.strip_prefix("#[path = \"") {
                let end = after.find('"').unwrap_or(0);
                file = Some(dir.join(&after[..end]));
                rest = after[end..].trim_start_matches(['"', ']']).trim_start();
            }
            let rest = rest.strip_prefix("pub ").unwrap_or(rest).trim_start();
            let Some(rest) = rest.strip_prefix("mod ") else {
                continue;
            };
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !rest[name.len()..].trim_start().starts_with(';') {
                continue;
            }
            let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
            let home = match stem.as_deref() {
                Some("lib" | "mod" | "main") => dir.to_path_buf(),
                Some(stem) => dir.join(stem),
                None => dir.to_path_buf(),
            };
            out.insert(file.unwrap_or_else(|| home.join(format!("{name}.rs"))));
        }
    }
    out
}

/// Every (named module, line) of one file defining `module`.
fn dependencies(
    source: &str,
    module: &[String],
    modules: &BTreeSet<ModulePath>,
    tests: Tests,
) -> Vec<(ModulePath, usize)> {
    let tokens = tokens(source);
    let mut found = Vec::new();
    // Inline modules (`mod tests { .. }`) open at a brace depth; `super` is relative to them.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        let current: ModulePath = module
            .iter()
            .cloned()
            .chain(inline.iter().map(|(name, _)| name.clone()))
            .collect();
        let (token, line) = &tokens[i];
        if tests == Tests::Left && is_cfg_test(&tokens[i..]) {
            i = end_of_item(&tokens, i);
            continue;
        }
        match token {
            Token::Open => depth += 1,
            Token::Close => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, at)| *at == depth) {
                    inline.pop();
                }
            }
            Token::Ident(word) if word == "mod" => {
                if let (Some((Token::Ident(name), _)), Some((Token::Open, _))) =
                    (tokens.get(i + 1), tokens.get(i + 2))
                {
                    inline.push((name.clone(), depth));
                }
            }
            Token::Ident(word) if word == "use" => {
                let end = tokens[i..]
                    .iter()
                    .position(|(t, _)| *t == Token::Semi)
                    .map_or(tokens.len(), |n| i + n);
                for path in use_paths(&tokens[i + 1..end]) {
                    if let Some(t) = target(&path, &current, modules) {
                        found.push((t, *line));
                    }
                }
                i = end;
                continue;
            }
            Token::Ident(word) => {
                let after_sep = i > 0 && tokens[i - 1].0 == Token::PathSep;
                if !after_sep && tokens.get(i + 1).map(|t| &t.0) == Some(&Token::PathSep) {
                    let mut path = vec![word.clone()];
                    let mut j = i + 1;
                    while let (Some((Token::PathSep, _)), Some((Token::Ident(next), _))) =
                        (tokens.get(j), tokens.get(j + 1))
                    {
                        path.push(next.clone());
                        j += 2;
                    }
                    if let Some(t) = target(&path, &current, modules) {
                        found.push((t, *line));
                    }
                    i = j;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    found
}

/// The module graph of the files `(path under src/, source)`, at file level (`depth` None) or
/// cut to the first `depth` segments.
fn graph(files: &[(PathBuf, String)], depth: Option<usize>, tests: Tests) -> Graph {
    let left = match tests {
        Tests::Included => BTreeSet::new(),
        Tests::Left => test_files(files),
    };
    let files: Vec<&(PathBuf, String)> = files.iter().filter(|(p, _)| !left.contains(p)).collect();
    let modules: BTreeSet<ModulePath> = files.iter().map(|(p, _)| module_of(p)).collect();
    let name = |m: &[String]| {
        let cut = depth.map_or(m.len(), |d| d.min(m.len()));
        m[..cut].join("::")
    };
    let mut graph = Graph::new();
    for (path, source) in files {
        let module = module_of(path);
        if module.is_empty() {
            continue;
        }
        let from = name(&module);
        for (to, line) in dependencies(source, &module, &modules, tests) {
            let to = name(&to);
            if to.is_empty() || to == from {
                continue;
            }
            graph
                .entry(from.clone())
                .or_default()
                .entry(to)
                .or_insert(Site {
                    file: path.display().to_string(),
                    line,
                });
        }
    }
    graph
}

/// A cycle of `graph`, as the modules along it (the first repeated at the end).
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &str,
        graph: &Graph,
        marks: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        marks.insert(node.to_owned(), Mark::Open);
        stack.push(node.to_owned());
        for next in graph.get(node).into_iter().flat_map(BTreeMap::keys) {
            match marks.get(next) {
                Some(Mark::Open) => {
                    let start = stack.iter().position(|n| n == next).unwrap_or(0);
                    let mut cycle = stack[start..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Some(Mark::Done) => {}
                None => {
                    if let Some(cycle) = visit(next, graph, marks, stack) {
                        return Some(cycle);
                    }
                }
            }
        }
        stack.pop();
        marks.insert(node.to_owned(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        if !marks.contains_key(node) {
            if let Some(cycle) = visit(node, graph, &mut marks, &mut Vec::new()) {
                return Some(cycle);
            }
        }
    }
    None
}

fn describe(cycle: &[String], graph: &Graph) -> String {
    let steps: Vec<String> = cycle
        .windows(2)
        .map(|pair| {
            let site = &graph[&pair[0]][&pair[1]];
            format!(
                "  {} -> {}   ({}:{})",
                pair[0], pair[1], site.file, site.line
            )
        })
        .collect();
    format!("import cycle:\n{}", steps.join("\n"))
}

/// The groups of modules that reach each other (strongly connected, two or more), each sorted.
fn tangles(graph: &Graph) -> Vec<Vec<String>> {
    let nodes: BTreeSet<&String> = graph
        .iter()
        .flat_map(|(from, to)| std::iter::once(from).chain(to.keys()))
        .collect();
    let reach = |start: &String| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![start.clone()];
        while let Some(node) = todo.pop() {
            for next in graph.get(&node).into_iter().flat_map(BTreeMap::keys) {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> =
        nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut groups: Vec<Vec<String>> = Vec::new();
    for node in &nodes {
        if groups.iter().any(|g| g.contains(*node)) {
            continue;
        }
        let group: Vec<String> = reached[node]
            .iter()
            .filter(|other| reached.get(other).is_some_and(|back| back.contains(*node)))
            .cloned()
            .collect();
        if group.len() > 1 {
            groups.push(group);
        }
    }
    groups
}

/// The files of the crate whose `src/` is `root`, `main.rs` aside.
fn files_under(root: &Path) -> Result<Vec<(PathBuf, String)>> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<(PathBuf, String)>) -> Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                walk(&path, root, out)?;
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(root)?.to_path_buf();
                if relative != Path::new("main.rs") {
                    out.push((relative, std::fs::read_to_string(&path)?));
                }
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    walk(root, root, &mut files)?;
    files.sort();
    Ok(files)
}

fn library_files() -> Result<Vec<(PathBuf, String)>> {
    files_under(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

/// The filter's decision crate, a sibling of this one in the workspace.
fn filter_core_files() -> Result<Vec<(PathBuf, String)>> {
    files_under(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../filter-core/src"))
}

#[test]
fn folders_have_no_import_cycle() -> Result<()> {
    let graph = graph(&library_files()?, Some(1), Tests::Included);
    // The check sees the layers it is meant to keep apart.
    for (from, to) in [("engine", "store"), ("keys", "config"), ("api", "engine")] {
        assert!(
            graph.get(from).is_some_and(|t| t.contains_key(to)),
            "{from} -> {to} not seen: {graph:#?}"
        );
    }
    if let Some(cycle) = find_cycle(&graph) {
        panic!("{}", describe(&cycle, &graph));
    }
    Ok(())
}

#[test]
fn files_have_no_import_cycle() -> Result<()> {
    let graph = graph(&library_files()?, None, Tests::Included);
    if let Some(cycle) = find_cycle(&graph) {
        panic!("{}", describe(&cycle, &graph));
    }
    Ok(())
}

#[test]
fn filter_core_files_have_no_import_cycle() -> Result<()> {
    let graph = graph(&filter_core_files()?, None, Tests::Left);
    // The check sees the crate's edges.
    for (from, to) in [("attempt", "classify::failure"), ("front", "resolve")] {
        assert!(
            graph.get(from).is_some_and(|t| t.contains_key(to)),
            "{from} -> {to} not seen: {graph:#?}"
        );
    }
    if let Some(cycle) = find_cycle(&graph) {
        panic!("{}", what_to_cut(&cycle, &graph));
    }
    Ok(())
}

#[test]
fn filter_core_folders_have_no_import_cycle() -> Result<()> {
    let graph = graph(&filter_core_files()?, Some(1), Tests::Left);
    for (from, to) in [
        ("attempt", "lanes"),
        ("front", "protocols"),
        ("lanes", "vm"),
    ] {
        assert!(
            graph.get(from).is_some_and(|t| t.contains_key(to)),
            "{from} -> {to} not seen: {graph:#?}"
        );
    }
    if let Some(cycle) = find_cycle(&graph) {
        panic!("{}", what_to_cut(&cycle, &graph));
    }
    Ok(())
}

/// A cycle, then every edge inside each group of modules that reach each other: what to cut.
fn what_to_cut(cycle: &[String], graph: &Graph) -> String {
    let groups: Vec<String> = tangles(graph)
        .iter()
        .map(|group| {
            let edges: Vec<String> = group
                .iter()
                .flat_map(|from| graph[from].iter().map(move |(to, site)| (from, to, site)))
                .filter(|(_, to, _)| group.contains(to))
                .map(|(from, to, site)| {
                    format!("    {from} -> {to}   ({}:{})", site.file, site.line)
                })
                .collect();
            format!("  {}:\n{}", group.join(", "), edges.join("\n"))
        })
        .collect();
    format!(
        "{}\nmodules that reach each other:\n{}",
        describe(cycle, graph),
        groups.join("\n")
    )
}

#[test]
fn the_check_finds_what_a_file_names() {
    let files = vec![
        (
            PathBuf::from("a/mod.rs"),
            "//! See crate::b (a comment).\npub mod x;\nuse crate::{b::{self, Thing}, c as d};\nfn f() { let s = \"crate::e\"; x::run(); }\n#[cfg(test)]\nmod tests {\n    use super::*;\n    use super::super::e::E;\n}\n".to_owned(),
        ),
        (PathBuf::from("a/x.rs"), "pub(super) fn run() { super::f(); }\n".to_owned()),
        (PathBuf::from("b.rs"), "use crate::a::x;\n".to_owned()),
        (PathBuf::from("c.rs"), String::new()),
        (PathBuf::from("e.rs"), "let r = r#\"crate::a\"#; let c = '\"';\n".to_owned()),
        (PathBuf::from("lib.rs"), "pub mod a;\n".to_owned()),
    ];
    let folders = graph(&files, Some(1), Tests::Included);
    let named = |g: &Graph, from: &str| -> Vec<String> {
        g.get(from)
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default()
    };
    assert_eq!(named(&folders, "a"), ["b", "c", "e"]);
    assert_eq!(named(&folders, "e"), Vec::<String>::new());
    let cycle = find_cycle(&folders).unwrap_or_default();
    assert_eq!(cycle, ["a", "b", "a"]);
    let text = describe(&cycle, &folders);
    assert!(text.contains("a -> b   (a/mod.rs:3)"), "{text}");
    assert!(text.contains("b -> a   (b.rs:1)"), "{text}");

    let modules = graph(&files, None, Tests::Included);
    assert_eq!(named(&modules, "a"), ["a::x", "b", "c", "e"]);
    assert_eq!(named(&modules, "a::x"), ["a"]);

    // Without what only tests build: a `#[cfg(test)]` module, function or `use`, and a file
    // declared `#[cfg(test)] mod` (with or without `#[path]`).
    let files = vec![
        (
            PathBuf::from("a.rs"),
            "use crate::b::B;\n#[cfg(test)]\nuse crate::c::C;\n#[cfg(test)]\nfn f() { crate::c::g(); }\n#[cfg(test)]\nmod tests {\n    use crate::c::C;\n}\n#[cfg(test)]\n#[path = \"a_tests.rs\"]\nmod more;\n#[cfg(test)]\nmod child;\n".to_owned(),
        ),
        (PathBuf::from("a_tests.rs"), "use crate::c::C;\n".to_owned()),
        (PathBuf::from("a/child.rs"), "use crate::c::C;\n".to_owned()),
        (PathBuf::from("b.rs"), String::new()),
        (PathBuf::from("c.rs"), "use crate::a::A;\n".to_owned()),
        (PathBuf::from("lib.rs"), "pub mod a;\n".to_owned()),
    ];
    let with = graph(&files, None, Tests::Included);
    assert_eq!(named(&with, "a"), ["b", "c"]);
    assert_eq!(named(&with, "a_tests"), ["c"]);
    let without = graph(&files, None, Tests::Left);
    assert_eq!(named(&without, "a"), ["b"]);
    assert_eq!(named(&without, "a_tests"), Vec::<String>::new());
    assert_eq!(named(&without, "a::child"), Vec::<String>::new());
    assert_eq!(find_cycle(&without), None);
    assert_eq!(tangles(&with), [["a", "c"]]);
}
