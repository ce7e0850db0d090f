//! Graph pieces shared by the architecture files: the per-step inputs ([`Step`]), weighted RMS
//! norm, attention through the KV slots, and gated feed-forward. Models call these with small
//! structs; they never see block tables or slot arithmetic.
use crate::device_step::{DeviceProducts, DeviceStep, GROUP_COLS, WIDE_MIN_COLS};
use crate::kv::KvCache;
use crate::small_products::{self, Product};
use crate::stacked_attention::{attention_op, KvSlots, OpRows, StackKey, StackTable, StackedKv};
use axle_ggml::paged_attention::PagedAttention;
use axle_ggml::row_attention::{RowAttention, TILED_ROWS};
use axle_ggml::tiled_columns;
use axle_ggml::{Context, DType, GluOp, Graph, StoredTensor, Tensor};

mod device_attention;
mod state;

pub use crate::heads::AttnSpec;
pub(crate) use crate::pieces::{columns, concat_all};

/// Everything a model's forward pass reads for one step (one graph over the whole batch).
#[derive(Debug)]
pub struct Step<'a> {
    /// The graph context (ops are created here).
    pub ctx: &'a Context,
    /// The graph being built.
    pub graph: Graph<'a>,
    /// Tokens in the batch.
    pub n_tokens: i64,
    /// I32 [n_tokens]: token ids.
    pub tokens: Tensor<'a>,
    /// I32 [n_tokens]: positions.
    pub pos: Tensor<'a>,
    /// I64 [n_tokens]: KV slot each token writes.
    pub slots: Tensor<'a>,
    /// F16 [n_kv, n_tokens]: 0 where a token may attend to a slot, -inf elsewhere.
    pub mask: Tensor<'a>,
    /// F16 [n_kv, n_tokens]: the same for sliding-window layers (if the model has them).
    pub mask_swa: Option<Tensor<'a>>,
    /// I32 [n_out]: rows whose logits are wanted (applied before the last layer's residual).
    pub out_ids: Tensor<'a>,
    /// Columns of the mask: visible slots this step (a prefix of the cache), or the length of
    /// the gathered KV when `kv_ids` is set.
    pub n_kv: i64,
    /// I32 [n_kv]: when set, attention reads these slots, gathered in this order, instead of a
    /// prefix of the cache. Used when some sequence's blocks do not lie in ascending order, so
    /// that attention still visits every sequence's tokens in logical order (and computes the
    /// same numbers wherever the blocks happen to lie).
    pub kv_ids: Option<Tensor<'a>>,
    /// The KV storage.
    pub kv: &'a KvCache,
    /// (cache layer, K write, V write) of each cache layer written so far this step: layers that
    /// share an earlier layer's KV ([`Step::attend`]) read it through these.
    pub kv_written: Vec<(usize, Tensor<'a>, Tensor<'a>)>,
    /// The attention ops of a host step: rows are split so that every row gets the same
    /// attention arithmetic whatever else is in the batch.
    pub attn_groups: Vec<AttnGroup>,
    /// Host steps: which of the step's columns take the tiled kernels' product arithmetic (see
    /// [`RowArithmetic`]); empty where none does.
    pub tiled_product_cols: Vec<bool>,
    /// The same for the output rows (the columns of products after the output rows are picked).
    pub tiled_product_out_cols: Vec<bool>,
    /// Kernel choice.
    pub kernels: Kernels,
    /// The recurrent state of the step's sequences (models with linear-attention layers).
    pub state: Option<crate::recurrent::StateStep<'a>>,
    /// With batch-invariant kernels and KV on an accelerator: how products and attention are
    /// split so that each row's arithmetic depends on its own sequence only (see
    /// [`crate::device_step`]). The masks are then laid out per attention op.
    pub device: Option<DeviceStep>,
    /// With the device layout: which runs of one-row attention ops may share an op (see
    /// [`crate::stacked_attention`]); `None`: never.
    pub stacking: Option<&'a StackTable>,
    /// With [`DeviceStep::paged`]: the paged attention inputs of the step.
    pub paged: Option<PagedInputs<'a>>,
    /// What the output rows hold: logits, or the final-normed hidden state ([`Step::output`]).
    pub values: RowValues,
    /// A next-token-prediction head's step ([`crate::arch::Family::mtp`]): F32 [n_embd,
    /// n_tokens], the hidden state each token is paired with (the trunk's, of the row before).
    pub hidden_in: Option<Tensor<'a>>,
    /// Whether the step returns every row's final-normed hidden state beside its output rows
    /// (a trunk feeding its MTP head, and the head itself): families that have a head then keep
    /// it with [`Step::keep_hidden`] and pick the output rows after the final norm.
    pub returns_hidden: bool,
    /// What [`Step::keep_hidden`] kept.
    pub hidden_out: Option<Tensor<'a>>,
}

/// What a step's output rows hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RowValues {
    /// Logits through the model's head (generation).
    #[default]
    Logits,
    /// The hidden state after the final norm, before the head (embeddings: what libllama
    /// pools).
    Hidden,
}

