//! libllama in-process, for tests (reference logits and tokenization) and benchmarks (the
//! baseline). Never Axle's execution path. Same crate, same ggml build, same file.
use crate::backend::ThreadPool;
use crate::{Error, Result};
use llama_cpp_sys_2 as sys;
use smart_default::SmartDefault;
use std::ffi::CString;
use std::path::Path;

mod mtp;
pub use mtp::{MtpOracle, MtpRows};

/// A token id.
pub type Token = i32;

/// A libllama model with one context.
#[derive(Debug)]
pub struct LlamaOracle {
    model: *mut sys::llama_model,
    ctx: *mut sys::llama_context,
    /// Dropped after the context that uses it.
    _threadpool: Option<ThreadPool>,
    n_vocab: usize,
    n_batch: usize,
}

// SAFETY: used from one thread at a time; not Sync.
unsafe impl Send for LlamaOracle {}

impl Drop for LlamaOracle {
    fn drop(&mut self) {
        // SAFETY: pointers came from libllama constructors and are freed once, context first; the
        // thread pool, a field, is freed after them.
        unsafe {
            sys::llama_free(self.ctx);
            sys::llama_model_free(self.model);
        }
    }
}

/// Options of the oracle context.
#[derive(Debug, Clone, SmartDefault)]
pub struct OracleOptions {
    /// Context length (KV cells).
    #[default(4096)]
    pub n_ctx: u32,
    /// Threads.
    #[default(2)]
    pub n_threads: usize,
    /// Max sequences decoded together.
    #[default(1)]
    pub n_seq_max: u32,
    /// Load only the vocabulary (for tokenizer tests).
    pub vocab_only: bool,
    /// Logical batch size.
    #[default(512)]
    pub n_batch: u32,
    /// Layers offloaded to the registered GPUs (0: CPU only; more than the model has: every
    /// layer and the output head).
    pub n_gpu_layers: i32,
    /// Flash attention (on, as Axle runs; off to see how libllama disagrees with itself).
    #[default(true)]
    pub flash_attn: bool,
    /// How libllama spreads the offloaded layers over several GPUs.
    #[default(SplitMode::Layer)]
    pub split_mode: SplitMode,
    /// One KV stream shared by every sequence (what the exactness tests use), or one stream per
    /// sequence as llama.cpp's tools run by default: with one shared stream, every sequence's
    /// attention spans the cells of all of them.
    #[default(true)]
    pub kv_unified: bool,
    /// A context computing pooled embeddings instead of logits ([`LlamaOracle::embed`]), with
    /// libllama's pooling type (1 mean, 2 cls, 3 last); `None`: logits.
    pub pooling: Option<i32>,
}

/// libllama's ways of using several GPUs (`llama_split_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SplitMode {
    /// Contiguous layer ranges per device (`--split-mode layer`, the default).
    #[default]
    Layer,
    /// Matrix rows across devices through the backend's split buffers (`--split-mode row`;
    /// libllama refuses it where the backend has none).
    Row,
    /// Tensor parallelism through ggml's meta device (`--split-mode tensor`).
    Tensor,
}

impl std::str::FromStr for SplitMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "layer" => Ok(SplitMode::Layer),
            "row" => Ok(SplitMode::Row),
            "tensor" => Ok(SplitMode::Tensor),
            _ => Err(Error::Oracle(format!(
                "unknown split mode `{s}` (layer, row or tensor)"
            ))),
        }
    }
}

impl SplitMode {
    /// The name llama.cpp's tools take.
    pub fn name(self) -> &'static str {
        match self {
            SplitMode::Layer => "layer",
            SplitMode::Row => "row",
            SplitMode::Tensor => "tensor",
        }
    }
}

