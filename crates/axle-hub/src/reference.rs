//! What users write for a model: a local path, or a Hub repository with an optional
//! quantization and revision (`org/repo`, `org/repo:Q4_K_M`, `hf:org/repo@main`).
use crate::HubError;
use std::fmt;
use std::path::{Path, PathBuf};

/// A model reference: a local file or folder, or a repository on the Hub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelRef {
    /// A path on this machine.
    Path(PathBuf),
    /// A Hub repository.
    Hub(HubId),
}

impl ModelRef {
    /// Reads a reference. An existing path is a path; `hf:`, `hf://` and Hub URLs are Hub ids;
    /// otherwise a name shaped like `org/repo[:QUANT][@REVISION]` (and not naming a `.gguf` file)
    /// is a Hub id and anything else a path (whose absence the loader reports).
    pub fn parse(text: &str) -> Result<ModelRef, HubError> {
        for prefix in ["hf://", "hf:", "https://huggingface.co/"] {
            if let Some(rest) = text.strip_prefix(prefix) {
                return HubId::parse(rest).map(ModelRef::Hub);
            }
        }
        if Path::new(text).exists() || text.ends_with(".gguf") || text.starts_with(['.', '/']) {
            return Ok(ModelRef::Path(PathBuf::from(text)));
        }
        match HubId::parse(text) {
            Ok(id) => Ok(ModelRef::Hub(id)),
            Err(_) => Ok(ModelRef::Path(PathBuf::from(text))),
        }
    }
}

/// A Hub repository, optionally narrowed to one GGUF quantization and pinned to a revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubId {
    /// `org/name`.
    pub repo: String,
    /// The GGUF quantization asked for (`Q4_K_M`), matched against the files' names.
    pub quant: Option<String>,
    /// Branch, tag or commit (`main` unless given).
    pub revision: String,
}

impl HubId {
    /// Parses `org/repo[:QUANT][@REVISION]`.
    pub fn parse(text: &str) -> Result<HubId, HubError> {
        let bad = |why: &str| HubError::BadId {
            id: text.to_string(),
            why: why.to_string(),
        };
        let (repo, rest) = match text.find([':', '@']) {
            Some(i) => (&text[..i], &text[i..]),
            None => (text, ""),
        };
        let (quant, revision) = if let Some(r) = rest.strip_prefix(':') {
            match r.split_once('@') {
                Some((q, rev)) => (Some(q), Some(rev)),
                None => (Some(r), None),
            }
        } else {
            (None, rest.strip_prefix('@'))
        };
        let mut parts = repo.split('/');
        let (Some(org), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad("a Hub id is `org/name`"));
        };
        for part in [org, name] {
            let ok_chars = part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            if part.is_empty()
                || part.len() > 96
                || !ok_chars
                || part.contains("--")
                || part.contains("..")
                || part.starts_with(['-', '.'])
                || part.ends_with(['-', '.'])
            {
                return Err(bad(
                    "names are 1-96 letters, digits, `-`, `_` or `.`, without `--` or `..`",
                ));
            }
        }
        if let Some(q) = quant {
            if q.is_empty() || !q.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(bad("a quantization is letters, digits and `_` (`Q4_K_M`)"));
            }
        }
        let revision = revision.unwrap_or("main");
        let rev_ok = revision
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
        if revision.is_empty() || revision.len() > 255 || !rev_ok || revision.contains("..") {
            return Err(bad("a revision is a branch, tag or commit"));
        }
        Ok(HubId {
            repo: repo.to_string(),
            quant: quant.map(str::to_string),
            revision: revision.to_string(),
        })
    }

    /// The same repository and revision without the quantization.
    pub fn repo_only(&self) -> HubId {
        HubId {
            quant: None,
            ..self.clone()
        }
    }
}

impl fmt::Display for HubId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.repo)?;
        if let Some(q) = &self.quant {
            write!(f, ":{q}")?;
        }
        if self.revision != "main" {
            write!(f, "@{}", self.revision)?;
        }
        Ok(())
    }
}

/// Whether a revision is a full commit id.
pub(crate) fn is_commit(revision: &str) -> bool {
    revision.len() == 40 && revision.chars().all(|c| c.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub(text: &str) -> HubId {
        match ModelRef::parse(text).expect("parses") {
            ModelRef::Hub(id) => id,
            other => panic!("{text}: {other:?}"),
        }
    }

    #[test]
    fn ids_with_quantization_and_revision() {
        let id = hub("bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M");
        assert_eq!(id.repo, "bartowski/Llama-3.2-1B-Instruct-GGUF");
        assert_eq!(id.quant.as_deref(), Some("Q4_K_M"));
        assert_eq!(id.revision, "main");
        let id = hub("hf:org/m.v2:q8_0@refs/pr/3");
        assert_eq!(
            (id.repo.as_str(), id.quant.as_deref(), id.revision.as_str()),
            ("org/m.v2", Some("q8_0"), "refs/pr/3")
        );
        let id = hub("https://huggingface.co/org/model@v1.0");
        assert_eq!((id.quant, id.revision.as_str()), (None, "v1.0"));
        assert_eq!(hub("org/m:Q4_0@dev").to_string(), "org/m:Q4_0@dev");
    }

    #[test]
    fn paths_stay_paths() {
        for text in [
            "model.gguf",
            "./org/model",
            "/abs/org/model",
            "dir/file.gguf",
            "a/b/c",
        ] {
            assert!(
                matches!(ModelRef::parse(text), Ok(ModelRef::Path(_))),
                "{text}"
            );
        }
    }

    #[test]
    fn malformed_ids_are_refused_by_name() {
        for text in [
            "hf:org",
            "hf:org/a/b",
            "hf:org--x/m",
            "hf:org/m:",
            "hf:org/m:Q4 K",
            "hf:-o/m",
        ] {
            let e = ModelRef::parse(text).expect_err(text).to_string();
            assert!(e.contains(text.trim_start_matches("hf:")), "{text}: {e}");
        }
    }
}
