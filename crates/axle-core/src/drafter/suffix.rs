//! Suffix decoding: a trie of every suffix of a token history, cut at [`DEPTH`] tokens, each node
//! counting how often its string occurred. The current context's longest suffix that occurred
//! before (and went on) is the match; the draft follows the most frequent continuation from there,
//! token by token, while the product of the continuation frequencies stays above
//! [`MIN_PROBABILITY`]. At the trie's depth the draft re-anchors: it matches again with its own
//! tokens as the context's tail. How many of its tokens are sent to verification is the gate's
//! choice (by the match's length class and the measured verify cost).
//!
//! Two tries serve a request: its own (prompt and output, updated per token in O(`DEPTH`)), and one
//! shared by all requests of a scheduler over recent outputs ([`SuffixCache`]: what agents
//! re-emit across requests), bounded by a token budget and rebuilt from the newest documents when
//! it overflows.
//!
//! Memory: at most `DEPTH` nodes per token, fewer where text repeats (about 30 bytes a node).
use crate::TokenId;
use std::collections::{HashMap, VecDeque};

/// Longest string the trie holds.
pub const DEPTH: usize = 16;
/// Longest context suffix matched: the rest of the depth is left for the continuation.
pub const MAX_PATTERN: usize = DEPTH - 4;
/// A draft stops where the estimated chance that all its tokens are right falls below this.
pub const MIN_PROBABILITY: f64 = 0.1;

const NONE: u32 = u32::MAX;
const ROOT: u32 = 0;

#[derive(Debug, Clone, Copy)]
struct Node {
    /// The token on the edge into this node.
    token: TokenId,
    /// Occurrences of this node's string.
    count: u32,
    /// Occurrences that went on to a next token (the sum of the children's counts).
    cont: u32,
    /// The child with the highest count (the newest among equals).
    best: u32,
    /// Length of this node's string.
    depth: u8,
}

/// A suffix match and the draft that follows it.
#[derive(Debug, Clone, PartialEq)]
pub struct SuffixDraft {
    /// Draft tokens.
    pub tokens: Vec<TokenId>,
    /// Tokens of the context the first anchor matched.
    pub match_len: usize,
    /// Estimated chance that the draft's first `j + 1` tokens are all right, per token.
    pub probabilities: Vec<f64>,
}

/// Every suffix of one or more token sequences, cut at [`DEPTH`], with counts.
#[derive(Debug, Clone)]
pub struct SuffixTrie {
    nodes: Vec<Node>,
    children: HashMap<(u32, TokenId), u32>,
    /// The nodes of the suffixes that end at the last token and may still grow.
    active: Vec<u32>,
    tokens: usize,
}

impl Default for SuffixTrie {
    fn default() -> Self {
        SuffixTrie {
            nodes: vec![Node {
                token: 0,
                count: 0,
                cont: 0,
                best: NONE,
                depth: 0,
            }],
            children: HashMap::new(),
            active: Vec::new(),
            tokens: 0,
        }
    }
}

impl SuffixTrie {
    /// A trie over `tokens`.
    pub fn new(tokens: &[TokenId]) -> SuffixTrie {
        let mut t = SuffixTrie::default();
        t.extend(tokens);
        t
    }

    /// Appends tokens to the current sequence.
    pub fn extend(&mut self, tokens: &[TokenId]) {
        for &t in tokens {
            self.push(t);
        }
    }

    /// Appends one token: every suffix ending before it grows by it, and it starts a new one.
    pub fn push(&mut self, t: TokenId) {
        let mut next = Vec::with_capacity(self.active.len() + 1);
        for i in 0..=self.active.len() {
            let parent = if i < self.active.len() {
                self.active[i]
            } else {
                ROOT
            };
            let child = self.grow(parent, t);
            if usize::from(self.nodes[child as usize].depth) < DEPTH {
                next.push(child);
            }
        }
        self.active = next;
        self.tokens += 1;
    }

    /// Ends the current sequence: the next token starts an unrelated one.
    pub fn end_sequence(&mut self) {
        self.active.clear();
    }

    /// Tokens inserted.
    pub fn len(&self) -> usize {
        self.tokens
    }

    /// Whether nothing was inserted.
    pub fn is_empty(&self) -> bool {
        self.tokens == 0
    }

    /// Nodes held (memory is about 30 bytes per node).
    pub fn nodes(&self) -> usize {
        self.nodes.len()
    }

