//! Tokenizers built from GGUF metadata: byte-level BPE (gpt2 style: SmolLM2, Qwen, Llama 3) and
//! SentencePiece-style bigram merging by score with byte fallback (Llama 2, Gemma).
//!
//! Hand-written rather than built on the `tokenizers` crate because the contract is token-for-token
//! identity with libllama on GGUF vocabularies: the GGUF carries llama.cpp's own pre-tokenizer
//! names, token types and scores, and its SPM path is a score-ordered bigram merge that differs from
//! HF's Unigram model. The algorithms follow the published BPE and SentencePiece descriptions; the
//! test suite checks every id against libllama.
/// `PartialEq`, `Eq` and `PartialOrd` of a merge candidate from its `Ord` (the heap order both
/// tokenizers define by hand).
macro_rules! order_from_cmp {
    ($t:ty) => {
        impl PartialEq for $t {
            fn eq(&self, o: &Self) -> bool {
                self.cmp(o) == std::cmp::Ordering::Equal
            }
        }
        impl Eq for $t {}
        impl PartialOrd for $t {
            fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(o))
            }
        }
    };
}

mod bpe;
mod spm;
mod stream;

pub use stream::StreamDecoder;

use axle_ggml::{GgufFile, MetaValue};
use std::collections::HashMap;

/// A token id.
pub type TokenId = u32;

/// Tokenizer errors.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The GGUF has no usable vocabulary.
    #[error("model vocabulary: {0}")]
    Vocab(String),
    /// The model's tokenizer kind is not implemented.
    #[error("tokenizer model `{0}` is not supported (supported: gpt2, llama)")]
    Unsupported(String),
    /// The pre-tokenizer regex failed.
    #[error("pre-tokenizer: {0}")]
    Regex(String),
}

/// The GGUF token type of each vocabulary entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// An ordinary piece.
    Normal,
    /// The unknown token.
    Unknown,
    /// A control token (BOS, EOS, chat markers): not produced from text unless parsing specials.
    Control,
    /// A user-defined token: always matched in text.
    UserDefined,
    /// An unused slot.
    Unused,
    /// A byte-fallback token `<0xXX>`.
    Byte,
}

