"""Long contexts: an 8,000-token prompt and a generation that runs to the end of an 8,192-position
context, on every backend (numpy, the row-at-a-time CPU model, native WebGPU).

The model is a tiny random Llama whose GGUF says 8,192 positions (testmodels.LONG_CONTEXT; the
default test models say 256, and every backend caps max_ctx at the model's own length), as small
as the kernels take: the 8,000-row prefill on lavapipe is what a test here pays for (the GPU case
took 20 s on two cores at load 6, against 65 s for one layer at d = 32 and 124 s for the default
tiny shape). Only attention and RoPE depend on positions, so the quantized kernels, which this
f32 model leaves out, lose no long-context coverage here.

Oracle: champion-only decoding (k = 0) on the same backend. A greedy speculative run must give
its tokens exactly, end with finish_reason "context" after exactly max_ctx + 1 - prompt tokens
(the cache lags the sequence by one row: the last token is never fed), and stream no text past
them. The two runs share one engine, so the second reuses the prompt's cache rows (the
conversation cache; that reuse is bit-exact, tests/test_conversation.py).
"""

from __future__ import annotations

import asyncio

import pytest

from conftest import BACKENDS, gpu_device
from pyspec import testmodels
from pyspec.cpu.fastcpu import FastModel
from pyspec.cpu.model import Model
from pyspec.engine import Engine
from pyspec.errors import PromptTooLongError
from pyspec.load import backend as backend_for
from pyspec.options import Options
from pyspec.text.tokenizer import Tokenizer

CTX = testmodels.LONG_CONTEXT["ctx"]
PROMPT_TOKENS = 8000


@pytest.fixture(scope="module")
def long_path(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("long") / "long.gguf")
    testmodels.write_model(path, seed=1, **testmodels.LONG_CONTEXT)
    return path


def load(path: str, backend: str):
    if backend == "cpu":
        return Model.load(path)
    if backend == "fastcpu":
        return FastModel.load(path)
    from pyspec.formats.gguf import GGUFFile
    from pyspec.gpu import load_model
    return load_model(gpu_device(), GGUFFile.open(path), CTX)


def long_prompt(tokenizer: Tokenizer) -> list[int]:
    ids = tokenizer.encode(testmodels.CORPUS * (1 + 4 * PROMPT_TOKENS // len(testmodels.CORPUS)))
    assert len(ids) >= PROMPT_TOKENS
    return ids[:PROMPT_TOKENS]


def run(engine: Engine, prompt: list[int], k: str) -> tuple[dict, list]:
    """One request streamed to its end: the report (Result fields) and its chunks."""
    report, chunks = {}, []

    async def drain():
        opts = Options(max_tokens=CTX, stop_at_eos=False, k=k)
        async for chunk in engine.stream(prompt, opts, report):
            chunks.append(chunk)

    asyncio.run(drain())
    return report, chunks


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_8000_token_prompt_generates_to_the_context_end(long_path, backend, request):
    if backend == "gpu":
        request.getfixturevalue("gpu")
    model = load(long_path, backend)
    tokenizer = Tokenizer.from_metadata(model.metadata)
    prompt = long_prompt(tokenizer)
    engine = Engine(backend_for(model, "ngram", CTX), tokenizer)
    assert engine.kv.max_ctx == CTX
    only, _ = run(engine, prompt, "fixed:0")
    spec, chunks = run(engine, prompt, "fixed:3")

    generated = CTX + 1 - PROMPT_TOKENS
    assert only["finish_reason"] == spec["finish_reason"] == "context"
    assert len(only["tokens"]) == generated
    assert spec["tokens"] == only["tokens"]
    assert spec["text"] == only["text"] == tokenizer.decode(only["tokens"])
    stats = spec["stats"]
    assert only["stats"]["drafted"] == 0 and stats["drafted"] > 0 and stats["accepted"] > 0
    assert stats["reused_tokens"] == PROMPT_TOKENS - 1 and stats["prompt_tokens"] == PROMPT_TOKENS
    # The stream: contiguous chunks whose text is the result's, and ids exactly its tokens.
    offsets = [c.offset for c in chunks]
    assert offsets == [sum(len(c.text) for c in chunks[:i]) for i in range(len(chunks))]
    assert "".join(c.text for c in chunks) == spec["text"]
    assert [t for c in chunks for t in c.ids] == spec["tokens"]
    # Memory, stated from the shapes: K and V of (layers, max_ctx, n_kv, head_dim) f32.
    cfg = model.config
    kv_bytes = 2 * cfg.n_layers * CTX * cfg.n_kv_heads * cfg.head_dim * 4
    assert stats["peak_bytes"]["kv"] == kv_bytes
    assert stats["peak_bytes"]["kv_used"] == kv_bytes * engine.kv.peak // CTX
    assert engine.kv.peak == CTX
    # A prompt that fills the whole context leaves no room: a named error, not a crash.
    with pytest.raises(PromptTooLongError):
        engine.generate(long_prompt(tokenizer) + prompt[:CTX - PROMPT_TOKENS], Options())
