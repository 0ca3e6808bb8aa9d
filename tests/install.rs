//! The README's Install section is what a new user copies: a crate written from it alone must
//! build and run.
//!
//! Each test writes a new crate in a temporary directory: its `Cargo.toml` is a snippet of the
//! README verbatim, plus a `[patch.crates-io]` that takes inoutbox from this repository (it is not
//! on a registry here); its `src/main.rs` is a program of the README. The build runs offline on
//! a copy of this workspace's `Cargo.lock`, in this workspace's target directory, so it
//! resolves the same versions and reuses what is compiled.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const README: &str = include_str!("../README.md");
const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// The text of the `## {heading}` section, up to the next `## ` heading.
fn section(heading: &str) -> &'static str {
    let start = README
        .find(&format!("\n## {heading}\n"))
        .unwrap_or_else(|| panic!("README.md has no `## {heading}` section"));
    let body = &README[start + 1..];
    let end = body[3..].find("\n## ").map_or(body.len(), |i| i + 3);
    &body[..end]
}

/// The fenced code blocks of `text` whose info string starts with `lang`, in order.
fn blocks(text: &str, lang: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let Some(info) = line.strip_prefix("```") else {
            continue;
        };
        let body: Vec<&str> = lines
            .by_ref()
            .take_while(|l| !l.starts_with("```"))
            .collect();
        if info.starts_with(lang) {
            // rustdoc's hidden lines (`# ...`) are part of the program
            let body: Vec<&str> = body
                .into_iter()
                .map(|l| match l {
                    "#" => "",
                    _ => l.strip_prefix("# ").unwrap_or(l),
                })
                .collect();
            out.push(body.join("\n") + "\n");
        }
    }
    out
}

/// The snippet of the Install section for `backend` (`"PostgreSQL"` or `"SQLite"`): the TOML
/// block that follows the paragraph naming it.
fn snippet(backend: &str) -> String {
    let install = section("Install");
    let at = install
        .find(&format!("A service on {backend}"))
        .unwrap_or_else(|| panic!("the Install section has no paragraph `A service on {backend}`"));
    blocks(&install[at..], "toml")
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no TOML block after `A service on {backend}`"))
}

/// A new crate named `name` with `dependencies` (a README snippet) and `main`.
fn new_crate(name: &str, dependencies: &str, main: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("src")).expect("crate directory");
    let manifest = format!(
        "[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2021\"\npublish = false\n\n\
         {dependencies}\n\
         [patch.crates-io]\n\
         inoutbox = {{ path = {repo:?} }}\n\
         inoutbox-runtime = {{ path = {runtime:?} }}\n\
         inoutbox-macros = {{ path = {macros:?} }}\n\n\
         [workspace]\n",
        repo = REPO,
        runtime = format!("{REPO}/box-runtime"),
        macros = format!("{REPO}/box-macros"),
    );
    std::fs::write(dir.join("Cargo.toml"), manifest).expect("Cargo.toml");
    std::fs::copy(Path::new(REPO).join("Cargo.lock"), dir.join("Cargo.lock")).expect("lockfile");
    std::fs::write(dir.join("src/main.rs"), main).expect("main.rs");
    dir
}

/// This workspace's target directory (the parent of the integration tests' temporary one).
fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target directory")
        .to_path_buf()
}

