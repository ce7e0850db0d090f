//! N-gram self-speculation: the sequence's own context proposes its next tokens, with no draft
//! model. Two sources, both updated in O(1) per token: prompt lookup (the continuation after the
//! most recent earlier occurrence of the current 3- or 2-token suffix) and, failing that, a chain
//! through trigram / bigram "next token" tables. A gate keeps drafting only while it pays: an
//! exponential moving average of the acceptance rate pauses drafting below a threshold, and the
//! draft length is the one that maximises expected accepted tokens per unit of verify cost.
//!
//! While the gate holds drafting back, the drafter keeps a *shadow* draft: what it would have
//! proposed, checked for free against the tokens the model then really produces. Shadow outcomes
//! feed the same EMA, so the gate reopens as soon as the context turns predictable again (a
//! paused gate can never learn that from real drafts, because it makes none).
use crate::TokenId;
use std::collections::HashMap;

/// The longest draft a verify step may carry.
pub const MAX_DRAFT: usize = 8;

/// Acceptance by draft position: how often position `j` of a draft was checked against the model
/// (every earlier draft token having been accepted) and how often it was accepted. Shows where a
/// draft stops paying: `accepted[j] / tested[j]` is the conditional acceptance of position `j`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PositionStats {
    /// Times position `j` was checked.
    pub tested: [u32; MAX_DRAFT],
    /// Times position `j` was accepted.
    pub accepted: [u32; MAX_DRAFT],
}

impl PositionStats {
    /// Records one verify step: `accepted` of `drafted` draft tokens matched.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        for j in 0..drafted.min(MAX_DRAFT) {
            if j <= accepted {
                self.tested[j] += 1;
            }
            if j < accepted {
                self.accepted[j] += 1;
            }
        }
    }

    /// Adds another request's counts.
    pub fn add(&mut self, other: &PositionStats) {
        for j in 0..MAX_DRAFT {
            self.tested[j] += other.tested[j];
            self.accepted[j] += other.accepted[j];
        }
    }

    /// Conditional acceptance rate per position, up to the last position ever checked.
    pub fn rates(&self) -> Vec<f64> {
        let n = self
            .tested
            .iter()
            .rposition(|&t| t > 0)
            .map_or(0, |i| i + 1);
        (0..n)
            .map(|j| self.accepted[j] as f64 / f64::from(self.tested[j].max(1)))
            .collect()
    }
}

/// Gate and length settings.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftConfig {
    /// Longest draft (1..=MAX_DRAFT).
    pub max_len: usize,
    /// EMA smoothing of the acceptance rate.
    pub alpha: f64,
    /// Drafting pauses while the EMA is below this.
    pub min_acceptance: f64,
    /// Tokens to wait before retrying after a pause (unless a long match appears first).
    pub cooldown: usize,
    /// Cost of a verify step with k draft tokens relative to a plain decode step, for k = 0..=max
    /// (index 0 is 1.0). Measured by the engine on the machine and model at start-up.
    pub verify_cost: Vec<f64>,
}

impl Default for DraftConfig {
    fn default() -> Self {
        DraftConfig {
            max_len: 4,
            alpha: 0.1,
            min_acceptance: 0.5,
            cooldown: 16,
            verify_cost: Vec::new(),
        }
    }
}

impl DraftConfig {
    /// The draft length with the best expected tokens per unit cost, given per-token acceptance
    /// probability `p`; 0 when no length beats a plain decode step.
    pub fn best_len(&self, p: f64, available: usize) -> usize {
        let mut best = (1.0, 0usize); // plain decode: 1 token per unit cost
        let mut expected = 1.0; // the model's own token is always gained
        let mut pk = 1.0;
        for k in 1..=self.max_len.min(available) {
            pk *= p;
            expected += pk;
            let cost = self
                .verify_cost
                .get(k)
                .copied()
                .unwrap_or(1.0 + 0.1 * k as f64);
            let value = expected / cost;
            if value > best.0 * 1.02 {
                best = (value, k);
            }
        }
        best.1
    }
}

/// Per-sequence n-gram state.
#[derive(Debug, Clone)]
pub struct Drafter {
    tokens: Vec<TokenId>,
    /// Continuation index after the latest earlier occurrence of each trigram / bigram.
    after3: HashMap<[TokenId; 3], usize>,
    after2: HashMap<[TokenId; 2], usize>,
    /// EMA of the per-token acceptance rate (optimistic start).
    ema: f64,
    paused_until: Option<usize>,
    /// The pending shadow draft and how many of its tokens the model has matched so far.
    shadow: Vec<TokenId>,
    shadow_matched: usize,
    /// Finished shadow drafts not yet folded into the EMA: (drafted, accepted) each.
    shadow_outcomes: Vec<(usize, usize)>,
    /// Shadow drafts checked (statistics).
    pub shadow_checks: usize,
    /// Totals for statistics.
    pub drafted: usize,
    /// Accepted draft tokens.
    pub accepted: usize,
    /// Verify steps.
    pub verifies: usize,
    /// Acceptance by draft position.
    pub positions: PositionStats,
}