    /// Counts one more occurrence of `parent`'s string followed by `t`.
    fn grow(&mut self, parent: u32, t: TokenId) -> u32 {
        let depth = self.nodes[parent as usize].depth + 1;
        let n = self.nodes.len() as u32;
        let child = *self.children.entry((parent, t)).or_insert(n);
        if child == n {
            self.nodes.push(Node {
                token: t,
                count: 0,
                cont: 0,
                best: NONE,
                depth,
            });
        }
        self.nodes[child as usize].count += 1;
        let count = self.nodes[child as usize].count;
        let p = &mut self.nodes[parent as usize];
        p.cont += 1;
        let best = p.best;
        if best == NONE || best == child || count >= self.nodes[best as usize].count {
            self.nodes[parent as usize].best = child;
        }
        child
    }

    /// The node of `pattern`, if the trie holds it.
    fn find(&self, pattern: &[TokenId]) -> Option<u32> {
        let mut v = ROOT;
        for &t in pattern {
            v = *self.children.get(&(v, t))?;
        }
        Some(v)
    }

    /// The longest suffix of `context` (at most [`MAX_PATTERN`] tokens) that occurred with a next
    /// token: its node and length. Binary search over the length: the trie holds every substring
    /// up to its depth, so if a suffix occurred and went on, every shorter one did.
    fn anchor(&self, context: &[TokenId]) -> Option<(u32, usize)> {
        let went_on = |p: usize| {
            self.find(&context[context.len() - p..])
                .filter(|&v| self.nodes[v as usize].cont > 0)
        };
        let (mut lo, mut hi) = (0, MAX_PATTERN.min(context.len()));
        let mut best = None;
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            match went_on(mid) {
                Some(v) => {
                    best = Some((v, mid));
                    lo = mid;
                }
                None => hi = mid - 1,
            }
        }
        best
    }

    /// The most frequent continuation of `context`: up to `max` tokens, while the estimated chance that all are right stays at or above
    /// [`MIN_PROBABILITY`]. None when no suffix of the context occurred before.
    pub fn draft(&self, context: &[TokenId], max: usize) -> Option<SuffixDraft> {
        let (mut v, match_len) = self.anchor(context)?;
        let limit = max;
        let mut out = SuffixDraft {
            tokens: Vec::with_capacity(limit),
            match_len,
            probabilities: Vec::with_capacity(limit),
        };
        let mut chance = 1.0;
        // The context's tail and the draft so far, for re-anchoring at the trie's depth.
        let mut tail: Vec<TokenId> = context[context.len().saturating_sub(MAX_PATTERN)..].to_vec();
        while out.tokens.len() < limit {
            let node = self.nodes[v as usize];
            if node.best == NONE {
                if usize::from(node.depth) < DEPTH {
                    break; // nothing went on from here
                }
                match self.anchor(&tail) {
                    Some((w, _)) => {
                        v = w;
                        continue;
                    }
                    None => break,
                }
            }
            let b = self.nodes[node.best as usize];
            chance *= f64::from(b.count) / f64::from(node.cont.max(1));
            if chance < MIN_PROBABILITY {
                break;
            }
            out.tokens.push(b.token);
            out.probabilities.push(chance);
            tail.push(b.token);
            v = node.best;
        }
        (!out.tokens.is_empty()).then_some(out)
    }
}

/// Recent outputs of all requests, for drafts across requests: a [`SuffixTrie`] over the newest
/// documents up to a token budget.
#[derive(Debug, Clone)]
pub struct SuffixCache {
    trie: SuffixTrie,
    documents: VecDeque<Vec<TokenId>>,
    held: usize,
    budget: usize,
}

impl SuffixCache {
    /// An empty cache holding up to `budget` tokens (0: holds nothing).
    pub fn new(budget: usize) -> SuffixCache {
        SuffixCache {
            trie: SuffixTrie::default(),
            documents: VecDeque::new(),
            held: 0,
            budget,
        }
    }

    /// Adds a document (a finished request's output with a little of its prompt before it). When
    /// the cache overflows, the oldest documents go until it is three quarters full, and the trie
    /// is rebuilt from the rest.
    pub fn add(&mut self, document: Vec<TokenId>) {
        if document.is_empty() || document.len() > self.budget {
            return;
        }
        self.held += document.len();
        self.trie.extend(&document);
        self.trie.end_sequence();
        self.documents.push_back(document);
        if self.held > self.budget {
            while self.held > self.budget * 3 / 4 {
                match self.documents.pop_front() {
                    Some(d) => self.held -= d.len(),
                    None => break,
                }
            }
            self.trie = SuffixTrie::default();
            for d in &self.documents {
                self.trie.extend(d);
                self.trie.end_sequence();
            }
        }
    }

    /// Forgets every document.
    pub fn clear(&mut self) {
        *self = SuffixCache::new(self.budget);
    }