/// The inputs of a step's paged attention ([`crate::device_step::PagedStep`]).
#[derive(Debug, Clone, Copy)]
pub struct PagedInputs<'a> {
    /// I32 [2, n_tokens]: per row, its block table's offset in `table` and the keys it sees.
    pub rows: Tensor<'a>,
    /// I32 [table_len]: block ids.
    pub table: Tensor<'a>,
    /// The model's sliding window (sliding-window layers), 0 without one.
    pub window: u32,
    /// Set when some layer's heads are not ones the paged op takes: the runner then lays steps
    /// out with an op per row instead and builds the graph again.
    pub refused: &'a std::cell::RefCell<Option<String>>,
}

/// How a step picks ggml's CPU kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kernels {
    /// Every row gets the numbers it would get in a step of its own, whatever else shares the
    /// step: on the host, each row's arithmetic is fixed by [`HostKernels`] (which of ggml's
    /// tiled or one-pass attention and tiled or dot-product K-quant arithmetic it takes; see
    /// [`Step::matmul`] and [`AttnGroup`]); with KV on an accelerator, the step layout of
    /// [`crate::device_step`]. The engine's default: batched and speculative decoding then
    /// reproduce plain decoding bit for bit.
    #[default]
    BatchInvariant,
    /// The ops libllama builds (one attention op for the whole step, products at full width), so
    /// that logits match libllama's bit for bit; a row's numbers then depend on the step's shape.
    LikeLlamaCpp,
}

/// The arithmetic of host (CPU) rows under [`Kernels::BatchInvariant`]: each keeps a row's
/// numbers independent of the step; they differ in which of ggml's kernels a row shares with
/// libllama.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HostKernels {
    /// A row's arithmetic follows its origin, as libllama's does: rows of a prompt of 64 tokens
    /// or more take the tiled kernels' arithmetic (libllama prefills such a prompt with ggml's
    /// tiled attention and tiled K-quant GEMM), prompts of 8 to 63 tokens the tiled products and
    /// one-pass attention, generated rows (decode, verify) the compatible arithmetic libllama
    /// decodes with. Prefill then runs at libllama's speed and greedy output follows libllama's.
    /// A row's numbers depend on its request alone (its prompt's length and whether it was
    /// generated); the prefix cache keys blocks by origin ([`HostKernels::prompt_classes`]).
    #[default]
    Origin,
    /// The arithmetic libllama decodes with, for every row: attention in ops under the tiled
    /// kernel's 64 rows (ggml's one-pass kernel), K-quant products through the per-column dot
    /// product (in slices of 4 columns). Prefill pays for it (ops of at most 63 rows, no tiled
    /// K-quant GEMM).
    Compatible,
    /// The arithmetic of ggml's tiled kernels for every row: prefill chunks run ggml's tiled
    /// attention and tiled K-quant GEMM (libllama's prefill speed), decode and verify rows get
    /// the same numbers through [`axle_ggml::Context::flash_attn_rows`] and
    /// [`axle_ggml::Context::mul_mat_tiled_columns`]. Queries stay F32 where libllama's decode
    /// rounds them to F16, so greedy output parts from libllama's sooner.
    Tiled,
}

/// Which of the tiled kernels' arithmetic a host row takes (see [`HostKernels`]); the rest of the
/// row takes the compatible arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RowArithmetic {
    /// Attention with ggml's tiled kernel's arithmetic (otherwise its one-pass kernel's).
    pub tiled_attention: bool,
    /// K-quant products with ggml's tiled GEMM's arithmetic (otherwise its dot product's).
    pub tiled_products: bool,
    /// A generated row that libllama, decoding its sequence alone, would attend with ggml's
    /// split-KV kernel (a one-row op over 512 or more KV cells): the width of libllama's KV view
    /// then, which the row's own op takes too. 0: the one-pass kernel over the row's keys.
    pub split_kv: u32,
}

/// Prompt length from which libllama prefills a K-quant product with ggml's tiled GEMM.
const ORIGIN_TILED_PRODUCTS: u32 = tiled_columns::TILED_COLS as u32;
/// Prompt length from which libllama prefills attention with ggml's tiled kernel.
const ORIGIN_TILED_ATTENTION: u32 = TILED_ROWS as u32;
/// libllama's KV view grows in steps of this many cells (and is never narrower).
const LIBLLAMA_KV_PAD: u32 = 256;

impl HostKernels {
    /// The arithmetic of the row at position `pos` of a request whose prompt is `prompt_len`
    /// tokens (positions from `prompt_len` on were generated), with a KV cache of `cells` slots.
    ///
    /// With `Origin`, a generated row at a position where libllama, decoding the sequence alone,
    /// would attend over a view of 512 cells or more (its view: the cells up to the row's,
    /// padded to 256, at least 256, at most the cache) takes ggml's split-KV kernel over a view
    /// of that width, as libllama's does; its numbers then depend on the width and the thread
    /// count, both fixed for the row.
    pub fn row(self, prompt_len: u32, pos: u32, cells: u32) -> RowArithmetic {
        match self {
            HostKernels::Compatible => RowArithmetic::default(),
            HostKernels::Tiled => RowArithmetic {
                tiled_attention: true,
                tiled_products: true,
                split_kv: 0,
            },
            HostKernels::Origin if pos >= prompt_len => {
                let view = (pos + 1)
                    .next_multiple_of(LIBLLAMA_KV_PAD)
                    .max(LIBLLAMA_KV_PAD)
                    .min(cells);
                RowArithmetic {
                    split_kv: if i64::from(view) >= FA_SPLIT_KV_SLOTS {
                        view
                    } else {
                        0
                    },
                    ..RowArithmetic::default()
                }
            }
            HostKernels::Origin => RowArithmetic {
                tiled_attention: prompt_len >= ORIGIN_TILED_ATTENTION,
                tiled_products: prompt_len >= ORIGIN_TILED_PRODUCTS,
                split_kv: 0,
            },
        }
    }

