//! `axle._axle`: the native half of the Python package. It wraps the SDK's [`Generator`] (our
//! engine over a loaded model, or a delegated upstream) behind a small blocking API; the
//! Python half (`python/axle/__init__.py`) adds keyword handling, the chat form and asyncio.
//!
//! Every wait releases the GIL and wakes every 50 ms to let Python deliver signals, so Ctrl-C
//! interrupts a generation; dropping a stream (breaking out of a loop, an exception, garbage
//! collection) cancels its request, which frees its KV blocks.
#![forbid(unsafe_code)]
// pyo3 0.22's #[pymethods] expansion converts each PyResult's error into itself.
#![allow(clippy::useless_conversion)]

use axle_models::device_step::DeviceProducts;
use axle_models::ChatMessage;
use axle_sdk::route::{self, RouteSpec};
use axle_sdk::{
    defaults, DraftSources, Embedder, EmbedderConfig, EngineConfig, EngineSizing, EventStream,
    Field, GenerateRequest, Generator, Model, ModelOptions, Prompt, Rejection, ResponseFormat,
    RoutePolicy, RuntimeReport, SamplingOptions, SdkError, StreamEvent, TokenLogprob, ToolChoice,
    MAX_DRAFT,
};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

create_exception!(
    _axle,
    AxleError,
    PyException,
    "Base class of Axle's errors."
);
create_exception!(
    _axle,
    ModelError,
    AxleError,
    "The model could not be loaded or run."
);
create_exception!(
    _axle,
    RequestError,
    AxleError,
    "The request was refused; `field` names the offending field."
);
create_exception!(
    _axle,
    UpstreamError,
    AxleError,
    "The upstream server of a delegated route failed or refused."
);
create_exception!(
    _axle,
    EngineError,
    AxleError,
    "Generation failed part-way, or the engine has stopped."
);

/// How often a blocked wait lets Python check for signals.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// An SDK error as a Python exception of the matching class; a refused request carries the field
/// (`e.field`, OpenAI's name) and the reason.
fn py_err(py: Python<'_>, e: SdkError) -> PyErr {
    match e {
        SdkError::Rejected(r) => {
            let err = RequestError::new_err(r.to_string());
            let value = err.value_bound(py);
            let _ = value.setattr("field", field_name(&r));
            let _ = value.setattr("reason", r.reason());
            err
        }
        SdkError::Upstream(u) => UpstreamError::new_err(u.to_string()),
        SdkError::Model(m) => ModelError::new_err(m.to_string()),
        e @ (SdkError::Config(_) | SdkError::Route(_)) => ModelError::new_err(e.to_string()),
        e @ (SdkError::Generation(_) | SdkError::EngineStopped) => {
            EngineError::new_err(e.to_string())
        }
    }
}

fn field_name(r: &Rejection) -> &'static str {
    r.field().name()
}

/// A finished generation.
#[pyclass(module = "axle._axle", get_all, frozen)]
#[derive(Debug, Clone)]
struct Completion {
    /// Generated text.
    text: String,
    /// Generated token ids (empty on delegated routes).
    tokens: Vec<u32>,
    /// `stop` or `length`.
    finish_reason: String,
    /// Prompt tokens (None when a delegated upstream does not report them).
    prompt_tokens: Option<usize>,
    /// Generated tokens (None when a delegated upstream does not report them).
    completion_tokens: Option<usize>,
    /// Prompt tokens served from the prefix cache.
    cached_tokens: usize,
    /// N-gram draft tokens proposed.
    drafted: usize,
    /// N-gram draft tokens accepted.
    accepted: usize,
    /// Per token: (token id, log-probability, [(alternative id, log-probability), ...]).
    logprobs: Vec<LogprobTuple>,
    /// Tool calls found in the output: (function name, arguments as JSON text).
    tool_calls: Vec<(String, String)>,
    /// The thinking before the answer, for chat with a model whose template marks it.
    reasoning: String,
}

