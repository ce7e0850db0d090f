//! `POST /v1/embeddings`, OpenAI's embeddings API: `input` as a text, a list of texts, a list of
//! token ids or a list of such lists; `encoding_format` `float` or `base64`; `dimensions` (the
//! leading components, normalized again). Served where `axle serve` holds an embedding model
//! ([`axle_sdk::Embeddings`]); every input of a request, and of requests that arrive together,
//! runs in the same batched steps.
use crate::api::{check_model, json, Authorized};
use crate::json_body::JsonBody;
use crate::openai::{refuse_unknown, WireError};
use crate::ApiError;
use axle_sdk::{Field, Rejection};
use axum::response::Response;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// Most inputs in one request (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

/// The request body.
#[derive(Debug, Deserialize)]
pub struct EmbeddingsRequest {
    /// A text, texts, token ids or lists of token ids.
    pub input: Value,
    /// The model (the served one's name, or empty).
    pub model: Option<String>,
    /// `float` (the default) or `base64` (little-endian f32 bytes).
    pub encoding_format: Option<String>,
    /// Keep this many leading components, normalized again.
    pub dimensions: Option<usize>,
    /// Every other field: refused by name unless it is `user` or null.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// One embedding of the answer.
#[derive(Debug, Serialize, Deserialize)]
pub struct EmbeddingItem {
    /// Always `embedding`.
    pub object: String,
    /// The input's index.
    pub index: usize,
    /// Floats, or their bytes in base64.
    pub embedding: Value,
}

/// Token counts of the answer.
#[derive(Debug, Serialize, Deserialize)]
pub struct EmbeddingUsage {
    /// Input tokens.
    pub prompt_tokens: usize,
    /// The same.
    pub total_tokens: usize,
}

/// The answer.
#[derive(Debug, Serialize, Deserialize)]
pub struct EmbeddingList {
    /// Always `list`.
    pub object: String,
    /// One per input, in order.
    pub data: Vec<EmbeddingItem>,
    /// The served model's name.
    pub model: String,
    /// Token counts.
    pub usage: EmbeddingUsage,
}

/// What `input` holds.
enum Inputs {
    Texts(Vec<String>),
    Tokens(Vec<Vec<u32>>),
}

fn invalid(reason: impl Into<String>) -> WireError {
    WireError::Rejected(Rejection::invalid(Field::Prompt, reason))
}

/// Reads `input`, naming what is wrong with it.
fn inputs(v: &Value) -> Result<Inputs, WireError> {
    let token = |x: &Value| {
        x.as_u64()
            .and_then(|t| u32::try_from(t).ok())
            .ok_or_else(|| invalid("token ids must be integers from 0 to 4294967295"))
    };
    let tokens = |xs: &[Value]| xs.iter().map(token).collect::<Result<Vec<u32>, _>>();
    let parsed = match v {
        Value::String(s) => Inputs::Texts(vec![s.clone()]),
        Value::Array(xs) if xs.is_empty() => return Err(invalid("it holds no input")),
        Value::Array(xs) if xs.iter().all(Value::is_string) => Inputs::Texts(
            xs.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect(),
        ),
        Value::Array(xs) if xs.iter().all(Value::is_number) => Inputs::Tokens(vec![tokens(xs)?]),
        Value::Array(xs) if xs.iter().all(Value::is_array) => Inputs::Tokens(
            xs.iter()
                .map(|x| tokens(x.as_array().map_or(&[][..], Vec::as_slice)))
                .collect::<Result<_, _>>()?,
        ),
        _ => {
            return Err(invalid(
                "expected a string, an array of strings, an array of token ids or an array of \
                 arrays of token ids",
            ))
        }
    };
    let n = match &parsed {
        Inputs::Texts(t) => t.len(),
        Inputs::Tokens(t) => t.len(),
    };
    if n > MAX_INPUTS {
        return Err(invalid(format!("{n} inputs; at most {MAX_INPUTS}")));
    }
    Ok(parsed)
}

/// The wire's name of a field.
fn param(f: Field) -> &'static str {
    match f {
        Field::Prompt => "input",
        f => f.name(),
    }
}

/// `POST /v1/embeddings`.
pub(crate) async fn embeddings(
    Authorized(state): Authorized,
    JsonBody(req): JsonBody<EmbeddingsRequest>,
) -> Result<Response, ApiError> {
    let Some(service) = state.embeddings.clone() else {
        return Err(ApiError {
            code: Some("unsupported_endpoint"),
            ..ApiError::bad_request(
                "this server holds no embedding model: start `axle serve` with --embeddings \
                 (and --pooling where the model file names none)",
                None,
            )
        });
    };
    check_model(&state, &req.model)?;
    state.metrics.request();
    let refused = |e: WireError| {
        state.metrics.error();
        ApiError::wire(e, param)
    };
    refuse_unknown(&req.other, &["user"]).map_err(refused)?;
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(refused(WireError::Unsupported {
                field: "encoding_format",
                reason: format!("`{other}` is not `float` or `base64`"),
            }))
        }
    };
    let width = service.width();
    let dimensions = match req.dimensions {
        None => width,
        Some(d) if (1..=width).contains(&d) => d,
        Some(d) => {
            return Err(refused(WireError::Unsupported {
                field: "dimensions",
                reason: format!("{d}: this model's embeddings have 1 to {width}"),
            }))
        }
    };
    let parsed = inputs(&req.input).map_err(refused)?;
    // Megabytes of text take a while to tokenize: on the blocking pool.
    let model = service.model().clone();
    let tokens: Vec<Vec<u32>> = match parsed {
        Inputs::Tokens(t) => t,
        Inputs::Texts(texts) => tokio::task::spawn_blocking(move || {
            texts
                .iter()
                .map(|t| model.tokenizer.encode(t, true, false))
                .collect()
        })
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?,
    };
    let prompt_tokens = tokens.iter().map(Vec::len).sum();
    let vectors = service
        .embed(tokens, dimensions == width)
        .await
        .map_err(|e| {
            state.metrics.error();
            ApiError::sdk(e, param)
        })?;
    let data = vectors
        .into_iter()
        .enumerate()
        .map(|(index, mut v)| {
            if dimensions < width {
                v.truncate(dimensions);
                axle_sdk::normalize(&mut v);
            }
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                serde_json::json!(v)
            };
            EmbeddingItem {
                object: "embedding".into(),
                index,
                embedding,
            }
        })
        .collect();
    Ok(json(EmbeddingList {
        object: "list".into(),
        data,
        model: state.model_name.clone(),
        usage: EmbeddingUsage {
            prompt_tokens,
            total_tokens: prompt_tokens,
        },
    }))
}
