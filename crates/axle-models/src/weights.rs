//! Binding a model's tensors by declaration: each family names the GGUF tensors it needs with
//! their shapes ([`Weights::req`], [`Weights::opt`]), and this is the one place that looks them
//! up and checks them; metadata keys and refusals of bad metadata are spelled here too.
use crate::ModelError;
use axle_ggml::{StoredTensor, TensorStore};

/// The GGUF metadata key `k` of architecture `arch`: `{arch}.{k}`.
pub(crate) fn arch_key(arch: &str, k: &str) -> String {
    format!("{arch}.{k}")
}

fn f32_only(name: &str, t: StoredTensor) -> Result<StoredTensor, ModelError> {
    if t.t().dtype() == axle_ggml::DType::F32 {
        Ok(t)
    } else {
        Err(ModelError::Invalid(format!(
            "tensor {name} is {:?}; the graph reads it as f32 only",
            t.t().dtype()
        )))
    }
}

pub(crate) fn bad(key: &str, what: &str) -> ModelError {
    ModelError::Invalid(format!("metadata {key} {what}"))
}

/// Looks weights up by GGUF name and checks their shapes: the one place model files bind tensors.
#[derive(Debug)]
pub struct Weights<'s> {
    store: &'s TensorStore,
}

impl<'s> Weights<'s> {
    /// Binding over a loaded store.
    pub fn new(store: &'s TensorStore) -> Self {
        Weights { store }
    }

    /// A required tensor with the given shape (ggml order).
    pub fn req(&self, name: &str, shape: &[i64]) -> Result<StoredTensor, ModelError> {
        let t = self.store.require(name)?;
        // Norm weights, biases and rope factors: ggml's element-wise ops take them as F32 only
        // (another type aborts inside ggml), and GGUF converters always write them so.
        if shape.len() == 1 && t.t().dtype() != axle_ggml::DType::F32 {
            return Err(ModelError::Invalid(format!(
                "tensor {name} is {:?}; one-dimensional weights must be f32",
                t.t().dtype()
            )));
        }
        let ne = t.t().ne();
        let found: Vec<i64> = ne[..shape.len()].to_vec();
        if found != shape || ne[shape.len()..].iter().any(|&d| d != 1) {
            return Err(ModelError::Ggml(axle_ggml::Error::TensorShape {
                name: name.into(),
                found: ne.to_vec(),
                expected: shape.to_vec(),
            }));
        }
        Ok(t)
    }

    /// An optional tensor (shape checked when present).
    pub fn opt(&self, name: &str, shape: &[i64]) -> Result<Option<StoredTensor>, ModelError> {
        match self.store.get(name) {
            None => Ok(None),
            Some(_) => self.req(name, shape).map(Some),
        }
    }

    /// A required tensor that the graph reads with an element-wise or convolution op (a
    /// convolution kernel, per-expert biases): those take F32 only, whatever the shape.
    pub fn req_f32(&self, name: &str, shape: &[i64]) -> Result<StoredTensor, ModelError> {
        let t = self.req(name, shape)?;
        f32_only(name, t)
    }

    /// [`Weights::opt`] for a tensor that must be F32 (see [`Weights::req_f32`]).
    pub fn opt_f32(&self, name: &str, shape: &[i64]) -> Result<Option<StoredTensor>, ModelError> {
        self.opt(name, shape)?
            .map(|t| f32_only(name, t))
            .transpose()
    }
}
