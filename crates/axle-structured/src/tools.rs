//! Tool (function) calling: OpenAI's tool definitions, the call formats of model families, the
//! grammar that makes a model write a valid call, and the parser that finds calls in its text.
//!
//! A chat template that renders `tools` also defines how the model writes a call; the format is
//! recognised from the template's text. A template that does not render tools (SmolLM2's,
//! Gemma 3's) gets the tools as a system prompt in the Hermes format (`<tool_call>` tags around
//! `{"name": ..., "arguments": ...}`), which Qwen's templates also use.
use crate::format::{json_layout, with_layout};
use crate::{OutputConstraint, StructuredError};
use serde_json::{json, Value};

/// Which tool, if any, the model must call (OpenAI's `tool_choice`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides; calls found in its text are returned as calls.
    #[default]
    Auto,
    /// No call: tools are not shown to the model.
    None,
    /// At least one call, of any tool (decoding constrained to a valid call).
    Required,
    /// A call of this function (decoding constrained to it).
    Function(String),
}

/// One function tool.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDef {
    /// Function name.
    pub name: String,
    /// What it does.
    pub description: Option<String>,
    /// JSON schema of its arguments.
    pub parameters: Value,
}

/// Reads OpenAI's `tools` list (`[{type: "function", function: {name, description,
/// parameters}}]`).
pub fn parse_tools(tools: &Value) -> Result<Vec<ToolDef>, StructuredError> {
    let bad = |m: String| Err(StructuredError::Invalid(m));
    let Some(list) = tools.as_array() else {
        return bad("must be a list of tools".into());
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return bad(format!(
                "tools[{i}]: only tools of type \"function\" are supported"
            ));
        }
        let Some(f) = t.get("function") else {
            return bad(format!("tools[{i}]: `function` is missing"));
        };
        let Some(name) = f.get("name").and_then(Value::as_str) else {
            return bad(format!("tools[{i}].function.name is missing"));
        };
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return bad(format!(
                "tools[{i}].function.name must be letters, digits, `_` or `-`"
            ));
        }
        if out.iter().any(|d: &ToolDef| d.name == name) {
            return bad(format!("tools[{i}]: `{name}` is defined twice"));
        }
        let parameters = f
            .get("parameters")
            .cloned()
            .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
        if !parameters.is_object() {
            return bad(format!(
                "tools[{i}].function.parameters must be a JSON schema object"
            ));
        }
        out.push(ToolDef {
            name: name.to_string(),
            description: f
                .get("description")
                .and_then(Value::as_str)
                .map(str::to_string),
            parameters,
        });
    }
    if out.is_empty() {
        return bad("must not be empty".into());
    }
    Ok(out)
}

/// How a model family writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one block per call
    /// (Hermes, Qwen 2.5/3, and Axle's prompt for templates without tools).
    Hermes,
    /// A bare `{"name": ..., "parameters": {...}}` object (Llama 3.1+), calls separated by `;`.
    Llama3,
    /// `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (Mistral).
    Mistral,
}

/// How a model's chat template handles tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolSupport {
    /// The call format.
    pub format: ToolFormat,
    /// Whether the template renders `tools` itself (else Axle adds a system prompt).
    pub template_renders_tools: bool,
}

impl ToolSupport {
    /// Recognises the format from the template's source.
    pub fn of_template(source: Option<&str>) -> ToolSupport {
        let src = source.unwrap_or("");
        let renders = src.contains("tools");
        let format = if !renders || src.contains("<tool_call>") {
            ToolFormat::Hermes
        } else if src.contains("[TOOL_CALLS]") {
            ToolFormat::Mistral
        } else if src.contains("<|start_header_id|>") {
            ToolFormat::Llama3
        } else {
            ToolFormat::Hermes
        };
        ToolSupport {
            format,
            template_renders_tools: renders,
        }
    }
}

/// The system prompt that shows tools to a model whose template does not render them.
pub fn system_prompt(tools: &[ToolDef]) -> String {
    let mut s = String::from(
        "You may call one or more functions to help with the user's request. The functions \
         are described in JSON inside <tools></tools>:\n<tools>\n",
    );
    for t in tools {
        let f = json!({"type": "function", "function": {
            "name": t.name, "description": t.description, "parameters": t.parameters}});
        s.push_str(&f.to_string());
        s.push('\n');
    }
    s.push_str(
        "</tools>\nTo call a function, reply with a JSON object of its name and arguments inside \
         <tool_call></tool_call> tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": \
         <args-json-object>}\n</tool_call>",
    );
    s
}

