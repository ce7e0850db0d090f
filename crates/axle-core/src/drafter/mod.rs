//! Drafting: proposals of a sequence's next tokens, verified by the model in one step. Sources
//! ([`DraftSource`]): n-gram prompt lookup ([`ngram`]) and suffix decoding ([`suffix`]) over the
//! sequence's own tokens and over recent outputs of all requests ([`SuffixCache`]), free to
//! consult; and a draft model, which the scheduler asks through [`ModelDrafter`] (the engine runs
//! it) only where no free source matched a copy (a long match). Each step every free source the
//! request has on proposes a draft; the one whose match is longest (then whose draft is longest)
//! goes to the gate, unless the draft model was asked.
//!
//! A gate keeps drafting only while it pays. Acceptance is estimated per draft position (the chance
//! that a draft token is accepted given that the ones before it were: every checked position is
//! one trial, EMA with `DraftConfig::alpha`), separately for short, medium and long suffix
//! matches, since a suffix that matched 12 tokens back predicts far better than a chance bigram.
//! The draft length is the one that maximises expected accepted tokens per unit of measured
//! verify cost at that estimate (0: no draft). On top, an overall estimate pauses drafting below a
//! threshold until a long match appears or a cool-down passes.
//!
//! While the gate holds drafting back, the drafter keeps a *shadow* draft: what it would have
//! proposed, checked for free against the tokens the model then really produces. Shadow outcomes
//! feed the same estimates, so the gate reopens as soon as the context turns predictable again (a
//! paused gate can never learn that from real drafts, because it makes none).
use crate::TokenId;
use smart_default::SmartDefault;

pub mod ngram;
pub mod suffix;

pub use ngram::NgramIndex;
pub use suffix::{SuffixCache, SuffixDraft, SuffixTrie};

/// The longest draft a verify step may carry. Accelerators keep a verify row's arithmetic equal to
/// a decode row's for steps of up to 9 tokens of a sequence (`SMALL_TOKENS` in
/// `axle_models::device_step`); a longer verify step would be computed as a prefill chunk.
pub const MAX_DRAFT: usize = 8;

/// Where a draft came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DraftSource {
    /// N-gram prompt lookup over the sequence's own tokens.
    Ngram = 0,
    /// Suffix decoding over the sequence's own tokens and recent outputs of all requests.
    Suffix = 1,
    /// A smaller model with the same vocabulary.
    Model = 2,
    /// The model's own next-token-prediction head (an MTP block of its file).
    Mtp = 3,
}

/// How many draft sources there are.
pub const DRAFT_SOURCES: usize = 4;

/// Draft counts per source, indexed by `DraftSource as usize`.
pub type BySource = [SourceCounts; DRAFT_SOURCES];

impl DraftSource {
    /// Every source.
    pub const ALL: [DraftSource; DRAFT_SOURCES] = [
        DraftSource::Ngram,
        DraftSource::Suffix,
        DraftSource::Model,
        DraftSource::Mtp,
    ];

    /// Its name in options, counters and reports.
    pub fn name(self) -> &'static str {
        match self {
            DraftSource::Ngram => "ngram",
            DraftSource::Suffix => "suffix",
            DraftSource::Model => "model",
            DraftSource::Mtp => "mtp",
        }
    }
}

/// Which sources a request's drafter consults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, SmartDefault)]
pub struct DraftSources {
    /// N-gram prompt lookup.
    #[default(true)]
    pub ngram: bool,
    /// Suffix decoding.
    #[default(true)]
    pub suffix: bool,
    /// The draft model (where the engine has one).
    #[default(true)]
    pub model: bool,
    /// The model's MTP head (where its file has one and no draft model is given).
    #[default(true)]
    pub mtp: bool,
}

impl DraftSources {
    /// Parses a comma-separated list of source names (`ngram`, `suffix`, `model`, `mtp`), or
    /// `all`.
    pub fn parse(text: &str) -> Result<DraftSources, String> {
        let mut s = DraftSources {
            ngram: false,
            suffix: false,
            model: false,
            mtp: false,
        };
        for name in text.split(',').map(str::trim) {
            match name {
                "ngram" => s.ngram = true,
                "suffix" => s.suffix = true,
                "model" => s.model = true,
                "mtp" => s.mtp = true,
                "all" => s = DraftSources::default(),
                other => {
                    return Err(format!(
                        "unknown drafter '{other}' (known: ngram, suffix, model, mtp, all)"
                    ))
                }
            }
        }
        Ok(s)
    }

