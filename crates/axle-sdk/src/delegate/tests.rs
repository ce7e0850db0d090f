//! Tests of the delegated route's request bodies, refusals and SSE parsing (no server needed).
use super::*;
use axle_models::ChatMessage;

fn upstream(kind: RuntimeKind) -> Upstream {
    Upstream {
        kind,
        base: "http://x".into(),
        model: "m".into(),
        api_key: None,
        timeout: Duration::from_secs(1),
        http: reqwest::Client::new(),
    }
}

#[test]
fn urls_normalize() {
    assert_eq!(normalize_url("http://h:1/v1/"), "http://h:1");
    assert_eq!(normalize_url("http://h:1"), "http://h:1");
    assert_eq!(normalize_url(" http://h:1/ "), "http://h:1");
}

#[test]
fn sampling_fields_are_passed_through_and_renamed_for_llama_cpp() {
    let mut req = GenerateRequest::new("hi").seed(7).max_tokens(16).stop("\n");
    req.sampling.temperature = Some(0.5);
    req.sampling.top_p = Some(0.9);
    req.sampling.top_k = Some(40);
    req.sampling.min_p = Some(0.05);
    req.sampling.repetition_penalty = Some(1.1);
    let b = upstream(RuntimeKind::LlamaCpp).body(&req, true);
    assert_eq!(b["repeat_penalty"], json!(1.1f32));
    assert!(b.get("repetition_penalty").is_none());
    assert_eq!(b["top_k"], 40);
    assert_eq!(b["min_p"], json!(0.05f32));
    assert_eq!(b["seed"], 7);
    assert_eq!(b["stop"], json!(["\n"]));
    assert_eq!(b["max_tokens"], 16);
    assert_eq!(b["prompt"], "hi");
    assert_eq!(b["stream"], true);
    let b = upstream(RuntimeKind::OpenaiCompatible).body(&req, false);
    assert_eq!(b["repetition_penalty"], json!(1.1f32));
    assert!(b.get("repeat_penalty").is_none() && b.get("stream").is_none());
    // Unset fields are left to the upstream's defaults.
    let b = upstream(RuntimeKind::OpenaiCompatible).body(
        &GenerateRequest::new(vec![ChatMessage::new("user", "q")]),
        false,
    );
    assert_eq!(
        b,
        json!({"model": "m", "messages": [{"role": "user", "content": "q"}]})
    );
    // The template's variables go as chat_template_kwargs.
    let req = GenerateRequest::new(vec![ChatMessage::new("user", "q")])
        .template_arg("enable_thinking", json!(false));
    let b = upstream(RuntimeKind::LlamaCpp).body(&req, false);
    assert_eq!(b["chat_template_kwargs"], json!({"enable_thinking": false}));
}

#[test]
fn what_no_upstream_can_honour_is_refused_by_name() {
    let up = upstream(RuntimeKind::OpenaiCompatible);
    let field = |r: GenerateRequest| up.check(&r).expect_err("refused").field();
    assert!(up.check(&GenerateRequest::new("hi")).is_ok());
    assert_eq!(field(GenerateRequest::new(vec![1u32, 2])), Field::Prompt);
    let mut r = GenerateRequest::new("hi");
    r.tools = Some(json!([]));
    assert_eq!(field(r), Field::Tools);
    let r = GenerateRequest::new("hi").format(OutputConstraint::Regex {
        pattern: "a+".into(),
    });
    assert_eq!(field(r), Field::ResponseFormat);
    let mut r = GenerateRequest::new("hi");
    r.n = 2;
    assert_eq!(field(r), Field::N);
    let mut r = GenerateRequest::new("hi");
    r.logprobs = Some(0);
    assert_eq!(field(r), Field::Logprobs);
    let mut r = GenerateRequest::new("hi");
    r.logit_bias = vec![(1, 1.0)];
    assert_eq!(
        field(r),
        Field::Sampling(axle_core::SamplingField::LogitBias)
    );
    let mut r = GenerateRequest::new("hi");
    r.stop_tokens = vec![1];
    assert_eq!(field(r), Field::StopTokens);
    let mut r = GenerateRequest::new("hi");
    r.ignore_eos = true;
    assert_eq!(field(r.clone()), Field::IgnoreEos);
    // llama.cpp's server reads ignore_eos.
    let llama = upstream(RuntimeKind::LlamaCpp);
    assert!(llama.check(&r).is_ok());
    assert_eq!(llama.body(&r, false)["ignore_eos"], true);
}

fn drain(p: &mut SseParser) -> Vec<Result<Chunk, String>> {
    std::iter::from_fn(|| p.next_event("u"))
        .map(|r| r.map_err(|e| e.to_string()))
        .collect()
}

#[test]
fn sse_in_arbitrary_pieces() {
    let body = concat!(
        ": keep-alive\n\n",
        "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n",
        "data: [DONE]\n\n",
    );
    for piece in [1, 7, body.len()] {
        let mut p = SseParser::new(true);
        let mut got = Vec::new();
        for part in body.as_bytes().chunks(piece) {
            p.buf.extend_from_slice(part);
            got.extend(drain(&mut p));
        }
        assert!(p.done);
        assert_eq!(
            got,
            vec![
                Ok(Chunk::Text("Hel".into())),
                Ok(Chunk::Text("lo".into())),
                Ok(Chunk::Finish("stop".into())),
                Ok(Chunk::Usage(Usage {
                    prompt_tokens: 3,
                    completion_tokens: 2,
                    ..Default::default()
                })),
            ]
        );
    }
}

