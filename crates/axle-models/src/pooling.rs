//! Embeddings: how a sequence's final-normed hidden states ([`crate::RowValues::Hidden`]) become
//! one vector, with the pooling types libllama reads from `{arch}.pooling_type`.
use crate::ModelError;
use axle_ggml::GgufFile;

/// How a sequence's hidden states are pooled into its embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean of every token's state.
    Mean,
    /// The first token's state.
    Cls,
    /// The last token's state (decoder embedding models such as Qwen3-Embedding).
    Last,
}

impl Pooling {
    /// The name the CLI and the server take.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }

    /// libllama's number for it (`llama_pooling_type`).
    pub fn llama_type(self) -> i32 {
        match self {
            Pooling::Mean => 1,
            Pooling::Cls => 2,
            Pooling::Last => 3,
        }
    }

    /// The pooling a GGUF file asks for (`{arch}.pooling_type`, libllama's numbering): `None`
    /// where it names none (absent, or 0). Reranking heads (4) and unknown values are refused.
    pub fn from_file(file: &GgufFile, arch: &str) -> Result<Option<Pooling>, ModelError> {
        let key = format!("{arch}.pooling_type");
        match file.int_opt(&key)? {
            None | Some(0) => Ok(None),
            Some(1) => Ok(Some(Pooling::Mean)),
            Some(2) => Ok(Some(Pooling::Cls)),
            Some(3) => Ok(Some(Pooling::Last)),
            Some(4) => Err(ModelError::Unsupported(format!(
                "{key} = 4 (a reranking head) is not supported"
            ))),
            Some(v) => Err(ModelError::Invalid(format!(
                "{key} = {v} is not a pooling type (0 to 4)"
            ))),
        }
    }

    /// Which of a sequence's `n` tokens it reads.
    pub fn reads(self, token: usize, n: usize) -> bool {
        match self {
            Pooling::Mean => true,
            Pooling::Cls => token == 0,
            Pooling::Last => token + 1 == n,
        }
    }
}

impl std::fmt::Display for Pooling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Pooling {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "mean" => Ok(Pooling::Mean),
            "cls" => Ok(Pooling::Cls),
            "last" => Ok(Pooling::Last),
            _ => Err(format!("unknown pooling `{s}` (mean, cls or last)")),
        }
    }
}

/// A sequence's embedding being pooled as its rows come, step after step.
#[derive(Debug, Clone)]
pub struct Pooled {
    pooling: Pooling,
    sum: Vec<f32>,
    rows: usize,
}

impl Pooled {
    /// An empty one of `width` (the model's hidden width).
    pub fn new(pooling: Pooling, width: usize) -> Pooled {
        Pooled {
            pooling,
            sum: vec![0.0; width],
            rows: 0,
        }
    }

    /// Adds one row the pooling reads, in token order.
    pub fn add(&mut self, row: &[f32]) {
        debug_assert_eq!(row.len(), self.sum.len());
        for (s, &v) in self.sum.iter_mut().zip(row) {
            *s += v;
        }
        self.rows += 1;
    }

    /// The pooled vector.
    pub fn finish(self) -> Vec<f32> {
        let mut v = self.sum;
        if self.pooling == Pooling::Mean && self.rows > 0 {
            let n = self.rows as f32;
            v.iter_mut().for_each(|x| *x /= n);
        }
        v
    }
}

/// Scales `v` to unit L2 length (a zero vector stays zero), the sum of squares in f64.
pub fn normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|&x| (x as f64) * (x as f64))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_rows_its_pooling_names() {
        let read = |p: Pooling| (0..4).filter(|&t| p.reads(t, 4)).collect::<Vec<_>>();
        assert_eq!(read(Pooling::Mean), [0, 1, 2, 3]);
        assert_eq!(read(Pooling::Cls), [0]);
        assert_eq!(read(Pooling::Last), [3]);
    }

    #[test]
    fn mean_divides_and_normalizing_gives_unit_length() {
        let mut p = Pooled::new(Pooling::Mean, 2);
        p.add(&[1.0, 2.0]);
        p.add(&[3.0, 6.0]);
        let mut v = p.finish();
        assert_eq!(v, [2.0, 4.0]);
        normalize(&mut v);
        let len: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((len - 1.0).abs() < 1e-6, "{v:?}");
        let mut zero = Pooled::new(Pooling::Last, 3).finish();
        normalize(&mut zero);
        assert_eq!(zero, [0.0; 3]);
    }

    #[test]
    fn names_round_trip_and_unknown_ones_are_refused() {
        for p in [Pooling::Mean, Pooling::Cls, Pooling::Last] {
            assert_eq!(p.name().parse::<Pooling>(), Ok(p));
        }
        assert!("max"
            .parse::<Pooling>()
            .unwrap_err()
            .contains("mean, cls or last"));
    }
}
