//! The synchronous engine: one model, one runner, one scheduler. Each `step` is
//! plan (core) -> execute (runner, one graph for the whole batch) -> apply (core), followed by
//! detokenization and stop-string matching per request.
use crate::draft_model::{Asking, DraftModel};
use crate::events::{Finish, Speculation, Timing, Usage};
pub use crate::request::RequestOptions;
use crate::request::{defaults, Field, Rejection};
use crate::stop::StopMatcher;
use crate::SdkError;
use axle_core::{
    DraftConfig, DraftSource, DraftSources, Event, FinishReason, RecurrentStates, RequestId,
    RequestSpec, Save, Scheduler, SchedulerConfig, StepPlan, TokenConstraint, TokenLogprob,
    MAX_DRAFT,
};
use axle_models::device_step::{DeviceAttention, DeviceProducts};
pub use axle_models::kv::KvType;
use axle_models::{
    HostKernels, Kernels, LogitRows, Model, RowValues, Runner, RunnerOptions, SeqInput, StateSlots,
    StepProfile, StreamDecoder, TokenId,
};
use axle_structured::reasoning::ReasoningSplitter;
use axle_structured::tools::ToolCallParser;
use smart_default::SmartDefault;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Instant;

/// Engine limits.
#[derive(Debug, Clone, SmartDefault)]
pub struct EngineConfig {
    /// KV slots shared by all sequences.
    #[default(8192)]
    pub kv_slots: u32,
    /// Slots per KV block.
    #[default(16)]
    pub block_size: u32,
    /// Most tokens per step (prefill chunks and decodes together).
    #[default(defaults::STEP_TOKENS)]
    pub max_batch_tokens: usize,
    /// Most sequences per step.
    #[default(16)]
    pub max_seqs: usize,
    /// Reuse KV of identical prompt prefixes.
    #[default(true)]
    pub prefix_caching: bool,
    /// Most tokens one sequence may hold.
    #[default(defaults::CONTEXT)]
    pub context: usize,
    /// Longest draft (0 turns speculation off for every request).
    #[default(defaults::DRAFT_LEN)]
    pub draft_len: usize,
    /// The drafters requests consult.
    pub drafters: DraftSources,
    /// A draft model: a smaller model with the same vocabulary, asked for drafts where no free
    /// source matched a copy (None: none).
    pub draft_model: Option<Arc<Model>>,
    /// The draft model's step cost relative to the target's decode step (None measures it at
    /// start-up).
    pub draft_cost: Option<f64>,
    /// Verify step costs relative to a decode step (index k: k draft tokens); None measures them
    /// at start-up on this machine and model.
    pub verify_cost: Option<Vec<f64>>,
    /// Hybrid (recurrent) models with prefix caching: how many recurrent states to keep for reuse,
    /// one per prefix ending at a prefill-chunk boundary (least recently used ones go first).
    #[default(16)]
    pub state_cache: u32,
    /// Hybrid (recurrent) models: sequences that may hold a recurrent state at once (None: one
    /// per `max_seqs`). Each slot is a fixed block of device memory (every linear layer's
    /// convolution window and delta-rule state, times the verify window); the scheduler admits a
    /// sequence only with a slot free, so fewer slots cap concurrency instead of memory running
    /// out.
    pub state_slots: Option<usize>,
    /// Kernel choice. Batch-invariant (the default): a request's output does not depend on what
    /// shares its steps, and n-gram speculation reproduces plain decoding. `LikeLlamaCpp` gives
    /// each step ggml's fastest kernels for its shape, as libllama does: more throughput for
    /// large batches on accelerators, where invariance costs extra passes over the weights, but
    /// outputs may differ at close calls with the batch (and speculation is no longer exact).
    #[default(Kernels::BatchInvariant)]
    pub kernels: Kernels,
    /// With batch-invariant kernels on accelerators: how small columns (decode and verify rows)
    /// multiply quantized weights. `None`: by device and `max_seqs`
    /// (`axle_models::runner::default_products`: wide products for engines of 16 sequences or
    /// more where the CUDA backend replays MMQ, else Axle's column-invariant kernel where the
    /// CUDA backend carries it, else mat-vec groups;
    /// `AXLE_DEVICE_PRODUCTS` may name another with `BatchInvariant` kernels, refused like this
    /// field where it cannot run).
    /// [`DeviceProducts::Wide`] (CUDA only)
    /// reads the weights once per step whatever the batch: the choice for serving many
    /// concurrent sequences, about level with libllama for a lone one and slower than `Columns`
    /// for a few (docs/gpu.md). Refused with `LikeLlamaCpp`.
    pub device_products: Option<DeviceProducts>,
    /// With batch-invariant kernels on a device: how decode and verify rows attend
    /// ([`DeviceAttention`]: paged attention by default; an op per row on request).
    pub device_attention: DeviceAttention,
    /// With batch-invariant kernels on the CPU: which of ggml's kernels rows share
    /// ([`HostKernels`]; `None`: the default, `Origin`). `Origin`: prompt rows the arithmetic
    /// libllama prefills with, generated rows the one it decodes with, so prefill runs at
    /// libllama's speed and greedy output follows libllama's. `Compatible`: libllama's decode
    /// arithmetic for every row (slower prefill). `Tiled`: ggml's tiled kernels' arithmetic for
    /// every row (greedy output parts from libllama's sooner). All three are exact. Refused
    /// (when set) with `LikeLlamaCpp`.
    pub host_kernels: Option<HostKernels>,
    /// How the KV cache stores keys and values ([`KvType`]: F16 by default; Q8_0 halves its
    /// memory where Axle's paged attention reads it, and is refused elsewhere).
    pub kv_type: KvType,
}

