//! `axle bench agent`: a multi-turn agent session through Anthropic's Messages API
//! (`POST /v1/messages`, streamed, over loopback): a long system prompt with tools, then turns
//! that each carry the whole conversation so far, as coding agents send them. Each turn's time to
//! first token is set against the first turn's: the prefix cache should serve everything but the
//! newest messages.
use crate::server::{post_lines, LocalServer};
use crate::BenchError;
use axle_models::Model;
use axle_sdk::{EngineConfig, Session};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

/// One turn's measurements.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AgentTurn {
    /// Prompt tokens the prefix cache did not serve (Anthropic's `input_tokens`).
    pub uncached_tokens: usize,
    /// Prompt tokens the prefix cache served.
    pub cached_tokens: usize,
    /// Time from sending the request to the first streamed delta, seconds.
    pub ttft_s: f64,
    /// Whether the reply called a tool (the next turn then returns its result).
    pub called_tool: bool,
}

/// A session's turns, in order.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AgentReport {
    /// The turns.
    pub turns: Vec<AgentTurn>,
}

/// What the user says at each turn (cycled).
const ASKS: [&str; 5] = [
    "A test fails after my last change. Which files would you read first?",
    "Read the first one.",
    "Summarize the failure in one line.",
    "Propose the smallest fix.",
    "Write the commit message for it.",
];

/// Tokens each reply may take.
const REPLY_TOKENS: usize = 32;

/// The tools every request offers.
fn tools() -> Value {
    let tool = |name: &str, description: &str, arg: &str| {
        json!({"name": name, "description": description,
               "input_schema": {"type": "object", "properties": {arg: {"type": "string"}}, "required": [arg]}})
    };
    json!([
        tool("read_file", "Read a file of the repository", "path"),
        tool(
            "run_command",
            "Run a shell command in the repository",
            "command"
        ),
        tool("search", "Search the repository for a string", "query"),
    ])
}

/// A system prompt of about `tokens` tokens for `model`: numbered working rules, as agents'
/// system prompts are written.
fn system_prompt(model: &Model, tokens: usize) -> String {
    const TOPICS: [&str; 8] = [
        "the scheduler",
        "the tokenizer",
        "the HTTP server",
        "error handling",
        "the build scripts",
        "the test suite",
        "the documentation",
        "the benchmarks",
    ];
    let mut text = String::from("You are a careful coding agent working in a Rust repository.\n");
    let mut i = 0;
    while model.tokenizer.encode(&text, false, false).len() < tokens {
        i += 1;
        text.push_str(&format!(
            "{i}. When a task touches {}, read the files involved before editing, keep each \
             change small and reviewable, run the tests that cover it, and say what you changed \
             and how you checked it.\n",
            TOPICS[i % TOPICS.len()]
        ));
    }
    text
}

/// A streamed reply: its content blocks (for the next turn's history) and measurements.
struct Reply {
    content: Vec<Value>,
    turn: AgentTurn,
}