    /// Tokens held.
    pub fn len(&self) -> usize {
        self.held
    }

    /// Most tokens held.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.held == 0
    }

    /// The draft the cache offers after `context` ([`SuffixTrie::draft`]).
    pub fn draft(&self, context: &[TokenId], max: usize) -> Option<SuffixDraft> {
        self.trie.draft(context, max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The trie's counts, recomputed by brute force: occurrences of `s` in `text` (cut at DEPTH).
    fn occurrences(text: &[TokenId], s: &[TokenId]) -> u32 {
        text.windows(s.len()).filter(|w| *w == s).count() as u32
    }

    #[test]
    fn counts_equal_occurrences() {
        let text: Vec<TokenId> = [1, 2, 3, 1, 2, 4, 1, 2, 3, 5, 1, 2, 3].to_vec();
        let t = SuffixTrie::new(&text);
        for s in [&[1][..], &[1, 2], &[1, 2, 3], &[2, 3, 1], &[3, 5], &[9]] {
            let got = t.find(s).map_or(0, |v| t.nodes[v as usize].count);
            assert_eq!(got, occurrences(&text, s), "{s:?}");
        }
        // "1 2 3" occurred 3 times; the last occurrence has no next token yet.
        let v = t.find(&[1, 2, 3]).expect("held");
        assert_eq!(
            (t.nodes[v as usize].count, t.nodes[v as usize].cont),
            (3, 2)
        );
    }

    #[test]
    fn draft_follows_the_most_frequent_continuation() {
        // After "7 8" came 9 twice and 6 once: the draft takes 9.
        let t = SuffixTrie::new(&[7, 8, 9, 1, 7, 8, 6, 2, 7, 8, 9, 1, 0, 7, 8]);
        let d = t.draft(&[0, 7, 8], 8).expect("a match");
        assert_eq!(d.match_len, 2, "'0 7 8' never occurred before, '7 8' did");
        assert_eq!(d.tokens[..2], [9, 1]);
        assert!((d.probabilities[0] - 2.0 / 3.0).abs() < 1e-12);
        assert!(t.draft(&[42], 8).is_none());
    }

    #[test]
    fn a_copy_drafts_past_the_tries_depth() {
        let doc: Vec<TokenId> = (100..160).collect();
        let mut t = SuffixTrie::new(&doc);
        t.push(7);
        t.extend(&doc[..20]);
        let context: Vec<TokenId> = [&doc[..], &[7], &doc[..20]].concat();
        let d = t.draft(&context, 40).expect("a match");
        assert_eq!(d.match_len, MAX_PATTERN);
        assert_eq!(d.tokens, doc[20..60].to_vec());
        assert!(d.probabilities.iter().all(|&p| p == 1.0));
        let long = SuffixTrie::new(&[&doc[..], &doc[..]].concat());
        let d = long.draft(&doc[..30], 40).expect("a match");
        assert_eq!(
            d.tokens,
            [&doc[30..], &doc[..10]].concat(),
            "the text was periodic"
        );
    }

    #[test]
    fn unlikely_continuations_are_not_drafted() {
        // "5 6" went on eleven different ways: a chance of 1/11 each, below the floor.
        let mut text = Vec::new();
        for i in 0..11 {
            text.extend([5, 6, 200 + i, 300 + i]);
        }
        assert!(SuffixTrie::new(&text).draft(&[5, 6], 8).is_none());
        // Four ways, one of them twice: that one, at 2/5, and then what followed it.
        let t = SuffixTrie::new(&[&text[..16], &[5, 6, 201, 301]].concat());
        let d = t.draft(&[5, 6], 8).expect("a match");
        assert_eq!(d.tokens[..4], [201, 301, 5, 6]);
        // Each later token is the only one that ever followed: the chance stays at 2/5.
        assert!(d.probabilities.iter().all(|&p| (p - 0.4).abs() < 1e-12));
    }

    #[test]
    fn cache_keeps_the_newest_documents_within_its_budget() {
        let mut c = SuffixCache::new(100);
        for i in 0..10u32 {
            c.add((0..30).map(|j| i * 1000 + j).collect());
        }
        assert!(c.len() <= 100 && c.len() >= 60, "{}", c.len());
        // The newest document is held, the oldest is not.
        assert!(c.draft(&[9000, 9001, 9002], 4).is_some());
        assert!(c.draft(&[0, 1, 2], 4).is_none());
        // Documents do not run into each other: the end of one is not followed by the next.
        assert!(c.draft(&[9027, 9028, 9029], 4).is_none());
        c.clear();
        assert!(c.is_empty() && c.draft(&[9000, 9001], 4).is_none());
    }
}
