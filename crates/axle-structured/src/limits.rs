//! Limits on a grammar's size and depth, checked before llguidance sees it. The grammar compiler
//! recurses along `$ref` chains, nested schemas, Lark rule chains and nested groups; a request can
//! make those as deep as its body allows. Compilation runs on a thread with a large stack (see
//! `constraint.rs`), and these limits keep every accepted grammar far inside that stack, so a
//! request is refused by name instead of taking the process down.
//!
//! Every walk here is iterative: the inputs are exactly the ones too deep for recursion.
use crate::format::OutputConstraint;
use crate::StructuredError;
use serde_json::Value;
use std::collections::HashMap;

/// The largest grammar accepted: a JSON schema serialized, a Lark grammar's or a pattern's text.
pub const MAX_GRAMMAR_BYTES: usize = 512 << 10;

/// The deepest grammar accepted: the longest chain of nested schemas and `$ref` hops, of Lark
/// rules referring to rules (with their groups), or of a pattern's nested groups.
pub const MAX_GRAMMAR_DEPTH: usize = 256;

/// Which limit a grammar is over, and by how much.
fn over(what: &str, found: usize, limit: usize) -> StructuredError {
    StructuredError::Limit(format!(
        "the grammar's {what} is over the limit of {limit} (found at least {found})"
    ))
}

/// Checks `c` against [`MAX_GRAMMAR_BYTES`] and [`MAX_GRAMMAR_DEPTH`].
pub(crate) fn check(c: &OutputConstraint) -> Result<(), StructuredError> {
    match c {
        OutputConstraint::JsonObject => Ok(()),
        OutputConstraint::JsonSchema { schema } => {
            let bytes = serialized_len(schema);
            if bytes > MAX_GRAMMAR_BYTES {
                return Err(over("size in bytes", bytes, MAX_GRAMMAR_BYTES));
            }
            check_depth("depth (nested schemas and $ref hops)", schema_depth(schema))
        }
        OutputConstraint::Regex { pattern } => {
            if pattern.len() > MAX_GRAMMAR_BYTES {
                return Err(over("size in bytes", pattern.len(), MAX_GRAMMAR_BYTES));
            }
            check_depth("depth (nested groups)", regex_depth(pattern))
        }
        OutputConstraint::Grammar { lark } => {
            if lark.len() > MAX_GRAMMAR_BYTES {
                return Err(over("size in bytes", lark.len(), MAX_GRAMMAR_BYTES));
            }
            check_depth(
                "depth (chains of rules, nested groups and embedded schemas)",
                lark_depth(lark),
            )
        }
    }
}

fn check_depth(what: &str, depth: usize) -> Result<(), StructuredError> {
    if depth > MAX_GRAMMAR_DEPTH {
        Err(over(what, depth, MAX_GRAMMAR_DEPTH))
    } else {
        Ok(())
    }
}

/// Bytes of `v` as compact JSON.
fn serialized_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    // Writing a Value into a counter cannot fail.
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// A graph whose longest path from any node is wanted, cycles cut where they close (a recursive
/// schema or rule is fine: the compiler makes it one nonterminal and stops there).
trait Graph {
    /// A node's identity.
    type Node: Copy + Eq + std::hash::Hash;
    /// The nodes a node leads to.
    fn next(&self, n: Self::Node) -> Vec<Self::Node>;
}

/// The longest path (in nodes) from any of `roots`, stopping as soon as it exceeds `cap` (the
/// answer is then some value over `cap`). Iterative depth-first search with memoised depths.
fn longest_path<G: Graph>(g: &G, roots: &[G::Node], cap: usize) -> usize {
    #[derive(Clone, Copy)]
    enum Mark {
        Open,
        Done(usize),
    }
    struct Frame<N> {
        node: N,
        next: Vec<N>,
        at: usize,
        best: usize,
    }
    let mut marks: HashMap<G::Node, Mark> = HashMap::new();
    let mut deepest = 0;
    for &root in roots {
        if marks.contains_key(&root) {
            continue;
        }
        marks.insert(root, Mark::Open);
        let mut stack = vec![Frame {
            node: root,
            next: g.next(root),
            at: 0,
            best: 1,
        }];
        loop {
            let height = stack.len();
            if height > cap {
                return height;
            }
            let Some(top) = stack.last_mut() else {
                break;
            };
            if top.at < top.next.len() {
                let n = top.next[top.at];
                top.at += 1;
                match marks.get(&n) {
                    Some(Mark::Done(d)) => {
                        top.best = top.best.max(d + 1);
                        if height - 1 + top.best > cap {
                            return height - 1 + top.best;
                        }
                    }
                    Some(Mark::Open) => {}
                    None => {
                        marks.insert(n, Mark::Open);
                        let next = g.next(n);
                        stack.push(Frame {
                            node: n,
                            next,
                            at: 0,
                            best: 1,
                        });
                    }
                }
            } else {
                let done = stack.pop().map(|f| (f.node, f.best));
                if let Some((node, best)) = done {
                    marks.insert(node, Mark::Done(best));
                    deepest = deepest.max(best);
                    if let Some(parent) = stack.last_mut() {
                        parent.best = parent.best.max(best + 1);
                    }
                }
            }
        }
    }
    deepest
}

