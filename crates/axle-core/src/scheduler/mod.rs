//! The request lifecycle and the per-step scheduler. Each step, every request's computed tokens
//! catch up with its known tokens (prompt + generated): a decode is a catch-up of one token, a
//! prefill a catch-up of many, done in chunks under a token budget. Running requests go first
//! (decodes, then unfinished prefills), then waiting ones in arrival order. When KV blocks run out,
//! the newest running request is preempted: its blocks are released and it recomputes later, so the
//! engine never fails for lack of memory. Models with recurrent layers also hold one state slot
//! per running sequence (a fixed pool, `SchedulerConfig::state_slots`): a request is admitted only
//! with a free slot, and gives it back when it finishes or is preempted (it then recomputes its
//! state with its KV). The output of `schedule` is a plain-data [`StepPlan`]; `apply` takes the
//! logits the runner computed for it.
use crate::blocks::{block_key, BlockId, BlockKey, BlockOrigin, BlockPool};
use crate::constraint::{Advanced, ConstraintTiming, TokenConstraint};
use crate::drafter::{suffix, BySource, DraftConfig, Drafter, PositionStats, SuffixCache};
use crate::sampler::{logprobs, RowLogits, Sampler, SamplingParams, TokenLogprob};
use crate::TokenId;
use std::collections::{HashMap, HashSet, VecDeque};

/// A request id (unique per scheduler).
pub type RequestId = u64;

mod plan;
pub use plan::*;

#[derive(Debug)]
struct Request {
    spec: RequestSpec,
    /// Prompt followed by generated tokens.
    tokens: Vec<TokenId>,
    computed: usize,
    blocks: Vec<BlockId>,
    /// Hash chain of this sequence's full blocks, as far as computed.
    keys: Vec<u64>,
    sampler: Sampler,
    phase: Phase,
    arrival: u64,
    preemptions: u32,
    cached_tokens: usize,
    drafter: Option<Drafter>,
    /// The output constraint, if any.
    constraint: Option<Box<dyn TokenConstraint>>,
    /// Tokens forced before the first sampled one, emitted with the first event.
    unreported: Vec<TokenId>,
    /// How the request ends at its first step, decided at admission (the forced tokens complete
    /// the constraint or fill the request).
    ends: Option<FinishReason>,
    /// Its recurrent state slot while running (recurrent models).
    state_slot: Option<u32>,
}

impl Request {
    fn generated(&self) -> usize {
        self.tokens.len() - self.spec.prompt.len()
    }

    /// The key of full block `b` (`bs` tokens) after `parent`.
    fn block_key(
        &self,
        b: usize,
        parent: Option<u64>,
        bs: usize,
        cfg: &SchedulerConfig,
    ) -> BlockKey {
        let prompt = self.spec.prompt.len();
        let origin = (!cfg.prompt_classes.is_empty()).then(|| BlockOrigin {
            prompt_class: cfg.prompt_classes.iter().filter(|&&t| prompt >= t).count() as u32,
            prompt_positions: prompt.saturating_sub(b * bs).min(bs) as u32,
        });
        block_key(
            parent,
            &self.tokens[b * bs..(b + 1) * bs],
            cfg.model_id,
            origin,
        )
    }
}

/// The scheduler: requests, queues and the block pool.
#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    pool: BlockPool,
    requests: HashMap<RequestId, Request>,
    waiting: VecDeque<RequestId>,
    running: Vec<RequestId>,
    next_id: RequestId,
    clock: u64,
    /// Block hashes a cached prefix may end at (with `reuse_marked_only`).
    reusable: HashSet<u64>,
    /// Free recurrent state slots (the last is handed out first).
    free_states: Vec<u32>,
    /// Recent outputs of all requests, for suffix drafts across requests.
    shared: SuffixCache,
}

impl Scheduler {
    /// A scheduler with an empty pool.
    pub fn new(cfg: SchedulerConfig) -> Scheduler {
        let lanes = if cfg.kv_lanes { cfg.max_seqs as u32 } else { 1 };
        let pool =
            BlockPool::new(cfg.n_blocks, cfg.block_size, cfg.prefix_caching).with_lanes(lanes);
        Scheduler {
            pool,
            requests: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_id: 1,
            clock: 0,
            reusable: HashSet::new(),
            free_states: (0..cfg.state_slots.unwrap_or(0)).rev().collect(),
            shared: SuffixCache::new(
                cfg.draft
                    .as_ref()
                    .filter(|d| d.sources.suffix)
                    .map_or(0, |d| d.shared_tokens),
            ),
            cfg,
        }
    }