/// What a step produced for one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// A generated token and the text it completed (possibly empty).
    Token {
        /// The request.
        id: RequestId,
        /// The token.
        token: TokenId,
        /// Answer text now safe to emit.
        text: String,
        /// Reasoning text now safe to emit (models whose template marks thinking).
        reasoning: String,
        /// Its log-probabilities, when the request asked for them.
        logprob: Option<TokenLogprob>,
    },
    /// The request ended.
    Finished {
        /// The request.
        id: RequestId,
        /// Answer text still held back when it ended (flushed).
        text: String,
        /// Reasoning text still held back.
        reasoning: String,
        /// How it ended.
        finish: Finish,
    },
}

/// What every request an engine ran to the end produced ([`EngineCore::drain`]).
#[derive(Debug, Default)]
pub struct Drained {
    /// Each request's tokens.
    pub tokens: HashMap<RequestId, Vec<TokenId>>,
    /// Each token's log-probability, for requests that asked for them.
    pub logprobs: HashMap<RequestId, Vec<f32>>,
    /// How each request ended (usage, speculation counts, ...).
    pub finished: HashMap<RequestId, Finish>,
}

impl Drained {
    /// The tokens of `ids`, in that order (empty for a request that produced none).
    pub fn outputs(&mut self, ids: &[RequestId]) -> Vec<Vec<TokenId>> {
        ids.iter()
            .map(|id| self.tokens.remove(id).unwrap_or_default())
            .collect()
    }

    /// The log-probabilities of `ids`' tokens, in that order (empty for a request that asked for
    /// none).
    pub fn logprobs(&mut self, ids: &[RequestId]) -> Vec<Vec<f32>> {
        ids.iter()
            .map(|id| self.logprobs.remove(id).unwrap_or_default())
            .collect()
    }

    /// Draft tokens proposed, over every request.
    pub fn drafted(&self) -> usize {
        self.finished.values().map(|f| f.speculation.drafted).sum()
    }

    /// Draft tokens accepted, over every request.
    pub fn accepted(&self) -> usize {
        self.finished.values().map(|f| f.speculation.accepted).sum()
    }
}

#[derive(Debug)]
struct TextState {
    decoder: StreamDecoder,
    stop: StopMatcher,
    thinking: Option<ReasoningSplitter>,
    calls: Option<ToolCallParser>,
    /// Tokens generated while the thinking was open.
    reasoning_tokens: usize,
    /// When the request was submitted, and when its first token came out of a step.
    submitted: Instant,
    first_token: Option<Instant>,
}

impl TextState {
    /// Text after stop strings: its reasoning, and its answer with tool calls held back.
    fn shown(&mut self, text: String) -> (String, String) {
        let (reasoning, answer) = match &mut self.thinking {
            Some(s) => s.push(&text),
            None => (String::new(), text),
        };
        (reasoning, self.answer(answer))
    }

    fn answer(&mut self, text: String) -> String {
        match &mut self.calls {
            Some(p) => p.push(&text),
            None => text,
        }
    }
}

