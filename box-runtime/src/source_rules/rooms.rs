//! The rooms of `box-runtime/src` and what they import, checked against the map of
//! `ARCHITECTURE.md`.
//!
//! A room is a top-level module of `src`: a file `src/<name>.rs` or a directory `src/<name>/`
//! (`lib.rs`, the crate's face, and this module are not rooms). A room imports another when one
//! of its files names a path into it, through a `use` declaration or in code: `crate::x::...`,
//! `super::x::...` from `src/<room>.rs` or `src/<room>/mod.rs`, or an item that `lib.rs`
//! re-exports (`crate::SqliteStore`).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::path::{Path, PathBuf};

use super::map::Map;
use super::reader::{self, Kind, Reading, Reference};

/// The sources of a crate's `src` directory, read.
#[derive(Debug, Clone)]
pub struct Tree {
    files: BTreeMap<PathBuf, File>,
    /// The file of each module, by its path from the crate root (`[]` is `lib.rs`).
    modules: BTreeMap<Vec<String>, PathBuf>,
    rooms: BTreeSet<String>,
}

#[derive(Debug, Clone)]
struct File {
    module: Vec<String>,
    room: Option<String>,
    reading: Reading,
}

/// Where an import is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    /// The file, relative to `src`.
    pub file: PathBuf,
    /// The 1-based line.
    pub line: usize,
    /// The path as written.
    pub path: String,
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file.display(), self.line, self.path)
    }
}

/// An import from one room or file to another, with where it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edge<N> {
    /// The importer.
    pub from: N,
    /// The imported.
    pub to: N,
    /// Where.
    pub site: Site,
}

impl Tree {
    /// Reads the sources, given as `(path relative to src, text)`.
    pub fn new(sources: &[(PathBuf, String)]) -> Tree {
        let mut tree = Tree {
            files: BTreeMap::new(),
            modules: BTreeMap::new(),
            rooms: BTreeSet::new(),
        };
        for (path, text) in sources {
            let module = module_path(path);
            let room = room_of_file(path);
            tree.rooms.extend(room.clone());
            tree.modules.insert(module.clone(), path.clone());
            let reading = reader::read(text);
            tree.files.insert(
                path.clone(),
                File {
                    module,
                    room,
                    reading,
                },
            );
        }
        tree
    }

    /// The rooms: the top-level modules of `src`.
    pub fn rooms(&self) -> &BTreeSet<String> {
        &self.rooms
    }

    /// Every import of a room by another, in file and line order.
    pub fn room_imports(&self) -> Vec<Edge<String>> {
        let mut edges = Vec::new();
        for (path, file, reference, absolute) in self.references() {
            let Some(from) = &file.room else { continue };
            let to = match absolute.first() {
                Some(first) if self.rooms.contains(first) => Some(first.clone()),
                _ => self
                    .defining_file(&absolute, 0)
                    .and_then(|f| self.files[f].room.clone()),
            };
            if let Some(to) = to.filter(|to| to != from) {
                edges.push(Edge {
                    from: from.clone(),
                    to,
                    site: site(path, reference),
                });
            }
        }
        edges
    }

    /// Every import of a file by another file of the same room, in file and line order. A path
    /// is followed to the deepest module file on it and, for an item of that module, through the
    /// module's `use` declarations to the file that defines it (a name a glob `use x::*` brings
    /// is taken for the module's own). A `pub use` by which a module re-exports an item of its
    /// own child is not an import.
    pub fn module_imports(&self) -> Vec<Edge<PathBuf>> {
        let mut edges = Vec::new();
        for (path, file, reference, absolute) in self.references() {
            if file.room.is_none() || reexports_child(file, reference, &absolute) {
                continue;
            }
            let Some(to) = self.defining_file(&absolute, 0) else {
                continue;
            };
            if to != path && self.files[to].room == file.room {
                edges.push(Edge {
                    from: path.to_path_buf(),
                    to: to.clone(),
                    site: site(path, reference),
                });
            }
        }
        edges
    }

