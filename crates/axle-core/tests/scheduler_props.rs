//! Property tests of the scheduler and block pool against a fake model whose "logits" are a pure
//! function of the tokens it reads back from its simulated KV slots. Random arrivals, prompt
//! lengths (with shared prefixes), cancellations and small KV budgets; after every step the
//! invariants hold, and every request's output equals the output of the same request run alone
//! with ample memory and no prefix cache: preemption and prefix reuse change nothing, and a reused
//! block never serves other tokens. Some requests carry an output constraint (a small automaton
//! that also forces tokens): their output obeys it, and is the same alone and batched, with and
//! without speculation.
use axle_core::sampler::argmax;
use axle_core::{
    Advanced, Allowed, ConstraintTiming, DraftConfig, FinishReason, ModelAsk, ModelDrafter, Phase,
    RequestId, RequestSpec, RowLogits, SamplingParams, Scheduler, SchedulerConfig, StepPlan,
    TokenConstraint, TokenMask,
};
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};

const VOCAB: usize = 12;
const BS: u32 = 4;

/// The fake model: KV slots hold (position, token, origin); logits hash what is read back. The
/// origin stands for the arithmetic a row was computed with where the scheduler is configured
/// with prompt classes: 0 for generated rows, 1 + the prompt's class for prompt rows. A block
/// reused from another origin then changes the output.
struct FakeModel {
    kv: HashMap<u32, (u32, u32, u32)>,
    /// The scheduler's [`SchedulerConfig::prompt_classes`].
    classes: Vec<usize>,
}

impl FakeModel {
    fn new(cfg: &SchedulerConfig) -> FakeModel {
        FakeModel {
            kv: HashMap::new(),
            classes: cfg.prompt_classes.clone(),
        }
    }

    fn origin(&self, prompt_len: usize, p: u32) -> u32 {
        if self.classes.is_empty() || p as usize >= prompt_len {
            0
        } else {
            1 + self.classes.iter().filter(|&&t| prompt_len >= t).count() as u32
        }
    }

    /// Per sequence: logits for each token index that needs them (the last known token and every
    /// draft token), computed from what the KV slots hold.
    fn run(&mut self, plan: &StepPlan) -> Vec<Vec<Option<Vec<f32>>>> {
        plan.seqs
            .iter()
            .map(|s| {
                let slot = |p: u32| s.block_table[(p / BS) as usize] * BS + p % BS;
                for (i, &t) in s.tokens.iter().enumerate() {
                    let p = s.start_pos + i as u32;
                    let origin = self.origin(s.prompt_len, p);
                    self.kv.insert(slot(p), (p, t, origin));
                }
                let first = s.tokens.len() - s.n_draft - 1;
                (0..s.tokens.len())
                    .map(|j| {
                        if !s.wants_logits || j < first {
                            return None;
                        }
                        let last = s.start_pos + j as u32 + 1;
                        let mut h: u64 = 1469598103934665603;
                        for p in 0..last {
                            let (pos, tok, origin) = self.kv[&slot(p)];
                            assert_eq!(
                                pos, p,
                                "slot for position {p} holds position {pos}: wrong block served"
                            );
                            h = (h ^ tok as u64).wrapping_mul(1099511628211);
                            h = (h ^ origin as u64).wrapping_mul(1099511628211);
                        }
                        // Mostly a pure function of the last token (so n-gram drafts often hit),
                        // sometimes of the whole prefix.
                        let key = if h.is_multiple_of(5) {
                            h
                        } else {
                            self.kv[&slot(last - 1)].1 as u64 + 17
                        };
                        Some(
                            (0..VOCAB)
                                .map(|v| {
                                    (((key ^ v as u64).wrapping_mul(0x9E3779B97F4A7C15) >> 40)
                                        % 1000) as f32
                                        / 100.0
                                })
                                .collect(),
                        )
                    })
                    .collect()
            })
            .collect()
    }
}

/// The toy constraint's alphabet: every token but the stop token.
const ALPHABET: u32 = VOCAB as u32 - 1;

/// Tokens the toy automaton allows after `last`.
fn toy_next(last: Option<u32>) -> Vec<u32> {
    match last {
        None => vec![0, 1, 2],
        Some(t) => vec![(t + 1) % ALPHABET, (t + 3) % ALPHABET, (t + 4) % ALPHABET],
    }
}

/// Tokens the toy automaton forces after `t` (a chain it also allows).
fn toy_forced(t: u32) -> Vec<u32> {
    if t.is_multiple_of(5) {
        vec![(t + 1) % ALPHABET, (t + 2) % ALPHABET]
    } else {
        Vec::new()
    }
}

