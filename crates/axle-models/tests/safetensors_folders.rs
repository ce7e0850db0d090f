//! Hugging Face safetensors folders load natively as the model their GGUF twin holds
//! (`scripts/make-hf-fixtures.py` writes both from one fixture's numbers): the same tokens for the
//! same text, the same logits bit for bit through prompt, decode and verify steps, in f32 and
//! bf16, sharded with an index, for the llama family (whose Q and K rows are permuted at load),
//! qwen2 (biases), qwen3 (Q/K norms) and qwen3_moe (experts written one by one, stacked at load).
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
}