    /// Whether `source` is on.
    pub fn has(self, source: DraftSource) -> bool {
        match source {
            DraftSource::Ngram => self.ngram,
            DraftSource::Suffix => self.suffix,
            DraftSource::Model => self.model,
            DraftSource::Mtp => self.mtp,
        }
    }

    /// The names of the sources on, comma-separated.
    pub fn names(self) -> String {
        DraftSource::ALL
            .iter()
            .filter(|&&d| self.has(d))
            .map(|d| d.name())
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Draft counts of one source.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SourceCounts {
    /// Draft tokens proposed.
    pub drafted: usize,
    /// Draft tokens accepted.
    pub accepted: usize,
    /// Verify steps with its drafts.
    pub verifies: usize,
}

impl SourceCounts {
    /// Adds another's counts.
    pub fn add(&mut self, other: &SourceCounts) {
        self.drafted += other.drafted;
        self.accepted += other.accepted;
        self.verifies += other.verifies;
    }
}

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
#[derive(Debug, Clone, PartialEq, SmartDefault)]
pub struct DraftConfig {
    /// Longest draft (1..=MAX_DRAFT).
    #[default(4)]
    pub max_len: usize,
    /// EMA smoothing of the acceptance rate.
    #[default(0.1)]
    pub alpha: f64,
    /// A verify outcome that leaves the overall estimate below this pauses drafting (until a long
    /// match appears or the cool-down passes).
    #[default(0.5)]
    pub min_acceptance: f64,
    /// Tokens to wait before retrying after a pause (unless a long match appears first).
    #[default(16)]
    pub cooldown: usize,
    /// Cost of a verify step with k draft tokens relative to a plain decode step, for k = 0..=max
    /// (index 0 is 1.0). Measured by the engine on the machine and model at start-up.
    pub verify_cost: Vec<f64>,
    /// The sources drafts come from.
    pub sources: DraftSources,
    /// Tokens of recent outputs the scheduler keeps for suffix drafts across requests.
    #[default(32768)]
    pub shared_tokens: usize,
    /// The draft model's step cost relative to the target's decode step (None: no draft model).
    pub model_cost: Option<f64>,
    /// What the engine's model drafter is: a draft model ([`DraftSource::Model`]) or the
    /// model's MTP head ([`DraftSource::Mtp`]); its drafts count under this source.
    #[default(DraftSource::Model)]
    pub model_source: DraftSource,
}

impl DraftConfig {
    /// The draft length with the best expected tokens per unit cost, given per-position acceptance
    /// probability `p`; a longer draft must beat the best shorter choice (plain decoding first) by
    /// 2%, so 0 when none does.
    pub fn best_len(&self, p: f64, available: usize) -> usize {
        self.best_len_with(p, available, 0.0)
    }

    /// [`DraftConfig::best_len`] where each draft token also costs `per_token` (a draft model's
    /// step, relative to a decode step).
    pub fn best_len_with(&self, p: f64, available: usize, per_token: f64) -> usize {
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
                .unwrap_or(1.0 + 0.1 * k as f64)
                + per_token * k as f64;
            let value = expected / cost;
            if value > best.0 * 1.02 {
                best = (value, k);
            }
        }
        best.1
    }
}

/// How long the current suffix matched its earlier occurrence: the classes the gate keeps
/// acceptance estimates for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchClass {
    /// 2 or 3 tokens: often a common phrase, not a copy.
    Short = 0,
    /// 4 to 7 tokens.
    Medium = 1,
    /// 8 tokens or more: the text is being copied.
    Long = 2,
    /// Not a match: a draft model's proposal.
    Model = 3,
}

impl MatchClass {
    /// The class of a suffix match of `len` tokens.
    pub fn of(len: usize) -> MatchClass {
        match len {
            0..=3 => MatchClass::Short,
            4..=7 => MatchClass::Medium,
            _ => MatchClass::Long,
        }
    }

    /// Starting acceptance estimate before any evidence.
    fn prior(self) -> f64 {
        match self {
            MatchClass::Short => 0.6,
            MatchClass::Medium => 0.8,
            MatchClass::Long => 0.9,
            MatchClass::Model => 0.7,
        }
    }
}

/// A source's proposal before the gate.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// Draft tokens (up to the longest draft).
    pub tokens: Vec<TokenId>,
    /// Context tokens its match covered.
    pub match_len: usize,
    /// Its source.
    pub source: DraftSource,
}

