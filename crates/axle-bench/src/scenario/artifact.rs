//! The artifact of a scenario run: what ran, where, the raw figures and what the checks found.
use crate::stats::median;
use crate::BenchError;
use axle_sdk::RuntimeReport;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// Version of the artifact format.
pub const SCHEMA: u32 = 1;

/// One run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Artifact {
    /// Artifact format version.
    pub schema: u32,
    /// The manifest's name.
    pub scenario: String,
    /// The manifest's description.
    pub description: String,
    /// The manifest as it was run (resolved, so the artifact stands alone).
    pub manifest: super::Manifest,
    /// Seconds since the Unix epoch at the start.
    pub started_unix: u64,
    /// Wall time of the whole run (seconds).
    pub wall_s: f64,
    /// Where it ran.
    pub environment: Environment,
    /// The route that served it.
    pub runtime: RuntimeReport,
    /// The measurements.
    pub rows: Vec<Row>,
    /// The checks.
    pub checks: Vec<CheckResult>,
    /// All checks passed.
    pub passed: bool,
}

/// Machine, build and model.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Environment {
    /// CPU model name.
    pub cpu_model: String,
    /// CPU features ggml was built with and uses.
    pub cpu_features: Vec<String>,
    /// Logical CPUs.
    pub cpus: usize,
    /// Threads the scenario used.
    pub threads: usize,
    /// OS and architecture.
    pub os: String,
    /// Kernel release.
    pub kernel: String,
    /// Build profile and flags.
    pub build: String,
    /// Axle's version.
    pub axle_version: String,
    /// `git rev-parse HEAD` of the working tree (with `-dirty` when it has changes).
    pub git_commit: String,
    /// The model file.
    pub model_path: String,
    /// Its size in bytes.
    pub model_bytes: u64,
    /// Its sha256.
    pub model_sha256: String,
    /// Peak resident memory of the process at the end (MiB).
    pub peak_rss_mib: f64,
}

/// One measured figure (one workload, one metric), raw per repetition and as medians.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    /// Workload name (`pp512`, `seqs=4`, `code-rewrite`, ...).
    pub workload: String,
    /// Metric (`prefill_tok_s`, `decode_tok_s`, `ttft_ms`, ...).
    pub metric: String,
    /// Unit.
    pub unit: String,
    /// Whether more is better (tok/s) or less (ms).
    pub higher_is_better: bool,
    /// Axle, per repetition.
    pub axle: Vec<f64>,
    /// Median of `axle`.
    pub axle_median: f64,
    /// What Axle is compared with (`libllama`, `no speculation`, ...), if anything.
    pub reference_name: Option<String>,
    /// The reference, per repetition.
    pub reference: Vec<f64>,
    /// Median of `reference`.
    pub reference_median: Option<f64>,
    /// Axle / reference (for lower-is-better metrics: reference / Axle), so > 1 means Axle wins.
    pub ratio: Option<f64>,
    /// Other per-row figures (acceptance rate, mean accepted length, ...).
    #[serde(default)]
    pub extra: BTreeMap<String, f64>,
}

impl Row {
    /// A row from raw samples.
    pub fn new(
        workload: impl Into<String>,
        metric: &str,
        axle: Vec<f64>,
        reference: Option<(&str, Vec<f64>)>,
    ) -> Row {
        let (unit, higher_is_better) = unit_of(metric);
        let axle_median = median(&axle);
        let (reference_name, reference) = match reference {
            Some((n, r)) => (Some(n.to_string()), r),
            None => (None, Vec::new()),
        };
        let reference_median = (!reference.is_empty()).then(|| median(&reference));
        let ratio = reference_median.map(|r| {
            if higher_is_better {
                axle_median / r
            } else {
                r / axle_median
            }
        });
        Row {
            workload: workload.into(),
            metric: metric.into(),
            unit: unit.into(),
            higher_is_better,
            axle,
            axle_median,
            reference_name,
            reference,
            reference_median,
            ratio,
            extra: BTreeMap::new(),
        }
    }

    /// Adds an extra figure.
    pub fn with(mut self, key: &str, v: f64) -> Row {
        self.extra.insert(key.into(), v);
        self
    }
}