/// A call as an assistant message's text, for templates that do not render `tool_calls`.
pub fn render_call(name: &str, arguments: &Value) -> String {
    format!(
        "<tool_call>\n{}\n</tool_call>",
        json!({"name": name, "arguments": arguments})
    )
}

/// A tool result as a user message's text, for templates without a `tool` role.
pub fn render_result(content: &str) -> String {
    format!("<tool_response>\n{content}\n</tool_response>")
}

/// The constraint that makes the model call tools: one call (or one or more with `parallel`) of
/// `tools`, or one call of the named one. With `or_answer`, a JSON answer of that schema is the other
/// choice (`tool_choice: auto` with `response_format`).
pub fn call_constraint(
    format: ToolFormat,
    tools: &[ToolDef],
    choice: &ToolChoice,
    parallel: bool,
    or_answer: Option<&Value>,
) -> Result<OutputConstraint, StructuredError> {
    let chosen: Vec<&ToolDef> = match choice {
        ToolChoice::Function(name) => match tools.iter().find(|t| &t.name == name) {
            Some(t) => vec![t],
            None => {
                return Err(StructuredError::Invalid(format!(
                    "function `{name}` is not among the tools"
                )))
            }
        },
        _ => tools.iter().collect(),
    };
    // A named function is one call of it.
    let parallel = parallel && !matches!(choice, ToolChoice::Function(_));
    let args_key = match format {
        ToolFormat::Llama3 => "parameters",
        _ => "arguments",
    };
    let variants: Vec<Value> = chosen
        .iter()
        .map(|t| {
            json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, args_key: t.parameters},
                "required": ["name", args_key],
                "additionalProperties": false,
            })
        })
        .collect();
    let mut call_schema = json!({"anyOf": variants});
    call_schema["x-guidance"] = json_layout();
    let call = format!("%json {call_schema}");
    let mut lark = match (format, parallel) {
        (ToolFormat::Hermes, false) => {
            format!("start: calls\ncalls: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: {call}\n")
        }
        (ToolFormat::Hermes, true) => format!(
            "start: calls\ncalls: one (\"\\n\" one)*\none: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: {call}\n"
        ),
        (ToolFormat::Llama3, false) => format!("start: calls\ncalls: call\ncall: {call}\n"),
        (ToolFormat::Llama3, true) => {
            format!("start: calls\ncalls: call (\"; \" call)*\ncall: {call}\n")
        }
        (ToolFormat::Mistral, false) => format!("start: calls\ncalls: \"[\" call \"]\"\ncall: {call}\n"),
        (ToolFormat::Mistral, true) => {
            format!("start: calls\ncalls: \"[\" call (\", \" call)* \"]\"\ncall: {call}\n")
        }
    };
    if let Some(schema) = or_answer {
        let answer = with_layout(schema)?;
        lark = lark.replacen("start: calls", "start: calls | answer", 1);
        lark.push_str(&format!("answer: %json {answer}\n"));
    }
    Ok(OutputConstraint::Grammar { lark })
}

/// A call found in the model's text.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// Function name.
    pub name: String,
    /// Arguments, a JSON object as text.
    pub arguments: String,
}

/// Finds tool calls in generated text as it streams: text that cannot be part of a call is
/// released at once, the rest is held until [`ToolCallParser::finish`].
#[derive(Debug)]
pub struct ToolCallParser {
    format: ToolFormat,
    /// The functions that exist (a call of another one stays text).
    names: Vec<String>,
    held: String,
    released_any: bool,
    holding: bool,
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const MISTRAL_OPEN: &str = "[TOOL_CALLS]";
const PYTHON_TAG: &str = "<|python_tag|>";

impl ToolCallParser {
    /// A parser for `format` that accepts calls of the functions `names`.
    pub fn new(format: ToolFormat, names: Vec<String>) -> ToolCallParser {
        ToolCallParser {
            format,
            names,
            held: String::new(),
            released_any: false,
            holding: false,
        }
    }

    /// Takes generated text; returns what can be shown as content now.
    pub fn push(&mut self, text: &str) -> String {
        self.held.push_str(text);
        if self.holding {
            return String::new();
        }
        match self.format {
            ToolFormat::Hermes => {
                if let Some(i) = self.held.find(HERMES_OPEN) {
                    self.holding = true;
                    return self.release(i);
                }
                // Keep a tail that may be the start of the tag.
                let keep = partial_suffix(&self.held, HERMES_OPEN);
                self.release(self.held.len() - keep)
            }
            ToolFormat::Llama3 | ToolFormat::Mistral => {
                // Calls are the whole reply: decide on its first non-space characters.
                let t = self.held.trim_start();
                if self.released_any {
                    return self.release(self.held.len());
                }
                if t.is_empty() {
                    return String::new();
                }
                let opens: &[&str] = match self.format {
                    ToolFormat::Llama3 => &["{", PYTHON_TAG],
                    _ => &["[", MISTRAL_OPEN],
                };
                if opens.iter().any(|o| t.starts_with(o)) {
                    self.holding = true;
                    return String::new();
                }
                if opens.iter().any(|o| o.starts_with(t)) {
                    return String::new();
                }
                self.release(self.held.len())
            }
        }
    }

