"""Axle: a local LLM inference runtime, from Python.

    import axle
    with axle.Engine("SmolLM2-135M-Instruct.Q4_1.gguf") as engine:
        print(engine.generate("The capital of France is", max_tokens=8, temperature=0).text)
        for chunk in engine.stream("Once upon a time", max_tokens=32):
            print(chunk, end="", flush=True)

One `Engine` holds a model and its engine thread (or a connection to a delegated upstream
server); every request made through it, from any thread or asyncio task, shares the engine's
continuous batching. The GIL is released while the engine works. Breaking out of a stream (or
Ctrl-C) cancels its request and frees its KV.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Dict, Iterator, List, Optional, Sequence, Union

from . import _axle
from ._axle import (
    AxleError,
    Completion,
    EngineError,
    ModelError,
    RequestError,
    TextStream,
    UpstreamError,
)

__all__ = [
    "Engine",
    "Completion",
    "TextStream",
    "AxleError",
    "ModelError",
    "RequestError",
    "UpstreamError",
    "EngineError",
]

Message = Dict[str, str]
Prompt = Union[str, Sequence[int], Sequence[Message]]


class Engine:
    """A model and its engine, or a delegated upstream.

    Native: ``Engine(model_path, device="auto", context=None, threads=None, ngram=True, ...)``;
    ``model_path`` may be a Hub id (``"org/repo:Q4_K_M"``), pulled into the Hugging Face cache
    (``HF_HOME``, ``HF_ENDPOINT``, ``HF_TOKEN``) on first use, or found there with
    ``offline=True`` (or ``HF_HUB_OFFLINE=1``).
    Delegated: ``Engine(backend="llama-cpp" | "openai", upstream="http://host:port")``, or
    ``Engine(model_path, upstream=..., allow_delegation=True)`` for a file Axle cannot run.
    Keyword arguments are those of ``axle serve`` (``max_batch_size``, ``max_batch_tokens``,
    ``kv_slots``, ``draft_len``, ``drafters`` (``"ngram"``, ``"suffix"``, ``"model"``, ``"mtp"`` or
    ``"all"``), ``draft_model`` (a path or Hub id of a smaller model with the same vocabulary),
    ``kernels``, ``repack``, ``gpu_layers``, ``upstream_model``,
    ``upstream_api_key``, ``upstream_timeout``, ``state_slots``, ``quantize`` (``"q4_k_m"``,
    ``"q5_k_m"``, ``"q6_k"``, ``"q8_0"``, ``"q4_0"``: float weights quantized at load as
    llama.cpp's quantize tool would)). Several devices:
    ``device="cuda0,cuda1"`` (or ``"all"``), ``split=[3, 1]`` for shares other than by free
    memory, ``rpc=["host:port", ...]`` to attach devices that ``axle rpc-server`` serves,
    ``split_mode="tensor"`` (with ``kernels="fast"``) to run every layer on every device instead
    of a range of layers on each. ``device_products`` (GPUs, exact kernels): ``"columns"`` (the
    default where the CUDA backend carries Axle's kernel and ``max_batch_size`` is under 32)
    reads the weights once per 8 decoding sequences, ``"groups"`` once per 4; ``"wide"`` (CUDA;
    the default from ``max_batch_size=32`` where the backend also replays MMQ) once per step for
    many concurrent sequences, level with libllama for a lone one with Q4_0 weights (0.99-1.01x
    on an H100) and slower than ``"columns"`` for a few (0.88x at 4 sequences).
    ``host_kernels`` (CPU, exact kernels): the default ``"origin"`` gives prompt rows the
    arithmetic libllama prefills with and generated rows the one it decodes with, so prompts
    prefill at libllama's speed and greedy output follows libllama's; ``"compatible"`` gives every
    row libllama's decode arithmetic, ``"tiled"`` every row that of ggml's tiled kernels.
    ``kv_type``: ``"f16"`` (the default), or ``"q8_0"`` for a KV cache of about half the memory,
    read by Axle's paged attention (GPUs whose CUDA backend carries it, exact kernels; refused
    elsewhere with an error naming what it needs).
    """

    def __init__(self, model_path: Optional[str] = None, **options: Any) -> None:
        self._inner: Optional[_axle.Engine] = _axle.Engine(
            None if model_path is None else str(model_path), **options
        )

    # -- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:
        """Stops the engine and frees the model."""
        if self._inner is not None:
            self._inner.close()
            self._inner = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def _engine(self) -> "_axle.Engine":
        if self._inner is None:
            raise EngineError("the engine is closed")
        return self._inner

    # -- generation -------------------------------------------------------------------------
    def generate(self, prompt: Prompt, **sampling: Any) -> Completion:
        """Runs one request to completion.

        ``prompt`` is text, a list of token ids, or a list of ``{"role", "content"}`` messages
        (rendered with the model's chat template). Sampling keywords: ``max_tokens``,
        ``temperature`` (0 = greedy; default 1), ``top_p``, ``top_k``, ``min_p``,
        ``repetition_penalty``, ``presence_penalty``, ``frequency_penalty``, ``seed``,
        ``stop`` (a string or a list), ``logprobs`` (alternatives per token), ``ignore_eos``,
        ``ngram``. With ``n=k`` it returns a list of k completions.

        Structured output: ``response_format`` is a pydantic model class, or OpenAI's dict
        (``{"type": "json_object"}``, ``{"type": "json_schema", "json_schema": {"schema": ...}}``)
        or Axle's (``{"type": "regex", "regex": ...}``, ``{"type": "grammar", "grammar": LARK}``);
        decoding is constrained to it. Tools: ``tools`` (OpenAI's list), ``tool_choice``
        (``"auto"``, ``"none"``, ``"required"``, a function name or OpenAI's dict) and
        ``parallel_tool_calls``; calls come back in ``completion.tool_calls`` as
        ``(name, arguments_json)`` and ``finish_reason == "tool_calls"``. Chat prompts:
        ``chat_template_kwargs`` (a dict) gives the template more variables, e.g.
        ``{"enable_thinking": False}``; a template's thinking comes back in
        ``completion.reasoning``, and ``reasoning_budget=N`` forces its closing marker after N
        tokens of thinking.
        """
        n = sampling.get("n", 1)
        out = []
        for stream in self._engine._start(prompt, **_normalize(sampling)):
            for _ in stream:
                pass
            out.append(stream.completion)
        return out if n != 1 else out[0]

    def chat(self, messages: Sequence[Message], **sampling: Any) -> Completion:
        """``generate`` over chat messages (the model's own template)."""
        return self.generate(list(messages), **sampling)

    def stream(self, prompt: Prompt, **sampling: Any) -> TextStream:
        """Starts one request; iterate the result for text chunks. After the loop,
        ``stream.completion`` holds the finished request. Breaking out (or ``close()``)
        cancels it."""
        if sampling.get("n", 1) != 1:
            err = RequestError("n: stream() runs one choice; use generate(n=...)")
            err.field, err.reason = "n", "stream() runs one choice"
            raise err
        return self._engine._start(prompt, **_normalize(sampling))[0]

    async def agenerate(self, prompt: Prompt, **sampling: Any) -> Completion:
        """``generate`` for asyncio: concurrent calls share the engine's batching."""
        return await asyncio.get_running_loop().run_in_executor(
            None, lambda: self.generate(prompt, **sampling)
        )

    async def achat(self, messages: Sequence[Message], **sampling: Any) -> Completion:
        """``chat`` for asyncio."""
        return await self.agenerate(list(messages), **sampling)

    async def astream(self, prompt: Prompt, **sampling: Any) -> AsyncIterator[str]:
        """``stream`` for asyncio: ``async for chunk in engine.astream(...)``. Leaving the loop
        early cancels the request."""
        loop = asyncio.get_running_loop()
        stream = await loop.run_in_executor(None, lambda: self.stream(prompt, **sampling))
        try:
            while True:
                chunk = await loop.run_in_executor(None, _next_or_none, stream)
                if chunk is None:
                    return
                yield chunk
        finally:
            stream.close()

    # -- tokens and report ------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True) -> List[int]:
        """Token ids of ``text`` (native routes)."""
        return self._engine.tokenize(text, add_special=add_special)

    def embed(self, inputs: Union[str, Sequence[int], Sequence[Union[str, Sequence[int]]]],
              normalize: bool = True, pooling: Optional[str] = None) -> List[List[float]]:
        """Embeddings of ``inputs`` (a text, a list of token ids, or a list of either), one per
        input in order: the final hidden states pooled as the model file says or as ``pooling``
        (``"mean"``, ``"cls"``, ``"last"``) asks, L2-normalized unless ``normalize`` is false, the
        same alone or batched (native routes; the first call sets up KV for one context of its
        own)."""
        if isinstance(inputs, str) or (inputs and isinstance(inputs[0], int)):
            inputs = [inputs]
        return self._engine._embed(list(inputs), normalize=normalize, pooling=pooling)

    def detokenize(self, tokens: Sequence[int]) -> str:
        """Text of token ids (native routes)."""
        return self._engine.detokenize(list(tokens))

    @property
    def runtime(self) -> Dict[str, Any]:
        """The runtime report: route, policy, model identity, device."""
        return json.loads(self._engine._runtime_json)

    @property
    def stats(self) -> Dict[str, int]:
        """KV blocks in use, requests waiting and running (zeros on delegated routes)."""
        used, waiting, running = self._engine.stats
        return {"kv_blocks_used": used, "waiting": waiting, "running": running}


def _normalize(sampling: Dict[str, Any]) -> Dict[str, Any]:
    sampling = dict(sampling)
    stop = sampling.get("stop")
    if isinstance(stop, str):
        sampling["stop"] = [stop]
    if "response_format" in sampling:
        fmt = _response_format(sampling["response_format"])
        if fmt is None:
            del sampling["response_format"]
        else:
            sampling["response_format"] = json.dumps(fmt)
    if sampling.get("tools") is not None:
        sampling["tools"] = json.dumps(sampling["tools"])
    if sampling.get("chat_template_kwargs") is not None:
        sampling["chat_template_kwargs"] = json.dumps(sampling["chat_template_kwargs"])
    choice = sampling.get("tool_choice")
    if isinstance(choice, dict):
        sampling["tool_choice"] = _field(choice, "tool_choice", "function", "name")
    return sampling


def _field(d: Dict[str, Any], name: str, *path: str) -> Any:
    v: Any = d
    for k in path:
        if not isinstance(v, dict) or k not in v:
            err = RequestError(f"{name}: `{'.'.join(path)}` is missing")
            err.field, err.reason = name, f"`{'.'.join(path)}` is missing"
            raise err
        v = v[k]
    return v


def _response_format(fmt: Any) -> Optional[Dict[str, Any]]:
    """OpenAI's ``response_format`` dict for a pydantic model class; a dict goes as it is (the
    engine reads it as the server does)."""
    if isinstance(fmt, type) and hasattr(fmt, "model_json_schema"):
        return {"type": "json_schema", "json_schema": {"name": fmt.__name__, "schema": fmt.model_json_schema()}}
    return fmt


def _next_or_none(stream: TextStream) -> Optional[str]:
    return next(stream, None)
