//! Structured output and tools on the native route: how tools reach the prompt, which constraint
//! a request's output follows, and the model's grammar engine (built at the first constrained
//! request).
use crate::request::{Field, GenerateRequest, Prompt, Rejection};
use axle_models::{ChatMessage, Model, TokenKind};
use axle_structured::tools::{
    call_constraint, parse_tools, render_call, render_result, system_prompt, ToolChoice,
    ToolFormat, ToolSupport,
};
use axle_structured::{GrammarEngine, OutputConstraint, Vocabulary};
use serde_json::Value;
use std::sync::{Arc, OnceLock};

/// What a request's tools and format mean for this model.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// The messages to render (rewritten when the template has no tools), for chat prompts.
    pub messages: Option<Vec<ChatMessage>>,
    /// `tools` for the template, when it renders them.
    pub template_tools: Option<Value>,
    /// The output constraint and the field it came from.
    pub constraint: Option<(OutputConstraint, Field)>,
    /// The call format to look for in the output, and the functions that exist.
    pub tool_format: Option<(ToolFormat, Vec<String>)>,
    /// The tools' parameter schemas when the model may call them but need not (`tool_choice:
    /// auto` without a format): checked against the grammar limits only, never compiled.
    pub tool_check: Vec<Value>,
    /// The constraint is a grammar of JSON (tool calls): bound its runs of digits as for JSON.
    pub json_grammar: bool,
}

/// Works out the plan of `req` for a model whose template source is `template`.
pub(crate) fn plan(req: &GenerateRequest, template: Option<&str>) -> Result<Plan, Rejection> {
    let mut plan = Plan {
        constraint: req.format.clone().map(|f| (f, Field::ResponseFormat)),
        ..Plan::default()
    };
    let Prompt::Chat(messages) = &req.prompt else {
        return Ok(plan);
    };
    let support = ToolSupport::of_template(template);
    let tools = match &req.tools {
        Some(t) if req.tool_choice != ToolChoice::None => {
            Some(parse_tools(t).map_err(|e| Rejection::invalid(Field::Tools, e.to_string()))?)
        }
        _ => None,
    };
    let mut msgs = messages.clone();
    let has_tool_turns = msgs
        .iter()
        .any(|m| m.role == "tool" || m.tool_calls.is_some());
    if !support.template_renders_tools && has_tool_turns {
        msgs = without_tool_roles(&msgs);
    }
    let Some(tools) = tools else {
        plan.messages = Some(msgs);
        return Ok(plan);
    };
    if support.template_renders_tools {
        plan.template_tools = req.tools.clone();
    } else {
        msgs = with_system_prompt(msgs, &system_prompt(&tools));
    }
    plan.messages = Some(msgs);
    plan.tool_format = Some((
        support.format,
        tools.iter().map(|t| t.name.clone()).collect(),
    ));
    let forced = matches!(
        req.tool_choice,
        ToolChoice::Required | ToolChoice::Function(_)
    );
    let answer_schema = match &req.format {
        None => None,
        Some(OutputConstraint::JsonObject) => Some(serde_json::json!({"type": "object"})),
        Some(OutputConstraint::JsonSchema { schema }) if schema.is_object() => Some(schema.clone()),
        Some(OutputConstraint::JsonSchema { .. }) => {
            return Err(Rejection::invalid(
                Field::ResponseFormat,
                "a JSON schema must be an object",
            ))
        }
        Some(_) => {
            return Err(Rejection::unsupported(
                Field::ResponseFormat,
                "with tools, only JSON formats can be combined",
            ))
        }
    };
    if forced && answer_schema.is_some() {
        return Err(Rejection::unsupported(
            Field::ResponseFormat,
            "a required tool call leaves no room for a response_format answer",
        ));
    }
    if !forced && answer_schema.is_none() {
        plan.tool_check = tools.iter().map(|t| t.parameters.clone()).collect();
        return Ok(plan);
    }
    let c = call_constraint(
        support.format,
        &tools,
        &req.tool_choice,
        req.parallel_tool_calls,
        answer_schema.as_ref(),
    )
    .map_err(|e| Rejection::invalid(Field::ToolChoice, e.to_string()))?;
    let field = if forced {
        Field::Tools
    } else {
        Field::ResponseFormat
    };
    plan.constraint = Some((c, field));
    plan.json_grammar = true;
    Ok(plan)
}

/// Messages for a template with no tool roles: calls become the assistant's text, results a
/// user message, and neighbours of the same role merge (templates that insist on alternating
/// roles accept them).
fn without_tool_roles(msgs: &[ChatMessage]) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(msgs.len());
    for m in msgs {
        let mut m2 = ChatMessage::new(&m.role, &m.content);
        if m.role == "tool" {
            m2 = ChatMessage::new("user", &render_result(&m.content));
        }
        if let Some(Value::Array(calls)) = &m.tool_calls {
            for c in calls {
                let f = c.get("function").unwrap_or(c);
                let name = f.get("name").and_then(Value::as_str).unwrap_or("");
                let args = f.get("arguments").cloned().unwrap_or(Value::Null);
                if !m2.content.is_empty() {
                    m2.content.push('\n');
                }
                m2.content.push_str(&render_call(name, &args));
            }
        }
        match out.last_mut() {
            Some(prev) if prev.role == m2.role && m2.role != "system" => {
                prev.content.push('\n');
                prev.content.push_str(&m2.content);
            }
            _ => out.push(m2),
        }
    }
    out
}

