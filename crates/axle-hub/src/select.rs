//! Which files of a repository make the model: one quantization's GGUF file (all its split
//! parts), or a safetensors folder (weights, index, config, tokenizer, chat template).
use crate::HubError;
use std::collections::BTreeMap;

/// How the weights are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One GGUF file, or its split parts.
    Gguf,
    /// A folder of safetensors shards with config.json and the tokenizer.
    Safetensors,
}

impl Format {
    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Format::Gguf => "gguf",
            Format::Safetensors => "safetensors",
        }
    }
}

/// The files chosen from a repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// How the weights are stored.
    pub format: Format,
    /// Repository paths, in the order to fetch them.
    pub files: Vec<String>,
    /// The quantization's label (GGUF), as the file names spell it.
    pub quant: Option<String>,
}

impl Selection {
    /// The file a loader opens: the (first part of the) GGUF; for a folder, none.
    pub fn entry(&self) -> Option<&str> {
        match self.format {
            Format::Gguf => self.files.first().map(String::as_str),
            Format::Safetensors => None,
        }
    }
}

/// The quantization picked when the reference names none and the repository has several,
/// in order of preference (what llama.cpp's `-hf` picks first).
const PREFERRED: [&str; 4] = ["Q4_K_M", "Q4_0", "Q8_0", "F16"];

/// Files of a safetensors folder besides the shards (those present are taken).
const FOLDER_FILES: [&str; 11] = [
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
];

/// One GGUF model of a repository: its files (split parts in order) and label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufGroup {
    /// `Q4_K_M`, or the file stem when no quantization can be read from the name.
    pub label: String,
    /// The files, first part first.
    pub files: Vec<String>,
}

/// The GGUF models among `files`, by file stem without the split suffix (projector files for
/// vision towers, `mmproj*`, are not models).
pub fn gguf_groups(files: &[String]) -> Vec<GgufGroup> {
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in files {
        let Some(stem) = f.strip_suffix(".gguf") else {
            continue;
        };
        let base = f.rsplit('/').next().unwrap_or(f);
        if base.to_ascii_lowercase().contains("mmproj") {
            continue;
        }
        groups
            .entry(split_base(stem).to_string())
            .or_default()
            .push(f.clone());
    }
    groups
        .into_iter()
        .map(|(stem, mut files)| {
            files.sort();
            GgufGroup {
                label: quant_label(&stem)
                    .unwrap_or_else(|| stem.rsplit('/').next().unwrap_or(&stem).to_string()),
                files,
            }
        })
        .collect()
}

/// `name-00001-of-00003` → `name`.
fn split_base(stem: &str) -> &str {
    let bytes = stem.as_bytes();
    let n = bytes.len();
    let digits = |s: &[u8]| s.len() == 5 && s.iter().all(u8::is_ascii_digit);
    if n > 15
        && &bytes[n - 9..n - 5] == b"-of-"
        && bytes[n - 15] == b'-'
        && digits(&bytes[n - 14..n - 9])
        && digits(&bytes[n - 5..])
    {
        return &stem[..n - 15];
    }
    stem
}

/// The quantization named in a file stem (`Llama-3-8B-Q4_K_M` → `Q4_K_M`,
/// `Q8_0/model` → `Q8_0`): the last token that looks like one.
fn quant_label(stem: &str) -> Option<String> {
    stem.split(['-', '.', '/'])
        .rev()
        .map(|t| t.to_ascii_uppercase())
        .find(|t| is_quant(t))
}

fn is_quant(token: &str) -> bool {
    let rest = token
        .strip_prefix("IQ")
        .or_else(|| token.strip_prefix("TQ"))
        .or_else(|| token.strip_prefix('Q'));
    match rest {
        Some(r) => r.starts_with(|c: char| c.is_ascii_digit()),
        None => matches!(token, "F16" | "BF16" | "F32") || token.starts_with("MXFP4"),
    }
}