/// One model driven step by step.
#[derive(Debug)]
pub struct EngineCore {
    model: Arc<Model>,
    runner: Runner,
    sched: Scheduler,
    text: HashMap<RequestId, TextState>,
    /// Recurrent models: each sequence's state group and the saved states of prefixes.
    states: Option<RecurrentStates>,
    /// Where the verify-cost measurement's steps spent their time, per draft length (empty
    /// when it did not run).
    verify_profiles: Vec<StepProfile>,
    /// The draft model, if one was given.
    draft_model: Option<DraftModel>,
}

/// What a step verifying k draft tokens costs, for k = 0..=max_len ([`measure_verify_cost`]).
#[derive(Debug, Clone, Default)]
pub struct VerifyCost {
    /// Time relative to a one-token decode step (index 0 is 1.0).
    pub ratios: Vec<f64>,
    /// The one-token decode step's time, seconds (median).
    pub decode_s: f64,
    /// Where the timed steps of each k spent their time.
    pub profiles: Vec<StepProfile>,
}

/// Measures what a step verifying k draft tokens (k + 1 tokens of one sequence) costs relative to
/// a one-token decode step, for k = 0..=max_len, on this machine and model: the input of the
/// cost-aware draft length. Uses the first KV blocks as scratch (nothing runs yet). The steps
/// pick greedy tokens on the device where the head runs on one, as greedy requests' steps do.
fn measure_verify_cost(runner: &mut Runner, max_len: usize) -> Result<VerifyCost, SdkError> {
    const REPS: usize = 9;
    let slots = runner.options().kv_slots;
    // A 64-token context, or what fits in a small cache next to the draft.
    let context: u32 = 64u32.min(slots.saturating_sub(max_len as u32 + 1));
    if context == 0 {
        // No room to measure: assume verifying costs as much as decoding each token (never drafts).
        return Ok(VerifyCost {
            ratios: (0..=max_len).map(|k| (k + 1) as f64).collect(),
            decode_s: 0.0,
            profiles: Vec::new(),
        });
    }
    let bs = runner.options().block_size;
    let table: Vec<u32> = (0..(context + max_len as u32 + 1).div_ceil(bs)).collect();
    let tokens: Vec<TokenId> = (0..context + max_len as u32 + 1)
        .map(|i| (i * 7919) % 1000 + 10)
        .collect();
    let chunk = runner.options().max_batch_tokens;
    // An MTP head's steps pair each token with a hidden state (zeros here).
    let width = match runner.options().mtp {
        true => runner.model().family().hparams().n_embd as usize,
        false => 0,
    };
    if max_len + 1 > chunk {
        return Err(SdkError::Config(format!(
            "draft length {max_len} needs a step budget above {chunk} tokens"
        )));
    }
    for start in (0..context as usize).step_by(chunk) {
        let end = (start + chunk).min(context as usize);
        let fill = SeqInput {
            hidden: vec![0.0; (end - start) * width],
            tokens: tokens[start..end].to_vec(),
            start_pos: start as u32,
            prompt_len: context,
            block_table: table.clone(),
            logits: LogitRows::Last,
            pick: false,
            state: StateSlots::default(),
        };
        runner.step(std::slice::from_ref(&fill))?;
    }
    let input = |k: usize| SeqInput {
        hidden: vec![0.0; (k + 1) * width],
        tokens: tokens[context as usize..context as usize + k + 1].to_vec(),
        start_pos: context,
        prompt_len: context,
        block_table: table.clone(),
        logits: LogitRows::for_drafts(k),
        pick: true,
        state: StateSlots {
            keep: k as u32 + 1,
            ..StateSlots::default()
        },
    };
    // Warm-up: every width once (graphs built), then for at least WARM_UP in all, so that a
    // GPU that idled at a low clock while the model loaded is up to speed when timing starts.
    const WARM_UP: std::time::Duration = std::time::Duration::from_millis(250);
    let warm = std::time::Instant::now();
    loop {
        for k in 0..=max_len {
            runner.step(&[input(k)])?;
        }
        if warm.elapsed() >= WARM_UP {
            break;
        }
    }
    // Widths interleaved within each repetition, so that whatever slows the machine down for a
    // while (another process, clock changes) weighs on all widths of that repetition alike; the
    // cost of k is the median over repetitions of time(k) / time(0) of the same repetition.
    let mut ratios: Vec<Vec<f64>> = vec![Vec::with_capacity(REPS); max_len + 1];
    let mut decode: Vec<f64> = Vec::with_capacity(REPS);
    let mut profiles = vec![StepProfile::default(); max_len + 1];
    runner.take_profile();
    for _ in 0..REPS {
        let mut times = Vec::with_capacity(max_len + 1);
        for (k, profile) in profiles.iter_mut().enumerate() {
            let inp = input(k);
            let t = std::time::Instant::now();
            runner.step(std::slice::from_ref(&inp))?;
            times.push(t.elapsed().as_secs_f64());
            profile.add(&runner.take_profile());
        }
        for (k, t) in times.iter().enumerate() {
            ratios[k].push(t / times[0]);
        }
        decode.push(times[0]);
    }
    let ratios = ratios
        .into_iter()
        .map(|mut r| {
            r.sort_by(f64::total_cmp);
            r[r.len() / 2]
        })
        .collect();
    decode.sort_by(f64::total_cmp);
    Ok(VerifyCost {
        ratios,
        decode_s: decode[decode.len() / 2],
        profiles,
    })
}

