//! A model split over several GGUF files (`name-00001-of-00002.gguf`, as llama.cpp's gguf-split
//! and the Hub's large repositories have them) loads from its first part and computes exactly
//! what the same weights in one file do, with weights mapped in place or copied; a missing part
//! or a later part opened first is refused by name.
mod common;

use axle_ggml::GgufFile;
use axle_models::{HostMemory, Model, ModelOptions};
use std::sync::Arc;

const FIRST: &str = "llama-split-tiny-00001-of-00002.gguf";
const SECOND: &str = "llama-split-tiny-00002-of-00002.gguf";

#[test]
fn a_split_model_reads_as_one_file() {
    let whole = GgufFile::open(common::fixture("llama-tiny.gguf")).expect("whole");
    let split = GgufFile::open(common::fixture(FIRST)).expect("split");
    assert_eq!(split.part_count(), 2);
    assert_eq!(split.tensors().len(), whole.tensors().len());
    assert!(split.tensors().iter().any(|t| t.part == 1));
    for t in whole.tensors() {
        let s = split.tensor(&t.name).expect("every tensor");
        assert_eq!(split.tensor_data(s), whole.tensor_data(t), "{}", t.name);
    }
}

#[test]
fn a_split_model_computes_what_one_file_does() {
    for memory in [HostMemory::Mapped, HostMemory::HugePages] {
        let opts = ModelOptions {
            host_memory: memory,
            ..ModelOptions::cpu(2)
        };
        let load = |name: &str| Arc::new(Model::load(common::fixture(name), &opts).expect(name));
        common::assert_same_step_logits(
            load(FIRST),
            load("llama-tiny.gguf"),
            &common::fixture(FIRST),
        );
    }
}

#[test]
fn a_missing_part_or_a_later_part_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let first = dir.path().join(FIRST);
    std::fs::copy(common::fixture(FIRST), &first).expect("copy");
    let e = GgufFile::open(&first)
        .expect_err("missing part")
        .to_string();
    assert!(e.contains(SECOND), "{e}");
    let e = GgufFile::open(common::fixture(SECOND))
        .expect_err("second part")
        .to_string();
    assert!(e.contains("part 2 of 2") && e.contains("first part"), "{e}");
    // Renamed so the parts cannot be found: said so.
    let renamed = dir.path().join("model.gguf");
    std::fs::copy(common::fixture(FIRST), &renamed).expect("copy");
    let e = GgufFile::open(&renamed).expect_err("renamed").to_string();
    assert!(e.contains("-00001-of-00002.gguf"), "{e}");
}
