//! libllama's next-token-prediction (MTP) head, for tests: the trunk's final-normed hidden state
//! of every row from a context that returns it, and the head's logits from an MTP context
//! (`LLAMA_CONTEXT_TYPE_MTP`) over the same model, fed each token with the hidden state of the
//! row before it, as llama.cpp's MTP drafter feeds it.
use super::{decode_on, load_model, new_context, OracleOptions, Token};
use crate::backend::ThreadPool;
use crate::{Error, Result};
use llama_cpp_sys_2 as sys;
use std::path::Path;

// libllama's staging API (`src/llama-ext.h`), which the crate's bindings leave out. The header
// declares it outside `extern "C"`, so the symbols carry C++ (Itanium ABI) names; the arguments
// are plain pointers, bools and ints, passed as C passes them.
extern "C" {
    #[link_name = "_Z26llama_set_embeddings_nextnP13llama_contextbb"]
    fn llama_set_embeddings_nextn(ctx: *mut sys::llama_context, value: bool, masked: bool);
    #[link_name = "_Z30llama_get_embeddings_nextn_ithP13llama_contexti"]
    fn llama_get_embeddings_nextn_ith(ctx: *mut sys::llama_context, i: i32) -> *mut f32;
}

/// A model loaded with its MTP layers, a trunk context and an MTP context.
#[derive(Debug)]
pub struct MtpOracle {
    model: *mut sys::llama_model,
    trunk: *mut sys::llama_context,
    head: *mut sys::llama_context,
    batch: *mut sys::llama_batch_ext,
    _pools: (Option<ThreadPool>, Option<ThreadPool>),
    n_vocab: usize,
    n_embd: usize,
    n_batch: usize,
}

// SAFETY: used from one thread at a time; not Sync.
unsafe impl Send for MtpOracle {}

impl Drop for MtpOracle {
    fn drop(&mut self) {
        // SAFETY: pointers came from libllama constructors and are freed once, batch and
        // contexts before the model; the thread pools, a field, are freed after them.
        unsafe {
            sys::llama_batch_ext_free(self.batch);
            sys::llama_free(self.head);
            sys::llama_free(self.trunk);
            sys::llama_model_free(self.model);
        }
    }
}

/// What the MTP head gives for each of a batch's entries.
#[derive(Debug, Clone, Default)]
pub struct MtpRows {
    /// Logits, one row per entry.
    pub logits: Vec<Vec<f32>>,
    /// The head's final-normed hidden state (what feeds its next draft), `n_embd` floats per
    /// entry.
    pub hidden: Vec<f32>,
}

impl MtpOracle {
    /// Loads `path` with its MTP layers (refused where it has none) and makes both contexts.
    pub fn load(path: &Path, opts: &OracleOptions) -> Result<MtpOracle> {
        let model = load_model(path, opts, true)?;
        // SAFETY: `model` is live; every context made is freed on the error paths before it.
        unsafe {
            let fail = |msg: String, ctxs: &[*mut sys::llama_context]| {
                for &c in ctxs {
                    sys::llama_free(c);
                }
                sys::llama_model_free(model);
                Err(Error::Oracle(msg))
            };
            if sys::llama_model_n_layer_nextn(model) < 1 {
                return fail(format!("{} has no MTP layers", path.display()), &[]);
            }
            let n_vocab = sys::llama_vocab_n_tokens(sys::llama_model_get_vocab(model)) as usize;
            let n_embd = sys::llama_model_n_embd(model) as usize;
            let (trunk, p1) = match new_context(model, opts, sys::LLAMA_CONTEXT_TYPE_DEFAULT) {
                Ok(c) => c,
                Err(e) => return fail(e.to_string(), &[]),
            };
            let (head, p2) = match new_context(model, opts, sys::LLAMA_CONTEXT_TYPE_MTP) {
                Ok(c) => c,
                Err(e) => return fail(e.to_string(), &[trunk]),
            };
            llama_set_embeddings_nextn(trunk, true, false);
            llama_set_embeddings_nextn(head, true, true);
            let batch = sys::llama_batch_ext_init(head);
            if batch.is_null() {
                return fail("cannot make an extended batch".into(), &[head, trunk]);
            }
            Ok(MtpOracle {
                model,
                trunk,
                head,
                batch,
                _pools: (p1, p2),
                n_vocab,
                n_embd,
                n_batch: opts.n_batch as usize,
            })
        }
    }