#[pymethods]
impl Completion {
    fn __repr__(&self) -> String {
        let tokens = self
            .completion_tokens
            .map_or_else(|| "None".to_string(), |n| n.to_string());
        format!(
            "Completion(text={:?}, finish_reason={:?}, completion_tokens={tokens})",
            self.text, self.finish_reason
        )
    }
}

impl Completion {
    fn from_sdk(c: axle_sdk::Completion) -> Completion {
        let f = &c.finish;
        Completion {
            finish_reason: f.openai_reason().to_string(),
            prompt_tokens: f.usage.map(|u| u.prompt_tokens),
            completion_tokens: f.usage.map(|u| u.completion_tokens),
            cached_tokens: f.usage.map_or(0, |u| u.cached_tokens),
            drafted: f.speculation.drafted,
            accepted: f.speculation.accepted,
            logprobs: c.logprobs.iter().map(logprob_tuple).collect(),
            tool_calls: f
                .tool_calls
                .iter()
                .map(|t| (t.name.clone(), t.arguments.clone()))
                .collect(),
            text: c.text,
            reasoning: c.reasoning,
            tokens: c.tokens,
        }
    }
}

/// A token's log-probability as Python sees it: (id, logprob, [(alternative id, logprob)]).
type LogprobTuple = (u32, f32, Vec<(u32, f32)>);

fn logprob_tuple(l: &TokenLogprob) -> LogprobTuple {
    (l.token, l.logprob, l.top.clone())
}

/// Waits for `fut` with the GIL released, letting Python deliver signals every
/// [`SIGNAL_POLL`] (a `KeyboardInterrupt` raised by a handler comes back as the error).
fn wait<T: Send>(
    py: Python<'_>,
    rt: &tokio::runtime::Runtime,
    mut fut: std::pin::Pin<&mut (impl std::future::Future<Output = T> + Send)>,
) -> PyResult<T> {
    loop {
        let polled = py.allow_threads(|| {
            rt.block_on(async { tokio::time::timeout(SIGNAL_POLL, fut.as_mut()).await.ok() })
        });
        match polled {
            Some(v) => return Ok(v),
            None => py.check_signals()?,
        }
    }
}

/// A model and its engine (or a delegated upstream), shared by every request.
#[pyclass(module = "axle._axle")]
struct Engine {
    generator: Option<Generator>,
    report: RuntimeReport,
    rt: Arc<tokio::runtime::Runtime>,
    /// Native routes: how an embedder would be sized, and the one made at the first `embed`
    /// (KV for one context of its own beside the engine's, as `axle serve --embeddings`).
    embedding: Option<(EmbedderConfig, Mutex<Option<Embedder>>)>,
}

impl Engine {
    fn generator(&self) -> PyResult<&Generator> {
        self.generator
            .as_ref()
            .ok_or_else(|| EngineError::new_err("the engine is closed"))
    }

    fn start(&self, py: Python<'_>, req: &GenerateRequest) -> PyResult<Vec<EventStream>> {
        let generator = self.generator()?.clone();
        let fut = std::pin::pin!(async move { generator.start(req).await });
        wait(py, &self.rt, fut)?.map_err(|e| py_err(py, e))
    }
}

