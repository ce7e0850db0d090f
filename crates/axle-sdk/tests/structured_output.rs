//! Structured output on the real models. For SmolLM2 and Gemma 3, each of the 20 schemas of
//! `benchmarks/workloads/schemas.json` (nested objects, arrays, enums, bounded numbers, optional
//! and nullable fields, `anyOf`, `$ref`, patterns) constrains a chat answer, greedy and sampled:
//! every answer must end by the grammar (not by length), parse, and validate against its schema
//! (the `jsonschema` crate). Greedy constrained output is the same with n-gram speculation on and
//! off, and the speculative runs must really have drafted. A regular expression and a required
//! tool call are checked the same way, and bad schemas are refused naming `response_format`.
use axle_sdk::{
    ChatMessage, Completion, EngineConfig, FinishReason, GenerateRequest, Model, ModelOptions,
    OutputConstraint, Session, ToolChoice,
};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;

const MAX_TOKENS: usize = 320;
const REPETITION_PENALTY: f32 = 1.2;

fn load(name: &str) -> Arc<Model> {
    load_with_threads(name, 2)
}

/// With fewer threads than cores, masks are computed ahead on mask threads.
fn load_with_threads(name: &str, threads: usize) -> Arc<Model> {
    let p = axle_models::fetched::model_path(name).unwrap_or_else(|e| panic!("{e}"));
    Arc::new(Model::load(&p, &ModelOptions::cpu(threads)).expect("load"))
}

/// (name, prompt, schema) of the checked-in workload.
fn schemas() -> Vec<(String, String, Value)> {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../benchmarks/workloads/schemas.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["schemas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_string(),
                s["prompt"].as_str().unwrap().to_string(),
                s["schema"].clone(),
            )
        })
        .collect()
}

fn session(m: &Arc<Model>, draft_len: usize) -> Session {
    let cfg = EngineConfig {
        max_seqs: 20,
        draft_len,
        // Pinned low so drafting really happens (the gate is tested in axle-core).
        verify_cost: (draft_len > 0).then(|| (0..=8).map(|k| 1.0 + 0.02 * k as f64).collect()),
        ..EngineConfig::default()
    };
    Session::new(m.clone(), cfg).expect("session")
}

/// A constrained chat request. The repetition penalty keeps the 135M/270M models from looping
/// inside a number or a string until the token limit (the grammar allows any length there).
fn request(prompt: &str, schema: &Value) -> GenerateRequest {
    let mut r = GenerateRequest::new(vec![ChatMessage::new("user", prompt)])
        .max_tokens(MAX_TOKENS)
        .format(OutputConstraint::JsonSchema {
            schema: schema.clone(),
        });
    r.sampling.repetition_penalty = Some(REPETITION_PENALTY);
    r
}

/// Runs all requests together (one batch) and returns their completions in order.
fn run_all(s: &Session, reqs: &[GenerateRequest]) -> Vec<Completion> {
    let streams: Vec<_> = reqs
        .iter()
        .map(|r| s.start_blocking(r).expect("start").remove(0))
        .collect();
    streams
        .into_iter()
        .map(|st| {
            let mut c = Completion::empty();
            for ev in st {
                if c.absorb(ev).expect("event") {
                    break;
                }
            }
            c
        })
        .collect()
}

/// Why `c` is not a valid answer for `schema`, if it is not.
fn invalid(schema: &Value, c: &Completion) -> Option<String> {
    if c.finish.reason != FinishReason::Stop {
        return Some(format!("ended by {:?}: {}", c.finish.reason, c.text));
    }
    let v: Value = match serde_json::from_str(&c.text) {
        Ok(v) => v,
        Err(e) => return Some(format!("not JSON ({e}): {}", c.text)),
    };
    let validator = jsonschema::validator_for(schema).expect("schema compiles");
    let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
    (!errors.is_empty()).then(|| format!("{} does not validate: {errors:?}", c.text))
}

fn schemas_hold(model_name: &str) {
    let m = load(model_name);
    let set = schemas();
    let plain = session(&m, 0);
    let greedy: Vec<GenerateRequest> = set.iter().map(|(_, p, s)| request(p, s).greedy()).collect();
    let sampled: Vec<GenerateRequest> = set
        .iter()
        .enumerate()
        .map(|(i, (_, p, s))| request(p, s).temperature(0.8).seed(100 + i as u64))
        .collect();
    let g = run_all(&plain, &greedy);
    let r = run_all(&plain, &sampled);
    let (mut masks, mut compute_us, mut wait_us, mut tokens) = (0, 0, 0, 0);
    let mut failures = Vec::new();
    for (i, (name, _, schema)) in set.iter().enumerate() {
        for (mode, c) in [("greedy", &g[i]), ("sampled", &r[i])] {
            if let Some(why) = invalid(schema, c) {
                failures.push(format!("{mode} {name}: {why}"));
            }
        }
        for c in [&g[i], &r[i]] {
            masks += c.finish.constraint.masks;
            compute_us += c.finish.constraint.compute_us;
            wait_us += c.finish.constraint.wait_us;
            tokens += c.tokens.len();
        }
    }
    assert!(
        failures.is_empty(),
        "{model_name}: {}/40 invalid:\n{}",
        failures.len(),
        failures.join("\n")
    );
    println!(
        "{model_name}: 40 answers valid; {tokens} tokens, {masks} masks sampled ({:.0}% of tokens \
         forced), mask {:.0} us each, engine waited {:.0} us per mask",
        100.0 * (1.0 - masks as f64 / tokens as f64),
        compute_us as f64 / masks as f64,
        wait_us as f64 / masks as f64
    );
    assert!(masks < tokens as u64, "no token was forced");
    // Speculation changes nothing (greedy), and really drafts.
    let spec = session(&m, 4);
    let gs = run_all(&spec, &greedy);
    let drafted: usize = gs.iter().map(|c| c.finish.speculation.drafted).sum();
    let accepted: usize = gs.iter().map(|c| c.finish.speculation.accepted).sum();
    for (i, (name, _, _)) in set.iter().enumerate() {
        assert_eq!(
            gs[i].tokens, g[i].tokens,
            "{model_name} {name}: speculation changed the output"
        );
    }
    println!("{model_name}: speculation on: 20/20 identical, {accepted}/{drafted} drafts accepted");
    assert!(drafted > 0, "speculation never drafted");
}