impl LlamaOracle {
    /// Loads `path` with F16 KV, a persistent thread pool and, by default, flash attention on
    /// and every layer on the CPU (as Axle runs there).
    pub fn load(path: &Path, opts: &OracleOptions) -> Result<LlamaOracle> {
        let model = load_model(path, opts, false)?;
        // SAFETY: `model` is live (freed below on error, else owned by the oracle).
        unsafe {
            let vocab = sys::llama_model_get_vocab(model);
            let n_vocab = sys::llama_vocab_n_tokens(vocab) as usize;
            if opts.vocab_only {
                return Ok(LlamaOracle {
                    model,
                    ctx: std::ptr::null_mut(),
                    _threadpool: None,
                    n_vocab,
                    n_batch: 0,
                });
            }
            let (ctx, threadpool) = match new_context(model, opts, sys::LLAMA_CONTEXT_TYPE_DEFAULT)
            {
                Ok(c) => c,
                Err(e) => {
                    sys::llama_model_free(model);
                    return Err(e);
                }
            };
            Ok(LlamaOracle {
                model,
                ctx,
                _threadpool: threadpool,
                n_vocab,
                n_batch: opts.n_batch as usize,
            })
        }
    }

    /// Vocabulary size.
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    fn vocab(&self) -> *const sys::llama_vocab {
        // SAFETY: live model.
        unsafe { sys::llama_model_get_vocab(self.model) }
    }