impl TokenKind {
    fn from_gguf(v: i64) -> TokenKind {
        match v {
            2 => TokenKind::Unknown,
            3 => TokenKind::Control,
            4 => TokenKind::UserDefined,
            5 => TokenKind::Unused,
            6 => TokenKind::Byte,
            _ => TokenKind::Normal,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Algorithm {
    Bpe,
    Spm,
}

/// A loaded tokenizer.
#[derive(Debug)]
pub struct Tokenizer {
    tokens: Vec<String>,
    kinds: Vec<TokenKind>,
    scores: Vec<f32>,
    by_text: HashMap<String, TokenId>,
    algorithm: Algorithm,
    bpe: Option<bpe::Bpe>,
    /// Control / user-defined / unknown tokens, longest text first (matched before tokenizing).
    specials: Vec<TokenId>,
    /// Beginning-of-sequence token.
    pub bos: Option<TokenId>,
    /// End-of-sequence token.
    pub eos: Option<TokenId>,
    /// Whether encoding with `add_special` prepends BOS.
    pub add_bos: bool,
    /// Whether encoding with `add_special` appends EOS.
    pub add_eos: bool,
    add_space_prefix: bool,
    eog: Vec<TokenId>,
}

fn str_array(file: &GgufFile, key: &str) -> Result<Vec<String>, TokenizerError> {
    let arr = file
        .array_opt(key)
        .map_err(|e| TokenizerError::Vocab(e.to_string()))?;
    let arr = arr.ok_or_else(|| TokenizerError::Vocab(format!("`{key}` is missing")))?;
    arr.iter()
        .map(|v| match v {
            MetaValue::Str(s) => Ok(s.clone()),
            _ => Err(TokenizerError::Vocab(format!("`{key}` must hold strings"))),
        })
        .collect()
}

/// A special token id from the metadata: absent is `None`; an id outside the vocabulary of `n`
/// tokens is an error naming the key (a file that says so is corrupt, and ignoring the id would
/// silently change where generation stops).
fn token_id(file: &GgufFile, key: &str, n: usize) -> Result<Option<TokenId>, TokenizerError> {
    match file.int_opt(key) {
        Ok(None) => Ok(None),
        Ok(Some(v)) if v >= 0 && (v as usize) < n => Ok(Some(v as TokenId)),
        Ok(Some(v)) => Err(TokenizerError::Vocab(format!(
            "{key} = {v} is outside the vocabulary of {n} tokens"
        ))),
        Err(e) => Err(TokenizerError::Vocab(format!("{key}: {e}"))),
    }
}

/// Texts of tokens that end a generation turn in common chat formats, beyond the declared EOS.
/// Like llama.cpp, such tokens are treated as control tokens even where the file says otherwise.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
];

/// Fill-in-the-middle markers, also control tokens whatever the file says.
const FIM_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<PRE>",
    "\u{2581}<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<SUF>",
    "\u{2581}<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<MID>",
    "\u{2581}<MID>",
    "<|code_middle|>",
    "<|middle|>",
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<PAD>",
    "[PAD]",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
    "<|file_sep|>",
];

impl Tokenizer {
    /// Builds the tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        let meta = |e: axle_ggml::Error| TokenizerError::Vocab(e.to_string());
        let model = file
            .str_opt("tokenizer.ggml.model")
            .map_err(meta)?
            .unwrap_or("")
            .to_string();
        let algorithm = match model.as_str() {
            "gpt2" => Algorithm::Bpe,
            "llama" => Algorithm::Spm,
            "" => {
                return Err(TokenizerError::Vocab(
                    "`tokenizer.ggml.model` is missing".into(),
                ))
            }
            other => return Err(TokenizerError::Unsupported(other.into())),
        };
        let tokens = str_array(file, "tokenizer.ggml.tokens")?;
        let n = tokens.len();
        if n == 0 {
            return Err(TokenizerError::Vocab("empty vocabulary".into()));
        }
        let kinds = match file.array_opt("tokenizer.ggml.token_type").map_err(meta)? {
            Some(a) if a.len() == n => a
                .iter()
                .map(|v| TokenKind::from_gguf(v.as_i64().unwrap_or(1)))
                .collect(),
            _ => vec![TokenKind::Normal; n],
        };
        let scores = match file.array_opt("tokenizer.ggml.scores").map_err(meta)? {
            Some(a) if a.len() == n => a.iter().map(|v| v.as_f64().unwrap_or(0.0) as f32).collect(),
            _ => vec![0.0; n],
        };
        let mut by_text = HashMap::with_capacity(n);
        for (i, t) in tokens.iter().enumerate() {
            by_text.entry(t.clone()).or_insert(i as TokenId);
        }
        let bpe = match algorithm {
            Algorithm::Bpe => {
                let merges = str_array(file, "tokenizer.ggml.merges")?;
                let pre = file
                    .str_opt("tokenizer.ggml.pre")
                    .map_err(meta)?
                    .unwrap_or("default");
                // A safetensors folder's tokenizer gives its pre-tokenizer as regexes, and
                // whether a word found whole in the vocabulary skips the merges
                // (`hf::tokenizer`).
                let regexes = match file.array_opt("tokenizer.axle.pre_regexes").map_err(meta)? {
                    Some(_) => Some(str_array(file, "tokenizer.axle.pre_regexes")?),
                    None => None,
                };
                let ignore_merges = file
                    .bool_opt("tokenizer.axle.ignore_merges")
                    .map_err(meta)?
                    .unwrap_or(false);
                Some(bpe::Bpe::new(
                    &merges,
                    pre,
                    regexes.as_deref(),
                    ignore_merges,
                )?)
            }
            Algorithm::Spm => None,
        };
        let mut kinds = kinds;
        // Some vocabularies (Gemma 4, PLaMo) use a normal `</s>`: it then neither ends turns nor is special.
        let normal_s = ["<|tool_response>", "<|plamo:eos|>"]
            .iter()
            .any(|t| by_text.contains_key(*t));
        let mut eog: Vec<TokenId> = Vec::new();
        for text in EOG_TEXTS.iter().chain(FIM_TEXTS) {
            if normal_s && *text == "</s>" {
                continue;
            }
            if let Some(&id) = by_text.get(*text) {
                if kinds[id as usize] != TokenKind::Control {
                    kinds[id as usize] = TokenKind::Control;
                }
                if EOG_TEXTS.contains(text) {
                    eog.push(id);
                }
            }
        }
        let mut specials: Vec<TokenId> = (0..n as TokenId)
            .filter(|&i| {
                matches!(
                    kinds[i as usize],
                    TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown
                )
            })
            .collect();
        specials.sort_by_key(|&i| std::cmp::Reverse(tokens[i as usize].len()));
        let bos = token_id(file, "tokenizer.ggml.bos_token_id", n)?;
        let eos = token_id(file, "tokenizer.ggml.eos_token_id", n)?;
        let default_add_bos = algorithm == Algorithm::Spm;
        let add_bos = file
            .bool_opt("tokenizer.ggml.add_bos_token")
            .map_err(meta)?
            .unwrap_or(default_add_bos)
            && bos.is_some();
        let add_eos = file
            .bool_opt("tokenizer.ggml.add_eos_token")
            .map_err(meta)?
            .unwrap_or(false)
            && eos.is_some();
        let add_space_prefix = file
            .bool_opt("tokenizer.ggml.add_space_prefix")
            .map_err(meta)?
            .unwrap_or(algorithm == Algorithm::Spm);
        eog.extend(eos);
        for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
            eog.extend(token_id(file, key, n)?);
        }
        eog.sort_unstable();
        eog.dedup();
        Ok(Tokenizer {
            tokens,
            kinds,
            scores,
            by_text,
            algorithm,
            bpe,
            specials,
            bos,
            eos,
            add_bos,
            add_eos,
            add_space_prefix,
            eog,
        })
    }

    /// Vocabulary size.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the vocabulary is empty (never, once loaded).
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Whether encoding puts a space before text that starts a string (SentencePiece's
    /// `add_space_prefix`): then a piece of text does not encode the same everywhere.
    pub fn adds_space_prefix(&self) -> bool {
        self.algorithm == Algorithm::Spm && self.add_space_prefix
    }

    /// Tokens that end generation (EOS, EOT and the chat end-of-turn markers).
    pub fn eog_tokens(&self) -> &[TokenId] {
        &self.eog
    }

    /// Whether `t` ends generation.
    pub fn is_eog(&self, t: TokenId) -> bool {
        self.eog.binary_search(&t).is_ok()
    }

    /// The id of a token's exact text.
    pub fn token_id(&self, text: &str) -> Option<TokenId> {
        self.by_text.get(text).copied()
    }

    /// The raw vocabulary text of a token (as stored in the GGUF).
    pub fn token_text(&self, t: TokenId) -> Option<&str> {
        self.tokens.get(t as usize).map(String::as_str)
    }

    /// The kind of a token.
    pub fn kind(&self, t: TokenId) -> Option<TokenKind> {
        self.kinds.get(t as usize).copied()
    }

    /// Encodes text. `add_special` adds BOS/EOS as the model asks; `parse_special` turns control
    /// token texts (like `<|im_start|>`) in the text into their ids.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<TokenId> {
        let mut out = Vec::new();
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        let mut prev_special = true;
        for frag in self.split_specials(text, parse_special) {
            match frag {
                Fragment::Token(t) => {
                    out.push(t);
                    prev_special = true;
                }
                Fragment::Text(s) => {
                    match self.algorithm {
                        Algorithm::Bpe => {
                            if let Some(bpe) = &self.bpe {
                                bpe.encode(self, s, &mut out);
                            }
                        }
                        Algorithm::Spm => {
                            let mut t = String::with_capacity(s.len() + 3);
                            if self.add_space_prefix && prev_special {
                                t.push(' ');
                            }
                            t.push_str(s);
                            spm::encode(self, &t.replace(' ', "\u{2581}"), &mut out);
                        }
                    }
                    prev_special = false;
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// The bytes of one token as it appears in output text. Control and unknown tokens render as
    /// nothing unless `special` is set.
    pub fn piece(&self, t: TokenId, special: bool) -> Vec<u8> {
        let Some(kind) = self.kind(t) else {
            return Vec::new();
        };
        let text = &self.tokens[t as usize];
        match kind {
            TokenKind::Control | TokenKind::Unknown if !special => Vec::new(),
            TokenKind::Control | TokenKind::Unknown | TokenKind::UserDefined => {
                text.as_bytes().to_vec()
            }
            TokenKind::Normal => match self.algorithm {
                Algorithm::Spm => text.replace('\u{2581}', " ").into_bytes(),
                Algorithm::Bpe => bpe::decode_bytes(text),
            },
            TokenKind::Byte => byte_of(text).map(|b| vec![b]).unwrap_or_default(),
            TokenKind::Unused => Vec::new(),
        }
    }

    /// Decodes tokens to text (invalid UTF-8 replaced).
    pub fn decode(&self, tokens: &[TokenId], special: bool) -> String {
        let mut bytes = Vec::new();
        for &t in tokens {
            bytes.extend(self.piece(t, special));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn split_specials<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        let mut frags = vec![Fragment::Text(text)];
        for &id in &self.specials {
            let kind = self.kinds[id as usize];
            if !parse_special && matches!(kind, TokenKind::Control | TokenKind::Unknown) {
                continue;
            }
            let needle = self.tokens[id as usize].as_str();
            if needle.is_empty() {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len());
            for f in frags {
                match f {
                    Fragment::Text(s) if s.contains(needle) => {
                        let mut rest = s;
                        while let Some(pos) = rest.find(needle) {
                            if pos > 0 {
                                next.push(Fragment::Text(&rest[..pos]));
                            }
                            next.push(Fragment::Token(id));
                            rest = &rest[pos + needle.len()..];
                        }
                        if !rest.is_empty() {
                            next.push(Fragment::Text(rest));
                        }
                    }
                    other => next.push(other),
                }
            }
            frags = next;
        }
        frags
    }

    fn byte_token(&self, b: u8) -> Option<TokenId> {
        match self.algorithm {
            Algorithm::Spm => self.token_id(&format!("<0x{b:02X}>")),
            Algorithm::Bpe => self.token_id(&bpe::byte_to_unicode(b).to_string()),
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Fragment<'t> {
    Text(&'t str),
    Token(TokenId),
}

fn byte_of(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}
