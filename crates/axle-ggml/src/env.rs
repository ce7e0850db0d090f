//! Every environment variable Axle reads (or sets for ggml), declared once: name, meaning, default
//! and who reads it. Code reads them through [`var`] and [`var_os`], which refuse a name the
//! registry does not list (a test scans the sources for reads that bypass it), and `axle doctor`
//! lists them with their values. Options passed in code come first: a variable only fills in
//! where the caller named nothing.

/// One variable.
#[derive(Debug, Clone, Copy)]
pub struct EnvVar {
    /// Its name.
    pub name: &'static str,
    /// What it does.
    pub meaning: &'static str,
    /// What holds when it is unset.
    pub default: &'static str,
    /// Where it is read.
    pub read_by: &'static str,
}

/// The registry.
pub const REGISTRY: &[EnvVar] = &[
    EnvVar {
        name: "AXLE_BACKENDS_DIR",
        meaning: "folder of ggml's loadable backends (libggml-cuda.so, libggml-rpc.so)",
        default: "the binary's folder and its backends/ subfolder",
        read_by: "axle-ggml backend.rs",
    },
    EnvVar {
        name: "AXLE_GGML_LOG",
        meaning: "set: ggml's and llama.cpp's log lines go to stderr",
        default: "quiet (ggml errors are still captured for error messages)",
        read_by: "axle-ggml log.rs",
    },
    EnvVar {
        name: "AXLE_TRACE_NODES",
        meaning: "file to which every computed graph node's name, op and shape is appended",
        default: "no trace",
        read_by: "axle-ggml backend.rs",
    },
    EnvVar {
        name: "GGML_CUDA_PDL",
        meaning: "ggml's programmatic dependent launch on CUDA; Axle sets it to 0 unless set",
        default: "0 (set by Axle for its process)",
        read_by: "axle-ggml backend.rs, ggml's CUDA backend",
    },
    EnvVar {
        name: "AXLE_MODEL_DIR",
        meaning: "folder of the real test models",
        default: "$XDG_CACHE_HOME/axle/models or ~/.cache/axle/models",
        read_by: "axle-models fetched.rs",
    },
    EnvVar {
        name: "AXLE_FUSED_PROJECTIONS",
        meaning: "0: no fused QKV and gate-up products where the model options name none",
        default: "fused where the device takes them",
        read_by: "axle-models model.rs",
    },
    EnvVar {
        name: "AXLE_DEVICE_PRODUCTS",
        meaning: "groups, wide or columns: the device products where the options name none",
        default: "by device and engine size",
        read_by: "axle-models device_step.rs",
    },
    EnvVar {
        name: "AXLE_GRAPH_SLOTS",
        meaning: "step shapes whose graphs a runner keeps, where the options name none",
        default: "11 with an accelerator, 1 without",
        read_by: "axle-models runner/graph.rs",
    },
    EnvVar {
        name: "AXLE_PRODUCTS_PROBE",
        meaning: "0: skip the load-time check of the device products (a diagnostic)",
        default: "the check runs",
        read_by: "axle-models runner/products.rs",
    },
    EnvVar {
        name: "AXLE_STACKED_ROWS",
        meaning: "0: no stacked one-row attention ops (a diagnostic, to compare)",
        default: "stacked where the device gives each row the same bits",
        read_by: "axle-models runner/arithmetic.rs",
    },
    EnvVar {
        name: "AXLE_HOST_KERNELS",
        meaning: "origin, compatible or tiled for the step_cost example",
        default: "origin",
        read_by: "axle-models examples/step_cost.rs",
    },
    EnvVar {
        name: "AXLE_KEEP_STATES",
        meaning: "set: the step_cost example keeps every recurrent state",
        default: "the states a verify step needs",
        read_by: "axle-models examples/step_cost.rs",
    },
    EnvVar {
        name: "AXLE_GIT_COMMIT",
        meaning: "the commit benchmark artifacts are stamped with, where git cannot say",
        default: "git rev-parse HEAD",
        read_by: "axle-bench scenario",
    },
    EnvVar {
        name: "AXLE_PDL",
        meaning: "0: Axle's CUDA product kernels launch without programmatic dependent launch",
        default: "as ggml launches its own",
        read_by: "axle-kernels cuda/column-invariant-mmvq.cu",
    },
    EnvVar {
        name: "AXLE_CI_MMA",
        meaning: "0: the column-invariant Q4_0 products skip their tensor-core variant",
        default: "tensor cores where the device has them",
        read_by: "axle-kernels cuda/column-invariant-mmvq.cu",
    },
    EnvVar {
        name: "AXLE_CI_Q6K",
        meaning: "0: Q6_K weights take the generic column-invariant kernel, not their own",
        default: "their own kernel (the same bits)",
        read_by: "axle-kernels cuda/column-invariant-mmvq.cu",
    },
    EnvVar {
        name: "AXLE_CI_SHAPE",
        meaning: "CxR[oN]: the column-invariant kernel's block shape (for measurements)",
        default: "8x4, 16x2 for Q6_K",
        read_by: "axle-kernels cuda/column-invariant-mmvq.cu",
    },
    EnvVar {
        name: "AXLE_WIDE_REPLAY",
        meaning: "0: the CUDA backend does not replay MMQ for a few columns",
        default: "replayed",
        read_by: "axle-kernels cuda/wide-replay-mmq.cu",
    },
    EnvVar {
        name: "AXLE_WR_ROWS",
        meaning: "output rows a block of the MMQ replay computes (for measurements)",
        default: "by weight type",
        read_by: "axle-kernels cuda/wide-replay-mmq.cu",
    },
];

