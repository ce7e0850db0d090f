//! Quantizing a model's float weights at load (`--quantize`), as llama.cpp's quantize tool
//! would write the file: the same choice of type for each tensor (its mixture rules for the
//! recipes offered here, without an importance matrix) and ggml's own quantizers, so a folder
//! loaded with `--quantize q4_k_m` holds the bytes `llama-quantize` gives its GGUF twin.
//! Weights already quantized are kept as they are.
use crate::ModelError;
use axle_ggml::{DType, GgufFile, TensorInfo};
use std::str::FromStr;

/// A quantization recipe, named as llama.cpp's quantize tool names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantize {
    /// Q8_0 throughout.
    Q8_0,
    /// Q6_K throughout.
    Q6K,
    /// Q5_K, with Q6_K for some V projections and FFN down projections.
    Q5KM,
    /// Q4_K, with Q6_K for some V projections and FFN down projections and the output head.
    Q4KM,
    /// Q4_0, with Q6_K for the output head.
    Q4_0,
}

const RECIPES: &[(&str, Quantize)] = &[
    ("q8_0", Quantize::Q8_0),
    ("q6_k", Quantize::Q6K),
    ("q5_k_m", Quantize::Q5KM),
    ("q4_k_m", Quantize::Q4KM),
    ("q4_0", Quantize::Q4_0),
];

impl FromStr for Quantize {
    type Err = String;

    fn from_str(s: &str) -> Result<Quantize, String> {
        RECIPES
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(s))
            .map(|(_, q)| *q)
            .ok_or_else(|| {
                format!(
                    "unknown quantization {s:?} (one of {})",
                    RECIPES.iter().map(|r| r.0).collect::<Vec<_>>().join(", ")
                )
            })
    }
}

impl Quantize {
    /// The recipe's name (`q4_k_m`).
    pub fn name(self) -> &'static str {
        RECIPES
            .iter()
            .find(|(_, q)| *q == self)
            .map_or("", |(n, _)| n)
    }

    /// The type most weights get.
    fn base(self) -> DType {
        match self {
            Quantize::Q8_0 => DType::Q8_0,
            Quantize::Q6K => DType::Q6_K,
            Quantize::Q5KM => DType::Q5_K,
            Quantize::Q4KM => DType::Q4_K,
            Quantize::Q4_0 => DType::Q4_0,
        }
    }
}

/// The role of a tensor that the mixture rules tell apart (llama.cpp's categories).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Output,
    TokenEmbedding,
    /// V projections and fused projections that hold them (`attn_v`, `attn_qkv`, `attn_kv_b`).
    AttentionV,
    AttentionK,
    AttentionOutput,
    FfnDown,
    Other,
}

fn role(name: &str) -> Role {
    if name == "output.weight" {
        Role::Output
    } else if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        Role::TokenEmbedding
    } else if ["attn_qkv.weight", "attn_kv_b.weight", "attn_v.weight"]
        .iter()
        .any(|p| name.contains(p))
    {
        Role::AttentionV
    } else if name.contains("attn_k.weight") {
        Role::AttentionK
    } else if name.contains("attn_output.weight") {
        Role::AttentionOutput
    } else if name.contains("ffn_down") {
        Role::FfnDown
    } else {
        Role::Other
    }
}

/// Whether llama.cpp quantizes a tensor at all: weights of 2 or 3 dimensions, except norms,
/// routers and the small or positional tensors it leaves alone. (Of these, only float weights
/// are quantized here; the others keep their type.)
fn quantizable(t: &TensorInfo) -> bool {
    const KEPT: &[&str] = &[
        "_norm.weight",
        "ffn_gate_inp.weight",
        "ffn_gate_tid2eid.weight",
        "altup",
        "laurel",
        "per_layer_model_proj",
        "ssm_conv1d",
        "shortconv.conv.weight",
        "attn_rel_b.weight",
        "position_embd",
        "token_types",
    ];
    t.shape.len() >= 2 && t.name.ends_with("weight") && !KEPT.iter().any(|k| t.name.contains(k))
}

/// The more sensitive share of a run of layers: the first and last eighth, and every third
/// between.
fn more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i as i64 - (n / 8) as i64).rem_euclid(3) == 2
}

/// What the rules read of the model.
struct Shape {
    experts: usize,
    layers: usize,
    /// V projections in the model (`AttentionV` tensors).
    v_projections: usize,
    tied: bool,
    /// A model of llama.cpp's 70B size class (Llama 2/3 70B, Qwen2 72B, ...).
    seventy_b: bool,
}

/// Counters the rules keep as they walk the tensors in llama.cpp's order.
#[derive(Default)]
struct Walk {
    v_seen: usize,
    down_seen: usize,
}

