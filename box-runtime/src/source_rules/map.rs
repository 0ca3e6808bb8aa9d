//! The map of the rooms, read from `ARCHITECTURE.md`: the table of the section [`ROOMS`] and the
//! bullets of the section [`ARROWS`].
//!
//! The table is `| room | holds | may import |`, one row per floor from the top floor down to the
//! ground floor. Column 1 names the rooms of the row, each in backticks (`` `engine/` ``,
//! `` `backoff.rs` ``; a trailing `/` or `.rs` is dropped; text in parentheses is a note).
//! Column 3 names, in backticks, what the rooms of the row may import; backticked names that are
//! not rooms (crates) and prose are ignored, except the word `anything` or the words
//! `every room` (the row may import every room) and the word `never`, after which the names of
//! the clause (to the next `)` or `;`, or the cell's end) are prohibitions, not permissions.
//! An upward arrow is a bullet ``- `from` → `to`: reason`` (or `->`).

use std::collections::BTreeSet;

/// The heading of the section holding the table of rooms.
pub const ROOMS: &str = "## Rooms of `inoutbox-runtime` (`box-runtime/src`)";

/// The heading of the section listing the allowed upward arrows.
pub const ARROWS: &str = "## Upward arrows";

/// The rooms and their rules, as `ARCHITECTURE.md` states them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Map {
    /// The rows of the table, the top floor first.
    pub rows: Vec<Row>,
    /// The upward arrows listed, in order.
    pub arrows: Vec<Arrow>,
}

/// One row of the table: one floor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The 1-based line of the row in `ARCHITECTURE.md`.
    pub line: usize,
    /// The rooms of column 1.
    pub rooms: Vec<String>,
    /// The backticked names of column 3 (rooms, and names of crates that are not rooms).
    pub may_import: BTreeSet<String>,
    /// Column 3 says `anything` or `every room`.
    pub anything: bool,
}

/// An upward arrow listed as allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrow {
    /// The 1-based line of the bullet in `ARCHITECTURE.md`.
    pub line: usize,
    /// The room that imports.
    pub from: String,
    /// The room, on a higher floor, that it imports.
    pub to: String,
}

impl Map {
    /// Reads the table of rooms and the upward arrows; a missing or malformed table, or a bullet
    /// of the arrows' section that is not an arrow, is an error naming its line.
    pub fn parse(architecture: &str) -> Result<Map, String> {
        let rooms = section(architecture, ROOMS)
            .ok_or_else(|| format!("ARCHITECTURE.md has no section `{ROOMS}`"))?;
        let rows = table(&rooms)?;
        let arrows = match section(architecture, ARROWS) {
            Some(lines) => arrows(&lines)?,
            None => Vec::new(),
        };
        Ok(Map { rows, arrows })
    }

    /// The index of the row holding `room` (0 for the top floor).
    pub fn floor(&self, room: &str) -> Option<usize> {
        self.rows
            .iter()
            .position(|row| row.rooms.iter().any(|r| r == room))
    }

    /// Whether the row of `from` lets it import `to`.
    pub fn allows(&self, from: &str, to: &str) -> bool {
        self.floor(from).is_some_and(|floor| {
            let row = &self.rows[floor];
            row.anything || row.may_import.contains(to)
        })
    }
}

/// The lines, numbered from 1, after the heading `heading` up to the next heading of level 1 or 2.
fn section<'a>(text: &'a str, heading: &str) -> Option<Vec<(usize, &'a str)>> {
    let mut lines = text.lines().enumerate().map(|(n, l)| (n + 1, l));
    lines.find(|(_, l)| l.trim() == heading)?;
    Some(
        lines
            .take_while(|(_, l)| !(l.starts_with("# ") || l.starts_with("## ")))
            .collect(),
    )
}

/// The rows of the first table of a section, checked to be `| room | holds | may import |`.
fn table(section: &[(usize, &str)]) -> Result<Vec<Row>, String> {
    let start = section
        .iter()
        .position(|(_, l)| l.trim_start().starts_with('|'))
        .ok_or("the section of the rooms has no table")?;
    let mut lines = section[start..]
        .iter()
        .take_while(|(_, l)| l.trim_start().starts_with('|'));
    let (n, header) = lines.next().expect("a first table line");
    let header: Vec<String> = cells(header).iter().map(|c| c.to_lowercase()).collect();
    if header != ["room", "holds", "may import"] {
        return Err(format!(
            "ARCHITECTURE.md:{n}: the table's header is {header:?}, not `| room | holds | may import |`"
        ));
    }
    let rule = lines.next().map(|(_, l)| cells(l));
    if !rule.is_some_and(|r| {
        r.iter()
            .all(|c| !c.is_empty() && c.chars().all(|c| "-:".contains(c)))
    }) {
        return Err(format!(
            "ARCHITECTURE.md:{}: no `| --- |` line after the table's header",
            n + 1
        ));
    }
    lines.map(|&(n, line)| row(n, line)).collect()
}