/// A toy output constraint: each token one of three successors of the last, a forced chain after
/// multiples of 5, may end after 3 tokens, complete after 9; forces token 1 at the start.
#[derive(Debug, Default)]
struct ToyConstraint {
    last: Option<u32>,
    emitted: usize,
}

impl ToyConstraint {
    fn take(&mut self, t: u32) {
        self.last = Some(t);
        self.emitted += 1;
    }
}

impl TokenConstraint for ToyConstraint {
    fn start(&mut self) -> Result<Advanced, String> {
        self.take(1);
        Ok(Advanced {
            finished: false,
            forced: vec![1],
        })
    }
    fn allowed(&mut self) -> Result<Allowed, String> {
        Ok(Allowed {
            mask: TokenMask::of(&toy_next(self.last)),
            may_end: self.emitted >= 3,
        })
    }
    fn advance(&mut self, token: u32) -> Result<Advanced, String> {
        if !toy_next(self.last).contains(&token) {
            return Err(format!("token {token} not allowed after {:?}", self.last));
        }
        self.take(token);
        let forced = if self.emitted < 9 {
            toy_forced(token)
        } else {
            Vec::new()
        };
        for &f in &forced {
            self.take(f);
        }
        Ok(Advanced {
            finished: self.emitted >= 9,
            forced,
        })
    }
    fn valid_prefix(&mut self, tokens: &[u32]) -> usize {
        let mut last = self.last;
        let mut n = 0;
        for &t in tokens {
            if !toy_next(last).contains(&t) {
                break;
            }
            last = Some(t);
            n += 1;
        }
        n
    }
    fn timing(&self) -> ConstraintTiming {
        ConstraintTiming::default()
    }
}

/// Whether `out` obeys the toy automaton (from its forced start).
fn obeys_toy(out: &[u32]) -> bool {
    out.first() == Some(&1) && out.windows(2).all(|w| toy_next(Some(w[0])).contains(&w[1]))
}

#[derive(Debug, Clone)]
struct Arrival {
    at_step: usize,
    prompt: Vec<u32>,
    max_tokens: usize,
    /// Sampled at temperature 0.8, else greedy.
    sampled: bool,
    seed: u64,
    cancel_after: Option<usize>,
    constrained: bool,
}

impl Arrival {
    /// An unconstrained request that runs to its end.
    fn new(at_step: usize, prompt: Vec<u32>, max_tokens: usize, sampled: bool, seed: u64) -> Self {
        Arrival {
            at_step,
            prompt,
            max_tokens,
            sampled,
            seed,
            cancel_after: None,
            constrained: false,
        }
    }
}

fn arrival() -> impl Strategy<Value = Arrival> {
    (
        0usize..12,
        prop::collection::vec(0u32..3, 0..3),
        0usize..3,
        prop::collection::vec(0u32..VOCAB as u32, 1..14),
        1usize..10,
        prop::bool::ANY,
        0u64..1000,
        prop::option::weighted(0.2, 0usize..8),
        prop::bool::weighted(0.4),
    )
        .prop_map(
            |(
                at_step,
                prefix_sel,
                shared,
                tail,
                max_tokens,
                sample,
                seed,
                cancel_after,
                constrained,
            )| {
                // Shared prefixes across requests exercise the prefix cache.
                let shared_prefix: Vec<u32> = (0..shared * 5)
                    .map(|i| (i as u32 * 7 + prefix_sel.len() as u32) % VOCAB as u32)
                    .collect();
                let mut prompt = shared_prefix;
                prompt.extend(tail);
                Arrival {
                    cancel_after,
                    constrained,
                    ..Arrival::new(at_step, prompt, max_tokens, sample, seed)
                }
            },
        )
}

fn spec(a: &Arrival) -> RequestSpec {
    RequestSpec {
        prompt: a.prompt.clone(),
        sampling: SamplingParams {
            temperature: if a.sampled { 0.8 } else { 0.0 },
            seed: a.seed,
            ..Default::default()
        },
        max_tokens: a.max_tokens,
        stop_tokens: vec![VOCAB as u32 - 1],
        speculation: true,
    }
}

/// Runs arrivals to completion; returns each request's generated tokens and finish reason.
fn simulate(
    arrivals: &[Arrival],
    cfg: SchedulerConfig,
    cancels: bool,
) -> Vec<(Vec<u32>, FinishReason)> {
    simulate_observed(arrivals, cfg, cancels, false, |_, _| {})
}

/// [`simulate`], showing each step's plan and the request id of each arrival to `observe`.
fn simulate_observed(
    arrivals: &[Arrival],
    cfg: SchedulerConfig,
    cancels: bool,
    picks: bool,
    observe: impl FnMut(&StepPlan, &[Option<RequestId>]),
) -> Vec<(Vec<u32>, FinishReason)> {
    simulate_drafted(arrivals, cfg, cancels, picks, None, observe)
}