    /// The prompt lengths at which a prompt row's arithmetic changes, for the scheduler's prefix
    /// cache (`axle_core::SchedulerConfig::prompt_classes`); empty where a row's arithmetic does
    /// not depend on its origin.
    pub fn prompt_classes(self) -> Vec<usize> {
        match self {
            HostKernels::Origin => vec![
                ORIGIN_TILED_PRODUCTS as usize,
                ORIGIN_TILED_ATTENTION as usize,
            ],
            HostKernels::Compatible | HostKernels::Tiled => Vec::new(),
        }
    }
}

// The names of the CLI's `--host-kernels`.
crate::choice::named_choice!(HostKernels, "host kernels", {
    "origin" => HostKernels::Origin,
    "compatible" => HostKernels::Compatible,
    "tiled" => HostKernels::Tiled,
});

/// One attention op of a host step: `rows` rows from `first`, all with the same attention
/// arithmetic. A tiled group of 64 rows or more is one sequence's run (ggml's tiled kernel); a
/// narrower one runs [`axle_ggml::Context::flash_attn_rows`]; a one-pass group stays under 64
/// rows (ggml's one-pass kernel); a split-KV group is one row over a KV view of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AttnGroup {
    /// First row.
    pub first: i64,
    /// Rows.
    pub rows: i64,
    /// The tiled kernel's arithmetic.
    pub tiled: bool,
    /// One row with ggml's split-KV kernel ([`RowArithmetic::split_kv`]): (the step's KV column
    /// of its sequence's position 0, the view's width).
    pub split_kv: Option<(i64, i64)>,
}

/// Columns per K-quant matrix product where the tiled-columns op does not cover the type (below
/// the 8 at which ggml's tiled GEMM takes over).
const MATMUL_SLICE: i64 = 4;

/// Columns from which ggml's CPU backend multiplies float (F32, F16, BF16) weights with one
/// kernel: llamafile's tiled sgemm, whose per-column sums do not depend on the width, takes them
/// from 2 columns on x86 (4 for F32 on NEON), and below that ggml's dot product, which sums in
/// another order. So in a one-token step a float product (the routers of MoE layers are F32) gets
/// zero columns beside its column: a router's logits then do not depend on how many tokens share
/// the step, which a near tie in expert selection would turn into another expert.
const FLOAT_MIN_COLS: i64 = 4;

/// Visible slots from which ggml's CPU flash attention runs a one-row op with its split-KV kernel
/// (each thread a chunk of the slots, partial softmaxes merged), which rounds differently from the
/// one-pass kernel every wider op uses.
const FA_SPLIT_KV_SLOTS: i64 = 512;

/// The weights of a gated feed-forward block.
#[derive(Debug)]
pub struct FfnWeights<'w> {
    /// [n_embd, n_ff]
    pub gate: &'w StoredTensor,
    /// [n_embd, n_ff]
    pub up: &'w StoredTensor,
    /// [n_ff, n_embd]
    pub down: &'w StoredTensor,
}

