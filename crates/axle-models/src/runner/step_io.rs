//! What a step takes (each sequence's tokens, positions, blocks and wanted logits) and gives
//! (the logits or picked tokens of the rows that asked).
use super::*;

/// Which logits a sequence wants back from a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitRows {
    /// None (a prefill chunk that does not end the prompt).
    None,
    /// The last token's (end of prompt, or a plain decode).
    Last,
    /// Every token's (verifying draft tokens).
    All,
}

impl LogitRows {
    /// The rows a decoding step of a sequence with `drafts` draft tokens wants: the last one for
    /// a plain decode, every one to verify drafts.
    pub fn for_drafts(drafts: usize) -> LogitRows {
        if drafts == 0 {
            LogitRows::Last
        } else {
            LogitRows::All
        }
    }

    /// Whether token `ti` of `n` wants its logits.
    pub(super) fn wants(self, ti: usize, n: usize) -> bool {
        match self {
            LogitRows::None => false,
            LogitRows::Last => ti + 1 == n,
            LogitRows::All => true,
        }
    }
}

pub(super) fn check_token(t: TokenId, n_vocab: i64) -> Result<(), ModelError> {
    if t as i64 >= n_vocab {
        return Err(ModelError::Batch(format!(
            "token id {t} is outside the vocabulary ({n_vocab})"
        )));
    }
    Ok(())
}

/// One sequence's share of a step.
#[derive(Debug, Clone)]
pub struct SeqInput {
    /// Tokens to run, at positions `start_pos..start_pos + tokens.len()`.
    pub tokens: Vec<TokenId>,
    /// Position of the first token (= tokens already in the KV cache for this sequence).
    pub start_pos: u32,
    /// Length of the request's prompt: positions before it are prompt rows, later ones were
    /// generated. With [`HostKernels::Origin`] a row's arithmetic follows it (see
    /// [`HostKernels::row`]); other kernel choices ignore it.
    pub prompt_len: u32,
    /// Physical block of each logical block of the sequence; must cover every position up to the
    /// last token of this step.
    pub block_table: Vec<u32>,
    /// Which logits to return.
    pub logits: LogitRows,
    /// Return each wanted row's largest-logit index instead of its logits, where the head runs
    /// on an accelerator (only the indices are read back); on the host, the logits as asked.
    pub pick: bool,
    /// Recurrent state rows (models with linear-attention layers; ignored otherwise).
    pub state: StateSlots,
    /// An MTP head's runner ([`RunnerOptions::mtp`]): each token's paired hidden state,
    /// `n_embd` floats a token; empty otherwise.
    pub hidden: Vec<f32>,
}

/// Logits (or, from an embedding runner, hidden states) returned by a step, one row per
/// requested position, in input order.
#[derive(Debug, Clone, Default)]
pub struct StepOutput {
    /// Row-major logits, `rows.len() * width`.
    pub logits: Vec<f32>,
    /// Row length: the vocabulary size, or the hidden width ([`RowValues::Hidden`]).
    pub width: usize,
    /// For each row: (sequence index in the step, token index within that sequence's input).
    pub rows: Vec<(usize, usize)>,
    /// For each row, when its sequence asked for picks and the head runs on an accelerator: the
    /// index of its largest logit (empty when no row was picked). Picked rows' logits may be
    /// absent: `logits` is empty when every row was picked.
    pub picked: Vec<Option<TokenId>>,
    /// Where the runner returns hidden states ([`RunnerOptions::returns_hidden`], MTP heads):
    /// every token's final-normed hidden state, `n_embd` floats a token, in input order.
    pub hidden: Vec<f32>,
}

impl StepOutput {
    /// Logits of row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.logits[i * self.width..(i + 1) * self.width]
    }

    /// Row `i`'s logits, owned: the step's buffer itself when it holds only that row (a decode
    /// step's 512 KB for a 128k vocabulary is not copied again).
    pub fn into_row(self, i: usize) -> Vec<f32> {
        if i == 0 && self.logits.len() == self.width {
            return self.logits;
        }
        self.row(i).to_vec()
    }

    /// Logits of (sequence, token index), if requested.
    pub fn find(&self, seq: usize, tok: usize) -> Option<&[f32]> {
        self.rows
            .iter()
            .position(|&r| r == (seq, tok))
            .map(|i| self.row(i))
    }

    /// What (sequence, token index) returned, if requested: its pick or its logits.
    pub fn find_row(&self, seq: usize, tok: usize) -> Option<RowLogits<'_>> {
        let i = self.rows.iter().position(|&r| r == (seq, tok))?;
        Some(match self.picked.get(i) {
            Some(&Some(t)) => RowLogits::Picked(t),
            _ => RowLogits::Full(self.row(i)),
        })
    }
}
