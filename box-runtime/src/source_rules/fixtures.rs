//! The reader, the map and the checks on synthetic sources: a sample tree that keeps every rule,
//! and for each rule a change that breaks it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use super::map::{Arrow, Map};
use super::reader::{read, Kind, Reference};
use super::rooms::{self, Tree};

/// A map in the format of `ARCHITECTURE.md`, rows from the top floor down.
const ARCHITECTURE: &str = "\
# Architecture

## Rooms of `inoutbox-runtime` (`box-runtime/src`)

| room | holds | may import |
| --- | --- | --- |
| `app.rs` | `App`: consumers and relays under one shutdown token | anything |
| `consumer.rs` | `Consumer`: an `Inbox` fed by a transport | `engine`, `kafka` |
| `kafka/` | the Kafka transport | rdkafka, `engine` |
| `engine/` | `Inbox`, `Outcome`, the per-partition loop | `handler`, `store` (traits only), `backoff`, `failpoint`, `telemetry` — never `kafka`, rdkafka or sqlx |
| `telemetry/` | metric handles and spans | `store` (traits), `engine` (`Outcome`), metrics |
| `store/` | `InboxStore`, `StoreError`, `MemoryStore` | sqlx, `names` |
| `handler.rs` | `HandlerError` | std, serde |
| `backoff.rs`, `names.rs`, `failpoint.rs` (feature `failpoints`) | small helpers | std |

Log events name their room as target.

## Upward arrows

- `telemetry` → `engine`: the spans name the engine's `Outcome`.

## Where a new thing goes

- `mysql/` beside `store/`.
";

/// Sources that keep every rule of [`ARCHITECTURE`], by path relative to `src`.
fn sample() -> BTreeMap<&'static str, String> {
    let files = [
        ("lib.rs", LIB),
        ("app.rs", APP),
        ("consumer.rs", CONSUMER),
        (
            "kafka/mod.rs",
            "mod member;\n\npub use member::Member;\n\npub struct KafkaConfig;\n",
        ),
        (
            "kafka/member.rs",
            "use super::KafkaConfig;\nuse crate::engine::Delivery;\n",
        ),
        ("engine/mod.rs", ENGINE),
        ("engine/delivery.rs", "pub struct Delivery;\n"),
        (
            "engine/lanes.rs",
            "use super::Delivery;\n\npub struct Lanes;\n",
        ),
        ("engine/partition.rs", PARTITION),
        (
            "telemetry/mod.rs",
            "pub(crate) mod inbox;\n\npub use inbox::InboxTelemetry;\n",
        ),
        (
            "telemetry/inbox.rs",
            "use crate::engine::Outcome;\nuse crate::store::StoreError;\n",
        ),
        ("store/mod.rs", STORE),
        ("handler.rs", "pub struct HandlerError;\n"),
        ("backoff.rs", "pub struct Backoff;\n"),
        ("names.rs", "pub const GROUP: &str = \"group\";\n"),
        ("failpoint.rs", "pub fn hit(_name: &str) {}\n"),
    ];
    files.into_iter().map(|(p, t)| (p, t.to_owned())).collect()
}

const LIB: &str = "\
pub mod app;
mod backoff;
mod consumer;
pub mod engine;
mod failpoint;
mod handler;
pub mod kafka;
mod names;
pub mod store;
pub mod telemetry;

pub use handler::HandlerError;
pub use store::MemoryStore;
";

const APP: &str = "\
use crate::consumer::Consumer;
use crate::kafka::KafkaConfig;

pub fn run() {
    let _store = crate::MemoryStore::new();
}
";

const CONSUMER: &str = "\
use crate::engine::{Inbox, Outcome};
use crate::kafka;

pub struct Consumer;
";

const ENGINE: &str = r#"//! The engine; `crate::kafka::Member` is named in docs only.

mod delivery;
mod lanes;
mod partition;

pub use delivery::Delivery;
pub use partition::{run, PartitionLink};

use crate::backoff::Backoff;
use crate::handler::HandlerError;
use crate::store::{self, InboxStore};

/// One message through its handler.
pub struct Inbox;

pub enum Outcome {}

impl Inbox {
    pub fn process(&self) {
        crate::failpoint::hit("engine::process");
        let _not_a_path = "crate::kafka::member";
        /* crate::kafka::Member */
    }
}

#[cfg(test)]
mod tests {
    use crate::kafka::Member;
}
"#;

const PARTITION: &str = "\
use super::lanes::Lanes;
use super::{Delivery, Inbox};

pub trait PartitionLink {}

pub fn run() {}
";

const STORE: &str = "\
use crate::names;

pub struct MemoryStore;
pub trait InboxStore {}
pub struct StoreError;
";