// A verify step (a token and its drafts) must stay "small" on accelerators, where its rows get a
// decode row's arithmetic: longer ones are computed as prefill chunks.
const _: () = assert!(MAX_DRAFT < axle_models::device_step::SMALL_TOKENS);

/// Refuses a draft model whose vocabulary differs from the target's (a draft token must mean
/// the same text to both).
fn same_vocabulary(target: &Model, draft: &Model) -> Result<(), SdkError> {
    let (t, d) = (&target.tokenizer, &draft.tokenizer);
    if t.len() != d.len() {
        return Err(SdkError::Config(format!(
            "the draft model's vocabulary has {} tokens, the model's {}: a draft model needs the same vocabulary",
            d.len(),
            t.len()
        )));
    }
    if let Some(i) = (0..t.len() as TokenId).find(|&i| t.token_text(i) != d.token_text(i)) {
        return Err(SdkError::Config(format!(
            "the draft model's token {i} is {:?}, the model's {:?}: a draft model needs the same vocabulary",
            d.token_text(i).unwrap_or_default(),
            t.token_text(i).unwrap_or_default()
        )));
    }
    Ok(())
}

/// A stable identity of the model file for prefix-cache keys.
fn model_id(model: &Model) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    model.path().hash(&mut h);
    model.file_size().hash(&mut h);
    model.quantized_at_load().map(|q| q.name()).hash(&mut h);
    h.finish()
}

