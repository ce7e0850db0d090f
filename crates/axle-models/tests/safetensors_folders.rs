//! Hugging Face safetensors folders load natively as the model their GGUF twin holds
//! (`scripts/make-hf-fixtures.py` writes both from one fixture's numbers): the same tokens for the
//! same text, the same logits bit for bit through prompt, decode and verify steps, in f32 and
//! bf16, sharded with an index, for the llama family (whose Q and K rows are permuted at load),
//! qwen2 (biases), qwen3 (Q/K norms), qwen3_moe (experts written one by one, stacked at load),
//! qwen3_5, qwen3_5_moe and qwen3_next (hybrid gated delta net layers, a vision-language layout),
//! glm4_moe_lite and deepseek_v3 (latent attention), gpt_oss (MXFP4 experts), gemma4_text and
//! gemma3_text (the real Gemma 3 270M: a SentencePiece vocabulary, Gemma's norms).
//! Folders Axle cannot read are refused by name.
mod common;

use axle_models::{Model, ModelOptions};
use std::path::PathBuf;
use std::sync::Arc;

use common::hf_fixture as hf;

const TEXTS: &[&str] = &[
    "Hello, world! It's 2026 and we're testing 12345 tokens.",
    "  leading spaces\n\nand\ttabs, ünïcödé, 日本語, emoji 🦀 and CAPS'LL'VE",
    "<|im_start|>user\nWhat's up?<|im_end|>",
    "def f(x):\n    return x ** 2  # square\n",
];

fn check(name: &str) {
    let opts = ModelOptions::cpu(2);
    let folder = Arc::new(Model::load(hf(name), &opts).unwrap_or_else(|e| panic!("{name}: {e}")));
    let twin = Arc::new(
        Model::load(hf(&format!("{name}.gguf")), &opts).unwrap_or_else(|e| panic!("{name}: {e}")),
    );
    assert_eq!(folder.arch(), twin.arch(), "{name}");
    for text in TEXTS {
        for (special, parse) in [(true, true), (false, false)] {
            assert_eq!(
                folder.tokenizer.encode(text, special, parse),
                twin.tokenizer.encode(text, special, parse),
                "{name}: {text:?}"
            );
        }
    }
    assert_eq!(
        folder.chat_template_source(),
        twin.chat_template_source(),
        "{name}"
    );
    common::assert_same_step_logits(folder, twin, &hf(name));
}

#[test]
fn llama_f32_folder_is_its_twin() {
    check("llama-f32");
}

#[test]
fn llama_bf16_folder_is_its_twin() {
    check("llama-bf16");
}

#[test]
fn qwen3_bf16_folder_is_its_twin() {
    check("qwen3-bf16");
}

#[test]
fn qwen2_f32_folder_is_its_twin() {
    check("qwen2-f32");
}

#[test]
fn qwen3moe_bf16_folder_is_its_twin() {
    check("qwen3moe-bf16");
}

/// Qwen 3.5 as a vision-language checkpoint holds it: the config under `text_config`, the
/// language model's weights under `model.language_model.`, a vision tower's and an MTP head's
/// beside them (left unread); gated delta net layers whose value heads are grouped by key head
/// (tiled at load), `A_log`, `[channels, 1, taps]` convolutions, norms stored as `w`.
#[test]
fn qwen35_bf16_folder_is_its_twin() {
    check("qwen35-bf16");
}

/// Qwen 3.5 MoE as Transformers writes it: experts' gate and up rows in one stacked tensor a
/// layer (read in place as ggml's merged `ffn_gate_up_exps`), a gated shared expert.
#[test]
fn qwen35moe_bf16_folder_is_its_twin() {
    check("qwen35moe-bf16");
}

#[test]
fn qwen35moe_f32_folder_is_its_twin() {
    check("qwen35moe-f32");
}

/// Qwen3-Next: queries, keys, values and output gates fused per key head (`in_proj_qkvz`, split
/// at load), value heads kept grouped, experts one by one.
#[test]
fn qwen3next_bf16_folder_is_its_twin() {
    check("qwen3next-bf16");
}

#[test]
fn qwen3next_f32_folder_is_its_twin() {
    check("qwen3next-f32");
}

/// GLM-4.7-Flash's layout: latent attention whose `kv_b_proj` is split at load into the
/// transposed key and the value up-projections, low-rank queries, sigmoid routing with a
/// selection bias, a leading dense layer, an MTP layer past the model's own (left unread).
#[test]
fn glm4lite_bf16_folder_is_its_twin() {
    check("glm4lite-bf16");
}

/// DeepSeek V3's: full-rank queries, expert groups, YaRN RoPE.
#[test]
fn deepseekv3_f32_folder_is_its_twin() {
    check("deepseekv3-f32");
}

/// gpt-oss as OpenAI's checkpoints hold it: MXFP4 experts (blocks and exponents, gate and up
/// rows interleaved, repacked at load into ggml's MXFP4 blocks), biases on the experts and the
/// router, attention sinks, alternating sliding-window layers, YaRN RoPE.
#[test]
fn gptoss_mxfp4_folder_is_its_twin() {
    check("gptoss-mxfp4");
}