fn row(n: usize, line: &str) -> Result<Row, String> {
    let cells = cells(line);
    if cells.len() < 3 {
        return Err(format!("ARCHITECTURE.md:{n}: a row of fewer than 3 cells"));
    }
    let rooms: Vec<String> = backticked(&outside_parentheses(&cells[0]))
        .map(room_name)
        .collect();
    if rooms.is_empty() {
        return Err(format!(
            "ARCHITECTURE.md:{n}: a row naming no room in backticks"
        ));
    }
    let (may_import, anything) = may_import(&cells[2]);
    Ok(Row {
        line: n,
        rooms,
        may_import,
        anything,
    })
}

/// The cells of a table line, trimmed: split at each `|` outside backticks and not escaped.
fn cells(line: &str) -> Vec<String> {
    let line = line.trim();
    let line = line.strip_prefix('|').unwrap_or(line);
    let line = line.strip_suffix('|').unwrap_or(line);
    let mut cells = vec![String::new()];
    let (mut code, mut escaped) = (false, false);
    for c in line.chars() {
        match c {
            '|' if !code && !escaped => cells.push(String::new()),
            _ => cells.last_mut().expect("a cell").push(c),
        }
        code ^= c == '`';
        escaped = c == '\\';
    }
    cells.iter().map(|c| c.trim().to_owned()).collect()
}

/// The text of a cell without its parentheses (outside backticks) and what they hold.
fn outside_parentheses(cell: &str) -> String {
    let (mut code, mut depth) = (false, 0usize);
    let mut out = String::new();
    for c in cell.chars() {
        match c {
            '(' if !code => depth += 1,
            ')' if !code => depth = depth.saturating_sub(1),
            _ if depth == 0 => out.push(c),
            _ => {}
        }
        code ^= c == '`';
    }
    out
}

/// The backticked names of a text.
fn backticked(text: &str) -> impl Iterator<Item = &str> {
    text.split('`').skip(1).step_by(2)
}

/// A room's name as the table writes it without its trailing `/` or `.rs`.
fn room_name(name: &str) -> String {
    let name = name.trim();
    let name = name.strip_suffix('/').unwrap_or(name);
    name.strip_suffix(".rs").unwrap_or(name).to_owned()
}

/// The backticked names of a "may import" cell, without those after `never`, and whether it
/// says `anything` or `every room`.
fn may_import(cell: &str) -> (BTreeSet<String>, bool) {
    let (mut names, mut anything, mut never) = (BTreeSet::new(), false, false);
    for (k, piece) in cell.split('`').enumerate() {
        if k % 2 == 1 {
            if !never {
                names.insert(room_name(piece));
            }
            continue;
        }
        for clause in piece.to_lowercase().split_inclusive([')', ';']) {
            let words: Vec<&str> = clause
                .split(|c: char| !c.is_alphanumeric())
                .filter(|w| !w.is_empty())
                .collect();
            never |= words.contains(&"never");
            let every_room = words.windows(2).any(|w| w == ["every", "room"]);
            anything |= !never && (words.contains(&"anything") || every_room);
            if clause.ends_with([')', ';']) {
                never = false;
            }
        }
    }
    (names, anything)
}

/// The arrows of the bullets of a section: ``- `from` → `to`: reason``.
fn arrows(section: &[(usize, &str)]) -> Result<Vec<Arrow>, String> {
    section
        .iter()
        .filter(|(_, l)| l.starts_with("- ") || l.starts_with("* "))
        .map(|&(n, line)| {
            let pieces: Vec<&str> = line.split('`').collect();
            let arrow = pieces.get(2).map(|a| a.trim());
            if pieces.len() < 4 || !matches!(arrow, Some("→" | "->")) {
                return Err(format!(
                    "ARCHITECTURE.md:{n}: not an arrow ``- `from` → `to`: reason``: {line}"
                ));
            }
            Ok(Arrow {
                line: n,
                from: room_name(pieces[1]),
                to: room_name(pieces[3]),
            })
        })
        .collect()
}