/// A draft model for the fake model: guesses the greedy token as a function of the last token
/// alone (which the fake model mostly is), wrong now and then on purpose, and checks that the
/// blocks it is given cover every position it writes.
struct FakeDrafter {
    calls: usize,
    drafted: usize,
}

impl ModelDrafter for FakeDrafter {
    fn draft(&mut self, asks: &[ModelAsk<'_>]) -> Vec<Vec<u32>> {
        self.calls += 1;
        asks.iter()
            .map(|a| {
                // Positions written: up to the one before the last draft token.
                let last_pos = a.tokens.len() + a.len - 2;
                assert!(
                    a.block_table.len() * BS as usize > last_pos,
                    "blocks end before the draft model's writes"
                );
                let mut last = *a.tokens.last().expect("tokens");
                (0..a.len)
                    .map(|j| {
                        let key = last as u64 + 17;
                        let l: Vec<f32> = (0..VOCAB)
                            .map(|v| {
                                (((key ^ v as u64).wrapping_mul(0x9E3779B97F4A7C15) >> 40) % 1000)
                                    as f32
                            })
                            .collect();
                        last = if (a.tokens.len() + j) % 7 == 3 {
                            (last + 1) % VOCAB as u32 // a wrong guess now and then
                        } else {
                            argmax(&l)
                        };
                        self.drafted += 1;
                        last
                    })
                    .collect()
            })
            .collect()
    }
}

/// [`simulate_observed`] with `drafter` as the draft model.
fn simulate_drafted(
    arrivals: &[Arrival],
    cfg: SchedulerConfig,
    cancels: bool,
    picks: bool,
    mut drafter: Option<&mut dyn ModelDrafter>,
    mut observe: impl FnMut(&StepPlan, &[Option<RequestId>]),
) -> Vec<(Vec<u32>, FinishReason)> {
    let mut model = FakeModel::new(&cfg);
    let mut s = Scheduler::new(cfg);
    let mut ids: Vec<Option<RequestId>> = vec![None; arrivals.len()];
    let mut steps_alive: Vec<usize> = vec![0; arrivals.len()];
    for step in 0..2000 {
        for (i, a) in arrivals.iter().enumerate() {
            if a.at_step == step {
                let constraint: Option<Box<dyn TokenConstraint>> = a
                    .constrained
                    .then(|| Box::new(ToyConstraint::default()) as Box<dyn TokenConstraint>);
                ids[i] = Some(s.add_constrained(spec(a), constraint).expect("fits"));
            }
        }
        if cancels {
            for (i, a) in arrivals.iter().enumerate() {
                if let (Some(id), Some(c)) = (ids[i], a.cancel_after) {
                    if steps_alive[i] == c {
                        s.finish(id, FinishReason::Cancelled);
                    }
                    steps_alive[i] += 1;
                }
            }
        }
        let plan = s.schedule_with(drafter.as_deref_mut());
        s.check()
            .unwrap_or_else(|e| panic!("after schedule at step {step}: {e}"));
        assert!(plan.n_tokens() <= s.config().max_batch_tokens);
        assert!(plan.seqs.len() <= s.config().max_seqs);
        observe(&plan, &ids);
        let out = model.run(&plan);
        // With `picks`, rows of sequences that allow it come back as their largest index only,
        // as a step whose head runs on an accelerator returns them.
        s.apply(&plan, |i, j| {
            let l = out[i][j].as_deref()?;
            Some(if picks && plan.seqs[i].pick {
                RowLogits::Picked(argmax(l))
            } else {
                RowLogits::Full(l)
            })
        });
        s.check()
            .unwrap_or_else(|e| panic!("after apply at step {step}: {e}"));
        if step > 12 && !s.has_work() {
            break;
        }
    }
    assert!(!s.has_work(), "requests left unfinished");
    assert_eq!(s.pool().in_use(), 0, "blocks leaked");
    ids.iter()
        .map(|id| {
            let id = id.expect("arrived");
            let reason = match s.phase(id) {
                Some(Phase::Finished(r)) => r.clone(),
                other => panic!("request {id} ended as {other:?}"),
            };
            (s.generated(id).unwrap().to_vec(), reason)
        })
        .collect()
}

fn cfg(n_blocks: u32, caching: bool, max_batch_tokens: usize, max_seqs: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_batch_tokens,
        max_seqs,
        n_blocks,
        block_size: BS,
        context: 28,
        prefix_caching: caching,
        reuse_marked_only: false,
        model_id: 9,
        prompt_classes: Vec::new(),
        draft: None,
        state_slots: None,
        kv_lanes: false,
    }
}