/// Gemma 4 (E2B/E4B-like): local and global layers of their own head sizes, K = V on the global
/// ones, proportional RoPE (its factors made at load), KV shared by the last two layers,
/// per-layer embeddings, double-width FFNs, norms stored as they are.
#[test]
fn gemma4_bf16_folder_is_its_twin() {
    check("gemma4-bf16");
}

/// Gemma 4 26B-A4B-like: a dense FFN beside experts stacked as Transformers holds them (gate and
/// up rows in one tensor, read in place as ggml's merged `ffn_gate_up_exps`), the router's
/// input and per-expert scales, each branch's norms.
#[test]
fn gemma4moe_bf16_folder_is_its_twin() {
    check("gemma4moe-bf16");
}

/// The real Gemma 3 270M as a bf16 folder: its SentencePiece vocabulary read from a byte-fallback
/// BPE tokenizer.json, Gemma's norms (1 + w) and local and global layers from config.json.
#[test]
fn gemma3_bf16_folder_is_its_twin() {
    check("gemma3-bf16");
}

/// A folder quantized at load (`--quantize`) holds, tensor by tensor, the types and bytes that
/// llama.cpp's quantize tool writes for its GGUF twin, and computes the same logits.
#[test]
fn folders_quantized_at_load_are_llama_quantize_of_their_twin() {
    use axle_models::quantize::{quantize, Quantize};
    let dir = tempfile::tempdir().expect("temp dir");
    // llama.cpp's LLAMA_FTYPE_MOSTLY_* of each recipe.
    for (name, recipe, ftype) in [
        ("llama-f32", Quantize::Q8_0, 7),
        ("qwen3-bf16", Quantize::Q4KM, 15),
        ("qwen2-f32", Quantize::Q5KM, 17),
        ("qwen3moe-bf16", Quantize::Q4KM, 15),
        ("llama-bf16", Quantize::Q4_0, 2),
    ] {
        let what = format!("{name} {}", recipe.name());
        let reference = dir.path().join(format!("{name}-{}.gguf", recipe.name()));
        axle_ggml::oracle::quantize_file(&hf(&format!("{name}.gguf")), &reference, ftype, 2)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let ours = quantize(axle_models::hf::open(&hf(name)).unwrap(), recipe, 2).unwrap();
        let theirs = axle_ggml::GgufFile::open(&reference).unwrap();
        assert_eq!(ours.tensors().len(), theirs.tensors().len(), "{what}");
        let mut types = std::collections::BTreeSet::new();
        for t in theirs.tensors() {
            let o = ours
                .tensor(&t.name)
                .unwrap_or_else(|| panic!("{what}: {}", t.name));
            assert_eq!(o.dtype, t.dtype, "{what}: {}", t.name);
            assert!(
                ours.tensor_data(o) == theirs.tensor_data(t),
                "{what}: {} differs",
                t.name
            );
            if o.dtype.is_quantized() {
                types.insert(o.dtype.name());
            }
        }
        // Rows of these small models mostly fall back from the K types to 32-value blocks; the
        // MoE fixture's 256-wide ones keep the mixture's Q4_K, Q5_K and Q6_K.
        eprintln!("{what}: {types:?}");
        assert!(!types.is_empty(), "{what}");
        let opts = ModelOptions {
            quantize: Some(recipe),
            ..ModelOptions::cpu(2)
        };
        let folder = Arc::new(Model::load(hf(name), &opts).unwrap());
        let twin = Arc::new(Model::load(&reference, &ModelOptions::cpu(2)).unwrap());
        common::assert_same_step_logits(folder, twin, &hf(name));
    }
}