impl Candidate {
    /// Order between sources' proposals: the longer match (more context behind the same
    /// continuation: the n-gram lookup measures up to 32 tokens, the suffix trie up to
    /// [`suffix::MAX_PATTERN`]), then the longer draft; among equals the earlier source.
    fn rank(&self) -> (usize, usize) {
        (self.match_len, self.tokens.len())
    }
}

/// Per-sequence drafting state: the sources' indexes and the gate.
#[derive(Debug, Clone)]
pub struct Drafter {
    tokens: Vec<TokenId>,
    ngram: Option<NgramIndex>,
    suffix: Option<SuffixTrie>,
    /// Overall per-position acceptance estimate (drives the pause).
    ema: f64,
    /// Per-position acceptance estimate by match class (drives the draft length).
    by_class: [f64; 4],
    paused_until: Option<usize>,
    /// Class and source of the draft last proposed.
    draft_class: MatchClass,
    draft_source: DraftSource,
    /// The pending shadow draft, its match class, and how many of its tokens the model has
    /// matched so far.
    shadow: Vec<TokenId>,
    shadow_class: MatchClass,
    shadow_matched: usize,
    /// Finished shadow drafts not yet folded into the estimates: (drafted, accepted, class).
    shadow_outcomes: Vec<(usize, usize, MatchClass)>,
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
    /// Counts by source (indexed by `DraftSource as usize`).
    pub by_source: BySource,
    /// Tokens seen when the draft model last drafted (for its probes while its estimate is low).
    model_at: usize,
    /// Sources on.
    sources: DraftSources,
}

impl Drafter {
    /// A drafter over the initial tokens (the prompt), consulting `sources`.
    pub fn new(prompt: &[TokenId], sources: DraftSources) -> Drafter {
        let mut d = Drafter {
            tokens: Vec::with_capacity(prompt.len() + 256),
            ngram: sources.ngram.then(NgramIndex::default),
            suffix: sources.suffix.then(SuffixTrie::default),
            ema: 0.8,
            by_class: [
                MatchClass::Short.prior(),
                MatchClass::Medium.prior(),
                MatchClass::Long.prior(),
                MatchClass::Model.prior(),
            ],
            paused_until: None,
            draft_class: MatchClass::Short,
            draft_source: DraftSource::Ngram,
            shadow: Vec::new(),
            shadow_class: MatchClass::Short,
            shadow_matched: 0,
            shadow_outcomes: Vec::new(),
            shadow_checks: 0,
            drafted: 0,
            accepted: 0,
            verifies: 0,
            positions: PositionStats::default(),
            by_source: BySource::default(),
            model_at: 0,
            sources,
        };
        for &t in prompt {
            d.push(t);
        }
        d
    }

    /// Appends a token to every source's index.
    pub fn push(&mut self, t: TokenId) {
        self.tokens.push(t);
        if let Some(x) = self.ngram.as_mut() {
            x.push(t);
        }
        if let Some(x) = self.suffix.as_mut() {
            x.push(t);
        }
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
            .push((self.shadow.len(), self.shadow_matched, self.shadow_class));
        self.shadow.clear();
        self.shadow_matched = 0;
    }

    /// Folds one draft's outcome into the estimates: each checked position is one trial (the
    /// accepted ones, then the first rejected one if any).
    fn learn(&mut self, cfg: &DraftConfig, drafted: usize, accepted: usize, class: MatchClass) {
        let a = cfg.alpha;
        let trials = (0..accepted)
            .map(|_| 1.0)
            .chain((accepted < drafted).then_some(0.0));
        for hit in trials {
            if class != MatchClass::Model {
                self.ema = (1.0 - a) * self.ema + a * hit;
            }
            let c = &mut self.by_class[class as usize];
            *c = (1.0 - a) * *c + a * hit;
        }
    }

    /// Tokens seen.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether no token was seen.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The tokens seen.
    pub fn tokens(&self) -> &[TokenId] {
        &self.tokens
    }

    /// Overall per-position acceptance estimate.
    pub fn acceptance(&self) -> f64 {
        self.ema
    }

    /// Per-position acceptance estimate for drafts from matches of one class.
    pub fn acceptance_for(&self, class: MatchClass) -> f64 {
        self.by_class[class as usize]
    }

