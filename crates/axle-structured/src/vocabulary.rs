//! A model's vocabulary as the grammar engine sees it: the bytes of every token (control tokens
//! marked so that grammars never produce them as text), the end-of-generation tokens, and the
//! model's own tokenizer for the text a grammar forces.
use crate::StructuredError;
use axle_core::TokenId;
use llguidance::toktrie::{TokRxInfo, TokTrie, TokenizerEnv};
use std::sync::Arc;

/// Turns text into the model's tokens (no BOS, special token texts not parsed).
pub type Tokenize = Arc<dyn Fn(&str) -> Vec<TokenId> + Send + Sync>;

/// The token bytes and tokenizer of a model.
pub struct Vocabulary {
    /// Bytes of each token as it appears in text (empty for tokens that never do).
    pub tokens: Vec<Vec<u8>>,
    /// Control tokens (rendered to grammars only by name, never as text).
    pub control: Vec<bool>,
    /// Tokens that end generation.
    pub eos: Vec<TokenId>,
    /// The model's tokenizer.
    pub tokenize: Tokenize,
    /// Whether `tokenize` gives the same tokens for a piece of text wherever it stands (false for
    /// tokenizers that add a space before every text).
    pub canonical: bool,
}

impl std::fmt::Debug for Vocabulary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vocabulary")
            .field("tokens", &self.tokens.len())
            .field("eos", &self.eos)
            .field("canonical", &self.canonical)
            .finish()
    }
}

/// llguidance's view of a [`Vocabulary`].
pub(crate) struct TokenEnv {
    trie: TokTrie,
    tokenize: Tokenize,
    canonical: bool,
}

impl TokenEnv {
    pub(crate) fn new(v: Vocabulary) -> Result<TokenEnv, StructuredError> {
        let n = v.tokens.len();
        let Some(&first_eos) = v.eos.first() else {
            return Err(StructuredError::Vocabulary(
                "no end-of-generation token".into(),
            ));
        };
        if let Some(bad) = v.eos.iter().find(|&&t| t as usize >= n) {
            return Err(StructuredError::Vocabulary(format!(
                "end-of-generation token {bad} is outside the vocabulary ({n})"
            )));
        }
        let words: Vec<Vec<u8>> = v
            .tokens
            .into_iter()
            .zip(v.control.iter().chain(std::iter::repeat(&false)))
            .map(|(bytes, &control)| {
                if control && !bytes.is_empty() {
                    let mut w = Vec::with_capacity(bytes.len() + 1);
                    w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    w.extend(bytes);
                    w
                } else {
                    bytes
                }
            })
            .collect();
        let info = TokRxInfo::new(n as u32, first_eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&v.eos);
        Ok(TokenEnv {
            trie,
            tokenize: v.tokenize,
            canonical: v.canonical,
        })
    }
}

impl TokenizerEnv for TokenEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(s) {
            Ok(text) => (self.tokenize)(text),
            // Forced bytes can end inside a character: the trie's greedy split covers them.
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }

    fn tokenize_is_canonical(&self) -> bool {
        self.canonical
    }
}
