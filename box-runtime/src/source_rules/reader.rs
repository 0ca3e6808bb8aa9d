//! A small reader of the paths a Rust source names: its `use` declarations and the paths written
//! in its code that start at `crate`, `super`, `self` or a module the file declares.
//!
//! It is not a parser. Comments and the contents of string and character literals are blanked
//! first, and the modules compiled only for tests (`#[cfg(test)]` before a `mod` item) are
//! skipped; what remains is cut into identifiers and punctuation, and the paths are read from
//! those tokens. A path inside an inline `mod` block is read as if written at the file's level.

/// A path that a source names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// The 1-based line of the path's last segment.
    pub line: usize,
    /// The segments as written, `crate`, `super` and `self` included; a group's `self` names the
    /// group's prefix: `use crate::store::{self};` names `["crate", "store"]`.
    pub path: Vec<String>,
    /// Whether it is imported by a `use` declaration or written in code.
    pub kind: Kind,
}

/// How a [`Reference`] is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// In a `use` declaration.
    Use {
        /// `pub use` or `pub(...) use`: the module re-exports it.
        public: bool,
        /// The name it brings into scope (the alias of `as`); `None` for a glob (`::*`).
        name: Option<String>,
    },
    /// In code: an expression, a type, a pattern, a macro's arguments.
    Inline,
}

impl Reference {
    /// The path as written, `::*` after a glob.
    pub fn written(&self) -> String {
        let path = self.path.join("::");
        match self.kind {
            Kind::Use { name: None, .. } => format!("{path}::*"),
            _ => path,
        }
    }
}

/// What one source declares and names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reading {
    /// The modules it declares (`mod name;` or `mod name { ... }`), outside test modules.
    pub children: Vec<String>,
    /// The paths it names, in the order written, outside comments and test modules.
    pub references: Vec<Reference>,
}

/// Reads the modules a source declares and the paths it names.
pub fn read(text: &str) -> Reading {
    let code = without_test_modules(&code_only(text));
    let tokens = tokens(&code);
    let children = children(&tokens);
    let references = references(&tokens, &children);
    Reading {
        children,
        references,
    }
}

/// The text with comments and the contents of string and character literals replaced by spaces;
/// line breaks are kept, so line numbers do not move.
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        match literal_or_comment_end(&chars, i) {
            Some(end) => {
                let end = end.min(chars.len());
                for &c in &chars[i..end] {
                    out.push(if c == '\n' { '\n' } else { ' ' });
                }
                i = end;
            }
            None => {
                out.push(chars[i]);
                i += 1;
            }
        }
    }
    out
}

/// Where the comment or literal that starts at `i` ends (exclusive), if one starts there.
fn literal_or_comment_end(chars: &[char], i: usize) -> Option<usize> {
    let at = |k: usize| chars.get(k).copied();
    match (chars[i], at(i + 1)) {
        ('/', Some('/')) => Some(
            (i..chars.len())
                .find(|&k| chars[k] == '\n')
                .unwrap_or(chars.len()),
        ),
        ('/', Some('*')) => Some(block_comment_end(chars, i)),
        ('"', _) => Some(quoted_end(chars, i + 1, '"')),
        ('\'', Some('\\')) => Some(quoted_end(chars, i + 3, '\'')),
        ('\'', _) if at(i + 2) == Some('\'') => Some(i + 3),
        ('r', _) => raw_string_end(chars, i),
        _ => None,
    }
}

/// The end of a (possibly nested) block comment starting at `i`.
fn block_comment_end(chars: &[char], i: usize) -> usize {
    let mut depth = 0;
    let mut k = i;
    while k + 1 < chars.len() {
        match (chars[k], chars[k + 1]) {
            ('/', '*') => {
                depth += 1;
                k += 2;
            }
            ('*', '/') => {
                depth -= 1;
                k += 2;
                if depth == 0 {
                    return k;
                }
            }
            _ => k += 1,
        }
    }
    chars.len()
}

/// The end of a literal whose body starts at `from` and runs to an unescaped `close`.
fn quoted_end(chars: &[char], from: usize, close: char) -> usize {
    let mut k = from;
    while k < chars.len() {
        match chars[k] {
            '\\' => k += 2,
            c if c == close => return k + 1,
            _ => k += 1,
        }
    }
    chars.len()
}

