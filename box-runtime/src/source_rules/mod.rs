//! Rules on the sources that a compiler does not check: every log event names a `inoutbox::`
//! target, doc comments name the facade's paths, and the rooms keep the map of
//! `ARCHITECTURE.md` (what each top-level module may import, floors, no cycles; see [`rooms`]).

mod fixtures;
mod map;
mod reader;
mod rooms;

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("source directory") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn sources(crate_dir: &str) -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    rust_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join(crate_dir),
        &mut files,
    );
    files
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(&f).expect("source");
            (f, text)
        })
        .collect()
}

/// Every log event and span names a `inoutbox::...` target, so `RUST_LOG=inoutbox=debug` (a
/// filter on the target) shows them all; the default target would be this crate's module path.
#[test]
fn every_log_event_has_a_inoutbox_target() {
    let macros = [
        "trace",
        "debug",
        "info",
        "warn",
        "error",
        "event",
        "span",
        "trace_span",
        "debug_span",
        "info_span",
        "warn_span",
        "error_span",
    ];
    let mut missing = Vec::new();
    for (file, text) in sources("src") {
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for m in macros {
                let call = format!("{m}{}", "!(");
                for (at, _) in line.match_indices(&call) {
                    let before = line[..at].chars().next_back();
                    if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                        continue;
                    }
                    let rest: String = text
                        .lines()
                        .skip(n)
                        .collect::<Vec<_>>()
                        .join(" ")
                        .split_at(at + call.len())
                        .1
                        .trim_start()
                        .to_owned();
                    if !rest.starts_with(concat!("target: \"inoutbox", "::")) {
                        missing.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                    }
                }
            }
            if line.contains(concat!("#[", "instrument")) && !line.contains("target = \"inoutbox::")
            {
                missing.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "log events without a `inoutbox::` target:\n{}",
        missing.join("\n")
    );
}

/// Doc examples compile as a user's code: they name `inoutbox::`, never this crate.
#[test]
fn doc_comments_name_inoutbox_paths_only() {
    let mut found = Vec::new();
    for dir in ["src", "../box-macros/src"] {
        for (file, text) in sources(dir) {
            for (n, line) in text.lines().enumerate() {
                let t = line.trim_start();
                let doc = t.starts_with("///") || t.starts_with("//!");
                if doc
                    && (t.contains(concat!("inoutbox_runtime", "::"))
                        || t.contains(concat!("inoutbox_macros", "::")))
                {
                    found.push(format!("{}:{}: {}", file.display(), n + 1, t));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "doc comments naming the inner crates:\n{}",
        found.join("\n")
    );
}

/// The sources of `src`, by path relative to it.
fn src_tree() -> rooms::Tree {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let sources: Vec<(PathBuf, String)> = sources("src")
        .into_iter()
        .map(|(file, text)| {
            let file = file.strip_prefix(&root).expect("a file under src");
            (file.to_path_buf(), text)
        })
        .collect();
    rooms::Tree::new(&sources)
}

/// The map of the rooms in the workspace's `ARCHITECTURE.md`.
fn architecture() -> map::Map {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ARCHITECTURE.md");
    let text = std::fs::read_to_string(path).expect("ARCHITECTURE.md");
    map::Map::parse(&text).unwrap_or_else(|e| panic!("{e}"))
}

/// Fails with the problems a check found.
fn holds(check: Result<(), String>) {
    if let Err(problems) = check {
        panic!("{problems}");
    }
}

/// Each top-level module of `src` is on exactly one row of the table of rooms, and each room
/// of the table exists.
#[test]
fn every_room_is_on_the_map() {
    holds(rooms::check_every_room_on_the_map(
        &src_tree(),
        &architecture(),
    ));
}

/// A room imports only the rooms its row names in "may import".
#[test]
fn each_room_imports_only_what_its_row_allows() {
    holds(rooms::check_imports_allowed(&src_tree(), &architecture()));
}

/// Imports run down the floors of the table, except the upward arrows it lists (at most two,
/// each present in the code).
#[test]
fn arrows_run_down_except_the_named_ones() {
    holds(rooms::check_arrows_run_down(&src_tree(), &architecture()));
}

/// No room imports, through other rooms, itself.
#[test]
fn no_cycle_between_rooms() {
    holds(rooms::check_no_room_cycle(&src_tree()));
}

/// No module of a room imports, through other modules of the room, itself.
#[test]
fn no_cycle_between_the_modules_of_a_room() {
    holds(rooms::check_no_module_cycle(&src_tree()));
}