fn unit_of(metric: &str) -> (&'static str, bool) {
    if metric.ends_with("_tok_s") {
        ("tok/s", true)
    } else if metric.ends_with("_ms") {
        ("ms", false)
    } else if metric.ends_with("_mib") {
        ("MiB", false)
    } else {
        ("", true)
    }
}

/// One check's outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckResult {
    /// `correctness`, `determinism`, `route`, `regression` or `products` (a batched workload's
    /// device products, asked for and chosen).
    pub kind: String,
    /// Whether it passed.
    pub passed: bool,
    /// What was compared and what was found.
    pub detail: String,
}

impl Artifact {
    /// Writes the artifact as pretty JSON.
    pub fn save(&self, path: &Path) -> Result<(), BenchError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| io(path, e))?;
        }
        let text =
            serde_json::to_string_pretty(self).map_err(|e| BenchError::Invalid(e.to_string()))?;
        std::fs::write(path, text + "\n").map_err(|e| io(path, e))
    }

    /// Reads an artifact.
    pub fn load(path: &Path) -> Result<Artifact, BenchError> {
        let text = std::fs::read_to_string(path).map_err(|e| io(path, e))?;
        let a: Artifact = serde_json::from_str(&text).map_err(|e| {
            BenchError::Invalid(format!("{}: not an artifact: {e}", path.display()))
        })?;
        if a.schema != SCHEMA {
            return Err(BenchError::Invalid(format!(
                "{}: artifact schema {} (this axle reads {SCHEMA})",
                path.display(),
                a.schema
            )));
        }
        Ok(a)
    }
}

fn io(path: &Path, e: std::io::Error) -> BenchError {
    BenchError::Invalid(format!("{}: {e}", path.display()))
}

/// Compares `current` with `baseline`: every metric in both (or those named), by median, must not
/// be worse than the baseline by more than `tolerance` (relative).
pub fn regression(
    current: &[Row],
    baseline: &Artifact,
    tolerance: f64,
    metrics: &[String],
) -> CheckResult {
    let mut compared = 0;
    let mut worse = Vec::new();
    for row in current {
        if !metrics.is_empty() && !metrics.contains(&row.metric) {
            continue;
        }
        let Some(base) = baseline
            .rows
            .iter()
            .find(|b| b.workload == row.workload && b.metric == row.metric)
        else {
            continue;
        };
        compared += 1;
        let (now, then) = (row.axle_median, base.axle_median);
        let rel = if row.higher_is_better {
            now / then
        } else {
            then / now
        };
        // NaN (a zero or missing figure) counts as worse.
        if rel.is_nan() || rel < 1.0 - tolerance {
            worse.push(format!(
                "{} {}: {now:.2} vs baseline {then:.2} ({:+.1} %)",
                row.workload,
                row.metric,
                (rel - 1.0) * 100.0
            ));
        }
    }
    let passed = compared > 0 && worse.is_empty();
    let detail = if compared == 0 {
        format!(
            "no metric in common with the baseline `{}`",
            baseline.scenario
        )
    } else if worse.is_empty() {
        format!(
            "{compared} metrics within {:.0} % of the baseline ({} at {})",
            tolerance * 100.0,
            baseline.scenario,
            baseline.environment.git_commit
        )
    } else {
        format!(
            "{} of {compared} metrics worse than the baseline by more than {:.0} %: {}",
            worse.len(),
            tolerance * 100.0,
            worse.join("; ")
        )
    };
    CheckResult {
        kind: "regression".into(),
        passed,
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_say_more_is_better_for_axle() {
        let r = Row::new(
            "tg",
            "decode_tok_s",
            vec![10.0, 12.0, 11.0],
            Some(("ref", vec![10.0])),
        );
        assert_eq!(r.ratio, Some(1.1));
        let r = Row::new("p", "ttft_ms", vec![50.0], Some(("uncached", vec![100.0])));
        assert_eq!(r.ratio, Some(2.0));
        assert!(!r.higher_is_better && r.unit == "ms");
    }
}
