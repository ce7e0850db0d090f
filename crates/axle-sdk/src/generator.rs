//! One way to generate, whoever runs the model: [`Generator`] takes a [`GenerateRequest`] and
//! gives back one async [`EventStream`] per choice, the same events for the native engine and
//! for a delegated upstream. The server, the CLI and SDK users go through it; route-specific
//! refusals happen inside (see [`Upstream::check`]).
use crate::delegate::{DelegatedStream, Upstream};
use crate::events::{Completion, StreamEvent};
use crate::request::{check_vocab, Field, GenerateRequest, Rejection};
use crate::session::{EngineStats, Session, TokenStream};
use crate::SdkError;
use axle_models::{TokenId, Tokenizer};
use std::sync::Arc;

/// Who generates.
#[derive(Debug, Clone)]
pub enum Generator {
    /// Axle's engine over a loaded model.
    Native(Arc<Session>),
    /// An upstream OpenAI-compatible server.
    Delegated(Arc<Upstream>),
}

/// How the caller will read a request's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// As they come.
    Streamed,
    /// All at once, at the end. A delegated route then makes one blocking upstream call, whose
    /// answer carries token counts that some upstreams leave out of their streams.
    Whole,
}

/// The events of one choice, from either route. Dropping it cancels the choice (frees its KV,
/// or closes the upstream connection).
#[derive(Debug)]
pub enum EventStream {
    /// From the engine.
    Native(TokenStream),
    /// From the upstream's stream.
    Delegated(Box<DelegatedStream>),
    /// From a finished upstream call ([`Delivery::Whole`]).
    Finished(std::collections::VecDeque<StreamEvent>),
}

impl EventStream {
    /// The next event; None after `Done` or `Error`.
    pub async fn next(&mut self) -> Option<StreamEvent> {
        match self {
            EventStream::Native(s) => s.recv().await,
            EventStream::Delegated(s) => s.next().await,
            EventStream::Finished(events) => events.pop_front(),
        }
    }

    /// Reads the stream to its end.
    pub async fn collect(mut self) -> Result<Completion, SdkError> {
        let mut c = Completion::empty();
        while let Some(ev) = self.next().await {
            if c.absorb(ev)? {
                return Ok(c);
            }
        }
        Err(SdkError::EngineStopped)
    }
}

impl Generator {
    /// Checks the request (ranges, then what this route can honour) and starts it: one stream
    /// per choice, in order.
    pub async fn start(&self, req: &GenerateRequest) -> Result<Vec<EventStream>, SdkError> {
        self.start_for(req, Delivery::Streamed).await
    }

    /// [`Generator::start`], for a caller that reads the events as `delivery` says.
    pub async fn start_for(
        &self,
        req: &GenerateRequest,
        delivery: Delivery,
    ) -> Result<Vec<EventStream>, SdkError> {
        let up = match self {
            // The session checks the request itself (it is an entry point of its own).
            Generator::Native(s) => {
                // Rendering and tokenizing a prompt of megabytes is CPU work: it runs on the
                // blocking pool, not on the async workers that answer everyone else.
                let (s, req) = (s.clone(), req.clone());
                let streams = tokio::task::spawn_blocking(move || s.start_blocking(&req))
                    .await
                    .map_err(|_| SdkError::EngineStopped)??;
                return Ok(streams.into_iter().map(EventStream::Native).collect());
            }
            Generator::Delegated(up) => up,
        };
        req.validate()?;
        up.check(req)?;
        if delivery == Delivery::Streamed {
            let s = up.stream(req).await?;
            return Ok(vec![EventStream::Delegated(Box::new(s))]);
        }
        let c = up.complete(req).await?;
        let events = [
            StreamEvent::Token {
                token: None,
                text: c.text,
                reasoning: c.reasoning,
                logprob: None,
            },
            StreamEvent::Done {
                text: String::new(),
                reasoning: String::new(),
                finish: c.finish,
            },
        ];
        Ok(vec![EventStream::Finished(events.into())])
    }

    /// Runs a request to completion: one completion per choice.
    pub async fn complete(&self, req: &GenerateRequest) -> Result<Vec<Completion>, SdkError> {
        let mut out = Vec::with_capacity(req.n);
        for s in self.start_for(req, Delivery::Whole).await? {
            out.push(s.collect().await?);
        }
        Ok(out)
    }

    /// How many tokens `req`'s prompt takes once rendered (its template, tools and system
    /// prompt), with the checks a start makes of it; native routes (a delegated upstream counts
    /// with its own vocabulary).
    pub async fn count_prompt_tokens(&self, req: &GenerateRequest) -> Result<usize, SdkError> {
        match self {
            Generator::Native(s) => {
                req.validate()?;
                let (s, req) = (s.clone(), req.clone());
                tokio::task::spawn_blocking(move || s.prompt_tokens(&req).map(|t| t.len()))
                    .await
                    .map_err(|_| SdkError::EngineStopped)?
            }
            Generator::Delegated(up) => Err(Rejection::unsupported(
                Field::Prompt,
                format!(
                    "counting tokens needs the native backend; this model is delegated to {} at {}",
                    up.kind().name(),
                    up.url()
                ),
            )
            .into()),
        }
    }

    /// The model's tokenizer; token-id routes need it, and only native models have one here.
    pub fn tokenizer(&self) -> Result<&Tokenizer, Rejection> {
        match self {
            Generator::Native(s) => Ok(&s.model().tokenizer),
            Generator::Delegated(up) => Err(Rejection::unsupported(
                Field::Prompt,
                format!(
                    "token ids need the native backend; this model is delegated to {} at {}, \
                     whose vocabulary is its own",
                    up.kind().name(),
                    up.url()
                ),
            )),
        }
    }

    /// Token ids of `text` (BOS added as the model asks when `add_special`); native routes.
    pub fn tokenize(&self, text: &str, add_special: bool) -> Result<Vec<TokenId>, Rejection> {
        Ok(self.tokenizer()?.encode(text, add_special, true))
    }

    /// The text of token ids, each checked against the vocabulary; native routes.
    pub fn detokenize(&self, tokens: &[TokenId]) -> Result<String, Rejection> {
        let tok = self.tokenizer()?;
        check_vocab(tokens, tok.len(), Field::Prompt)?;
        Ok(tok.decode(tokens, false))
    }

    /// Queue and KV statistics (zeros for a delegated route, whose queue is the upstream's).
    pub fn stats(&self) -> EngineStats {
        match self {
            Generator::Native(s) => s.stats(),
            Generator::Delegated(_) => EngineStats::default(),
        }
    }
}