impl Drafter {
    /// A drafter over the initial tokens (the prompt).
    pub fn new(prompt: &[TokenId]) -> Drafter {
        let mut d = Drafter {
            tokens: Vec::with_capacity(prompt.len() + 256),
            after3: HashMap::new(),
            after2: HashMap::new(),
            ema: 0.8,
            paused_until: None,
            shadow: Vec::new(),
            shadow_matched: 0,
            shadow_outcomes: Vec::new(),
            shadow_checks: 0,
            drafted: 0,
            accepted: 0,
            verifies: 0,
            positions: PositionStats::default(),
        };
        for &t in prompt {
            d.push(t);
        }
        d
    }

    /// Appends a token, indexing the n-grams that now have a continuation.
    pub fn push(&mut self, t: TokenId) {
        let n = self.tokens.len();
        if n >= 2 {
            self.after2
                .insert([self.tokens[n - 2], self.tokens[n - 1]], n);
        }
        if n >= 3 {
            self.after3.insert(
                [self.tokens[n - 3], self.tokens[n - 2], self.tokens[n - 1]],
                n,
            );
        }
        self.tokens.push(t);
        if self.shadow_matched < self.shadow.len() {
            if self.shadow[self.shadow_matched] == t {
                self.shadow_matched += 1;
                if self.shadow_matched == self.shadow.len() {
                    self.finish_shadow();
                }
            } else {
                self.finish_shadow();
            }
        }
    }

    fn finish_shadow(&mut self) {
        self.shadow_outcomes
            .push((self.shadow.len(), self.shadow_matched));
        self.shadow.clear();
        self.shadow_matched = 0;
    }

    fn learn(&mut self, cfg: &DraftConfig, drafted: usize, accepted: usize) {
        let rate = accepted as f64 / drafted as f64;
        self.ema = (1.0 - cfg.alpha) * self.ema + cfg.alpha * rate;
    }

    /// Tokens seen.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether no token was seen.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Current acceptance EMA.
    pub fn acceptance(&self) -> f64 {
        self.ema
    }

    /// Where the current suffix occurred before (continuation index) and the match length.
    fn lookup(&self) -> Option<(usize, usize)> {
        let n = self.tokens.len();
        if n >= 3 {
            if let Some(&i) =
                self.after3
                    .get(&[self.tokens[n - 3], self.tokens[n - 2], self.tokens[n - 1]])
            {
                return Some((i, 3));
            }
        }
        if n >= 2 {
            if let Some(&i) = self.after2.get(&[self.tokens[n - 2], self.tokens[n - 1]]) {
                return Some((i, 2));
            }
        }
        None
    }

    /// Proposes up to `cfg`-chosen many draft tokens (possibly none).
    pub fn propose(&mut self, cfg: &DraftConfig, room: usize) -> Vec<TokenId> {
        for (d, a) in std::mem::take(&mut self.shadow_outcomes) {
            self.shadow_checks += 1;
            self.learn(cfg, d, a);
        }
        let n = self.tokens.len();
        let found = self.lookup();
        let mut draft = true;
        if let Some(until) = self.paused_until {
            // Shadow drafts that would have been accepted, or a fresh long match, lift the pause
            // early; otherwise wait out the cool-down.
            let strong = matches!(found, Some((_, 3)));
            if n < until && !strong && self.ema < cfg.min_acceptance {
                draft = false;
            } else {
                self.paused_until = None;
                self.ema = cfg.min_acceptance.max(self.ema);
            }
        }
        let Some((start, _)) = found else {
            return Vec::new();
        };
        let k = if draft {
            cfg.best_len(self.ema, room)
        } else {
            0
        };
        if k == 0 {
            // Held back: keep a shadow draft to learn whether drafting would pay now.
            if self.shadow.is_empty() {
                self.shadow = self.continuation(start, cfg.max_len);
                self.shadow_matched = 0;
            }
            return Vec::new();
        }
        // A real draft supersedes any shadow.
        self.shadow.clear();
        self.shadow_matched = 0;
        self.continuation(start, k)
    }

