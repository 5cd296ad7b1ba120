//! The library's layering, written down once and kept: each top-level module of `src/` may
//! import only the modules below it in [`LAYERS`], and no two files import each other, directly
//! or round a cycle.
//!
//! The check reads the sources as text (no compiler involved): comments and string literals
//! are blanked, then every `use` and every path starting with `crate::`, `super::`, `self::` or
//! a child module's name is resolved to the file that defines it, following `pub use`
//! re-exports to the file the item really lives in (a parent's re-export of its child is how a
//! module shows its items, not an import of the parent). `docs/ARCHITECTURE.md` draws the
//! same order.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// The top-level modules of `src/`, lowest first. A module may import only those before it.
const LAYERS: &[&str] = &[
    "interrupt", // what a signal must not leave behind (temporary files, children)
    "output",    // the one way files are written
    "limits",    // what the machine has
    "input",     // the one way files a user named are read
    "terminal",  // error: and warning: lines
    "trace",     // the timeline
    "backend",   // the kernel seam and the CPU kernels
    "model",     // what a network is: layer vocabulary, model files, the graph
    "nn",        // how a graph runs: layers and the net
    "export",    // ONNX export of a net
    "optim",     // the solver
    "comm",      // transports and collectives
    "parallel",  // buckets and the reducer (idea 1)
    "plan",      // the planning rules: buckets and each bucket's operation
    "measure",   // the replica, profiles and their format
    "testbed",   // fault injection and the emulated device
    "data",      // dataset readers
    "pipeline",  // the input pipeline (idea 3)
    "config",    // options, defaults, validation
    "train",     // the run and the worker's step
    "report",    // run reports from a run's files
    "infer",     // eval and predict from a checkpoint
    "sim",       // planning past this machine
    "bench",     // benchmarks
    "elastic",   // dptrain launch: the supervisor that restarts a run on the survivors
    "cli",       // the commands
];

/// One source file: its module path (`["train", "worker"]`) and its text with comments and
/// literals blanked.
struct SourceFile {
    path: PathBuf,
    text: String,
}

/// The module tree of a source directory and the imports between its files.
struct Imports {
    files: BTreeMap<Vec<String>, SourceFile>,
    /// `(module, name)` re-exported by a `pub use` in that module's file -> the full path.
    reexports: HashMap<(Vec<String>, String), Vec<String>>,
    /// File -> files it imports from (by module path).
    edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
}

/// Blanks comments, string and character literals (keeping line structure), so that paths
/// inside them are not read as imports.
fn blank_comments_and_literals(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let blank = |out: &mut Vec<u8>, s: &[u8]| {
        out.extend(s.iter().map(|&c| if c == b'\n' { b'\n' } else { b' ' }))
    };
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            let end = rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest.starts_with(b"/*") {
            // Block comments nest in Rust.
            let (mut depth, mut k) = (0usize, 0usize);
            while k < rest.len() {
                if rest[k..].starts_with(b"/*") {
                    depth += 1;
                    k += 2;
                } else if rest[k..].starts_with(b"*/") {
                    depth -= 1;
                    k += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    k += 1;
                }
            }
            blank(&mut out, &rest[..k]);
            i += k;
        } else if let Some(len) = raw_string_len(b, i) {
            blank(&mut out, &b[i..i + len]);
            i += len;
        } else if rest[0] == b'"' {
            let mut k = 1;
            while k < rest.len() && rest[k] != b'"' {
                k += if rest[k] == b'\\' { 2 } else { 1 };
            }
            let end = (k + 1).min(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest[0] == b'\'' {
            // A character literal ('a', '\n', '\u{..}'), not a lifetime ('a without a close).
            let len = if rest.len() > 3 && rest[1] == b'\\' {
                rest[3..].iter().position(|&c| c == b'\'').map(|p| p + 4)
            } else if rest.len() > 2 && rest[2] == b'\'' {
                Some(3)
            } else {
                None
            };
            match len {
                Some(len) => {
                    blank(&mut out, &rest[..len]);
                    i += len;
                }
                None => {
                    out.push(b'\'');
                    i += 1;
                }
            }
        } else {
            out.push(rest[0]);
            i += 1;
        }
    }
    String::from_utf8(out).expect("blanking keeps UTF-8 (only ASCII is replaced)")
}

/// The length of a raw string literal (`r"..."`, `r#"..."#`, `br"..."`) starting at `i`.
fn raw_string_len(b: &[u8], i: usize) -> Option<usize> {
    if i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_') {
        return None;
    }
    let mut k = i;
    if b.get(k) == Some(&b'b') {
        k += 1;
    }
    if b.get(k) != Some(&b'r') {
        return None;
    }
    k += 1;
    let hashes = b[k..].iter().take_while(|&&c| c == b'#').count();
    k += hashes;
    if b.get(k) != Some(&b'"') {
        return None;
    }
    let close: Vec<u8> = std::iter::once(b'"')
        .chain(std::iter::repeat_n(b'#', hashes))
        .collect();
    let body = &b[k + 1..];
    let end = body.windows(close.len()).position(|w| w == close)?;
    Some(k + 1 + end + close.len() - i)
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Splits `a, b::{c, d}, e` at its top-level commas.
fn split_top_level(s: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(s[start..].trim());
    parts.into_iter().filter(|p| !p.is_empty()).collect()
}

/// The paths a use tree names: `crate::a::{b, c::D}` -> `[crate, a, b]`, `[crate, a, c, D]`.
fn expand_use_tree(prefix: &[String], tree: &str) -> Vec<Vec<String>> {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let base: Vec<String> = tree[..open]
            .split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let mut prefix = prefix.to_vec();
        prefix.extend(base);
        return split_top_level(inner)
            .into_iter()
            .flat_map(|item| expand_use_tree(&prefix, item))
            .collect();
    }
    let path = tree.split(" as ").next().unwrap_or("").trim();
    let mut full = prefix.to_vec();
    full.extend(
        path.split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from),
    );
    vec![full]
}

