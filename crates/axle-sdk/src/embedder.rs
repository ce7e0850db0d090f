//! Embeddings: a runner whose rows are the final-normed hidden states ([`RowValues::Hidden`]),
//! inputs packed into its steps, and the rows pooled on the host ([`Pooled`]).
//!
//! [`Embedder`] runs a set of inputs to the end: each one gets KV blocks for its whole length
//! when it is admitted (in input order, as many at once as the blocks and `max_seqs` allow),
//! steps take up to `max_batch_tokens` tokens from the admitted inputs in order, and an input's
//! blocks go back when its last chunk has run. With batch-invariant kernels a row's numbers do
//! not depend on what shares its step or where its chunks were cut, so an input's embedding is
//! the same alone or in a batch, bit for bit. [`Embeddings`] is the service the server holds:
//! a thread of its own that runs together every request waiting when it starts a batch.
use crate::request::{check_vocab, Field, Rejection};
use crate::SdkError;
use axle_models::pooling;
use axle_models::{
    HostKernels, Kernels, LogitRows, Model, Pooled, Pooling, RowValues, Runner, RunnerOptions,
    SeqInput, StateSlots, TokenId,
};
use smart_default::SmartDefault;
use std::collections::VecDeque;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use tokio::sync::oneshot;

/// An embedder's limits.
#[derive(Debug, Clone, SmartDefault)]
pub struct EmbedderConfig {
    /// How rows are pooled (`None`: as the model file says; a model that says nothing needs one).
    pub pooling: Option<Pooling>,
    /// KV slots shared by the inputs being run (also the longest input).
    #[default(8192)]
    pub kv_slots: u32,
    /// Slots per KV block.
    #[default(16)]
    pub block_size: u32,
    /// Most tokens per step.
    #[default(512)]
    pub max_batch_tokens: usize,
    /// Most inputs per step.
    #[default(16)]
    pub max_seqs: usize,
    /// Kernel choice (batch-invariant by default: embeddings independent of the batch).
    pub kernels: Kernels,
    /// With batch-invariant kernels on the CPU: which of ggml's kernels rows share.
    pub host_kernels: Option<HostKernels>,
}

impl EmbedderConfig {
    /// An embedder beside an engine of `engine`'s configuration: KV for one context of its own,
    /// the engine's step limits and kernels; `pooling` as asked (None: as the model file says).
    pub fn beside(engine: &crate::EngineConfig, pooling: Option<Pooling>) -> EmbedderConfig {
        EmbedderConfig {
            pooling,
            kv_slots: engine.context as u32,
            block_size: engine.block_size,
            max_batch_tokens: engine.max_batch_tokens,
            max_seqs: engine.max_seqs,
            kernels: engine.kernels,
            host_kernels: engine.host_kernels,
        }
    }
}

/// A model computing embeddings.
#[derive(Debug)]
pub struct Embedder {
    runner: Runner,
    pooling: Pooling,
    block_size: u32,
    n_blocks: u32,
    max_batch_tokens: usize,
    max_seqs: usize,
    width: usize,
    n_vocab: usize,
}

/// An input being run.
struct Running {
    /// Its index among the inputs.
    index: usize,
    /// Tokens already run.
    done: usize,
    blocks: Vec<u32>,
    pooled: Pooled,
}

impl Embedder {
    /// An embedder over `model`.
    pub fn new(model: Arc<Model>, cfg: &EmbedderConfig) -> Result<Embedder, SdkError> {
        let pooling = cfg.pooling.or(model.pooling()).ok_or_else(|| {
            SdkError::Config(
                "the model file names no pooling type: choose one (mean, cls or last)".into(),
            )
        })?;
        if !model.family().state_dims().is_empty() {
            return Err(SdkError::Config(format!(
                "embeddings of models with recurrent layers ({}) are not supported",
                model.arch()
            )));
        }
        if cfg.host_kernels.is_some() && cfg.kernels != Kernels::BatchInvariant {
            return Err(SdkError::Config(
                "host kernels are a choice of the exact (batch-invariant) kernels".into(),
            ));
        }
        if cfg.block_size == 0 || cfg.max_batch_tokens == 0 || cfg.max_seqs == 0 {
            return Err(SdkError::Config(
                "block size, step tokens and sequences must be positive".into(),
            ));
        }
        let n_blocks = cfg.kv_slots / cfg.block_size;
        let hp = model.family().hparams();
        let (width, n_vocab) = (hp.n_embd as usize, hp.n_vocab as usize);
        let runner = Runner::new(
            model,
            RunnerOptions {
                kv_slots: n_blocks * cfg.block_size,
                block_size: cfg.block_size,
                max_batch_tokens: cfg.max_batch_tokens,
                kernels: cfg.kernels,
                max_seqs: cfg.max_seqs,
                host_kernels: cfg.host_kernels.unwrap_or_default(),
                values: RowValues::Hidden,
                ..Default::default()
            },
        )?;
        Ok(Embedder {
            runner,
            pooling,
            block_size: cfg.block_size,
            n_blocks,
            max_batch_tokens: cfg.max_batch_tokens,
            max_seqs: cfg.max_seqs,
            width,
            n_vocab,
        })
    }