    /// libllama's tokenization of `text`.
    pub fn tokenize(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<Token>> {
        let mut out = vec![0; text.len() + 8];
        let tokenize = |out: &mut Vec<Token>| {
            // SAFETY: text pointer/len pair is valid; out has the capacity passed.
            unsafe {
                sys::llama_tokenize(
                    self.vocab(),
                    text.as_ptr().cast(),
                    text.len() as i32,
                    out.as_mut_ptr(),
                    out.len() as i32,
                    add_special,
                    parse_special,
                )
            }
        };
        let mut n = tokenize(&mut out);
        if n < 0 {
            // Retried with the size libllama asked for.
            out.resize((-n) as usize, 0);
            n = tokenize(&mut out);
            if n < 0 {
                return Err(Error::Oracle("tokenize failed".into()));
            }
        }
        out.truncate(n as usize);
        Ok(out)
    }

    /// libllama's bytes for one token (`special` renders control tokens).
    pub fn token_to_piece(&self, token: Token, special: bool) -> Vec<u8> {
        let mut buf = vec![0u8; 64];
        let piece = |buf: &mut Vec<u8>| {
            // SAFETY: buf has the length passed.
            unsafe {
                sys::llama_token_to_piece(
                    self.vocab(),
                    token,
                    buf.as_mut_ptr().cast(),
                    buf.len() as i32,
                    0,
                    special,
                )
            }
        };
        let mut n = piece(&mut buf);
        if n < 0 {
            // Retried with the size libllama asked for.
            buf.resize((-n) as usize, 0);
            n = piece(&mut buf);
        }
        buf.truncate(n.max(0) as usize);
        buf
    }

    /// Clears the KV cache.
    pub fn clear(&mut self) {
        // SAFETY: live context.
        unsafe { sys::llama_memory_clear(sys::llama_get_memory(self.ctx), true) }
    }

    /// Removes positions >= `from` of sequence `seq` from the cache.
    pub fn truncate(&mut self, seq: i32, from: i32) {
        // SAFETY: live context.
        unsafe { sys::llama_memory_seq_rm(sys::llama_get_memory(self.ctx), seq, from, -1) };
    }

    /// Decodes one batch of (token, position, sequence, wants_logits) entries and returns the
    /// logits of the entries that asked for them, in order.
    pub fn decode(&mut self, entries: &[(Token, i32, i32, bool)]) -> Result<Vec<Vec<f32>>> {
        self.decode_then(entries, |ctx, n_vocab| {
            let mut out = Vec::new();
            for (i, e) in entries.iter().enumerate() {
                if e.3 {
                    // SAFETY: the decode succeeded and entry i asked for logits, so libllama
                    // holds n_vocab floats for it until the next decode.
                    unsafe {
                        let p = sys::llama_get_logits_ith(ctx, i as i32);
                        out.push(std::slice::from_raw_parts(p, n_vocab).to_vec());
                    }
                }
            }
            out
        })
    }

    /// Decodes one batch as [`LlamaOracle::decode`] does and waits for the device, without
    /// reading any logits back: what llama.cpp's own benchmarks time.
    pub fn decode_unread(&mut self, entries: &[(Token, i32, i32, bool)]) -> Result<()> {
        self.decode_then(entries, |ctx, _| {
            // SAFETY: live context.
            unsafe { sys::llama_synchronize(ctx) }
        })
    }

    fn decode_then<T>(
        &mut self,
        entries: &[(Token, i32, i32, bool)],
        after: impl FnOnce(*mut sys::llama_context, usize) -> T,
    ) -> Result<T> {
        if self.ctx.is_null() {
            return Err(Error::Oracle("vocab-only oracle cannot decode".into()));
        }
        decode_on(self.ctx, self.n_vocab, self.n_batch, entries, after)
    }

    /// The pooled embedding of `tokens` as sequence 0 of a context loaded with
    /// [`OracleOptions::pooling`], after clearing the cache; every token in one batch (libllama
    /// pools a sequence within one batch).
    pub fn embed(&mut self, tokens: &[Token]) -> Result<Vec<f32>> {
        self.clear();
        let entries: Vec<_> = tokens
            .iter()
            .enumerate()
            .map(|(i, &t)| (t, i as i32, 0, true))
            .collect();
        self.decode_then(&entries, |ctx, _| {
            // SAFETY: live model and context; after a successful decode of sequence 0 with
            // pooling on, libllama holds n_embd floats for it (null when pooling is off).
            unsafe {
                let n_embd = sys::llama_model_n_embd(sys::llama_get_model(ctx)) as usize;
                let p = sys::llama_get_embeddings_seq(ctx, 0);
                if p.is_null() {
                    return Err(Error::Oracle(
                        "no pooled embeddings: load with a pooling".into(),
                    ));
                }
                Ok(std::slice::from_raw_parts(p, n_embd).to_vec())
            }
        })?
    }

    /// Processes a prompt for sequence 0 from position `start` in batches, returning the last logits.
    pub fn prefill(&mut self, tokens: &[Token], start: i32) -> Result<Vec<f32>> {
        let mut last = Vec::new();
        let n = tokens.len();
        for (c, chunk) in tokens.chunks(self.n_batch.max(1)).enumerate() {
            let base = c * self.n_batch;
            let entries: Vec<_> = chunk
                .iter()
                .enumerate()
                .map(|(i, &t)| (t, start + (base + i) as i32, 0, base + i + 1 == n))
                .collect();
            let mut out = self.decode(&entries)?;
            if let Some(l) = out.pop() {
                last = l;
            }
        }
        Ok(last)
    }
}

/// Decodes one batch of (token, position, sequence, wants_logits) entries in `ctx` (at most
/// `n_batch`) and runs `after` on the context and `n_vocab` once the decode succeeded.
fn decode_on<T>(
    ctx: *mut sys::llama_context,
    n_vocab: usize,
    n_batch: usize,
    entries: &[(Token, i32, i32, bool)],
    after: impl FnOnce(*mut sys::llama_context, usize) -> T,
) -> Result<T> {
    if entries.is_empty() || entries.len() > n_batch {
        return Err(Error::Oracle(format!(
            "batch of {} entries (max {n_batch})",
            entries.len()
        )));
    }
    // SAFETY: `ctx` is a live context (the callers own it); batch allocated for entries.len()
    // tokens and one seq id each; all writes are in bounds; `after` runs only on a successful
    // decode; batch freed before return.
    unsafe {
        let mut batch = sys::llama_batch_init(entries.len() as i32, 0, 1);
        for (i, &(tok, pos, seq, logits)) in entries.iter().enumerate() {
            *batch.token.add(i) = tok;
            *batch.pos.add(i) = pos;
            *batch.n_seq_id.add(i) = 1;
            *(*batch.seq_id.add(i)) = seq;
            *batch.logits.add(i) = logits as i8;
        }
        batch.n_tokens = entries.len() as i32;
        let rc = sys::llama_decode(ctx, batch);
        let out = (rc == 0).then(|| after(ctx, n_vocab));
        sys::llama_batch_free(batch);
        out.ok_or_else(|| Error::Oracle(format!("llama_decode returned {rc}")))
    }
}

/// Loads `path` as `opts` say (`mtp`: with its next-token-prediction layers).
fn load_model(path: &Path, opts: &OracleOptions, mtp: bool) -> Result<*mut sys::llama_model> {
    crate::quiet_logs();
    let cpath = CString::new(path.as_os_str().to_string_lossy().as_bytes())
        .map_err(|e| Error::Oracle(e.to_string()))?;
    // SAFETY: default-initialised params, valid path; the result is checked for null.
    unsafe {
        sys::llama_backend_init();
        let mut mp = sys::llama_model_default_params();
        mp.n_gpu_layers = opts.n_gpu_layers;
        mp.split_mode = match opts.split_mode {
            SplitMode::Layer => sys::LLAMA_SPLIT_MODE_LAYER,
            SplitMode::Row => sys::LLAMA_SPLIT_MODE_ROW,
            SplitMode::Tensor => sys::LLAMA_SPLIT_MODE_TENSOR,
        };
        mp.vocab_only = opts.vocab_only;
        mp.load_mtp = mtp;
        let model = sys::llama_model_load_from_file(cpath.as_ptr(), mp);
        if model.is_null() {
            return Err(Error::Oracle(format!("cannot load {}", path.display())));
        }
        Ok(model)
    }
}

/// A context of `kind` over `model` with F16 KV and a persistent thread pool of its own.
///
/// # Safety
/// `model` must be live, and outlive the context.
unsafe fn new_context(
    model: *mut sys::llama_model,
    opts: &OracleOptions,
    kind: sys::llama_context_type,
) -> Result<(*mut sys::llama_context, Option<ThreadPool>)> {
    let mut cp = sys::llama_context_default_params();
    cp.n_ctx = opts.n_ctx;
    cp.n_batch = opts.n_batch;
    cp.n_ubatch = opts.n_batch;
    cp.n_seq_max = opts.n_seq_max;
    cp.n_threads = opts.n_threads as i32;
    cp.n_threads_batch = opts.n_threads as i32;
    cp.flash_attn_type = if opts.flash_attn {
        sys::LLAMA_FLASH_ATTN_TYPE_ENABLED
    } else {
        sys::LLAMA_FLASH_ATTN_TYPE_DISABLED
    };
    cp.kv_unified = opts.kv_unified;
    cp.no_perf = true;
    cp.ctx_type = kind;
    if let Some(p) = opts.pooling {
        cp.embeddings = true;
        cp.pooling_type = p;
    }
    // SAFETY: the caller keeps `model` live.
    let ctx = unsafe { sys::llama_init_from_model(model, cp) };
    if ctx.is_null() {
        return Err(Error::Oracle("cannot create llama context".into()));
    }
    let threadpool = ThreadPool::new(opts.n_threads as i32);
    if let Some(tp) = &threadpool {
        // SAFETY: live context and pool; the pool is dropped after the context by its owner.
        unsafe { sys::llama_attach_threadpool(ctx, tp.raw(), tp.raw()) };
    }
    Ok((ctx, threadpool))
}

/// llama.cpp's quantize tool in process (`llama_model_quantize`): the float GGUF at `input`
/// written to `output` as `ftype` (`LLAMA_FTYPE_MOSTLY_*`, e.g. 7 for Q8_0, 15 for Q4_K_M),
/// without an importance matrix, on `threads` threads.
pub fn quantize_file(input: &Path, output: &Path, ftype: u32, threads: usize) -> Result<()> {
    crate::quiet_logs();
    let c = |p: &Path| {
        CString::new(p.as_os_str().to_string_lossy().as_bytes())
            .map_err(|e| Error::Oracle(e.to_string()))
    };
    let (inp, out) = (c(input)?, c(output)?);
    // SAFETY: default-initialised params with the file type and threads set; both paths are
    // NUL-terminated and outlive the call.
    let status = unsafe {
        sys::llama_backend_init();
        let mut params = sys::llama_model_quantize_default_params();
        params.ftype = ftype;
        params.nthread = threads as i32;
        sys::llama_model_quantize(inp.as_ptr(), out.as_ptr(), &params)
    };
    if status != 0 {
        return Err(Error::Oracle(format!(
            "llama_model_quantize {} -> {} failed ({status})",
            input.display(),
            output.display()
        )));
    }
    Ok(())
}