/// `c` with n-gram drafts of up to `max_len` tokens (0: speculation off).
fn with_drafts(mut c: SchedulerConfig, max_len: usize) -> SchedulerConfig {
    if max_len == 0 {
        return c;
    }
    c.draft = Some(DraftConfig {
        max_len,
        verify_cost: (0..=8).map(|k| 1.0 + 0.05 * k as f64).collect(),
        ..Default::default()
    });
    c
}

/// 1 to 6 requests.
fn arrivals() -> impl Strategy<Value = Vec<Arrival>> {
    prop::collection::vec(arrival(), 1..7)
}

/// A step's limits, drawn together: its token budget, its sequence cap and the longest draft.
#[derive(Debug, Clone, Copy)]
struct StepLimits {
    budget: usize,
    max_seqs: usize,
    draft_len: usize,
}

impl StepLimits {
    /// A config of `n_blocks` blocks with these limits (see [`cfg`] and [`with_drafts`]).
    fn config(self, n_blocks: u32, caching: bool) -> SchedulerConfig {
        with_drafts(
            cfg(n_blocks, caching, self.budget, self.max_seqs),
            self.draft_len,
        )
    }
}

/// Small limits: budgets of 3 to 23 tokens, 1 to 4 sequences, drafts of up to 5 tokens (0:
/// speculation off).
fn step_limits() -> impl Strategy<Value = StepLimits> {
    (3usize..24, 1usize..5, 0usize..6).prop_map(|(budget, max_seqs, draft_len)| StepLimits {
        budget,
        max_seqs,
        draft_len,
    })
}

