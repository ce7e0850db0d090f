//! Reports of artifacts: a Markdown table per run (or one comparing runs of a scenario), a bar
//! chart (SVG) of Axle beside its reference, and the README sections they fill.
//!
//! The chart is written as SVG by hand: plotters needs a system font to draw any text, and a
//! bar chart is a few rectangles and labels.
use super::Artifact;
use crate::stats::markdown_table;
use crate::BenchError;
use std::fmt::Write;
use std::path::Path;

fn fmt(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Extras rendered in tables of their own rather than in the "other" column.
fn own_table(key: &str) -> bool {
    key.starts_with("verify_")
        || key.starts_with("accept_pos")
        || key.starts_with("llama_server_")
        || key.starts_with("step_")
}

/// Where a step's time goes (compare runs): Axle's phases per step beside libllama's time for the
/// same tokens, in microseconds (a decode row's steps are its tokens, a prefill row's its chunks).
fn step_table(a: &Artifact) -> Option<String> {
    let phases = super::workloads::STEP_PHASES;
    let rows: Vec<Vec<String>> = a
        .rows
        .iter()
        .filter(|r| r.extra.contains_key("step_compute_us"))
        .map(|r| {
            let get = |k: &str| r.extra.get(k).copied().unwrap_or(0.0);
            let mut row = vec![r.workload.clone()];
            let mut total = 0.0;
            for p in phases {
                let v = get(&format!("step_{p}_us"));
                total += v;
                row.push(format!("{v:.0}"));
            }
            row.push(format!("{total:.0}"));
            row.push(format!("{:.0}", get("step_llama_us")));
            row.push(format!("{:.3}", get("step_builds")));
            row
        })
        .collect();
    if rows.is_empty() {
        return None;
    }
    Some(format!(
        "\nWhere a step's time goes (microseconds per step: a decode step, or a prefill chunk; prepare: block tables, positions and masks on the host; build: graph building and allocation, amortized; inputs: uploads; compute: the graph until the device is done; logits: the read-back):\n\n{}",
        markdown_table(
            &["workload", "prepare", "build", "inputs", "compute", "logits", "Axle step", "libllama, same tokens", "graphs built per step"],
            &rows
        )
    ))
}

/// Where the steps of the verify-cost measurement spent their time (n-gram runs), by draft
/// length, in microseconds per step.
fn verify_step_table(a: &Artifact) -> Option<String> {
    let extras = a
        .rows
        .iter()
        .map(|r| &r.extra)
        .find(|e| e.contains_key("verify_step_k0_compute_us"))?;
    let row = |label: String, key: &str| {
        let get = |p: &str| extras.get(&format!("verify_step_{key}_{p}_us")).copied();
        get("compute")?;
        let vals: Vec<f64> = super::workloads::STEP_PHASES
            .iter()
            .map(|p| get(p).unwrap_or(0.0))
            .collect();
        let mut row = vec![label];
        row.extend(vals.iter().map(|v| format!("{v:.0}")));
        row.push(format!("{:.0}", vals.iter().sum::<f64>()));
        Some(row)
    };
    let rows: Vec<Vec<String>> = (0..)
        .map_while(|k| row(k.to_string(), &format!("k{k}")))
        .chain(row("plain run (every step)".into(), "plain"))
        .collect();
    Some(format!(
        "\nWhere the verify-cost measurement's steps spent their time (microseconds per step; k drafts, k + 1 rows of one sequence; phases as in the step tables), and the plain engine's steps over the whole run (prefill chunks included):\n\n{}",
        markdown_table(
            &["k", "prepare", "build", "inputs", "compute", "logits", "step"],
            &rows
        )
    ))
}

/// The extras of each row under `prefix`, as (suffix, value), in the order of their suffixes.
fn extras_with<'a>(r: &'a super::artifact::Row, prefix: &str) -> Vec<(&'a str, f64)> {
    r.extra
        .iter()
        .filter_map(|(k, v)| k.strip_prefix(prefix).map(|s| (s, *v)))
        .collect()
}

