//! The pieces every next-token-prediction (MTP) block shares, whatever its family's layer: the
//! input, which joins a token's embedding with the trunk's hidden state of the row before it
//! (both RMS-normed, concatenated, projected back to the hidden size), and the output, the
//! block's final norm and head (its own where the file has them, else the trunk's). A family's
//! head is a [`super::Family`] of its own ([`super::Family::mtp`]): one of the family's layers
//! between these two, with one cache layer.
use super::{bad, Head, Hparams, Weights};
use crate::layers::Step;
use crate::ModelError;
use axle_ggml::{GgufFile, StoredTensor, Tensor};

/// Leaves the file's MTP blocks (`{arch}.nextn_predict_layers`, after the trunk) out of
/// `hp.n_layer` and returns how many there are; refused where they would leave no trunk.
pub fn split_off(f: &GgufFile, hp: &mut Hparams) -> Result<usize, ModelError> {
    let key = hp.key("nextn_predict_layers");
    let n = f.int_opt(&key)?.unwrap_or(0);
    if n < 0 || n as usize >= hp.n_layer {
        return Err(bad(
            &key,
            &format!("= {n} leaves no trunk of the {} layers", hp.n_layer),
        ));
    }
    hp.n_layer -= n as usize;
    Ok(n as usize)
}

/// Whether layer `il` of `f` is an MTP block (has the block's input projection).
pub fn is_block(f: &GgufFile, il: usize) -> bool {
    let name = format!("blk.{il}.nextn.eh_proj.weight");
    f.tensors().iter().any(|t| t.name == name)
}

/// A step's first hidden state [n_embd, n_tokens]: the token embeddings, or an MTP head's input.
pub fn input<'a>(
    nextn: Option<&'a Nextn>,
    s: &mut Step<'a>,
    trunk: &'a Head,
    eps: f32,
) -> Tensor<'a> {
    match nextn {
        Some(nx) => nx.input(s, trunk, eps),
        None => s.ctx.get_rows(trunk.tok_embd.t(), s.tokens),
    }
    .named("inp_embd")
}

/// The step's output from the last layer's output `x` [n_embd, rows]: final-normed (with an MTP
/// head's own norm where it has one), and unless `x` holds only the output rows already
/// (`picked`), kept as the step's hidden state and the output rows picked; then logits through
/// the head (an MTP head's own where it has one), or the hidden rows ([`Step::output`]).
pub fn output<'a>(
    nextn: Option<&'a Nextn>,
    s: &mut Step<'a>,
    trunk: &'a Head,
    x: Tensor<'a>,
    eps: f32,
    picked: bool,
) -> Tensor<'a> {
    let norm = nextn.and_then(|n| n.head_norm.as_ref());
    let head = nextn.and_then(|n| n.head.as_ref());
    let mut x = s.rms_norm(x, norm.unwrap_or(&trunk.output_norm), eps);
    if !picked {
        s.keep_hidden(x);
        x = s.ctx.get_rows(x, s.out_ids);
    }
    s.output(head.unwrap_or(&trunk.output), x, 0.0)
}

/// An MTP block's own weights.
#[derive(Debug)]
pub struct Nextn {
    /// [2 n_embd, n_embd]: the joined input back to the hidden size.
    eh_proj: StoredTensor,
    /// [n_embd] each: the token embedding's and the hidden state's norms.
    enorm: StoredTensor,
    hnorm: StoredTensor,
    /// [n_embd, n_vocab]: the block's own token embedding, else the trunk's.
    embed_tokens: Option<StoredTensor>,
    /// [n_embd]: the block's final norm, else the trunk's.
    head_norm: Option<StoredTensor>,
    /// [n_embd, n_vocab]: the block's own head, else the trunk's.
    head: Option<StoredTensor>,
}

impl Nextn {
    /// Binds layer `il`'s `nextn.*` weights.
    pub fn bind(w: &Weights, il: usize, n_embd: i64, n_vocab: i64) -> Result<Nextn, ModelError> {
        let n = |s: &str| format!("blk.{il}.nextn.{s}");
        let e = n_embd;
        Ok(Nextn {
            eh_proj: w.req(&n("eh_proj.weight"), &[2 * e, e])?,
            enorm: w.req(&n("enorm.weight"), &[e])?,
            hnorm: w.req(&n("hnorm.weight"), &[e])?,
            embed_tokens: w.opt(&n("embed_tokens.weight"), &[e, n_vocab])?,
            head_norm: w.opt(&n("shared_head_norm.weight"), &[e])?,
            head: w.opt(&n("shared_head_head.weight"), &[e, n_vocab])?,
        })
    }

    /// The block's input [n_embd, n_tokens] from the step's tokens and [`Step::hidden_in`].
    fn input<'a>(&'a self, s: &mut Step<'a>, trunk: &'a Head, eps: f32) -> Tensor<'a> {
        let g = s.ctx;
        let Some(hidden) = s.hidden_in else {
            panic!("an MTP head's step without hidden states");
        };
        let embd = self.embed_tokens.as_ref().unwrap_or(&trunk.tok_embd);
        let e = s.rms_norm(g.get_rows(embd.t(), s.tokens), &self.enorm, eps);
        let h = s.rms_norm(hidden, &self.hnorm, eps);
        s.matmul(&self.eh_proj, g.concat(e, h, 0))
    }
}