/// The prefill chunks (first position, tokens) of each arrival, in order.
fn prefill_chunks(arrivals: &[Arrival], cfg: SchedulerConfig) -> Vec<Vec<(u32, usize)>> {
    let mut chunks = vec![Vec::new(); arrivals.len()];
    simulate_observed(arrivals, cfg, false, false, |plan, ids| {
        for p in &plan.seqs {
            let i = ids.iter().position(|&x| x == Some(p.id)).expect("known");
            if (p.start_pos as usize) < arrivals[i].prompt.len() {
                chunks[i].push((p.start_pos, p.tokens.len() - p.n_draft));
            }
        }
    });
    chunks
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Constrained output (forced chains included) is the same with speculation on and off,
    /// batched or alone.
    #[test]
    fn constrained_output_is_the_same_with_speculation(
        arrivals in prop::collection::vec(constrained_arrival(), 1..5),
        draft_len in 2usize..7,
        max_seqs in 1usize..5,
    ) {
        let reference = simulate(&arrivals, cfg(512, false, 64, 8), false);
        let spec = simulate(&arrivals, with_drafts(cfg(512, true, 32, max_seqs), draft_len), false);
        for (i, a) in arrivals.iter().enumerate() {
            prop_assert_eq!(&spec[i], &reference[i], "request {} ({:?})", i, a);
            prop_assert!(obeys_toy(&reference[i].0), "request {}: {:?}", i, reference[i].0);
        }
    }

    #[test]
    fn device_picks_change_no_output_and_only_plain_greedy_rows_allow_them(
        arrivals in arrivals(),
        draft_len in 0usize..6,
    ) {
        let reference = simulate(&arrivals, cfg(512, false, 64, 8), false);
        let c = with_drafts(cfg(512, false, 64, 8), draft_len);
        let mut picked = 0;
        let got = simulate_observed(&arrivals, c, false, true, |plan, ids| {
            for seq in plan.seqs.iter().filter(|q| q.pick) {
                let a = ids.iter().position(|&id| id == Some(seq.id)).expect("arrived");
                assert!(
                    !arrivals[a].sampled && !arrivals[a].constrained,
                    "request {a} (sampled {}, constrained {}) allowed picks",
                    arrivals[a].sampled,
                    arrivals[a].constrained
                );
                picked += 1;
            }
        });
        prop_assert_eq!(got, reference);
        let greedy = arrivals.iter().any(|a| !a.sampled && !a.constrained);
        prop_assert!(!greedy || picked > 0, "no plain-greedy request was planned with picks");
    }

    #[test]
    fn a_draft_model_changes_no_output(
        arrivals in arrivals(),
        limits in step_limits(),
        n_blocks in 8u32..40,
    ) {
        let plain = simulate(&arrivals, cfg(64, false, 64, 8), false);
        let mut c = limits.config(n_blocks, true);
        let draft = c.draft.get_or_insert_with(|| DraftConfig {
            max_len: 4,
            verify_cost: vec![1.0, 1.05, 1.1, 1.15, 1.2],
            ..Default::default()
        });
        draft.model_cost = Some(0.05);
        let mut model = FakeDrafter { calls: 0, drafted: 0 };
        let fast = simulate_drafted(&arrivals, c, false, false, Some(&mut model), |_, _| {});
        prop_assert_eq!(plain, fast);
    }

    #[test]
    fn small_budgets_preemption_and_caching_change_no_output(
        arrivals in arrivals(),
        n_blocks in 7u32..16,
        caching in prop::bool::ANY,
        limits in step_limits(),
        classed in prop::bool::ANY,
        lanes in prop::bool::ANY,
    ) {
        // With prompt classes, rows computed from different origins hold different numbers:
        // a cached block must serve only requests that would compute the same ones.
        let classes = |mut c: SchedulerConfig| {
            if classed {
                c.prompt_classes = vec![3, 6];
            }
            c
        };
        // Reference: ample memory, no cache, no cancellations, no speculation.
        let reference = simulate(&arrivals, classes(cfg(512, false, 64, 8)), false);
        // Lanes move blocks, never tokens.
        let c = SchedulerConfig {
            kv_lanes: lanes,
            ..classes(limits.config(n_blocks, caching))
        };
        let constrained = simulate(&arrivals, c, true);
        for (i, (a, (want, want_reason))) in arrivals.iter().zip(&reference).enumerate() {
            let (got, reason) = &constrained[i];
            if *reason == FinishReason::Cancelled {
                prop_assert!(want.starts_with(got), "request {i}: cancelled output {got:?} is not a prefix of {want:?}");
            } else {
                prop_assert_eq!(got, want, "request {} ({:?})", i, a);
                prop_assert_eq!(reason, want_reason);
            }
            if a.constrained {
                prop_assert!(obeys_toy(got), "request {i}: {got:?} breaks the constraint");
                if *reason == FinishReason::Stop {
                    prop_assert!(got.len() >= 3, "request {i} ended before the constraint allowed");
                }
            }
        }
    }

    /// Recurrent models: with a pool of state slots smaller than the requests (and than
    /// `max_seqs`), no step runs more sequences than slots, every planned sequence has a slot
    /// of its own, a sequence keeps its slot until it starts over (preempted and recomputed from
    /// position 0), slots are all given back (`check` every step), and the output is the same as
    /// with ample memory and no slot limit.
    #[test]
    fn state_slots_cap_concurrency_and_change_no_output(
        arrivals in arrivals(),
        n_blocks in 7u32..16,
        limits in step_limits(),
        slots in 1u32..4,
    ) {
        let reference = simulate(&arrivals, cfg(512, false, 64, 8), false);
        let c = SchedulerConfig {
            state_slots: Some(slots),
            ..limits.config(n_blocks, false)
        };
        let mut holder: HashMap<RequestId, u32> = HashMap::new();
        let mut violations = Vec::new();
        let got = simulate_observed(&arrivals, c, false, false, |plan, _| {
            if plan.seqs.len() > slots as usize {
                violations.push(format!("{} sequences in a step, {slots} slots", plan.seqs.len()));
            }
            let mut seen = HashSet::new();
            for p in &plan.seqs {
                let Some(s) = p.state_slot else {
                    violations.push(format!("request {} planned without a slot", p.id));
                    continue;
                };
                if !seen.insert(s) {
                    violations.push(format!("slot {s} planned twice in one step"));
                }
                if holder.insert(p.id, s).is_some_and(|old| old != s) && p.start_pos != 0 {
                    violations.push(format!("request {} changed slot mid-sequence", p.id));
                }
            }
        });
        prop_assert!(violations.is_empty(), "{violations:?}");
        for (i, ((want, want_reason), (g, reason))) in reference.iter().zip(&got).enumerate() {
            prop_assert_eq!(g, want, "request {}", i);
            prop_assert_eq!(reason, want_reason);
        }
    }

    /// How a prompt is cut into prefill chunks depends on the prompt alone, not on the requests
    /// sharing its steps (with ample memory and no prefix cache): the condition for a prompt to
    /// compute the same numbers batched as alone on kernels that round by the chunk's width.
    #[test]
    fn prefill_chunks_do_not_depend_on_neighbours(
        arrivals in arrivals(),
        limits in step_limits(),
    ) {
        let c = limits.config(512, false);
        let together = prefill_chunks(&arrivals, c.clone());
        for (i, a) in arrivals.iter().enumerate() {
            let alone = prefill_chunks(std::slice::from_ref(a), c.clone());
            prop_assert_eq!(&together[i], &alone[0], "request {}", i);
        }
    }
}