impl EngineCore {
    /// An engine over a loaded model.
    pub fn new(model: Arc<Model>, cfg: &EngineConfig) -> Result<EngineCore, SdkError> {
        let exact_choices = [
            ("device products", cfg.device_products.is_some()),
            ("host kernels", cfg.host_kernels.is_some()),
        ];
        if let Some((what, _)) = exact_choices.iter().find(|(_, set)| *set) {
            if cfg.kernels != Kernels::BatchInvariant {
                return Err(SdkError::Config(format!(
                    "{what} are a choice of the exact (batch-invariant) kernels; the fast kernels \
                     take ggml's own for each step's shape"
                )));
            }
        }
        let kv_slots = cfg.kv_slots.div_ceil(cfg.block_size) * cfg.block_size;
        // Recurrent models: one state group per sequence that can run, and as many kept states
        // as a verify step has tokens. A cached prefix would restore KV blocks but not the
        // recurrent state at that point, so prefix caching is off for them.
        let recurrent = !model.family().state_dims().is_empty();
        let draft_len = cfg.draft_len.min(MAX_DRAFT);
        // Recurrent state slots: the scheduler admits a sequence only with one free.
        let state_slots = cfg.state_slots.unwrap_or(cfg.max_seqs).max(1) as u32;
        let saved_states = if recurrent && cfg.prefix_caching {
            cfg.state_cache
        } else {
            0
        };
        // The model's own MTP head drafts where its file has one, speculation is on, the head is
        // among the drafters and no draft model is given.
        let use_mtp = cfg.draft_len > 0
            && cfg.drafters.mtp
            && !(cfg.draft_model.is_some() && cfg.drafters.model)
            && model.family().mtp().is_some();
        let mut runner = Runner::new(
            model.clone(),
            RunnerOptions {
                kv_slots,
                block_size: cfg.block_size,
                max_batch_tokens: cfg.max_batch_tokens,
                kernels: cfg.kernels,
                force_device_layout: false,
                device_products: cfg.device_products,
                device_attention: cfg.device_attention,
                max_seqs: cfg.max_seqs,
                graph_slots: None,
                state_groups: state_slots,
                state_snapshots: draft_len as u32 + 1,
                state_saved: saved_states,
                stacked_rows: true,
                host_kernels: cfg.host_kernels.unwrap_or_default(),
                values: RowValues::Logits,
                kv_type: cfg.kv_type,
                mtp: false,
                returns_hidden: use_mtp,
            },
        )?;
        let mut verify_profiles = Vec::new();
        let mut draft_model = match (&cfg.draft_model, cfg.draft_len > 0 && cfg.drafters.model) {
            (Some(m), true) => {
                same_vocabulary(&model, m)?;
                Some(DraftModel::new(
                    m.clone(),
                    kv_slots,
                    cfg.block_size,
                    cfg.max_batch_tokens,
                    cfg.max_seqs,
                )?)
            }
            _ if use_mtp => Some(DraftModel::mtp(
                model.clone(),
                kv_slots,
                cfg.block_size,
                cfg.max_batch_tokens,
                cfg.max_seqs,
            )?),
            _ => None,
        };
        let draft = if cfg.draft_len > 0 {
            let max_len = cfg.draft_len.min(MAX_DRAFT);
            let mut decode_s = None;
            let verify_cost = match &cfg.verify_cost {
                Some(c) => c.clone(),
                None => {
                    let m = measure_verify_cost(&mut runner, max_len)?;
                    verify_profiles = m.profiles;
                    decode_s = Some(m.decode_s);
                    m.ratios
                }
            };
            // The draft model's step against the target's decode step, timed alike.
            let model_cost = match (&mut draft_model, cfg.draft_cost) {
                (None, _) => None,
                (Some(_), Some(c)) => Some(c),
                (Some(d), None) => {
                    let target_s = match decode_s {
                        Some(t) => t,
                        None => measure_verify_cost(&mut runner, 0)?.decode_s,
                    };
                    let draft_s = measure_verify_cost(d.runner(), 0)?.decode_s;
                    d.runner().pause_threads();
                    Some(draft_s / target_s.max(1e-9))
                }
            };
            Some(DraftConfig {
                max_len,
                verify_cost,
                sources: DraftSources {
                    model: draft_model.as_ref().is_some_and(|d| !d.is_mtp()),
                    mtp: draft_model.as_ref().is_some_and(DraftModel::is_mtp),
                    ..cfg.drafters
                },
                model_cost,
                model_source: match use_mtp {
                    true => DraftSource::Mtp,
                    false => DraftSource::Model,
                },
                ..Default::default()
            })
        } else {
            None
        };
        let sched = Scheduler::new(SchedulerConfig {
            max_batch_tokens: cfg.max_batch_tokens,
            max_seqs: cfg.max_seqs,
            n_blocks: kv_slots / cfg.block_size,
            block_size: cfg.block_size,
            context: cfg.context,
            prefix_caching: cfg.prefix_caching && (!recurrent || saved_states > 0),
            reuse_marked_only: recurrent,
            model_id: model_id(&model),
            prompt_classes: runner.prompt_classes(),
            draft,
            state_slots: recurrent.then_some(state_slots),
            kv_lanes: runner.reads_consecutive_kv_in_place(),
        });
        Ok(EngineCore {
            model,
            runner,
            sched,
            text: HashMap::new(),
            states: recurrent.then(|| RecurrentStates::new(saved_states)),
            draft_model,
            verify_profiles,
        })
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The scheduler (read-only: queue depth, KV use).
    pub fn scheduler(&self) -> &Scheduler {
        &self.sched
    }

    /// Queues a request.
    pub fn add(
        &mut self,
        prompt: Vec<TokenId>,
        opts: RequestOptions,
    ) -> Result<RequestId, SdkError> {
        self.add_constrained(prompt, opts, None)
    }

    /// Queues a request whose output follows `constraint`.
    pub fn add_constrained(
        &mut self,
        prompt: Vec<TokenId>,
        opts: RequestOptions,
        constraint: Option<Box<dyn TokenConstraint>>,
    ) -> Result<RequestId, SdkError> {
        let mut stop_tokens = opts.stop_tokens.clone();
        if !opts.ignore_eos {
            stop_tokens.extend_from_slice(self.model.tokenizer.eog_tokens());
        }
        if opts.max_tokens == 0 {
            return Err(Rejection::invalid(Field::MaxTokens, "must be at least 1").into());
        }
        let id = self
            .sched
            .add_constrained(
                RequestSpec {
                    prompt,
                    sampling: opts.sampling,
                    max_tokens: opts.max_tokens,
                    stop_tokens,
                    speculation: opts.speculation,
                },
                constraint,
            )
            .map_err(|e| SdkError::Rejected(e.into()))?;
        self.text.insert(
            id,
            TextState {
                decoder: StreamDecoder::new(),
                stop: StopMatcher::new(opts.stop_strings),
                thinking: opts
                    .thinking
                    .map(|(markers, opened)| ReasoningSplitter::new(markers, opened)),
                calls: opts
                    .tool_format
                    .map(|(format, names)| ToolCallParser::new(format, names)),
                reasoning_tokens: 0,
                submitted: Instant::now(),
                first_token: None,
            },
        );
        Ok(id)
    }

    /// Cancels a request (frees its KV at once). Returns whether it was still running.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        self.text.remove(&id);
        if let Some(st) = &mut self.states {
            st.release(id);
        }
        let was = self.sched.finish(id, FinishReason::Cancelled);
        self.sched.forget(id);
        if let Some(d) = &mut self.draft_model {
            d.forget(id);
        }
        was
    }