/// A JSON schema as a graph: each value leads to its members and, for a local `$ref`, to the
/// value it points at. Nodes are the values' addresses inside `root`, indexed once.
struct Schema<'a> {
    root: &'a Value,
    index: HashMap<usize, &'a Value>,
}

impl<'a> Schema<'a> {
    fn new(root: &'a Value) -> Schema<'a> {
        let mut index = HashMap::new();
        let mut todo = vec![root];
        while let Some(v) = todo.pop() {
            index.insert(node(v), v);
            match v {
                Value::Object(m) => todo.extend(m.values()),
                Value::Array(a) => todo.extend(a.iter()),
                _ => {}
            }
        }
        Schema { root, index }
    }
}

fn node(v: &Value) -> usize {
    v as *const Value as usize
}

impl Graph for Schema<'_> {
    type Node = usize;
    fn next(&self, n: usize) -> Vec<usize> {
        match self.index.get(&n) {
            Some(Value::Object(m)) => {
                let mut out: Vec<usize> = m.values().map(node).collect();
                let target = m
                    .get("$ref")
                    .and_then(Value::as_str)
                    .and_then(|r| r.strip_prefix('#'))
                    .and_then(|p| self.root.pointer(p));
                out.extend(target.map(node));
                out
            }
            Some(Value::Array(a)) => a.iter().map(node).collect(),
            _ => Vec::new(),
        }
    }
}

/// The longest chain of nested values and `$ref` hops in `schema`.
pub(crate) fn schema_depth(schema: &Value) -> usize {
    let g = Schema::new(schema);
    longest_path(&g, &[node(schema)], MAX_GRAMMAR_DEPTH)
}