#[test]
fn exhausted_kv_preempts_the_newest_and_everything_completes() {
    // Three requests that each need 4 blocks at the end, in a pool of 6 blocks.
    let arrivals: Vec<Arrival> = (0..3)
        .map(|i| Arrival::new(0, vec![i, 1, 2, 3, 4, 5], 9, false, 0))
        .collect();
    let mut s = Scheduler::new(cfg(6, true, 32, 4));
    let mut model = FakeModel::new(s.config());
    let ids: Vec<_> = arrivals
        .iter()
        .map(|a| {
            s.add(RequestSpec {
                stop_tokens: vec![],
                ..spec(a)
            })
            .unwrap()
        })
        .collect();
    let mut preempted = Vec::new();
    while s.has_work() {
        let plan = s.schedule();
        preempted.extend(plan.preempted.iter().copied());
        let out = model.run(&plan);
        s.apply(&plan, |i, j| out[i][j].as_deref().map(RowLogits::Full));
        s.check().unwrap();
    }
    assert!(!preempted.is_empty(), "the budget should force preemption");
    assert!(
        !preempted.contains(&ids[0]),
        "the oldest request is never preempted for newer ones"
    );
    for id in ids {
        assert_eq!(s.phase(id), Some(&Phase::Finished(FinishReason::Length)));
        assert_eq!(s.generated(id).unwrap().len(), 9);
    }
    assert_eq!(s.pool().in_use(), 0);
}

#[test]
fn speculation_verifies_drafts_and_rolls_back() {
    // A periodic prompt: the fake model (mostly a function of the last token) continues the period,
    // so drafts are accepted; outputs must equal the plain run token for token.
    let prompt: Vec<u32> = (0..24).map(|i| [3u32, 5, 7, 2][i % 4]).collect();
    let run = |c: SchedulerConfig| {
        let mut s = Scheduler::new(c);
        let mut model = FakeModel::new(s.config());
        let id = s
            .add(RequestSpec {
                prompt: prompt.clone(),
                sampling: SamplingParams::greedy(),
                max_tokens: 40,
                stop_tokens: vec![],
                speculation: true,
            })
            .unwrap();
        let mut steps = 0;
        while s.has_work() {
            let p = s.schedule();
            let out = model.run(&p);
            s.apply(&p, |i, j| out[i][j].as_deref().map(RowLogits::Full));
            s.check().unwrap();
            steps += 1;
        }
        (
            s.generated(id).unwrap().to_vec(),
            s.stats(id).unwrap(),
            steps,
            s.pool().in_use(),
        )
    };
    let big = |d| {
        let c = SchedulerConfig {
            max_batch_tokens: 64,
            max_seqs: 4,
            n_blocks: 64,
            block_size: BS,
            context: 256,
            prefix_caching: false,
            reuse_marked_only: false,
            model_id: 1,
            prompt_classes: Vec::new(),
            draft: None,
            state_slots: None,
            kv_lanes: false,
        };
        with_drafts(c, if d { 4 } else { 0 })
    };
    let (plain, plain_stats, plain_steps, _) = run(big(false));
    let (fast, stats, steps, in_use) = run(big(true));
    assert_eq!(plain, fast);
    assert_eq!(plain_stats.drafted, 0);
    assert!(stats.drafted > 0 && stats.verifies > 0, "{stats:?}");
    assert!(
        steps <= plain_steps,
        "speculation took more steps ({steps} vs {plain_steps})"
    );
    assert_eq!(in_use, 0);
}

/// Runs one greedy request of `prompt` to the end; after its first step, marks its prefix of
/// `mark` blocks reusable. Returns the tokens its first step computed, its output and the prompt
/// tokens it took from the cache.
fn run_one(
    s: &mut Scheduler,
    model: &mut FakeModel,
    prompt: &[u32],
    mark: Option<usize>,
) -> (usize, Vec<u32>, usize) {
    let id = s
        .add(RequestSpec {
            prompt: prompt.to_vec(),
            sampling: SamplingParams::greedy(),
            max_tokens: 2,
            stop_tokens: vec![],
            speculation: false,
        })
        .unwrap();
    let first = s.schedule();
    let computed = first.n_tokens();
    let out = model.run(&first);
    s.apply(&first, |i, j| out[i][j].as_deref().map(RowLogits::Full));
    if let Some(blocks) = mark {
        let h = s.prefix_hash(id, blocks * BS as usize).expect("registered");
        s.set_reusable(h, true);
    }
    while s.has_work() {
        let p = s.schedule();
        let out = model.run(&p);
        s.apply(&p, |i, j| out[i][j].as_deref().map(RowLogits::Full));
    }
    (
        computed,
        s.generated(id).unwrap().to_vec(),
        s.stats(id).unwrap().cached_tokens,
    )
}