fn tree(files: &BTreeMap<&str, String>) -> Tree {
    let sources: Vec<(PathBuf, String)> = files
        .iter()
        .map(|(path, text)| (PathBuf::from(path), text.clone()))
        .collect();
    Tree::new(&sources)
}

fn map(text: &str) -> Map {
    Map::parse(text).unwrap_or_else(|e| panic!("{e}"))
}

/// The sample with `line` appended to the file at `path` (created if missing).
fn with(path: &'static str, line: &str) -> BTreeMap<&'static str, String> {
    let mut files = sample();
    let text = files.entry(path).or_default();
    *text += line;
    *text += "\n";
    files
}

/// The error of a check that must fail, showing it when it passes.
fn fails(check: Result<(), String>) -> String {
    check.expect_err("the check passes, but the rule is broken")
}

fn paths(references: &[Reference]) -> Vec<String> {
    references.iter().map(Reference::written).collect()
}

#[test]
fn reads_a_grouped_use_over_several_lines() {
    let text = "use crate::{\n    engine::{Inbox,\n        partition::run},\n    store::{self, Claim as C},\n};\n";
    let reading = read(text);
    assert_eq!(
        paths(&reading.references),
        [
            "crate::engine::Inbox",
            "crate::engine::partition::run",
            "crate::store",
            "crate::store::Claim"
        ]
    );
    let lines: Vec<usize> = reading.references.iter().map(|r| r.line).collect();
    assert_eq!(lines, [2, 3, 4, 4]);
    let names: Vec<Option<&str>> = (reading.references.iter())
        .map(|r| match &r.kind {
            Kind::Use { name, .. } => name.as_deref(),
            Kind::Inline => None,
        })
        .collect();
    assert_eq!(
        names,
        [Some("Inbox"), Some("run"), Some("store"), Some("C")]
    );
}

#[test]
fn reads_visibility_and_relative_roots() {
    let text = "pub use a::X;\npub(crate) use super::y::Y;\nuse self::z::*;\nuse std::sync::Arc;\nmod a;\n";
    let reading = read(text);
    assert_eq!(reading.children, ["a"]);
    let public: Vec<bool> = (reading.references.iter())
        .map(|r| matches!(r.kind, Kind::Use { public: true, .. }))
        .collect();
    assert_eq!(
        paths(&reading.references),
        ["a::X", "super::y::Y", "self::z::*", "std::sync::Arc"]
    );
    assert_eq!(public, [true, true, false, false]);
}

#[test]
fn reads_a_path_written_in_code() {
    let text = "fn f() {\n    if x { crate::failpoint::hit(\"x\"); }\n    let t = super::text::safe(&s);\n    child::run::<u8>();\n}\nmod child;\n";
    let reading = read(text);
    assert_eq!(
        paths(&reading.references),
        ["crate::failpoint::hit", "super::text::safe", "child::run"]
    );
    assert!(reading.references.iter().all(|r| r.kind == Kind::Inline));
    assert_eq!(reading.references[0].line, 2);
}

#[test]
fn comments_literals_and_test_modules_name_nothing() {
    let text = r##"// use crate::a::A;
/// crate::b::b()
//! use crate::c;
/* crate::d::D /* nested */ crate::e::E */
const S: &str = "crate::f::F \" crate::g::G";
const R: &str = r#"crate::h::H " still raw"#;
const C: char = '"';
fn f<'a>(x: &'a str) -> impl Sized + use<'a> { crate::kept::K }

#[cfg(test)]
mod tests {
    use crate::i::I;
    fn g() { crate::j::J }
}
"##;
    assert_eq!(paths(&read(text).references), ["crate::kept::K"]);
}

#[test]
fn reads_the_table_of_rooms() {
    let map = map(ARCHITECTURE);
    let rooms: Vec<Vec<String>> = map.rows.iter().map(|r| r.rooms.clone()).collect();
    assert_eq!(rooms[2], ["kafka"]);
    assert_eq!(rooms[7], ["backoff", "names", "failpoint"]);
    assert_eq!(map.floor("app"), Some(0));
    assert_eq!(map.floor("failpoint"), Some(7));
    assert!(map.rows[0].anything && !map.rows[1].anything);
    assert!(map.allows("engine", "store") && map.allows("app", "store"));
    assert!(!map.allows("engine", "kafka"), "`never` names prohibitions");
    let telemetry: BTreeSet<&str> = map.rows[4].may_import.iter().map(|s| s.as_str()).collect();
    assert_eq!(telemetry, BTreeSet::from(["store", "engine", "Outcome"]));
    let arrow = Arrow {
        line: 20,
        from: "telemetry".into(),
        to: "engine".into(),
    };
    assert_eq!(map.arrows, [arrow]);
}