/// Chooses the model's files from a repository listing, as `quant` asks.
pub fn select(repo: &str, files: &[String], quant: Option<&str>) -> Result<Selection, HubError> {
    let groups = gguf_groups(files);
    if !groups.is_empty() {
        let labels = || {
            groups
                .iter()
                .map(|g| g.label.clone())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let pick = match quant {
            Some(q) => groups
                .iter()
                .find(|g| g.label.eq_ignore_ascii_case(q))
                .ok_or_else(|| HubError::NoSuchQuant {
                    repo: repo.to_string(),
                    quant: q.to_string(),
                    available: labels(),
                })?,
            None if groups.len() == 1 => &groups[0],
            None => PREFERRED
                .iter()
                .find_map(|p| groups.iter().find(|g| g.label == *p))
                .ok_or_else(|| HubError::ChooseQuant {
                    repo: repo.to_string(),
                    available: labels(),
                })?,
        };
        return Ok(Selection {
            format: Format::Gguf,
            files: pick.files.clone(),
            quant: Some(pick.label.clone()),
        });
    }
    let top_level = |f: &&String| !f.contains('/');
    let mut shards: Vec<String> = files
        .iter()
        .filter(top_level)
        .filter(|f| f.ends_with(".safetensors") && !f.starts_with("consolidated"))
        .cloned()
        .collect();
    if shards.is_empty() {
        return Err(HubError::NoWeights {
            repo: repo.to_string(),
        });
    }
    if let Some(q) = quant {
        return Err(HubError::NoSuchQuant {
            repo: repo.to_string(),
            quant: q.to_string(),
            available: "none: it is a safetensors repository, taken whole".into(),
        });
    }
    shards.sort();
    let mut chosen: Vec<String> = FOLDER_FILES
        .iter()
        .filter(|name| files.iter().any(|f| f == *name))
        .map(|name| name.to_string())
        .collect();
    chosen.extend(shards);
    Ok(Selection {
        format: Format::Safetensors,
        files: chosen,
        quant: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn one_quantization_with_its_split_parts() {
        let files = names(&[
            "README.md",
            "M-Q4_K_M.gguf",
            "M-Q8_0-00002-of-00002.gguf",
            "M-Q8_0-00001-of-00002.gguf",
            "mmproj-M-F16.gguf",
            "BF16/M-BF16-00001-of-00003.gguf",
        ]);
        let s = select("o/m", &files, Some("q8_0")).unwrap();
        assert_eq!(s.format, Format::Gguf);
        assert_eq!(
            s.files,
            names(&["M-Q8_0-00001-of-00002.gguf", "M-Q8_0-00002-of-00002.gguf"])
        );
        assert_eq!(s.entry(), Some("M-Q8_0-00001-of-00002.gguf"));
        let s = select("o/m", &files, None).unwrap();
        assert_eq!(s.files, names(&["M-Q4_K_M.gguf"]));
        let s = select("o/m", &files, Some("BF16")).unwrap();
        assert_eq!(s.files, names(&["BF16/M-BF16-00001-of-00003.gguf"]));
        let e = select("o/m", &files, Some("Q5_K_S"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("Q5_K_S") && e.contains("Q4_K_M, Q8_0") && e.contains("BF16"),
            "{e}"
        );
    }

    #[test]
    fn several_quantizations_without_a_preferred_one_ask() {
        let files = names(&["m-IQ2_XS.gguf", "m-Q6_K.gguf"]);
        let e = select("o/m", &files, None).unwrap_err().to_string();
        assert!(e.contains("IQ2_XS, Q6_K") && e.contains("o/m:"), "{e}");
        let one = select("o/m", &names(&["model.gguf"]), None).unwrap();
        assert_eq!((one.quant.as_deref(), one.files.len()), (Some("model"), 1));
    }

    #[test]
    fn safetensors_folder() {
        let files = names(&[
            ".gitattributes",
            "config.json",
            "model-00002-of-00002.safetensors",
            "model-00001-of-00002.safetensors",
            "model.safetensors.index.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "consolidated.safetensors",
            "original/model.safetensors",
        ]);
        let s = select("o/m", &files, None).unwrap();
        assert_eq!(s.format, Format::Safetensors);
        assert_eq!(
            s.files,
            names(&[
                "config.json",
                "model.safetensors.index.json",
                "tokenizer.json",
                "tokenizer_config.json",
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors",
            ])
        );
        assert!(select("o/m", &files, Some("Q4_0")).is_err());
        let e = select("o/m", &names(&["README.md"]), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no GGUF or safetensors"), "{e}");
    }
}
