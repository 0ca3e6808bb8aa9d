//! No function in the macros' sources is longer than 80 lines (counted from its `fn` line to the
//! closing brace at the same indentation), so that each one reads on a screen.

use std::fs;
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 80;

#[test]
fn no_function_is_longer_than_80_lines() {
    let mut too_long = Vec::new();
    for file in rust_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src")) {
        let text = fs::read_to_string(&file).expect("a readable source file");
        for (name, start, lines) in functions(&text) {
            if lines > MAX_LINES {
                too_long.push(format!(
                    "{}:{start} `{name}`: {lines} lines",
                    file.display()
                ));
            }
        }
    }
    assert!(
        too_long.is_empty(),
        "functions over {MAX_LINES} lines:\n{}",
        too_long.join("\n")
    );
}

#[test]
fn the_counter_sees_a_function_to_its_closing_brace() {
    let text = "fn a() {\n    x();\n}\n\n    pub(crate) fn b(\n        y: u8,\n    ) {\n    }\n";
    assert_eq!(
        functions(text),
        vec![("a".to_owned(), 1, 3), ("b".to_owned(), 5, 4)]
    );
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).expect("a readable directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// Each function with a body: its name, the line of its `fn` (1-based) and its length in lines.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = fn_name(line) else { continue };
        let indent = &line[..line.len() - line.trim_start().len()];
        let closing = format!("{indent}}}");
        if line.trim_end().ends_with('}') || line.trim_end().ends_with(';') {
            out.push((name, i + 1, 1));
            continue;
        }
        if let Some(end) = lines[i..].iter().position(|l| *l == closing) {
            out.push((name, i + 1, end + 1));
        }
    }
    out
}

/// The name of the function a line declares (`fn`, `pub fn`, `pub(crate) const fn`, ..).
fn fn_name(line: &str) -> Option<String> {
    let mut words = line.split_whitespace();
    let mut word = words.next()?;
    while matches!(word, "pub" | "const" | "async" | "unsafe" | "extern")
        || word.starts_with("pub(")
    {
        word = words.next()?;
    }
    if word != "fn" {
        return None;
    }
    let name: String = words
        .next()?
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}