#[test]
fn reads_arrows_written_with_ascii_and_refuses_other_bullets() {
    let text = ARCHITECTURE.replace("`telemetry` → `engine`", "`telemetry/` -> `engine/`");
    assert_eq!(map(&text).arrows[0].to, "engine");
    let text = ARCHITECTURE.replace("`telemetry` → `engine`", "telemetry to engine");
    assert!(Map::parse(&text)
        .unwrap_err()
        .contains("ARCHITECTURE.md:20"));
    let text = ARCHITECTURE.replace("| may import |", "| imports |");
    assert!(Map::parse(&text).unwrap_err().contains("header"));
    assert!(Map::parse("# Architecture\n").is_err());
}

#[test]
fn the_sample_keeps_every_rule() {
    let (tree, map) = (tree(&sample()), map(ARCHITECTURE));
    assert_eq!(rooms::check_every_room_on_the_map(&tree, &map), Ok(()));
    assert_eq!(rooms::check_imports_allowed(&tree, &map), Ok(()));
    assert_eq!(rooms::check_arrows_run_down(&tree, &map), Ok(()));
    assert_eq!(rooms::check_no_room_cycle(&tree), Ok(()));
    assert_eq!(rooms::check_no_module_cycle(&tree), Ok(()));
}

#[test]
fn a_room_off_the_map_or_a_mapped_room_missing_fails() {
    let mut files = with("effects.rs", "pub fn drain() {}");
    files.remove("backoff.rs");
    let error = fails(rooms::check_every_room_on_the_map(
        &tree(&files),
        &map(ARCHITECTURE),
    ));
    assert!(error.contains("room `effects` is on no row"), "{error}");
    assert!(
        error.contains("ARCHITECTURE.md:14: `backoff` is no room"),
        "{error}"
    );
    let twice = ARCHITECTURE.replace("| `handler.rs` |", "| `handler.rs`, `names.rs` |");
    let error = fails(rooms::check_every_room_on_the_map(
        &tree(&sample()),
        &map(&twice),
    ));
    assert!(
        error.contains("room `names` is on 2 rows (ARCHITECTURE.md lines 13, 14)"),
        "{error}"
    );
}

#[test]
fn an_import_its_row_does_not_allow_fails_with_its_line() {
    let files = with(
        "engine/partition.rs",
        "use crate::kafka::{\n    KafkaConfig,\n};",
    );
    let error = fails(rooms::check_imports_allowed(
        &tree(&files),
        &map(ARCHITECTURE),
    ));
    let expected = "engine/partition.rs:8: crate::kafka::KafkaConfig  (`engine` imports `kafka`)";
    assert!(error.contains(expected), "{error}");
}

#[test]
fn an_inline_path_is_an_import() {
    let files = with(
        "consumer.rs",
        "fn f() {\n    crate::failpoint::hit(\"x\");\n}",
    );
    let error = fails(rooms::check_imports_allowed(
        &tree(&files),
        &map(ARCHITECTURE),
    ));
    assert!(
        error.contains("consumer.rs:6: crate::failpoint::hit  (`consumer` imports `failpoint`)"),
        "{error}"
    );
}

#[test]
fn an_item_of_the_crate_face_or_of_super_is_an_import_of_its_room() {
    let files = with("consumer.rs", "type S = crate::MemoryStore;");
    let error = fails(rooms::check_imports_allowed(
        &tree(&files),
        &map(ARCHITECTURE),
    ));
    assert!(
        error.contains("consumer.rs:5: crate::MemoryStore  (`consumer` imports `store`)"),
        "{error}"
    );
    let files = with("handler.rs", "use super::store::StoreError;");
    let error = fails(rooms::check_imports_allowed(
        &tree(&files),
        &map(ARCHITECTURE),
    ));
    assert!(
        error.contains("handler.rs:2: super::store::StoreError  (`handler` imports `store`)"),
        "{error}"
    );
}

#[test]
fn an_upward_arrow_not_listed_fails() {
    let text = ARCHITECTURE.replace(
        "| `HandlerError` | std, serde |",
        "| `HandlerError` | `telemetry` |",
    );
    let files = with("handler.rs", "use crate::telemetry::InboxTelemetry;");
    let (tree, map) = (tree(&files), map(&text));
    assert_eq!(rooms::check_imports_allowed(&tree, &map), Ok(()));
    let error = fails(rooms::check_arrows_run_down(&tree, &map));
    let expected = "handler.rs:2: crate::telemetry::InboxTelemetry  (`handler`, row 7, imports `telemetry`, row 5: an upward arrow not listed)";
    assert!(error.contains(expected), "{error}");
}

