//! The grammar engine (one per model), which compiles an output constraint into a [`Grammar`],
//! and the grammar's per-choice constraints ([`crate::grammar_constraint`]).
use crate::budget::ReasoningBudget;
use crate::digits::{digit_limit, DigitRuns};
use crate::format::OutputConstraint;
use crate::grammar_constraint::{GrammarConstraint, Worker};
use crate::reasoning::ThinkingMarkers;
use crate::vocabulary::{TokenEnv, Vocabulary};
use crate::StructuredError;
use axle_core::TokenConstraint;
use llguidance::api::{GrammarWithLexer, TopLevelGrammar};
use llguidance::toktrie::TokEnv;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use std::sync::Arc;

/// Compiles constraints for one model's vocabulary.
pub struct GrammarEngine {
    factory: ParserFactory,
    digits: Arc<DigitRuns>,
}

/// Where a constrained answer starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnswerStart {
    /// At the first generated token.
    First,
    /// After the thinking between `markers`, which the prompt opened (`opened`) or the model
    /// may open itself first.
    AfterThinking {
        /// The template's thinking markers.
        markers: ThinkingMarkers,
        /// The rendered prompt ended inside the thinking.
        opened: bool,
    },
}

impl std::fmt::Debug for GrammarEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarEngine")
            .field("vocab", &self.factory.tok_env().tok_trie().vocab_size())
            .finish()
    }
}

