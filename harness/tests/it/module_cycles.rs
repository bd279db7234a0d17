//! No import cycles between the modules of any crate of the workspace.
//!
//! For every member of the root `Cargo.toml`'s `[workspace] members` (so a crate added later is
//! checked without editing this file), and every crate root it has (`src/lib.rs`, `src/main.rs`,
//! `src/bin/*`, or the paths its `Cargo.toml` gives), the modules are found by following `mod`
//! declarations as the compiler does (`name.rs`, `name/mod.rs`, `#[path]`, inline `mod name {}`)
//! and their sources are parsed with `syn`. Files under a `generated/` directory are generated
//! code and are not read.
//!
//! The graph has an edge from module A to module B when A names something of B:
//! - a `use` (public or not, a glob included) or a path anywhere in A's code, in macro arguments
//!   too, that starts with `crate`, `super`, `self` or the name of one of A's child modules or
//!   imports; `super` is A's parent;
//! - the path is followed through re-exports to the module that defines what it names: `use
//!   crate::Price`, where the crate root only re-exports `price::Price`, is an edge to `price`,
//!   not to the root. The `pub use` itself is an edge from the re-exporting module to the one it
//!   re-exports from;
//! - a parent's `mod child;` declaration is not an edge: a module owns its children without
//!   depending on them. A parent that uses its child's items, and a child that uses its parent's
//!   (`super::x`), are edges like any other.
//!
//! A cycle is a strongly connected component of more than one module. The test fails listing, for
//! each, cycles that together cover every edge inside it, each edge with the file and line where
//! it is first made. Breaking any edge of a listed cycle breaks that cycle.

use proc_macro2::{Spacing, TokenStream, TokenTree};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use syn::visit::Visit;

/// A module's place in its crate: empty for the crate root.
type ModPath = Vec<String>;

/// How a module is written: `crate` for the root, `a::b` otherwise.
fn display(path: &[String]) -> String {
    if path.is_empty() { "crate".to_string() } else { path.join("::") }
}

/// Where source files come from: the file system, or a test's in-memory tree.
trait Sources {
    /// The file's text, `None` if there is no such file.
    fn read(&self, path: &Path) -> Option<String>;
}

/// The file system.
struct Disk;

impl Sources for Disk {
    fn read(&self, path: &Path) -> Option<String> {
        std::fs::read_to_string(path).ok()
    }
}

impl Sources for BTreeMap<PathBuf, String> {
    fn read(&self, path: &Path) -> Option<String> {
        self.get(path).cloned()
    }
}

/// A path named in a module's code, and where.
#[derive(Clone, Debug)]
struct Reference {
    segments: Vec<String>,
    line: usize,
}

/// One module: what it declares, imports and names.
#[derive(Debug, Default)]
struct Module {
    /// The file it is written in (the enclosing file, for an inline module).
    file: PathBuf,
    /// Child modules, and whether their source was read (false: generated code, left out).
    children: BTreeMap<String, bool>,
    /// Names of the items it defines, other than modules.
    items: BTreeSet<String>,
    /// Names its `use` declarations bring in, and the paths they stand for.
    imports: BTreeMap<String, Vec<String>>,
    /// Paths of its glob imports (`use x::*`).
    globs: Vec<Vec<String>>,
    /// Every path it names that may lead into the crate.
    references: Vec<Reference>,
}

/// A crate's modules, by path.
#[derive(Debug, Default)]
struct Crate {
    /// The directory of the crate root's file (`src`): generated code is under it.
    src: PathBuf,
    modules: BTreeMap<ModPath, Module>,
}

/// An edge of the module graph, with where it is made.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Site {
    file: PathBuf,
    line: usize,
}

