//! `tokenizer.json` (and `tokenizer_config.json`) → the tokenizer metadata GGUF files carry:
//! vocabulary with token kinds, merges, the pre-tokenizer as its regexes, the special tokens and
//! whether a BOS is added, and the chat template. Byte-level BPE (GPT-2, Llama 3, Qwen and
//! SmolLM vocabularies), and SentencePiece-style BPE with byte fallback (Gemma, Llama 2), which
//! reads as GGUF's SentencePiece tokenizer: each merge's result scored by the merge's rank, so
//! the highest-scored bigram is the first-ranked merge; anything else is refused by name.
use super::read_json;
use crate::ModelError;
use axle_ggml::MetaValue;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// GPT-2's pre-tokenizer, which `ByteLevel { use_regex: true }` applies.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Token kinds as GGUF numbers them.
const NORMAL: i64 = 1;
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;
const UNKNOWN: i64 = 2;
const BYTE: i64 = 6;

/// SentencePiece's word-boundary mark, which SentencePiece-style tokenizers put for spaces.
const SPACE_MARK: &str = "\u{2581}";

/// How a SentencePiece-style tokenizer's normalizer marks spaces: whether it puts a mark before
/// the text as well (Llama 2) or only replaces spaces (Gemma).
fn spm_space_prefix(normalizer: &Value) -> Result<bool, ModelError> {
    let replaces = |n: &Value| {
        n["type"] == "Replace" && n["pattern"]["String"] == " " && n["content"] == SPACE_MARK
    };
    let prepends = |n: &Value| n["type"] == "Prepend" && n["prepend"] == SPACE_MARK;
    if replaces(normalizer) {
        return Ok(false);
    }
    if let Some([a, b]) = normalizer["normalizers"].as_array().map(Vec::as_slice) {
        if normalizer["type"] == "Sequence" && prepends(a) && replaces(b) {
            return Ok(true);
        }
    }
    Err(refuse(format!(
        "byte-fallback BPE with normalizer {normalizer} (Axle reads spaces replaced by U+2581, \
         optionally one prepended)"
    )))
}

fn refuse(what: String) -> ModelError {
    ModelError::Unsupported(format!("tokenizer.json: {what}"))
}

/// The pre-tokenizer's regexes, applied in turn (each splits every piece into its matches and
/// what lies between).
fn pre_regexes(pre: &Value, out: &mut Vec<String>) -> Result<(), ModelError> {
    if pre.is_null() {
        return Ok(());
    }
    match pre.get("type").and_then(Value::as_str).unwrap_or("") {
        "Sequence" => {
            for p in pre
                .get("pretokenizers")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                pre_regexes(p, out)?;
            }
        }
        "ByteLevel" => {
            if pre.get("add_prefix_space").and_then(Value::as_bool) == Some(true) {
                return Err(refuse("ByteLevel with add_prefix_space".into()));
            }
            if pre
                .get("use_regex")
                .and_then(Value::as_bool)
                .unwrap_or(true)
            {
                out.push(GPT2.into());
            }
        }
        "Split" => {
            let behavior = pre.get("behavior").and_then(Value::as_str).unwrap_or("");
            let invert = pre.get("invert").and_then(Value::as_bool).unwrap_or(false);
            let Some(re) = pre
                .get("pattern")
                .and_then(|p| p.get("Regex").or_else(|| p.get("String")))
                .and_then(Value::as_str)
            else {
                return Err(refuse(format!("Split pattern {}", pre["pattern"])));
            };
            if behavior != "Isolated" || invert {
                return Err(refuse(format!(
                    "Split with behavior {behavior}, invert {invert}"
                )));
            }
            let re = if pre["pattern"].get("String").is_some() {
                fancy_regex::escape(re).into_owned()
            } else {
                re.to_string()
            };
            out.push(re);
        }
        "Digits" => {
            let single = pre
                .get("individual_digits")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            out.push(if single { r"\p{N}" } else { r"\p{N}+" }.into());
        }
        other => return Err(refuse(format!("pre-tokenizer {other}"))),
    }
    Ok(())
}

/// A byte-fallback token: `<0xXX>`.
fn is_byte_token(text: &str) -> bool {
    text.len() == 6
        && text.starts_with("<0x")
        && text.ends_with('>')
        && text[3..5].bytes().all(|b| b.is_ascii_hexdigit())
}

