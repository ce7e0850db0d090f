//! The Session: a loaded model plus its engine thread. Requests go in through a channel; each
//! choice of a request gets its own event stream back, read with `next().await` (async) or as an
//! iterator (blocking). Dropping a stream before it finishes cancels that choice and frees its
//! KV blocks.
use crate::engine::{EngineConfig, EngineCore, Output, RequestOptions};
use crate::events::{Completion, StreamEvent};
use crate::request::{check_vocab, Field, GenerateRequest, Prompt, Rejection};
use crate::structured::{self, GrammarSlot};
use crate::SdkError;
use axle_core::{FinishReason, RequestId, TokenConstraint};
use axle_models::{Model, TokenId};
use axle_structured::reasoning::ThinkingMarkers;
use axle_structured::AnswerStart;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use tokio::sync::{mpsc as events, oneshot};

/// The engine's answer to a submission: queued, or refused.
type Ack = oneshot::Receiver<Result<(), SdkError>>;

enum Command {
    Submit {
        ticket: u64,
        prompt: Vec<TokenId>,
        options: Box<RequestOptions>,
        constraint: Option<Box<dyn TokenConstraint>>,
        events: events::UnboundedSender<StreamEvent>,
        ack: oneshot::Sender<Result<(), SdkError>>,
    },
    Cancel(u64),
    Shutdown,
}

/// Engine statistics for metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Requests waiting.
    pub waiting: usize,
    /// Requests running.
    pub running: usize,
    /// KV blocks in use.
    pub kv_blocks_used: usize,
}

/// A model with its engine thread.
pub struct Session {
    model: Arc<Model>,
    tx: Sender<Command>,
    next_ticket: AtomicU64,
    thread: Option<JoinHandle<()>>,
    stats: Arc<std::sync::Mutex<EngineStats>>,
    grammar: GrammarSlot,
    /// Compute constraint masks on worker threads, overlapping the forward pass (when a core is
    /// left over by the model's threads, or the model runs on a GPU).
    overlap: bool,
    /// How the engine multiplies decode rows on its devices (see
    /// [`Session::device_products_summary`]).
    device_products: Option<String>,
}

/// The events of one choice of a native request, ending with `Done` or `Error`; dropping it
/// early cancels the choice. Read it with [`TokenStream::recv`] in async code, or iterate it
/// (blocking; not from inside an async runtime).
#[derive(Debug)]
pub struct TokenStream {
    rx: events::UnboundedReceiver<StreamEvent>,
    tx: Sender<Command>,
    ticket: u64,
    done: bool,
}

impl TokenStream {
    /// The next event (None after the last); iterating is the blocking form.
    pub async fn recv(&mut self) -> Option<StreamEvent> {
        if self.done {
            return None;
        }
        let ev = self.rx.recv().await;
        self.seen(ev)
    }

    fn seen(&mut self, ev: Option<StreamEvent>) -> Option<StreamEvent> {
        let end = !matches!(ev, Some(StreamEvent::Token { .. }));
        if end {
            self.done = true;
        }
        ev
    }
}

impl Iterator for TokenStream {
    type Item = StreamEvent;
    /// Blocks for the next event.
    fn next(&mut self) -> Option<StreamEvent> {
        if self.done {
            return None;
        }
        let ev = self.rx.blocking_recv();
        self.seen(ev)
    }
}

impl Drop for TokenStream {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.tx.send(Command::Cancel(self.ticket));
        }
    }
}

impl Session {
    /// Starts the engine thread for a loaded model.
    pub fn new(model: Arc<Model>, cfg: EngineConfig) -> Result<Session, SdkError> {
        let mut engine = EngineCore::new(model.clone(), &cfg)?;
        let device_products = engine.device_products_summary();
        let (tx, rx) = mpsc::channel::<Command>();
        let stats = Arc::new(std::sync::Mutex::new(EngineStats::default()));
        let stats_thread = stats.clone();
        let thread = std::thread::Builder::new()
            .name("axle-engine".into())
            .spawn(move || engine_loop(&mut engine, rx, &stats_thread))
            .map_err(|e| SdkError::Config(format!("cannot start the engine thread: {e}")))?;
        Ok(Session {
            model: model.clone(),
            tx,
            next_ticket: AtomicU64::new(1),
            thread: Some(thread),
            stats,
            grammar: GrammarSlot::default(),
            overlap: structured::overlap_masks(&model),
            device_products,
        })
    }