    /// Every source's proposal of up to `k` tokens now, ignoring the gate, best first: the
    /// sequence's n-gram index, its suffix trie, then `shared` (recent outputs of all requests).
    pub fn candidates(&self, k: usize, shared: Option<&SuffixCache>) -> Vec<Candidate> {
        let mut out = Vec::new();
        if let Some(x) = &self.ngram {
            if let Some(f) = x.lookup() {
                let tokens = x.continuation(f.start, k);
                if !tokens.is_empty() {
                    out.push(Candidate {
                        tokens,
                        match_len: f.len,
                        source: DraftSource::Ngram,
                    });
                }
            }
        }
        if let Some(x) = &self.suffix {
            let own = x.draft(&self.tokens, k);
            let across = shared.and_then(|c| c.draft(&self.tokens, k));
            for d in [own, across].into_iter().flatten() {
                out.push(Candidate {
                    tokens: d.tokens,
                    match_len: d.match_len,
                    source: DraftSource::Suffix,
                });
            }
        }
        // Stable: among equals, the earlier source stays first.
        out.sort_by_key(|c| std::cmp::Reverse(c.rank()));
        out
    }

    /// What a draft of up to `k` tokens would be now, ignoring the gate (for analysis: replays
    /// that ask how well a hindsight choice of lengths would do).
    pub fn candidate(&self, k: usize, shared: Option<&SuffixCache>) -> Vec<TokenId> {
        self.candidates(k, shared)
            .into_iter()
            .next()
            .map_or_else(Vec::new, |c| c.tokens)
    }

    /// How many tokens to ask the draft model for now (0: none): none where a free source
    /// matched a copy (a long match), the model is off, or its step costs so much that no
    /// acceptance would pay for it; else the gate's length at the model's acceptance estimate
    /// with its step cost added per token, and a one-token probe every `2 * cooldown` tokens
    /// while that length is 0 (so that the estimate can recover).
    pub fn model_len(
        &mut self,
        cfg: &DraftConfig,
        room: usize,
        shared: Option<&SuffixCache>,
    ) -> usize {
        let Some(cost) = cfg
            .model_cost
            .filter(|_| self.sources.has(cfg.model_source))
        else {
            return 0;
        };
        let free = self.candidates(cfg.max_len, shared).into_iter().next();
        if free.is_some_and(|c| MatchClass::of(c.match_len) == MatchClass::Long) {
            return 0;
        }
        if cfg.best_len_with(1.0, room, cost) == 0 {
            return 0; // too dear to pay even if every draft token were accepted
        }
        let p = self.by_class[MatchClass::Model as usize];
        let k = cfg.best_len_with(p, room, cost);
        if k > 0 {
            return k;
        }
        usize::from(room > 0 && self.tokens.len() >= self.model_at + 2 * cfg.cooldown)
    }

    /// Proposes up to `cfg`-chosen many draft tokens (possibly none), at most `room`; `shared`
    /// holds recent outputs of all requests for suffix decoding; `model` is what the draft model
    /// proposed when it was asked ([`Drafter::model_len`]), which then goes to verification as
    /// it is.
    pub fn propose(
        &mut self,
        cfg: &DraftConfig,
        room: usize,
        shared: Option<&SuffixCache>,
        model: Option<Vec<TokenId>>,
    ) -> Vec<TokenId> {
        for (d, a, class) in std::mem::take(&mut self.shadow_outcomes) {
            self.shadow_checks += 1;
            self.learn(cfg, d, a, class);
        }
        if let Some(mut tokens) = model.filter(|t| !t.is_empty()) {
            self.shadow.clear();
            self.shadow_matched = 0;
            self.draft_class = MatchClass::Model;
            self.draft_source = cfg.model_source;
            self.model_at = self.tokens.len();
            tokens.truncate(room);
            return tokens;
        }
        let n = self.tokens.len();
        let best = self.candidates(cfg.max_len, shared).into_iter().next();
        let class = best.as_ref().map(|c| MatchClass::of(c.match_len));
        let mut draft = true;
        if let Some(until) = self.paused_until {
            // A fresh long match, or shadow drafts that would have been accepted, lift the pause
            // early; otherwise wait out the cool-down.
            let strong = class == Some(MatchClass::Long);
            if n < until && !strong && self.ema < cfg.min_acceptance {
                draft = false;
            } else {
                self.paused_until = None;
                self.ema = cfg.min_acceptance.max(self.ema);
            }
        }
        let (Some(mut best), Some(class)) = (best, class) else {
            return Vec::new();
        };
        let k = if draft {
            cfg.best_len(self.by_class[class as usize], room.min(best.tokens.len()))
        } else {
            0
        };
        if k == 0 {
            // Held back: keep a shadow draft to learn whether drafting would pay now.
            if self.shadow.is_empty() {
                self.shadow = best.tokens;
                self.shadow_class = class;
                self.shadow_matched = 0;
            }
            return Vec::new();
        }
        // A real draft supersedes any shadow; a pending one is dropped unscored (its matches so
        // far are not folded in).
        self.shadow.clear();
        self.shadow_matched = 0;
        self.draft_class = class;
        self.draft_source = best.source;
        best.tokens.truncate(k);
        best.tokens
    }