impl Quantize {
    /// The type `t` gets (llama.cpp's `llama_tensor_get_type` for this recipe).
    fn type_of(self, t: &TensorInfo, s: &Shape, w: &mut Walk) -> DType {
        let cols = t.shape[0];
        let mut ty = self.base();
        let k_mix = matches!(self, Quantize::Q4KM | Quantize::Q5KM);
        match role(&t.name) {
            r if r == Role::Output || (s.tied && r == Role::TokenEmbedding) => {
                if cols % ty.block_size() != 0 {
                    ty = DType::Q8_0;
                } else if ty != DType::Q8_0 {
                    ty = DType::Q6_K;
                }
            }
            Role::TokenEmbedding => {}
            Role::AttentionV => {
                if k_mix && more_bits(w.v_seen, s.v_projections) {
                    ty = DType::Q6_K;
                }
                if s.seventy_b && ty == DType::Q4_K {
                    ty = DType::Q5_K;
                }
                if s.experts == 8 {
                    ty = DType::Q8_0;
                }
                w.v_seen += 1;
            }
            Role::AttentionK if s.experts == 8 => ty = DType::Q8_0,
            Role::AttentionOutput if s.experts == 8 && self == Quantize::Q4KM => ty = DType::Q5_K,
            Role::FfnDown => {
                let layer = if s.experts > 1 {
                    t.layer().map_or(w.down_seen, |l| l as usize)
                } else {
                    w.down_seen
                };
                if k_mix && more_bits(layer, s.layers) {
                    ty = DType::Q6_K;
                }
                w.down_seen += 1;
            }
            _ => {}
        }
        // Rows that do not split into the type's blocks fall back to a smaller block.
        if cols % ty.block_size() != 0 {
            ty = match ty {
                t if t == DType::Q4_K => DType::Q5_0,
                t if t == DType::Q5_K => DType::Q5_1,
                t if t == DType::Q6_K => DType::Q8_0,
                t => t,
            };
            if cols % ty.block_size() != 0 {
                ty = DType::F16;
            }
        }
        ty
    }
}

/// `file` with its float weights quantized by `recipe` on `threads` threads.
pub fn quantize(file: GgufFile, recipe: Quantize, threads: usize) -> Result<GgufFile, ModelError> {
    let arch = file.str("general.architecture")?.to_string();
    let int = |k: &str| -> Result<usize, ModelError> {
        Ok(file.int_opt(&format!("{arch}.{k}"))?.unwrap_or(0).max(0) as usize)
    };
    let layers = int("block_count")?;
    let experts = int("expert_count")?;
    let mut order: Vec<&TensorInfo> = file.tensors().iter().collect();
    // llama.cpp walks the tensors by layer (those of no layer first), then by name.
    order.sort_by(|a, b| {
        let layer = |t: &TensorInfo| t.layer().map_or(-1, |l| l as i64);
        (layer(a), &a.name).cmp(&(layer(b), &b.name))
    });
    // What llama.cpp's loader calls a 70B model (its size class), for the families that have one.
    let seventy_b = match arch.as_str() {
        "llama" if layers == 80 && experts != 8 => {
            let heads = int("attention.head_count")?;
            let kv = file
                .int_opt(&format!("{arch}.attention.head_count_kv"))?
                .map_or(heads, |k| k.max(0) as usize);
            heads != kv
        }
        "qwen2" | "olmo" | "deci" => layers == 80,
        "jais2" => layers == 68,
        _ => false,
    };
    let shape = Shape {
        experts,
        layers,
        v_projections: order
            .iter()
            .filter(|t| role(&t.name) == Role::AttentionV)
            .count(),
        tied: file.tensor("output.weight").is_none(),
        seventy_b,
    };
    let mut walk = Walk::default();
    let mut replaced = Vec::new();
    for t in order.into_iter().filter(|t| quantizable(t)) {
        let ty = recipe.type_of(t, &shape, &mut walk);
        if !t.dtype.is_float() || ty == t.dtype {
            continue;
        }
        let values = crate::hf::floats(file.tensor_data(t), t.dtype);
        let bytes = if ty == DType::F16 {
            values
                .iter()
                .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                .collect()
        } else {
            axle_ggml::quantize_rows(ty, &values, t.shape[0] as usize, threads)?
        };
        replaced.push((t.name.clone(), ty, bytes));
    }
    Ok(file.with_tensors_replaced(replaced)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipes_parse_by_name_and_unknown_ones_are_named() {
        assert_eq!("Q4_K_M".parse::<Quantize>(), Ok(Quantize::Q4KM));
        assert_eq!(Quantize::Q5KM.name(), "q5_k_m");
        let e = "q3_k".parse::<Quantize>().unwrap_err();
        assert!(e.contains("q3_k") && e.contains("q4_k_m"), "{e}");
    }

    #[test]
    fn more_bits_takes_the_ends_and_every_third_between() {
        let picked: Vec<usize> = (0..16).filter(|&i| more_bits(i, 16)).collect();
        assert_eq!(picked, [0, 1, 4, 7, 10, 13, 14, 15]);
    }
}