/// For n-gram runs (workloads named `NAME (KIND)`): the median ratio of each kind and the lowest
/// ratio of each kind, the figures the speculation bars are stated in.
fn ngram_summary(a: &Artifact) -> Option<String> {
    let mut kinds: Vec<(String, Vec<f64>)> = Vec::new();
    for r in &a.rows {
        let (Some(kind), Some(ratio)) = (
            r.workload
                .rsplit_once(" (")
                .and_then(|(_, k)| k.strip_suffix(')'))
                .filter(|k| k.ends_with("-hit")),
            r.ratio,
        ) else {
            continue;
        };
        match kinds.iter_mut().find(|(k, _)| k == kind) {
            Some((_, v)) => v.push(ratio),
            None => kinds.push((kind.to_string(), vec![ratio])),
        }
    }
    if kinds.is_empty() {
        return None;
    }
    let parts: Vec<String> = kinds
        .iter()
        .map(|(k, v)| {
            let lowest = v.iter().copied().fold(f64::INFINITY, f64::min);
            format!(
                "{k}: median ratio {:.3}, lowest {lowest:.3}",
                crate::stats::median(v)
            )
        })
        .collect();
    Some(format!(
        "Speculation over no speculation, by workload kind: {}",
        parts.join("; ")
    ))
}

/// A table of its own after the main one: a blank line, `title` and a colon, a blank line, then
/// the table.
fn titled_table(title: &str, header: &[String], rows: &[Vec<String>]) -> String {
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    format!("\n{title}:\n\n{}", markdown_table(&header, rows))
}

/// Conditional acceptance by draft position, one row per workload (n-gram runs).
fn acceptance_table(a: &Artifact) -> Option<String> {
    let n = a
        .rows
        .iter()
        .map(|r| extras_with(r, "accept_pos").len())
        .max()
        .filter(|&n| n > 0)?;
    let mut header = vec!["workload".to_string()];
    header.extend((1..=n).map(|j| format!("draft pos {j}")));
    let rows: Vec<Vec<String>> = a
        .rows
        .iter()
        .map(|r| {
            let mut row = vec![r.workload.clone()];
            for j in 1..=n {
                row.push(
                    r.extra
                        .get(&format!("accept_pos{j}"))
                        .map_or("-".into(), |v| format!("{v:.2}")),
                );
            }
            row
        })
        .collect();
    Some(titled_table(
        "Acceptance by draft position (share of checks of that position that were accepted, given every earlier one was)",
        &header,
        &rows,
    ))
}

/// llama-server's own n-gram modes on the same prompts, beside Axle's ratio (n-gram runs given a
/// llama-server binary).
fn llama_server_table(a: &Artifact) -> Option<String> {
    let mut modes: Vec<String> = Vec::new();
    for r in &a.rows {
        for (k, _) in extras_with(r, "llama_server_") {
            if let Some(m) = k.strip_suffix("_ratio") {
                if !modes.iter().any(|x| x == m) {
                    modes.push(m.to_string());
                }
            }
        }
    }
    if modes.is_empty() {
        return None;
    }
    let mut header = vec![
        "workload".to_string(),
        "Axle ratio".into(),
        "llama-server plain (tok/s)".into(),
    ];
    header.extend(
        modes
            .iter()
            .map(|m| format!("{} (tok/s, ratio, acc.)", m.replace('_', "-"))),
    );
    let rows: Vec<Vec<String>> = a
        .rows
        .iter()
        .map(|r| {
            let get = |k: &str| r.extra.get(&format!("llama_server_{k}")).copied();
            let mut row = vec![
                r.workload.clone(),
                r.ratio.map_or("-".into(), |x| format!("{x:.3}")),
                get("plain_tok_s").map_or("-".into(), fmt),
            ];
            for m in &modes {
                row.push(
                    match (get(&format!("{m}_tok_s")), get(&format!("{m}_ratio"))) {
                        (Some(t), Some(x)) => format!(
                            "{} ({x:.3}, {:.2})",
                            fmt(t),
                            get(&format!("{m}_acceptance")).unwrap_or(0.0)
                        ),
                        _ => "-".into(),
                    },
                );
            }
            row
        })
        .collect();
    Some(titled_table(
        "llama-server's n-gram speculative modes on the same prompt tokens, each ratio against its own plain decoding",
        &header,
        &rows,
    ))
}