    /// The pooling it applies.
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// The embeddings' length (the model's hidden width).
    pub fn width(&self) -> usize {
        self.width
    }

    /// The longest input it takes, in tokens.
    pub fn max_tokens(&self) -> usize {
        (self.n_blocks * self.block_size) as usize
    }

    /// Refuses inputs it cannot run (empty, too long, ids outside the vocabulary), naming the
    /// first.
    pub fn check(&self, inputs: &[Vec<TokenId>]) -> Result<(), Rejection> {
        for (i, t) in inputs.iter().enumerate() {
            if t.is_empty() {
                return Err(Rejection::invalid(
                    Field::Prompt,
                    format!("input {i} has no tokens"),
                ));
            }
            if t.len() > self.max_tokens() {
                return Err(Rejection::ContextOverflow {
                    prompt_tokens: t.len(),
                    context: self.max_tokens(),
                });
            }
            check_vocab(t, self.n_vocab, Field::Prompt)?;
        }
        Ok(())
    }

    /// Each input's embedding, in input order (L2-normalized when `normalize`).
    pub fn embed(
        &mut self,
        inputs: &[Vec<TokenId>],
        normalize: bool,
    ) -> Result<Vec<Vec<f32>>, SdkError> {
        self.check(inputs)?;
        let mut vectors = self.run(inputs)?;
        if normalize {
            vectors.iter_mut().for_each(|v| pooling::normalize(v));
        }
        Ok(vectors)
    }

    /// Each input's pooled embedding, unnormalized; the inputs passed [`Embedder::check`].
    fn run(&mut self, inputs: &[Vec<TokenId>]) -> Result<Vec<Vec<f32>>, SdkError> {
        let bs = self.block_size as usize;
        let mut free: VecDeque<u32> = (0..self.n_blocks).collect();
        let mut waiting: VecDeque<usize> = (0..inputs.len()).collect();
        let mut running: Vec<Running> = Vec::new();
        let mut out: Vec<Option<Vec<f32>>> = vec![None; inputs.len()];
        while !(waiting.is_empty() && running.is_empty()) {
            // Admit in input order while blocks and sequences last.
            while let Some(&index) = waiting.front() {
                let need = inputs[index].len().div_ceil(bs);
                if running.len() == self.max_seqs || need > free.len() {
                    break;
                }
                waiting.pop_front();
                running.push(Running {
                    index,
                    done: 0,
                    blocks: free.drain(..need).collect(),
                    pooled: Pooled::new(self.pooling, self.width),
                });
            }
            // One step: chunks of the running inputs, in order, up to the token budget.
            let mut room = self.max_batch_tokens;
            let mut seqs: Vec<SeqInput> = Vec::new();
            for r in running.iter() {
                if room == 0 {
                    break;
                }
                let tokens = &inputs[r.index];
                let take = (tokens.len() - r.done).min(room);
                room -= take;
                let end = r.done + take;
                let rows = match self.pooling {
                    Pooling::Mean => LogitRows::All,
                    Pooling::Cls if r.done == 0 => LogitRows::All,
                    Pooling::Last if end == tokens.len() => LogitRows::Last,
                    _ => LogitRows::None,
                };
                seqs.push(SeqInput {
                    hidden: Vec::new(),
                    tokens: tokens[r.done..end].to_vec(),
                    start_pos: r.done as u32,
                    prompt_len: tokens.len() as u32,
                    block_table: r.blocks.clone(),
                    logits: rows,
                    pick: false,
                    state: StateSlots::default(),
                });
            }
            let step = self.runner.step(&seqs)?;
            for (row, &(seq, token)) in step.rows.iter().enumerate() {
                let r = &mut running[seq];
                let n = inputs[r.index].len();
                if self.pooling.reads(r.done + token, n) {
                    r.pooled.add(step.row(row));
                }
            }
            for (r, s) in running.iter_mut().zip(&seqs) {
                r.done += s.tokens.len();
            }
            let (finished, left): (Vec<Running>, Vec<Running>) = running
                .into_iter()
                .partition(|r| r.done == inputs[r.index].len());
            running = left;
            for r in finished {
                free.extend(&r.blocks);
                out[r.index] = Some(r.pooled.finish());
            }
            // Lowest blocks first: an input's blocks then tend to lie in ascending order.
            free.make_contiguous().sort_unstable();
        }
        Ok(out.into_iter().map(Option::unwrap_or_default).collect())
    }
}

