//! The draft model: a smaller model with the target's vocabulary that proposes draft tokens
//! greedily, one step per draft position for every sequence the scheduler asked for, batched.
//! Its KV lives in its own cache indexed by the target's block tables: a block the scheduler
//! gives a sequence holds that sequence's KV in both caches, so the draft model needs no pool
//! of its own and no bookkeeping beyond how far each sequence's draft KV is valid.
//!
//! Validity: before a draft, the draft model catches up on the sequence's tokens since its last
//! draft (the whole prompt the first time, a few tokens after). After verification, its KV stays
//! valid for the real tokens and for the accepted draft tokens that it computed (all but the
//! last draft token, which it never fed back); the rest is overwritten by the next catch-up. A
//! preempted sequence starts over. What the draft model computes never reaches the output: the
//! target verifies every token, so outputs are the same with it or without.
//!
//! The model's own next-token-prediction head ([`DraftModel::mtp`]) drafts the same way, with
//! two differences. Its step at position p reads token p and the target's hidden state of row
//! p - 1 (zeros before the first), so it catches up after every target step, on the step's real
//! tokens (a verify step's accepted ones) with the states that step returned, and keeps the last
//! state for the next; a draft then starts from the sequence's last token and that state, and
//! each further draft token reads the head's own state of the one before. Nothing a draft wrote
//! stays valid (its states were the head's, not the target's): the next catch-up writes those
//! positions again. Its KV of a cached prefix's blocks is there already (the request that
//! computed them caught up on them), and the target's state at each block's end is kept for a
//! while ([`SAVED_STATES`]), keyed by the prefix's hash: a request that starts from a cached
//! prefix picks it up there (zeros where it is gone: the head's first row then reads a state the
//! trunk never gave, which only costs acceptance).
use axle_core::sampler::argmax;
use axle_core::{Event, ModelAsk, ModelDrafter, RequestId, RowLogits, StepPlan};
use axle_models::{LogitRows, Model, Runner, RunnerOptions, SeqInput, StateSlots, TokenId};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// Target states kept at block ends for requests that start from a cached prefix (an MTP head):
/// one row of the hidden size each (16 KB for a 4096-wide model), the oldest dropped first.
pub const SAVED_STATES: usize = 1024;

/// How far a sequence's draft KV is valid, and the draft in flight.
#[derive(Debug, Clone, Default)]
struct DraftSeq {
    /// Positions `0..computed` hold the KV of the sequence's real tokens.
    computed: usize,
    /// The draft in flight: the sequence's known tokens when it was drafted, and its length.
    pending: Option<(usize, usize)>,
    /// An MTP head: the target's hidden state of position `computed - 1` (zeros before any).
    state: Vec<f32>,
}

/// A draft model with its runner.
#[derive(Debug)]
pub struct DraftModel {
    runner: Runner,
    seqs: HashMap<RequestId, DraftSeq>,
    /// Most tokens per draft step (its catch-up is cut to fit).
    max_tokens: usize,
    /// The first error it met (drafting stops being offered after one; outputs are unaffected).
    error: Option<String>,
    /// Hidden size where this is the model's MTP head (0: a separate draft model).
    mtp_width: usize,
    /// An MTP head: the target's state at the end of prefixes of whole blocks, by prefix hash,
    /// and their order (oldest first).
    saved: HashMap<u64, Vec<f32>>,
    saved_order: VecDeque<u64>,
}

impl DraftModel {
    /// A draft model over `model`, its KV shaped like the target's (`kv_slots` slots in blocks of
    /// `block_size`), steps of at most `max_tokens` tokens for up to `max_seqs` sequences.
    pub fn new(
        model: Arc<Model>,
        kv_slots: u32,
        block_size: u32,
        max_tokens: usize,
        max_seqs: usize,
    ) -> Result<DraftModel, crate::SdkError> {
        if !model.family().state_dims().is_empty() {
            return Err(crate::SdkError::Config(
                "a draft model with recurrent layers is not supported: use an attention-only one"
                    .into(),
            ));
        }
        DraftModel::with_runner(model, kv_slots, block_size, max_tokens, max_seqs, false)
    }

