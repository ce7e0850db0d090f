//! One choice's constraint. Its parser is shared with a mask thread: the engine thread moves the
//! parser past every emitted token itself (and takes what the grammar then forces) and checks
//! drafts against it, then, as the step is about to run ([`TokenConstraint::prepare`]), leaves
//! the next mask to the mask thread, which computes it while the engine runs the model's forward
//! pass. The engine thread only waits when it needs the mask before the thread has it, and never
//! for a thread to wake up just to answer: a mask the thread has not started is computed in
//! place.
use crate::digits::{DigitRuns, DigitState};
use crate::StructuredError;
use axle_core::{Advanced, Allowed, ConstraintTiming, TokenConstraint, TokenId, TokenMask};
use llguidance::Matcher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

impl GrammarConstraint {
    /// `worker` shared with a new mask thread.
    pub(crate) fn threaded(worker: Worker) -> Result<GrammarConstraint, StructuredError> {
        let timing = worker.timing.clone();
        let shared = Arc::new(Shared {
            slot: Mutex::new(Slot { worker, go: false }),
            wake: Condvar::new(),
            closed: AtomicBool::new(false),
        });
        let thread_shared = shared.clone();
        std::thread::Builder::new()
            .name("axle-grammar".into())
            .spawn(move || serve_masks(&thread_shared))
            .map_err(|e| StructuredError::Worker(e.to_string()))?;
        Ok(GrammarConstraint::Threaded {
            shared,
            timing,
            wait_us: 0,
        })
    }
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    masks: AtomicU64,
    compute_us: AtomicU64,
}

/// A constraint's parser, shared by the engine thread and its mask thread.
pub(crate) struct Shared {
    slot: Mutex<Slot>,
    /// Wakes the mask thread when a mask is asked for or the constraint is dropped.
    wake: Condvar,
    /// The constraint was dropped: the mask thread ends. Set without the lock, so that dropping
    /// never waits for a mask nobody will use.
    closed: AtomicBool,
}

pub(crate) struct Slot {
    worker: Worker,
    /// The engine asked for the next mask ([`TokenConstraint::prepare`]).
    go: bool,
}

/// How long the mask thread sleeps at most before it looks whether the constraint was dropped
/// (a drop's wake-up can come between its look and its sleep).
const CLOSED_POLL: Duration = Duration::from_millis(50);

/// The mask thread: computes each mask the engine asks for, holding the parser while it does,
/// and sleeps otherwise. Ends when the constraint is dropped (or a computation panicked).
fn serve_masks(shared: &Shared) {
    let Ok(mut slot) = shared.slot.lock() else {
        return;
    };
    loop {
        if shared.closed.load(Ordering::Acquire) {
            return;
        }
        if std::mem::take(&mut slot.go) && slot.worker.wants_mask() {
            slot.worker.precompute();
            continue;
        }
        slot = match shared.wake.wait_timeout(slot, CLOSED_POLL) {
            Ok((s, _)) => s,
            Err(_) => return,
        };
    }
}

pub(crate) struct Worker {
    matcher: Matcher,
    force: bool,
    mask: Option<Result<Allowed, String>>,
    /// The next mask is wanted (the parser moved and is not finished) and not computed yet.
    wanted: bool,
    timing: Arc<Counters>,
    digits: Option<(Arc<DigitRuns>, usize)>,
    /// Digits at the end of the output so far.
    run: DigitState,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").field("digits", &self.run).finish()
    }
}

impl Worker {
    /// A worker moving `matcher`, bounding runs of digits as `digits` says.
    pub(crate) fn new(
        matcher: Matcher,
        force: bool,
        digits: Option<(Arc<DigitRuns>, usize)>,
    ) -> Worker {
        Worker {
            matcher,
            force,
            mask: None,
            wanted: false,
            timing: Arc::new(Counters::default()),
            digits,
            run: DigitState::default(),
        }
    }

    fn start(&mut self) -> Result<Advanced, String> {
        let forced = self.forced();
        self.took(&forced);
        let a = Advanced {
            finished: self.matcher.is_stopped(),
            forced,
        };
        self.moved(self.checked(a))
    }

    /// After the parser moved: the next mask is wanted unless it finished or failed.
    fn moved(&mut self, r: Result<Advanced, String>) -> Result<Advanced, String> {
        self.wanted = r.as_ref().is_ok_and(|a| !a.finished);
        r
    }

    fn wants_mask(&self) -> bool {
        self.wanted && self.mask.is_none()
    }

    fn allowed(&mut self) -> Result<Allowed, String> {
        self.wanted = false;
        self.mask.take().unwrap_or_else(|| self.compute())
    }

    fn advance(&mut self, token: TokenId) -> Result<Advanced, String> {
        self.mask = None;
        self.wanted = false;
        self.took(&[token]);
        self.matcher
            .consume_token(token)
            .map_err(|e| e.to_string())?;
        let forced = if self.matcher.is_stopped() {
            Vec::new()
        } else {
            self.forced()
        };
        self.took(&forced);
        let a = Advanced {
            finished: self.matcher.is_stopped(),
            forced,
        };
        self.moved(self.checked(a))
    }

    fn valid_prefix(&mut self, tokens: &[TokenId]) -> usize {
        self.matcher.validate_tokens(tokens).unwrap_or(0)
    }

