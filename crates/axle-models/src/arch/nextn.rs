//! The pieces every next-token-prediction (MTP) block shares, whatever its family's layer: the
//! input, which joins a token's embedding with the trunk's hidden state of the row before it
//! (both RMS-normed, concatenated, projected back to the hidden size), and the output, the
//! block's final norm and head (its own where the file has them, else the trunk's). A family's
//! head is a [`super::Family`] of its own ([`super::Family::mtp`]): one of the family's layers
//! between these two, with one cache layer.
use super::{Head, Weights};
use crate::layers::Step;
use crate::ModelError;
use axle_ggml::{StoredTensor, Tensor};

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
    /// The name of layer `il`'s projection, which marks it as an MTP block.
    pub fn marker(il: usize) -> String {
        format!("blk.{il}.nextn.eh_proj.weight")
    }

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
    pub fn input<'a>(&'a self, s: &mut Step<'a>, trunk: &'a Head, eps: f32) -> Tensor<'a> {
        let g = s.ctx;
        let Some(hidden) = s.hidden_in else {
            panic!("an MTP head's step without hidden states");
        };
        let embd = self.embed_tokens.as_ref().unwrap_or(&trunk.tok_embd);
        let e = s.rms_norm(g.get_rows(embd.t(), s.tokens), &self.enorm, eps);
        let h = s.rms_norm(hidden, &self.hnorm, eps);
        s.matmul(&self.eh_proj, g.concat(e, h, 0))
    }

    /// The step's output from the block's last residual `x` [n_embd, n_tokens]: final-normed,
    /// kept as the step's hidden state (every row), the output rows' logits through the head.
    pub fn output<'a>(
        &'a self,
        s: &mut Step<'a>,
        trunk: &'a Head,
        x: Tensor<'a>,
        eps: f32,
    ) -> Tensor<'a> {
        let x = s.rms_norm(
            x,
            self.head_norm.as_ref().unwrap_or(&trunk.output_norm),
            eps,
        );
        s.keep_hidden(x);
        let x = s.ctx.get_rows(x, s.out_ids);
        s.output(self.head.as_ref().unwrap_or(&trunk.output), x, 0.0)
    }
}
