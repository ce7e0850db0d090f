//! Constraints on what a request may generate (a JSON schema, a grammar): which tokens may come
//! next, and which tokens the constraint forces. The scheduler applies a request's constraint at
//! every sampled position, also when verifying drafts, so constrained output is the same with
//! speculation on or off. Implementations live outside the core (the grammar engine, with its
//! worker thread); the core only sees this trait.
use crate::TokenId;

/// A set of token ids, one bit each (bit `t % 32` of word `t / 32`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u32>,
}

impl TokenMask {
    /// A mask from its words.
    pub fn from_words(words: Vec<u32>) -> TokenMask {
        TokenMask { words }
    }

    /// A mask allowing exactly `tokens`.
    pub fn of(tokens: &[TokenId]) -> TokenMask {
        let n = tokens
            .iter()
            .map(|&t| t as usize / 32 + 1)
            .max()
            .unwrap_or(0);
        let mut words = vec![0u32; n];
        for &t in tokens {
            words[t as usize / 32] |= 1 << (t % 32);
        }
        TokenMask { words }
    }

    /// Whether `t` is in the set.
    pub fn allows(&self, t: TokenId) -> bool {
        self.words
            .get(t as usize / 32)
            .is_some_and(|w| w & (1 << (t % 32)) != 0)
    }

    /// How many tokens are in the set.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Sets the logits of tokens outside the set to minus infinity.
    pub fn apply(&self, logits: &mut [f32]) {
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let bits = self.words.get(w).copied().unwrap_or(0);
            if bits == u32::MAX {
                continue;
            }
            for (b, l) in chunk.iter_mut().enumerate() {
                if bits & (1 << b) == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }
}

/// What may come next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    /// Tokens the constraint accepts next.
    pub mask: TokenMask,
    /// Whether the output may end here (the request's stop tokens are allowed).
    pub may_end: bool,
}

/// What follows an emitted token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Advanced {
    /// The constraint is complete: nothing more may be generated.
    pub finished: bool,
    /// Tokens the constraint forces next (already taken by the constraint): the request emits
    /// them without sampling and computes them in its next step, like a prompt chunk.
    pub forced: Vec<TokenId>,
}

/// Time spent on masks, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConstraintTiming {
    /// Masks computed.
    pub masks: u64,
    /// Time computing them (off the engine thread where the implementation overlaps it with the
    /// forward pass).
    pub compute_us: u64,
    /// Time the engine thread spent on the constraint: computing masks in place, or, where a
    /// thread computes them ahead, its own calls (moving past tokens, checking drafts) and any
    /// wait for a mask the thread had not finished.
    pub wait_us: u64,
}

/// A constraint on one request's output. Errors are internal failures of the constraint; they
/// finish the request with an error.
pub trait TokenConstraint: Send + std::fmt::Debug {
    /// Tokens forced before the first generated one (already taken by the constraint), and
    /// whether they complete it.
    fn start(&mut self) -> Result<Advanced, String>;
    /// The tokens allowed next.
    fn allowed(&mut self) -> Result<Allowed, String>;
    /// Moves past an emitted token (one that `allowed` allowed).
    fn advance(&mut self, token: TokenId) -> Result<Advanced, String>;
    /// How many of `tokens`, in order, the constraint would accept from here (it does not move).
    fn valid_prefix(&mut self, tokens: &[TokenId]) -> usize;
    /// The engine is about to run the step whose logits the next mask applies to, with this
    /// request's drafts already checked: a constraint that computes masks ahead may start now.
    fn prepare(&mut self) {}
    /// Time spent on masks so far.
    fn timing(&self) -> ConstraintTiming;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_sets_and_applies() {
        let m = TokenMask::of(&[1, 33, 64]);
        assert!(m.allows(1) && m.allows(33) && m.allows(64));
        assert!(!m.allows(0) && !m.allows(2) && !m.allows(65) && !m.allows(10_000));
        assert_eq!(m.count(), 3);
        let mut l = vec![1.0f32; 70];
        m.apply(&mut l);
        let kept: Vec<usize> = (0..70).filter(|&i| l[i].is_finite()).collect();
        assert_eq!(kept, vec![1, 33, 64]);
    }
}