/// The index of the `}` closing the `{` at `open` (in blanked text, so every brace is code).
fn matching_brace(b: &[u8], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (k, &c) in b.iter().enumerate().skip(open) {
        match c {
            b'{' => depth += 1,
            b'}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(k);
                }
            }
            _ => {}
        }
    }
    None
}

/// The `(start, end, name)` spans of the inline modules (`mod tests { ... }`) of a file.
fn inline_modules(text: &str) -> Vec<(usize, usize, String)> {
    let b = text.as_bytes();
    let mut spans = Vec::new();
    let mut from = 0;
    while let Some(p) = text[from..].find("mod ") {
        let at = from + p;
        from = at + 4;
        if at > 0 && is_ident(b[at - 1]) {
            continue;
        }
        let name_start = at + 4;
        let name_len = b[name_start..].iter().take_while(|&&c| is_ident(c)).count();
        let after = text[name_start + name_len..].trim_start();
        if name_len == 0 || !after.starts_with('{') {
            continue;
        }
        let open = text.len() - after.len();
        let end = matching_brace(b, open).unwrap_or(text.len());
        spans.push((at, end, text[name_start..name_start + name_len].to_string()));
    }
    spans
}

impl Imports {
    /// Reads every `.rs` file under `src` (the binary's `main.rs` aside) and resolves its imports.
    fn of(src: &Path) -> Self {
        let mut files = BTreeMap::new();
        let mut stack = vec![src.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).expect("readable source directory") {
                let path = entry.expect("directory entry").path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                if path.extension().is_none_or(|e| e != "rs") {
                    continue;
                }
                let rel = path.strip_prefix(src).expect("under src");
                let mut module: Vec<String> = rel
                    .with_extension("")
                    .iter()
                    .map(|s| s.to_string_lossy().into_owned())
                    .collect();
                if module.last().is_some_and(|m| m == "mod") {
                    module.pop();
                }
                if module == ["main"] {
                    continue;
                }
                if module == ["lib"] {
                    module.clear();
                }
                let text = blank_comments_and_literals(
                    &std::fs::read_to_string(&path).expect("readable source file"),
                );
                files.insert(module, SourceFile { path, text });
            }
        }
        let mut imports = Imports {
            files,
            reexports: HashMap::new(),
            edges: BTreeMap::new(),
        };
        let referenced = imports.collect_references();
        for (module, paths) in referenced {
            let targets: BTreeSet<Vec<String>> = paths
                .iter()
                .filter_map(|p| imports.resolve(p, 0))
                .filter(|t| *t != module && !t.is_empty())
                .collect();
            imports.edges.insert(module, targets);
        }
        imports
    }

    /// `path` as written in `context` (the file's module plus any inline modules around it)
    /// made absolute; `None` for paths into other crates.
    fn absolute(&self, context: &[String], path: &[String]) -> Option<Vec<String>> {
        let first = path.first()?;
        match first.as_str() {
            // `$crate` in a macro is this crate.
            "crate" | "$crate" => Some(path[1..].to_vec()),
            "self" => Some([context, &path[1..]].concat()),
            "super" => {
                let ups = path.iter().take_while(|s| *s == "super").count();
                let base = &context[..context.len().checked_sub(ups)?];
                Some([base, &path[ups..]].concat())
            }
            child => {
                let mut candidate = context.to_vec();
                candidate.push(child.to_string());
                self.files
                    .contains_key(&candidate)
                    .then(|| [context, path].concat())
            }
        }
    }

    /// Every file's imported paths (absolute); records `pub use` re-exports on the way.
    fn collect_references(&mut self) -> Vec<(Vec<String>, Vec<Vec<String>>)> {
        let mut all = Vec::new();
        let modules: Vec<Vec<String>> = self.files.keys().cloned().collect();
        for module in modules {
            let text = self.files[&module].text.clone();
            let spans = inline_modules(&text);
            let context = |pos: usize| -> Vec<String> {
                let mut c = module.clone();
                c.extend(
                    spans
                        .iter()
                        .filter(|(a, b, _)| *a <= pos && pos <= *b)
                        .map(|(_, _, n)| n.clone()),
                );
                c
            };
            let mut paths = Vec::new();
            let mut rest_of_text = text.clone();
            // `use` declarations (and `pub use` re-exports, which are followed, not counted).
            let mut from = 0;
            while let Some(p) = text[from..].find("use ") {
                let at = from + p;
                from = at + 4;
                if at > 0 && is_ident(text.as_bytes()[at - 1]) {
                    continue;
                }
                let Some(len) = text[at..].find(';') else {
                    break;
                };
                let before = text[..at].trim_end();
                let public = before.ends_with("pub") || before.ends_with(')');
                let tree = &text[at + 4..at + len];
                for p in expand_use_tree(&[], tree) {
                    let Some(abs) = self.absolute(&context(at), &p) else {
                        continue;
                    };
                    if public {
                        let name = if tree.contains(" as ") {
                            None
                        } else {
                            p.last().cloned()
                        };
                        // Re-exporting another top-level module's item imports it (a lower
                        // module must not re-export a higher one's); a parent's re-export
                        // of its own children is how it shows them, and is followed instead.
                        if abs.first() != module.first() {
                            paths.push(abs.clone());
                        }
                        if let Some(name) = name.filter(|n| n != "self" && n != "*") {
                            self.reexports.insert((module.clone(), name), abs);
                        }
                    } else {
                        paths.push(abs);
                    }
                }
                rest_of_text.replace_range(at..at + len, &" ".repeat(len));
            }
            // Paths in code: `crate::a::b`, `super::x`, `self::x`, `child::Item`.
            let b = rest_of_text.as_bytes();
            let mut i = 0;
            while i < b.len() {
                if !is_ident(b[i]) || (i > 0 && (is_ident(b[i - 1]) || b[i - 1] == b':')) {
                    i += 1;
                    continue;
                }
                let mut end = i;
                loop {
                    while end < b.len() && is_ident(b[end]) {
                        end += 1;
                    }
                    if rest_of_text[end..].starts_with("::")
                        && b.get(end + 2).is_some_and(|&c| is_ident(c))
                    {
                        end += 2;
                    } else {
                        break;
                    }
                }
                let segments: Vec<String> =
                    rest_of_text[i..end].split("::").map(String::from).collect();
                if segments.len() > 1 {
                    if let Some(abs) = self.absolute(&context(i), &segments) {
                        paths.push(abs);
                    }
                }
                i = end.max(i + 1);
            }
            all.push((module, paths));
        }
        all
    }

    /// The file that defines what `path` names: its longest prefix that is a module with a
    /// file, through that module's re-exports.
    fn resolve(&self, path: &[String], depth: usize) -> Option<Vec<String>> {
        (0..=path.len()).rev().find_map(|k| {
            let module = &path[..k];
            if !self.files.contains_key(module) {
                return None;
            }
            if let Some(next) = path.get(k) {
                if let Some(target) = self.reexports.get(&(module.to_vec(), next.clone())) {
                    if depth < 8 {
                        let mut through = target.clone();
                        through.extend_from_slice(&path[k + 1..]);
                        return self.resolve(&through, depth + 1);
                    }
                }
            }
            Some(module.to_vec())
        })
    }

    /// Imports from a top-level module into one at or above it in `layers`, as
    /// `"from.rs imports to.rs (a above b)"`; and any top-level module missing from `layers`.
    fn upward_imports(&self, layers: &[&str]) -> Vec<String> {
        let rank = |m: &[String]| m.first().and_then(|t| layers.iter().position(|l| l == t));
        let mut problems = Vec::new();
        for module in self.files.keys().filter(|m| m.len() == 1) {
            if rank(module).is_none() {
                problems.push(format!(
                    "module `{}` is not in LAYERS: place it in the order",
                    module[0]
                ));
            }
        }
        for (from, targets) in &self.edges {
            for to in targets {
                let (Some(a), Some(b)) = (rank(from), rank(to)) else {
                    continue;
                };
                if b > a {
                    problems.push(format!(
                        "{} imports {} (`{}` is above `{}`)",
                        self.files[from].path.display(),
                        self.files[to].path.display(),
                        to[0],
                        from[0]
                    ));
                }
            }
        }
        problems
    }

    /// The groups of files that import each other round a cycle (Tarjan's strongly connected
    /// components of more than one file).
    fn cycles(&self) -> Vec<Vec<PathBuf>> {
        struct Search<'a> {
            edges: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
            index: HashMap<&'a [String], usize>,
            low: HashMap<&'a [String], usize>,
            stack: Vec<&'a [String]>,
            on_stack: BTreeSet<&'a [String]>,
            found: Vec<Vec<&'a [String]>>,
        }
        impl<'a> Search<'a> {
            fn visit(&mut self, v: &'a [String]) {
                let n = self.index.len();
                self.index.insert(v, n);
                self.low.insert(v, n);
                self.stack.push(v);
                self.on_stack.insert(v);
                for w in self.edges.get(v).into_iter().flatten() {
                    let w: &'a [String] = w.as_slice();
                    if !self.index.contains_key(w) {
                        self.visit(w);
                        let lw = self.low[w];
                        let lv = self.low.get_mut(v).expect("visited");
                        *lv = (*lv).min(lw);
                    } else if self.on_stack.contains(w) {
                        let iw = self.index[w];
                        let lv = self.low.get_mut(v).expect("visited");
                        *lv = (*lv).min(iw);
                    }
                }
                if self.low[v] == self.index[v] {
                    let mut component = Vec::new();
                    while let Some(w) = self.stack.pop() {
                        self.on_stack.remove(w);
                        component.push(w);
                        if w == v {
                            break;
                        }
                    }
                    if component.len() > 1 {
                        self.found.push(component);
                    }
                }
            }
        }
        let mut search = Search {
            edges: &self.edges,
            index: HashMap::new(),
            low: HashMap::new(),
            stack: Vec::new(),
            on_stack: BTreeSet::new(),
            found: Vec::new(),
        };
        for v in self.files.keys() {
            if !search.index.contains_key(v.as_slice()) {
                search.visit(v);
            }
        }
        search
            .found
            .into_iter()
            .map(|c| c.iter().map(|m| self.files[*m].path.clone()).collect())
            .collect()
    }
}