    /// The MTP head of `model` (the target itself, whose runner must return hidden states), its
    /// KV shaped like the target's.
    pub fn mtp(
        model: Arc<Model>,
        kv_slots: u32,
        block_size: u32,
        max_tokens: usize,
        max_seqs: usize,
    ) -> Result<DraftModel, crate::SdkError> {
        DraftModel::with_runner(model, kv_slots, block_size, max_tokens, max_seqs, true)
    }

    fn with_runner(
        model: Arc<Model>,
        kv_slots: u32,
        block_size: u32,
        max_tokens: usize,
        max_seqs: usize,
        mtp: bool,
    ) -> Result<DraftModel, crate::SdkError> {
        let mtp_width = match mtp {
            true => model.family().hparams().n_embd as usize,
            false => 0,
        };
        let runner = Runner::new(
            model,
            RunnerOptions {
                kv_slots,
                block_size,
                max_batch_tokens: max_tokens,
                max_seqs,
                mtp,
                ..Default::default()
            },
        )?;
        Ok(DraftModel {
            runner,
            seqs: HashMap::new(),
            max_tokens,
            error: None,
            mtp_width,
            saved: HashMap::new(),
            saved_order: VecDeque::new(),
        })
    }

    /// Whether this is the model's MTP head.
    pub fn is_mtp(&self) -> bool {
        self.mtp_width > 0
    }

    /// The runner (for timing its steps).
    pub fn runner(&mut self) -> &mut Runner {
        &mut self.runner
    }

    /// Puts its runner's CPU threads to sleep until its next step.
    pub fn pause_threads(&self) {
        self.runner.pause_threads();
    }

    /// The first error the draft model met, if any.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// After a step: what each verified draft left valid, preempted and finished sequences
    /// forgotten; an MTP head catches up on the step's real tokens with `hidden`, the target's
    /// hidden states of the step's tokens, and `prefix(id, n)` names a request's prefix of `n`
    /// tokens where it is a whole number of blocks (the scheduler's prefix hash).
    pub fn settle(
        &mut self,
        plan: &StepPlan,
        events: &[Event],
        hidden: &[f32],
        prefix: &dyn Fn(RequestId, usize) -> Option<u64>,
    ) {
        for id in &plan.preempted {
            self.seqs.remove(id);
        }
        if self.is_mtp() && self.error.is_none() {
            if let Err(e) = self.catch_up(plan, events, hidden, prefix) {
                self.error = Some(e.to_string());
            }
        }
        for ev in events {
            if ev.finished.is_some() {
                self.seqs.remove(&ev.id);
                continue;
            }
            if let Some(s) = self.seqs.get_mut(&ev.id) {
                if let Some((n, k)) = s.pending.take() {
                    s.computed = n + ev.accepted.min(k.saturating_sub(1));
                }
            }
        }
        // A draft the step dropped (no event for it: cancelled, or its request ended otherwise)
        // leaves only the real tokens valid.
        for s in self.seqs.values_mut() {
            if let Some((n, _)) = s.pending.take() {
                s.computed = s.computed.min(n);
            }
        }
    }