    /// Hidden size.
    pub fn n_embd(&self) -> usize {
        self.n_embd
    }

    /// Empties both contexts' caches.
    pub fn clear(&mut self) {
        // SAFETY: live contexts.
        unsafe {
            sys::llama_memory_clear(sys::llama_get_memory(self.trunk), true);
            sys::llama_memory_clear(sys::llama_get_memory(self.head), true);
        }
    }

    /// Decodes `tokens` as sequence 0 from position `start` in the trunk context (one batch)
    /// and returns every row's final-normed hidden state (`n_embd` floats a row) and the last
    /// row's logits.
    pub fn trunk(&mut self, tokens: &[Token], start: i32) -> Result<(Vec<f32>, Vec<f32>)> {
        let n = tokens.len();
        let entries: Vec<_> = (0..n)
            .map(|i| (tokens[i], start + i as i32, 0, i + 1 == n))
            .collect();
        let e = self.n_embd;
        decode_on(
            self.trunk,
            self.n_vocab,
            self.n_batch,
            &entries,
            |ctx, n_vocab| {
                // SAFETY: the decode succeeded: libllama holds the hidden state of each of the n
                // rows (unmasked) and the last row's n_vocab logits until the next decode.
                unsafe {
                    let mut hidden = Vec::with_capacity(n * e);
                    for i in 0..n {
                        let p = llama_get_embeddings_nextn_ith(ctx, i as i32);
                        if p.is_null() {
                            return Err(Error::Oracle(format!("no hidden state for row {i}")));
                        }
                        hidden.extend_from_slice(std::slice::from_raw_parts(p, e));
                    }
                    let p = sys::llama_get_logits_ith(ctx, n as i32 - 1);
                    let logits = std::slice::from_raw_parts(p, n_vocab).to_vec();
                    Ok((hidden, logits))
                }
            },
        )?
    }

    /// Runs the MTP head over `entries` (token, position) of sequence 0 in one batch, entry `i`
    /// fed `hidden[i * n_embd..]`, and returns every entry's logits and hidden state.
    pub fn head(&mut self, entries: &[(Token, i32)], hidden: &[f32]) -> Result<MtpRows> {
        let e = self.n_embd;
        if entries.is_empty() || entries.len() > self.n_batch || hidden.len() != entries.len() * e {
            return Err(Error::Oracle(format!(
                "{} entries (max {}) with {} hidden values",
                entries.len(),
                self.n_batch,
                hidden.len()
            )));
        }
        // SAFETY: live batch and context; each entry's hidden row is a view into `hidden`, which
        // outlives the process call; rows are read after a successful process, for entries
        // that asked for output.
        unsafe {
            sys::llama_batch_ext_clear(self.batch);
            for (i, &(t, pos)) in entries.iter().enumerate() {
                let idx = sys::llama_batch_ext_add_token(self.batch, 0, t);
                if idx != i as i32 {
                    return Err(Error::Oracle(format!("cannot add entry {i} ({idx})")));
                }
                let embd = sys::llama_embd {
                    data: hidden[i * e..].as_ptr(),
                    n_rows: 1,
                    n_embd: e,
                };
                let ok = sys::llama_batch_ext_set_pos(self.batch, idx, &pos)
                    && sys::llama_batch_ext_set_embd_token(self.batch, idx, embd)
                    && sys::llama_batch_ext_set_output_logits(self.batch, idx, true);
                if !ok {
                    return Err(Error::Oracle(format!("cannot set entry {i}")));
                }
            }
            let rc = sys::llama_process(self.head, sys::LLAMA_PROCESS_TYPE_DECODE, self.batch);
            if rc != 0 {
                return Err(Error::Oracle(format!("llama_process returned {rc}")));
            }
            let mut out = MtpRows::default();
            for i in 0..entries.len() {
                let p = sys::llama_get_logits_ith(self.head, i as i32);
                let h = llama_get_embeddings_nextn_ith(self.head, i as i32);
                if p.is_null() || h.is_null() {
                    return Err(Error::Oracle(format!("no output for entry {i}")));
                }
                out.logits
                    .push(std::slice::from_raw_parts(p, self.n_vocab).to_vec());
                out.hidden
                    .extend_from_slice(std::slice::from_raw_parts(h, e));
            }
            Ok(out)
        }
    }
}