/// Runs `cargo <args>` in `dir` offline; returns its stdout, or panics with both outputs.
fn cargo(dir: &Path, args: &[&str], within: Duration) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut child = Command::new(cargo)
        .args(args)
        .arg("--offline")
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target_dir())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("cargo starts");
    let started = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if started.elapsed() > within {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "`cargo {}` in {} did not finish within {within:?}:\n{}",
                args.join(" "),
                dir.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "`cargo {}` in {} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        args.join(" "),
        dir.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn a_crate_from_the_sqlite_snippet_runs_the_zero_setup_program() {
    let programs = blocks(section("Install"), "rust");
    assert_eq!(
        programs.len(),
        1,
        "the Install section has one program (the zero-setup check)"
    );
    let dir = new_crate("inoutbox-install-sqlite", &snippet("SQLite"), &programs[0]);
    let stdout = cargo(&dir, &["run", "--quiet"], Duration::from_secs(1800));
    assert!(
        stdout.contains("hello, world\n") && stdout.contains("greetings stored: 1\n"),
        "the program's output: {stdout:?}"
    );
}

/// The tour's service runs on both stores (and its zero-setup mode on SQLite), so a
/// PostgreSQL-only crate builds the Install section's program as a PostgreSQL user writes it:
/// the same code with `PgTx` and `PgStore`.
#[test]
fn a_crate_from_the_postgres_snippet_compiles_the_program_on_postgres() {
    let programs = blocks(section("Install"), "rust");
    assert_eq!(programs.len(), 1, "the Install section has one program");
    let mut program = programs[0].clone();
    for (from, to) in [
        ("SqliteTx<'_>", "PgTx<'_>"),
        (
            "inoutbox::SqliteStore::connect(&format!(\"sqlite:{}\", file.display())).await?",
            "inoutbox::PgStore::connect(&std::env::var(\"DATABASE_URL\")?, 4).await?",
        ),
    ] {
        assert!(program.contains(from), "the program no longer has `{from}`");
        program = program.replace(from, to);
    }
    let dir = new_crate(
        "inoutbox-install-postgres",
        &snippet("PostgreSQL"),
        &program,
    );
    cargo(&dir, &["build", "--quiet"], Duration::from_secs(1800));
}

/// The guides a user reaches from the README, and the link targets in them.
const GUIDES: [(&str, &str); 10] = [
    ("README.md", include_str!("../README.md")),
    ("SECURITY.md", include_str!("../SECURITY.md")),
    ("ARCHITECTURE.md", include_str!("../ARCHITECTURE.md")),
    ("docs/behaviour.md", include_str!("../docs/behaviour.md")),
    ("docs/deployment.md", include_str!("../docs/deployment.md")),
    ("docs/modes.md", include_str!("../docs/modes.md")),
    ("docs/nats.md", include_str!("../docs/nats.md")),
    ("docs/operations.md", include_str!("../docs/operations.md")),
    ("docs/outbox.md", include_str!("../docs/outbox.md")),
    ("docs/two_phase.md", include_str!("../docs/two_phase.md")),
];

/// The anchor rustdoc (and GitHub) gives a heading: lowercase, spaces to `-`, punctuation
/// dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Whether the Markdown `text` has a heading whose anchor is `fragment`.
fn has_heading(text: &str, fragment: &str) -> bool {
    text.lines()
        .filter(|l| l.starts_with('#'))
        .filter_map(|l| l.trim_start_matches('#').strip_prefix(' '))
        .any(|h| anchor(h) == fragment)
}

/// The `[text](target)` link targets of a Markdown text, outside code blocks.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        for (i, _) in line.match_indices("](") {
            if let Some(end) = line[i + 2..].find(')') {
                out.push(line[i + 2..i + 2 + end].to_owned());
            }
        }
    }
    out
}

#[test]
fn the_readme_and_guides_link_only_to_pages_that_exist_on_docs_rs() {
    const BASE: &str = "https://docs.rs/inoutbox/latest/inoutbox/";
    let lib = include_str!("../src/lib.rs");
    let guide_of = |module: &str| -> &'static str {
        let file = GUIDES
            .iter()
            .find(|(path, _)| {
                let stem = path.rsplit('/').next().unwrap().trim_end_matches(".md");
                stem.to_lowercase() == module
            })
            .unwrap_or_else(|| panic!("no guide file for docs module `{module}`"));
        assert!(
            lib.contains(&format!("pub mod {module} {{}}")),
            "src/lib.rs has no `docs::{module}` rendering it"
        );
        file.1
    };
    let mut checked = 0;
    for (path, text) in GUIDES {
        for target in links(text) {
            if target.starts_with("http") && !target.starts_with(BASE) {
                continue;
            }
            if target.starts_with("crate::") || target.starts_with("trait@") {
                continue;
            }
            if let Some(fragment) = target.strip_prefix('#') {
                assert!(
                    has_heading(text, fragment),
                    "{path} links to `#{fragment}`, a heading it does not have"
                );
                checked += 1;
                continue;
            }
            assert!(
                target.starts_with(BASE),
                "{path} links to `{target}`: a relative link breaks on crates.io and docs.rs; \
                 link to {BASE}..."
            );
            let rest = &target[BASE.len()..];
            let (page, fragment) = rest.split_once('#').unwrap_or((rest, ""));
            let headings: &str = match page.strip_prefix("docs/") {
                Some(module) => guide_of(module.trim_end_matches("/index.html")),
                None if page == "attr.inbox_handler.html" => {
                    include_str!("../src/docs/inbox_handler.md")
                }
                None => panic!("{path} links to `{target}`, a page this test does not know"),
            };
            if !fragment.is_empty() {
                assert!(
                    has_heading(headings, fragment),
                    "{path} links to `#{fragment}` of {page}, which has no such heading"
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 15, "only {checked} links checked");
}