    /// Whether any request is unfinished.
    pub fn has_work(&self) -> bool {
        self.sched.has_work()
    }

    fn finished(
        &mut self,
        id: RequestId,
        reason: FinishReason,
        mut text: String,
        mut reasoning: String,
    ) -> Output {
        if let Some(st) = &mut self.states {
            st.release(id);
        }
        let mut tool_calls = Vec::new();
        let mut reasoning_tokens = 0;
        let mut stop_string = None;
        let mut timing = None;
        if let Some(mut t) = self.text.remove(&id) {
            reasoning_tokens = t.reasoning_tokens;
            timing = t.first_token.map(|first| Timing {
                first_token: first - t.submitted,
                decode: first.elapsed(),
            });
            stop_string = t.stop.matched().map(str::to_string);
            if !matches!(reason, FinishReason::StopString) {
                let rest = t.decoder.finish();
                let mut tail = t.stop.push(&rest).0;
                tail.push_str(&t.stop.finish());
                let (r, a) = t.shown(tail);
                reasoning.push_str(&r);
                text.push_str(&a);
            }
            if let Some(s) = t.thinking.take() {
                let (r, a) = s.finish();
                reasoning.push_str(&r);
                text.push_str(&t.answer(a));
            }
            if let Some(p) = t.calls.take() {
                let (rest, calls) = p.finish();
                text.push_str(&rest);
                tool_calls = calls;
            }
        }
        let stats = self.sched.stats(id);
        self.sched.forget(id);
        let s = stats.unwrap_or_default();
        Output::Finished {
            id,
            text,
            reasoning,
            finish: Finish {
                reason,
                usage: Some(Usage {
                    prompt_tokens: s.prompt_tokens,
                    completion_tokens: s.generated_tokens,
                    cached_tokens: s.cached_tokens,
                    reasoning_tokens,
                }),
                speculation: Box::new(Speculation {
                    drafted: s.drafted,
                    accepted: s.accepted,
                    verifies: s.verifies,
                    positions: s.positions,
                    by_source: s.by_source,
                }),
                upstream_reason: None,
                tool_calls,
                stop_string,
                constraint: s.constraint,
                timing,
            },
        }
    }

    /// The scheduler's speculation settings (measured verify costs), if on.
    pub fn draft_config(&self) -> Option<&DraftConfig> {
        self.sched.config().draft.as_ref()
    }

    /// Puts the engine's CPU threads (and its draft model's) to sleep until its next step: for
    /// processes that run several engines in turn (benchmarks), whose idle pools would otherwise
    /// poll for work while another engine computes.
    pub fn pause_threads(&self) {
        self.runner.pause_threads();
        if let Some(d) = &self.draft_model {
            d.pause_threads();
        }
    }