/// One run as a Markdown table (medians; reference and ratio where measured), then its checks.
pub fn markdown(a: &Artifact) -> String {
    let rows: Vec<Vec<String>> = a
        .rows
        .iter()
        .map(|r| {
            let extra = r
                .extra
                .iter()
                .filter(|(k, _)| !own_table(k))
                .map(|(k, v)| format!("{k} {}", fmt(*v)))
                .collect::<Vec<_>>()
                .join(", ");
            vec![
                r.workload.clone(),
                format!("{} ({})", r.metric, r.unit),
                fmt(r.axle_median),
                match (&r.reference_name, r.reference_median) {
                    (Some(n), Some(v)) => format!("{} ({n})", fmt(v)),
                    _ => "-".into(),
                },
                r.ratio.map_or("-".into(), |x| format!("{x:.3}")),
                extra,
            ]
        })
        .collect();
    let mut out = markdown_table(
        &["workload", "metric", "Axle", "reference", "ratio", "other"],
        &rows,
    );
    let reps = a.manifest.repetitions;
    let e = &a.environment;
    let _ = writeln!(
        out,
        "\n{} repetitions, medians; {} threads on {} ({}); commit {}; model sha256 {}…",
        reps,
        e.threads,
        e.cpu_model,
        e.cpu_features.join(" "),
        &e.git_commit.chars().take(12).collect::<String>(),
        &e.model_sha256.chars().take(12).collect::<String>()
    );
    let costs: Vec<String> = a
        .rows
        .iter()
        .flat_map(|r| r.extra.iter())
        .filter(|(k, _)| k.starts_with("verify_cost_k"))
        .map(|(_, v)| format!("{v:.2}"))
        .collect();
    if !costs.is_empty() {
        let _ = writeln!(
            out,
            "Measured cost of verifying k drafts relative to one decode step (k = 0..): [{}]",
            costs.join(", ")
        );
    }
    if let Some(line) = ngram_summary(a) {
        let _ = writeln!(out, "{line}");
    }
    for t in [
        acceptance_table(a),
        llama_server_table(a),
        step_table(a),
        verify_step_table(a),
    ]
    .into_iter()
    .flatten()
    {
        out.push_str(&t);
        out.push('\n');
    }
    for c in &a.checks {
        let _ = writeln!(
            out,
            "- check {}: {} ({})",
            c.kind,
            if c.passed { "passed" } else { "FAILED" },
            c.detail
        );
    }
    out
}

/// Several runs of scenarios side by side: one column of Axle medians (and ratios) per run.
pub fn comparison(runs: &[Artifact]) -> String {
    let mut keys: Vec<(String, String)> = Vec::new();
    for a in runs {
        for r in &a.rows {
            let k = (r.workload.clone(), r.metric.clone());
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
    }
    let mut header = vec!["workload".to_string(), "metric".to_string()];
    for a in runs {
        let commit: String = a.environment.git_commit.chars().take(8).collect();
        header.push(format!("{} @{commit}", a.scenario));
    }
    let rows: Vec<Vec<String>> = keys
        .iter()
        .map(|(w, m)| {
            let mut row = vec![w.clone(), m.clone()];
            for a in runs {
                row.push(
                    a.rows
                        .iter()
                        .find(|r| &r.workload == w && &r.metric == m)
                        .map_or("-".into(), |r| match r.ratio {
                            Some(x) => format!("{} ({x:.3})", fmt(r.axle_median)),
                            None => fmt(r.axle_median),
                        }),
                );
            }
            row
        })
        .collect();
    let h: Vec<&str> = header.iter().map(String::as_str).collect();
    markdown_table(&h, &rows)
}

/// A grouped bar chart of the throughput rows: Axle beside its reference, per workload.
pub fn svg(a: &Artifact) -> String {
    let bars: Vec<_> = a.rows.iter().filter(|r| r.unit == "tok/s").collect();
    let (w, h, left, bottom, top) = (820.0, 360.0, 70.0, 90.0, 40.0);
    let max = bars
        .iter()
        .map(|r| r.axle_median.max(r.reference_median.unwrap_or(0.0)))
        .fold(1.0f64, f64::max)
        * 1.1;
    let plot_h = h - bottom - top;
    let slot = (w - left - 20.0) / bars.len().max(1) as f64;
    let bw = (slot * 0.35).min(40.0);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{left}" y="22" font-size="14">{}: tok/s (median of {}), Axle beside its reference</text>"#,
        a.scenario, a.manifest.repetitions
    );
    for i in 0..=4 {
        let v = max * i as f64 / 4.0;
        let y = top + plot_h - plot_h * i as f64 / 4.0;
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            w - 20.0,
            left - 6.0,
            y + 4.0,
            fmt(v)
        );
    }
    for (i, r) in bars.iter().enumerate() {
        let x0 = left + slot * i as f64 + slot / 2.0 - bw;
        let mut bar = |x: f64, v: f64, color: &str| {
            let bh = plot_h * v / max;
            let _ = writeln!(
                s,
                r#"<rect x="{x:.1}" y="{:.1}" width="{bw:.1}" height="{bh:.1}" fill="{color}"/>"#,
                top + plot_h - bh
            );
        };
        bar(x0, r.axle_median, "#1f77b4");
        if let Some(v) = r.reference_median {
            bar(x0 + bw, v, "#ff7f0e");
        }
        let label = format!(
            "{}{}",
            r.workload,
            r.ratio.map_or(String::new(), |x| format!(" ({x:.2}x)"))
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end" transform="rotate(-30 {:.1} {:.1})">{}</text>"#,
            x0 + bw,
            top + plot_h + 14.0,
            x0 + bw,
            top + plot_h + 14.0,
            escape(&label)
        );
    }
    let reference = bars
        .iter()
        .find_map(|r| r.reference_name.clone())
        .unwrap_or_else(|| "reference".into());
    let _ = writeln!(
        s,
        r##"<rect x="{:.1}" y="12" width="10" height="10" fill="#1f77b4"/><text x="{:.1}" y="21">Axle</text><rect x="{:.1}" y="12" width="10" height="10" fill="#ff7f0e"/><text x="{:.1}" y="21">{}</text>"##,
        w - 230.0,
        w - 216.0,
        w - 170.0,
        w - 156.0,
        escape(&reference)
    );
    s.push_str("</svg>\n");
    s
}

