//! A bound on a reasoning model's thinking (Anthropic's `thinking.budget_tokens`): after that
//! many tokens of thinking the closing marker is forced, and the answer follows. It wraps the
//! request's own constraint, if any (a JSON answer after the thinking), and otherwise allows
//! every token, so a request that closes its thinking in time generates exactly what it would
//! without the bound.
//!
//! Why a constraint rather than a grammar: llguidance's `max_tokens=` ends a bounded thought
//! without its marker (`suffix=` lexemes), and a bounded free-text thought followed by the
//! marker as its own lexeme swallows the marker's first bytes (the lexer is greedy), so neither
//! forces the marker at the bound where the marker is text rather than one special token.
use crate::reasoning::{ReasoningSplitter, ThinkingMarkers};
use axle_core::{Advanced, Allowed, ConstraintTiming, TokenConstraint, TokenId, TokenMask};
use std::sync::Arc;

/// The bound (see the module's documentation).
pub struct ReasoningBudget {
    inner: Option<Box<dyn TokenConstraint>>,
    /// Each token's bytes as text (empty for control tokens).
    pieces: Arc<Vec<Vec<u8>>>,
    /// Where the output stands, as the engine splits it into thinking and answer.
    split: ReasoningSplitter,
    /// The closing marker's text (what a control-token marker stands for).
    close: String,
    /// The closing marker as one control token, where the vocabulary has it so.
    close_token: Option<TokenId>,
    /// What is forced at the bound.
    close_tokens: Vec<TokenId>,
    budget: usize,
    /// Tokens of thinking so far.
    spent: usize,
    every: TokenMask,
}

impl std::fmt::Debug for ReasoningBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReasoningBudget")
            .field("budget", &self.budget)
            .field("spent", &self.spent)
            .finish()
    }
}

impl ReasoningBudget {
    /// Bounds the thinking between `markers` to `budget` tokens (at least 1): `opened` when the
    /// prompt ended inside the thinking; `close_tokens` are forced at the bound (one control
    /// token, `close_token`, where the vocabulary has the marker as one). `inner`: the
    /// request's own constraint.
    pub fn new(
        inner: Option<Box<dyn TokenConstraint>>,
        pieces: Arc<Vec<Vec<u8>>>,
        markers: ThinkingMarkers,
        close_token: Option<TokenId>,
        close_tokens: Vec<TokenId>,
        budget: usize,
        opened: bool,
    ) -> ReasoningBudget {
        let every = TokenMask::from_words(vec![u32::MAX; pieces.len().div_ceil(32)]);
        ReasoningBudget {
            inner,
            pieces,
            close: markers.close.clone(),
            split: ReasoningSplitter::new(markers, opened),
            close_token,
            close_tokens,
            budget: budget.max(1),
            spent: 0,
            every,
        }
    }

    /// Takes an emitted token; true when the bound is reached with the thinking still open. A
    /// token counts when the thinking was open before it (the one that opens it does not).
    fn observe(&mut self, token: TokenId) -> bool {
        let was = self.split.thinking();
        if Some(token) == self.close_token {
            self.split.push(&self.close);
        } else {
            let piece = self
                .pieces
                .get(token as usize)
                .map_or(&[][..], Vec::as_slice);
            // The markers are ASCII: a character cut between tokens cannot hide one.
            self.split.push(&String::from_utf8_lossy(piece));
        }
        if !(was && self.split.thinking()) {
            return false;
        }
        self.spent += 1;
        self.spent >= self.budget
    }

    /// Follows `a` (what the inner constraint forced after a token) and adds the closing marker
    /// where the bound is reached.
    fn follow(&mut self, mut a: Advanced, token: Option<TokenId>) -> Result<Advanced, String> {
        let mut due = token.is_some_and(|t| self.observe(t));
        for &f in &a.forced {
            due |= self.observe(f);
        }
        if due && !a.finished {
            self.split.push(&self.close);
            for &c in &self.close_tokens {
                a.forced.push(c);
                if let Some(inner) = self.inner.as_mut() {
                    let after = inner.advance(c)?;
                    a.finished = after.finished;
                    a.forced.extend(after.forced);
                    if a.finished {
                        break;
                    }
                }
            }
        }
        Ok(a)
    }
}

impl TokenConstraint for ReasoningBudget {
    fn start(&mut self) -> Result<Advanced, String> {
        let a = match self.inner.as_mut() {
            Some(c) => c.start()?,
            None => Advanced::default(),
        };
        self.follow(a, None)
    }