/// The deepest nesting of groups in a regular expression (escapes and classes skipped).
fn regex_depth(pattern: &str) -> usize {
    let (mut depth, mut deepest, mut class, mut escaped) = (0usize, 0usize, false, false);
    for c in pattern.chars() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            '[' if !class => class = true,
            ']' if class => class = false,
            '(' if !class => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            ')' if !class => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// A Lark grammar's rules as a graph: a rule leads to the rules its body names.
struct Rules {
    /// Each rule's body: the names it refers to, and the depth of what it embeds (groups, JSON
    /// schemas, regular expressions).
    bodies: Vec<(Vec<usize>, usize)>,
}

impl Graph for Rules {
    type Node = usize;
    fn next(&self, n: usize) -> Vec<usize> {
        self.bodies.get(n).map(|b| b.0.clone()).unwrap_or_default()
    }
}

/// The deepest a Lark grammar goes: the longest chain of rules, each rule counting what it
/// embeds; or its deepest embedded piece alone.
fn lark_depth(lark: &str) -> usize {
    let scanned = scan_lark(lark);
    let mut ids: HashMap<&str, usize> = HashMap::new();
    for (name, _) in &scanned.rules {
        let next = ids.len();
        ids.entry(name).or_insert(next);
    }
    let mut bodies = vec![(Vec::new(), 0usize); ids.len()];
    for (name, body) in &scanned.rules {
        let id = ids[name.as_str()];
        let b = &mut bodies[id];
        b.0.extend(body.names.iter().filter_map(|n| ids.get(n.as_str())));
        b.1 = b.1.max(body.embedded);
    }
    // A rule that embeds a deep piece adds it to every chain through it: count the piece as a
    // chain of that many extra nodes by folding it into the rule's own depth below.
    let roots: Vec<usize> = (0..bodies.len()).collect();
    let embedded = bodies.iter().map(|b| b.1).max().unwrap_or(0);
    let rules = Rules { bodies };
    let chain = longest_path(&rules, &roots, MAX_GRAMMAR_DEPTH);
    chain.saturating_add(embedded).max(scanned.nesting)
}

/// What a scan of a Lark grammar finds.
#[derive(Debug, Default)]
struct ScannedLark {
    /// Rule and terminal definitions in order: name and body.
    rules: Vec<(String, Body)>,
    /// The deepest nesting of brackets outside literals.
    nesting: usize,
}

#[derive(Debug, Default)]
struct Body {
    names: Vec<String>,
    embedded: usize,
}

/// Scans Lark text: definitions (`name:` or `?name.2:` at the start of a line), the names each
/// body uses, bracket nesting, and the depth of embedded `%json {...}` schemas and `/regex/`s.
/// Strings, regexes and comments are skipped as Lark's lexer would.
fn scan_lark(text: &str) -> ScannedLark {
    let b = text.as_bytes();
    let mut out = ScannedLark::default();
    let mut current: Option<(String, Body)> = None;
    let (mut i, mut depth, mut line_start) = (0usize, 0usize, true);
    while i < b.len() {
        let c = b[i];
        if c == b'\n' {
            line_start = true;
            i += 1;
            continue;
        }
        if line_start && !c.is_ascii_whitespace() {
            line_start = false;
            if let Some((name, end)) = definition(b, i) {
                if let Some(done) = current.take() {
                    out.rules.push(done);
                }
                current = Some((name, Body::default()));
                depth = 0;
                i = end;
                continue;
            }
        } else if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        line_start = false;
        match c {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'"' | b'\'' => i = skip_quoted(b, i, c),
            b'/' => {
                let end = skip_quoted(b, i, b'/');
                let inner = regex_depth(&String::from_utf8_lossy(&b[i..end]));
                if let Some((_, body)) = current.as_mut() {
                    body.embedded = body.embedded.max(inner);
                }
                out.nesting = out.nesting.max(inner);
                i = end;
            }
            b'%' => {
                let word_end = ident_end(b, i + 1);
                let word = &b[i + 1..word_end];
                i = word_end;
                if matches!(word, b"json" | b"regex" | b"llguidance") {
                    while i < b.len() && b[i].is_ascii_whitespace() {
                        i += 1;
                    }
                    if b.get(i) == Some(&b'{') {
                        let (end, inner) = embedded_json(text, i);
                        if let Some((_, body)) = current.as_mut() {
                            body.embedded = body.embedded.max(inner);
                        }
                        out.nesting = out.nesting.max(inner);
                        i = end;
                    }
                }
            }
            b'(' | b'[' | b'{' => {
                depth += 1;
                out.nesting = out.nesting.max(depth);
                i += 1;
            }
            b')' | b']' | b'}' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let end = ident_end(b, i);
                if let Some((_, body)) = current.as_mut() {
                    body.names
                        .push(String::from_utf8_lossy(&b[i..end]).into_owned());
                }
                i = end;
            }
            _ => i += 1,
        }
    }
    out.rules.extend(current);
    out
}

fn ident_end(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
        i += 1;
    }
    i
}

/// The end of a literal opened by `quote` at `i` (past the closing quote and, for a regex, its
/// flags; the end of the line or text if it never closes).
fn skip_quoted(b: &[u8], i: usize, quote: u8) -> usize {
    let mut j = i + 1;
    while j < b.len() && b[j] != b'\n' {
        match b[j] {
            b'\\' => j += 2,
            c if c == quote => {
                j += 1;
                if quote == b'/' {
                    j = ident_end(b, j);
                }
                return j.min(b.len());
            }
            _ => j += 1,
        }
    }
    j.min(b.len())
}