    /// The first error the draft model met (it then stops drafting; outputs are unaffected).
    pub fn draft_model_error(&self) -> Option<&str> {
        self.draft_model.as_ref().and_then(DraftModel::error)
    }

    /// Forgets the outputs kept for suffix drafts across requests (for benchmarks that time each
    /// request on its own).
    pub fn clear_shared_drafts(&mut self) {
        self.sched.clear_shared_drafts();
    }

    /// Where the steps that measured the verify cost spent their time, for k = 0.. drafts
    /// (empty unless this engine measured it).
    pub fn verify_profiles(&self) -> &[StepProfile] {
        &self.verify_profiles
    }

    /// Finishes every request of a step with an error.
    fn fail_all(&mut self, plan: &StepPlan, msg: String) -> Vec<Output> {
        let ids: Vec<RequestId> = plan.seqs.iter().map(|s| s.id).collect();
        ids.into_iter()
            .map(|id| {
                self.sched.finish(id, FinishReason::Error(msg.clone()));
                self.finished(
                    id,
                    FinishReason::Error(msg.clone()),
                    String::new(),
                    String::new(),
                )
            })
            .collect()
    }

    /// How the runner's device layout multiplies small columns; `None` where steps do not take
    /// the device layout ([`axle_models::Runner::device_products`]).
    pub fn device_products(&self) -> Option<DeviceProducts> {
        self.runner.device_products()
    }

    /// The device products in words, and why the default ones gave way to others at load where
    /// they did ([`axle_models::Runner::products_note`]); `None` without the device layout.
    pub fn device_products_summary(&self) -> Option<String> {
        let products = self.device_products()?;
        Some(match self.runner.products_note() {
            Some(note) => format!("{products} ({note})"),
            None => products.to_string(),
        })
    }

    /// How decode and verify rows attend on the device: "paged", "rows", or "rows (why paged
    /// attention is off)"; `None` without the device layout.
    pub fn device_attention_summary(&self) -> Option<String> {
        self.device_products()?;
        Some(
            match (self.runner.paged_attention(), self.runner.paged_note()) {
                (true, _) => "paged".into(),
                (false, Some(why)) => format!("rows ({why})"),
                (false, None) => "rows".into(),
            },
        )
    }

    /// The verify-row shapes the runner probed for shared attention ops so far: (KV slots, rows,
    /// shared).
    pub fn stacked_shapes(&self) -> Vec<(i64, i64, bool)> {
        self.runner
            .stacked_shapes()
            .into_iter()
            .map(|(k, ok)| (k.kv_len, k.rows, ok))
            .collect()
    }

    /// Where the runner's steps spent their time since the last call (and starts a new count).
    pub fn take_profile(&mut self) -> axle_models::runner::StepProfile {
        self.runner.take_profile()
    }

    /// Steps until no work is left, collecting every request's tokens and how it ended;
    /// `after_step` sees the engine after each step (tests check its invariants there).
    pub fn drain(&mut self, mut after_step: impl FnMut(&EngineCore)) -> Drained {
        let mut d = Drained::default();
        while self.has_work() {
            for o in self.step() {
                match o {
                    Output::Token {
                        id, token, logprob, ..
                    } => {
                        d.tokens.entry(id).or_default().push(token);
                        if let Some(l) = logprob {
                            d.logprobs.entry(id).or_default().push(l.logprob);
                        }
                    }
                    Output::Finished { id, finish, .. } => {
                        d.finished.insert(id, finish);
                    }
                }
            }
            after_step(self);
        }
        d
    }