    fn release(&mut self, n: usize) -> String {
        let out: String = self.held.drain(..n).collect();
        if !out.is_empty() {
            self.released_any = true;
        }
        out
    }

    /// The rest of the content (text that was held but is not a call) and the calls. A reply
    /// that calls a function not among the tools is text.
    pub fn finish(self) -> (String, Vec<ToolCall>) {
        let (content, calls) = self.parse();
        if calls.iter().all(|c| self.names.contains(&c.name)) {
            (content, calls)
        } else {
            (self.held, Vec::new())
        }
    }

    fn parse(&self) -> (String, Vec<ToolCall>) {
        let text = self.held.clone();
        match self.format {
            ToolFormat::Hermes => parse_hermes(&text),
            ToolFormat::Llama3 => {
                // One or more objects separated by `;` (a `;` inside a string is the string's).
                let mut body = text.trim().trim_start_matches(PYTHON_TAG).trim();
                let mut calls = Vec::new();
                while !body.is_empty() {
                    let mut values = serde_json::Deserializer::from_str(body).into_iter::<Value>();
                    let call = match values.next() {
                        Some(Ok(v)) => call_of_value(&v, "parameters"),
                        _ => None,
                    };
                    let Some(call) = call else {
                        return (text, Vec::new());
                    };
                    calls.push(call);
                    body = body[values.byte_offset()..].trim_start();
                    body = body.strip_prefix(';').unwrap_or(body).trim_start();
                }
                if calls.is_empty() {
                    return (text, Vec::new());
                }
                (String::new(), calls)
            }
            ToolFormat::Mistral => {
                let body = text.trim().trim_start_matches(MISTRAL_OPEN).trim();
                let Ok(Value::Array(items)) = serde_json::from_str::<Value>(body) else {
                    return (text, Vec::new());
                };
                let calls: Option<Vec<ToolCall>> = items
                    .iter()
                    .map(|v| call_of(&v.to_string(), "arguments"))
                    .collect();
                match calls {
                    Some(c) if !c.is_empty() => (String::new(), c),
                    _ => (text, Vec::new()),
                }
            }
        }
    }
}

/// The longest suffix of `s` that is a proper prefix of `tag`.
fn partial_suffix(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&k| s.is_char_boundary(s.len() - k) && tag.starts_with(&s[s.len() - k..]))
        .unwrap_or(0)
}

/// `{"name": ..., <args_key>: {...}}` (or `arguments` in any case) as a call.
fn call_of(text: &str, args_key: &str) -> Option<ToolCall> {
    call_of_value(&serde_json::from_str(text).ok()?, args_key)
}

fn call_of_value(v: &Value, args_key: &str) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v.get(args_key).or_else(|| v.get("arguments"))?;
    let arguments = match args {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    Some(ToolCall { name, arguments })
}