    /// Records the outcome of the draft last proposed: `accepted` of `drafted` tokens matched.
    pub fn record(&mut self, cfg: &DraftConfig, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        self.drafted += drafted;
        self.accepted += accepted;
        self.verifies += 1;
        let s = &mut self.by_source[self.draft_source as usize];
        s.drafted += drafted;
        s.accepted += accepted;
        s.verifies += 1;
        self.positions.record(drafted, accepted);
        self.learn(cfg, drafted, accepted, self.draft_class);
        if self.draft_class == MatchClass::Model {
            return; // the model's estimate sets its own length; the pause is for free sources
        }
        if self.ema < cfg.min_acceptance {
            self.paused_until = Some(self.tokens.len() + cfg.cooldown);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NGRAM: DraftSources = DraftSources {
        ngram: true,
        suffix: false,
        model: false,
        mtp: false,
    };
    const SUFFIX: DraftSources = DraftSources {
        ngram: false,
        suffix: true,
        model: false,
        mtp: false,
    };

    #[test]
    fn proposes_continuation_of_repeated_text() {
        let cfg = DraftConfig {
            verify_cost: vec![1.0; 5],
            ..Default::default()
        };
        let mut d = Drafter::new(&[1, 2, 3, 4, 5, 6, 7, 9, 1, 2, 3], NGRAM);
        assert_eq!(d.propose(&cfg, 8, None, None), vec![4, 5, 6, 7]);
        d.push(4);
        assert_eq!(d.propose(&cfg, 8, None, None), vec![5, 6, 7, 9]);
        assert_eq!(
            d.propose(&cfg, 2, None, None),
            vec![5, 6],
            "limited by room"
        );
    }

    #[test]
    fn each_checked_draft_position_is_one_trial() {
        let cfg = DraftConfig {
            alpha: 0.5,
            ..Default::default()
        };
        let mut d = Drafter::new(&[], NGRAM);
        let before = d.acceptance_for(MatchClass::Short);
        // Two accepted, the third rejected, the fourth never checked: trials 1, 1, 0.
        d.record(&cfg, 4, 2);
        let want = ((before * 0.5 + 0.5) * 0.5 + 0.5) * 0.5;
        assert!((d.acceptance_for(MatchClass::Short) - want).abs() < 1e-12);
        assert_eq!(d.acceptance_for(MatchClass::Long), MatchClass::Long.prior());
        // All four accepted: four successes, no failure.
        d.record(&cfg, 4, 4);
        assert!(d.acceptance_for(MatchClass::Short) > 0.9);
    }

    #[test]
    fn misses_on_short_matches_do_not_stop_drafting_a_copy() {
        let cfg = dear();
        let doc: Vec<TokenId> = (10..40).collect();
        let mut d = Drafter::new(&[doc.clone(), vec![7, 10, 11]].concat(), NGRAM);
        assert_eq!(
            MatchClass::of(d.candidates(8, None)[0].match_len),
            MatchClass::Short
        );
        for _ in 0..20 {
            d.record(&cfg, 3, 0);
        }
        assert!(d.acceptance_for(MatchClass::Short) < 0.2);
        // Still copying: once the suffix matches 8 tokens back, the long-match estimate decides.
        for &t in &doc[2..8] {
            d.push(t);
        }
        assert_eq!(
            MatchClass::of(d.candidates(8, None)[0].match_len),
            MatchClass::Long
        );
        assert!(
            !d.propose(&cfg, 8, None, None).is_empty(),
            "a long match lifts the pause"
        );
    }

    #[test]
    fn gate_pauses_on_low_acceptance_and_costs_bound_length() {
        let cfg = DraftConfig {
            verify_cost: vec![1.0, 1.1, 1.2, 1.3, 1.4],
            ..Default::default()
        };
        let mut d = Drafter::new(&[5, 6, 7, 8, 5, 6], NGRAM);
        for _ in 0..20 {
            d.record(&cfg, 4, 0);
        }
        assert!(d.acceptance() < 0.5);
        d.push(9);
        d.push(10);
        assert!(d.propose(&cfg, 8, None, None).is_empty(), "paused");
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
        let mut d = Drafter::new(&[pattern.clone(), pattern.clone()].concat(), NGRAM);
        assert!(
            !d.propose(&cfg, 8, None, None).is_empty(),
            "a long match drafts"
        );
        for _ in 0..20 {
            d.record(&cfg, 4, 0);
        }
        let low = d.acceptance_for(MatchClass::Long);
        assert!(low < cfg.min_acceptance);
        d.push(100);
        // The pattern again. At the low long-match estimate no draft length pays at these costs,
        // so without shadow drafts the gate would stay shut for good; shadow drafts match, the
        // estimate climbs, and real drafting resumes.
        let mut reopened_after = None;
        for (i, &t) in pattern.iter().cycle().take(64).enumerate() {
            if !d.propose(&cfg, 8, None, None).is_empty() {
                reopened_after = Some(i);
                break;
            }
            d.push(t);
        }
        let i = reopened_after.expect("shadow drafts should reopen the gate");
        assert!(d.shadow_checks > 0, "reopened after {i} tokens");
        assert!(d.acceptance_for(MatchClass::Long) > cfg.min_acceptance.max(low));
        assert_eq!(d.drafted, 80, "shadow drafts are not counted as drafted");
    }

    #[test]
    fn shadow_misses_keep_the_gate_shut() {
        let cfg = dear();
        // After 9 1 2 the model says something new each time, so every shadow draft fails there.
        let mut d = Drafter::new(&[9, 1, 2, 3, 4, 9], NGRAM);
        for _ in 0..20 {
            d.record(&cfg, 4, 0);
        }
        for i in 0..30 {
            for t in [1, 2, 100 + i, 9] {
                let draft = d.propose(&cfg, 8, None, None);
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

    #[test]
    fn suffix_drafts_come_from_the_sequence_and_from_other_requests_outputs() {
        let cfg = DraftConfig {
            verify_cost: vec![1.0; MAX_DRAFT + 1],
            max_len: MAX_DRAFT,
            ..Default::default()
        };
        let answer: Vec<TokenId> = (500..540).collect();
        // Another request answered the same question: its output is in the shared cache.
        let mut shared = SuffixCache::new(1000);
        shared.add([&[1, 2, 3][..], &answer].concat());
        let mut d = Drafter::new(&[9, 9, 1, 2, 3], SUFFIX);
        assert!(
            d.propose(&cfg, 16, None, None).is_empty(),
            "nothing in its own history"
        );
        let draft = d.propose(&cfg, 16, Some(&shared), None);
        assert!(answer.starts_with(&draft) && draft.len() >= 4, "{draft:?}");
        for &t in &answer[..12] {
            d.push(t);
        }
        let draft = d.propose(&cfg, 16, Some(&shared), None);
        assert_eq!(draft, answer[12..12 + MAX_DRAFT].to_vec());
        d.record(&cfg, draft.len(), 5);
        let s = d.by_source[DraftSource::Suffix as usize];
        assert_eq!((s.drafted, s.accepted, s.verifies), (MAX_DRAFT, 5, 1));
        assert_eq!(
            d.by_source[DraftSource::Ngram as usize],
            SourceCounts::default()
        );
    }

    #[test]
    fn sources_rank_by_match_then_length() {
        // Both sources see the same copy and propose the same draft: the earlier source (n-gram)
        // goes first among equals.
        let doc: Vec<TokenId> = (10..40).collect();
        let d = Drafter::new(
            &[&doc[..], &[7], &doc[..6]].concat(),
            DraftSources::default(),
        );
        let c = d.candidates(16, None);
        assert_eq!(c.len(), 2);
        assert_eq!((c[0].source, c[0].tokens.len()), (DraftSource::Ngram, 16));
        assert_eq!((c[1].source, c[1].tokens.len()), (DraftSource::Suffix, 16));
        assert_eq!(c[1].tokens, doc[6..22].to_vec());
        assert_eq!(c[0].tokens, c[1].tokens);
        assert_eq!(DraftSources::parse("suffix"), Ok(SUFFIX));
        assert_eq!(
            DraftSources::parse("ngram, suffix,model,mtp"),
            Ok(DraftSources::default())
        );
        assert!(DraftSources::parse("medusa").is_err());
        assert_eq!(DraftSources::default().names(), "ngram,suffix,model,mtp");
    }
}