/// With `reuse_marked_only` (recurrent models), a cached prefix is reused only up to the last
/// block marked reusable, and the output is unchanged.
#[test]
fn marked_only_prefix_reuse_stops_at_the_last_marked_block() {
    let mut c = cfg(32, true, 64, 4);
    c.reuse_marked_only = true;
    let mut s = Scheduler::new(c);
    let mut model = FakeModel::new(s.config());
    let prompt: Vec<u32> = (0..17).map(|i| i % 10).collect();
    // Nothing marked: nothing reused. Then the prefix of 2 blocks marked: reuse stops there,
    // although all 4 full blocks are cached.
    let (a_computed, a_out, a_cached) = run_one(&mut s, &mut model, &prompt, None);
    let (b_computed, b_out, b_cached) = run_one(&mut s, &mut model, &prompt, Some(2));
    let (c_computed, c_out, c_cached) = run_one(&mut s, &mut model, &prompt, None);
    assert_eq!((a_computed, a_cached), (17, 0));
    assert_eq!((b_computed, b_cached), (17, 0));
    assert_eq!((c_computed, c_cached), (9, 8));
    assert_eq!(a_out, b_out);
    assert_eq!(a_out, c_out);
    assert_eq!(s.pool().in_use(), 0);
    s.check().unwrap();
}

#[test]
fn prefix_reuse_skips_cached_blocks() {
    let mut s = Scheduler::new(cfg(32, true, 64, 4));
    let mut model = FakeModel::new(s.config());
    let prompt: Vec<u32> = (0..17).map(|i| i % 10).collect();
    let (a_computed, a_out, a_cached) = run_one(&mut s, &mut model, &prompt, None);
    let (b_computed, b_out, b_cached) = run_one(&mut s, &mut model, &prompt, None);
    assert_eq!((a_computed, a_cached), (17, 0));
    // 17 tokens = 4 full blocks + 1; all 4 full blocks are reused, only the last token is computed.
    assert_eq!((b_computed, b_cached), (1, 16));
    assert_eq!(a_out, b_out);
}

/// With prompt classes (an engine that computes prompt rows by their prompt's length and
/// generated rows otherwise), a cached block serves only a request that computes its positions
/// from the same origin: the same prompt class, and prompt positions where it had prompt positions.
#[test]
fn prefix_reuse_follows_the_rows_origin() {
    let mut c = cfg(32, true, 64, 4);
    c.prompt_classes = vec![8];
    let mut s = Scheduler::new(c);
    let mut model = FakeModel::new(s.config());
    // 15 prompt tokens (class 1) and 2 generated: block 3 holds 3 prompt positions and the
    // first generated token.
    let prompt: Vec<u32> = (0..15).map(|i| i % 10).collect();
    let (_, a_out, a_cached) = run_one(&mut s, &mut model, &prompt, None);
    assert_eq!(a_cached, 0);
    // The same prompt: its 3 full blocks come from the cache.
    let (computed, out, cached) = run_one(&mut s, &mut model, &prompt, None);
    assert_eq!((computed, cached), (3, 12));
    assert_eq!(out, a_out);
    // A prompt of 7 tokens (class 0) computes its first block otherwise: nothing is reused.
    let (computed, _, cached) = run_one(&mut s, &mut model, &prompt[..7], None);
    assert_eq!((computed, cached), (7, 0));
    // The next turn (prompt, output): the block that held a generated row is computed again as
    // a prompt row.
    let mut turn = prompt.clone();
    turn.extend(&a_out);
    let (computed, _, cached) = run_one(&mut s, &mut model, &turn, None);
    assert_eq!((computed, cached), (5, 12));
    s.check().unwrap();
}

/// Arrivals whose prompts are paths of the toy automaton (so n-gram drafts follow it and often
/// cross its forced chains), all constrained.
fn constrained_arrival() -> impl Strategy<Value = Arrival> {
    (
        0usize..6,
        prop::collection::vec(0usize..3, 4..16),
        4usize..12,
        prop::bool::ANY,
        0u64..1000,
    )
        .prop_map(|(at_step, picks, max_tokens, sample, seed)| {
            let mut prompt = vec![1];
            for p in picks {
                let last = *prompt.last().expect("non-empty");
                prompt.push(toy_next(Some(last))[p]);
            }
            Arrival {
                constrained: true,
                ..Arrival::new(at_step, prompt, max_tokens, sample, seed)
            }
        })
}