/// Sends one streamed Messages request and reads its events.
fn ask(port: u16, body: &Value) -> Result<Reply, BenchError> {
    let started = Instant::now();
    let lines = post_lines(port, "/v1/messages", body)?;
    let mut first = None;
    let (mut uncached_tokens, mut cached_tokens) = (0, 0);
    let mut content: Vec<Value> = Vec::new();
    let mut json_args: Vec<String> = Vec::new();
    let mut status_ok = None;
    for line in lines {
        let line = line?;
        if status_ok.is_none() {
            status_ok = Some(line.contains(" 200 "));
            if status_ok == Some(false) {
                return Err(BenchError::Invalid(format!("/v1/messages answered {line}")));
            }
        }
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let ev: Value = serde_json::from_str(data)
            .map_err(|e| BenchError::Invalid(format!("bad event {data}: {e}")))?;
        match ev["type"].as_str().unwrap_or("") {
            "message_delta" => {
                let u = &ev["usage"];
                uncached_tokens = u["input_tokens"].as_u64().unwrap_or(0) as usize;
                cached_tokens = u["cache_read_input_tokens"].as_u64().unwrap_or(0) as usize;
            }
            "content_block_start" => {
                content.push(ev["content_block"].clone());
                json_args.push(String::new());
            }
            "content_block_delta" => {
                first.get_or_insert_with(Instant::now);
                let (Some(block), Some(args)) = (content.last_mut(), json_args.last_mut()) else {
                    continue;
                };
                let d = &ev["delta"];
                match d["type"].as_str().unwrap_or("") {
                    "text_delta" => {
                        let text = block["text"].as_str().unwrap_or("").to_string()
                            + d["text"].as_str().unwrap_or("");
                        block["text"] = Value::String(text);
                    }
                    "input_json_delta" => args.push_str(d["partial_json"].as_str().unwrap_or("")),
                    _ => {}
                }
            }
            "error" => {
                return Err(BenchError::Invalid(format!("the stream failed: {data}")));
            }
            "message_stop" => break,
            _ => {}
        }
    }
    // Tool calls: their arguments arrive as JSON text.
    for (block, args) in content.iter_mut().zip(json_args) {
        if block["type"] == "tool_use" && !args.is_empty() {
            block["input"] = serde_json::from_str(&args).unwrap_or_else(|_| json!({}));
        }
    }
    // Thinking is not sent back; empty text blocks are not either.
    content
        .retain(|b| b["type"] == "tool_use" || b["text"].as_str().is_some_and(|t| !t.is_empty()));
    let called_tool = content.iter().any(|b| b["type"] == "tool_use");
    let first = first.ok_or_else(|| BenchError::Invalid("a reply streamed nothing".into()))?;
    Ok(Reply {
        content,
        turn: AgentTurn {
            uncached_tokens,
            cached_tokens,
            ttft_s: (first - started).as_secs_f64(),
            called_tool,
        },
    })
}

/// Runs a session of `turns` turns after a system prompt of about `system_tokens` tokens, on
/// `model` (loaded by the caller), through a server of its own with the prefix cache on.
pub fn run(
    model: &Arc<Model>,
    turns: usize,
    system_tokens: usize,
) -> Result<AgentReport, BenchError> {
    let context = system_tokens + turns * (REPLY_TOKENS + 200) + 512;
    let session = Arc::new(Session::new(
        model.clone(),
        EngineConfig {
            context,
            kv_slots: (2 * context) as u32,
            draft_len: 0,
            ..Default::default()
        },
    )?);
    let server = LocalServer::start(session, 1)?;
    let system = system_prompt(model, system_tokens);
    let mut messages: Vec<Value> = Vec::new();
    let mut pending_calls: Vec<Value> = Vec::new();
    let mut report = AgentReport { turns: Vec::new() };
    for t in 0..turns {
        let mut user: Vec<Value> = pending_calls
            .drain(..)
            .map(|call| {
                json!({"type": "tool_result", "tool_use_id": call["id"],
                       "content": format!("(output of {})", call["name"])})
            })
            .collect();
        user.push(json!({"type": "text", "text": ASKS[t % ASKS.len()]}));
        messages.push(json!({"role": "user", "content": user}));
        let reply = ask(
            server.port,
            &json!({"model": "bench", "system": system, "tools": tools(), "messages": messages,
                    "max_tokens": REPLY_TOKENS, "temperature": 0, "stream": true}),
        )?;
        pending_calls = reply
            .content
            .iter()
            .filter(|b| b["type"] == "tool_use")
            .cloned()
            .collect();
        let content = if reply.content.is_empty() {
            vec![json!({"type": "text", "text": "(no answer)"})]
        } else {
            reply.content
        };
        messages.push(json!({"role": "assistant", "content": content}));
        report.turns.push(reply.turn);
    }
    Ok(report)
}