impl GrammarEngine {
    /// An engine for `vocab` (builds the token trie: tens of milliseconds per 100k tokens).
    pub fn new(vocab: Vocabulary) -> Result<GrammarEngine, StructuredError> {
        let digits = Arc::new(DigitRuns::new(&vocab.tokens));
        let env: TokEnv = Arc::new(TokenEnv::new(vocab)?);
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| StructuredError::Vocabulary(e.to_string()))?;
        factory.quiet();
        // Errors go to clients: no parser state or grammar dump in them.
        factory.limits_mut().verbose_errors = false;
        Ok(GrammarEngine { factory, digits })
    }

    /// Compiles a constraint; errors name what is wrong with the schema, pattern or grammar.
    /// JSON answers hold runs of at most [`JSON_DIGIT_LIMIT`] digits.
    pub fn compile(&self, c: &OutputConstraint) -> Result<Grammar, StructuredError> {
        self.compile_with(c, digit_limit(c, false))
    }

    /// [`GrammarEngine::compile`] with a chosen bound on runs of digits (None: unbounded). The
    /// bound gives way where the grammar needs more digits.
    pub fn compile_with(
        &self,
        c: &OutputConstraint,
        digit_limit: Option<usize>,
    ) -> Result<Grammar, StructuredError> {
        self.compile_answer(c, digit_limit, &AnswerStart::First)
    }

    /// [`GrammarEngine::compile_with`] for an answer that starts where `start` says: after the
    /// thinking, the output is free text up to the closing marker (a control token where the
    /// vocabulary has one, else the marker's text), then whitespace, then the constraint. A
    /// pattern or grammar that writes the closing marker itself covers the thinking too, so it
    /// starts at the first token.
    pub fn compile_answer(
        &self,
        c: &OutputConstraint,
        digit_limit: Option<usize>,
        start: &AnswerStart,
    ) -> Result<Grammar, StructuredError> {
        crate::limits::check(c)?;
        let mut grammar = c.grammar()?;
        if let AnswerStart::AfterThinking { markers, opened } = start {
            let own = matches!(c, OutputConstraint::Regex { pattern: t } | OutputConstraint::Grammar { lark: t }
                if t.contains(&markers.close));
            if !own {
                grammar = self.after_thinking(grammar, markers, *opened);
            }
        }
        let compiled = std::thread::scope(|s| {
            std::thread::Builder::new()
                .name("axle-grammar-compile".into())
                .stack_size(COMPILE_STACK)
                .spawn_scoped(s, || self.compile_here(grammar))
                .map_err(|e| StructuredError::Worker(e.to_string()))?
                .join()
                .unwrap_or_else(|_| {
                    Err(StructuredError::Invalid(
                        "the grammar compiler failed on this grammar".into(),
                    ))
                })
        })?;
        Ok(Grammar {
            matcher: compiled,
            digits: digit_limit.map(|l| (self.digits.clone(), l)),
        })
    }

    /// Bounds a request's thinking between `markers` to `budget` tokens, around its own
    /// constraint `inner` (see [`ReasoningBudget`]); `opened`: the prompt ended inside the
    /// thinking.
    pub fn bound_thinking(
        &self,
        inner: Option<Box<dyn TokenConstraint>>,
        markers: &ThinkingMarkers,
        opened: bool,
        budget: usize,
    ) -> Box<dyn TokenConstraint> {
        let env = self.factory.tok_env();
        let close_token = env.tok_trie().get_special_token(&markers.close);
        let close_tokens = match close_token {
            Some(id) => vec![id],
            None => env.tokenize(&markers.close),
        };
        Box::new(ReasoningBudget::new(
            inner,
            self.digits.bytes.clone(),
            markers.clone(),
            close_token,
            close_tokens,
            budget,
            opened,
        ))
    }

    /// `answer` behind free thinking text: opened by the prompt (`opened`) or optionally by the
    /// model, up to the closing marker, then whitespace.
    fn after_thinking(
        &self,
        mut answer: TopLevelGrammar,
        markers: &ThinkingMarkers,
        opened: bool,
    ) -> TopLevelGrammar {
        let trie = self.factory.tok_env().tok_trie();
        let think = match trie.get_special_token(&markers.close) {
            Some(id) => format!("think: THOUGHT? <[{id}]>\nTHOUGHT: /(.|\n)+/\n"),
            None => format!(
                "think[suffix={}]: /(.|\n)*/\n",
                Value::String(markers.close.clone())
            ),
        };
        let opening = match (opened, trie.get_special_token(&markers.open)) {
            (true, _) => "think".to_string(),
            (false, Some(id)) => format!("(<[{id}]> think)?"),
            (false, None) => format!("({} think)?", Value::String(markers.open.clone())),
        };
        // The constraint's grammar follows this one, named to be referenced.
        let lark = format!(
            "start: {opening} answer\nanswer: WS? @axle_answer\nWS: /[ \\t\\r\\n]+/\n{think}"
        );
        if let Some(first) = answer.grammars.first_mut() {
            first.name = Some("axle_answer".into());
        }
        let mut grammars = vec![GrammarWithLexer::from_lark(lark)];
        grammars.append(&mut answer.grammars);
        answer.grammars = grammars;
        answer
    }

    /// Compiles on the calling thread, then computes the first mask of a copy: a grammar that
    /// compiles but cannot start (no token allowed, or a parser limit hit at once) is refused
    /// here rather than when the request runs.
    fn compile_here(&self, grammar: TopLevelGrammar) -> Result<Matcher, StructuredError> {
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| invalid(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(invalid(e));
        }
        let mut probe = matcher.deep_clone();
        let mask = probe.compute_mask().map_err(|e| invalid(e.to_string()))?;
        if let Some(e) = probe.get_error() {
            return Err(invalid(e));
        }
        let accepting = probe.is_accepting().unwrap_or(false);
        if mask.is_zero() && !accepting {
            return Err(StructuredError::Invalid(
                "the grammar admits no output (no token can start it)".into(),
            ));
        }
        Ok(matcher)
    }
}

/// The stack of the thread that compiles a grammar: the compiler recurses along the grammar's
/// chains, and [`crate::MAX_GRAMMAR_DEPTH`] keeps every accepted grammar far inside this (the
/// pages are reserved, not committed, until used).
const COMPILE_STACK: usize = 64 << 20;

/// The longest error message passed on from the grammar compiler.
const MAX_ERROR_CHARS: usize = 300;

/// A compiler error as the client sees it: its first line, cut short (llguidance's messages can
/// carry its internal state on later lines).
fn invalid(e: String) -> StructuredError {
    let line = e.lines().next().unwrap_or("the grammar is invalid").trim();
    let mut msg: String = line.chars().take(MAX_ERROR_CHARS).collect();
    if msg.len() < line.len() {
        msg.push_str("...");
    }
    StructuredError::Invalid(msg)
}

