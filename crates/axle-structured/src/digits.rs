//! The bound on runs of digits in JSON answers.
use crate::format::OutputConstraint;
use axle_core::TokenId;
use std::sync::Arc;

/// The longest run of ASCII digits a JSON answer may hold (llama.cpp's JSON grammars bound the
/// integral and the fraction part of a number to 16 digits each): JSON grammars allow numbers of
/// any length, and a small model that starts repeating a digit never stops.
pub const JSON_DIGIT_LIMIT: usize = 16;

/// What bounding runs of digits needs: each token's bytes, and the tokens that start with a
/// digit.
#[derive(Debug, Default)]
pub(crate) struct DigitRuns {
    /// Tokens that start with a digit, with their leading digits.
    pub(crate) leading: Vec<(TokenId, u8)>,
    /// Each token's bytes as text.
    pub(crate) bytes: Arc<Vec<Vec<u8>>>,
}

impl DigitRuns {
    pub(crate) fn new(tokens: &[Vec<u8>]) -> DigitRuns {
        let leading = tokens
            .iter()
            .enumerate()
            .filter_map(|(t, b)| {
                let lead = b.iter().take_while(|c| c.is_ascii_digit()).count();
                (lead > 0).then_some((t as TokenId, lead.min(255) as u8))
            })
            .collect();
        DigitRuns {
            leading,
            bytes: Arc::new(tokens.to_vec()),
        }
    }
}

/// Where the output stands for the digit bound: the run of digits at its end, outside JSON
/// strings (digits inside a string, an id or a phone number, are the text's own and unbounded).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct DigitState {
    pub(crate) run: usize,
    pub(crate) in_string: bool,
    escaped: bool,
}

impl DigitState {
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                }
                self.run = 0;
            } else if b == b'"' {
                self.in_string = true;
                self.run = 0;
            } else if b.is_ascii_digit() {
                self.run += 1;
            } else {
                self.run = 0;
            }
        }
    }
}

/// The bound on runs of digits a constraint's output gets: JSON answers (a schema, an object,
/// or a grammar of JSON such as a tool call's) hold runs of at most [`JSON_DIGIT_LIMIT`].
pub fn digit_limit(c: &OutputConstraint, json_grammar: bool) -> Option<usize> {
    (json_grammar
        || matches!(
            c,
            OutputConstraint::JsonObject | OutputConstraint::JsonSchema { .. }
        ))
    .then_some(JSON_DIGIT_LIMIT)
}