/// `msgs` with `prompt` in the system message (added first when there is none).
fn with_system_prompt(mut msgs: Vec<ChatMessage>, prompt: &str) -> Vec<ChatMessage> {
    match msgs.first_mut() {
        Some(m) if m.role == "system" => {
            m.content = format!("{}\n\n{prompt}", m.content);
        }
        _ => msgs.insert(0, ChatMessage::new("system", prompt)),
    }
    msgs
}

/// The model's vocabulary for the grammar engine.
pub(crate) fn vocabulary(model: &Arc<Model>) -> Vocabulary {
    let tok = &model.tokenizer;
    let n = tok.len();
    let mut tokens = Vec::with_capacity(n);
    let mut control = Vec::with_capacity(n);
    for t in 0..n as u32 {
        let kind = tok.kind(t);
        let is_control = matches!(kind, Some(TokenKind::Control | TokenKind::Unknown));
        tokens.push(if is_control {
            tok.piece(t, true)
        } else {
            tok.piece(t, false)
        });
        control.push(is_control);
    }
    let m = model.clone();
    Vocabulary {
        tokens,
        control,
        eos: tok.eog_tokens().to_vec(),
        tokenize: Arc::new(move |s: &str| m.tokenizer.encode(s, false, false)),
        canonical: !tok.adds_space_prefix(),
    }
}

/// Whether constraint masks should be computed on worker threads while the model runs: when the
/// model runs on a GPU, or its CPU threads leave a core free. Where every core runs the model
/// there is no idle core to overlap on: the worker's round trips cost about what the overlap
/// saves (measured within noise on 2 cores), so masks are computed in place and a request holds
/// no thread.
pub(crate) fn overlap_masks(model: &Model) -> bool {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    model.placement().uses_accelerator() || cores > model.threads()
}

/// A model's grammar engine, built once on first use.
#[derive(Debug, Default)]
pub(crate) struct GrammarSlot(OnceLock<Result<GrammarEngine, String>>);

impl GrammarSlot {
    /// The engine (built now if this is the first constrained request).
    pub(crate) fn get(&self, model: &Arc<Model>) -> Result<&GrammarEngine, Rejection> {
        self.0
            .get_or_init(|| GrammarEngine::new(vocabulary(model)).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| {
                Rejection::unsupported(
                    Field::ResponseFormat,
                    format!("constrained decoding is not available for this model: {e}"),
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tool_roles_become_text_for_templates_without_tools() {
        let mut call = ChatMessage::new("assistant", "");
        call.tool_calls = Some(json!([{"type": "function", "function":
            {"name": "add", "arguments": {"a": 1}}}]));
        let msgs = vec![
            ChatMessage::new("user", "1+1?"),
            call,
            ChatMessage::new("tool", "2"),
            ChatMessage::new("tool", "3"),
        ];
        let out = without_tool_roles(&msgs);
        assert_eq!(out.len(), 3);
        assert_eq!(out[1].role, "assistant");
        assert!(out[1].content.contains("<tool_call>") && out[1].content.contains("\"add\""));
        assert_eq!(out[2].role, "user");
        assert_eq!(
            out[2].content,
            "<tool_response>\n2\n</tool_response>\n<tool_response>\n3\n</tool_response>"
        );
        let with = with_system_prompt(out, "TOOLS");
        assert_eq!(with[0].role, "system");
        assert_eq!(with[0].content, "TOOLS");
    }

    #[test]
    fn required_calls_and_formats_make_constraints() {
        let tools = json!([{"type": "function", "function": {"name": "add", "parameters":
            {"type": "object", "properties": {"a": {"type": "number"}}}}}]);
        let mut req = GenerateRequest::new(vec![ChatMessage::new("user", "hi")]);
        req.tools = Some(tools);
        let p = plan(&req, None).unwrap();
        assert!(p.constraint.is_none(), "auto: no constraint");
        assert_eq!(p.tool_format.map(|f| f.0), Some(ToolFormat::Hermes));
        assert!(p.messages.unwrap()[0].content.contains("<tools>"));
        req.tool_choice = ToolChoice::Required;
        assert_eq!(
            plan(&req, None).unwrap().constraint.unwrap().1,
            Field::Tools
        );
        req.format = Some(OutputConstraint::JsonObject);
        assert_eq!(plan(&req, None).unwrap_err().field(), Field::ResponseFormat);
        req.tool_choice = ToolChoice::Auto;
        assert!(plan(&req, None).unwrap().constraint.is_some());
        req.tool_choice = ToolChoice::Function("nope".into());
        req.format = None;
        assert_eq!(plan(&req, None).unwrap_err().field(), Field::ToolChoice);
        req.tool_choice = ToolChoice::None;
        let p = plan(&req, None).unwrap();
        assert!(p.tool_format.is_none() && p.constraint.is_none());
    }
}
