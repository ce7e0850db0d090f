//! Byte-level BPE (gpt2 style): split text with the model's pre-tokenizer regexes, map each byte of
//! a word to a printable character, then merge adjacent pairs by merge rank (lowest first,
//! leftmost on ties) until no ranked pair remains.
use super::{TokenId, Tokenizer, TokenizerError};
use fancy_regex::Regex;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// o200k (gpt-oss, Llama 4), in llama.cpp's spelling: "a letter other than a-z" for the
/// upper-case classes and "other than A-Z" for the lower-case ones, as libllama tokenizes.
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pre-tokenizer regex sequence for a GGUF `tokenizer.ggml.pre` name.
fn pre_regexes(pre: &str) -> Vec<&'static str> {
    match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "dbrx" | "smaug-bpe" => vec![LLAMA3],
        "qwen2" | "deepseek-r1-qwen" | "hunyuan" => vec![QWEN2],
        "gpt-4o" | "llama4" | "minimax-m2" | "kanana2" | "talkie" => vec![GPT4O],
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva" => {
            vec![r"\p{N}", GPT2]
        }
        "gpt2" | "gpt-2" | "mpt" | "olmo" | "jais" | "trillion" => vec![GPT2],
        _ => vec![r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
    }
}

#[derive(Debug)]
pub(super) struct Bpe {
    ranks: HashMap<(String, String), u32>,
    regexes: Vec<Regex>,
    /// A word that is a token as a whole is that token, merges or not (tokenizer.json's
    /// `ignore_merges`).
    ignore_merges: bool,
}

/// gpt2's reversible byte -> printable character map.
pub(super) fn byte_to_unicode(b: u8) -> char {
    let printable =
        (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    if printable {
        return b as char;
    }
    // Non-printable bytes map, in order, to U+0100 and up.
    let mut n = 0u32;
    for x in 0..b {
        let p =
            (b'!'..=b'~').contains(&x) || (0xA1..=0xAC).contains(&x) || (0xAE..=0xFF).contains(&x);
        if !p {
            n += 1;
        }
    }
    char::from_u32(256 + n).unwrap_or('?')
}

fn unicode_to_byte(c: char) -> Option<u8> {
    let u = c as u32;
    if u < 256 {
        let b = u as u8;
        if byte_to_unicode(b) == c {
            return Some(b);
        }
    }
    (0..=255u8).find(|&b| byte_to_unicode(b) == c)
}

/// The bytes a byte-level token stands for.
pub(super) fn decode_bytes(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match unicode_to_byte(c) {
            Some(b) => out.push(b),
            None => out.extend(c.to_string().as_bytes()),
        }
    }
    out
}

struct Cand {
    left: usize,
    right: usize,
    rank: u32,
    text: String,
}
order_from_cmp!(Cand);
impl Ord for Cand {
    // Max-heap order: the lowest rank, then the leftmost pair, comes out first.
    fn cmp(&self, o: &Self) -> Ordering {
        o.rank.cmp(&self.rank).then_with(|| o.left.cmp(&self.left))
    }
}

impl Bpe {
    /// The merges, and the pre-tokenizer: the regexes given, else those of the GGUF name `pre`.
    pub(super) fn new(
        merges: &[String],
        pre: &str,
        regexes: Option<&[String]>,
        ignore_merges: bool,
    ) -> Result<Bpe, TokenizerError> {
        let mut ranks = HashMap::with_capacity(merges.len());
        for (i, m) in merges.iter().enumerate() {
            // A merge is "left right"; the separator is the first space after the first character.
            let first_len = m.chars().next().map_or(0, char::len_utf8);
            if let Some(p) = m[first_len..].find(' ') {
                let (a, b) = (&m[..first_len + p], &m[first_len + p + 1..]);
                ranks
                    .entry((a.to_string(), b.to_string()))
                    .or_insert(i as u32);
            }
        }
        let named: Vec<String>;
        let sources: &[String] = match regexes {
            Some(r) => r,
            None => {
                named = pre_regexes(pre).into_iter().map(str::to_string).collect();
                &named
            }
        };
        let regexes = sources
            .iter()
            .map(|r| Regex::new(r).map_err(|e| TokenizerError::Regex(e.to_string())))
            .collect::<Result<_, _>>()?;
        Ok(Bpe {
            ranks,
            regexes,
            ignore_merges,
        })
    }

    /// Splits text into words: each regex in turn splits every current piece into its matches and
    /// the text between them (nothing is dropped).
    fn words<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let mut pieces = vec![text];
        for re in &self.regexes {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for p in pieces {
                let mut last = 0;
                for m in re.find_iter(p) {
                    let Ok(m) = m else { break };
                    if m.start() > last {
                        next.push(&p[last..m.start()]);
                    }
                    if m.end() > m.start() {
                        next.push(m.as_str());
                    }
                    last = m.end();
                }
                if last < p.len() {
                    next.push(&p[last..]);
                }
            }
            pieces = next;
        }
        pieces
    }

    pub(super) fn encode(&self, tok: &Tokenizer, text: &str, out: &mut Vec<TokenId>) {
        for word in self.words(text) {
            let encoded: String = word.bytes().map(byte_to_unicode).collect();
            if self.ignore_merges {
                if let Some(id) = tok.token_id(&encoded) {
                    out.push(id);
                    continue;
                }
            }
            let mut syms: Vec<String> = encoded.chars().map(String::from).collect();
            let mut next: Vec<Option<usize>> = (0..syms.len())
                .map(|i| (i + 1 < syms.len()).then_some(i + 1))
                .collect();
            let mut prev: Vec<Option<usize>> = (0..syms.len()).map(|i| i.checked_sub(1)).collect();
            let mut heap = BinaryHeap::new();
            let push = |heap: &mut BinaryHeap<Cand>,
                        syms: &[String],
                        l: Option<usize>,
                        r: Option<usize>| {
                let (Some(l), Some(r)) = (l, r) else { return };
                if let Some(&rank) = self.ranks.get(&(syms[l].clone(), syms[r].clone())) {
                    heap.push(Cand {
                        left: l,
                        right: r,
                        rank,
                        text: format!("{}{}", syms[l], syms[r]),
                    });
                }
            };
            for i in 1..syms.len() {
                push(&mut heap, &syms, Some(i - 1), Some(i));
            }
            while let Some(c) = heap.pop() {
                if syms[c.left].is_empty() || syms[c.right].is_empty() {
                    continue;
                }
                if syms[c.left].len() + syms[c.right].len() != c.text.len()
                    || !c.text.starts_with(syms[c.left].as_str())
                    || !c.text.ends_with(syms[c.right].as_str())
                {
                    continue;
                }
                syms[c.left] = c.text;
                syms[c.right].clear();
                next[c.left] = next[c.right];
                if let Some(n) = next[c.right] {
                    prev[n] = Some(c.left);
                }
                push(&mut heap, &syms, prev[c.left], Some(c.left));
                push(&mut heap, &syms, Some(c.left), next[c.left]);
            }
            let mut i = if syms.is_empty() { None } else { Some(0) };
            while let Some(k) = i {
                let s = &syms[k];
                match tok.token_id(s) {
                    Some(id) => out.push(id),
                    None => {
                        for b in s.bytes() {
                            let one = [b];
                            if let Some(id) =
                                std::str::from_utf8(&one).ok().and_then(|t| tok.token_id(t))
                            {
                                out.push(id);
                            }
                        }
                    }
                }
                i = next[k];
            }
        }
    }
}