#[test]
fn unreadable_folders_are_refused_by_name() {
    let dir = tempfile::tempdir().expect("temp dir");
    let copy_of = |source: &str, name: &str| {
        let to = dir.path().join(name);
        std::fs::create_dir_all(&to).unwrap();
        for e in std::fs::read_dir(hf(source)).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
        to
    };
    let copy = |name: &str| copy_of("llama-f32", name);
    let edit = |folder: &PathBuf, file: &str, f: &dyn Fn(&mut serde_json::Value)| {
        let p = folder.join(file);
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        f(&mut v);
        std::fs::write(&p, v.to_string()).unwrap();
    };
    let refused = |folder: &PathBuf| {
        Model::load(folder, &ModelOptions::cpu(1))
            .map(|_| ())
            .expect_err("refused")
            .to_string()
    };
    let f = copy("mixtral");
    edit(&f, "config.json", &|c| c["model_type"] = "mixtral".into());
    let e = refused(&f);
    assert!(e.contains("mixtral") && e.contains("qwen3"), "{e}");
    let f = copy("mlx7");
    edit(&f, "config.json", &|c| {
        c["quantization"] = serde_json::json!({"bits": 7, "group_size": 64})
    });
    assert!(refused(&f).contains("7-bit"));
    let f = copy("heads");
    edit(&f, "config.json", &|c| {
        c["num_attention_heads"] = (-3).into()
    });
    assert!(refused(&f).contains("num_attention_heads"));
    let f = copy("spm");
    edit(&f, "tokenizer.json", &|t| {
        t["model"]["type"] = "Unigram".into()
    });
    assert!(refused(&f).contains("Unigram"));
    let f = copy("spm-normalizer");
    edit(&f, "tokenizer.json", &|t| {
        t["model"]["byte_fallback"] = true.into()
    });
    assert!(refused(&f).contains("byte-fallback BPE with pre-tokenizer"));
    edit(&f, "tokenizer.json", &|t| {
        t["pre_tokenizer"] = serde_json::Value::Null
    });
    assert!(refused(&f).contains("byte-fallback BPE with normalizer"));
    let f = copy("gemma-27b-scale");
    edit(&f, "config.json", &|c| {
        c["model_type"] = "gemma3_text".into();
        c["query_pre_attn_scalar"] = 168.into();
    });
    assert!(refused(&f).contains("query_pre_attn_scalar"));
    let f = copy("shard");
    std::fs::remove_file(f.join("model-00002-of-00002.safetensors")).unwrap();
    assert!(refused(&f).contains("model-00002-of-00002.safetensors"));
    let f = copy("cut");
    let shard = f.join("model-00001-of-00002.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() / 2]).unwrap();
    assert!(refused(&f).contains("not a safetensors file"));
    let f = copy_of("qwen3moe-bf16", "dense-layers");
    edit(&f, "config.json", &|c| {
        c["mlp_only_layers"] = serde_json::json!([0])
    });
    assert!(refused(&f).contains("mlp_only_layers"));
    let f = copy_of("qwen3moe-bf16", "fewer-experts");
    edit(&f, "config.json", &|c| c["num_experts"] = 4.into());
    let e = refused(&f);
    assert!(
        e.contains("_exps.weight") && e.contains("expert 4 exists"),
        "{e}"
    );
    // Qwen 3.5: what the family does not compute is refused by name.
    for (name, key, value, said) in [
        (
            "q35-yarn",
            "rope_parameters",
            serde_json::json!({"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}),
            "yarn",
        ),
        ("q35-bias", "attention_bias", true.into(), "attention_bias"),
        ("q35-head", "head_dim", serde_json::Value::Null, "head_dim"),
        (
            "q35-types",
            "layer_types",
            serde_json::json!(["full_attention"]),
            "layer_types",
        ),
    ] {
        let f = copy_of("qwen35-bf16", name);
        edit(&f, "config.json", &|c| {
            c["text_config"][key] = value.clone()
        });
        let e = refused(&f);
        assert!(e.contains(said), "{name}: {e}");
    }
    // Latent attention: routing and layouts the family does not compute.
    for (name, key, value, said) in [
        (
            "mla-score",
            "scoring_func",
            serde_json::json!("sqrtsoftplus"),
            "sqrtsoftplus",
        ),
        ("mla-freq", "moe_layer_freq", 2.into(), "moe_layer_freq"),
        (
            "mla-dense",
            "n_routed_experts",
            serde_json::Value::Null,
            "n_routed_experts",
        ),
    ] {
        let f = copy_of("glm4lite-bf16", name);
        edit(&f, "config.json", &|c| c[key] = value.clone());
        let e = refused(&f);
        assert!(e.contains(said), "{name}: {e}");
    }
    // gpt-oss: what ggml's graph does not compute, and MXFP4 outside gpt-oss.
    for (name, key, value, said) in [
        ("oss-limit", "swiglu_limit", 10.0.into(), "swiglu_limit"),
        (
            "oss-types",
            "layer_types",
            serde_json::json!(["sliding_attention"]),
            "layer_types",
        ),
        (
            "oss-quant",
            "quantization_config",
            serde_json::json!({"quant_method": "fp8"}),
            "quant_method fp8",
        ),
    ] {
        let f = copy_of("gptoss-mxfp4", name);
        edit(&f, "config.json", &|c| c[key] = value.clone());
        let e = refused(&f);
        assert!(e.contains(said), "{name}: {e}");
    }
    // Gemma 4: experts named without their counts, and RoPE types the family does not compute.
    for (name, edit_config, said) in [
        (
            "g4-experts",
            &(|c: &mut serde_json::Value| c["enable_moe_block"] = true.into())
                as &dyn Fn(&mut serde_json::Value),
            "num_experts",
        ),
        (
            "g4-rope",
            &|c: &mut serde_json::Value| {
                c["rope_parameters"]["sliding_attention"]["rope_type"] = "yarn".into()
            },
            "RoPE types",
        ),
        (
            "g4-types",
            &|c: &mut serde_json::Value| c["layer_types"] = serde_json::Value::Null,
            "layer_types",
        ),
    ] {
        let f = copy_of("gemma4-bf16", name);
        edit(&f, "config.json", edit_config);
        let e = refused(&f);
        assert!(e.contains(said), "{name}: {e}");
    }
    let f = copy("mxfp4-llama");
    edit(&f, "config.json", &|c| {
        c["quantization_config"] = serde_json::json!({"quant_method": "mxfp4"})
    });
    assert!(refused(&f).contains("MXFP4 quantization in a llama folder"));
}
