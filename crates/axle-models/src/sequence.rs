//! One sequence on a contiguous KV range (slot = position): the simplest client of the runner, used
//! by single-prompt generation and the oracle tests. The paged, multi-sequence path is the engine's.
use crate::recurrent::StateSlots;
use crate::runner::{LogitRows, Runner, SeqInput};
use crate::ModelError;
use axle_core::TokenId;

/// A single sequence occupying slots `0..len` of a runner's KV cache.
#[derive(Debug)]
pub struct Sequence {
    tokens: Vec<TokenId>,
    table: Vec<u32>,
    /// Recurrent models: which kept state the next step starts from (tokens dropped by
    /// [`Sequence::truncate`] since the last step).
    state_from: u32,
    /// The prompt: what the first feed into the empty sequence ran. Later tokens are generated
    /// rows (see [`SeqInput::prompt_len`]).
    prompt_len: u32,
}

impl Sequence {
    /// An empty sequence over the whole cache of `runner`.
    pub fn new(runner: &Runner) -> Sequence {
        Sequence {
            tokens: Vec::new(),
            table: (0..runner.n_blocks()).collect(),
            state_from: 0,
            prompt_len: 0,
        }
    }

    /// Tokens in the cache.
    pub fn tokens(&self) -> &[TokenId] {
        &self.tokens
    }

    /// Forgets everything after `len` tokens (the KV slots are simply overwritten later). A
    /// recurrent model can go back only within the states its last step kept.
    pub fn truncate(&mut self, len: usize) {
        if len < self.tokens.len() {
            self.state_from += (self.tokens.len() - len) as u32;
        }
        self.tokens.truncate(len);
    }

    /// Runs `tokens` (in chunks of the runner's step budget) and returns the last token's logits.
    pub fn feed(
        &mut self,
        runner: &mut Runner,
        tokens: &[TokenId],
    ) -> Result<Vec<f32>, ModelError> {
        let limit = runner.options().kv_slots as usize;
        if self.tokens.len() + tokens.len() > limit {
            return Err(ModelError::ContextOverflow {
                tokens: self.tokens.len() + tokens.len(),
                limit,
            });
        }
        if tokens.is_empty() {
            return Err(ModelError::Batch("nothing to feed".into()));
        }
        if self.tokens.is_empty() {
            self.prompt_len = tokens.len() as u32;
        }
        let chunk = runner.options().max_batch_tokens;
        let mut last = Vec::new();
        let n_chunks = tokens.len().div_ceil(chunk);
        for (i, c) in tokens.chunks(chunk).enumerate() {
            let input = SeqInput {
                hidden: Vec::new(),
                tokens: c.to_vec(),
                start_pos: self.tokens.len() as u32,
                prompt_len: self.prompt_len,
                block_table: self.table.clone(),
                logits: if i + 1 == n_chunks {
                    LogitRows::Last
                } else {
                    LogitRows::None
                },
                pick: false,
                state: StateSlots {
                    from: std::mem::take(&mut self.state_from),
                    ..StateSlots::default()
                },
            };
            let out = runner.step(std::slice::from_ref(&input))?;
            self.tokens.extend_from_slice(c);
            if i + 1 == n_chunks {
                last = out.into_row(0);
            }
        }
        Ok(last)
    }

    /// Runs `tokens` in one step and returns logits at every position (draft verification).
    pub fn feed_all(
        &mut self,
        runner: &mut Runner,
        tokens: &[TokenId],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let limit = runner.options().kv_slots as usize;
        if self.tokens.len() + tokens.len() > limit {
            return Err(ModelError::ContextOverflow {
                tokens: self.tokens.len() + tokens.len(),
                limit,
            });
        }
        if self.tokens.is_empty() {
            self.prompt_len = tokens.len() as u32;
        }
        let input = SeqInput {
            hidden: Vec::new(),
            tokens: tokens.to_vec(),
            start_pos: self.tokens.len() as u32,
            prompt_len: self.prompt_len,
            block_table: self.table.clone(),
            logits: LogitRows::All,
            pick: false,
            state: StateSlots {
                from: std::mem::take(&mut self.state_from),
                keep: tokens.len() as u32,
                ..StateSlots::default()
            },
        };
        let out = runner.step(std::slice::from_ref(&input))?;
        self.tokens.extend_from_slice(tokens);
        Ok((0..out.rows.len()).map(|i| out.row(i).to_vec()).collect())
    }
}
