//! The Session: a loaded model plus its engine thread. Requests go in through a channel; each
//! request gets its own event stream back. Dropping a stream before it finishes cancels the request
//! and frees its KV blocks.
use crate::engine::{EngineConfig, EngineCore, Output, RequestOptions};
use crate::SdkError;
use axle_core::{FinishReason, RequestId, TokenLogprob};
use axle_models::{ChatMessage, Model, TokenId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// What to generate from.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// Plain text (BOS added as the model asks).
    Text(String),
    /// Chat messages, rendered with the model's template.
    Chat(Vec<ChatMessage>),
    /// Token ids, used as they are.
    Tokens(Vec<TokenId>),
}

/// A generation request.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// The prompt.
    pub prompt: Prompt,
    /// Options.
    pub options: RequestOptions,
}

/// One event of a request's stream.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// A generated token and the text it completed (possibly empty while a character or a
    /// possible stop string is incomplete).
    Token {
        /// The token id.
        token: TokenId,
        /// Text to append.
        text: String,
        /// Its log-probabilities, when asked for.
        logprob: Option<TokenLogprob>,
    },
    /// The request ended; `text` is the last text to append.
    Done {
        /// Final text.
        text: String,
        /// Why it ended.
        reason: FinishReason,
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Generated tokens.
        completion_tokens: usize,
        /// Prompt tokens served from the prefix cache.
        cached_tokens: usize,
        /// Draft tokens proposed.
        drafted: usize,
        /// Draft tokens accepted.
        accepted: usize,
    },
}

/// A finished generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// Generated text.
    pub text: String,
    /// Generated token ids.
    pub tokens: Vec<TokenId>,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
    /// Draft tokens proposed.
    pub drafted: usize,
    /// Draft tokens accepted.
    pub accepted: usize,
}

enum Command {
    Submit {
        ticket: u64,
        prompt: Vec<TokenId>,
        options: Box<RequestOptions>,
        events: Sender<StreamEvent>,
        ack: Sender<Result<(), SdkError>>,
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
}

/// The events of one request. Iterating yields events until `Done`; dropping it early cancels.
pub struct TokenStream {
    rx: Receiver<StreamEvent>,
    tx: Sender<Command>,
    ticket: u64,
    done: bool,
}

impl Iterator for TokenStream {
    type Item = StreamEvent;
    fn next(&mut self) -> Option<StreamEvent> {
        if self.done {
            return None;
        }
        match self.rx.recv() {
            Ok(ev) => {
                if matches!(ev, StreamEvent::Done { .. }) {
                    self.done = true;
                }
                Some(ev)
            }
            Err(_) => {
                self.done = true;
                None
            }
        }
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
        let (tx, rx) = mpsc::channel::<Command>();
        let stats = Arc::new(std::sync::Mutex::new(EngineStats::default()));
        let stats_thread = stats.clone();
        let thread = std::thread::Builder::new()
            .name("axle-engine".into())
            .spawn(move || engine_loop(&mut engine, rx, &stats_thread))
            .map_err(|e| SdkError::Rejected(format!("cannot start the engine thread: {e}")))?;
        Ok(Session {
            model,
            tx,
            next_ticket: AtomicU64::new(1),
            thread: Some(thread),
            stats,
        })
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Current engine statistics.
    pub fn stats(&self) -> EngineStats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Tokenizes a prompt.
    pub fn prompt_tokens(&self, prompt: &Prompt) -> Result<Vec<TokenId>, SdkError> {
        Ok(match prompt {
            Prompt::Text(t) => self.model.tokenizer.encode(t, true, false),
            Prompt::Chat(m) => self.model.encode_chat(m)?,
            Prompt::Tokens(t) => t.clone(),
        })
    }

    /// Starts a request and returns its event stream.
    pub fn stream(&self, req: GenerateRequest) -> Result<TokenStream, SdkError> {
        let prompt = self.prompt_tokens(&req.prompt)?;
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let (events, rx) = mpsc::channel();
        let (ack, ack_rx) = mpsc::channel();
        self.tx
            .send(Command::Submit {
                ticket,
                prompt,
                options: Box::new(req.options),
                events,
                ack,
            })
            .map_err(|_| SdkError::EngineStopped)?;
        ack_rx.recv().map_err(|_| SdkError::EngineStopped)??;
        Ok(TokenStream {
            rx,
            tx: self.tx.clone(),
            ticket,
            done: false,
        })
    }

    /// Runs a request to completion.
    pub fn generate(&self, req: GenerateRequest) -> Result<Completion, SdkError> {
        let mut text = String::new();
        let mut tokens = Vec::new();
        for ev in self.stream(req)? {
            match ev {
                StreamEvent::Token { token, text: t, .. } => {
                    tokens.push(token);
                    text.push_str(&t);
                }
                StreamEvent::Done {
                    text: t,
                    reason,
                    prompt_tokens,
                    completion_tokens,
                    cached_tokens,
                    drafted,
                    accepted,
                } => {
                    text.push_str(&t);
                    if let FinishReason::Error(e) = &reason {
                        return Err(SdkError::Rejected(e.clone()));
                    }
                    return Ok(Completion {
                        text,
                        tokens,
                        finish_reason: reason,
                        prompt_tokens,
                        completion_tokens,
                        cached_tokens,
                        drafted,
                        accepted,
                    });
                }
            }
        }
        Err(SdkError::EngineStopped)
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
    let mut streams: HashMap<RequestId, (u64, Sender<StreamEvent>)> = HashMap::new();
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
                    events,
                    ack,
                } => match engine.add(prompt, *options) {
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
                        logprob,
                    } => (
                        id,
                        StreamEvent::Token {
                            token,
                            text,
                            logprob,
                        },
                    ),
                    Output::Finished {
                        id,
                        text,
                        reason,
                        prompt_tokens,
                        completion_tokens,
                        cached_tokens,
                        drafted,
                        accepted,
                        ..
                    } => (
                        id,
                        StreamEvent::Done {
                            text,
                            reason,
                            prompt_tokens,
                            completion_tokens,
                            cached_tokens,
                            drafted,
                            accepted,
                        },
                    ),
                };
                let done = matches!(ev, StreamEvent::Done { .. });
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