    fn allowed(&mut self) -> Result<Allowed, String> {
        match self.inner.as_mut() {
            Some(c) => c.allowed(),
            None => Ok(Allowed {
                mask: self.every.clone(),
                may_end: true,
            }),
        }
    }

    fn advance(&mut self, token: TokenId) -> Result<Advanced, String> {
        let a = match self.inner.as_mut() {
            Some(c) => c.advance(token)?,
            None => Advanced::default(),
        };
        self.follow(a, Some(token))
    }

    fn valid_prefix(&mut self, tokens: &[TokenId]) -> usize {
        let inner = match self.inner.as_mut() {
            Some(c) => c.valid_prefix(tokens),
            None => tokens.len(),
        };
        // Drafts never run past the bound (what the bound forces there is not drafted).
        if self.split.thinking() {
            inner.min(self.budget.saturating_sub(self.spent + 1))
        } else {
            inner
        }
    }

    fn prepare(&mut self) {
        if let Some(c) = self.inner.as_mut() {
            c.prepare();
        }
    }

    fn timing(&self) -> ConstraintTiming {
        self.inner
            .as_ref()
            .map_or_else(ConstraintTiming::default, |c| c.timing())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn markers() -> ThinkingMarkers {
        ThinkingMarkers::of_template(Some("<think></think>")).expect("markers")
    }

    /// Bytes as single-byte tokens, and one more token: `</think>` as a control token (256).
    fn budget(n: usize, opened: bool, control: bool) -> ReasoningBudget {
        let mut pieces: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        pieces.push(Vec::new());
        let (close_token, close_tokens) = if control {
            (Some(256), vec![256])
        } else {
            (None, b"</think>".iter().map(|&b| b as TokenId).collect())
        };
        ReasoningBudget::new(
            None,
            Arc::new(pieces),
            markers(),
            close_token,
            close_tokens,
            n,
            opened,
        )
    }

    fn run(b: &mut ReasoningBudget, text: &str) -> Vec<Vec<TokenId>> {
        assert!(b.start().unwrap().forced.is_empty());
        text.bytes()
            .map(|t| {
                assert!(b.allowed().unwrap().mask.allows(t as TokenId));
                b.advance(t as TokenId).unwrap().forced
            })
            .collect()
    }

    #[test]
    fn the_marker_is_forced_at_the_bound_and_only_then() {
        let mut b = budget(4, true, false);
        let forced = run(&mut b, "abcdefg");
        let close: Vec<TokenId> = b"</think>".iter().map(|&t| t as TokenId).collect();
        assert_eq!(forced[3], close, "forced after the 4th token of thinking");
        assert!(forced
            .iter()
            .enumerate()
            .all(|(i, f)| i == 3 || f.is_empty()));
        // With the marker as a control token.
        let mut b = budget(2, true, true);
        assert_eq!(run(&mut b, "xyz")[1], vec![256]);
    }

    #[test]
    fn thinking_that_closes_in_time_is_left_alone() {
        let mut b = budget(16, true, false);
        assert!(run(&mut b, "ab</think>\n\nAnswer that goes on and on")
            .iter()
            .all(Vec::is_empty));
        let mut b = budget(3, true, true);
        b.start().unwrap();
        assert!(b.advance(b'a' as TokenId).unwrap().forced.is_empty());
        assert!(b.advance(256).unwrap().forced.is_empty());
        assert!(run_more(&mut b, "long answer").iter().all(Vec::is_empty));
    }

    fn run_more(b: &mut ReasoningBudget, text: &str) -> Vec<Vec<TokenId>> {
        text.bytes()
            .map(|t| b.advance(t as TokenId).unwrap().forced)
            .collect()
    }

    #[test]
    fn thinking_the_model_opens_counts_from_its_marker() {
        let mut b = budget(3, false, false);
        let forced = run(&mut b, "\n<think>abcd");
        assert_eq!(forced.iter().position(|f| !f.is_empty()), Some(10));
        // No thinking at all: nothing is bounded.
        let mut b = budget(3, false, false);
        assert!(run(&mut b, "Just an answer.").iter().all(Vec::is_empty));
    }

    #[test]
    fn drafts_stop_at_the_bound() {
        let mut b = budget(5, true, false);
        run(&mut b, "ab");
        assert_eq!(b.valid_prefix(&[1, 2, 3, 4, 5]), 2);
        let mut b = budget(5, true, false);
        run(&mut b, "ab</think>");
        assert_eq!(b.valid_prefix(&[1, 2, 3, 4, 5]), 5);
    }
}