    /// Every reference of every file with the absolute path it names, if it names one in the
    /// crate.
    fn references(&self) -> impl Iterator<Item = (&Path, &File, &Reference, Vec<String>)> {
        self.files.iter().flat_map(|(path, file)| {
            file.reading.references.iter().filter_map(move |r| {
                absolute(file, &r.path).map(|abs| (path.as_path(), file, r, abs))
            })
        })
    }

    /// The file that defines what the absolute `path` names: the deepest module file on it, or,
    /// when the path goes on into an item of that module which the module imports, the file
    /// defining that import (`None` when it comes from outside the crate).
    fn defining_file(&self, path: &[String], hops: usize) -> Option<&PathBuf> {
        let depth = (0..=path.len())
            .rev()
            .find(|&k| self.modules.contains_key(&path[..k]))?;
        let found = &self.modules[&path[..depth]];
        if depth == path.len() || hops > 16 {
            return Some(found);
        }
        let file = &self.files[found];
        let import = file.reading.references.iter().find(
            |r| matches!(&r.kind, Kind::Use { name: Some(name), .. } if *name == path[depth]),
        );
        match import {
            None => Some(found),
            Some(import) => {
                let mut next = absolute(file, &import.path)?;
                next.extend_from_slice(&path[depth + 1..]);
                self.defining_file(&next, hops + 1)
            }
        }
    }
}

/// The module path of a file relative to `src`: `engine/mod.rs` and `engine.rs` are
/// `["engine"]`, `lib.rs` is `[]`.
fn module_path(path: &Path) -> Vec<String> {
    let mut segments: Vec<String> = path
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if let Some(last) = segments.pop() {
        let stem = last.strip_suffix(".rs").unwrap_or(&last);
        let face = stem == "mod" || (segments.is_empty() && matches!(stem, "lib" | "main"));
        if !face {
            segments.push(stem.to_owned());
        }
    }
    segments
}

/// The room of a file relative to `src`: its first component without `.rs`, unless that is
/// `lib` or `source_rules`.
fn room_of_file(path: &Path) -> Option<String> {
    let first = path.components().next()?.as_os_str().to_string_lossy();
    let room = first.strip_suffix(".rs").unwrap_or(&first);
    (!matches!(room, "lib" | "source_rules")).then(|| room.to_owned())
}

/// The path from the crate root that a reference of `file` names, if it names one in the crate.
fn absolute(file: &File, path: &[String]) -> Option<Vec<String>> {
    let first = path.first()?;
    let (mut absolute, mut rest) = match first.as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "self" | "super" => (file.module.clone(), path),
        _ if file.reading.children.contains(first) => (file.module.clone(), path),
        _ => return None,
    };
    while let Some(first) = rest.first() {
        match first.as_str() {
            "self" => {}
            "super" => {
                absolute.pop()?;
            }
            _ => break,
        }
        rest = &rest[1..];
    }
    absolute.extend_from_slice(rest);
    Some(absolute)
}

/// Whether a reference is a `pub use` by which `file` re-exports an item of a child module.
fn reexports_child(file: &File, reference: &Reference, absolute: &[String]) -> bool {
    let public = matches!(reference.kind, Kind::Use { public: true, .. });
    let depth = file.module.len();
    public
        && absolute.len() > depth
        && absolute.starts_with(&file.module)
        && file.reading.children.contains(&absolute[depth])
}

fn site(file: &Path, reference: &Reference) -> Site {
    Site {
        file: file.to_path_buf(),
        line: reference.line,
        path: reference.written(),
    }
}