impl<'a> Step<'a> {
    /// x * rms(x)^-1 * w.
    pub fn rms_norm(&self, x: Tensor<'a>, w: &'a StoredTensor, eps: f32) -> Tensor<'a> {
        self.ctx.mul(self.ctx.rms_norm(x, eps), w.t())
    }

    /// `w @ x` for x [k, n], computed so that every column gets the numbers it would get alone.
    ///
    /// ggml's CPU backend multiplies K-quant weights with a tiled GEMM from 8 columns on, which
    /// rounds differently from the per-column dot product used below that. Left alone, a token's
    /// logits would then depend on how many other tokens share its step (a verify step of 8 or
    /// more, a batch of decoding sequences), and batched or speculative greedy decoding would
    /// drift from plain decoding at close calls. So each column takes one of two arithmetics,
    /// fixed by its row (see [`RowArithmetic::tiled_products`]; a product runs once per run of
    /// columns of one arithmetic). The dot product's, libllama's in decoding (generated rows by
    /// default, every row with [`HostKernels::Compatible`]): such products go through in slices
    /// of 4 columns at every width (a 3-D batch of one op, plus one op for the rest). The tiled
    /// GEMM's, libllama's in prefill (prompt rows by default, every row with
    /// [`HostKernels::Tiled`]): since the tiled GEMM gives a column the same numbers at every
    /// width from 8 on, Q4_K, Q5_K and Q6_K products of 8 columns or more (prefill chunks) run as
    /// they are, at the tiled kernel's speed, and narrower ones go through
    /// [`Context::mul_mat_tiled_columns`], which gives each column those numbers (where its probe
    /// passes; see [`axle_ggml::tiled_columns`]; other such types keep the slices).
    /// Other weight types give every column the same numbers at any width already (llamafile's
    /// kernels for Q8_0/Q5_0/Q4_0 do the same per-block arithmetic as the dot product). Repacked
    /// weights (their own kernels, no such promise) and device weights are left as they are.
    ///
    /// Q4_1, Q5_0 and Q8_0 weights with 2 to 32 columns (verify steps, small batches) go through
    /// [`Context::mul_mat_few`], which unpacks each weight block once for up to 4 columns where
    /// ggml does more work per column, and so do Q4_1 and Q5_0 products of more columns (prefill)
    /// on CPUs with AVX-512 VNNI (a tiled kernel, faster than ggml's products of those types:
    /// docs/performance.md); their columns are bit-identical to ggml's.
    pub fn matmul(&self, w: &'a StoredTensor, x: Tensor<'a>) -> Tensor<'a> {
        let g = self.ctx;
        let [_, n, rest @ ..] = x.ne();
        let w_t = w.t();
        if let Some(d) = &self.device {
            // Quantized weights (MMVQ/MMQ) and float ones (the routers of MoE layers are F32:
            // cuBLAS and the vector kernels round differently by width too).
            if rest == [1, 1] && w_t.is_on_device() {
                return self.matmul_device(w_t, x, d);
            }
        }
        if self.kernels == Kernels::BatchInvariant {
            if let Some(y) = g.mul_mat_few(w_t, x) {
                return y;
            }
            if let Some(y) = self.float_padded(w_t, x) {
                return y;
            }
        }
        if self.kernels != Kernels::BatchInvariant
            || rest != [1, 1]
            || !w_t.dtype().has_cpu_tiled_gemm()
            || !w_t.is_plain_host()
        {
            return g.mul_mat(w_t, x);
        }
        let tiled: &[bool] = if n == self.n_tokens {
            &self.tiled_product_cols
        } else if n == self.out_ids.ne()[0] {
            &self.tiled_product_out_cols
        } else {
            &[]
        };
        if !tiled.iter().any(|&t| t) || !tiled_columns::covers(w_t) {
            return self.host_product(w_t, x, false);
        }
        // Runs of columns with one arithmetic each.
        let mut pieces = Vec::new();
        let mut first = 0;
        while first < n {
            let t = tiled[first as usize];
            let cols = tiled[first as usize..]
                .iter()
                .take_while(|&&c| c == t)
                .count() as i64;
            pieces.push(self.host_product(w_t, columns(g, x, first, cols), t));
            first += cols;
        }
        concat_all(g, pieces, 1)
    }

    /// A batch-invariant K-quant product of host columns `x`: with the tiled GEMM's arithmetic
    /// (`tiled`, for weights [`tiled_columns::covers`]) or the dot product's.
    fn host_product(&self, w: Tensor<'a>, x: Tensor<'a>, tiled: bool) -> Tensor<'a> {
        let g = self.ctx;
        let n = x.ne()[1];
        if tiled {
            if n >= tiled_columns::TILED_COLS {
                return g.mul_mat(w, x);
            }
            // Always applies here: the weight is covered and x holds plain activation columns.
            if let Some(y) = g.mul_mat_tiled_columns(w, x) {
                return y;
            }
            unreachable!("tiled columns are asked only of weights the op covers");
        }
        if n < tiled_columns::TILED_COLS {
            return g.mul_mat(w, x);
        }
        Product { g: self.ctx, w }.grouped(x, MATMUL_SLICE)
    }

    /// `w @ x` for a float weight in host memory and fewer than [`FLOAT_MIN_COLS`] columns of
    /// `x` [k, n, h]: padded with zero columns to that width, so that it takes the kernel a wider
    /// step's product takes (see [`FLOAT_MIN_COLS`]); `None` for other weights and widths.
    fn float_padded(&self, w: Tensor<'a>, x: Tensor<'a>) -> Option<Tensor<'a>> {
        let [_, n, _, rest] = x.ne();
        if !w.dtype().is_float() || n >= FLOAT_MIN_COLS || rest != 1 || !w.is_plain_host() {
            return None;
        }
        Some(Product { g: self.ctx, w }.padded(x, FLOAT_MIN_COLS))
    }

    /// `w @ x` on an accelerator, each column's arithmetic independent of the step's shape:
    /// the step's small columns (decode and verify rows, and every column of a product after the
    /// output rows were picked) in groups of [`GROUP_COLS`] ([`FLOAT_GROUP_COLS`] for F32
    /// weights), each prefill chunk as one product.
    fn matmul_device(&self, w: Tensor<'a>, x: Tensor<'a>, d: &DeviceStep) -> Tensor<'a> {
        let g = self.ctx;
        if self.all_small(x, d) {
            return Product { g: self.ctx, w }.small(x, d);
        }
        let pieces = d
            .runs
            .iter()
            .map(|r| {
                let xs = columns(g, x, r.first, r.cols);
                if r.small {
                    Product { g: self.ctx, w }.small(xs, d)
                } else {
                    g.mul_mat(w, xs)
                }
            })
            .collect();
        concat_all(g, pieces, 1)
    }

    /// Whether every column of `x` is a small one (decoding or verifying sequences; rows picked
    /// for output count as small, as in [`Step::matmul`]).
    fn all_small(&self, x: Tensor<'a>, d: &DeviceStep) -> bool {
        x.ne()[1] != self.n_tokens || d.runs.iter().all(|r| r.small)
    }

    /// The products of `x` with the parts of a fused weight (a layer's Q, K and V, or its gate and
    /// up: [`axle_ggml::WeightFusion`]), as one product with `fused` or one per part.
    ///
    /// On the host every row of a product is computed by itself, so the fused weight serves
    /// every column. On a device, prefill chunks multiply the parts, as libllama does (MMQ's
    /// stream-k split depends on the weight's rows, so a fused product would round a prompt
    /// differently); small columns multiply the fused weight: one MMVQ pass per group, or one
    /// MMQ op (wide products), instead of one per part. `fused_in_groups: false` keeps the parts
    /// for small columns too where they go through MMVQ groups: ggml's CUDA backend fuses a
    /// one-column gate product, up product and gated unit into one kernel, as it does for
    /// libllama. With libllama's ops on a device (no device layout: `--kernels fast`) the parts
    /// serve products of [`WIDE_MIN_COLS`] columns or more, which ggml runs with MMQ.
    pub fn matmul_fused(
        &self,
        fused: &'a StoredTensor,
        parts: &[&'a StoredTensor],
        x: Tensor<'a>,
        fused_in_groups: bool,
    ) -> FusedProduct<'a> {
        let g = self.ctx;
        let w = fused.t();
        let each_part = |x: Tensor<'a>| parts.iter().map(|p| self.matmul(p, x)).collect();
        let on_device = w.is_on_device();
        let device = self
            .device
            .as_ref()
            .filter(|_| x.ne()[2..] == [1, 1] && on_device);
        let Some(d) = device else {
            // libllama's ops on a device (`--kernels fast`, and the runner the oracle checks
            // compare): from WIDE_MIN_COLS columns ggml's CUDA backend multiplies with MMQ,
            // whose split of the K range depends on the weight's rows, so the parts keep
            // libllama's numbers; below that the mat-vec kernel computes each row by itself.
            // Without `fused_in_groups` (gate and up) the parts serve every width, as below.
            if on_device && (x.ne()[1] >= WIDE_MIN_COLS || !fused_in_groups) {
                return FusedProduct::Parts(each_part(x));
            }
            return FusedProduct::Whole(self.matmul(fused, x));
        };
        let wide = d.products == DeviceProducts::Wide
            && w.dtype().has_cuda_mmq()
            && !small_products::by_columns(w, d);
        // Column-invariant products take the fused weight (a row's arithmetic does not depend on
        // the weight it sits in) except for a few columns of gate and up, as groups do.
        let invariant = small_products::by_columns(w, d) && x.ne()[1] > GROUP_COLS;
        if !(fused_in_groups || wide || invariant) {
            return FusedProduct::Parts(each_part(x));
        }
        if self.all_small(x, d) {
            return FusedProduct::Whole(Product { g: self.ctx, w }.small(x, d));
        }
        if d.runs.iter().all(|r| !r.small) {
            return FusedProduct::Parts(each_part(x));
        }
        // A step with both: each run its own way, each part's pieces joined by columns.
        let mut pieces: Vec<Vec<Tensor<'a>>> = vec![Vec::new(); parts.len()];
        for r in &d.runs {
            let xs = columns(g, x, r.first, r.cols);
            if r.small {
                let y = Product { g: self.ctx, w }.small(xs, d);
                let mut offset = 0;
                for (piece, p) in pieces.iter_mut().zip(parts) {
                    let rows = p.t().ne()[1];
                    piece.push(g.view(y, &[rows, r.cols], &[y.nb()[1]], offset));
                    offset += y.dtype().row_size(rows);
                }
            } else {
                for (piece, p) in pieces.iter_mut().zip(parts) {
                    piece.push(g.mul_mat(p.t(), xs));
                }
            }
        }
        FusedProduct::Parts(pieces.into_iter().map(|p| concat_all(g, p, 1)).collect())
    }

    /// The step's output from the output rows' final-normed hidden state `x`: logits through
    /// `head`, soft-capped at `softcap` (0: none), or `x` itself where the step returns hidden
    /// states ([`RowValues::Hidden`]; the head is then not computed).
    pub fn output(&self, head: &'a StoredTensor, x: Tensor<'a>, softcap: f32) -> Tensor<'a> {
        match self.values {
            RowValues::Hidden => x,
            RowValues::Logits => {
                let logits = self.matmul(head, x).named("result_output");
                self.softcap(logits, softcap)
            }
        }
    }

    /// Keeps `x` [n_embd, n_tokens], every row's final-normed hidden state, as the step's
    /// hidden output where it returns one ([`Step::returns_hidden`]).
    pub fn keep_hidden(&mut self, x: Tensor<'a>) {
        if self.returns_hidden {
            self.hidden_out = Some(x);
        }
    }

    /// `cap * tanh(x / cap)`: logit softcapping (Gemma); `x` itself when `cap` is 0.
    pub fn softcap(&self, x: Tensor<'a>, cap: f32) -> Tensor<'a> {
        if cap <= 0.0 {
            return x;
        }
        let g = self.ctx;
        g.scale(g.tanh(g.scale(x, 1.0 / cap)), cap)
    }

    /// A per-head product `w` [k, m, h] x `x` [k, n, h] -> [m, n, h] (MLA's absorption
    /// matrices). With the device layout, each prefill chunk's columns in one op and every other
    /// column in an op of its own, so that a token's kernel does not depend on the step's width.
    pub fn head_matmul(&self, w: &'a StoredTensor, x: Tensor<'a>) -> Tensor<'a> {
        let g = self.ctx;
        let w_t = w.t();
        let [k, n, h, _] = x.ne();
        let d = match &self.device {
            Some(d) if self.kernels == Kernels::BatchInvariant && w_t.is_on_device() && n > 1 => d,
            _ if self.kernels == Kernels::BatchInvariant => {
                return self
                    .float_padded(w_t, x)
                    .unwrap_or_else(|| g.mul_mat(w_t, x))
            }
            _ => return g.mul_mat(w_t, x),
        };
        let nb = x.nb();
        let part = |first: i64, cols: i64| {
            let xs = g.view(x, &[k, cols, h], &[nb[1], nb[2]], first as usize * nb[1]);
            g.mul_mat(w_t, xs)
        };
        concat_all(g, self.per_token_pieces(d, n, part), 1)
    }

    /// The device layout's pieces of an op over `n` columns (tokens): each prefill chunk's
    /// columns in one piece, every other column in a piece of its own (all columns one by one
    /// when `n` is not the step's width: after the output rows were picked).
    pub(crate) fn per_token_pieces(
        &self,
        d: &DeviceStep,
        n: i64,
        part: impl Fn(i64, i64) -> Tensor<'a>,
    ) -> Vec<Tensor<'a>> {
        let runs: Vec<(i64, i64, bool)> = if n == self.n_tokens {
            d.runs.iter().map(|r| (r.first, r.cols, !r.small)).collect()
        } else {
            vec![(0, n, false)]
        };
        let mut pieces = Vec::new();
        for (first, cols, whole) in runs {
            if whole {
                pieces.push(part(first, cols));
            } else {
                pieces.extend((first..first + cols).map(|c| part(c, 1)));
            }
        }
        pieces
    }

    /// `w @ x` plus an optional bias.
    pub fn linear(
        &self,
        w: &'a StoredTensor,
        b: Option<&'a StoredTensor>,
        x: Tensor<'a>,
    ) -> Tensor<'a> {
        let y = self.matmul(w, x);
        match b {
            Some(b) => self.ctx.add(y, b.t()),
            None => y,
        }
    }

    /// Gated FFN: down(act(gate x) * up x).
    pub fn ffn(&self, x: Tensor<'a>, w: FfnWeights<'a>, act: GluOp) -> Tensor<'a> {
        let g = self.matmul(w.gate, x);
        let u = self.matmul(w.up, x);
        self.matmul(w.down, self.ctx.glu(g, u, act))
    }

    /// Stores this step's K and V of layer `il` in their slots, then attends over the visible
    /// slots. q: [head_dim_k, n_head, n], k: [head_dim_k, n_head_kv, n], v: [head_dim_v, n_head_kv, n];
    /// `sinks` [n_head] F32 (gpt-oss): one extra logit per head in every row's softmax.
    /// Returns [head_dim_v * n_head, n].
    pub fn attention(
        &mut self,
        il: usize,
        q: Tensor<'a>,
        k: Tensor<'a>,
        v: Tensor<'a>,
        spec: &AttnSpec,
        sinks: Option<Tensor<'a>>,
    ) -> Tensor<'a> {
        let g = self.ctx;
        let n = self.n_tokens;
        let kc = self.kv.k[il].t();
        let Some(vc) = self.kv.v[il].as_ref().map(|t| t.t()) else {
            panic!("cache layer {il} has no V: attend with Step::attention_latent");
        };
        // Views rather than reshapes (the same rows): ggml's CUDA backend fuses rope -> view ->
        // set_rows (and a preceding RMS norm) into one kernel that writes the rotated keys
        // straight into their slots, as llama.cpp's graphs have it. A token's heads lie side by
        // side; its row may be a stretch of a wider one (V from a fused QKV product).
        let rows = |t: Tensor<'a>, d: i64| {
            let nb = t.nb();
            if nb[1] == t.dtype().row_size(d) && nb[2] >= nb[1] * spec.n_head_kv as usize {
                g.view(t, &[d * spec.n_head_kv, n], &[t.nb()[2]], 0)
            } else {
                g.reshape(t, &[d * spec.n_head_kv, n])
            }
        };
        let k_rows = rows(k, spec.head_dim_k);
        let v_rows = rows(v, spec.head_dim_v);
        let k_written = g.set_rows(kc, k_rows, self.slots);
        let v_written = g.set_rows(vc, v_rows, self.slots);
        self.graph.expand(k_written);
        self.graph.expand(v_written);
        self.kv_written.push((il, k_written, v_written));
        self.attend_heads(il, q, Heads { spec, sinks })
    }

    /// Multi-head latent attention (DeepSeek V2/V3, GLM-4.7-Flash): stores this step's rows of
    /// layer `il`'s K-only cache, k [head_dim_k, 1, n] (the compressed latent, then the rotated
    /// part), and attends with V read from the first `head_dim_v` values of each K row (the
    /// latent itself): one row per token in the pool, not one per head. Returns
    /// [head_dim_v * n_head, n].
    pub fn attention_latent(
        &mut self,
        il: usize,
        q: Tensor<'a>,
        k: Tensor<'a>,
        spec: &AttnSpec,
    ) -> Tensor<'a> {
        let g = self.ctx;
        let k_rows = g.reshape(k, &[spec.head_dim_k, self.n_tokens]);
        let k_written = g.set_rows(self.kv.k[il].t(), k_rows, self.slots);
        self.graph.expand(k_written);
        self.kv_written.push((il, k_written, k_written));
        self.attend(il, q, spec)
    }

    /// Attention of `q` over cache layer `il` as written earlier in this step (by
    /// [`Step::attention`] or [`Step::attention_latent`]): for layers that reuse an earlier
    /// layer's keys and values (Gemma 4's KV-shared layers). Returns [head_dim_v * n_head, n].
    pub fn attend(&self, il: usize, q: Tensor<'a>, spec: &AttnSpec) -> Tensor<'a> {
        self.attend_heads(il, q, Heads { spec, sinks: None })
    }

    fn attend_heads(&self, il: usize, q: Tensor<'a>, heads: Heads<'_, 'a>) -> Tensor<'a> {
        let (g, spec) = (self.ctx, heads.spec);
        let n = self.n_tokens;
        let kc = self.kv.k[il].t();
        // A K-only (latent) cache: V is the start of each K row.
        let vc = self.kv.v[il].as_ref().map_or(kc, |t| t.t());
        let Some(&(_, k_written, v_written)) = self.kv_written.iter().find(|w| w.0 == il) else {
            panic!("cache layer {il} is read before it is written in the step");
        };
        if let Some(d) = &self.device {
            // Ops read the cache itself (written above, earlier in the graph), as the host path
            // does; gathered slots are copied from the writes, so that the gather follows them,
            // bit for bit.
            let (ks, vs) = match self.kv_ids {
                None => (kc, vc),
                Some(ids) => (g.gather_rows(k_written, ids), g.gather_rows(v_written, ids)),
            };
            // Paged attention reads the cache through the writes, so that it follows them.
            return self.attention_device(d, q, (ks, vs), (k_written, v_written), heads);
        }
        let invariant = self.kernels == Kernels::BatchInvariant;
        let whole = [AttnGroup {
            first: 0,
            rows: n,
            tiled: false,
            split_kv: None,
        }];
        let groups: &[AttnGroup] = if !invariant || self.attn_groups.is_empty() {
            &whole
        } else {
            &self.attn_groups
        };
        let rows_op = |a: &AttnGroup| a.tiled && a.rows < TILED_ROWS;
        // The row op reads scattered slots itself; ggml's kernel needs them gathered.
        let read_scattered = self.kv_ids.is_some() && groups.iter().all(rows_op);
        let cache_view = |cache: Tensor<'a>, d: i64, slots: i64| {
            g.view(
                cache,
                &[d, spec.n_head_kv, slots],
                &[cache.dtype().row_size(d), cache.nb()[1]],
                0,
            )
        };
        let (kview, vview) = match self.kv_ids {
            Some(_) if read_scattered => (
                cache_view(kc, spec.head_dim_k, kc.ne()[1]),
                cache_view(vc, spec.head_dim_v, vc.ne()[1]),
            ),
            None => {
                let row_k = kc.dtype().row_size(spec.head_dim_k);
                let row_v = vc.dtype().row_size(spec.head_dim_v);
                (
                    g.view(
                        kc,
                        &[spec.head_dim_k, spec.n_head_kv, self.n_kv],
                        &[row_k, kc.nb()[1]],
                        0,
                    ),
                    g.view(
                        vc,
                        &[spec.head_dim_v, spec.n_head_kv, self.n_kv],
                        &[row_v, vc.nb()[1]],
                        0,
                    ),
                )
            }
            Some(ids) => {
                // get_rows yields F32; back to the cache's F16 (exact) so that the attention
                // kernel is the same one the direct path uses.
                // A view, not a reshape: V may be the start of each gathered K row.
                let gather = |cache: Tensor<'a>, d: i64| {
                    let rows = g.cast(g.get_rows(cache, ids), cache.dtype());
                    let head = rows.dtype().row_size(d);
                    g.view(
                        rows,
                        &[d, spec.n_head_kv, self.n_kv],
                        &[head, rows.nb()[1]],
                        0,
                    )
                };
                (
                    gather(k_written, spec.head_dim_k),
                    gather(v_written, spec.head_dim_v),
                )
            }
        };
        let kview = g.permute(kview, [0, 2, 1, 3]);
        let vview = g.permute(vview, [0, 2, 1, 3]);
        let mask = self.layer_mask(spec);
        // One op per attention group (see `attn_groups`), so that each row's arithmetic depends
        // on its own sequence's rows, not on the whole batch's.
        let width = spec.head_dim_v * spec.n_head;
        let mut outs = Vec::with_capacity(groups.len());
        for group in groups {
            let (first, rows) = (group.first, group.rows);
            let (qg, mg) = if (first, rows) == (0, n) {
                (q, mask)
            } else {
                let qn = q.nb();
                let mn = mask.nb();
                (
                    g.view(
                        q,
                        &[spec.head_dim_k, spec.n_head, rows],
                        &[qn[1], qn[2]],
                        first as usize * qn[2],
                    ),
                    g.view(mask, &[self.n_kv, rows], &[mn[1]], first as usize * mn[1]),
                )
            };
            if let Some((col, cols)) = group.split_kv {
                // The row's own view: its sequence's keys from position 0, `cols` wide (the
                // columns past the row's position are masked).
                let kv_cols = |t: Tensor<'a>| {
                    let [d, _, heads, _] = t.ne();
                    let nb = t.nb();
                    g.view(t, &[d, cols, heads], &[nb[1], nb[2]], col as usize * nb[1])
                };
                let mn = mask.nb();
                let mg = g.view(
                    mask,
                    &[cols, 1],
                    &[mn[1]],
                    first as usize * mn[1] + col as usize * mn[0],
                );
                let qg = g.permute(qg, [0, 2, 1, 3]);
                let o = heads.flash(g, qg, kv_cols(kview), kv_cols(vview), mg);
                let o = g.reshape(o, &[width, 1]);
                outs.push(o);
                continue;
            }
            if rows_op(group) {
                let ids = self.kv_ids.filter(|_| read_scattered);
                let o = g
                    .flash_attn_rows(RowAttention {
                        q: g.permute(qg, [0, 2, 1, 3]),
                        k: kview,
                        v: vview,
                        mask: mg,
                        ids,
                        sinks: heads.sinks,
                        scale: spec.scale,
                        softcap: spec.softcap,
                    })
                    .unwrap_or_else(|| {
                        unreachable!("the runner turns row attention on only where the op applies")
                    });
                let o = g.reshape(o, &[width, rows]);
                outs.push(o);
                continue;
            }
            // A one-row op over 512 or more slots would take the CPU's split-KV kernel: attend with
            // the row twice instead (the one-pass kernel, as in every wider op) and keep the first.
            let twice =
                invariant && rows == 1 && self.n_kv >= FA_SPLIT_KV_SLOTS && kc.is_plain_host();
            let (qg, mg) = if twice {
                (g.concat(qg, qg, 2), g.concat(mg, mg, 1))
            } else {
                (qg, mg)
            };
            let o = heads.flash(g, g.permute(qg, [0, 2, 1, 3]), kview, vview, mg);
            let o = if twice {
                g.view(o, &[width, 1], &[o.nb()[2]], 0)
            } else {
                g.reshape(o, &[width, rows])
            };
            outs.push(o);
        }
        // A step has at least one attention group.
        concat_all(g, outs, 1)
    }

    /// The mask a layer attends with: the sliding-window one for sliding layers (when the model
    /// has one), the full one otherwise.
    fn layer_mask(&self, spec: &AttnSpec) -> Tensor<'a> {
        if spec.sliding {
            self.mask_swa.unwrap_or(self.mask)
        } else {
            self.mask
        }
    }
}

