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

/// Checks `c` against [`MAX_GRAMMAR_BYTES`] and [`MAX_GRAMMAR_DEPTH`] before it is compiled.
pub(crate) fn check(c: &OutputConstraint) -> Result<(), StructuredError> {
    match c {
        OutputConstraint::JsonObject => Ok(()),
        OutputConstraint::JsonSchema { schema } => check_schema(schema, true),
        OutputConstraint::Regex { pattern } => {
            check_size(pattern.len())?;
            check_depth("depth (nested groups)", regex_depth(pattern))
        }
        OutputConstraint::Grammar { lark } => {
            check_size(lark.len())?;
            check_depth(
                "depth (chains of rules, nested groups and embedded schemas)",
                lark_depth(lark),
            )
        }
    }
}

/// The checks for a JSON schema that is not compiled (a tool's parameters when the model may
/// call it but need not): the size and depth limits (`$ref`s that lead outside it are left
/// alone), then that it is a schema at all, against the meta-schema of its draft.
pub fn check_tool_schema(schema: &Value) -> Result<(), StructuredError> {
    check_schema(schema, false)?;
    jsonschema::meta::validate(schema)
        .map_err(|e| StructuredError::Invalid(format!("not a valid JSON schema: {e}")))
}

/// A schema's size, then (with `local_refs`) that every `$ref` points inside it, whose chain
/// could not be measured otherwise, then its depth.
fn check_schema(schema: &Value, local_refs: bool) -> Result<(), StructuredError> {
    check_size(serialized_len(schema))?;
    let g = Schema::new(schema);
    if let Some(r) = g.unresolved().filter(|_| local_refs) {
        return Err(StructuredError::Limit(format!(
            "the grammar's `$ref` {r:?} does not point inside the schema (only local JSON pointers \
             such as \"#/$defs/name\" are followed)"
        )));
    }
    check_depth(
        "depth (nested schemas and $ref hops)",
        longest_path(&g, &[node(schema)]),
    )
}