/// The registry's entry for `name`.
pub fn lookup(name: &str) -> Option<&'static EnvVar> {
    REGISTRY.iter().find(|v| v.name == name)
}

/// `std::env::var(name)`, for a registered name (panics on an unregistered one: a programming
/// error, caught by the tests).
pub fn var(name: &str) -> Option<String> {
    assert!(
        lookup(name).is_some(),
        "{name} is not in axle_ggml::env::REGISTRY"
    );
    std::env::var(name).ok()
}

/// `std::env::var_os(name)`, for a registered name.
pub fn var_os(name: &str) -> Option<std::ffi::OsString> {
    assert!(
        lookup(name).is_some(),
        "{name} is not in axle_ggml::env::REGISTRY"
    );
    std::env::var_os(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// Every variable the sources read (`var("..")`, `var_os("..")`, `getenv("..")`) is in the
    /// registry, and every registered name is read somewhere.
    #[test]
    fn every_variable_read_is_registered() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        let mut stack = vec![root.clone()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).expect("crates folder") {
                let p = e.expect("entry").path();
                if p.is_dir() {
                    stack.push(p);
                } else if p
                    .extension()
                    .is_some_and(|x| x == "rs" || x == "cu" || x == "cuh")
                {
                    files.push(p);
                }
            }
        }
        let mut read = std::collections::BTreeSet::new();
        for f in &files {
            if f.ends_with("env.rs") {
                continue;
            }
            let text = std::fs::read_to_string(f).expect("source");
            for pat in ["var(\"", "var_os(\"", "getenv(\""] {
                for (at, _) in text.match_indices(pat) {
                    let rest = &text[at + pat.len()..];
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                        .collect();
                    if (name.starts_with("AXLE_") || name.starts_with("GGML_"))
                        && rest[name.len()..].starts_with('"')
                        && !f.components().any(|c| c.as_os_str() == "tests")
                    {
                        read.insert((name, f.display().to_string()));
                    }
                }
            }
        }
        let doc = std::fs::read_to_string(root.join("../docs/environment.md")).expect("docs");
        for v in REGISTRY {
            assert!(
                doc.contains(&format!("`{}`", v.name)),
                "docs/environment.md lacks {}",
                v.name
            );
        }
        let missing: Vec<_> = read.iter().filter(|(n, _)| lookup(n).is_none()).collect();
        assert!(missing.is_empty(), "read but not registered: {missing:?}");
        for v in REGISTRY {
            assert!(
                read.iter().any(|(n, _)| n == v.name),
                "{} is registered but read nowhere",
                v.name
            );
        }
    }
}