/// The value of a `#[path = "..."]` attribute, if there is one.
fn path_attribute(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find(|a| a.path().is_ident("path")).and_then(|a| match &a.meta {
        syn::Meta::NameValue(syn::MetaNameValue { value: syn::Expr::Lit(l), .. }) => match &l.lit {
            syn::Lit::Str(s) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

/// The line a span starts on.
fn line_of(span: proc_macro2::Span) -> usize {
    span.start().line
}

impl Crate {
    /// The modules of the crate whose root is `root`.
    fn load(sources: &impl Sources, root: &Path) -> Result<Crate, String> {
        let text = sources.read(root).ok_or_else(|| format!("{}: cannot read", root.display()))?;
        let dir = root.parent().unwrap_or(Path::new("")).to_path_buf();
        let mut krate = Crate { src: dir.clone(), modules: BTreeMap::new() };
        krate.file(sources, root, &text, Vec::new(), dir)?;
        Ok(krate)
    }

    /// Whether `file` is generated code (under a `generated` directory of the crate's sources),
    /// which the check leaves out.
    fn generated(&self, file: &Path) -> bool {
        file.strip_prefix(&self.src).unwrap_or(file).components().any(|c| c.as_os_str() == "generated")
    }

    /// Reads `file` as module `path`, whose child module files are in `dir`.
    fn file(
        &mut self,
        sources: &impl Sources,
        file: &Path,
        text: &str,
        path: ModPath,
        dir: PathBuf,
    ) -> Result<(), String> {
        let parsed = syn::parse_file(text).map_err(|e| format!("{}: {e}", file.display()))?;
        self.items(sources, file, &parsed.items, path, dir)
    }

    /// Reads the items of module `path` (written in `file`), whose child module files are in
    /// `dir`, and its child modules.
    fn items(
        &mut self,
        sources: &impl Sources,
        file: &Path,
        items: &[syn::Item],
        path: ModPath,
        dir: PathBuf,
    ) -> Result<(), String> {
        let mut module = Module { file: file.to_path_buf(), ..Module::default() };
        let mut collector = Collector::default();
        let mut children = Vec::new();
        for item in items {
            let name = match item {
                syn::Item::Mod(m) => {
                    children.push(m);
                    continue;
                }
                syn::Item::Use(u) => {
                    if u.leading_colon.is_none() {
                        imports(&u.tree, Vec::new(), &mut module);
                    }
                    continue;
                }
                syn::Item::Fn(f) => Some(&f.sig.ident),
                syn::Item::Struct(s) => Some(&s.ident),
                syn::Item::Enum(e) => Some(&e.ident),
                syn::Item::Union(u) => Some(&u.ident),
                syn::Item::Trait(t) => Some(&t.ident),
                syn::Item::TraitAlias(t) => Some(&t.ident),
                syn::Item::Type(t) => Some(&t.ident),
                syn::Item::Const(c) => Some(&c.ident),
                syn::Item::Static(s) => Some(&s.ident),
                syn::Item::Macro(m) => m.ident.as_ref(),
                _ => None,
            };
            if let Some(name) = name {
                module.items.insert(name.to_string());
            }
            collector.visit_item(item);
        }
        module.references.extend(collector.references);
        for child in children {
            let name = child.ident.to_string();
            let mut child_path = path.clone();
            child_path.push(name.clone());
            let explicit = path_attribute(&child.attrs);
            match &child.content {
                Some((_, items)) => {
                    let child_dir = dir.join(explicit.unwrap_or_else(|| name.clone()));
                    module.children.insert(name, true);
                    self.items(sources, file, items, child_path, child_dir)?;
                }
                None => {
                    let (child_file, child_dir) = match explicit {
                        Some(p) => {
                            let f = file.parent().unwrap_or(Path::new("")).join(p);
                            let d = f.parent().unwrap_or(Path::new("")).to_path_buf();
                            (f, d)
                        }
                        None => {
                            let flat = dir.join(format!("{name}.rs"));
                            if sources.read(&flat).is_some() {
                                (flat, dir.join(&name))
                            } else {
                                (dir.join(&name).join("mod.rs"), dir.join(&name))
                            }
                        }
                    };
                    if self.generated(&child_file) {
                        module.children.insert(name, false);
                        continue;
                    }
                    let text = sources.read(&child_file).ok_or_else(|| {
                        format!("{}: `mod {name}` has no file {}", file.display(), child_file.display())
                    })?;
                    module.children.insert(name, true);
                    self.file(sources, &child_file, &text, child_path, child_dir)?;
                }
            }
        }
        self.modules.insert(path, module);
        Ok(())
    }

    /// The parent of `path` (the root is its own parent, as the compiler would refuse anyway).
    fn parent(path: &[String]) -> ModPath {
        path[..path.len().saturating_sub(1)].to_vec()
    }

    /// Whether module `module` has something called `name`: a child, an item, an import, or
    /// something one of its globs brings in.
    fn provides(&self, module: &[String], name: &str, depth: usize) -> bool {
        let Some(m) = self.modules.get(module) else { return false };
        if m.children.contains_key(name) || m.items.contains(name) || m.imports.contains_key(name) {
            return true;
        }
        depth < 8
            && m.globs.iter().any(|glob| match self.resolve(module, glob, depth + 1) {
                Some((target, true)) => self.provides(&target, name, depth + 1),
                _ => false,
            })
    }

    /// Where `segments`, named in module `from`, lead: the module they name (`true`), or the
    /// module defining the item they name (`false`); `None` for a path that leaves the crate
    /// through an import of another crate.
    fn resolve(&self, from: &[String], segments: &[String], depth: usize) -> Option<(ModPath, bool)> {
        let (first, rest) = segments.split_first()?;
        match first.as_str() {
            "crate" => self.walk(Vec::new(), rest, depth),
            "super" => self.walk(Crate::parent(from), rest, depth),
            "self" => self.walk(from.to_vec(), rest, depth),
            // A name relative to `from` (2018 paths): its child, or something it imports. A
            // name it does not know (another crate's, `std`) leaves the path at `from`, which
            // makes no edge.
            _ => self.walk(from.to_vec(), segments, depth),
        }
    }

    /// Where `segments` lead from module `current`, one segment at a time.
    fn walk(&self, mut current: ModPath, segments: &[String], depth: usize) -> Option<(ModPath, bool)> {
        if depth > 16 {
            return None;
        }
        for (i, segment) in segments.iter().enumerate() {
            let Some(module) = self.modules.get(&current) else {
                // A module left out (generated code): the path leads there.
                return Some((current, true));
            };
            match segment.as_str() {
                "super" => current = Crate::parent(&current),
                "self" => {}
                name if module.children.contains_key(name) => current.push(name.to_string()),
                name if module.items.contains(name) => return Some((current, false)),
                name if module.imports.contains_key(name) => {
                    let (landed, is_module) = self.resolve(&current, &module.imports[name], depth + 1)?;
                    if !is_module {
                        return Some((landed, false));
                    }
                    current = landed;
                }
                name => {
                    let glob = module.globs.iter().find_map(|glob| match self.resolve(&current, glob, depth + 1) {
                        Some((target, true)) if self.provides(&target, name, depth + 1) => Some(target),
                        _ => None,
                    });
                    match glob {
                        Some(target) => return self.walk(target, &segments[i..], depth + 1),
                        // Defined where no declaration shows it (a macro's item, an enum's
                        // variant, another crate's name): this module.
                        None => return Some((current, false)),
                    }
                }
            }
        }
        Some((current, true))
    }

    /// The module graph: from each module, to each module it names, with where each edge is first
    /// made and how many times in all.
    fn edges(&self) -> BTreeMap<(ModPath, ModPath), (Site, usize)> {
        let mut edges: BTreeMap<(ModPath, ModPath), (Site, usize)> = BTreeMap::new();
        for (from, module) in &self.modules {
            for reference in &module.references {
                let Some((to, _)) = self.resolve(from, &reference.segments, 0) else { continue };
                if &to == from || !self.modules.contains_key(&to) {
                    continue;
                }
                let site = Site { file: module.file.clone(), line: reference.line };
                edges
                    .entry((from.clone(), to))
                    .and_modify(|(first, count)| {
                        *first = first.clone().min(site.clone());
                        *count += 1;
                    })
                    .or_insert((site, 1));
            }
        }
        edges
    }
}

/// Adds the names a `use` tree brings in, and the paths it names, to `module`.
fn imports(tree: &syn::UseTree, prefix: Vec<String>, module: &mut Module) {
    let mut at = |segments: Vec<String>, span: proc_macro2::Span| {
        module.references.push(Reference { segments, line: line_of(span) });
    };
    match tree {
        syn::UseTree::Path(p) => {
            let mut prefix = prefix;
            prefix.push(p.ident.to_string());
            imports(&p.tree, prefix, module);
        }
        syn::UseTree::Name(n) => {
            let name = n.ident.to_string();
            let mut path = prefix.clone();
            // `use a::b::{self}` names `b`.
            if name != "self" {
                path.push(name.clone());
            }
            let binding = if name == "self" { prefix.last().cloned().unwrap_or_default() } else { name };
            at(path.clone(), n.ident.span());
            module.imports.insert(binding, path);
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix.clone();
            if r.ident != "self" {
                path.push(r.ident.to_string());
            }
            at(path.clone(), r.ident.span());
            module.imports.insert(r.rename.to_string(), path);
        }
        syn::UseTree::Glob(g) => {
            at(prefix.clone(), g.star_token.span);
            module.globs.push(prefix);
        }
        syn::UseTree::Group(g) => {
            for tree in &g.items {
                imports(tree, prefix.clone(), module);
            }
        }
    }
}

/// Collects the paths a module's code names, without going into its child modules (they are
/// modules of their own) or its `use` declarations (read by [`imports`]).
#[derive(Default)]
struct Collector {
    references: Vec<Reference>,
}

impl<'ast> Visit<'ast> for Collector {
    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {}

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        // A `use` inside a function: its paths are references too (its names are local).
        if u.leading_colon.is_none() {
            let mut scratch = Module::default();
            imports(&u.tree, Vec::new(), &mut scratch);
            self.references.extend(scratch.references);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() && path.segments.len() > 1 {
            let segments = path.segments.iter().map(|s| s.ident.to_string()).collect();
            self.references.push(Reference { segments, line: line_of(path.segments[0].ident.span()) });
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        macro_paths(mac.tokens.clone(), &mut self.references);
    }
}

/// Whether `t` is a `:`, joined to the next token (`Spacing::Joint`) or not.
fn is_colon(t: Option<&TokenTree>, spacing: Spacing) -> bool {
    matches!(t, Some(TokenTree::Punct(p)) if p.as_char() == ':' && p.spacing() == spacing)
}

/// The paths of two or more segments in a macro's tokens (which syn leaves unparsed), found as
/// runs of `ident :: ident ...` not preceded by `::`.
fn macro_paths(tokens: TokenStream, out: &mut Vec<Reference>) {
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    let mut i = 0;
    while i < tokens.len() {
        if let TokenTree::Group(g) = &tokens[i] {
            macro_paths(g.stream(), out);
            i += 1;
            continue;
        }
        let preceded =
            i >= 2 && is_colon(tokens.get(i - 1), Spacing::Alone) && is_colon(tokens.get(i - 2), Spacing::Joint);
        if let (TokenTree::Ident(first), false) = (&tokens[i], preceded) {
            let mut segments = vec![first.to_string()];
            let mut j = i + 1;
            while is_colon(tokens.get(j), Spacing::Joint) && is_colon(tokens.get(j + 1), Spacing::Alone) {
                match tokens.get(j + 2) {
                    Some(TokenTree::Ident(next)) => {
                        segments.push(next.to_string());
                        j += 3;
                    }
                    _ => break,
                }
            }
            if segments.len() > 1 {
                out.push(Reference { segments, line: line_of(first.span()) });
            }
            i = j.max(i + 1);
            continue;
        }
        i += 1;
    }
}

/// The strongly connected components of more than one module (Tarjan's algorithm), each sorted.
fn tangles(nodes: &BTreeSet<ModPath>, edges: &BTreeMap<(ModPath, ModPath), (Site, usize)>) -> Vec<Vec<ModPath>> {
    let index_of: BTreeMap<&ModPath, usize> = nodes.iter().enumerate().map(|(i, n)| (n, i)).collect();
    let names: Vec<&ModPath> = nodes.iter().collect();
    let mut next: Vec<Vec<usize>> = vec![Vec::new(); names.len()];
    for (from, to) in edges.keys() {
        if let (Some(&a), Some(&b)) = (index_of.get(from), index_of.get(to)) {
            next[a].push(b);
        }
    }
    struct State {
        counter: usize,
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        stack: Vec<usize>,
        on_stack: Vec<bool>,
        components: Vec<Vec<usize>>,
    }
    fn connect(v: usize, next: &[Vec<usize>], s: &mut State) {
        s.index[v] = Some(s.counter);
        s.low[v] = s.counter;
        s.counter += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for &w in &next[v] {
            match s.index[w] {
                None => {
                    connect(w, next, s);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                component.push(w);
                if w == v {
                    break;
                }
            }
            s.components.push(component);
        }
    }
    let n = names.len();
    let mut state = State {
        counter: 0,
        index: vec![None; n],
        low: vec![0; n],
        stack: Vec::new(),
        on_stack: vec![false; n],
        components: Vec::new(),
    };
    for v in 0..n {
        if state.index[v].is_none() {
            connect(v, &next, &mut state);
        }
    }
    let mut out: Vec<Vec<ModPath>> = state
        .components
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| {
            let mut c: Vec<ModPath> = c.into_iter().map(|i| names[i].clone()).collect();
            c.sort();
            c
        })
        .collect();
    out.sort();
    out
}

/// Cycles within `component` that together hold every edge between its modules: for each edge
/// not yet in a listed cycle, the edge and the shortest way back. Each cycle starts and ends at
/// the same module.
fn cycles(component: &[ModPath], edges: &BTreeMap<(ModPath, ModPath), (Site, usize)>) -> Vec<Vec<ModPath>> {
    let inside: BTreeSet<&ModPath> = component.iter().collect();
    let internal: Vec<(&ModPath, &ModPath)> =
        edges.keys().filter(|(a, b)| inside.contains(a) && inside.contains(b)).map(|(a, b)| (a, b)).collect();
    let mut covered: BTreeSet<(&ModPath, &ModPath)> = BTreeSet::new();
    let mut out = Vec::new();
    for &(from, to) in &internal {
        if covered.contains(&(from, to)) {
            continue;
        }
        // Shortest path from `to` back to `from`, within the component (breadth first).
        let mut came_from: BTreeMap<&ModPath, &ModPath> = BTreeMap::new();
        let mut queue = VecDeque::from([to]);
        while let Some(v) = queue.pop_front() {
            if v == from {
                break;
            }
            for &(a, b) in &internal {
                if a == v && b != to && !came_from.contains_key(b) {
                    came_from.insert(b, a);
                    queue.push_back(b);
                }
            }
        }
        let mut back = vec![from];
        let mut v = from;
        while v != to {
            let Some(&previous) = came_from.get(v) else { break };
            back.push(previous);
            v = previous;
        }
        back.reverse();
        let mut cycle = vec![from.clone()];
        cycle.extend(back.into_iter().cloned());
        for pair in cycle.windows(2) {
            if let Some(((a, b), _)) = edges.get_key_value(&(pair[0].clone(), pair[1].clone())) {
                covered.insert((a, b));
            }
        }
        out.push(cycle);
    }
    out
}

/// The cycles of the crate whose root is `root`, as lines of text (empty: none). `name` heads
/// them; file names are shown relative to `base`.
fn report(sources: &impl Sources, root: &Path, name: &str, base: &Path) -> Result<String, String> {
    let krate = Crate::load(sources, root)?;
    let edges = krate.edges();
    let nodes: BTreeSet<ModPath> = krate.modules.keys().cloned().collect();
    let mut text = String::new();
    for component in tangles(&nodes, &edges) {
        let members: Vec<String> = component.iter().map(|m| display(m)).collect();
        let _ = writeln!(text, "{name}: modules {} depend on each other", members.join(", "));
        for cycle in cycles(&component, &edges) {
            let path: Vec<String> = cycle.iter().map(|m| display(m)).collect();
            let _ = writeln!(text, "  cycle {}", path.join(" → "));
            for pair in cycle.windows(2) {
                let (site, count) = &edges[&(pair[0].clone(), pair[1].clone())];
                let file = site.file.strip_prefix(base).unwrap_or(&site.file).display();
                let more = if *count > 1 { format!(" (and {} more)", count - 1) } else { String::new() };
                let _ =
                    writeln!(text, "    {} → {}  at {file}:{}{more}", display(&pair[0]), display(&pair[1]), site.line);
            }
        }
    }
    Ok(text)
}

/// The workspace's member crates: (package name, directory), from the root manifest's
/// `[workspace] members` (a trailing `/*` stands for every directory there with a manifest).
fn members(root: &Path) -> Vec<(String, PathBuf)> {
    let manifest = |dir: &Path| -> toml::Table {
        let path = dir.join("Cargo.toml");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        text.parse().unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let workspace = manifest(root);
    let listed = workspace["workspace"]["members"].as_array().expect("[workspace] members is a list");
    let mut dirs = Vec::new();
    for member in listed {
        let member = member.as_str().expect("a member is a path");
        match member.strip_suffix("/*") {
            Some(parent) => {
                let mut found: Vec<PathBuf> = std::fs::read_dir(root.join(parent))
                    .unwrap_or_else(|e| panic!("{parent}: {e}"))
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.join("Cargo.toml").is_file())
                    .collect();
                found.sort();
                dirs.extend(found);
            }
            None => dirs.push(root.join(member)),
        }
    }
    dirs.into_iter()
        .map(|dir| {
            let name = manifest(&dir)["package"]["name"].as_str().expect("a package name").to_string();
            (name, dir)
        })
        .collect()
}

/// The crate roots of the package in `dir`: the library's and each binary's.
fn roots(dir: &Path) -> Vec<PathBuf> {
    let manifest: toml::Table = std::fs::read_to_string(dir.join("Cargo.toml"))
        .expect("the member's manifest")
        .parse()
        .expect("the member's manifest is TOML");
    let mut roots = BTreeSet::new();
    let lib = manifest.get("lib").and_then(|l| l.get("path")).and_then(|p| p.as_str());
    roots.insert(dir.join(lib.unwrap_or("src/lib.rs")));
    roots.insert(dir.join("src/main.rs"));
    for bin in manifest.get("bin").and_then(|b| b.as_array()).into_iter().flatten() {
        if let Some(path) = bin.get("path").and_then(|p| p.as_str()) {
            roots.insert(dir.join(path));
        }
    }
    if let Ok(entries) = std::fs::read_dir(dir.join("src/bin")) {
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            roots.insert(if path.is_dir() { path.join("main.rs") } else { path });
        }
    }
    roots.into_iter().filter(|r| r.is_file() && r.extension().is_some_and(|e| e == "rs")).collect()
}

#[test]
fn no_crate_of_the_workspace_has_a_module_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf();
    let members = members(&root);
    assert!(members.iter().any(|(name, _)| name == "mdrelay-proto"), "the members were found: {members:?}");
    let mut found = String::new();
    let mut crates = 0;
    for (name, dir) in &members {
        for crate_root in roots(dir) {
            crates += 1;
            let label = format!("{name} ({})", crate_root.strip_prefix(dir).unwrap_or(&crate_root).display());
            found += &report(&Disk, &crate_root, &label, &root).unwrap_or_else(|e| panic!("{label}: {e}"));
        }
    }
    assert!(crates >= members.len(), "every member has a crate root");
    assert!(
        found.is_empty(),
        "import cycles between modules (break one edge of each cycle: move what both sides need to \
         the module it belongs to, or to one of its own):\n{found}"
    );
}

/// An in-memory crate: (file, text) pairs under `src/`.
fn tree(files: &[(&str, &str)]) -> BTreeMap<PathBuf, String> {
    files.iter().map(|(path, text)| (Path::new("src").join(path), text.to_string())).collect()
}

/// The report on an in-memory crate rooted at `src/lib.rs`.
fn report_on(files: &[(&str, &str)]) -> String {
    report(&tree(files), Path::new("src/lib.rs"), "t", Path::new("")).expect("the tree parses")
}

#[test]
fn a_cycle_is_reported_as_a_path_with_the_line_of_each_edge() {
    let text = report_on(&[
        ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
        ("a.rs", "use crate::b::B;\npub struct A;\n"),
        ("b.rs", "pub struct B;\n\nfn f() -> crate::c::C { todo!() }\n"),
        ("c.rs", "pub struct C;\nfn g() {\n    let _ = super::a::A;\n}\n"),
    ]);
    assert_eq!(
        text,
        "t: modules a, b, c depend on each other\n  cycle a → b → c → a\n    a → b  at src/a.rs:1\n    \
         b → c  at src/b.rs:3\n    c → a  at src/c.rs:3\n"
    );
}

#[test]
fn a_tree_without_a_cycle_passes_and_declaring_a_child_is_no_edge() {
    let text = report_on(&[
        ("lib.rs", "pub mod relay;\npub mod codec;\npub use relay::Wire;\n"),
        ("relay/mod.rs", "pub mod wire;\npub use wire::*;\n"),
        ("relay/wire.rs", "use crate::codec::Format;\npub struct Wire;\n#[cfg(test)]\nmod tests { use super::*; }\n"),
        ("codec.rs", "pub struct Format;\n"),
    ]);
    assert_eq!(text, "", "re-exports, globs, a test module's `super::*` and `mod` declarations make no cycle");
}

#[test]
fn a_path_through_re_exports_is_an_edge_to_the_module_defining_the_item() {
    // The root re-exports relay::wire's `Wire` (through relay's glob). codec names it through
    // the root: the edge goes to relay::wire, which uses codec: a cycle of those two, not one
    // through the root.
    let text = report_on(&[
        ("lib.rs", "pub mod relay;\npub mod codec;\npub use relay::Wire;\n"),
        ("relay/mod.rs", "pub mod wire;\npub use wire::*;\n"),
        ("relay/wire.rs", "use crate::codec::Format;\npub struct Wire;\n"),
        ("codec.rs", "pub struct Format;\npub fn f(_: crate::Wire) {}\n"),
    ]);
    assert_eq!(
        text,
        "t: modules codec, relay::wire depend on each other\n  cycle codec → relay::wire → codec\n    \
         codec → relay::wire  at src/codec.rs:2\n    relay::wire → codec  at src/relay/wire.rs:1\n"
    );
}

#[test]
fn super_paths_in_macros_and_generated_code_are_handled() {
    // The child names its parent's item inside a macro; the parent uses the child: a cycle.
    let text = report_on(&[
        ("lib.rs", "mod engine;\n"),
        ("engine/mod.rs", "mod metrics;\npub struct Ring;\nfn f() { metrics::publish(); }\n"),
        ("engine/metrics.rs", "pub fn publish() { println!(\"{:?}\", super::Ring); }\n"),
    ]);
    assert!(text.contains("cycle engine → engine::metrics → engine"), "{text}");
    assert!(text.contains("engine::metrics → engine  at src/engine/metrics.rs:1"), "{text}");
    // Generated code is not read, and a module's uses of it are no edge.
    let text = report_on(&[
        ("lib.rs", "mod codec;\n"),
        ("codec.rs", "#[path = \"generated/sbe.rs\"]\nmod sbe;\nuse sbe::Decoder;\n"),
        ("generated/sbe.rs", "this is not Rust, and is never read"),
    ]);
    assert_eq!(text, "");
}