/// Parses a prompt argument: text, a list of token ids, or a list of `{"role", "content"}`
/// messages.
fn prompt_of(prompt: &Bound<'_, PyAny>) -> PyResult<Prompt> {
    // Bytes would read as a list of small integers, token ids nobody meant.
    if prompt.is_instance_of::<pyo3::types::PyBytes>()
        || prompt.is_instance_of::<pyo3::types::PyByteArray>()
    {
        return Err(py_err(
            prompt.py(),
            SdkError::Rejected(Rejection::invalid(
                Field::Prompt,
                "bytes are not a prompt: decode them to a string, or give a list of token ids",
            )),
        ));
    }
    if let Ok(text) = prompt.extract::<String>() {
        return Ok(Prompt::Text(text));
    }
    if let Ok(tokens) = prompt.extract::<Vec<u32>>() {
        return Ok(Prompt::Tokens(tokens));
    }
    if let Ok(list) = prompt.downcast::<PyList>() {
        let mut msgs = Vec::with_capacity(list.len());
        for m in list.iter() {
            let d = m.downcast::<PyDict>().map_err(|_| bad_prompt())?;
            let role: String = d
                .get_item("role")?
                .ok_or_else(|| RequestError::new_err("messages: a message has no `role`"))?
                .extract()?;
            // Content may be null in an assistant message that only calls tools.
            let content: Option<String> = match d.get_item("content")? {
                Some(c) if !c.is_none() => Some(c.extract()?),
                _ => None,
            };
            let mut msg = ChatMessage::new(&role, content.as_deref().unwrap_or(""));
            if let Some(calls) = d.get_item("tool_calls")? {
                let json: String = prompt
                    .py()
                    .import_bound("json")?
                    .call_method1("dumps", (calls,))?
                    .extract()?;
                let mut v: serde_json::Value = serde_json::from_str(&json)
                    .map_err(|e| RequestError::new_err(format!("messages: tool_calls: {e}")))?;
                // Templates render arguments as objects: parse OpenAI's JSON text.
                for c in v.as_array_mut().into_iter().flatten() {
                    if let Some(a) = c.pointer_mut("/function/arguments") {
                        if let Some(parsed) = a.as_str().and_then(|t| serde_json::from_str(t).ok())
                        {
                            *a = parsed;
                        }
                    }
                }
                msg.tool_calls = Some(v);
            } else if content.is_none() {
                return Err(RequestError::new_err(
                    "messages: a message has no `content`",
                ));
            }
            if let Some(id) = d.get_item("tool_call_id")? {
                msg.tool_call_id = Some(id.extract()?);
            }
            msgs.push(msg);
        }
        return Ok(Prompt::Chat(msgs));
    }
    Err(bad_prompt())
}

fn bad_prompt() -> PyErr {
    RequestError::new_err(
        "prompt: give a string, a list of token ids, or a list of {\"role\", \"content\"} dicts",
    )
}

