//! N-gram prompt lookup: the continuation after the earlier occurrence of the current suffix that
//! matches it longest, among the latest few occurrences of its last three tokens (or the latest of
//! its last two), and past the end of history a chain through trigram / bigram "next token"
//! tables. Updated in O(1) per token.
use crate::TokenId;
use std::collections::HashMap;

/// Earlier occurrences of a trigram kept for prompt lookup (the latest ones).
const CANDIDATES: usize = 8;
/// Longest suffix match measured (enough to tell a copy from a chance match).
const MAX_MATCH: usize = 32;

/// The latest `CANDIDATES` positions in a fixed ring (O(1) insert), iterated newest first.
#[derive(Debug, Clone, Copy, Default)]
struct Recent {
    at: [usize; CANDIDATES],
    len: usize,
    next: usize,
}

impl Recent {
    fn push(&mut self, i: usize) {
        self.at[self.next] = i;
        self.next = (self.next + 1) % CANDIDATES;
        self.len = (self.len + 1).min(CANDIDATES);
    }

    /// Newest first.
    fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        (1..=self.len).map(move |j| self.at[(self.next + CANDIDATES - j) % CANDIDATES])
    }

    fn latest(&self) -> Option<usize> {
        self.iter().next()
    }
}

/// A suffix match: where its earlier occurrence continues, and how many tokens matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// Index of the token after the earlier occurrence.
    pub start: usize,
    /// Tokens matched.
    pub len: usize,
}

/// One sequence's history with its n-gram tables.
#[derive(Debug, Clone, Default)]
pub struct NgramIndex {
    tokens: Vec<TokenId>,
    /// Continuation indexes after the latest earlier occurrences of each trigram, and after the
    /// latest occurrence of each bigram.
    after3: HashMap<[TokenId; 3], Recent>,
    after2: HashMap<[TokenId; 2], usize>,
}

impl NgramIndex {
    /// Appends a token, indexing the n-grams that now have a continuation.
    pub fn push(&mut self, t: TokenId) {
        let n = self.tokens.len();
        if n >= 2 {
            self.after2
                .insert([self.tokens[n - 2], self.tokens[n - 1]], n);
        }
        if n >= 3 {
            self.after3
                .entry([self.tokens[n - 3], self.tokens[n - 2], self.tokens[n - 1]])
                .or_default()
                .push(n);
        }
        self.tokens.push(t);
    }

    /// The history.
    pub fn tokens(&self) -> &[TokenId] {
        &self.tokens
    }

    /// How many tokens before the continuation index `start` equal the current suffix (at most
    /// `MAX_MATCH`).
    fn match_len(&self, start: usize) -> usize {
        let n = self.tokens.len();
        (0..MAX_MATCH.min(start))
            .take_while(|&j| self.tokens[start - 1 - j] == self.tokens[n - 1 - j])
            .count()
    }

    /// The earlier occurrence of the current suffix that matches it longest: among the latest
    /// occurrences of its last three tokens (the newest wins ties), else the latest of its last
    /// two.
    pub fn lookup(&self) -> Option<Found> {
        let n = self.tokens.len();
        if n >= 3 {
            let key = [self.tokens[n - 3], self.tokens[n - 2], self.tokens[n - 1]];
            if let Some(recent) = self.after3.get(&key) {
                let mut best: Option<Found> = None;
                for start in recent.iter() {
                    let len = self.match_len(start);
                    if best.is_none_or(|b| len > b.len) {
                        best = Some(Found { start, len });
                    }
                }
                return best;
            }
        }
        if n >= 2 {
            if let Some(&start) = self.after2.get(&[self.tokens[n - 2], self.tokens[n - 1]]) {
                return Some(Found {
                    start,
                    len: self.match_len(start),
                });
            }
        }
        None
    }

    /// Up to `k` tokens continuing the history from index `start`.
    pub fn continuation(&self, start: usize, k: usize) -> Vec<TokenId> {
        let n = self.tokens.len();
        // Copy the earlier continuation; it may run into the current suffix (periodic text).
        let mut out = Vec::with_capacity(k);
        let mut i = start;
        while out.len() < k && i < n {
            out.push(self.tokens[i]);
            i += 1;
        }
        // Past the end of history, continue by chaining trigram/bigram lookups over the draft.
        while out.len() < k {
            let mut ctx: Vec<TokenId> = self.tokens[n.saturating_sub(3)..].to_vec();
            ctx.extend_from_slice(&out);
            let m = ctx.len();
            let next = (m >= 3)
                .then(|| {
                    self.after3
                        .get(&[ctx[m - 3], ctx[m - 2], ctx[m - 1]])
                        .and_then(Recent::latest)
                })
                .flatten()
                .or_else(|| self.after2.get(&[ctx[m - 2], ctx[m - 1]]).copied());
            match next {
                Some(j) if j < n => out.push(self.tokens[j]),
                _ => break,
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(tokens: &[TokenId]) -> NgramIndex {
        let mut x = NgramIndex::default();
        for &t in tokens {
            x.push(t);
        }
        x
    }

    #[test]
    fn lookup_prefers_the_occurrence_that_matches_longest() {
        // "1 2 3" occurs twice; the current suffix "8 9 1 2 3" matches the older occurrence over
        // five tokens and the newer one over three, so the older continuation wins.
        let x = index(&[
            8, 9, 1, 2, 3, 40, 41, 42, 43, 7, 1, 2, 3, 50, 51, 52, 53, 8, 9, 1, 2, 3,
        ]);
        let f = x.lookup().expect("a match");
        assert_eq!(
            (f.len, x.continuation(f.start, 4)),
            (5, vec![40, 41, 42, 43])
        );
        // With no longer match, the newest occurrence wins.
        let x = index(&[1, 2, 3, 40, 41, 1, 2, 3, 50, 51, 6, 1, 2, 3]);
        let f = x.lookup().expect("a match");
        assert_eq!(x.continuation(f.start, 2), vec![50, 51]);
    }
}