#[test]
fn smollm2_json_schemas_hold_greedy_sampled_and_speculative() {
    schemas_hold(axle_models::fetched::SMOLLM2);
}

#[test]
fn gemma3_json_schemas_hold_greedy_sampled_and_speculative() {
    schemas_hold(axle_models::fetched::GEMMA3);
}

/// Masks computed ahead on mask threads (one model thread on a machine of more cores): every
/// answer is valid and greedy output is the same with speculation on (drafts checked against
/// the parser between the mask thread's turns) and off.
#[test]
fn masks_computed_ahead_keep_answers_valid_and_speculation_exact() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        cores > 1,
        "needs 2 cores to put masks on a thread of their own"
    );
    let m = load_with_threads(axle_models::fetched::SMOLLM2, 1);
    let set: Vec<_> = schemas().into_iter().take(6).collect();
    let greedy: Vec<GenerateRequest> = set.iter().map(|(_, p, s)| request(p, s).greedy()).collect();
    let plain = run_all(&session(&m, 0), &greedy);
    let spec = run_all(&session(&m, 4), &greedy);
    let drafted: usize = spec.iter().map(|c| c.finish.speculation.drafted).sum();
    for (i, (name, _, schema)) in set.iter().enumerate() {
        assert_eq!(invalid(schema, &plain[i]), None, "{name}");
        assert_eq!(
            spec[i].tokens, plain[i].tokens,
            "{name}: speculation changed the output"
        );
        assert!(plain[i].finish.constraint.masks > 0, "{name}: no mask");
    }
    assert!(drafted > 0, "speculation never drafted");
}

#[test]
fn patterns_tool_calls_and_bad_schemas() {
    let m = load(axle_models::fetched::SMOLLM2);
    let s = session(&m, 0);
    // A pattern.
    let req = GenerateRequest::new(vec![ChatMessage::new("user", "Give me a US phone number.")])
        .greedy()
        .max_tokens(40)
        .format(OutputConstraint::Regex {
            pattern: r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}".into(),
        });
    let c = s.generate(&req).unwrap();
    let ok = c.text.len() == 14
        && c.text.chars().enumerate().all(|(i, ch)| match i {
            0 => ch == '(',
            4 => ch == ')',
            5 => ch == ' ',
            9 => ch == '-',
            _ => ch.is_ascii_digit(),
        });
    assert!(ok, "{:?}", c.text);
    // A required call of a named tool.
    let tools = serde_json::json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "add", "description": "Adds two numbers",
         "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}
    ]);
    let mut req = GenerateRequest::new(vec![ChatMessage::new("user", "What is 2 plus 3?")])
        .greedy()
        .max_tokens(80);
    req.tools = Some(tools);
    req.tool_choice = ToolChoice::Function("add".into());
    let c = s.generate(&req).unwrap();
    assert_eq!(c.finish.tool_calls.len(), 1, "{c:?}");
    assert_eq!(c.finish.tool_calls[0].name, "add");
    let args: Value = serde_json::from_str(&c.finish.tool_calls[0].arguments).unwrap();
    assert!(args["a"].is_number() && args["b"].is_number(), "{args}");
    assert_eq!(c.finish.openai_reason(), "tool_calls");
    // A call the grammar forces whole (a tool without arguments): it ends without sampling.
    let mut req = GenerateRequest::new(vec![ChatMessage::new("user", "What time is it?")])
        .greedy()
        .max_tokens(80);
    req.tools = Some(
        serde_json::json!([{"type": "function", "function": {"name": "now",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": false}}}]),
    );
    req.tool_choice = ToolChoice::Function("now".into());
    let c = s.generate(&req).unwrap();
    assert_eq!(c.finish.reason, FinishReason::Stop, "{c:?}");
    assert_eq!(c.finish.tool_calls.len(), 1, "{c:?}");
    assert_eq!(c.finish.tool_calls[0].arguments, "{}");
    assert_eq!(c.finish.constraint.masks, 0, "nothing was sampled");
    // So does a schema with one possible answer, with log-probabilities (forced tokens: 0).
    let mut req = request("Anything.", &serde_json::json!({"const": "yes"}));
    req.logprobs = Some(2);
    let c = s.generate(&req).unwrap();
    assert_eq!(c.text, "\"yes\"");
    assert_eq!(c.logprobs.len(), c.tokens.len());
    // Bad schemas are refused, naming the field.
    for bad in [serde_json::json!(7), serde_json::json!({"type": "strnig"})] {
        let e = s
            .generate(&request("x", &bad))
            .expect_err("refused")
            .to_string();
        assert!(e.contains("response_format"), "{e}");
    }
}