fn parse_hermes(text: &str) -> (String, Vec<ToolCall>) {
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(HERMES_OPEN) {
        content.push_str(&rest[..i]);
        let after = &rest[i + HERMES_OPEN.len()..];
        let Some(j) = after.find(HERMES_CLOSE) else {
            // An unclosed block: a call if its JSON is complete (generation stopped at the tag).
            match call_of(after.trim(), "arguments") {
                Some(c) => calls.push(c),
                None => content.push_str(&rest[i..]),
            }
            rest = "";
            break;
        };
        match call_of(after[..j].trim(), "arguments") {
            Some(c) => calls.push(c),
            None => content.push_str(&rest[i..i + HERMES_OPEN.len() + j + HERMES_CLOSE.len()]),
        }
        rest = &after[j + HERMES_CLOSE.len()..];
    }
    content.push_str(rest);
    if !calls.is_empty() {
        content = content.trim().to_string();
    }
    (content, calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<ToolDef> {
        parse_tools(&json!([
            {"type": "function", "function": {"name": "get_weather", "parameters":
                {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "add", "description": "Adds", "parameters":
                {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}
        ]))
        .unwrap()
    }

    fn names() -> Vec<String> {
        vec!["get_weather".into(), "add".into()]
    }

    #[test]
    fn tool_definitions_are_checked() {
        assert_eq!(tools().len(), 2);
        for (bad, says) in [
            (json!({}), "list"),
            (json!([]), "empty"),
            (json!([{"type": "code"}]), "function"),
            (json!([{"type": "function"}]), "missing"),
            (
                json!([{"type": "function", "function": {"name": "a b"}}]),
                "letters",
            ),
            (
                json!([{"type": "function", "function": {"name": "f", "parameters": 3}}]),
                "schema",
            ),
        ] {
            let e = parse_tools(&bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn hermes_calls_stream_and_parse() {
        let mut p = ToolCallParser::new(ToolFormat::Hermes, names());
        let mut shown = String::new();
        for piece in [
            "Let me ",
            "check.<tool",
            "_call>\n{\"name\": \"get_weather\", ",
            "\"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
        ] {
            shown.push_str(&p.push(piece));
        }
        assert_eq!(shown, "Let me check.");
        let (rest, calls) = p.finish();
        assert_eq!(rest, "");
        assert_eq!(
            calls,
            vec![ToolCall {
                name: "get_weather".into(),
                arguments: "{\"city\":\"Oslo\"}".into()
            }]
        );
        // Text with a broken block stays text.
        let mut p = ToolCallParser::new(ToolFormat::Hermes, names());
        p.push("<tool_call>not json</tool_call>");
        assert_eq!(
            p.finish(),
            ("<tool_call>not json</tool_call>".into(), vec![])
        );
        // A tag-like tail is released when it turns out not to be a tag.
        let mut p = ToolCallParser::new(ToolFormat::Hermes, names());
        assert_eq!(p.push("a <to"), "a ");
        assert_eq!(p.push("p>"), "<top>");
    }

    #[test]
    fn llama3_and_mistral_calls_parse() {
        let mut p = ToolCallParser::new(ToolFormat::Llama3, names());
        assert_eq!(
            p.push("{\"name\": \"add\", \"parameters\": {\"a\": 1}}"),
            ""
        );
        assert_eq!(p.finish().1[0].arguments, "{\"a\":1}");
        let mut p = ToolCallParser::new(ToolFormat::Llama3, names());
        assert_eq!(p.push("Hello"), "Hello");
        assert!(p.finish().1.is_empty());
        let mut p = ToolCallParser::new(ToolFormat::Mistral, names());
        p.push("[{\"name\": \"add\", \"arguments\": {\"a\": 1}}, {\"name\": \"add\", \"arguments\": {}}]");
        assert_eq!(p.finish().1.len(), 2);
        // `;` inside a string is the string's; two calls are split at the `;` between them.
        let mut p = ToolCallParser::new(ToolFormat::Llama3, names());
        p.push("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"a; b\"}}; {\"name\": \"add\", \"parameters\": {}}");
        let calls = p.finish().1;
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].arguments, "{\"city\":\"a; b\"}");
        // A call of a function that does not exist is text.
        let mut p = ToolCallParser::new(ToolFormat::Hermes, names());
        p.push("<tool_call>{\"name\": \"rm\", \"arguments\": {}}</tool_call>");
        let (text, calls) = p.finish();
        assert!(calls.is_empty() && text.contains("rm"), "{text}");
    }

    #[test]
    fn formats_come_from_templates() {
        let s =
            ToolSupport::of_template(Some("{% for m in messages %}{{ m.content }}{% endfor %}"));
        assert_eq!(s.format, ToolFormat::Hermes);
        assert!(!s.template_renders_tools);
        let s = ToolSupport::of_template(Some("{% if tools %}<tool_call>{% endif %}"));
        assert!(s.template_renders_tools && s.format == ToolFormat::Hermes);
        let s = ToolSupport::of_template(Some("{% if tools %}[TOOL_CALLS]{% endif %}"));
        assert_eq!(s.format, ToolFormat::Mistral);
        let s = ToolSupport::of_template(Some("{% if tools %}<|start_header_id|>{% endif %}"));
        assert_eq!(s.format, ToolFormat::Llama3);
    }

    #[test]
    fn call_grammars_name_the_tools() {
        let t = tools();
        let c = call_constraint(
            ToolFormat::Hermes,
            &t,
            &ToolChoice::Function("add".into()),
            false,
            None,
        )
        .unwrap();
        let OutputConstraint::Grammar { lark } = c else {
            panic!()
        };
        assert!(
            lark.contains("\"const\":\"add\"") && !lark.contains("get_weather"),
            "{lark}"
        );
        assert!(call_constraint(
            ToolFormat::Hermes,
            &t,
            &ToolChoice::Function("nope".into()),
            false,
            None
        )
        .is_err());
    }
}