    /// The MTP head's catch-up after a target step: for each sequence, its step's real tokens
    /// (all of a prefill chunk or decode step; a verify step's first token and its accepted
    /// drafts), each paired with the target's state of the row before.
    fn catch_up(
        &mut self,
        plan: &StepPlan,
        events: &[Event],
        hidden: &[f32],
        prefix: &dyn Fn(RequestId, usize) -> Option<u64>,
    ) -> Result<(), crate::SdkError> {
        let e = self.mtp_width;
        let bs = self.runner.options().block_size as usize;
        let total: usize = plan.seqs.iter().map(|s| s.tokens.len()).sum();
        if hidden.len() != total * e {
            return Err(crate::SdkError::Config(format!(
                "the target's step returned {} hidden values for {total} tokens",
                hidden.len()
            )));
        }
        let mut inputs = Vec::new();
        let mut row = 0;
        for s in &plan.seqs {
            let first = row;
            row += s.tokens.len();
            // A finished request's last tokens are caught up too: a later request may reuse its
            // blocks.
            let event = events.iter().find(|ev| ev.id == s.id);
            let real = match (s.n_draft, event) {
                (0, _) => s.tokens.len(),
                (_, Some(ev)) => ev.accepted.min(s.n_draft) + 1,
                (_, None) => continue,
            };
            let start = s.start_pos as usize;
            let st = self.seqs.entry(s.id).or_default();
            if start != st.computed {
                // A cached prefix: its blocks hold the head's KV already; the target's state at
                // its end where it was kept, else zeros.
                st.state = prefix(s.id, start)
                    .and_then(|h| self.saved.get(&h).cloned())
                    .unwrap_or_default();
            }
            let mut paired = Vec::with_capacity(real * e);
            match st.state.len() == e {
                true => paired.extend_from_slice(&st.state),
                false => paired.resize(e, 0.0),
            }
            paired.extend_from_slice(&hidden[first * e..(first + real - 1) * e]);
            st.state = hidden[(first + real - 1) * e..(first + real) * e].to_vec();
            st.computed = start + real;
            // The target's state at each block end the step's real tokens reach.
            for end in (start + 1..=start + real).filter(|q| q % bs == 0) {
                if let Some(h) = prefix(s.id, end) {
                    let row = first + end - 1 - start;
                    if self
                        .saved
                        .insert(h, hidden[row * e..(row + 1) * e].to_vec())
                        .is_none()
                    {
                        self.saved_order.push_back(h);
                    }
                }
            }
            while self.saved_order.len() > SAVED_STATES {
                if let Some(old) = self.saved_order.pop_front() {
                    self.saved.remove(&old);
                }
            }
            inputs.push(SeqInput {
                tokens: s.tokens[..real].to_vec(),
                start_pos: s.start_pos,
                prompt_len: s.prompt_len as u32,
                block_table: s.block_table.clone(),
                logits: LogitRows::None,
                pick: false,
                state: StateSlots::default(),
                hidden: paired,
            });
        }
        // Steps of at most `max_tokens` tokens (the target's step fits one).
        while !inputs.is_empty() {
            let mut room = self.max_tokens;
            let take = inputs
                .iter()
                .take_while(|i| {
                    let fits = i.tokens.len() <= room;
                    room = room.saturating_sub(i.tokens.len());
                    fits
                })
                .count()
                .max(1);
            let batch: Vec<SeqInput> = inputs.drain(..take).collect();
            let out = self.runner.step(&batch)?;
            self.runner.recycle(out.logits);
        }
        self.runner.pause_threads();
        Ok(())
    }

    /// Forgets a request (cancelled or finished outside a step).
    pub fn forget(&mut self, id: RequestId) {
        self.seqs.remove(&id);
    }