/// A compiled constraint, ready to start any number of choices.
pub struct Grammar {
    matcher: Matcher,
    digits: Option<(Arc<DigitRuns>, usize)>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Grammar")
    }
}

impl Grammar {
    /// A fresh constraint for one choice. With `force`, tokens the grammar allows alone are
    /// emitted without sampling (off when a request wants log-probabilities of every token).
    /// With `overlap`, a worker thread computes each next mask while the model runs (worth it
    /// where a core is free of the model's threads; on a machine whose cores all run the model,
    /// the worker only takes a core from it, so the mask is computed in place).
    pub fn constraint(
        &self,
        force: bool,
        overlap: bool,
    ) -> Result<Box<dyn TokenConstraint>, StructuredError> {
        let worker = self.worker(force);
        Ok(Box::new(if overlap {
            GrammarConstraint::threaded(worker)?
        } else {
            GrammarConstraint::Inline(Box::new(worker))
        }))
    }

    fn worker(&self, force: bool) -> Worker {
        Worker::new(self.matcher.deep_clone(), force, self.digits.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::JSON_DIGIT_LIMIT;
    use crate::MAX_GRAMMAR_DEPTH;
    use axle_core::TokenId;
    use serde_json::{json, Value};
    use std::time::{Duration, Instant};

    /// Single bytes, a few words, and an end token (id 259).
    fn engine() -> GrammarEngine {
        let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        for w in ["{\"", "\": ", "\"name", "true"] {
            tokens.push(w.as_bytes().to_vec());
        }
        tokens.push(b"<end>".to_vec());
        let mut control = vec![false; tokens.len()];
        control[260] = true;
        let words = tokens.clone();
        let tokenize: crate::vocabulary::Tokenize = Arc::new(move |s: &str| {
            // Greedy longest match over the words.
            let b = s.as_bytes();
            let mut i = 0;
            let mut out = Vec::new();
            while i < b.len() {
                let (id, len) = (0..260)
                    .filter(|&t| b[i..].starts_with(&words[t]))
                    .map(|t| (t as TokenId, words[t].len()))
                    .max_by_key(|x| x.1)
                    .expect("bytes cover everything");
                out.push(id);
                i += len;
            }
            out
        });
        GrammarEngine::new(Vocabulary {
            tokens,
            control,
            eos: vec![260],
            tokenize,
            canonical: true,
        })
        .unwrap()
    }

    /// A `$ref` chain of `n` objects, each holding the next: the shape that overflowed a
    /// server worker's stack at about 900.
    fn object_chain(n: usize) -> Value {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            defs.insert(
                format!("d{i}"),
                json!({"type": "object", "properties": {"x": {"$ref": format!("#/$defs/d{}", i + 1)}},
                    "required": ["x"], "additionalProperties": false}),
            );
        }
        defs.insert(format!("d{n}"), json!({"type": "integer"}));
        json!({"$defs": defs, "$ref": "#/$defs/d0"})
    }

    fn lark_chain(n: usize) -> String {
        let mut g = String::from("start: r0\n");
        for i in 0..n {
            g.push_str(&format!("r{i}: \"a\" r{}\n", i + 1));
        }
        g.push_str(&format!("r{n}: \"b\"\n"));
        g
    }

    #[test]
    fn grammar_bombs_are_refused_by_name() {
        let e = engine();
        let bombs = [
            OutputConstraint::JsonSchema {
                schema: object_chain(900),
            },
            OutputConstraint::JsonSchema {
                schema: object_chain(20_000),
            },
            OutputConstraint::Grammar {
                lark: lark_chain(5_000),
            },
            OutputConstraint::Grammar {
                lark: format!("start: {}\"a\"{}\n", "(".repeat(5_000), ")".repeat(5_000)),
            },
            OutputConstraint::Regex {
                pattern: format!("{}a{}", "(".repeat(5_000), ")".repeat(5_000)),
            },
        ];
        for b in &bombs {
            match e.compile(b) {
                Err(StructuredError::Limit(m)) => assert!(m.contains("limit of"), "{m}"),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn grammars_at_the_depth_limit_compile_on_any_caller_stack() {
        // Run from a thread with a small stack, as an async worker would be.
        let e = engine();
        let ok = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || {
                let schema = object_chain(MAX_GRAMMAR_DEPTH / 4);
                let g = e.compile(&OutputConstraint::JsonSchema { schema })?;
                let lark = lark_chain(MAX_GRAMMAR_DEPTH / 2);
                e.compile(&OutputConstraint::Grammar { lark })?;
                Ok::<_, StructuredError>(g)
            })
            .unwrap()
            .join()
            .unwrap();
        let g = ok.unwrap();
        let mut c = g.constraint(true, false).unwrap();
        let text = run(c.as_mut(), |t, _| t as u64);
        assert!(
            text.starts_with(b"{\"x\": {\"x\""),
            "{}",
            String::from_utf8_lossy(&text)
        );
    }

    #[test]
    fn grammars_that_cannot_start_are_invalid_without_internal_state() {
        let e = engine();
        let dead = [
            OutputConstraint::JsonSchema {
                schema: json!({"$ref": "#"}),
            },
            OutputConstraint::JsonSchema {
                schema: json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                    "$ref": "#/$defs/a"}),
            },
            OutputConstraint::Regex {
                pattern: r"[^\s\S]".into(),
            },
        ];
        for d in &dead {
            match e.compile(d) {
                Err(StructuredError::Invalid(m)) => {
                    assert!(!m.contains('\n') && m.len() <= MAX_ERROR_CHARS + 3, "{m}");
                }
                other => panic!("{d:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn json_digit_runs_are_bounded() {
        let e = engine();
        let g = e
            .compile(&OutputConstraint::JsonSchema {
                schema: json!({"type": "object", "properties": {"n": {"type": "number"}},
                    "required": ["n"], "additionalProperties": false}),
            })
            .unwrap();
        let s = nines(&g, true);
        let v: Value = serde_json::from_str(&s).unwrap_or_else(|e| panic!("{e}: {s}"));
        assert!(v["n"].is_number(), "{s}");
        let longest = s
            .split(|c: char| !c.is_ascii_digit())
            .map(str::len)
            .max()
            .unwrap();
        assert_eq!(longest, JSON_DIGIT_LIMIT, "{s}");
        // Digits inside a string are the text's own: a 20-digit pattern gets them all.
        let g = e
            .compile(&OutputConstraint::JsonSchema {
                schema: json!({"type": "string", "pattern": "^[0-9]{20}$"}),
            })
            .unwrap();
        for overlap in [true, false] {
            let mut c = g.constraint(true, overlap).unwrap();
            let text = run(c.as_mut(), |t, _| t as u64);
            assert_eq!(text.len(), 22, "{}", String::from_utf8_lossy(&text));
        }
        // A free string of a digit-loving model is not cut either.
        let g = e
            .compile(&OutputConstraint::JsonSchema {
                schema: json!({"type": "string", "maxLength": 30}),
            })
            .unwrap();
        let s = nines(&g, false);
        assert!(s.contains(&"9".repeat(20)), "{s}");
    }

    /// The output of a "model" that always prefers the digit 9.
    fn nines(g: &Grammar, overlap: bool) -> String {
        let mut c = g.constraint(true, overlap).unwrap();
        let text = run(c.as_mut(), |t, _| {
            if t == b'9' as TokenId {
                1000
            } else {
                t as u64
            }
        });
        String::from_utf8(text).unwrap()
    }

    /// Runs a constraint with a "model" that picks the allowed token of highest `score`.
    fn run(c: &mut dyn TokenConstraint, score: impl Fn(TokenId, usize) -> u64) -> Vec<u8> {
        let mut out: Vec<TokenId> = c.start().unwrap().forced;
        for step in 0..200 {
            let a = c.allowed().unwrap();
            let pick = (0..261u32)
                .filter(|&t| a.mask.allows(t) && t != 260)
                .max_by_key(|&t| score(t, step));
            let Some(t) = pick.filter(|_| !(a.may_end && step % 7 == 6)) else {
                assert!(
                    a.may_end,
                    "nothing allowed but the end is not allowed either"
                );
                break;
            };
            out.push(t);
            let adv = c.advance(t).unwrap();
            out.extend(adv.forced);
            if adv.finished {
                break;
            }
        }
        let words: Vec<Vec<u8>> = {
            let mut w: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
            for s in ["{\"", "\": ", "\"name", "true"] {
                w.push(s.as_bytes().to_vec());
            }
            w
        };
        out.iter()
            .flat_map(|&t| words[t as usize].clone())
            .collect()
    }

    #[test]
    fn json_schema_output_is_valid_and_forced_parts_come_free() {
        let e = engine();
        let schema = json!({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 5},
            "ok": {"type": "boolean"},
            "n": {"type": "integer", "minimum": 3, "maximum": 9}},
            "required": ["name", "ok", "n"], "additionalProperties": false});
        let g = e.compile(&OutputConstraint::JsonSchema { schema }).unwrap();
        for seed in 0..5u64 {
            let mut c = g.constraint(true, true).unwrap();
            let text = run(c.as_mut(), |t, step| {
                (t as u64 ^ seed.wrapping_mul(0x9E37_79B9) ^ step as u64)
                    .wrapping_mul(0x2545_F491_4F6C_DD1D)
                    >> 7
            });
            let v: Value = serde_json::from_slice(&text)
                .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&text)));
            let n = v["n"].as_i64().unwrap();
            assert!((3..=9).contains(&n), "{v}");
            assert!(v["name"].as_str().unwrap().chars().count() <= 5, "{v}");
            assert!(v["ok"].is_boolean());
            assert!(
                text.starts_with(b"{\"name\": \""),
                "{}",
                String::from_utf8_lossy(&text)
            );
            let t = c.timing();
            assert!(t.masks > 0);
        }
        // The start is forced: `{"name": "` comes without sampling.
        let mut c = g.constraint(true, true).unwrap();
        let forced = c.start().unwrap().forced;
        assert!(!forced.is_empty());
        let mut c = g.constraint(false, false).unwrap();
        assert!(c.start().unwrap().forced.is_empty());
        assert_eq!(
            c.valid_prefix(&[b'{' as TokenId, b'"' as TokenId, b'x' as TokenId]),
            2
        );
    }

    /// Bytes as single-byte tokens.
    fn bytes(s: &str) -> Vec<TokenId> {
        s.bytes().map(TokenId::from).collect()
    }

    #[test]
    fn a_constrained_answer_starts_after_the_thinking() {
        let e = engine();
        let markers = crate::reasoning::ThinkingMarkers::of_template(Some("<think></think>"))
            .expect("markers");
        let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}},
            "required": ["ok"], "additionalProperties": false});
        let c = OutputConstraint::JsonSchema { schema };
        let thought = "Hm, {not json} <b>.\n";
        // Opened by the prompt: free text (braces, tags, newlines) up to the marker, then JSON.
        let start = AnswerStart::AfterThinking {
            markers: markers.clone(),
            opened: true,
        };
        let g = e
            .compile_answer(&c, Some(JSON_DIGIT_LIMIT), &start)
            .unwrap();
        let mut k = g.constraint(false, false).unwrap();
        k.start().unwrap();
        let full = format!("{thought}</think>\n\n{{\"ok\": true}}");
        assert_eq!(k.valid_prefix(&bytes(&full)), full.len());
        // Not JSON after the thinking, and no answer before the marker closes it.
        let bad = format!("{thought}</think>\nyes");
        assert_eq!(k.valid_prefix(&bytes(&bad)), bad.len() - 3);
        // Opened by the model, or not at all.
        let start = AnswerStart::AfterThinking {
            markers,
            opened: false,
        };
        let g = e
            .compile_answer(&c, Some(JSON_DIGIT_LIMIT), &start)
            .unwrap();
        for text in [
            format!("<think>{thought}</think>{{\"ok\": false}}"),
            "{\"ok\": false}".to_string(),
        ] {
            let mut k = g.constraint(false, false).unwrap();
            k.start().unwrap();
            assert_eq!(k.valid_prefix(&bytes(&text)), text.len(), "{text}");
        }
        let mut k = g.constraint(false, false).unwrap();
        k.start().unwrap();
        assert_eq!(k.valid_prefix(&bytes("Hm")), 0, "text outside the thinking");
    }

    #[test]
    fn a_reasoning_budget_closes_the_thinking_before_a_constrained_answer() {
        let e = engine();
        let markers = crate::reasoning::ThinkingMarkers::of_template(Some("<think></think>"))
            .expect("markers");
        let c = OutputConstraint::JsonObject;
        let start = AnswerStart::AfterThinking {
            markers: markers.clone(),
            opened: true,
        };
        let g = e.compile_answer(&c, None, &start).unwrap();
        let mut k = e.bound_thinking(Some(g.constraint(true, false).unwrap()), &markers, true, 3);
        assert!(k.start().unwrap().forced.is_empty());
        let mut out = Vec::new();
        for &t in &bytes("abc") {
            assert!(k.allowed().unwrap().mask.allows(t));
            out.push(t);
            out.extend(k.advance(t).unwrap().forced);
        }
        let text: Vec<u8> = out.iter().map(|&t| t as u8).collect();
        assert!(
            text.starts_with(b"abc</think>"),
            "{}",
            String::from_utf8_lossy(&text)
        );
        // The answer's constraint took the marker: only JSON may follow.
        let allowed = k.allowed().unwrap();
        assert!(!allowed.mask.allows(b'x' as TokenId));
        assert!(allowed.mask.allows(b'{' as TokenId) || text.ends_with(b"{"));
    }

    /// With overlap, the mask thread computes the next mask once the engine asks for it
    /// (`prepare`), and `allowed` hands over that mask instead of computing it again; the masks
    /// and the moves are the ones computed in place.
    #[test]
    fn the_mask_thread_computes_ahead_and_allowed_takes_its_mask() {
        let e = engine();
        let g = e.compile(&OutputConstraint::JsonObject).unwrap();
        let mut threaded = g.constraint(false, true).unwrap();
        let mut inline = g.constraint(false, false).unwrap();
        assert_eq!(threaded.start().unwrap(), inline.start().unwrap());
        for (i, &t) in b"{\"a\": 1".iter().enumerate() {
            threaded.prepare();
            // The thread computes this position's mask by itself (give it up to 10 s).
            let t0 = Instant::now();
            while threaded.timing().masks <= i as u64 {
                assert!(t0.elapsed().as_secs() < 10, "no mask computed ahead");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let allowed = threaded.allowed().unwrap();
            assert_eq!(threaded.timing().masks, i as u64 + 1, "computed twice");
            assert_eq!(allowed, inline.allowed().unwrap());
            assert!(allowed.mask.allows(t as TokenId));
            assert_eq!(
                threaded.advance(t as TokenId).unwrap(),
                inline.advance(t as TokenId).unwrap()
            );
        }
    }

    /// Dropping a threaded constraint ends its mask thread (which holds the other reference to
    /// the shared parser), also while the thread is asleep.
    #[test]
    fn dropping_the_constraint_ends_its_mask_thread() {
        let g = engine().compile(&OutputConstraint::JsonObject).unwrap();
        let mut c = GrammarConstraint::threaded(g.worker(false)).unwrap();
        c.start().unwrap();
        c.prepare();
        let GrammarConstraint::Threaded { shared, .. } = &c else {
            unreachable!("threaded")
        };
        let shared = Arc::downgrade(shared);
        drop(c);
        let t0 = Instant::now();
        while shared.upgrade().is_some() {
            assert!(t0.elapsed().as_secs() < 10, "the mask thread did not end");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn bad_schemas_and_grammars_are_refused_with_reasons() {
        let e = engine();
        for (c, says) in [
            (OutputConstraint::JsonSchema { schema: json!(3) }, "object"),
            (
                OutputConstraint::JsonSchema {
                    schema: json!({"type": "strin"}),
                },
                "strin",
            ),
            (
                OutputConstraint::Regex {
                    pattern: "(a".into(),
                },
                "",
            ),
            (
                OutputConstraint::Grammar {
                    lark: "start: nope".into(),
                },
                "nope",
            ),
        ] {
            let err = e.compile(&c).unwrap_err().to_string();
            assert!(err.contains(says), "{c:?}: {err}");
        }
    }
}