/// The cycles of a graph: for each edge on a cycle, a shortest cycle through it, each cycle
/// once, as its nodes from its smallest one (not repeated at the end); the shortest first.
pub fn cycles<N: Ord + Clone>(edges: &[Edge<N>]) -> Vec<Vec<N>> {
    let mut next: BTreeMap<&N, BTreeSet<&N>> = BTreeMap::new();
    for edge in edges {
        next.entry(&edge.from).or_default().insert(&edge.to);
    }
    let mut found = BTreeSet::new();
    for edge in edges {
        if let Some(mut path) = shortest_path(&next, &edge.to, &edge.from) {
            let smallest = (0..path.len()).min_by_key(|&k| path[k]).unwrap_or(0);
            path.rotate_left(smallest);
            found.insert(path.into_iter().cloned().collect::<Vec<N>>());
        }
    }
    let mut found: Vec<Vec<N>> = found.into_iter().collect();
    found.sort_by_key(Vec::len);
    found
}

/// The nodes of a shortest path from `from` to `to` (both included).
fn shortest_path<'a, N: Ord>(
    next: &BTreeMap<&'a N, BTreeSet<&'a N>>,
    from: &'a N,
    to: &'a N,
) -> Option<Vec<&'a N>> {
    let mut came_from: BTreeMap<&N, &N> = BTreeMap::new();
    let mut queue = VecDeque::from([from]);
    while let Some(node) = queue.pop_front() {
        if node == to {
            let mut path = vec![to];
            while let Some(&before) = path.last().and_then(|n| came_from.get(n)) {
                path.push(before);
            }
            path.reverse();
            return Some(path);
        }
        for &after in next.get(node).into_iter().flatten() {
            if after != from && !came_from.contains_key(after) {
                came_from.insert(after, node);
                queue.push_back(after);
            }
        }
    }
    None
}

/// A cycle written `a → b → a`, with the first import making each of its arrows.
pub fn describe_cycle<N: Ord + Clone + fmt::Display>(cycle: &[N], edges: &[Edge<N>]) -> String {
    let mut nodes: Vec<String> = cycle.iter().map(N::to_string).collect();
    nodes.push(cycle[0].to_string());
    let mut text = format!("  {}\n", nodes.join(" → "));
    for (k, from) in cycle.iter().enumerate() {
        let to = &cycle[(k + 1) % cycle.len()];
        if let Some(edge) = edges.iter().find(|e| e.from == *from && e.to == *to) {
            text += &format!("    {from} → {to}: {}\n", edge.site);
        }
    }
    text
}

/// Check 1: every room is on exactly one row of the map, and every room of the map exists.
pub fn check_every_room_on_the_map(tree: &Tree, map: &Map) -> Result<(), String> {
    let mut problems = Vec::new();
    for room in tree.rooms() {
        let rows: Vec<String> = map
            .rows
            .iter()
            .filter(|row| row.rooms.contains(room))
            .map(|row| row.line.to_string())
            .collect();
        match rows.len() {
            0 => problems.push(format!("  room `{room}` is on no row of the table")),
            1 => {}
            _ => problems.push(format!(
                "  room `{room}` is on {} rows (ARCHITECTURE.md lines {})",
                rows.len(),
                rows.join(", ")
            )),
        }
    }
    for row in &map.rows {
        for room in row.rooms.iter().filter(|r| !tree.rooms().contains(*r)) {
            problems.push(format!(
                "  ARCHITECTURE.md:{}: `{room}` is no room of src (no `{room}.rs`, no `{room}/`)",
                row.line
            ));
        }
    }
    report(
        "the rooms of src and the table of ARCHITECTURE.md disagree",
        problems,
    )
}

/// Check 2: each room imports only rooms its row allows.
pub fn check_imports_allowed(tree: &Tree, map: &Map) -> Result<(), String> {
    let imports = tree.room_imports();
    let problems = by_line(imports.iter().filter(|e| !map.allows(&e.from, &e.to)))
        .into_iter()
        .map(|(sites, e)| format!("  {sites}  (`{}` imports `{}`)", e.from, e.to))
        .collect();
    report(
        "imports that the room's row of ARCHITECTURE.md does not allow",
        problems,
    )
}