    /// Runs one step: plan, execute, apply. Requests hit by a runner failure finish with an error;
    /// the engine itself keeps going.
    pub fn step(&mut self) -> Vec<Output> {
        let plan = match &mut self.draft_model {
            Some(draft) => self.sched.schedule_with(Some(&mut Asking {
                target: &self.runner,
                draft,
            })),
            None => self.sched.schedule(),
        };
        if let Some(st) = &mut self.states {
            for &id in &plan.preempted {
                st.release(id);
            }
        }
        if plan.is_empty() {
            return Vec::new();
        }
        let mut inputs: Vec<SeqInput> = Vec::with_capacity(plan.seqs.len());
        for s in &plan.seqs {
            let state = match &mut self.states {
                None => StateSlots::default(),
                Some(st) => {
                    let sched = &self.sched;
                    let prefix = || sched.prefix_hash(s.id, s.start_pos as usize);
                    let restored = st
                        .rows(
                            s.id,
                            s.state_slot,
                            s.start_pos,
                            s.n_draft as u32 + 1,
                            prefix,
                        )
                        .and_then(|(slots, restore)| match restore {
                            Some(slot) => self
                                .runner
                                .restore_state(slot, slots.group)
                                .map(|()| slots)
                                .map_err(|e| e.to_string()),
                            None => Ok(slots),
                        });
                    match restored {
                        Ok(slots) => slots,
                        Err(msg) => return self.fail_all(&plan, msg),
                    }
                }
            };
            inputs.push(SeqInput {
                hidden: Vec::new(),
                tokens: s.tokens.clone(),
                start_pos: s.start_pos,
                prompt_len: s.prompt_len as u32,
                block_table: s.block_table.clone(),
                logits: if s.wants_logits {
                    LogitRows::for_drafts(s.n_draft)
                } else {
                    LogitRows::None
                },
                pick: s.pick,
                state,
            });
        }
        let out = match self.runner.step(&inputs) {
            Ok(o) => o,
            Err(e) => return self.fail_all(&plan, e.to_string()),
        };
        let events: Vec<Event> = self.sched.apply(&plan, |i, j| out.find_row(i, j));
        self.runner.recycle(out.logits);
        if let Some(d) = &mut self.draft_model {
            let sched = &self.sched;
            d.settle(&plan, &events, &out.hidden, &|id, n| {
                sched.prefix_hash(id, n)
            });
        }
        if let Some(st) = &mut self.states {
            // Where each sequence's next step starts: after a verify step of d drafts with a
            // accepted, the state d - a tokens back from the step's end.
            for s in &plan.seqs {
                let accepted = events
                    .iter()
                    .find(|e| e.id == s.id)
                    .map_or(0, |e| e.accepted);
                st.verified(s.id, s.n_draft, accepted);
            }
            // Prefix reuse: save the state at the end of each prefill chunk that ends at a block
            // boundary inside the prompt, and let the scheduler reuse prefixes up to there.
            for s in plan
                .seqs
                .iter()
                .filter(|s| s.n_draft == 0 && !s.wants_logits)
            {
                let end = s.start_pos as usize + s.tokens.len();
                let (Some(hash), Some(group)) = (self.sched.prefix_hash(s.id, end), st.group(s.id))
                else {
                    continue;
                };
                if let Save::Into { slot, evicted } = st.save(hash) {
                    if let Some(old) = evicted {
                        self.sched.set_reusable(old, false);
                    }
                    let worked = self.runner.save_state(group, slot).is_ok();
                    st.saved(hash, slot, worked);
                    if worked {
                        self.sched.set_reusable(hash, true);
                    }
                }
            }
        }
        let mut outputs = Vec::with_capacity(events.len());
        for ev in events {
            let mut stopped = false;
            for (i, &tok) in ev.tokens.iter().enumerate() {
                let Some(t) = self.text.get_mut(&ev.id) else {
                    break;
                };
                t.first_token.get_or_insert_with(Instant::now);
                let piece = t.decoder.push(&self.model.tokenizer, tok);
                let (text, hit) = t.stop.push(&piece);
                let was_thinking = t.thinking.as_ref().is_some_and(|s| s.thinking());
                let (reasoning, text) = t.shown(text);
                if was_thinking || t.thinking.as_ref().is_some_and(|s| s.thinking()) {
                    t.reasoning_tokens += 1;
                }
                if hit {
                    stopped = true;
                    self.sched.finish(ev.id, FinishReason::StopString);
                    if let Some(d) = &mut self.draft_model {
                        d.forget(ev.id);
                    }
                    let out = self.finished(ev.id, FinishReason::StopString, text, reasoning);
                    outputs.push(out);
                    break;
                }
                outputs.push(Output::Token {
                    id: ev.id,
                    token: tok,
                    text,
                    reasoning,
                    logprob: ev.logprobs.get(i).cloned(),
                });
            }
            if !stopped {
                if let Some(reason) = ev.finished {
                    outputs.push(self.finished(ev.id, reason, String::new(), String::new()));
                }
            }
        }
        outputs
    }
}