/// The end of a raw string (`r"..."`, `r#"..."#`, `br"..."`) starting at the `r` at `i`.
fn raw_string_end(chars: &[char], i: usize) -> Option<usize> {
    let ident = |k: usize| chars[k].is_alphanumeric() || chars[k] == '_';
    let prefix_ok = match i {
        0 => true,
        1 => !ident(0) || chars[0] == 'b',
        _ => !ident(i - 1) || (chars[i - 1] == 'b' && !ident(i - 2)),
    };
    let hashes = chars[i + 1..].iter().take_while(|&&c| c == '#').count();
    if !prefix_ok || chars.get(i + 1 + hashes) != Some(&'"') {
        return None;
    }
    let body = i + 2 + hashes;
    let closes =
        |k: usize| chars[k] == '"' && chars[k + 1..].iter().take(hashes).all(|&c| c == '#');
    let end = (body..chars.len()).find(|&k| closes(k));
    Some(end.map_or(chars.len(), |k| k + 1 + hashes))
}

/// The code with every module compiled only for tests blanked: a line that is exactly
/// `#[cfg(test)]` before (other attributes aside) a `mod` item, through the item's closing brace.
fn without_test_modules(code: &str) -> String {
    let mut lines: Vec<&str> = code.split('\n').collect();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() == "#[cfg(test)]" {
            let item = (i + 1..lines.len()).find(|&k| {
                let t = lines[k].trim();
                !t.is_empty() && !t.starts_with("#[")
            });
            if let Some(item) = item.filter(|&k| is_mod_item(lines[k])) {
                let end = item_end(&lines, item);
                lines[i..=end].fill("");
                i = end;
            }
        }
        i += 1;
    }
    lines.join("\n")
}

/// Whether a line starts a `mod` item (`mod x`, `pub mod x`, `pub(crate) mod x`).
fn is_mod_item(line: &str) -> bool {
    let mut t = line.trim_start();
    if let Some(rest) = t.strip_prefix("pub") {
        t = rest.trim_start();
        if let Some(rest) = t.strip_prefix('(') {
            t = rest.split_once(')').map_or("", |(_, r)| r).trim_start();
        }
    }
    t.starts_with("mod ")
}

/// The line on which the item starting on line `start` ends: its `;`, or its closing brace.
fn item_end(lines: &[&str], start: usize) -> usize {
    let mut depth = 0usize;
    for (k, line) in lines.iter().enumerate().skip(start) {
        for c in line.chars() {
            match c {
                ';' if depth == 0 => return k,
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        return k;
                    }
                }
                _ => {}
            }
        }
    }
    lines.len() - 1
}

/// A token of code: an identifier (keywords and numbers included), `::`, or one other character.
#[derive(Debug, Clone, Copy)]
struct Token<'a> {
    text: &'a str,
    line: usize,
}

impl Token<'_> {
    fn is_ident(&self) -> bool {
        self.text
            .starts_with(|c: char| c.is_alphabetic() || c == '_')
    }
}

fn tokens(code: &str) -> Vec<Token<'_>> {
    let mut out = Vec::new();
    for (n, line) in code.split('\n').enumerate() {
        let mut rest = line.trim_start();
        while let Some(c) = rest.chars().next() {
            let len = if c.is_alphanumeric() || c == '_' {
                rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len())
            } else if rest.starts_with("::") {
                2
            } else {
                c.len_utf8()
            };
            out.push(Token {
                text: &rest[..len],
                line: n + 1,
            });
            rest = rest[len..].trim_start();
        }
    }
    out
}