#[pymethods]
impl Engine {
    /// Loads a model (or connects to an upstream) and starts its engine.
    #[new]
    #[pyo3(signature = (
        model_path=None, *, device="auto".to_string(), gpu_layers=None, context=None,
        threads=None, max_batch_size=16, max_batch_tokens=None, kv_slots=None, ngram=true,
        draft_len=defaults::DRAFT_LEN, kernels="exact".to_string(), repack=false,
        backend="auto".to_string(), upstream=None, upstream_model=None, upstream_api_key=None,
        upstream_timeout=60.0, allow_delegation=false, split=None, rpc=None, state_slots=None,
        split_mode="layer".to_string(), device_products=None, host_kernels=None, offline=false,
        drafters="all".to_string(), draft_model=None, quantize=None, kv_type="f16".to_string()
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model_path: Option<PathBuf>,
        device: String,
        gpu_layers: Option<u32>,
        context: Option<usize>,
        threads: Option<usize>,
        max_batch_size: usize,
        max_batch_tokens: Option<usize>,
        kv_slots: Option<u32>,
        ngram: bool,
        draft_len: usize,
        kernels: String,
        repack: bool,
        backend: String,
        upstream: Option<String>,
        upstream_model: Option<String>,
        upstream_api_key: Option<String>,
        upstream_timeout: f64,
        allow_delegation: bool,
        split: Option<Vec<f32>>,
        rpc: Option<Vec<String>>,
        state_slots: Option<usize>,
        split_mode: String,
        device_products: Option<String>,
        host_kernels: Option<String>,
        offline: bool,
        drafters: String,
        draft_model: Option<PathBuf>,
        quantize: Option<String>,
        kv_type: String,
    ) -> PyResult<Engine> {
        let invalid = |m: String| PyValueError::new_err(m);
        let kv_type = kv_type
            .parse::<axle_sdk::KvType>()
            .map_err(|e| invalid(format!("kv_type: {e}")))?;
        let policy = match backend.as_str() {
            "auto" => RoutePolicy::Auto,
            "native" => RoutePolicy::Native,
            "llama-cpp" => RoutePolicy::LlamaCpp,
            "openai" => RoutePolicy::Openai,
            other => {
                return Err(invalid(format!(
                    "backend must be auto, native, llama-cpp or openai, not {other:?}"
                )))
            }
        };
        let kernels = match kernels.as_str() {
            "exact" => axle_models::Kernels::BatchInvariant,
            "fast" => axle_models::Kernels::LikeLlamaCpp,
            other => {
                return Err(invalid(format!(
                    "kernels must be exact or fast, not {other:?}"
                )))
            }
        };
        if !(1..=MAX_DRAFT).contains(&draft_len) {
            return Err(invalid(format!("draft_len must be 1 to {MAX_DRAFT}")));
        }
        let drafters = DraftSources::parse(&drafters).map_err(invalid)?;
        if max_batch_size == 0 {
            return Err(invalid("max_batch_size must be at least 1".into()));
        }
        let device_products = device_products
            .map(|p| p.parse::<DeviceProducts>())
            .transpose()
            .map_err(invalid)?;
        let host_kernels = host_kernels
            .map(|k| k.parse::<axle_models::HostKernels>())
            .transpose()
            .map_err(invalid)?;
        let device = device.parse().map_err(|e| invalid(format!("{e}")))?;
        let options = ModelOptions {
            threads: threads.unwrap_or_else(axle_models::default_threads),
            repack,
            device,
            gpu_layers,
            split,
            rpc: rpc.unwrap_or_default(),
            split_mode: split_mode.parse().map_err(invalid)?,
            quantize: quantize
                .map(|q| q.parse::<axle_models::quantize::Quantize>())
                .transpose()
                .map_err(|e| invalid(format!("quantize: {e}")))?,
            ..Default::default()
        };
        // A Hub id (`org/repo[:QUANT]`) is pulled into the Hub cache first (or, offline, found
        // there); a path is taken as it is.
        let local = match model_path {
            Some(p) => Some(
                py.allow_threads(|| {
                    axle_hub::locate(&p.to_string_lossy(), offline, &mut axle_hub::Quiet)
                })
                .map_err(|e| ModelError::new_err(e.to_string()))?,
            ),
            None => None,
        };
        let spec = RouteSpec {
            model: local.as_ref().map(|l| l.path.clone()),
            policy,
            upstream,
            upstream_model,
            upstream_api_key,
            upstream_timeout: Duration::from_secs_f64(upstream_timeout.max(0.001)),
            allow_delegation,
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| EngineError::new_err(e.to_string()))?;
        let load = |p: &std::path::Path| Model::load(p, &options).map_err(SdkError::from);
        // The draft model: same device options, pulled first when it is a Hub id.
        let draft_model = match draft_model {
            Some(p) => {
                let located = py
                    .allow_threads(|| {
                        axle_hub::locate(&p.to_string_lossy(), offline, &mut axle_hub::Quiet)
                    })
                    .map_err(|e| ModelError::new_err(e.to_string()))?;
                let m = py
                    .allow_threads(|| Model::load(&located.path, &options))
                    .map_err(|e| ModelError::new_err(format!("draft model: {e}")))?;
                Some(std::sync::Arc::new(m))
            }
            None => None,
        };
        let sizing = EngineSizing {
            context,
            kv_slots,
            kv_contexts: 2, // as `axle serve`
            max_seqs: max_batch_size,
            max_batch_tokens,
            state_slots,
            draft_len: if ngram { draft_len } else { 0 },
            kv_type,
        };
        sizing.check().map_err(|e| invalid(e.to_string()))?;
        let configure = |m: &Model| EngineConfig {
            kernels,
            device_products,
            host_kernels,
            drafters,
            draft_model: draft_model.clone(),
            ..EngineConfig::sized(m, &sizing)
        };
        let opened = py.allow_threads(|| rt.block_on(route::open(&spec, load, configure)));
        let (generator, mut report) = opened.map_err(|e| py_err(py, e))?;
        let mut embedding = None;
        if let Generator::Native(session) = &generator {
            report.model_source = local.map(|l| l.source);
            let embedder = EmbedderConfig::beside(&configure(session.model()), None);
            embedding = Some((embedder, Mutex::new(None)));
        }
        Ok(Engine {
            generator: Some(generator),
            report,
            rt: Arc::new(rt),
            embedding,
        })
    }

    /// Starts one request: one stream of text chunks per choice (`n`).
    #[pyo3(signature = (
        prompt, *, max_tokens=None, temperature=None, top_p=None, top_k=None, min_p=None,
        repetition_penalty=None, presence_penalty=None, frequency_penalty=None, seed=None,
        stop=None, logprobs=None, n=1, ignore_eos=false, ngram=true, response_format=None,
        tools=None, tool_choice=None, parallel_tool_calls=true, chat_template_kwargs=None,
        reasoning_budget=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn _start(
        &self,
        py: Python<'_>,
        prompt: &Bound<'_, PyAny>,
        max_tokens: Option<usize>,
        temperature: Option<f32>,
        top_p: Option<f32>,
        top_k: Option<usize>,
        min_p: Option<f32>,
        repetition_penalty: Option<f32>,
        presence_penalty: Option<f32>,
        frequency_penalty: Option<f32>,
        seed: Option<u64>,
        stop: Option<Vec<String>>,
        logprobs: Option<usize>,
        n: usize,
        ignore_eos: bool,
        ngram: bool,
        response_format: Option<String>,
        tools: Option<String>,
        tool_choice: Option<String>,
        parallel_tool_calls: bool,
        chat_template_kwargs: Option<String>,
        reasoning_budget: Option<usize>,
    ) -> PyResult<Vec<TextStream>> {
        let bad = |field: Field, e: serde_json::Error| {
            py_err(
                py,
                SdkError::Rejected(Rejection::invalid(field, e.to_string())),
            )
        };
        let format = match response_format {
            None => None,
            Some(j) => serde_json::from_str::<ResponseFormat>(&j)
                .map_err(|e| bad(Field::ResponseFormat, e))?
                .constraint(),
        };
        let tools = match tools {
            None => None,
            Some(j) => Some(
                serde_json::from_str::<serde_json::Value>(&j).map_err(|e| bad(Field::Tools, e))?,
            ),
        };
        let template_args = match chat_template_kwargs {
            None => Default::default(),
            Some(j) => serde_json::from_str(&j).map_err(|e| bad(Field::TemplateArgs, e))?,
        };
        let tool_choice = match tool_choice.as_deref() {
            None | Some("auto") => ToolChoice::Auto,
            Some("none") => ToolChoice::None,
            Some("required") => ToolChoice::Required,
            Some(name) => ToolChoice::Function(name.to_string()),
        };
        let req = GenerateRequest {
            format,
            tools,
            tool_choice,
            parallel_tool_calls,
            max_tokens,
            sampling: SamplingOptions {
                temperature,
                top_p,
                top_k,
                min_p,
                repetition_penalty,
                presence_penalty,
                frequency_penalty,
                seed,
            },
            stop: stop.unwrap_or_default(),
            logprobs,
            n,
            ignore_eos,
            speculation: ngram,
            template_args,
            reasoning_budget,
            ..GenerateRequest::new(prompt_of(prompt)?)
        };
        let streams = self.start(py, &req)?;
        Ok(streams
            .into_iter()
            .map(|s| TextStream::new(Some(s), self.rt.clone()))
            .collect())
    }

    /// The benchmark's reference: decode tokens/s of one greedy request (EOS ignored, no
    /// speculation) read entirely in Rust through the same generator, from the first token to
    /// the last. Returns (tokens after the first, seconds).
    fn _decode_rate_rust(
        &self,
        py: Python<'_>,
        prompt: String,
        max_tokens: usize,
    ) -> PyResult<(usize, f64)> {
        let mut req = GenerateRequest::new(prompt).greedy().max_tokens(max_tokens);
        req.ignore_eos = true;
        req.speculation = false;
        let mut streams = self.start(py, &req)?;
        let mut s = streams
            .pop()
            .ok_or_else(|| EngineError::new_err("no stream"))?;
        let timed = py.allow_threads(|| {
            self.rt.block_on(async {
                let (mut first, mut n) = (None, 0usize);
                while let Some(ev) = s.next().await {
                    match ev {
                        StreamEvent::Token { .. } => {
                            first.get_or_insert_with(std::time::Instant::now);
                            n += 1;
                        }
                        StreamEvent::Done { .. } => break,
                        StreamEvent::Error(e) => return Err(e),
                    }
                }
                let secs = first.map_or(0.0, |f| f.elapsed().as_secs_f64());
                Ok((n.saturating_sub(1), secs))
            })
        });
        timed.map_err(|e| py_err(py, e))
    }

    /// Token ids of `text` (BOS added as the model asks when `add_special`).
    #[pyo3(signature = (text, *, add_special=true))]
    fn tokenize(&self, py: Python<'_>, text: &str, add_special: bool) -> PyResult<Vec<u32>> {
        self.generator()?
            .tokenize(text, add_special)
            .map_err(|r| py_err(py, r.into()))
    }

    /// Embeddings of `inputs` (texts, or lists of token ids), in order: the final hidden
    /// states pooled as the model file says or as `pooling` (`mean`, `cls`, `last`) asks, and
    /// L2-normalized unless `normalize` is false. Native routes only.
    #[pyo3(signature = (inputs, *, normalize=true, pooling=None))]
    fn _embed(
        &self,
        py: Python<'_>,
        inputs: Vec<Bound<'_, PyAny>>,
        normalize: bool,
        pooling: Option<String>,
    ) -> PyResult<Vec<Vec<f32>>> {
        let Some((cfg, slot)) = &self.embedding else {
            return Err(EngineError::new_err(
                "embeddings need a model Axle runs natively, not a delegated route",
            ));
        };
        let Generator::Native(session) = self.generator()? else {
            return Err(EngineError::new_err("the engine is closed"));
        };
        let model = session.model().clone();
        let pooling = match pooling.as_deref() {
            None => None,
            Some(p) => Some(
                p.parse::<axle_sdk::Pooling>()
                    .map_err(|e| PyValueError::new_err(format!("pooling: {e}")))?,
            ),
        };
        let mut tokens = Vec::with_capacity(inputs.len());
        for x in &inputs {
            tokens.push(match x.extract::<String>() {
                Ok(text) => model.tokenizer.encode(&text, true, false),
                Err(_) => x.extract::<Vec<u32>>().map_err(|_| {
                    PyValueError::new_err("each input is a text or a list of token ids")
                })?,
            });
        }
        py.allow_threads(|| {
            let mut slot = slot.lock().map_err(|_| SdkError::EngineStopped)?;
            let stale = slot
                .as_ref()
                .is_some_and(|e| pooling.is_some_and(|p| p != e.pooling()));
            if slot.is_none() || stale {
                *slot = None;
                let cfg = EmbedderConfig {
                    pooling,
                    ..cfg.clone()
                };
                *slot = Some(Embedder::new(model.clone(), &cfg)?);
            }
            match slot.as_mut() {
                Some(e) => e.embed(&tokens, normalize),
                None => Err(SdkError::EngineStopped),
            }
        })
        .map_err(|e| py_err(py, e))
    }

    /// The text of token ids.
    fn detokenize(&self, py: Python<'_>, tokens: Vec<u32>) -> PyResult<String> {
        self.generator()?
            .detokenize(&tokens)
            .map_err(|r| py_err(py, r.into()))
    }

    /// The runtime report (route, policy, model identity, device) as JSON text.
    #[getter]
    fn _runtime_json(&self) -> PyResult<String> {
        serde_json::to_string(&self.report).map_err(|e| EngineError::new_err(e.to_string()))
    }

    /// KV blocks in use, requests waiting and running (zeros on delegated routes).
    #[getter]
    fn stats(&self) -> PyResult<(usize, usize, usize)> {
        let s = self.generator()?.stats();
        Ok((s.kv_blocks_used, s.waiting, s.running))
    }

    /// Stops the engine and frees the model (requests still running end with an error).
    fn close(&mut self, py: Python<'_>) {
        let g = self.generator.take();
        let e = self.embedding.take();
        py.allow_threads(|| drop((g, e)));
    }
}