    /// Up to `k` tokens continuing the history from index `start`.
    fn continuation(&self, start: usize, k: usize) -> Vec<TokenId> {
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
                .then(|| self.after3.get(&[ctx[m - 3], ctx[m - 2], ctx[m - 1]]))
                .flatten()
                .or_else(|| self.after2.get(&[ctx[m - 2], ctx[m - 1]]));
            match next {
                Some(&j) if j < n => out.push(self.tokens[j]),
                _ => break,
            }
        }
        out
    }

    /// Records a verify outcome: `accepted` of `drafted` tokens matched.
    pub fn record(&mut self, cfg: &DraftConfig, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        self.drafted += drafted;
        self.accepted += accepted;
        self.verifies += 1;
        self.positions.record(drafted, accepted);
        self.learn(cfg, drafted, accepted);
        if self.ema < cfg.min_acceptance {
            self.paused_until = Some(self.tokens.len() + cfg.cooldown);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_continuation_of_repeated_text() {
        let cfg = DraftConfig {
            verify_cost: vec![1.0, 1.1, 1.2, 1.3, 1.4],
            ..Default::default()
        };
        let mut d = Drafter::new(&[1, 2, 3, 4, 5, 6, 7, 9, 1, 2, 3]);
        assert_eq!(d.propose(&cfg, 8), vec![4, 5, 6, 7]);
        d.push(4);
        assert_eq!(d.propose(&cfg, 8), vec![5, 6, 7, 9]);
        assert_eq!(d.propose(&cfg, 2), vec![5, 6], "limited by room");
    }

    #[test]
    fn gate_pauses_on_low_acceptance_and_costs_bound_length() {
        let cfg = DraftConfig {
            verify_cost: vec![1.0, 1.1, 1.2, 1.3, 1.4],
            ..Default::default()
        };
        let mut d = Drafter::new(&[5, 6, 7, 8, 5, 6]);
        for _ in 0..20 {
            d.record(&cfg, 4, 0);
        }
        assert!(d.acceptance() < 0.5);
        d.push(9);
        d.push(10);
        assert!(d.propose(&cfg, 8).is_empty(), "paused");
        // Expensive verification: drafting never pays.
        let dear = DraftConfig {
            verify_cost: vec![1.0, 2.5, 3.5, 4.5, 5.5],
            ..Default::default()
        };
        assert_eq!(dear.best_len(0.9, 8), 0);
        assert_eq!(cfg.best_len(0.95, 8), 4);
        assert_eq!(cfg.best_len(0.05, 8), 0);
    }

    /// Verify costs like SmolLM2's on 2 cores: drafting pays only at high acceptance.
    fn dear() -> DraftConfig {
        DraftConfig {
            verify_cost: vec![1.0, 1.6, 2.2, 2.6, 3.3],
            ..Default::default()
        }
    }

    #[test]
    fn shadow_drafts_reopen_the_gate_when_the_text_turns_predictable() {
        let cfg = dear();
        assert_eq!(cfg.best_len(cfg.min_acceptance, 8), 0);
        let pattern: Vec<TokenId> = (1..=8).collect();
        let mut d = Drafter::new(&[pattern.clone(), pattern.clone(), vec![100]].concat());
        for _ in 0..20 {
            d.record(&cfg, 4, 0);
        }
        assert!(d.acceptance() < cfg.min_acceptance);
        // The pattern again. A lifted pause resumes at the threshold acceptance, where no draft
        // length pays at these costs, so without shadow drafts the gate would stay shut for good;
        // shadow drafts match, the acceptance estimate climbs, and real drafting resumes.
        let mut reopened_after = None;
        for (i, &t) in pattern.iter().cycle().take(64).enumerate() {
            if !d.propose(&cfg, 8).is_empty() {
                reopened_after = Some(i);
                break;
            }
            d.push(t);
        }
        let i = reopened_after.expect("shadow drafts should reopen the gate");
        assert!(d.shadow_checks > 0, "reopened after {i} tokens");
        assert!(d.acceptance() > 0.6);
        assert_eq!(d.drafted, 80, "shadow drafts are not counted as drafted");
    }

    #[test]
    fn shadow_misses_keep_the_gate_shut() {
        let cfg = dear();
        // After 9 1 2 the model says something new each time, so every shadow draft fails there.
        let mut d = Drafter::new(&[9, 1, 2, 3, 4, 9]);
        for _ in 0..20 {
            d.record(&cfg, 4, 0);
        }
        for i in 0..30 {
            for t in [1, 2, 100 + i, 9] {
                let draft = d.propose(&cfg, 8);
                assert!(draft.is_empty(), "drafted {draft:?}");
                d.push(t);
            }
        }
        assert!(d.shadow_checks > 10);
        assert!(d.acceptance() < cfg.min_acceptance);
    }

    #[test]
    fn position_stats_count_checked_and_accepted_positions() {
        let mut p = PositionStats::default();
        p.record(4, 4); // all four accepted
        p.record(4, 1); // first accepted, second rejected, last two never checked
        p.record(2, 0); // first rejected
        assert_eq!(&p.tested[..5], &[3, 2, 1, 1, 0]);
        assert_eq!(&p.accepted[..5], &[2, 1, 1, 1, 0]);
        let r = p.rates();
        assert_eq!(r.len(), 4);
        assert!((r[0] - 2.0 / 3.0).abs() < 1e-12 && r[1] == 0.5 && r[3] == 1.0);
        let mut q = PositionStats::default();
        q.add(&p);
        q.add(&p);
        assert_eq!(q.tested[0], 6);
    }
}