/// A layer's attention heads as one op sees them: their shape and scale, and the sinks the
/// layer's softmax has (gpt-oss: one extra logit per head in every row), if any.
#[derive(Debug, Clone, Copy)]
struct Heads<'s, 'a> {
    spec: &'s AttnSpec,
    sinks: Option<Tensor<'a>>,
}

impl<'a> Heads<'_, 'a> {
    /// ggml's fused attention with the layer's scale, softcap and sinks.
    fn flash(
        &self,
        g: &'a Context,
        q: Tensor<'a>,
        k: Tensor<'a>,
        v: Tensor<'a>,
        mask: Tensor<'a>,
    ) -> Tensor<'a> {
        let o = g.flash_attn(q, k, v, mask, self.spec.scale, self.spec.softcap);
        self.add_sinks(g, o);
        o
    }

    /// Gives a fused attention op the layer's sinks.
    fn add_sinks(&self, g: &'a Context, o: Tensor<'a>) {
        if let Some(s) = self.sinks {
            g.flash_attn_add_sinks(o, s);
        }
    }
}

/// What [`Step::matmul_fused`] gives: the fused weight's product (the parts' outputs one
/// after another in each column), or each part's product.
#[derive(Debug)]
pub enum FusedProduct<'a> {
    /// [sum of the parts' rows, n].
    Whole(Tensor<'a>),
    /// [part rows, n] each, in the parts' order.
    Parts(Vec<Tensor<'a>>),
}