/// Check 3: imports run from a floor down to a lower one (or across it), except the upward
/// arrows listed, at most two, each allowed by its row and each present in the code.
pub fn check_arrows_run_down(tree: &Tree, map: &Map) -> Result<(), String> {
    let imports = tree.room_imports();
    let listed = |from: &str, to: &str| map.arrows.iter().any(|a| a.from == from && a.to == to);
    let upward = |from: &str, to: &str| match (map.floor(from), map.floor(to)) {
        (Some(from), Some(to)) => to < from,
        _ => false,
    };
    let row = |room: &str| map.floor(room).map_or(0, |f| f + 1);
    let unlisted = imports
        .iter()
        .filter(|e| upward(&e.from, &e.to) && !listed(&e.from, &e.to));
    let mut problems: Vec<String> = by_line(unlisted)
        .into_iter()
        .map(|(sites, e)| {
            let (from, to) = (&e.from, &e.to);
            let (below, above) = (row(from), row(to));
            format!("  {sites}  (`{from}`, row {below}, imports `{to}`, row {above}: an upward arrow not listed)")
        })
        .collect();
    if map.arrows.len() > 2 {
        problems.push(format!(
            "  {} upward arrows are listed; at most 2 are allowed",
            map.arrows.len()
        ));
    }
    for arrow in &map.arrows {
        let (from, to, line) = (&arrow.from, &arrow.to, arrow.line);
        let mut problem = |what: &str| {
            problems.push(format!(
                "  ARCHITECTURE.md:{line}: the arrow `{from}` → `{to}` {what}"
            ))
        };
        if map.floor(from).is_none() || map.floor(to).is_none() {
            problem("names a room that is on no row of the table");
        } else if !upward(from, to) {
            problem("does not run up (its target is not on a higher row)");
        }
        if !map.allows(from, to) {
            problem(&format!("is not in the \"may import\" column of `{from}`"));
        }
        if !imports.iter().any(|e| e.from == *from && e.to == *to) {
            problem("does not exist in the code (a stale entry)");
        }
    }
    report("arrows that do not run down", problems)
}

/// Check 4: no cycle between rooms.
pub fn check_no_room_cycle(tree: &Tree) -> Result<(), String> {
    let imports = tree.room_imports();
    let problems = cycles(&imports)
        .iter()
        .map(|cycle| describe_cycle(cycle, &imports))
        .collect();
    report("cycles between rooms", problems)
}

/// Check 5: no cycle between the modules of a room.
pub fn check_no_module_cycle(tree: &Tree) -> Result<(), String> {
    let imports: Vec<Edge<Shown>> = tree
        .module_imports()
        .into_iter()
        .map(|e| Edge {
            from: Shown(e.from),
            to: Shown(e.to),
            site: e.site,
        })
        .collect();
    let problems = cycles(&imports)
        .iter()
        .map(|cycle| describe_cycle(cycle, &imports))
        .collect();
    report("cycles between the modules of a room", problems)
}

/// A path shown with [`Path::display`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Shown(PathBuf);

impl fmt::Display for Shown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.display().fmt(f)
    }
}

/// The imports of one line from one room to another as one entry: `file:line: path, path`,
/// with the first of them.
fn by_line<'e>(
    imports: impl IntoIterator<Item = &'e Edge<String>>,
) -> Vec<(String, &'e Edge<String>)> {
    let mut entries: Vec<(String, &Edge<String>)> = Vec::new();
    for import in imports {
        match entries.last_mut() {
            Some((text, first))
                if first.site.file == import.site.file
                    && first.site.line == import.site.line
                    && first.to == import.to =>
            {
                *text += &format!(", {}", import.site.path);
            }
            _ => entries.push((import.site.to_string(), import)),
        }
    }
    entries
}

fn report(title: &str, problems: Vec<String>) -> Result<(), String> {
    if problems.is_empty() {
        return Ok(());
    }
    let problems: Vec<&str> = problems.iter().map(|p| p.trim_end()).collect();
    Err(format!(
        "{title} (paths relative to src):\n{}",
        problems.join("\n")
    ))
}