/// A definition starting at `i`: `[?!]name[.priority][{params}]` then `:`. Returns the name and
/// where its body starts.
fn definition(b: &[u8], i: usize) -> Option<(String, usize)> {
    let mut j = i;
    if matches!(b.get(j), Some(b'?' | b'!')) {
        j += 1;
    }
    if !b
        .get(j)
        .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_')
    {
        return None;
    }
    let end = ident_end(b, j);
    let name = String::from_utf8_lossy(&b[j..end]).into_owned();
    let mut k = end;
    if b.get(k) == Some(&b'.') {
        k += 1;
        if b.get(k) == Some(&b'-') {
            k += 1;
        }
        while k < b.len() && b[k].is_ascii_digit() {
            k += 1;
        }
    }
    if b.get(k) == Some(&b'{') {
        while k < b.len() && b[k] != b'}' && b[k] != b'\n' {
            k += 1;
        }
        k += 1;
    }
    while k < b.len() && (b[k] == b' ' || b[k] == b'\t') {
        k += 1;
    }
    (b.get(k) == Some(&b':')).then_some((name, k + 1))
}

/// A JSON value embedded at `i` (after `%json`): where it ends and its schema depth. A value
/// that does not parse is skipped to its closing brace and counted by its bracket nesting.
fn embedded_json(text: &str, i: usize) -> (usize, usize) {
    let rest = &text[i..];
    let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
    match values.next() {
        Some(Ok(v)) => (i + values.byte_offset(), schema_depth(&v)),
        _ => {
            let b = text.as_bytes();
            let (mut j, mut depth, mut deepest) = (i, 0usize, 0usize);
            while j < b.len() {
                match b[j] {
                    b'"' => {
                        j = skip_quoted(b, j, b'"');
                        continue;
                    }
                    b'{' | b'[' => {
                        depth += 1;
                        deepest = deepest.max(depth);
                    }
                    b'}' | b']' => {
                        depth = depth.saturating_sub(1);
                        if depth == 0 {
                            return (j + 1, deepest);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            (j, deepest)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ref_chain(n: usize) -> Value {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            defs.insert(
                format!("d{i}"),
                json!({"$ref": format!("#/$defs/d{}", i + 1)}),
            );
        }
        defs.insert(format!("d{n}"), json!({"type": "integer"}));
        json!({"$defs": defs, "$ref": "#/$defs/d0"})
    }

    #[test]
    fn ref_chains_count_every_hop() {
        let shallow = schema_depth(&ref_chain(10));
        assert!((12..=20).contains(&shallow), "{shallow}");
        assert!(schema_depth(&ref_chain(5_000)) > MAX_GRAMMAR_DEPTH);
    }

    #[test]
    fn recursive_schemas_are_not_deep() {
        let tree = json!({
            "$defs": {"node": {"type": "object", "properties": {
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
            "$ref": "#/$defs/node"
        });
        assert!(schema_depth(&tree) < 16);
        assert!(schema_depth(&json!({"$ref": "#"})) < 4);
    }

    #[test]
    fn lark_rule_chains_and_nesting_count() {
        let mut chain = String::from("start: r0\n");
        for i in 0..5_000 {
            chain.push_str(&format!("r{i}: \"a\" r{}\n", i + 1));
        }
        chain.push_str("r5000: \"b\"\n");
        assert!(lark_depth(&chain) > MAX_GRAMMAR_DEPTH);
        let nested = format!("start: {}\"a\"{}\n", "(".repeat(400), ")".repeat(400));
        assert!(lark_depth(&nested) > MAX_GRAMMAR_DEPTH);
        let plain = "start: item+\nitem: /[a-z]+/ | \"(\" item \")\" // a comment (\n";
        let d = lark_depth(plain);
        assert!((2..10).contains(&d), "{d}");
    }

    #[test]
    fn embedded_schemas_count_in_lark() {
        let deep = ref_chain(1_000);
        let lark = format!("start: call\ncall: %json {deep}\n");
        assert!(lark_depth(&lark) > MAX_GRAMMAR_DEPTH);
        let small = format!("start: call\ncall: %json {}\n", ref_chain(3));
        assert!(lark_depth(&small) < 16);
    }

    #[test]
    fn limits_name_what_is_over() {
        let c = OutputConstraint::JsonSchema {
            schema: ref_chain(900),
        };
        let e = check(&c).expect_err("too deep").to_string();
        assert!(e.contains("depth") && e.contains("256"), "{e}");
        let big = OutputConstraint::Regex {
            pattern: "a".repeat(MAX_GRAMMAR_BYTES + 1),
        };
        let e = check(&big).expect_err("too big").to_string();
        assert!(e.contains("size in bytes"), "{e}");
        let nested = OutputConstraint::Regex {
            pattern: format!("{}a{}", "(".repeat(300), ")".repeat(300)),
        };
        assert!(check(&nested).is_err());
    }
}
