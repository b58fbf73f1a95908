//! A linear pre-scan of a manifest's nesting depth, run before any parser sees the text (the
//! kubelet's answer to CVE-2019-11253 was the same: bound the input before decoding it).
//!
//! Why it is needed: the YAML parser (libyaml, under `serde_yaml_ng`) keeps one "possible simple
//! key" per open flow collection (`[` or `{`) and walks all of them for every token it reads, so a
//! document nested N levels deep costs O(size × N): 100,000 nested `{"a":` took about a minute of
//! CPU, long before the deserializer's own recursion limit (128) could refuse it. This scan walks the
//! text once, understands just enough YAML to tell structure from text (quoted scalars, comments,
//! plain scalars, block scalars, flow collections, block indentation), and reports the first place
//! the nesting passes the limit.
//!
//! Flow collections are counted exactly as libyaml opens them, because their depth is what costs;
//! block nesting (indentation) costs the parser nothing extra and is estimated from the indentation
//! levels, at worst one level low per sequence that shares its parent's indentation. Where the scan
//! and libyaml could read a construct differently, libyaml reports a syntax error there and stops,
//! so the text after it is never parsed.

/// Where a document first nests deeper than the limit (1-based, columns in bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TooDeep {
    pub line: usize,
    pub column: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Block context, at the start of a line.
    LineStart,
    /// Block context, where a token may start.
    Block,
    /// Inside a plain (unquoted) scalar in block context.
    BlockPlain,
    /// Flow context, where a token may start.
    Flow,
    /// Inside a plain scalar in flow context.
    FlowPlain,
    /// Inside a double-quoted scalar; `flow` says which context it returns to.
    Double { flow: bool },
    /// Inside a single-quoted scalar.
    Single { flow: bool },
    /// Up to the end of the line: a comment, a directive, a block scalar's header.
    ToEndOfLine,
    /// An anchor, alias or tag; `verbatim` tags (`!<...>`) end at `>`.
    Word { flow: bool, verbatim: bool },
}

/// Whether the next line may continue a plain scalar left open at the end of a line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PlainGoesOn {
    No,
    /// In lines of any indentation (a scalar at the top level).
    AnyIndent,
    /// In lines indented more than its parent collection.
    DeeperThan(usize),
}

impl PlainGoesOn {
    fn after(parent: Option<usize>) -> Self {
        parent.map_or(Self::AnyIndent, Self::DeeperThan)
    }
}

/// The content lines of a block scalar (`|` or `>`) being skipped.
#[derive(Clone, Copy, Debug)]
struct BlockScalar {
    /// Indentation of the collection holding the scalar; content is indented more (`None`: top level).
    parent: Option<usize>,
    /// Indentation of the content, fixed by its first non-empty line.
    content: Option<usize>,
}

struct Scanner<'a> {
    bytes: &'a [u8],
    limit: usize,
    pos: usize,
    line: usize,
    line_start: usize,
    mode: Mode,
    /// Open flow collections.
    flow: usize,
    /// Indentation of the open block collections, innermost last.
    indents: Vec<usize>,
    /// This line's indentation, while no structure (key, `-`, `?`) has been seen on the line.
    line_indent: Option<usize>,
    /// Block collections opened on this line after its first one (`- - a`, `- key: value`).
    extra: usize,
    /// Indentation of the innermost block collection at this point of the line.
    node_column: Option<usize>,
    /// Column where the last scalar of this line started, in case a `:` makes it a key.
    scalar_column: Option<usize>,
    /// Whether a plain scalar ended the previous line and may go on in the next ones.
    plain: PlainGoesOn,
    /// The parent's indentation of the plain scalar being read in block context.
    plain_parent: Option<usize>,
    block_scalar: Option<BlockScalar>,
    /// The deepest nesting seen so far.
    deepest: usize,
}

/// Scans `text` and returns where its nesting first exceeds `limit` levels, if it does.
pub(crate) fn too_deep(text: &str, limit: usize) -> Option<TooDeep> {
    scan(text, limit).err()
}