    /// The MTP head's drafts: from each sequence's last token and the target's last state, one
    /// step per draft position for the sequences still drafting, each fed the head's own state.
    fn run_mtp(&mut self, asks: &[ModelAsk<'_>]) -> Result<Vec<Vec<TokenId>>, crate::SdkError> {
        let e = self.mtp_width;
        let mut out: Vec<Vec<TokenId>> = vec![Vec::new(); asks.len()];
        // (ask, the state its next draft step reads)
        let mut live: Vec<(usize, Vec<f32>)> = asks
            .iter()
            .enumerate()
            .filter_map(|(i, a)| {
                let st = self.seqs.get(&a.id)?;
                let ready = st.computed + 1 == a.tokens.len() && st.state.len() == e;
                (ready && a.len > 0).then(|| (i, st.state.clone()))
            })
            .collect();
        for j in 0.. {
            live.retain(|&(i, _)| asks[i].len > j);
            if live.is_empty() {
                break;
            }
            let inputs: Vec<SeqInput> = live
                .iter()
                .map(|(i, h)| {
                    let a = &asks[*i];
                    let token = match j {
                        0 => a.tokens[a.tokens.len() - 1],
                        _ => out[*i][j - 1],
                    };
                    SeqInput {
                        hidden: h.clone(),
                        ..self.input(a, &[token], a.tokens.len() - 1 + j, true)
                    }
                })
                .collect();
            let step = self.runner.step(&inputs)?;
            for (r, (i, h)) in live.iter_mut().enumerate() {
                out[*i].push(pick(step.find_row(r, 0))?);
                h.copy_from_slice(&step.hidden[r * e..(r + 1) * e]);
            }
            self.runner.recycle(step.logits);
        }
        self.runner.pause_threads();
        Ok(out)
    }

    fn run(&mut self, asks: &[ModelAsk<'_>]) -> Result<Vec<Vec<TokenId>>, crate::SdkError> {
        if self.is_mtp() {
            return self.run_mtp(asks);
        }
        let mut out: Vec<Vec<TokenId>> = vec![Vec::new(); asks.len()];
        // Catch-up, in steps of at most `max_tokens` tokens in all; the step that reaches a
        // sequence's last token gives its first draft token.
        let mut next: Vec<usize> = asks
            .iter()
            .map(|a| {
                let valid = self.seqs.get(&a.id).map_or(0, |s| s.computed);
                valid.min(a.tokens.len() - 1)
            })
            .collect();
        loop {
            let mut inputs = Vec::new();
            let mut rows = Vec::new();
            let mut room = self.max_tokens;
            for (i, a) in asks.iter().enumerate() {
                let left = a.tokens.len() - next[i];
                if left == 0 || room == 0 {
                    continue;
                }
                let m = left.min(room);
                room -= m;
                let ends = next[i] + m == a.tokens.len();
                inputs.push(self.input(a, &a.tokens[next[i]..next[i] + m], next[i], ends));
                rows.push((i, m, ends));
            }
            if inputs.is_empty() {
                break;
            }
            let step = self.runner.step(&inputs)?;
            for (j, &(i, m, ends)) in rows.iter().enumerate() {
                next[i] += m;
                if ends {
                    out[i].push(pick(step.find_row(j, m - 1))?);
                }
            }
            self.runner.recycle(step.logits);
        }
        // The other draft tokens, one step each for the sequences still drafting.
        let longest = asks.iter().map(|a| a.len).max().unwrap_or(0);
        for j in 1..longest {
            let mut inputs = Vec::new();
            let mut rows = Vec::new();
            for (i, a) in asks.iter().enumerate() {
                if a.len > j && out[i].len() == j {
                    let pos = a.tokens.len() - 1 + j;
                    inputs.push(self.input(a, &out[i][j - 1..j], pos, true));
                    rows.push(i);
                }
            }
            if inputs.is_empty() {
                break;
            }
            let step = self.runner.step(&inputs)?;
            for (r, &i) in rows.iter().enumerate() {
                out[i].push(pick(step.find_row(r, 0))?);
            }
            self.runner.recycle(step.logits);
        }
        self.runner.pause_threads();
        for (a, d) in asks.iter().zip(&out) {
            let s = self.seqs.entry(a.id).or_default();
            s.computed = a.tokens.len();
            s.pending = Some((a.tokens.len(), d.len()));
        }
        Ok(out)
    }

    fn input(&self, a: &ModelAsk<'_>, tokens: &[TokenId], start: usize, last: bool) -> SeqInput {
        SeqInput {
            hidden: Vec::new(),
            tokens: tokens.to_vec(),
            start_pos: start as u32,
            prompt_len: a.prompt_len as u32,
            block_table: a.block_table.to_vec(),
            logits: if last {
                LogitRows::Last
            } else {
                LogitRows::None
            },
            pick: true,
            state: StateSlots::default(),
        }
    }
}

/// The greedy token of a row.
fn pick(row: Option<RowLogits<'_>>) -> Result<TokenId, crate::SdkError> {
    match row {
        Some(RowLogits::Picked(t)) => Ok(t),
        Some(RowLogits::Full(l)) => Ok(argmax(l)),
        None => Err(crate::SdkError::Config(
            "the draft model's step returned no logits".into(),
        )),
    }
}

/// The draft model as the scheduler asks it during a step of the engine: the target's threads
/// are put to sleep first, so that on the CPU the two thread pools do not spin against each other.
pub struct Asking<'a> {
    /// The target's runner.
    pub target: &'a Runner,
    /// The draft model.
    pub draft: &'a mut DraftModel,
}

impl ModelDrafter for Asking<'_> {
    fn draft(&mut self, asks: &[ModelAsk<'_>]) -> Vec<Vec<TokenId>> {
        self.target.pause_threads();
        self.draft.draft(asks)
    }
}

impl ModelDrafter for DraftModel {
    fn draft(&mut self, asks: &[ModelAsk<'_>]) -> Vec<Vec<TokenId>> {
        if self.error.is_some() {
            return vec![Vec::new(); asks.len()];
        }
        match self.run(asks) {
            Ok(d) => d,
            Err(e) => {
                self.error = Some(e.to_string());
                for a in asks {
                    self.seqs.remove(&a.id);
                }
                vec![Vec::new(); asks.len()]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axle_core::PlannedSeq;
    use axle_models::{ModelOptions, StepOutput};

    /// The MTP head's greedy chain computed in one go: a fresh head runner over the whole known
    /// sequence, each token paired with the trunk's state of the row before (`states`, one row
    /// per position up to the last but one), then `k` draft steps fed its own states; and the
    /// logits of the first draft.
    fn chain(
        model: &Arc<Model>,
        tokens: &[TokenId],
        states: &[f32],
        k: usize,
    ) -> (Vec<TokenId>, Vec<f32>) {
        let e = model.family().hparams().n_embd as usize;
        let mut head = Runner::new(
            model.clone(),
            RunnerOptions {
                mtp: true,
                ..Default::default()
            },
        )
        .unwrap();
        let table: Vec<u32> = (0..8).collect();
        let step = |head: &mut Runner, toks: &[TokenId], start: usize, hidden: Vec<f32>| {
            let out = head
                .step(&[SeqInput {
                    tokens: toks.to_vec(),
                    start_pos: start as u32,
                    prompt_len: tokens.len() as u32,
                    block_table: table.clone(),
                    logits: LogitRows::Last,
                    pick: false,
                    state: StateSlots::default(),
                    hidden,
                }])
                .unwrap();
            let last = out.hidden.len() - e;
            (out.row(0).to_vec(), out.hidden[last..].to_vec())
        };
        let mut paired = vec![0.0; e];
        paired.extend_from_slice(&states[..(tokens.len() - 1) * e]);
        let (first, mut h) = step(&mut head, tokens, 0, paired);
        let mut out = vec![argmax(&first)];
        for j in 1..k {
            let (l, next) = step(&mut head, &out[j - 1..j], tokens.len() - 1 + j, h);
            out.push(argmax(&l));
            h = next;
        }
        (out, first)
    }

    /// The head's logits for the draft after `known` from the drafter's own KV and kept state
    /// (what its first draft step computes).
    fn first_draft_logits(mtp: &mut DraftModel, id: RequestId, known: &[TokenId]) -> Vec<f32> {
        let state = mtp.seqs[&id].state.clone();
        let out = mtp
            .runner
            .step(&[SeqInput {
                tokens: known[known.len() - 1..].to_vec(),
                start_pos: known.len() as u32 - 1,
                prompt_len: known.len() as u32,
                block_table: (0..8).collect(),
                logits: LogitRows::Last,
                pick: false,
                state: StateSlots::default(),
                hidden: state,
            }])
            .unwrap();
        out.row(0).to_vec()
    }

    /// The glm4moe fixture, a target runner that returns its hidden states, and the drafter of
    /// its MTP head; one sequence at a time in blocks 0..8, with prompts of `prompt_len` tokens.
    struct Setup {
        model: Arc<Model>,
        e: usize,
        prompt_len: usize,
        target: Runner,
        mtp: DraftModel,
    }

    impl Setup {
        fn new(prompt: &str) -> (Setup, Vec<TokenId>) {
            let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../fixtures/glm4moe-tiny.gguf");
            let model = Arc::new(Model::load(&path, &ModelOptions::cpu(2)).unwrap());
            let target = Runner::new(
                model.clone(),
                RunnerOptions {
                    returns_hidden: true,
                    ..Default::default()
                },
            )
            .unwrap();
            let tokens = model.tokenizer.encode(prompt, true, false);
            let t = Setup {
                e: model.family().hparams().n_embd as usize,
                prompt_len: tokens.len(),
                mtp: DraftModel::mtp(model.clone(), 4096, 16, 64, 4).unwrap(),
                target,
                model,
            };
            (t, tokens)
        }

        /// A target step of request `id`'s `tokens` from `start` (the last `n_draft` of them
        /// drafts, `accepted` of those accepted), settled into the drafter with `prefix`.
        fn step(
            &mut self,
            id: RequestId,
            tokens: &[TokenId],
            start: usize,
            n_draft: usize,
            accepted: usize,
            prefix: &dyn Fn(RequestId, usize) -> Option<u64>,
        ) -> StepOutput {
            let table: Vec<u32> = (0..8).collect();
            let out = self
                .target
                .step(&[SeqInput {
                    tokens: tokens.to_vec(),
                    start_pos: start as u32,
                    prompt_len: self.prompt_len as u32,
                    block_table: table.clone(),
                    logits: LogitRows::All,
                    pick: false,
                    state: StateSlots::default(),
                    hidden: Vec::new(),
                }])
                .unwrap();
            let plan = StepPlan {
                seqs: vec![PlannedSeq {
                    id,
                    tokens: tokens.to_vec(),
                    start_pos: start as u32,
                    prompt_len: self.prompt_len,
                    block_table: table,
                    wants_logits: true,
                    n_draft,
                    state_slot: None,
                    pick: false,
                }],
                preempted: Vec::new(),
            };
            let event = Event {
                id,
                tokens: Vec::new(),
                finished: None,
                logprobs: Vec::new(),
                accepted,
            };
            self.mtp.settle(&plan, &[event], &out.hidden, prefix);
            out
        }

        /// The drafter's three drafts after `known`, checked against the head's chain computed
        /// in one go over `states`: the tokens, and the first draft's logits bit for bit.
        fn drafts(&mut self, id: RequestId, known: &[TokenId], states: &[f32]) -> Vec<TokenId> {
            let table: Vec<u32> = (0..8).collect();
            let drafts = self
                .mtp
                .draft(&[ModelAsk {
                    id,
                    tokens: known,
                    prompt_len: self.prompt_len,
                    block_table: &table,
                    len: 3,
                }])
                .remove(0);
            assert_eq!(self.mtp.error(), None);
            let (want, logits) = chain(&self.model, known, states, 3);
            assert_eq!(drafts, want, "request {id}, {} tokens", known.len());
            assert_eq!(
                first_draft_logits(&mut self.mtp, id, known),
                logits,
                "request {id}, {} tokens",
                known.len()
            );
            drafts
        }
    }

    /// The drafter's catch-up after a prefill and after a verify step with one draft token
    /// accepted, and its drafts, against the head's chain computed in one go: an off-by-one in
    /// pairing tokens with states, or a state kept from a rejected row, changes the drafts.
    #[test]
    fn mtp_drafts_are_the_heads_greedy_chain_after_prefill_and_after_a_verify_step() {
        let (mut t, mut known) = Setup::new("one two three four five");
        let mut states: Vec<f32> = Vec::new();
        let (mut start, mut drafts) = (0usize, Vec::new());
        for round in 0..3 {
            // A target step over the tokens not yet computed (the prompt, or the last token and
            // the drafts); the first draft is accepted in round 2.
            let tokens: Vec<TokenId> = known[start..].iter().chain(&drafts).copied().collect();
            let n_draft = drafts.len();
            let accepted = usize::from(round == 2).min(n_draft);
            let out = t.step(1, &tokens, start, n_draft, accepted, &|_, _| None);
            let real = tokens.len() - n_draft + accepted;
            states.extend_from_slice(&out.hidden[..real * t.e]);
            known.extend_from_slice(&drafts[..accepted]);
            known.push(argmax(out.row(real - 1)));
            start = known.len() - 1;
            drafts = t.drafts(1, &known, &states);
        }
    }

    /// A request that starts from a cached prefix (its first block computed by an earlier
    /// request) drafts what the head drafts over the whole sequence: the head's KV of the
    /// prefix's block is the earlier request's, and the target's state at the block's end the
    /// one kept under the prefix's hash.
    #[test]
    fn mtp_drafts_after_a_cached_prefix_are_the_heads_greedy_chain() {
        let (mut t, prompt) = Setup::new(
            "one two three four five six seven eight nine ten eleven twelve thirteen fourteen \
             fifteen sixteen seventeen eighteen nineteen twenty",
        );
        let n = prompt.len();
        assert!(n > 16, "{n} tokens: the prompt must pass the first block");
        // The same prompt twice; the second request computes only what follows the first block.
        let prefix = |_: RequestId, end: usize| (end == 16).then_some(42u64);
        let mut states = Vec::new();
        for (id, start) in [(1u64, 0usize), (2, 16)] {
            let out = t.step(id, &prompt[start..], start, 0, 0, &prefix);
            if start == 0 {
                states = out.hidden.clone();
            } else {
                assert_eq!(
                    out.hidden,
                    states[start * t.e..],
                    "the target's states again"
                );
            }
            let mut known = prompt.clone();
            known.push(argmax(out.row(n - start - 1)));
            t.drafts(id, &known, &states);
        }
    }
}