/// The names of `mod name;` and `mod name { ... }` items.
fn children(tokens: &[Token<'_>]) -> Vec<String> {
    tokens
        .windows(3)
        .filter(|w| w[0].text == "mod" && w[1].is_ident() && matches!(w[2].text, ";" | "{"))
        .map(|w| w[1].text.to_owned())
        .collect()
}

/// Every path named by a `use` declaration or written in code.
fn references(tokens: &[Token<'_>], children: &[String]) -> Vec<Reference> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if starts_use(tokens, i) {
            let mut tree = UseTree {
                tokens,
                pos: i + 1,
                public: is_public(tokens, i),
                out: &mut out,
            };
            tree.read(&[]);
            let end = tree.pos;
            i = (end..tokens.len())
                .find(|&k| tokens[k].text == ";")
                .map_or(tokens.len(), |k| k + 1);
        } else if let Some((reference, end)) = inline_path(tokens, i, children) {
            out.push(reference);
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

/// Whether the `use` keyword of a declaration is at `i` (not `impl Trait + use<'a>`).
fn starts_use(tokens: &[Token<'_>], i: usize) -> bool {
    tokens[i].text == "use"
        && (i == 0 || tokens[i - 1].text != "::")
        && tokens
            .get(i + 1)
            .is_some_and(|t| t.is_ident() || matches!(t.text, "::" | "{"))
}

/// Whether the `use` at `i` follows `pub` or `pub(...)`.
fn is_public(tokens: &[Token<'_>], i: usize) -> bool {
    match i.checked_sub(1).map(|k| tokens[k].text) {
        Some("pub") => true,
        Some(")") => {
            let open = (0..i - 1).rev().find(|&k| tokens[k].text == "(");
            open.is_some_and(|k| k > 0 && tokens[k - 1].text == "pub")
        }
        _ => false,
    }
}

/// The reader of one `use` tree, adding each imported path to `out`.
struct UseTree<'t, 'a> {
    tokens: &'t [Token<'a>],
    pos: usize,
    public: bool,
    out: &'t mut Vec<Reference>,
}

impl UseTree<'_, '_> {
    /// Reads a tree (`a::b`, `a::{...}`, `a::*`, `a as b`) after the segments in `prefix`.
    fn read(&mut self, prefix: &[String]) {
        let mut path = prefix.to_vec();
        while let Some(token) = self.tokens.get(self.pos).copied() {
            match token.text {
                "::" => self.pos += 1,
                "{" => {
                    self.pos += 1;
                    self.group(&path);
                    return;
                }
                "*" => {
                    self.pos += 1;
                    self.push(path, token.line, None);
                    return;
                }
                _ if token.is_ident() => {
                    self.pos += 1;
                    if self.next_is("::") {
                        path.push(token.text.to_owned());
                        continue;
                    }
                    if token.text != "self" {
                        path.push(token.text.to_owned());
                    }
                    let mut name = path.last().cloned();
                    if self.next_is("as") {
                        name = self.tokens.get(self.pos + 1).map(|t| t.text.to_owned());
                        self.pos += 2;
                    }
                    self.push(path, token.line, name);
                    return;
                }
                _ => return,
            }
        }
    }

    /// Reads the trees of a `{ ... }` group, after its `{`, through its `}`.
    fn group(&mut self, prefix: &[String]) {
        while let Some(token) = self.tokens.get(self.pos) {
            match token.text {
                "}" => {
                    self.pos += 1;
                    return;
                }
                "," => self.pos += 1,
                _ => {
                    let before = self.pos;
                    self.read(prefix);
                    if self.pos == before {
                        return;
                    }
                }
            }
        }
    }

    fn next_is(&self, text: &str) -> bool {
        self.tokens.get(self.pos).is_some_and(|t| t.text == text)
    }

    fn push(&mut self, path: Vec<String>, line: usize, name: Option<String>) {
        if path.is_empty() {
            return;
        }
        self.out.push(Reference {
            line,
            path,
            kind: Kind::Use {
                public: self.public,
                name,
            },
        });
    }
}

/// The path written in code at `i`, if one starts there at `crate`, `super`, `self` or a module
/// the file declares, and the index after it.
fn inline_path(tokens: &[Token<'_>], i: usize, children: &[String]) -> Option<(Reference, usize)> {
    let first = tokens[i].text;
    let root = matches!(first, "crate" | "super" | "self") || children.iter().any(|c| c == first);
    let starts = i == 0 || !matches!(tokens[i - 1].text, "::" | ".");
    if !root || !starts {
        return None;
    }
    let mut path = vec![first.to_owned()];
    let mut last = i;
    while tokens.get(last + 1).is_some_and(|t| t.text == "::")
        && tokens.get(last + 2).is_some_and(Token::is_ident)
    {
        path.push(tokens[last + 2].text.to_owned());
        last += 2;
    }
    if path.len() == 1 {
        return None;
    }
    let reference = Reference {
        line: tokens[last].line,
        path,
        kind: Kind::Inline,
    };
    Some((reference, last + 1))
}