#[test]
fn thinking_and_its_token_counts_are_read_from_both_names() {
    let body = concat!(
        "data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"Let me \"}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"reasoning\":\"think.\"}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"content\":\"Four.\"},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":5,",
        "\"prompt_tokens_details\":{\"cached_tokens\":8},",
        "\"completion_tokens_details\":{\"reasoning_tokens\":4}}}\n\n",
        "data: [DONE]\n\n",
    );
    let mut p = SseParser::new(true);
    p.buf.extend_from_slice(body.as_bytes());
    assert_eq!(
        drain(&mut p),
        vec![
            Ok(Chunk::Reasoning("Let me ".into())),
            Ok(Chunk::Reasoning("think.".into())),
            Ok(Chunk::Text("Four.".into())),
            Ok(Chunk::Finish("stop".into())),
            Ok(Chunk::Usage(Usage {
                prompt_tokens: 9,
                completion_tokens: 5,
                cached_tokens: 8,
                reasoning_tokens: 4,
            })),
        ]
    );
    // Text completions have no thinking: a `reasoning` field there is not read.
    let mut p = SseParser::new(false);
    p.buf
        .extend_from_slice(b"data: {\"choices\":[{\"text\":\"a\",\"reasoning\":\"b\"}]}\n\n");
    assert_eq!(drain(&mut p), vec![Ok(Chunk::Text("a".into()))]);
}

#[test]
fn tools_and_json_formats_pass_through() {
    let up = upstream(RuntimeKind::LlamaCpp);
    let mut call = ChatMessage::new("assistant", "");
    call.tool_calls = Some(json!([{"id": "c1", "type": "function",
        "function": {"name": "f", "arguments": {"a": 1}}}]));
    let mut result = ChatMessage::new("tool", "2");
    result.tool_call_id = Some("c1".into());
    let mut r = GenerateRequest::new(vec![ChatMessage::new("user", "q"), call, result]).format(
        OutputConstraint::JsonSchema {
            schema: json!({"type": "object"}),
        },
    );
    r.tools = Some(json!([{"type": "function", "function": {"name": "f"}}]));
    r.tool_choice = ToolChoice::Function("f".into());
    r.parallel_tool_calls = false;
    assert!(up.check(&r).is_ok());
    let b = up.body(&r, false);
    assert_eq!(
        b["response_format"]["json_schema"]["schema"],
        json!({"type": "object"})
    );
    assert_eq!(b["tool_choice"]["function"]["name"], "f");
    assert_eq!(b["parallel_tool_calls"], false);
    assert_eq!(b["messages"][1]["content"], Value::Null);
    assert_eq!(
        b["messages"][1]["tool_calls"][0]["function"]["arguments"],
        "{\"a\":1}"
    );
    assert_eq!(b["messages"][2]["tool_call_id"], "c1");
    // Streamed calls come in pieces by index.
    let body = concat!(
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"x\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\":1}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n",
        "data: [DONE]\n\n",
    );
    let mut p = SseParser::new(true);
    p.buf.extend_from_slice(body.as_bytes());
    let got = drain(&mut p);
    assert_eq!(
        got,
        vec![
            Ok(Chunk::ToolCall {
                index: 0,
                name: Some("f".into()),
                arguments: "{\"a".into()
            }),
            Ok(Chunk::ToolCall {
                index: 0,
                name: None,
                arguments: "\":1}".into()
            }),
            Ok(Chunk::Finish("tool_calls".into())),
        ]
    );
    assert_eq!(
        calls_of(&json!([{"function": {"name": "f", "arguments": "{}"}}])),
        vec![ToolCall {
            name: "f".into(),
            arguments: "{}".into()
        }]
    );
}

#[test]
fn sse_errors_and_cut_off_streams() {
    let mut p = SseParser::new(false);
    p.buf.extend_from_slice(
        b"data: {\"choices\":[{\"text\":\"a\"}]}\ndata: {\"error\":{\"message\":\"boom\"}}\n",
    );
    let got = drain(&mut p);
    assert_eq!(got[0], Ok(Chunk::Text("a".into())));
    assert!(got[1].as_ref().unwrap_err().contains("boom"));
    assert!(p.done);
    let mut p = SseParser::new(false);
    p.buf
        .extend_from_slice(b"data: {\"choices\":[{\"text\":\"a\"}]}\n");
    assert_eq!(drain(&mut p).len(), 1);
    p.finish("u");
    assert!(drain(&mut p)[0]
        .as_ref()
        .unwrap_err()
        .contains("ended before"));
}

#[test]
fn error_bodies_yield_their_message() {
    assert_eq!(
        error_message(r#"{"error":{"message":"too long","type":"x"}}"#),
        "too long"
    );
    assert_eq!(error_message(r#"{"detail":"bad"}"#), "bad");
    assert_eq!(error_message("plain words"), "plain words");
    assert_eq!(error_message(""), "(no message)");
}
