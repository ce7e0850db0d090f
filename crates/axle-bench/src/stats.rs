//! Small statistics and table helpers shared by the benchmarks.

/// Axle against libllama on one measurement: tok/s per repetition, medians and their ratio.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Paired {
    /// Axle tok/s per repetition.
    pub axle: Vec<f64>,
    /// libllama tok/s per repetition.
    pub llama: Vec<f64>,
    /// Median Axle tok/s.
    pub axle_median: f64,
    /// Median libllama tok/s.
    pub llama_median: f64,
    /// axle_median / llama_median.
    pub ratio: f64,
}

impl Paired {
    /// The medians and ratio of the two series.
    pub fn new(axle: Vec<f64>, llama: Vec<f64>) -> Paired {
        let (axle_median, llama_median) = (median(&axle), median(&llama));
        Paired {
            axle,
            llama,
            axle_median,
            llama_median,
            ratio: axle_median / llama_median,
        }
    }
}

/// Median of the samples (mean of the middle two for even counts); 0 for none.
pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// The `q` quantile (0..=1) of samples already sorted ascending, by nearest rank; 0 for none.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Deterministic pseudo-random token ids in `[0, n_vocab)` (xorshift), for synthetic prompts.
pub fn synthetic_tokens(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % n_vocab as u64) as u32
        })
        .collect()
}

/// Renders a Markdown table.
pub fn markdown_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = format!(
        "| {} |\n|{}|\n",
        header.join(" | "),
        header
            .iter()
            .map(|h| format!("{}:", "-".repeat(h.len().max(3))))
            .collect::<Vec<_>>()
            .join("|")
    );
    for r in rows {
        out.push_str(&format!("| {} |\n", r.join(" | ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_tokens() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        let t = synthetic_tokens(100, 50, 7);
        assert!(t.iter().all(|&x| x < 50));
        assert_eq!(t, synthetic_tokens(100, 50, 7));
    }
}