/// The text chunks of one request. Iterating blocks (with the GIL released) for the next
/// chunk; `completion` holds the finished request once the iteration has ended; `close()` (or
/// dropping the stream) cancels it.
#[pyclass(module = "axle._axle")]
struct TextStream {
    inner: Option<EventStream>,
    rt: Arc<tokio::runtime::Runtime>,
    acc: axle_sdk::Completion,
    finished: bool,
}

impl TextStream {
    fn new(inner: Option<EventStream>, rt: Arc<tokio::runtime::Runtime>) -> TextStream {
        TextStream {
            inner,
            rt,
            acc: axle_sdk::Completion::empty(),
            finished: false,
        }
    }

    /// The next non-empty text chunk; None once the request is done.
    fn next_text(&mut self, py: Python<'_>) -> PyResult<Option<String>> {
        loop {
            let Some(inner) = self.inner.as_mut() else {
                return Ok(None);
            };
            let ev = wait(py, &self.rt, std::pin::pin!(inner.next()))?;
            let Some(ev) = ev else {
                self.inner = None;
                return Err(EngineError::new_err("the stream ended without a result"));
            };
            let text = match &ev {
                StreamEvent::Token { text, .. } | StreamEvent::Done { text, .. } => text.clone(),
                StreamEvent::Error(_) => String::new(),
            };
            match self.acc.absorb(ev) {
                Err(e) => {
                    self.inner = None;
                    return Err(py_err(py, e));
                }
                Ok(true) => {
                    self.inner = None;
                    self.finished = true;
                    return Ok((!text.is_empty()).then_some(text));
                }
                Ok(false) if !text.is_empty() => return Ok(Some(text)),
                Ok(false) => {}
            }
        }
    }
}

#[pymethods]
impl TextStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<String>> {
        self.next_text(py)
    }

    /// The finished request (None until the iteration has ended, or if it was cancelled).
    #[getter]
    fn completion(&self) -> Option<Completion> {
        self.finished
            .then(|| Completion::from_sdk(self.acc.clone()))
    }

    /// Cancels the request (frees its KV); iteration then ends.
    fn close(&mut self, py: Python<'_>) {
        let s = self.inner.take();
        py.allow_threads(|| drop(s));
    }
}

#[pymodule]
fn _axle(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<Engine>()?;
    m.add_class::<TextStream>()?;
    m.add_class::<Completion>()?;
    m.add("AxleError", py.get_type_bound::<AxleError>())?;
    m.add("ModelError", py.get_type_bound::<ModelError>())?;
    m.add("RequestError", py.get_type_bound::<RequestError>())?;
    m.add("UpstreamError", py.get_type_bound::<UpstreamError>())?;
    m.add("EngineError", py.get_type_bound::<EngineError>())?;
    m.add("MAX_DRAFT", MAX_DRAFT)?;
    m.add("DEFAULT_MAX_TOKENS", defaults::MAX_TOKENS)?;
    Ok(())
}
