//! Where the CPU reads weights from (`HostMemory`): a copy in transparent huge pages (the
//! default) or the file's pages in place. The bytes and kernels are the same, so a prompt,
//! decode steps and a verify step must give the same logits bit for bit either way; and where
//! this system hands out huge pages, the default must actually have taken them.
mod common;

use axle_ggml::huge_pages::huge_pages_offered;
use axle_models::{HostMemory, Model, ModelOptions};
use std::path::Path;
use std::sync::Arc;

fn load(path: &Path, host_memory: HostMemory, repack: bool) -> Arc<Model> {
    Arc::new(
        Model::load(
            path,
            &ModelOptions {
                host_memory,
                repack,
                ..ModelOptions::cpu(2)
            },
        )
        .unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
}

fn check(path: &Path, repack: bool) {
    let huge = load(path, HostMemory::HugePages, repack);
    assert_eq!(
        huge.weights_in_huge_pages(),
        huge_pages_offered(),
        "{}: huge pages taken where offered",
        path.display()
    );
    let mapped = load(path, HostMemory::Mapped, repack);
    assert!(!mapped.weights_in_huge_pages());
    common::assert_same_step_logits(huge, mapped, path);
}

#[test]
fn smollm2_logits_same_in_huge_pages_and_mapped() {
    check(&common::model(common::SMOLLM2), false);
}

/// Repacked: the repacking buffers are advised too, and the tied head's copy is repacked.
#[test]
fn gemma3_repacked_logits_same_in_huge_pages_and_mapped() {
    check(&common::model(common::GEMMA3), true);
}

#[test]
fn host_memory_names_parse_and_print() {
    for (name, v) in [
        ("huge-pages", HostMemory::HugePages),
        ("mapped", HostMemory::Mapped),
    ] {
        assert_eq!(name.parse::<HostMemory>().unwrap(), v);
        assert_eq!(v.to_string(), name);
    }
    let err = "hugepages".parse::<HostMemory>().unwrap_err();
    assert!(err.contains("huge-pages or mapped"), "{err}");
}