/// Scores for GGUF's SentencePiece tokenizer, which merges the highest-scored bigram first: the
/// result of the merge ranked `r` scores `-r`, so the first-ranked merge goes first, as BPE has
/// it. Tokens of several characters that no merge makes (special and added tokens among them)
/// score below every merge, so they are merged into last; single characters, never merged
/// into, score 0.
fn merge_scores(tokens: &[Option<String>], merges: &[String]) -> Vec<f64> {
    let mut rank: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (r, m) in merges.iter().enumerate() {
        if let Some((a, b)) = m.split_once(' ') {
            rank.entry(format!("{a}{b}")).or_insert(r);
        }
    }
    let never = -(merges.len() as f64) - 1.0;
    tokens
        .iter()
        .map(|t| match t {
            Some(t) => match rank.get(t) {
                Some(&r) => -(r as f64),
                None if t.chars().count() > 1 => never,
                None => 0.0,
            },
            None => never,
        })
        .collect()
}

/// A token given as a string or as `{"content": ...}`.
fn token_text(v: &Value) -> Option<&str> {
    v.as_str().or_else(|| v.get("content")?.as_str())
}

/// The tokenizer metadata and chat template of a folder.
pub(super) fn read(folder: &Path) -> Result<BTreeMap<String, MetaValue>, ModelError> {
    let tj = read_json(&folder.join("tokenizer.json"))?;
    let config_path = folder.join("tokenizer_config.json");
    let tc = if config_path.is_file() {
        read_json(&config_path)?
    } else {
        Value::Null
    };
    let model = &tj["model"];
    if model.get("type").and_then(Value::as_str) != Some("BPE") {
        return Err(refuse(format!("model type {}", model["type"])));
    }
    // SentencePiece style: bytes missing from the vocabulary fall back to `<0xXX>` tokens.
    let spm = model.get("byte_fallback").and_then(Value::as_bool) == Some(true);
    let space_prefix = if spm {
        // A split at spaces (as Transformers writes Gemma's) finds none once the normalizer
        // has marked them all.
        let pre = &tj["pre_tokenizer"];
        let at_spaces = pre["type"] == "Split" && pre["pattern"]["String"] == " ";
        if !pre.is_null() && !at_spaces {
            return Err(refuse(format!(
                "byte-fallback BPE with pre-tokenizer {}",
                tj["pre_tokenizer"]
            )));
        }
        Some(spm_space_prefix(&tj["normalizer"])?)
    } else {
        match tj["normalizer"].get("type").and_then(Value::as_str) {
            None | Some("NFC") => {}
            Some(other) => return Err(refuse(format!("normalizer {other}"))),
        }
        None
    };
    let vocab = model
        .get("vocab")
        .and_then(Value::as_object)
        .ok_or_else(|| refuse("no model.vocab".into()))?;
    let mut tokens: Vec<Option<String>> = Vec::new();
    let mut kinds: Vec<i64> = Vec::new();
    let mut place = |id: u64, text: &str, kind: i64| -> Result<(), ModelError> {
        let id = usize::try_from(id)
            .ok()
            .filter(|&i| i < 1 << 21)
            .ok_or_else(|| refuse(format!("token id {id} of {text:?}")))?;
        if tokens.len() <= id {
            tokens.resize(id + 1, None);
            kinds.resize(id + 1, NORMAL);
        }
        tokens[id] = Some(text.to_string());
        kinds[id] = kind;
        Ok(())
    };
    let unknown = model.get("unk_token").and_then(Value::as_str);
    for (text, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| refuse(format!("id of {text:?}")))?;
        let kind = if spm && is_byte_token(text) {
            BYTE
        } else if unknown == Some(text.as_str()) {
            UNKNOWN
        } else {
            NORMAL
        };
        place(id, text, kind)?;
    }
    for added in tj["added_tokens"].as_array().into_iter().flatten() {
        let (Some(id), Some(text)) = (added["id"].as_u64(), added["content"].as_str()) else {
            return Err(refuse(format!("added token {added}")));
        };
        let special = added["special"].as_bool().unwrap_or(false);
        place(id, text, if special { CONTROL } else { USER_DEFINED })?;
    }
    let merges: Vec<String> = model["merges"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| match m {
            Value::String(s) => Ok(s.clone()),
            Value::Array(pair) if pair.len() == 2 => Ok(format!(
                "{} {}",
                pair[0].as_str().unwrap_or_default(),
                pair[1].as_str().unwrap_or_default()
            )),
            other => Err(refuse(format!("merge {other}"))),
        })
        .collect::<Result<_, _>>()?;
    // SentencePiece style: the space mark's placement and each token's merge score.
    let spm_scores = space_prefix.map(|prefix| (prefix, merge_scores(&tokens, &merges)));
    let tokens: Vec<MetaValue> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| MetaValue::Str(t.unwrap_or_else(|| format!("[PAD{i}]"))))
        .collect();
    let mut regexes = Vec::new();
    if !spm {
        pre_regexes(&tj["pre_tokenizer"], &mut regexes)?;
    }
    let id_of = |text: &str| -> Option<u64> {
        if let Some(id) = vocab.get(text).and_then(Value::as_u64) {
            return Some(id);
        }
        tj["added_tokens"]
            .as_array()?
            .iter()
            .find(|a| a["content"].as_str() == Some(text))?["id"]
            .as_u64()
    };
    let mut m = BTreeMap::new();
    m.insert("tokenizer.ggml.tokens".into(), MetaValue::Array(tokens));
    m.insert(
        "tokenizer.ggml.token_type".into(),
        MetaValue::Array(kinds.into_iter().map(MetaValue::Int).collect()),
    );
    match spm_scores {
        Some((prefix, scores)) => {
            m.insert(
                "tokenizer.ggml.model".into(),
                MetaValue::Str("llama".into()),
            );
            m.insert(
                "tokenizer.ggml.scores".into(),
                MetaValue::Array(scores.into_iter().map(MetaValue::Float).collect()),
            );
            m.insert(
                "tokenizer.ggml.add_space_prefix".into(),
                MetaValue::Bool(prefix),
            );
            if let Some(u) = unknown.and_then(id_of) {
                m.insert("tokenizer.ggml.unknown_token_id".into(), MetaValue::UInt(u));
            }
        }
        None => {
            m.insert("tokenizer.ggml.model".into(), MetaValue::Str("gpt2".into()));
            m.insert(
                "tokenizer.ggml.merges".into(),
                MetaValue::Array(merges.into_iter().map(MetaValue::Str).collect()),
            );
            m.insert(
                "tokenizer.axle.pre_regexes".into(),
                MetaValue::Array(regexes.into_iter().map(MetaValue::Str).collect()),
            );
            m.insert(
                "tokenizer.axle.ignore_merges".into(),
                MetaValue::Bool(model["ignore_merges"].as_bool().unwrap_or(false)),
            );
        }
    }
    // BOS: the token the post-processor puts first, else the config's, added as it says.
    let template_bos = tj["post_processor"]
        .get("single")
        .and_then(Value::as_array)
        .and_then(|s| s.first())
        .and_then(|f| f.get("SpecialToken"))
        .and_then(|t| t["id"].as_str())
        .and_then(id_of);
    let bos = template_bos.or_else(|| tc.get("bos_token").and_then(token_text).and_then(id_of));
    if let Some(b) = bos {
        m.insert("tokenizer.ggml.bos_token_id".into(), MetaValue::UInt(b));
    }
    let add_bos = template_bos.is_some()
        || tc
            .get("add_bos_token")
            .and_then(Value::as_bool)
            .unwrap_or(false);
    m.insert(
        "tokenizer.ggml.add_bos_token".into(),
        MetaValue::Bool(add_bos && bos.is_some()),
    );
    if let Some(e) = tc.get("eos_token").and_then(token_text).and_then(id_of) {
        m.insert("tokenizer.ggml.eos_token_id".into(), MetaValue::UInt(e));
    }
    if let Some(p) = tc.get("pad_token").and_then(token_text).and_then(id_of) {
        m.insert("tokenizer.ggml.padding_token_id".into(), MetaValue::UInt(p));
    }
    let jinja = folder.join("chat_template.jinja");
    let template = if jinja.is_file() {
        Some(
            std::fs::read_to_string(&jinja)
                .map_err(|e| ModelError::Invalid(format!("{}: {e}", jinja.display())))?,
        )
    } else {
        match &tc["chat_template"] {
            Value::String(s) => Some(s.clone()),
            Value::Array(named) => named
                .iter()
                .find(|t| t["name"].as_str() == Some("default"))
                .and_then(|t| t["template"].as_str())
                .map(str::to_string),
            _ => None,
        }
    };
    if let Some(t) = template {
        m.insert("tokenizer.chat_template".into(), MetaValue::Str(t));
    }
    Ok(m)
}