/// Longest a function may be, in lines from its `fn` to its closing brace.
const MAX_FUNCTION_LINES: usize = 120;

/// Functions allowed past [`MAX_FUNCTION_LINES`]: match-per-variant dispatch tables, one arm per
/// variant, which read best whole. `(file under src/, function)`.
const DISPATCH_TABLES: &[(&str, &str)] = &[];

/// Every function of `text` (blanked) longer than `max` lines: `(name, first line, lines)`.
fn long_functions(text: &str, max: usize) -> Vec<(String, usize, usize)> {
    let b = text.as_bytes();
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(p) = text[from..].find("fn ") {
        let at = from + p;
        from = at + 3;
        if at > 0 && is_ident(b[at - 1]) {
            continue;
        }
        let name_len = b[at + 3..].iter().take_while(|&&c| is_ident(c)).count();
        if name_len == 0 {
            continue;
        }
        // The body: the first `{` outside the signature's brackets (`[usize; 3]`) before any
        // `;` (a declaration without a body has none).
        let mut nesting = 0i32;
        let Some(open) = (at..b.len()).find(|&k| {
            match b[k] {
                b'(' | b'[' => nesting += 1,
                b')' | b']' => nesting -= 1,
                b'{' | b';' if nesting == 0 => return true,
                _ => {}
            }
            false
        }) else {
            break;
        };
        if b[open] == b';' {
            continue;
        }
        let close = matching_brace(b, open).unwrap_or(text.len() - 1);
        let first = text[..at].matches('\n').count() + 1;
        let lines = text[at..=close].matches('\n').count() + 1;
        if lines > max {
            found.push((text[at + 3..at + 3 + name_len].to_string(), first, lines));
        }
    }
    found
}