fn escape(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Replaces each `<!-- bench:NAME -->` … `<!-- /bench:NAME -->` section of `readme` with the
/// table of the artifact of scenario NAME. Returns the new text and the sections filled.
pub fn fill_readme(readme: &str, runs: &[Artifact]) -> (String, Vec<String>) {
    let mut out = readme.to_string();
    let mut filled = Vec::new();
    for a in runs {
        let by = "`axle bench report --readme` from the artifact of benchmarks/manifests";
        if let Some(new) = fill_section(&out, &a.scenario, by, &markdown(a)) {
            out = new;
            filled.push(a.scenario.clone());
        }
    }
    (out, filled)
}

/// Replaces the `<!-- bench:NAME -->` … `<!-- /bench:NAME -->` section of `text` with `table`,
/// noting what generated it; None when `text` has no such section.
pub fn fill_section(text: &str, name: &str, generated_by: &str, table: &str) -> Option<String> {
    let open = format!("<!-- bench:{name} -->");
    let close = format!("<!-- /bench:{name} -->");
    let (i, j) = (text.find(&open)?, text.find(&close)?);
    if j < i {
        return None;
    }
    let mut out = text.to_string();
    let body = format!("{open}\n<!-- generated by {generated_by}; do not edit -->\n{table}{close}");
    out.replace_range(i..j + close.len(), &body);
    Some(out)
}

/// Writes `NAME.md` and `NAME.svg` for each artifact into `dir`.
pub fn write_reports(runs: &[Artifact], dir: &Path) -> Result<(), BenchError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| BenchError::Invalid(format!("{}: {e}", dir.display())))?;
    for a in runs {
        let md = format!(
            "# {}\n\n{}\n\n![{}]({}.svg)\n\n{}",
            a.scenario,
            a.description,
            a.scenario,
            a.scenario,
            markdown(a)
        );
        for (ext, text) in [("md", md), ("svg", svg(a))] {
            let p = dir.join(format!("{}.{ext}", a.scenario));
            std::fs::write(&p, text)
                .map_err(|e| BenchError::Invalid(format!("{}: {e}", p.display())))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readme_sections_are_replaced_between_their_markers_only() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../benchmarks/baselines/smoke.json"
        );
        let a = Artifact::load(Path::new(path)).unwrap();
        let readme = "intro\n<!-- bench:smoke -->\nold table\n<!-- /bench:smoke -->\nafter\n<!-- bench:other -->\nkeep\n<!-- /bench:other -->\n";
        let (new, filled) = fill_readme(readme, &[a]);
        assert_eq!(filled, ["smoke"]);
        assert!(!new.contains("old table"));
        assert!(new.contains("| generate | decode_tok_s (tok/s) |"));
        assert!(new.starts_with("intro\n<!-- bench:smoke -->\n"));
        assert!(new.contains("<!-- /bench:smoke -->\nafter\n<!-- bench:other -->\nkeep\n"));
        // Filling twice gives the same text.
        let a = Artifact::load(Path::new(path)).unwrap();
        assert_eq!(fill_readme(&new, &[a]).0, new);
    }
}