/// With KV lanes (device layouts) every sequence grows in consecutive blocks of a lane of its
/// own, a new request takes the lowest lane that is wholly free, and a step lists its decoding
/// sequences first, in the order of their blocks, then prefill chunks.
#[test]
fn lanes_keep_each_sequence_consecutive_and_steps_in_block_order() {
    let c = SchedulerConfig {
        kv_lanes: true,
        ..cfg(24, false, 64, 3)
    };
    let mut s = Scheduler::new(c);
    let mut model = FakeModel::new(s.config());
    let request = |s: &mut Scheduler, prompt: Vec<u32>, max_tokens| {
        s.add(RequestSpec {
            prompt,
            sampling: SamplingParams::greedy(),
            max_tokens,
            stop_tokens: vec![],
            speculation: false,
        })
        .unwrap()
    };
    let mut step = |s: &mut Scheduler| {
        let p = s.schedule();
        let out = model.run(&p);
        s.apply(&p, |i, j| out[i][j].as_deref().map(RowLogits::Full));
        p
    };
    // Three sequences of 5 prompt tokens, decoding side by side past a block of BS slots.
    let a = request(&mut s, vec![1, 2, 3, 4, 5], 14);
    let b = request(&mut s, vec![2, 3, 4, 5, 6], 3);
    let c = request(&mut s, vec![3, 4, 5, 6, 7], 14);
    for _ in 0..3 {
        step(&mut s);
    }
    let lane = 24 / 3;
    let table = |p: &StepPlan, id| {
        p.seqs
            .iter()
            .find(|q| q.id == id)
            .unwrap()
            .block_table
            .clone()
    };
    // b finished; a new request takes its lane (the lowest wholly free one).
    assert!(matches!(s.phase(b), Some(Phase::Finished(_))));
    let d = request(&mut s, vec![4, 5, 6, 7, 8, 9, 1, 2, 3], 4);
    let p = step(&mut s);
    let ids: Vec<RequestId> = p.seqs.iter().map(|q| q.id).collect();
    assert_eq!(
        ids,
        [a, c, d],
        "decodes first in block order, then the prefill"
    );
    assert_eq!(table(&p, d)[0], lane);
    for _ in 0..4 {
        let p = step(&mut s);
        let ids: Vec<RequestId> = p.seqs.iter().map(|q| q.id).collect();
        if ids.len() == 3 {
            assert_eq!(ids, [a, d, c], "in block order once d decodes");
        }
        for q in &p.seqs {
            let t = &q.block_table;
            assert!(
                t.windows(2).all(|w| w[1] == w[0] + 1),
                "request {}: blocks {t:?} not consecutive",
                q.id
            );
            assert_eq!(t[0] % lane, 0, "request {} starts mid-lane: {t:?}", q.id);
        }
    }
    while s.has_work() {
        step(&mut s);
    }
    assert_eq!(s.pool().in_use(), 0);
    s.check().unwrap();
}

#[test]
fn draft_model_drafts_are_verified_and_counted() {
    let prompt: Vec<u32> = (0..10).map(|i| [3u32, 5, 7, 2, 9][i % 5]).collect();
    let c = || {
        let mut c = with_drafts(
            SchedulerConfig {
                context: 256,
                ..cfg(64, false, 64, 4)
            },
            4,
        );
        if let Some(d) = c.draft.as_mut() {
            d.model_cost = Some(0.05);
            d.sources.ngram = false;
            d.sources.suffix = false;
        }
        c
    };
    let run = |drafter: Option<&mut FakeDrafter>| {
        let mut s = Scheduler::new(c());
        let mut model = FakeModel::new(s.config());
        let id = s
            .add(RequestSpec {
                prompt: prompt.clone(),
                sampling: SamplingParams::greedy(),
                max_tokens: 60,
                stop_tokens: vec![],
                speculation: drafter.is_some(),
            })
            .unwrap();
        let mut drafter = drafter;
        while s.has_work() {
            let p = s.schedule_with(drafter.as_deref_mut());
            let out = model.run(&p);
            s.apply(&p, |i, j| out[i][j].as_deref().map(RowLogits::Full));
            s.check().unwrap();
        }
        assert_eq!(s.pool().in_use(), 0);
        (s.generated(id).unwrap().to_vec(), s.stats(id).unwrap())
    };
    let (plain, _) = run(None);
    let mut m = FakeDrafter {
        calls: 0,
        drafted: 0,
    };
    let (fast, stats) = run(Some(&mut m));
    assert_eq!(plain, fast);
    let by_model = stats.by_source[axle_core::DraftSource::Model as usize];
    assert!(m.calls > 0 && by_model.drafted > 0, "{stats:?}");
    assert!(
        by_model.accepted > 0 && by_model.accepted < by_model.drafted,
        "{by_model:?}"
    );
    assert_eq!(stats.drafted, by_model.drafted, "only the model drafted");
}