fn crate_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn no_module_imports_one_above_it() {
    let problems = Imports::of(&crate_src()).upward_imports(LAYERS);
    assert!(
        problems.is_empty(),
        "imports against the layering (tests/layers.rs LAYERS, lowest first):\n{}",
        problems.join("\n")
    );
}

#[test]
fn no_files_import_each_other() {
    let cycles = Imports::of(&crate_src()).cycles();
    assert!(
        cycles.is_empty(),
        "files that import each other round a cycle (move what they share into a file of its \
         own):\n{}",
        cycles
            .iter()
            .map(|c| c
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" <-> "))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn no_function_is_longer_than_a_screenful_or_two() {
    let src = crate_src();
    let imports = Imports::of(&src);
    let mut long = Vec::new();
    for file in imports.files.values() {
        let rel = file.path.strip_prefix(&src).unwrap().display().to_string();
        for (name, line, lines) in long_functions(&file.text, MAX_FUNCTION_LINES) {
            if !DISPATCH_TABLES.contains(&(rel.as_str(), name.as_str())) {
                long.push(format!("src/{rel}:{line}: fn {name} is {lines} lines"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FUNCTION_LINES} lines (split them into functions that each do one \
         job; a match-per-variant dispatch table may be listed in DISPATCH_TABLES):\n{}",
        long.join("\n")
    );
}

/// The check itself: on a small tree it finds an upward import, a cycle through a parent's
/// types, a module missing from the order, and nothing where re-exports, comments, strings
/// and test modules only look like imports.
#[test]
fn the_check_finds_upward_imports_and_cycles_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    let write = |rel: &str, text: &str| {
        let p = src.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write("lib.rs", "pub mod low;\npub mod high;\n");
    write(
        "low/mod.rs",
        "pub mod a;\npub mod b;\npub use a::Thing;\n// crate::high::Up in a comment\n\
         const S: &str = \"crate::high::Up\";\n",
    );
    write(
        "low/a.rs",
        "pub struct Thing;\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
    );
    write("low/b.rs", "use super::Thing;\npub fn f(_: Thing) {}\n");
    write("high.rs", "pub struct Up;\nuse crate::low::Thing;\n");
    let clean = Imports::of(src);
    assert!(clean.upward_imports(&["low", "high"]).is_empty());
    assert!(clean.cycles().is_empty(), "{:?}", clean.cycles());

    // An import from the lower module of the higher one.
    write(
        "low/b.rs",
        "use super::Thing;\npub fn f(_: Thing, _: crate::high::Up) {}\n",
    );
    let up = Imports::of(src).upward_imports(&["low", "high"]);
    assert_eq!(up.len(), 1, "{up:?}");
    assert!(
        up[0].contains("b.rs imports") && up[0].contains("high.rs"),
        "{up:?}"
    );
    assert!(Imports::of(src)
        .upward_imports(&["low"])
        .iter()
        .any(|p| p.contains("`high` is not in LAYERS")));

    // A lower module re-exporting a higher one's item imports it.
    write("low/b.rs", "pub use crate::high::Up;\n");
    let up = Imports::of(src).upward_imports(&["low", "high"]);
    assert!(up.iter().any(|p| p.contains("b.rs imports")), "{up:?}");

    // A parent's own item used by its child while the parent uses the child: a cycle.
    write("low/b.rs", "use super::Shared;\npub fn f() {}\n");
    write(
        "low/mod.rs",
        "pub mod a;\npub mod b;\npub struct Shared;\nfn g() { b::f() }\n",
    );
    let cycles = Imports::of(src).cycles();
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    assert_eq!(cycles[0].len(), 2);

    // Function lengths: braces in strings and comments do not count.
    let body = (0..5).map(|_| "    x();\n").collect::<String>();
    let text = blank_comments_and_literals(&format!(
        "fn short(a: [u8; 2]) {{\n{body}}}\nfn long() {{\n    let s = \"}}\"; // }}\n{body}{body}}}\nfn decl();\n"
    ));
    assert_eq!(long_functions(&text, 8), vec![("long".to_string(), 8, 13)]);
}