#[test]
fn a_listed_arrow_must_be_allowed_present_upward_and_one_of_two() {
    let text = ARCHITECTURE.replace(
        "- `telemetry` → `engine`",
        "- `kafka` → `consumer`: stale\n- `consumer` → `engine`: down\n- `telemetry` → `engine`",
    );
    let error = fails(rooms::check_arrows_run_down(&tree(&sample()), &map(&text)));
    for expected in [
        "3 upward arrows are listed; at most 2 are allowed",
        "ARCHITECTURE.md:20: the arrow `kafka` → `consumer` is not in the \"may import\" column of `kafka`",
        "ARCHITECTURE.md:20: the arrow `kafka` → `consumer` does not exist in the code (a stale entry)",
        "ARCHITECTURE.md:21: the arrow `consumer` → `engine` does not run up",
    ] {
        assert!(error.contains(expected), "{expected:?} not in:\n{error}");
    }
}

#[test]
fn a_cycle_between_rooms_fails_and_names_each_arrow() {
    let files = with("engine/mod.rs", "use crate::telemetry::InboxTelemetry;");
    let tree = tree(&files);
    assert_eq!(
        rooms::check_imports_allowed(&tree, &map(ARCHITECTURE)),
        Ok(())
    );
    let error = fails(rooms::check_no_room_cycle(&tree));
    for expected in [
        "  engine → telemetry → engine",
        "    engine → telemetry: engine/mod.rs:31: crate::telemetry::InboxTelemetry",
        "    telemetry → engine: telemetry/inbox.rs:1: crate::engine::Outcome",
    ] {
        assert!(error.contains(expected), "{expected:?} not in:\n{error}");
    }
}

#[test]
fn a_cycle_between_modules_through_a_face_fails() {
    let files = with("engine/lanes.rs", "use super::run;");
    let error = fails(rooms::check_no_module_cycle(&tree(&files)));
    for expected in [
        "  engine/lanes.rs → engine/partition.rs → engine/lanes.rs",
        "    engine/lanes.rs → engine/partition.rs: engine/lanes.rs:4: super::run",
        "    engine/partition.rs → engine/lanes.rs: engine/partition.rs:1: super::lanes::Lanes",
    ] {
        assert!(error.contains(expected), "{expected:?} not in:\n{error}");
    }
}

#[test]
fn a_face_reexport_is_no_import_but_other_code_of_the_face_is() {
    let edges = tree(&sample()).module_imports();
    let from_face = edges.iter().filter(|e| e.from.ends_with("engine/mod.rs"));
    assert_eq!(from_face.count(), 0, "{edges:?}");
    let to_face: Vec<String> = (edges.iter())
        .filter(|e| e.to.ends_with("engine/mod.rs"))
        .map(|e| e.site.to_string())
        .collect();
    assert_eq!(to_face, ["engine/partition.rs:2: super::Inbox"]);
    let files = with("engine/mod.rs", "fn start() {\n    partition::run();\n}");
    let error = fails(rooms::check_no_module_cycle(&tree(&files)));
    let expected = "engine/mod.rs → engine/partition.rs: engine/mod.rs:32: partition::run";
    assert!(
        error.contains("  engine/mod.rs → engine/partition.rs → engine/mod.rs"),
        "{error}"
    );
    assert!(error.contains(expected), "{error}");
}

#[test]
fn a_path_leads_to_the_deepest_module_file_and_through_chains_of_reexports() {
    let files = BTreeMap::from([
        ("engine/mod.rs", "mod lanes;\nmod partition;\n\npub use partition::Settled;\n".to_owned()),
        ("engine/partition/mod.rs", "mod settle;\n\npub use settle::Settled;\nuse self::settle::helper;\n".to_owned()),
        ("engine/partition/settle.rs", "pub struct Settled;\npub fn helper() {}\n".to_owned()),
        ("engine/lanes.rs", "use super::partition::settle::helper;\nuse crate::engine::partition::Settled as S;\nuse super::Settled;\n".to_owned()),
    ]);
    let edges: Vec<String> = (tree(&files).module_imports().iter())
        .map(|e| format!("{} → {}", e.site, e.to.display()))
        .collect();
    assert_eq!(
        edges,
        [
            "engine/lanes.rs:1: super::partition::settle::helper → engine/partition/settle.rs",
            "engine/lanes.rs:2: crate::engine::partition::Settled → engine/partition/settle.rs",
            "engine/lanes.rs:3: super::Settled → engine/partition/settle.rs",
            "engine/partition/mod.rs:4: self::settle::helper → engine/partition/settle.rs",
        ]
    );
}