    /// Marks (or unmarks) the prefix ending with the block of hash `hash` as one a new request
    /// may reuse, with `reuse_marked_only`.
    pub fn set_reusable(&mut self, hash: u64, reusable: bool) {
        if reusable {
            self.reusable.insert(hash);
        } else {
            self.reusable.remove(&hash);
        }
    }

    /// The hash of `id`'s prefix of `n_tokens` tokens, when that is a whole number of blocks
    /// already registered (the chain hash of the block ending there).
    pub fn prefix_hash(&self, id: RequestId, n_tokens: usize) -> Option<u64> {
        let bs = self.cfg.block_size as usize;
        let r = self.requests.get(&id)?;
        if n_tokens == 0 || !n_tokens.is_multiple_of(bs) {
            return None;
        }
        r.keys.get(n_tokens / bs - 1).copied()
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// The block pool (read-only, for metrics and tests).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Queues a request. Fails (without queuing) when it can never fit.
    pub fn add(&mut self, spec: RequestSpec) -> Result<RequestId, AdmitError> {
        self.add_constrained(spec, None)
    }

    /// Queues a request whose output follows `constraint` (tokens it forces at the start are
    /// generated tokens, computed with the prompt).
    pub fn add_constrained(
        &mut self,
        spec: RequestSpec,
        mut constraint: Option<Box<dyn TokenConstraint>>,
    ) -> Result<RequestId, AdmitError> {
        if spec.prompt.is_empty() {
            return Err(AdmitError::EmptyPrompt);
        }
        let cap = self
            .cfg
            .context
            .min((self.cfg.n_blocks * self.cfg.block_size) as usize);
        if spec.prompt.len() >= cap {
            return Err(AdmitError::PromptTooLong {
                prompt_tokens: spec.prompt.len(),
                context: cap,
            });
        }
        spec.sampling.validate()?;
        let started = match constraint.as_mut() {
            Some(c) => c.start().map_err(AdmitError::Constraint)?,
            None => Advanced::default(),
        };
        // Forced tokens up to max_tokens, leaving one position of context; a request they fill
        // or complete ends at its first step without sampling.
        let mut unreported = started.forced;
        let room = cap - spec.prompt.len() - 1;
        let mut ends = started.finished.then_some(FinishReason::Stop);
        if unreported.len() >= spec.max_tokens {
            unreported.truncate(spec.max_tokens);
            ends = Some(FinishReason::Length);
        } else if unreported.len() > room {
            unreported.truncate(room);
            ends = Some(FinishReason::ContextLimit);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.clock += 1;
        let mut tokens = spec.prompt.clone();
        tokens.extend_from_slice(&unreported);
        let sampler = Sampler::new(spec.sampling.clone());
        let drafter = self
            .cfg
            .draft
            .as_ref()
            .filter(|_| spec.speculation)
            .map(|cfg| {
                let mut d = Drafter::new(&spec.prompt, cfg.sources);
                for &t in &unreported {
                    d.push(t);
                }
                d
            });
        self.requests.insert(
            id,
            Request {
                spec,
                tokens,
                computed: 0,
                blocks: Vec::new(),
                keys: Vec::new(),
                sampler,
                phase: Phase::Waiting,
                arrival: self.clock,
                preemptions: 0,
                cached_tokens: 0,
                drafter,
                constraint,
                unreported,
                ends,
                state_slot: None,
            },
        );
        self.waiting.push_back(id);
        Ok(id)
    }

    /// Forgets the outputs kept for suffix drafts across requests (benchmarks that time each
    /// request on its own clear them between requests).
    pub fn clear_shared_drafts(&mut self) {
        self.shared.clear();
    }

    /// A request's phase (None once forgotten).
    pub fn phase(&self, id: RequestId) -> Option<&Phase> {
        self.requests.get(&id).map(|r| &r.phase)
    }

    /// A request's tokens so far (prompt, then generated).
    pub fn tokens(&self, id: RequestId) -> Option<&[TokenId]> {
        self.requests.get(&id).map(|r| r.tokens.as_slice())
    }

    /// A request's generated tokens.
    pub fn generated(&self, id: RequestId) -> Option<&[TokenId]> {
        self.requests
            .get(&id)
            .map(|r| &r.tokens[r.spec.prompt.len()..])
    }

    /// A request's statistics.
    pub fn stats(&self, id: RequestId) -> Option<RequestStats> {
        self.requests.get(&id).map(|r| RequestStats {
            prompt_tokens: r.spec.prompt.len(),
            generated_tokens: r.generated(),
            cached_tokens: r.cached_tokens,
            preemptions: r.preemptions,
            drafted: r.drafter.as_ref().map_or(0, |d| d.drafted),
            accepted: r.drafter.as_ref().map_or(0, |d| d.accepted),
            verifies: r.drafter.as_ref().map_or(0, |d| d.verifies),
            positions: r.drafter.as_ref().map(|d| d.positions).unwrap_or_default(),
            by_source: r.drafter.as_ref().map(|d| d.by_source).unwrap_or_default(),
            constraint: r
                .constraint
                .as_ref()
                .map(|c| c.timing())
                .unwrap_or_default(),
        })
    }

    /// Requests queued.
    pub fn n_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Requests holding KV.
    pub fn n_running(&self) -> usize {
        self.running.len()
    }

    /// Whether any request is unfinished.
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Drops a finished request's record.
    pub fn forget(&mut self, id: RequestId) {
        if matches!(
            self.requests.get(&id).map(|r| &r.phase),
            Some(Phase::Finished(_))
        ) {
            self.requests.remove(&id);
        }
    }

    /// Ends a request now (client cancel or stop string), freeing its blocks.
    pub fn finish(&mut self, id: RequestId, reason: FinishReason) -> bool {
        let Some(r) = self.requests.get_mut(&id) else {
            return false;
        };
        if matches!(r.phase, Phase::Finished(_)) {
            return false;
        }
        give_back(r, &mut self.pool, &mut self.free_states);
        r.phase = Phase::Finished(reason);
        // Its output, after a little of its prompt, joins the outputs later requests draft from.
        if r.drafter.is_some() && r.generated() > 0 && self.shared.budget() > 0 {
            let from = r.spec.prompt.len().saturating_sub(suffix::MAX_PATTERN);
            self.shared.add(r.tokens[from..].to_vec());
        }
        self.running.retain(|&x| x != id);
        self.waiting.retain(|&x| x != id);
        true
    }

    fn preempt(&mut self, id: RequestId) {
        let r = self
            .requests
            .get_mut(&id)
            .expect("preempting a known request");
        give_back(r, &mut self.pool, &mut self.free_states);
        r.computed = 0;
        r.keys.clear();
        r.phase = Phase::Waiting;
        r.preemptions += 1;
        self.running.retain(|&x| x != id);
        // Back in arrival order, ahead of newer requests.
        let arrival = r.arrival;
        let pos = self
            .waiting
            .iter()
            .position(|w| self.requests[w].arrival > arrival)
            .unwrap_or(self.waiting.len());
        self.waiting.insert(pos, id);
    }

    /// The running request to preempt: the newest one other than `keep`.
    fn victim(&self, keep: RequestId) -> Option<RequestId> {
        self.running
            .iter()
            .copied()
            .filter(|&x| x != keep)
            .max_by_key(|x| self.requests[x].arrival)
    }

    /// Claims cached blocks for the longest cached prefix of a request being admitted. The block
    /// holding the last known token is never reused, so that token is always computed (its logits
    /// are needed) and a shared block is never written.
    fn reuse_prefix(&mut self, id: RequestId) {
        let bs = self.cfg.block_size as usize;
        let r = self.requests.get_mut(&id).expect("known request");
        let full = (r.tokens.len() - 1) / bs;
        let mut parent = None;
        for i in 0..full {
            let key = r.block_key(i, parent, bs, &self.cfg);
            match self.pool.reuse(&key) {
                Some(b) => {
                    parent = Some(key.hash);
                    r.blocks.push(b);
                    r.keys.push(key.hash);
                }
                None => break,
            }
        }
        if self.cfg.reuse_marked_only {
            // Only up to the last block a state was saved for; the rest goes back.
            let keep = r
                .keys
                .iter()
                .rposition(|h| self.reusable.contains(h))
                .map_or(0, |i| i + 1);
            while r.blocks.len() > keep {
                if let Some(b) = r.blocks.pop() {
                    self.pool.release(b);
                }
                r.keys.pop();
            }
        }
        r.computed = r.blocks.len() * bs;
        r.cached_tokens = r.computed;
    }

    /// Makes sure `id` has blocks for its first `upto` positions, preempting newer running requests
    /// if the pool is empty. Returns false if it cannot (then nothing was preempted for it).
    fn ensure_blocks(
        &mut self,
        id: RequestId,
        upto: usize,
        plan: &mut StepPlan,
        preempt: bool,
    ) -> bool {
        let bs = self.cfg.block_size as usize;
        loop {
            let blocks = &self.requests[&id].blocks;
            if blocks.len() * bs >= upto {
                return true;
            }
            if let Some(b) = self.pool.allocate_after(blocks.last().copied()) {
                self.requests.get_mut(&id).expect("known").blocks.push(b);
                continue;
            }
            if !preempt {
                return false;
            }
            let Some(v) = self.victim(id) else {
                return false;
            };
            if self.requests[&v].arrival < self.requests[&id].arrival {
                return false; // only newer requests give way
            }
            plan.seqs.retain(|s| s.id != v);
            self.preempt(v);
            plan.preempted.push(v);
        }
    }

    /// Tokens per prefill chunk: prefills are cut at positions that are multiples of this, so
    /// that how a prompt is chunked depends on the prompt alone (and on where its cached prefix
    /// ends), never on what else shares the steps: on accelerators, whose kernels round a chunk's
    /// rows differently at different widths, a prompt then computes the same numbers batched as
    /// alone. The budget keeps room for every running sequence's decode token, so that a chunk
    /// always fits in a step once it is the next in line.
    pub fn prefill_chunk(&self) -> usize {
        let (b, s) = (self.cfg.max_batch_tokens, self.cfg.max_seqs);
        if b > s {
            b - s
        } else {
            (b / 2).max(1)
        }
    }

    /// Tokens of the next prefill chunk of a request with `computed` of `known` tokens computed.
    fn chunk_len(&self, computed: usize, known: usize) -> usize {
        let c = self.prefill_chunk();
        (known - computed).min(c - computed % c)
    }

    /// Plans the next step: running decodes first (one token each), then the next chunk of each
    /// running prefill that fits, then waiting requests in arrival order while their first chunk
    /// fits, and last, with the budget left, drafts for the decodes (from the n-gram and suffix
    /// sources; no draft model).
    pub fn schedule(&mut self) -> StepPlan {
        self.schedule_with::<dyn ModelDrafter>(None)
    }

    /// [`Scheduler::schedule`], asking `model` for drafts where the gate wants it: every such
    /// decode at once, before the free sources' drafts take the budget left.
    pub fn schedule_with<M: ModelDrafter + ?Sized>(&mut self, model: Option<&mut M>) -> StepPlan {
        let mut plan = StepPlan::default();
        let mut budget = self.cfg.max_batch_tokens;
        // Running requests: decodes first, then unfinished prefills, each in arrival order.
        let mut order: Vec<RequestId> = self.running.clone();
        order.sort_by_key(|id| {
            let r = &self.requests[id];
            (r.tokens.len() - r.computed > 1, r.arrival)
        });
        let mut decodes = Vec::new();
        for id in order {
            if plan.seqs.len() >= self.cfg.max_seqs || budget == 0 {
                break;
            }
            if !self.running.contains(&id) {
                continue; // preempted while planning this step
            }
            let (computed, known) = (self.requests[&id].computed, self.requests[&id].tokens.len());
            let n = self.chunk_len(computed, known);
            if n > budget {
                continue; // this chunk waits for a step with room for all of it
            }
            if !self.ensure_blocks(id, computed + n, &mut plan, true) {
                self.preempt(id);
                plan.preempted.push(id);
                continue;
            }
            budget -= n;
            if n == 1 && known - computed == 1 {
                decodes.push(id);
            }
            plan.seqs.push(self.planned(id, n));
        }
        // Waiting requests, first come first served; stop at the first that does not fit (its
        // chunk, its blocks, or a recurrent state slot).
        while let Some(&id) = self.waiting.front() {
            if plan.seqs.len() >= self.cfg.max_seqs || budget == 0 {
                break;
            }
            if self.cfg.state_slots.is_some() && self.free_states.is_empty() {
                break;
            }
            if self.pool.caching() && self.requests[&id].blocks.is_empty() {
                self.reuse_prefix(id);
            }
            let (computed, known) = (self.requests[&id].computed, self.requests[&id].tokens.len());
            let n = self.chunk_len(computed, known);
            if n > budget || !self.ensure_blocks(id, computed + n, &mut plan, false) {
                let r = self.requests.get_mut(&id).expect("known");
                for b in r.blocks.drain(..) {
                    self.pool.release(b);
                }
                r.keys.clear();
                r.computed = 0;
                break;
            }
            self.waiting.pop_front();
            let state_slot = match self.cfg.state_slots {
                Some(_) => self.free_states.pop(),
                None => None,
            };
            let r = self.requests.get_mut(&id).expect("known");
            r.phase = Phase::Running;
            r.state_slot = state_slot;
            self.running.push(id);
            budget -= n;
            plan.seqs.push(self.planned(id, n));
        }
        // Drafts, with what the budget has left (a draft that finds no free block is dropped).
        // Only for the decodes planned above: preemption may have dropped one from the plan since
        // (and re-admission may have planned it again, as a prefill).
        let decodes: Vec<(RequestId, usize)> = decodes
            .into_iter()
            .filter(|id| !plan.preempted.contains(id))
            .filter_map(|id| Some((id, plan.seqs.iter().position(|p| p.id == id)?)))
            .collect();
        // The draft model first: its asks reserve their budget and blocks, then run together.
        let mut reserved: HashMap<RequestId, (usize, Vec<TokenId>)> = HashMap::new();
        if let Some(model) = model {
            let mut asked = Vec::new();
            for &(id, _) in &decodes {
                let k = self.model_len_for(id, budget);
                if k == 0 {
                    continue;
                }
                let computed = self.requests[&id].computed;
                let had = self.requests[&id].blocks.len();
                if !self.ensure_blocks(id, computed + 1 + k, &mut plan, false) {
                    self.release_from(id, had);
                    continue;
                }
                budget -= k;
                asked.push((id, k));
            }
            if !asked.is_empty() {
                let asks: Vec<ModelAsk> = asked
                    .iter()
                    .map(|&(id, len)| {
                        let r = &self.requests[&id];
                        ModelAsk {
                            id,
                            tokens: &r.tokens,
                            prompt_len: r.spec.prompt.len(),
                            block_table: &r.blocks,
                            len,
                        }
                    })
                    .collect();
                let mut drafts = model.draft(&asks);
                drafts.resize(asked.len(), Vec::new());
                for ((id, k), mut d) in asked.into_iter().zip(drafts) {
                    d.truncate(k);
                    reserved.insert(id, (k, d));
                }
            }
        }
        for (id, i) in decodes {
            let model_draft = reserved.remove(&id);
            let allowance = model_draft.as_ref().map_or(budget, |(k, _)| *k);
            if allowance == 0 {
                continue;
            }
            let computed = self.requests[&id].computed;
            let had = self.requests[&id].blocks.len();
            let draft = self.draft_for(id, allowance, model_draft.as_ref().map(|(_, d)| d.clone()));
            if let Some((k, _)) = model_draft {
                budget += k; // what was reserved for it comes back; its draft takes its share below
                if draft.is_empty() {
                    // Blocks taken for the draft that did not come: back to the pool.
                    let bs = self.cfg.block_size as usize;
                    self.release_from(id, (computed + 1).div_ceil(bs));
                    continue;
                }
            } else if draft.is_empty() {
                continue;
            }
            if !self.ensure_blocks(id, computed + 1 + draft.len(), &mut plan, false) {
                self.release_from(id, had);
                continue;
            }
            budget -= draft.len();
            let p = &mut plan.seqs[i];
            p.n_draft = draft.len();
            p.tokens.extend(draft);
            p.block_table = self.requests[&id].blocks.clone();
        }
        // Drafts are checked: constraints may compute the step's next masks now (a draft check
        // needs the parser that a mask computation holds).
        for p in &plan.seqs {
            if let Some(c) = self
                .requests
                .get_mut(&p.id)
                .and_then(|r| r.constraint.as_mut())
            {
                c.prepare();
            }
        }
        if self.cfg.kv_lanes {
            // Decoding (and verifying) sequences first, as planned above, each group in the order
            // of its blocks: sequences in lanes of the pool then lie one after another in the
            // step as in the cache (a device reads them at one stride), and the decode columns
            // stay one run of the step's products. Which sequences run was decided above; the
            // order of a step's sequences changes no sequence's numbers.
            plan.seqs.sort_by_key(|p| {
                (
                    p.tokens.len() > 1 + p.n_draft,
                    p.block_table.first().copied(),
                )
            });
        }
        plan
    }

    /// Gives back a request's blocks from index `from` on.
    fn release_from(&mut self, id: RequestId, from: usize) {
        let r = self.requests.get_mut(&id).expect("known");
        if from < r.blocks.len() {
            for b in r.blocks.drain(from..) {
                self.pool.release(b);
            }
        }
    }

    /// Draft tokens a decoding request may carry: within its remaining tokens, its context and
    /// `budget`.
    fn draft_room(&self, id: RequestId, budget: usize) -> usize {
        let cap = self
            .cfg
            .context
            .min((self.cfg.n_blocks * self.cfg.block_size) as usize);
        let r = &self.requests[&id];
        let left = r.spec.max_tokens.saturating_sub(r.generated() + 1);
        left.min(cap.saturating_sub(r.tokens.len() + 1)).min(budget)
    }

    /// How many draft tokens to ask the draft model for, for a decoding request (0: none).
    fn model_len_for(&mut self, id: RequestId, budget: usize) -> usize {
        let room = self.draft_room(id, budget);
        let Some(cfg) = self.cfg.draft.as_ref() else {
            return 0;
        };
        let r = self.requests.get_mut(&id).expect("known");
        match r.drafter.as_mut() {
            Some(d) if room > 0 => d.model_len(cfg, room, Some(&self.shared)),
            _ => 0,
        }
    }

    /// Draft tokens for a decoding request, within its remaining token and context allowance
    /// and `budget`: the draft model's, where it was asked, else the free sources' best.
    fn draft_for(
        &mut self,
        id: RequestId,
        budget: usize,
        model: Option<Vec<TokenId>>,
    ) -> Vec<TokenId> {
        let room = self.draft_room(id, budget);
        let Some(cfg) = self.cfg.draft.as_ref() else {
            return Vec::new();
        };
        let r = self.requests.get_mut(&id).expect("known");
        let mut draft = match r.drafter.as_mut() {
            Some(d) if room > 0 => d.propose(cfg, room, Some(&self.shared), model),
            _ => Vec::new(),
        };
        // A draft token the constraint forbids ends the draft.
        if let Some(c) = r.constraint.as_mut() {
            if !draft.is_empty() {
                let n = c.valid_prefix(&draft);
                draft.truncate(n);
            }
        }
        draft
    }

    fn planned(&self, id: RequestId, n: usize) -> PlannedSeq {
        let r = &self.requests[&id];
        PlannedSeq {
            id,
            tokens: r.tokens[r.computed..r.computed + n].to_vec(),
            start_pos: r.computed as u32,
            prompt_len: r.spec.prompt.len(),
            block_table: r.blocks.clone(),
            wants_logits: r.computed + n == r.tokens.len(),
            n_draft: 0,
            state_slot: r.state_slot,
            pick: r.sampler.is_plain_greedy()
                && r.constraint.is_none()
                && r.spec.sampling.logprobs.is_none(),
        }
    }

    /// Applies a computed step: `logits(i, j)` gives the logits of token `j` of `plan.seqs[i]`
    /// (asked only for positions that wanted them). Samples, verifies drafts (accepting the longest
    /// prefix the model agrees with, plus the model's own next token), checks stops, rolls back
    /// rejected drafts by a length change (freeing whole blocks that only held them), registers
    /// newly full blocks, and reports events.
    pub fn apply<'l>(
        &mut self,
        plan: &StepPlan,
        mut logits: impl FnMut(usize, usize) -> Option<RowLogits<'l>>,
    ) -> Vec<Event> {
        let bs = self.cfg.block_size as usize;
        let cap = self
            .cfg
            .context
            .min((self.cfg.n_blocks * self.cfg.block_size) as usize);
        let mut events = Vec::new();
        for (i, s) in plan.seqs.iter().enumerate() {
            let Some(r) = self.requests.get_mut(&s.id) else {
                continue;
            };
            if r.phase != Phase::Running || r.computed != s.start_pos as usize {
                continue; // cancelled or preempted after planning
            }
            let n_known = s.tokens.len() - s.n_draft;
            r.computed += n_known;
            if !s.wants_logits {
                Self::register_full(&mut self.pool, r, bs, &self.cfg);
                continue;
            }
            let unreported = std::mem::take(&mut r.unreported);
            let mut ev = Event {
                id: s.id,
                logprobs: match r.spec.sampling.logprobs {
                    Some(_) => unreported.iter().map(|&t| forced_logprob(t)).collect(),
                    None => Vec::new(),
                },
                tokens: unreported,
                finished: r.ends.take(),
                accepted: 0,
            };
            let mut accepted = 0;
            let mut masked = Vec::new();
            for j in 0..=s.n_draft {
                if ev.finished.is_some() {
                    break;
                }
                let (tok, l) = match logits(i, n_known - 1 + j) {
                    None => break,
                    Some(RowLogits::Picked(t)) => (t, None),
                    Some(RowLogits::Full(raw)) => {
                        let mut l = raw;
                        if let Some(c) = r.constraint.as_mut() {
                            match constrain(c.as_mut(), raw, &r.spec.stop_tokens, &mut masked) {
                                Ok(()) => l = &masked,
                                Err(e) => {
                                    ev.finished = Some(FinishReason::Error(e));
                                    break;
                                }
                            }
                        }
                        (r.sampler.sample(l, &r.tokens), Some(l))
                    }
                };
                let agrees = j < s.n_draft && tok == s.tokens[n_known + j];
                if r.spec.stop_tokens.contains(&tok) {
                    ev.finished = Some(FinishReason::Stop);
                    break;
                }
                let mut emitted = vec![tok];
                let mut done = false;
                if let Some(c) = r.constraint.as_mut() {
                    match c.advance(tok) {
                        Ok(a) => {
                            done = a.finished;
                            emitted.extend(a.forced);
                        }
                        Err(e) => {
                            ev.finished = Some(FinishReason::Error(e));
                            break;
                        }
                    }
                }
                for (k, &t) in emitted.iter().enumerate() {
                    r.tokens.push(t);
                    if let Some(d) = r.drafter.as_mut() {
                        d.push(t);
                    }
                    ev.tokens.push(t);
                    if let Some(top) = r.spec.sampling.logprobs {
                        // Picked rows never have logprobs asked for (see `PlannedSeq::pick`).
                        ev.logprobs.push(match l {
                            Some(l) if k == 0 => logprobs(l, t, top),
                            _ => forced_logprob(t),
                        });
                    }
                    if r.generated() >= r.spec.max_tokens {
                        ev.finished = Some(FinishReason::Length);
                    } else if r.tokens.len() >= cap {
                        ev.finished = Some(FinishReason::ContextLimit);
                    }
                    if ev.finished.is_some() {
                        break;
                    }
                }
                if done && ev.finished.is_none() {
                    ev.finished = Some(FinishReason::Stop);
                }
                // Forced tokens are computed in the next step: the drafts after them go.
                if !agrees || ev.finished.is_some() || emitted.len() > 1 {
                    break;
                }
                accepted += 1;
                r.computed += 1; // the accepted draft's KV is already in place
            }
            ev.accepted = accepted;
            if s.n_draft > 0 {
                if let (Some(d), Some(cfg)) = (r.drafter.as_mut(), self.cfg.draft.as_ref()) {
                    d.record(cfg, s.n_draft, accepted);
                }
                // Rejected drafts: nothing to undo but whole blocks past what the tokens need.
                let need = r.tokens.len().div_ceil(bs);
                while r.blocks.len() > need {
                    if let Some(b) = r.blocks.pop() {
                        self.pool.release(b);
                    }
                }
            }
            Self::register_full(&mut self.pool, r, bs, &self.cfg);
            if let Some(reason) = &ev.finished {
                self.finish(s.id, reason.clone());
            }
            events.push(ev);
        }
        events
    }

    /// Registers the request's blocks that became full of computed tokens, extending its hash chain.
    fn register_full(pool: &mut BlockPool, r: &mut Request, bs: usize, cfg: &SchedulerConfig) {
        while (r.keys.len() + 1) * bs <= r.computed {
            let b = r.keys.len();
            let key = r.block_key(b, r.keys.last().copied(), bs, cfg);
            r.keys.push(key.hash);
            pool.register(r.blocks[b], key);
        }
    }

    /// Checks the invariants the property tests rely on: the pool is consistent, every block's
    /// reference count equals the number of running requests holding it, and nothing else holds
    /// blocks.
    pub fn check(&self) -> Result<(), String> {
        self.pool.check()?;
        let mut owners: HashMap<BlockId, u32> = HashMap::new();
        let mut states: Vec<u32> = self.free_states.clone();
        for (id, r) in &self.requests {
            match r.phase {
                Phase::Running => {
                    if !self.running.contains(id) {
                        return Err(format!("running request {id} not in the running list"));
                    }
                    if self.cfg.state_slots.is_some() && r.state_slot.is_none() {
                        return Err(format!("running request {id} holds no state slot"));
                    }
                }
                _ => {
                    if !r.blocks.is_empty() {
                        return Err(format!("request {id} holds blocks while {:?}", r.phase));
                    }
                    if r.state_slot.is_some() {
                        return Err(format!(
                            "request {id} holds a state slot while {:?}",
                            r.phase
                        ));
                    }
                }
            }
            states.extend(r.state_slot);
            for &b in &r.blocks {
                *owners.entry(b).or_default() += 1;
            }
            if r.computed > r.tokens.len() {
                return Err(format!("request {id} computed past its tokens"));
            }
        }
        states.sort_unstable();
        let all: Vec<u32> = (0..self.cfg.state_slots.unwrap_or(0)).collect();
        if states != all {
            return Err(format!(
                "state slots held or free {states:?}, not each of {all:?} once"
            ));
        }
        for b in 0..self.pool.n_blocks() {
            let want = owners.get(&b).copied().unwrap_or(0);
            if self.pool.refs(b) != want {
                return Err(format!(
                    "block {b}: {} refs, {want} owners",
                    self.pool.refs(b)
                ));
            }
        }
        Ok(())
    }
}

/// Returns what a request holds while running, its KV blocks and its recurrent state slot, when
/// it finishes or is preempted.
fn give_back(r: &mut Request, pool: &mut BlockPool, free_states: &mut Vec<u32>) {
    for b in r.blocks.drain(..) {
        pool.release(b);
    }
    if let Some(s) = r.state_slot.take() {
        free_states.push(s);
    }
}

/// The log-probability of a token the constraint forced: certain under the constrained
/// distribution, with no alternatives.
fn forced_logprob(token: TokenId) -> TokenLogprob {
    TokenLogprob {
        token,
        logprob: 0.0,
        top: Vec::new(),
    }
}

/// Writes `raw` logits with what `c` does not allow set to minus infinity into `out`; the stop
/// tokens are allowed exactly when the constraint lets the output end. Refuses a position where
/// nothing is allowed.
fn constrain(
    c: &mut dyn TokenConstraint,
    raw: &[f32],
    stop_tokens: &[TokenId],
    out: &mut Vec<f32>,
) -> Result<(), String> {
    let allowed = c.allowed()?;
    out.clear();
    out.extend_from_slice(raw);
    allowed.mask.apply(out);
    for &t in stop_tokens {
        if let Some(l) = out.get_mut(t as usize) {
            *l = if allowed.may_end {
                raw[t as usize]
            } else {
                f32::NEG_INFINITY
            };
        }
    }
    if out.iter().all(|l| *l == f32::NEG_INFINITY) {
        return Err("the output constraint allows no token here".into());
    }
    Ok(())
}