    /// How the engine multiplies decode rows on its devices, and why where the default gave way
    /// at load ([`EngineCore::device_products_summary`]); `None` without the device layout.
    pub fn device_products_summary(&self) -> Option<&str> {
        self.device_products.as_deref()
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Current engine statistics.
    pub fn stats(&self) -> EngineStats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The prompt's tokens, with the checks that need the model (the template renders, the ids
    /// are in the vocabulary). Tools reach the prompt through the template, or through a system
    /// prompt when the template has none.
    pub fn prompt_tokens(&self, req: &GenerateRequest) -> Result<Vec<TokenId>, SdkError> {
        let plan = structured::plan(req, self.model.chat_template_source())?;
        self.planned_tokens(req, &plan)
    }

    fn planned_tokens(
        &self,
        req: &GenerateRequest,
        plan: &structured::Plan,
    ) -> Result<Vec<TokenId>, SdkError> {
        // Calls the model may make but need not (`tool_choice: auto`) are parsed from its text,
        // not forced by a grammar: their schemas get the size and depth limits and the
        // meta-schema, not a compile (which would refuse valid schemas that llguidance does not
        // take, and that parse fine as text).
        for schema in &plan.tool_check {
            axle_structured::check_tool_schema(schema)
                .map_err(|e| Rejection::invalid(Field::Tools, e.to_string()))?;
        }
        let tok = &self.model.tokenizer;
        let vocab = tok.len();
        let ids = match (&req.prompt, &plan.messages) {
            (Prompt::Text(t), _) => tok.encode(t, true, false),
            (Prompt::Chat(m), planned) => self
                .model
                .encode_chat(
                    planned.as_deref().unwrap_or(m),
                    plan.template_tools.as_ref(),
                    &req.template_args,
                )
                .map_err(|e| {
                    let field = if req.tools.is_some() {
                        Field::Tools
                    } else {
                        Field::Prompt
                    };
                    Rejection::invalid(field, e.to_string())
                })?,
            (Prompt::Tokens(t), _) => {
                check_vocab(t, vocab, Field::Prompt)?;
                t.clone()
            }
        };
        check_vocab(&req.stop_tokens, vocab, Field::StopTokens)?;
        let biased: Vec<TokenId> = req.logit_bias.iter().map(|b| b.0).collect();
        let bias_field = Field::Sampling(axle_core::SamplingField::LogitBias);
        check_vocab(&biased, vocab, bias_field)?;
        Ok(ids)
    }

    /// Checks a request and queues its choices; the acknowledgements come back through
    /// `acks`. A constrained request compiles its grammar here, on the caller's thread.
    fn submit(&self, req: &GenerateRequest) -> Result<(Vec<TokenStream>, Vec<Ack>), SdkError> {
        req.validate()?;
        let plan = structured::plan(req, self.model.chat_template_source())?;
        let prompt = self.planned_tokens(req, &plan)?;
        // Chat answers of a template that marks thinking: the thinking is split from the answer,
        // starting inside it when the rendered prompt opened it; a constraint (JSON, a forced
        // call) covers the answer after the thinking.
        let thinking = match &req.prompt {
            Prompt::Chat(_) => {
                ThinkingMarkers::of_template(self.model.chat_template_source()).map(|m| {
                    let tail = &prompt[prompt.len().saturating_sub(8)..];
                    let opened = m.opened_by(&self.model.tokenizer.decode(tail, false));
                    (m, opened)
                })
            }
            _ => None,
        };
        let grammar = match &plan.constraint {
            Some((c, field)) => {
                let engine = self.grammar.get(&self.model)?;
                let start = match &thinking {
                    Some((markers, opened)) => AnswerStart::AfterThinking {
                        markers: markers.clone(),
                        opened: *opened,
                    },
                    None => AnswerStart::First,
                };
                let digits = axle_structured::digit_limit(c, plan.json_grammar);
                let compiled = engine.compile_answer(c, digits, &start);
                Some(compiled.map_err(|e| Rejection::invalid(*field, e.to_string()))?)
            }
            None => None,
        };
        let mut streams = Vec::with_capacity(req.n);
        let mut acks = Vec::with_capacity(req.n);
        let seed = req.base_seed();
        for choice in 0..req.n {
            let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
            let (events, rx) = events::unbounded_channel();
            let (ack, ack_rx) = oneshot::channel();
            let mut options = req.options(choice, seed);
            options.tool_format = plan.tool_format.clone();
            options.thinking = thinking.clone();
            // Forced tokens have no log-probabilities: a request that wants them samples all.
            let mut constraint = match &grammar {
                Some(g) => Some(
                    g.constraint(req.fast_forward && req.logprobs.is_none(), self.overlap)
                        .map_err(|e| SdkError::Config(e.to_string()))?,
                ),
                None => None,
            };
            if let (Some(budget), Some((markers, opened))) = (req.reasoning_budget, &thinking) {
                let engine = self.grammar.get(&self.model)?;
                constraint = Some(engine.bound_thinking(constraint, markers, *opened, budget));
            }
            self.tx
                .send(Command::Submit {
                    ticket,
                    prompt: prompt.clone(),
                    options: Box::new(options),
                    constraint,
                    events,
                    ack,
                })
                .map_err(|_| SdkError::EngineStopped)?;
            streams.push(TokenStream {
                rx,
                tx: self.tx.clone(),
                ticket,
                done: false,
            });
            acks.push(ack_rx);
        }
        Ok((streams, acks))
    }

    /// Starts a request: one event stream per choice (`n`), in order.
    pub async fn start(&self, req: &GenerateRequest) -> Result<Vec<TokenStream>, SdkError> {
        let (streams, acks) = self.submit(req)?;
        for ack in acks {
            ack.await.map_err(|_| SdkError::EngineStopped)??;
        }
        Ok(streams)
    }

    /// [`Session::start`] for code outside an async runtime (blocks until the engine has
    /// queued the choices).
    pub fn start_blocking(&self, req: &GenerateRequest) -> Result<Vec<TokenStream>, SdkError> {
        let (streams, acks) = self.submit(req)?;
        for ack in acks {
            ack.blocking_recv().map_err(|_| SdkError::EngineStopped)??;
        }
        Ok(streams)
    }

    /// Runs a one-choice request to completion (blocking; not from inside an async runtime).
    pub fn generate(&self, req: &GenerateRequest) -> Result<Completion, SdkError> {
        if req.n != 1 {
            return Err(Rejection::unsupported(Field::N, "generate() runs one choice").into());
        }
        let mut c = Completion::empty();
        for stream in self.start_blocking(req)? {
            for ev in stream {
                if c.absorb(ev)? {
                    return Ok(c);
                }
            }
        }
        Err(SdkError::EngineStopped)
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("model", &self.model.path())
            .field("stats", &self.stats())
            .finish()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.tx.send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn engine_loop(
    engine: &mut EngineCore,
    rx: Receiver<Command>,
    stats: &std::sync::Mutex<EngineStats>,
) {
    let mut by_ticket: HashMap<u64, RequestId> = HashMap::new();
    let mut streams: HashMap<RequestId, (u64, events::UnboundedSender<StreamEvent>)> =
        HashMap::new();
    loop {
        // Block for commands only when idle; otherwise take what is queued and keep stepping.
        let mut cmds = Vec::new();
        if !engine.has_work() {
            match rx.recv() {
                Ok(c) => cmds.push(c),
                Err(_) => return,
            }
        }
        while let Ok(c) = rx.try_recv() {
            cmds.push(c);
        }
        for c in cmds {
            match c {
                Command::Submit {
                    ticket,
                    prompt,
                    options,
                    constraint,
                    events,
                    ack,
                } => match engine.add_constrained(prompt, *options, constraint) {
                    Ok(id) => {
                        by_ticket.insert(ticket, id);
                        streams.insert(id, (ticket, events));
                        let _ = ack.send(Ok(()));
                    }
                    Err(e) => {
                        let _ = ack.send(Err(e));
                    }
                },
                Command::Cancel(ticket) => {
                    if let Some(id) = by_ticket.remove(&ticket) {
                        engine.cancel(id);
                        streams.remove(&id);
                    }
                }
                Command::Shutdown => {
                    for (&id, _) in streams.iter() {
                        engine.cancel(id);
                    }
                    return;
                }
            }
        }
        if engine.has_work() {
            for out in engine.step() {
                let (id, ev) = match out {
                    Output::Token {
                        id,
                        token,
                        text,
                        reasoning,
                        logprob,
                    } => (
                        id,
                        StreamEvent::Token {
                            token: Some(token),
                            text,
                            reasoning,
                            logprob,
                        },
                    ),
                    Output::Finished {
                        id,
                        text,
                        reasoning,
                        finish,
                    } => match finish.reason {
                        FinishReason::Error(e) => (id, StreamEvent::Error(SdkError::Generation(e))),
                        _ => (
                            id,
                            StreamEvent::Done {
                                text,
                                reasoning,
                                finish,
                            },
                        ),
                    },
                };
                let done = !matches!(ev, StreamEvent::Token { .. });
                let delivered = streams
                    .get(&id)
                    .map(|(_, s)| s.send(ev).is_ok())
                    .unwrap_or(false);
                if done || !delivered {
                    if let Some((ticket, _)) = streams.remove(&id) {
                        by_ticket.remove(&ticket);
                    }
                    if !done {
                        engine.cancel(id); // the client went away
                    }
                }
            }
        }
        if let Ok(mut s) = stats.lock() {
            let sched = engine.scheduler();
            *s = EngineStats {
                waiting: sched.n_waiting(),
                running: sched.n_running(),
                kv_blocks_used: sched.pool().in_use(),
            };
        }
    }
}