/// A batch of inputs sent to the embedding thread, with where the answer goes.
struct Job {
    inputs: Vec<Vec<TokenId>>,
    normalize: bool,
    reply: oneshot::Sender<Result<Vec<Vec<f32>>, SdkError>>,
}

/// An embedder on a thread of its own: requests waiting when it starts a batch run together.
pub struct Embeddings {
    tx: Sender<Job>,
    pooling: Pooling,
    width: usize,
    max_tokens: usize,
    model: Arc<Model>,
}

impl std::fmt::Debug for Embeddings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embeddings")
            .field("pooling", &self.pooling)
            .field("width", &self.width)
            .finish()
    }
}

impl Embeddings {
    /// Starts the embedding thread over `model`.
    pub fn start(model: Arc<Model>, cfg: &EmbedderConfig) -> Result<Embeddings, SdkError> {
        let embedder = Embedder::new(model.clone(), cfg)?;
        let (pooling, width, max_tokens) =
            (embedder.pooling(), embedder.width(), embedder.max_tokens());
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("axle-embeddings".into())
            .spawn(move || serve(embedder, rx))
            .map_err(|e| SdkError::Config(format!("cannot start the embedding thread: {e}")))?;
        Ok(Embeddings {
            tx,
            pooling,
            width,
            max_tokens,
            model,
        })
    }

    /// The pooling applied.
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// The embeddings' length.
    pub fn width(&self) -> usize {
        self.width
    }

    /// The longest input taken, in tokens.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Each input's embedding, in order; batched with whatever else is waiting.
    pub async fn embed(
        &self,
        inputs: Vec<Vec<TokenId>>,
        normalize: bool,
    ) -> Result<Vec<Vec<f32>>, SdkError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Job {
                inputs,
                normalize,
                reply,
            })
            .map_err(|_| SdkError::EngineStopped)?;
        answer.await.map_err(|_| SdkError::EngineStopped)?
    }
}

/// The embedding thread: takes every job waiting, checks each on its own (a bad one is refused
/// alone), runs the rest in one batch, and answers each with its share.
fn serve(mut embedder: Embedder, rx: Receiver<Job>) {
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        jobs.extend(rx.try_iter());
        // Each accepted job's inputs move into one batch; the job keeps their count.
        let mut accepted = Vec::new();
        let mut all: Vec<Vec<TokenId>> = Vec::new();
        for mut job in jobs {
            match embedder.check(&job.inputs) {
                Ok(()) => {
                    let n = job.inputs.len();
                    all.append(&mut job.inputs);
                    accepted.push((job, n));
                }
                Err(r) => {
                    let _ = job.reply.send(Err(r.into()));
                }
            }
        }
        // Normalizing is per job; the pooled vectors are computed unnormalized once.
        match embedder.run(&all) {
            Ok(vectors) => {
                let mut vectors = vectors.into_iter();
                for (job, n) in accepted {
                    let mut mine: Vec<Vec<f32>> = vectors.by_ref().take(n).collect();
                    if job.normalize {
                        mine.iter_mut().for_each(|v| pooling::normalize(v));
                    }
                    let _ = job.reply.send(Ok(mine));
                }
            }
            Err(e) => {
                let msg = e.to_string();
                for (job, _) in accepted {
                    let _ = job.reply.send(Err(SdkError::Generation(msg.clone())));
                }
            }
        }
    }
}