/// The deepest nesting the pre-scan reads in `text`.
#[cfg(test)]
pub(super) fn deepest(text: &str) -> usize {
    scan(text, usize::MAX).unwrap_or(usize::MAX)
}

/// The deepest nesting of `text`, up to the first place it exceeds `limit`.
fn scan(text: &str, limit: usize) -> Result<usize, TooDeep> {
    Scanner {
        bytes: text.as_bytes(),
        limit,
        pos: 0,
        line: 1,
        line_start: 0,
        mode: Mode::LineStart,
        flow: 0,
        indents: Vec::new(),
        line_indent: None,
        extra: 0,
        node_column: None,
        scalar_column: None,
        plain: PlainGoesOn::No,
        plain_parent: None,
        block_scalar: None,
        deepest: 0,
    }
    .run()
}

fn is_blank(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\r')
}

fn is_flow_indicator(byte: u8) -> bool {
    matches!(byte, b',' | b'[' | b']' | b'{' | b'}')
}

impl Scanner<'_> {
    fn at(&self, pos: usize) -> Option<u8> {
        self.bytes.get(pos).copied()
    }

    /// Whether `pos` is a blank, a line break or the end of the text.
    fn blank_or_end(&self, pos: usize) -> bool {
        self.at(pos).is_none_or(|b| is_blank(b) || b == b'\n')
    }

    fn column(&self) -> usize {
        self.pos - self.line_start
    }

    fn here(&self) -> TooDeep {
        TooDeep {
            line: self.line,
            column: self.column() + 1,
        }
    }

    fn check(&mut self) -> Result<(), TooDeep> {
        let depth = self.indents.len() + self.extra + self.flow;
        self.deepest = self.deepest.max(depth);
        if depth > self.limit {
            Err(self.here())
        } else {
            Ok(())
        }
    }

    /// Consumes a line break.
    fn newline(&mut self) {
        self.pos += 1;
        self.line += 1;
        self.line_start = self.pos;
    }

    /// A key or a `-`/`?` entry at the current position opens a block collection: the line's own
    /// level for the first one on the line, one more for each further one.
    fn structure(&mut self, column: usize) -> Result<(), TooDeep> {
        if let Some(indent) = self.line_indent.take() {
            if self.indents.last() != Some(&indent) {
                self.indents.push(indent);
            }
        } else {
            self.extra += 1;
        }
        self.node_column = Some(column);
        self.check()
    }

    fn is_document_marker(&self) -> bool {
        self.column() == 0
            && (self.bytes[self.pos..].starts_with(b"---")
                || self.bytes[self.pos..].starts_with(b"..."))
            && self.blank_or_end(self.pos + 3)
    }

    fn run(mut self) -> Result<usize, TooDeep> {
        while self.pos < self.bytes.len() {
            match self.mode {
                Mode::LineStart => self.line_start_step(),
                Mode::Block => self.block_step()?,
                Mode::BlockPlain => self.block_plain_step(),
                Mode::Flow => self.flow_step()?,
                Mode::FlowPlain => self.flow_plain_step(),
                Mode::Double { flow } => self.double_step(flow),
                Mode::Single { flow } => self.single_step(flow),
                Mode::ToEndOfLine => {
                    if self.bytes[self.pos] == b'\n' {
                        self.newline();
                        self.mode = if self.flow > 0 {
                            Mode::Flow
                        } else {
                            Mode::LineStart
                        };
                    } else {
                        self.pos += 1;
                    }
                }
                Mode::Word { flow, verbatim } => self.word_step(flow, verbatim),
            }
        }
        Ok(self.deepest)
    }

    fn line_start_step(&mut self) {
        let indent = self.bytes[self.pos..]
            .iter()
            .take_while(|&&b| b == b' ')
            .count();
        let first = self.bytes[self.pos..]
            .iter()
            .position(|&b| !is_blank(b))
            .map_or(self.bytes.len(), |offset| self.pos + offset);
        if self.at(first).is_none_or(|b| b == b'\n') {
            // An empty line changes nothing, not even for a block scalar or a plain scalar.
            self.pos = first;
            if self.pos < self.bytes.len() {
                self.newline();
            }
            return;
        }
        let marker = self.is_document_marker();
        if let Some(scalar) = &mut self.block_scalar {
            let inside = !marker
                && scalar.parent.is_none_or(|parent| indent > parent)
                && scalar.content.is_none_or(|content| indent >= content);
            if inside {
                scalar.content.get_or_insert(indent);
                self.mode = Mode::ToEndOfLine;
                return;
            }
            self.block_scalar = None;
        }
        let goes_on = match std::mem::replace(&mut self.plain, PlainGoesOn::No) {
            PlainGoesOn::No => None,
            PlainGoesOn::AnyIndent => Some(None),
            PlainGoesOn::DeeperThan(parent) => (indent > parent).then_some(Some(parent)),
        };
        if let Some(parent) = goes_on
            && !marker
            && self.bytes[first] != b'#'
        {
            // The plain scalar goes on; this line is more of its text.
            self.pos = first;
            self.mode = Mode::BlockPlain;
            self.plain_parent = parent;
            return;
        }
        if self.bytes[first] == b'#' || (self.column() == 0 && self.at(self.pos) == Some(b'%')) {
            self.pos = first;
            self.mode = Mode::ToEndOfLine;
            return;
        }
        self.extra = 0;
        self.scalar_column = None;
        if marker {
            self.indents.clear();
            self.line_indent = None;
            self.node_column = None;
            self.pos += 3;
            self.mode = Mode::Block;
            return;
        }
        while self.indents.last().is_some_and(|&top| top > indent) {
            self.indents.pop();
        }
        let enclosing = match self.indents.last() {
            Some(&top) if top == indent => self.indents.len().checked_sub(2),
            Some(_) => Some(self.indents.len() - 1),
            None => None,
        };
        self.node_column = enclosing.map(|i| self.indents[i]);
        self.line_indent = Some(indent);
        self.pos = first;
        self.mode = Mode::Block;
    }

    /// Block context where a token may start.
    fn block_step(&mut self) -> Result<(), TooDeep> {
        let byte = self.bytes[self.pos];
        let column = self.column();
        match byte {
            b'\n' => {
                self.newline();
                self.mode = Mode::LineStart;
            }
            b' ' | b'\t' | b'\r' => self.pos += 1,
            b'#' => self.mode = Mode::ToEndOfLine,
            b'-' | b'?' if self.blank_or_end(self.pos + 1) => {
                self.structure(column)?;
                self.scalar_column = None;
                self.pos += 1;
            }
            b':' if self.blank_or_end(self.pos + 1) => {
                // The value of the scalar before it, which is therefore a key.
                if let Some(key) = self.scalar_column.take() {
                    self.structure(key)?;
                }
                self.pos += 1;
            }
            b'[' | b'{' => {
                self.scalar_column = Some(column);
                self.flow = 1;
                self.check()?;
                self.pos += 1;
                self.mode = Mode::Flow;
            }
            b'"' => {
                self.scalar_column = Some(column);
                self.pos += 1;
                self.mode = Mode::Double { flow: false };
            }
            b'\'' => {
                self.scalar_column = Some(column);
                self.pos += 1;
                self.mode = Mode::Single { flow: false };
            }
            b'|' | b'>' => {
                self.block_scalar = Some(BlockScalar {
                    parent: self.node_column,
                    content: None,
                });
                self.mode = Mode::ToEndOfLine;
            }
            b'&' | b'!' | b'*' => {
                let verbatim = byte == b'!' && self.at(self.pos + 1) == Some(b'<');
                self.pos += 1;
                self.mode = Mode::Word {
                    flow: false,
                    verbatim,
                };
            }
            _ => {
                self.scalar_column = Some(column);
                self.plain_parent = self.node_column;
                self.mode = Mode::BlockPlain;
            }
        }
        Ok(())
    }

    /// Inside a plain scalar in block context: brackets and quotes are text; `: ` ends a key, ` #`
    /// starts a comment, and at the end of the line the scalar may go on in the next one.
    fn block_plain_step(&mut self) {
        let byte = self.bytes[self.pos];
        match byte {
            b'\n' => {
                self.plain = PlainGoesOn::after(self.plain_parent);
                self.newline();
                self.mode = Mode::LineStart;
            }
            b':' if self.blank_or_end(self.pos + 1) => self.mode = Mode::Block,
            b' ' | b'\t' if self.at(self.pos + 1) == Some(b'#') => {
                self.mode = Mode::ToEndOfLine;
            }
            _ => self.pos += 1,
        }
    }

    /// Flow context where a token may start; line breaks and indentation mean nothing here.
    fn flow_step(&mut self) -> Result<(), TooDeep> {
        let byte = self.bytes[self.pos];
        match byte {
            b'\n' => self.newline(),
            b' ' | b'\t' | b'\r' | b',' | b':' | b'?' => self.pos += 1,
            b'-' if self.blank_or_end(self.pos + 1) => self.pos += 1,
            b'#' => self.mode = Mode::ToEndOfLine,
            b'[' | b'{' => {
                self.flow += 1;
                self.check()?;
                self.pos += 1;
            }
            b']' | b'}' => {
                self.flow -= 1;
                self.pos += 1;
                if self.flow == 0 {
                    self.mode = Mode::Block;
                }
            }
            b'"' => {
                self.pos += 1;
                self.mode = Mode::Double { flow: true };
            }
            b'\'' => {
                self.pos += 1;
                self.mode = Mode::Single { flow: true };
            }
            b'&' | b'!' | b'*' => {
                let verbatim = byte == b'!' && self.at(self.pos + 1) == Some(b'<');
                self.pos += 1;
                self.mode = Mode::Word {
                    flow: true,
                    verbatim,
                };
            }
            _ => self.mode = Mode::FlowPlain,
        }
        Ok(())
    }

    /// Inside a plain scalar in flow context: it ends at a flow indicator or `: `, and a `#` after
    /// blanks (also on a following line) starts a comment.
    fn flow_plain_step(&mut self) {
        let byte = self.bytes[self.pos];
        let ends = is_flow_indicator(byte)
            || (byte == b':'
                && (self.blank_or_end(self.pos + 1)
                    || self.at(self.pos + 1).is_some_and(is_flow_indicator)));
        if ends {
            self.mode = Mode::Flow;
        } else if is_blank(byte) || byte == b'\n' {
            // Blanks and breaks inside the scalar; what follows them decides.
            let next = self.bytes[self.pos..]
                .iter()
                .position(|&b| !(is_blank(b) || b == b'\n'))
                .map_or(self.bytes.len(), |offset| self.pos + offset);
            while self.pos < next {
                if self.bytes[self.pos] == b'\n' {
                    self.newline();
                } else {
                    self.pos += 1;
                }
            }
            if self.at(self.pos) == Some(b'#') {
                self.mode = Mode::ToEndOfLine;
            }
        } else {
            self.pos += 1;
        }
    }

    fn double_step(&mut self, flow: bool) {
        match self.bytes[self.pos] {
            b'\\' => {
                self.pos += 1;
                if self.at(self.pos) == Some(b'\n') {
                    self.newline();
                } else if self.pos < self.bytes.len() {
                    self.pos += 1;
                }
            }
            b'"' => {
                self.pos += 1;
                self.mode = if flow { Mode::Flow } else { Mode::Block };
            }
            b'\n' => self.newline(),
            _ => self.pos += 1,
        }
    }

    fn single_step(&mut self, flow: bool) {
        match self.bytes[self.pos] {
            b'\'' if self.at(self.pos + 1) == Some(b'\'') => self.pos += 2,
            b'\'' => {
                self.pos += 1;
                self.mode = if flow { Mode::Flow } else { Mode::Block };
            }
            b'\n' => self.newline(),
            _ => self.pos += 1,
        }
    }

    fn word_step(&mut self, flow: bool, verbatim: bool) {
        let byte = self.bytes[self.pos];
        let ends = if verbatim {
            byte == b'>' || byte == b'\n'
        } else {
            is_blank(byte) || byte == b'\n' || (flow && is_flow_indicator(byte))
        };
        if !ends || (verbatim && byte == b'>') {
            self.pos += 1;
        }
        if ends {
            self.mode = if flow { Mode::Flow } else { Mode::Block };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth(text: &str) -> usize {
        deepest(text)
    }

    fn nested_json(depth: usize) -> String {
        format!("{}1{}", r#"{"a":"#.repeat(depth), "}".repeat(depth))
    }

    #[test]
    fn json_nesting_is_counted_exactly() {
        assert_eq!(depth(&nested_json(1)), 1);
        assert_eq!(depth(&nested_json(128)), 128);
        assert_eq!(depth(r#"{"a": [1, {"b": [[]]}], "c": {}}"#), 5);
        assert_eq!(
            too_deep(&nested_json(129), 128),
            Some(TooDeep {
                line: 1,
                column: 129 * 5 - 4
            })
        );
        assert_eq!(depth(&nested_json(100_000)), 100_000);
    }

    #[test]
    fn block_nesting_follows_the_indentation() {
        assert_eq!(depth("a: 1\n"), 1);
        assert_eq!(depth("a:\n  b:\n    c: [1]\n"), 4);
        assert_eq!(depth("a:\n- b: {c: 1}\n  d: 2\n"), 3);
        assert_eq!(depth("- - - a\n"), 3);
        assert_eq!(depth("a:\n  b: 1\nc: 1\n"), 2);
        // Each document starts afresh.
        assert_eq!(depth("a:\n  b:\n    c: 1\n---\nd: 1\n"), 3);
    }

    #[test]
    fn brackets_in_text_are_not_nesting() {
        let many = "[".repeat(300);
        for text in [
            format!("a: \"{many}\"\n"),
            format!("a: '{many}'\n"),
            format!("a: b{many}\n"),
            format!("a: 1 # {many}\n"),
            format!("# {many}\n"),
            format!("a: |\n  {many}\n  {many}\nb: 1\n"),
            format!("a: >-\n    x\n    {many}\n"),
            format!("- \"a\\\" {many}\"\n"),
            format!("a: 'it''s {many}'\n"),
            format!("a: [\"{many}\", '{many}', x]\n"),
            format!("a: b\n  c {many}\n"),
            format!("{{\"a\": \"{many}\\\"{many}\"}}"),
        ] {
            assert!(depth(&text) < 10, "{text}");
        }
    }

    #[test]
    fn closing_brackets_in_text_do_not_hide_nesting() {
        let deep = |open: &str| open.repeat(200);
        for text in [
            // A string holding the closer next to each real opener.
            deep(r#"[ "]", "#),
            deep("[ ']', "),
            deep("[ # ]]\n"),
            // A quote inside a flow plain scalar is text, not the start of a string.
            format!("[a \"b, {}", deep("[")),
            format!("[a 'b, {}", deep("[")),
            // A plain scalar ends where a less indented line starts.
            format!("a:\n  b \"\nc: {}", deep("[")),
            // A block scalar ends at a less indented line.
            format!("a: |\n    text \"\n  b: {}", deep("{")),
            format!("- |\n  x\n- {}", deep("[")),
            // A comment line ends a plain scalar.
            format!("a: b\n# \"\nc: {}", deep("[")),
            // An anchor or tag is no string either.
            format!("a: &x\" {}", deep("[")),
            format!("a: !t' {}", deep("[")),
        ] {
            assert!(depth(&text) >= 200, "{text}");
        }
    }

    #[test]
    fn every_example_manifest_is_far_from_the_limit() {
        let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples");
        let mut checked = 0;
        let mut dirs = vec![examples];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path
                    .extension()
                    .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
                {
                    let text = std::fs::read_to_string(&path).unwrap();
                    let found = depth(&text);
                    assert!((1..=16).contains(&found), "{}: {found}", path.display());
                    checked += 1;
                }
            }
        }
        assert!(checked >= 3, "only {checked} examples");
    }
}