fn check_size(bytes: usize) -> Result<(), StructuredError> {
    if bytes > MAX_GRAMMAR_BYTES {
        Err(over("size in bytes", bytes, MAX_GRAMMAR_BYTES))
    } else {
        Ok(())
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

/// A graph whose heaviest path from given roots is wanted. A cycle (a recursive schema or rule)
/// counts once with the weight of all its members: the compiler can recurse through each member
/// of a cycle once before it meets one it is already compiling.
trait Graph {
    /// A node's identity.
    type Node: Copy + Eq + std::hash::Hash;
    /// The nodes a node leads to.
    fn next(&self, n: Self::Node) -> Vec<Self::Node>;
    /// How deep the compiler may recurse inside the node itself.
    fn weight(&self, _n: Self::Node) -> usize {
        1
    }
}

/// The heaviest path from any of `roots`: strongly connected components found with an iterative
/// Tarjan walk, each weighted by the sum of its members' weights, and the heaviest path through
/// the acyclic graph of components (computed as Tarjan emits them, successors first). Linear in
/// nodes and edges.
fn longest_path<G: Graph>(g: &G, roots: &[G::Node]) -> usize {
    struct Frame<N> {
        node: N,
        next: Vec<N>,
        at: usize,
    }
    let mut index: HashMap<G::Node, usize> = HashMap::new();
    let mut low: HashMap<G::Node, usize> = HashMap::new();
    let mut on_stack: HashMap<G::Node, bool> = HashMap::new();
    let mut component: HashMap<G::Node, usize> = HashMap::new();
    // Heaviest path starting in each finished component.
    let mut depth: Vec<usize> = Vec::new();
    let mut stack: Vec<G::Node> = Vec::new();
    let mut deepest = 0;
    for &root in roots {
        if index.contains_key(&root) {
            continue;
        }
        let mut frames = vec![Frame {
            node: root,
            next: g.next(root),
            at: 0,
        }];
        index.insert(root, index.len());
        low.insert(root, index[&root]);
        stack.push(root);
        on_stack.insert(root, true);
        while let Some(top) = frames.last_mut() {
            if top.at < top.next.len() {
                let n = top.next[top.at];
                top.at += 1;
                let v = top.node;
                if !index.contains_key(&n) {
                    let i = index.len();
                    index.insert(n, i);
                    low.insert(n, i);
                    stack.push(n);
                    on_stack.insert(n, true);
                    let next = g.next(n);
                    frames.push(Frame {
                        node: n,
                        next,
                        at: 0,
                    });
                } else if on_stack.get(&n).copied().unwrap_or(false) {
                    let l = low[&v].min(index[&n]);
                    low.insert(v, l);
                }
                continue;
            }
            let Some(done) = frames.pop() else { break };
            let v = done.node;
            if let Some(parent) = frames.last() {
                let l = low[&parent.node].min(low[&v]);
                low.insert(parent.node, l);
            }
            if low[&v] != index[&v] {
                continue;
            }
            // `v` roots a component: its members are on the stack down to `v`.
            let id = depth.len();
            let mut members = Vec::new();
            while let Some(m) = stack.pop() {
                on_stack.insert(m, false);
                component.insert(m, id);
                members.push(m);
                if m == v {
                    break;
                }
            }
            let weight: usize = members.iter().map(|&m| g.weight(m)).sum();
            let below = members
                .iter()
                .flat_map(|&m| g.next(m))
                .filter_map(|n| component.get(&n).copied())
                .filter(|&c| c != id)
                .map(|c| depth[c])
                .max()
                .unwrap_or(0);
            let d = weight.saturating_add(below);
            depth.push(d);
            deepest = deepest.max(d);
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

impl<'a> Schema<'a> {
    /// The value a local `$ref` (`#/json/pointer`, percent-encoded or not) points at.
    fn resolve(&self, r: &str) -> Option<&'a Value> {
        let pointer = r.strip_prefix('#')?;
        self.root.pointer(&percent_decoded(pointer))
    }

    /// The first `$ref` that does not resolve to a value inside the schema.
    fn unresolved(&self) -> Option<String> {
        self.index.values().find_map(|v| {
            let r = v.get("$ref")?.as_str()?;
            self.resolve(r).is_none().then(|| r.to_string())
        })
    }
}

/// `%XX` escapes decoded (invalid ones kept as they are).
fn percent_decoded(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).and_then(|&c| hex(c)),
            b.get(i + 2).and_then(|&c| hex(c)),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
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
                    .and_then(|r| self.resolve(r));
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
    longest_path(&g, &[node(schema)])
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
    fn weight(&self, n: usize) -> usize {
        1 + self.bodies.get(n).map_or(0, |b| b.1)
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
    // Each rule weighs 1 plus the depth of its own groups and embedded pieces: the compiler
    // recurses through both along a chain.
    let roots: Vec<usize> = (0..bodies.len()).collect();
    let rules = Rules { bodies };
    longest_path(&rules, &roots).max(scanned.nesting)
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
    // Deepens what the current rule embeds, and the grammar's deepest nesting.
    let embed = |current: &mut Option<(String, Body)>, out: &mut ScannedLark, d: usize| {
        if let Some((_, body)) = current.as_mut() {
            body.embedded = body.embedded.max(d);
        }
        out.nesting = out.nesting.max(d);
    };
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
            // Comments, as llguidance's lexer skips them: `#` or `//` to the end of the line.
            b'#' => i = line_end(b, i),
            b'/' if b.get(i + 1) == Some(&b'/') => i = line_end(b, i),
            b'"' => i = skip_quoted(b, i, b'"'),
            b'/' => {
                let end = skip_quoted(b, i, b'/');
                let inner = regex_depth(&String::from_utf8_lossy(&b[i..end]));
                embed(&mut current, &mut out, depth + inner);
                i = end;
            }
            // A special token, `<name>`: no rule names inside.
            b'<' => {
                let end = b[i + 1..]
                    .iter()
                    .position(|&x| x == b'<' || x == b'>' || x.is_ascii_whitespace())
                    .map_or(b.len(), |p| i + 1 + p);
                i = if b.get(end) == Some(&b'>') {
                    end + 1
                } else {
                    i + 1
                };
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
                        embed(&mut current, &mut out, depth + inner);
                        i = end;
                    }
                }
            }
            b'(' | b'[' | b'{' => {
                depth += 1;
                embed(&mut current, &mut out, depth);
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

fn line_end(b: &[u8], i: usize) -> usize {
    b[i..]
        .iter()
        .position(|&x| x == b'\n')
        .map_or(b.len(), |p| i + p)
}

fn ident_end(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'-') {
        i += 1;
    }
    i
}

/// The end of a literal opened by `quote` at `i`: past the closing quote and, for a regex, its
/// flags. As in llguidance's lexer, a regex may run over lines and a string may not (an unclosed
/// string ends at the line's end, an unclosed regex at the text's).
fn skip_quoted(b: &[u8], i: usize, quote: u8) -> usize {
    let mut j = i + 1;
    while j < b.len() && (quote == b'/' || b[j] != b'\n') {
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

    /// Tools' schemas that are not compiled: valid schemas pass (references outside them too),
    /// documents that are no schema are refused by what is wrong.
    #[test]
    fn tool_schemas_meet_the_meta_schema() {
        for ok in [
            json!({}),
            json!(true),
            json!({"type": "object", "properties": {"a": {"type": ["string", "null"]}}, "required": ["a"]}),
            json!({"$ref": "https://example.com/elsewhere.json"}),
        ] {
            check_tool_schema(&ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in [
            json!({"type": "objcet"}),
            json!({"type": "object", "properties": 5}),
            json!({"required": "x"}),
            json!({"minimum": "3"}),
            json!(5),
        ] {
            let e = check_tool_schema(&bad).expect_err("refused").to_string();
            assert!(e.contains("not a valid JSON schema"), "{bad}: {e}");
        }
    }

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
    fn what_a_review_found_hidden_is_counted() {
        // A regex over two lines must not hide the rule names after it.
        let mut g = String::from("start: r0\n");
        for i in 0..2_000 {
            g.push_str(&format!("r{i}: /a\n/ r{}\n", i + 1));
        }
        g.push_str("r2000: \"b\"\n");
        assert!(lark_depth(&g) > MAX_GRAMMAR_DEPTH);
        // Nor may special tokens or comments.
        let mut g = String::from("start: r0\n");
        for i in 0..2_000 {
            g.push_str(&format!(
                "r{i}: <a\"> r{} # a comment with \" and /\n",
                i + 1
            ));
        }
        g.push_str("r2000: \"b\"\n");
        assert!(lark_depth(&g) > MAX_GRAMMAR_DEPTH);
        // Groups add up along a chain: 20 rules of 20 nested groups each.
        let mut g = String::from("start: r0\n");
        for i in 0..20 {
            g.push_str(&format!(
                "r{i}: {}\"a\" r{}{}\n",
                "(".repeat(20),
                i + 1,
                ")".repeat(20)
            ));
        }
        g.push_str("r20: \"b\"\n");
        assert!(lark_depth(&g) > MAX_GRAMMAR_DEPTH);
        // A cycle entered late counts all its members: Y_i = anyOf[X_i, X_{i+1}], X_i -> Y_i,
        // with the Y's listed first.
        let t = 1_000;
        let mut defs = serde_json::Map::new();
        for i in (1..=t).rev() {
            defs.insert(
                format!("y{i}"),
                json!({"anyOf": [{"$ref": format!("#/$defs/x{i}")}, {"$ref": format!("#/$defs/x{}", i + 1)}]}),
            );
        }
        for i in 1..=t + 1 {
            defs.insert(
                format!("x{i}"),
                json!({"$ref": format!("#/$defs/y{}", i.min(t))}),
            );
        }
        let s = json!({"$defs": defs, "$ref": "#/$defs/x1"});
        assert!(schema_depth(&s) > MAX_GRAMMAR_DEPTH);
        // Percent-encoded pointers are followed; refs that lead nowhere are refused.
        let mut defs = serde_json::Map::new();
        for i in 0..1_000 {
            defs.insert(
                format!("d{i}"),
                json!({"$ref": format!("#/%24defs/d{}", i + 1)}),
            );
        }
        defs.insert("d1000".into(), json!({"type": "string"}));
        let s = json!({"$defs": defs, "$ref": "#/%24defs/d0"});
        assert!(schema_depth(&s) > MAX_GRAMMAR_DEPTH);
        let c = OutputConstraint::JsonSchema {
            schema: json!({"$ref": "https://example.com/s.json"}),
        };
        assert!(matches!(check(&c), Err(StructuredError::Limit(_))));
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