    fn took(&mut self, tokens: &[TokenId]) {
        if let Some((d, _)) = &self.digits {
            for &t in tokens {
                if let Some(b) = d.bytes.get(t as usize) {
                    self.run.push(b);
                }
            }
        }
    }

    /// Clears the tokens that would make the run of digits longer than the limit, unless the
    /// grammar then allows nothing else.
    fn bound_digits(&self, words: &mut [u32]) {
        let Some((d, limit)) = &self.digits else {
            return;
        };
        if self.run.in_string {
            return;
        }
        let mut cleared = Vec::new();
        for &(t, lead) in &d.leading {
            let (w, bit) = (t as usize / 32, 1u32 << (t % 32));
            let Some(word) = words.get_mut(w) else {
                continue;
            };
            if *word & bit == 0 {
                continue;
            }
            if self.run.run + lead as usize > *limit {
                *word &= !bit;
                cleared.push((w, bit));
            }
        }
        if !cleared.is_empty() && words.iter().all(|&w| w == 0) {
            for (w, bit) in cleared {
                words[w] |= bit;
            }
        }
    }

    fn forced(&mut self) -> Vec<TokenId> {
        if self.force {
            self.matcher.consume_ff_tokens()
        } else {
            Vec::new()
        }
    }

    fn checked<T>(&self, v: T) -> Result<T, String> {
        match self.matcher.get_error() {
            Some(e) => Err(e),
            None => Ok(v),
        }
    }

    fn precompute(&mut self) {
        let m = self.compute();
        self.mask = Some(m);
        self.wanted = false;
    }

    fn compute(&mut self) -> Result<Allowed, String> {
        let t0 = Instant::now();
        let r = self
            .matcher
            .compute_mask()
            .map_err(|e| e.to_string())
            .and_then(|vob| {
                let may_end = self
                    .matcher
                    .tok_env()
                    .map(|env| {
                        env.tok_trie()
                            .eos_tokens()
                            .iter()
                            .any(|&t| vob.is_allowed(t))
                    })
                    .map_err(|e| e.to_string())?;
                let mut words = vob.as_slice().to_vec();
                self.bound_digits(&mut words);
                Ok(Allowed {
                    mask: TokenMask::from_words(words),
                    may_end,
                })
            });
        self.timing.masks.fetch_add(1, Ordering::Relaxed);
        self.timing
            .compute_us
            .fetch_add(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
        r
    }
}

/// The engine thread's handle on a constraint: the parser shared with a mask thread that computes
/// ahead, or the worker used in place.
#[derive(Debug)]
pub(crate) enum GrammarConstraint {
    Threaded {
        shared: Arc<Shared>,
        timing: Arc<Counters>,
        wait_us: u64,
    },
    Inline(Box<Worker>),
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Shared")
    }
}

impl GrammarConstraint {
    /// Runs `f` on the worker on this thread: at once when the mask thread is idle, after the
    /// mask it is computing otherwise.
    fn with_worker<T>(&mut self, f: impl FnOnce(&mut Worker) -> T) -> Result<T, String> {
        match self {
            GrammarConstraint::Inline(w) => Ok(f(w)),
            GrammarConstraint::Threaded {
                shared, wait_us, ..
            } => {
                let t0 = Instant::now();
                let mut slot = shared
                    .slot
                    .lock()
                    .map_err(|_| "the grammar worker stopped".to_string())?;
                let r = f(&mut slot.worker);
                drop(slot);
                *wait_us += t0.elapsed().as_micros() as u64;
                Ok(r)
            }
        }
    }
}

impl Drop for GrammarConstraint {
    fn drop(&mut self) {
        if let GrammarConstraint::Threaded { shared, .. } = self {
            shared.closed.store(true, Ordering::Release);
            shared.wake.notify_one();
        }
    }
}

impl TokenConstraint for GrammarConstraint {
    fn start(&mut self) -> Result<Advanced, String> {
        self.with_worker(Worker::start)?
    }

    fn allowed(&mut self) -> Result<Allowed, String> {
        self.with_worker(Worker::allowed)?
    }

    fn advance(&mut self, token: TokenId) -> Result<Advanced, String> {
        self.with_worker(|w| w.advance(token))?
    }

    fn valid_prefix(&mut self, tokens: &[TokenId]) -> usize {
        self.with_worker(|w| w.valid_prefix(tokens)).unwrap_or(0)
    }

    fn prepare(&mut self) {
        if let GrammarConstraint::Threaded { shared, .. } = self {
            // The thread computes only when asked and the engine took the last mask it asked
            // for, so the lock is free at once (or after that mask, if it was never taken).
            let Ok(mut slot) = shared.slot.lock() else {
                return;
            };
            if slot.worker.wants_mask() {
                slot.go = true;
                drop(slot);
                shared.wake.notify_one();
            }
        }
    }

    fn timing(&self) -> ConstraintTiming {
        let (timing, wait_us) = match self {
            GrammarConstraint::Threaded {
                timing, wait_us, ..
            } => (timing, *wait_us),
            // Inline, the engine waits for every mask it computes.
            GrammarConstraint::Inline(w) => {
                (&w.timing, w.timing.compute_us.load(Ordering::Relaxed))
            }
        };
        ConstraintTiming {
            masks: timing.masks.load(Ordering::Relaxed),
            compute_us: timing.compute_us.load(Ordering::Relaxed),
            wait_us,
        }
    }
}
