"""`python -m pyspec info MODEL.gguf`: a model card, read from the file's header, before any load.

The card says what the file is (architecture, parameters, tensor types, context, chat template
family, size) and what pyspec can do with it here: whether its architecture and block formats
are ones pyspec runs (the same checks a load makes, so a refusal names the same reason), and for
each backend the memory it needs by a stated rule:

- CPU engines (`cpu`, `numpy`, and the page without a usable GPU) dequantize every matrix to
  float32 at load: 4 bytes a parameter, plus the KV cache in float32 at the chosen context.
  Natively the float32 weights must fit cpu/memory.py's budget (half the machine's memory) and,
  with the cache, the machine's memory; in the page they must fit its budget, and all of it,
  with PAGE_RUNTIME_BYTES for Pyodide, numpy and pyspec (the worker streams the file, never
  there), the wasm heap, which is 32-bit (4 GiB). A CPU verdict that does not fit names the
  largest parameter count that would, as the `cpu` engine's refusal at load does (block-format
  weights on the CPU were measured and not taken: cpu/memory.py).
- GPU engines (`wgpu`, the page on WebGPU) keep weights in their block format: the file's tensor
  bytes on the device, plus the KV cache. WebGPU tells no memory size, so the rule checks what it
  does tell: every buffer the GPU needs whole (a layer's Q, K and V stacked, its gate and up
  paired, any other tensor; a vocabulary table only 64 of its rows, as it goes in row parts,
  gpu/model.py whole_buffers) must fit one storage binding (the spec's default limit is 128 MiB;
  adapters offer more, and pyspec asks for the adapter's maximum). The out-of-memory fault path
  stays the backstop.

`card_from_header` builds the same card from the file's first bytes and its size (the page
reads them by HTTP Range requests or File.slice(); web/worker.js). Not here: loading (load.py).
"""

from __future__ import annotations

import math
import os
from collections import Counter

from ..cpu.memory import PAGE_RUNTIME_BYTES, WASM_HEAP_BYTES, float32_budget, memory_host
from ..cpu.model import Config, ModelError
from ..errors import ModelTooLargeError, PyspecError
from ..formats.gguf import GGUFError, GGUFFile, HeaderIncompleteError
from ..gpu.model import whole_buffers

WEBGPU_DEFAULT_BINDING = 128 << 20   # maxStorageBufferBindingSize, the WebGPU spec's default

MEMORY_RULE = ("Memory rule: the CPU engines need 4 bytes a parameter (float32 weights, within "
               "half of this machine's memory) plus the KV cache in float32, against this "
               "machine's memory; the page's CPU engine that plus 300 MiB of runtime "
               "within its 4 GiB wasm heap; a model that does not fit is refused with the "
               "largest parameter count that would. WebGPU the file's tensor bytes plus the "
               "cache, each buffer it needs whole (a vocabulary table goes in parts of 64 rows) "
               "within one storage binding (128 MiB by the spec's default; "
               "pyspec asks the adapter for its maximum). Exit status: 0 pyspec runs the model, "
               "1 it cannot (the card says why), 2 bad input.")

TEMPLATE_FAMILIES = (   # a marker in the template text -> its family
    ("<|im_start|>", "ChatML"), ("<|start_header_id|>", "Llama 3"),
    ("<start_of_turn>", "Gemma"), ("[INST]", "Llama 2 / Mistral"),
)


def template_family(template: str | None) -> str:
    if not template:
        return "none (the file has no chat template: use --raw)"
    for marker, family in TEMPLATE_FAMILIES:
        if marker in template:
            return family
    return "other (rendered from the file's own template)"


def card(path: str, ctx: int | None = None) -> dict:
    """The card of the GGUF at `path` as a dict (what `info --json` prints); `ctx` is the context
    the memory rule assumes (default: the model's own, as a load reserves it)."""
    size = os.path.getsize(path)
    try:
        f = GGUFFile.open(path)
    except GGUFError as e:
        return refused(os.path.basename(path), size, e)
    return card_of(f, os.path.basename(path), size, ctx)


def card_from_header(head, total_size: int, name: str, ctx: int | None = None,
                     limits: dict | None = None) -> dict:
    """The same card from the file's first bytes alone (`head`) and its size: the page reads
    them by HTTP Range requests or File.slice() before any download. Raises
    HeaderIncompleteError (with `.needed`) when `head` ends inside the header. `limits` are the
    WebGPU adapter's (maxBufferSize, maxStorageBufferBindingSize) that the GPU verdict uses."""
    try:
        f = GGUFFile(head, name, total_size=total_size)
    except HeaderIncompleteError:
        raise
    except GGUFError as e:
        return refused(name, total_size, e)
    return card_of(f, name, total_size, ctx, limits)


def refused(name: str, size: int, e: PyspecError) -> dict:
    """A card for a file pyspec cannot run: the reason and its error code."""
    return {"file": name, "bytes": size, "runs": False, "refusal": str(e), "code": e.code}


def card_of(f: GGUFFile, name: str, size: int, ctx: int | None = None,
            limits: dict | None = None) -> dict:
    """The card of a parsed file (whole or header-only) of `size` bytes."""
    md = f.metadata
    params = sum(math.prod(t.shape) for t in f.tensors.values())
    types = Counter(t.format.name for t in f.tensors.values())
    out: dict = {"file": name, "bytes": size, "runs": False, "refusal": None, "code": None}
    out.update(architecture=md.get("general.architecture"), name=md.get("general.name"),
               parameters=params, tensor_types=dict(types.most_common()),
               template=template_family(md.get("tokenizer.chat_template")),
               tokenizer=md.get("tokenizer.ggml.model"), pre=md.get("tokenizer.ggml.pre"))
    try:
        cfg = Config.from_metadata(md)
    except (ModelError, PyspecError) as e:
        return {**out, "refusal": str(e), "code": e.code}
    ctx = min(ctx or cfg.context_length, cfg.context_length)
    kv = 2 * cfg.n_layers * ctx * cfg.n_kv_heads * cfg.head_dim * 4
    largest = max(f.tensors.values(), key=lambda t: t.nbytes)
    buffer, buffer_bytes = max(whole_buffers(f).items(), key=lambda kv: kv[1])
    out.update(runs=True, context=cfg.context_length, layers=cfg.n_layers,
               vocab=cfg.vocab_size, kv_context=ctx, kv_bytes=kv,
               largest_tensor={"name": largest.name, "bytes": largest.nbytes},
               # the largest buffer the GPU needs whole (vocabulary tables go in row parts)
               gpu_buffer={"name": buffer, "bytes": buffer_bytes},
               backends=backends(params, kv, buffer_bytes, size, limits))
    return out


def backends(params: int, kv: int, largest: int, file_bytes: int,
             limits: dict | None = None) -> dict:
    """Each backend's verdict by the module docstring's rule: {backend: {fits, needs, why}}, the
    CPU engines' with the largest parameter count that fits (`largest_params`); with an
    adapter's `limits` the WebGPU verdict is this adapter's, else the spec default's advice
    (natively pyspec asks the adapter for its maximum, which the card does not know)."""
    gpu_needs = file_bytes + kv
    binding_ok = largest <= WEBGPU_DEFAULT_BINDING
    return {
        "cpu": cpu_verdict(params, kv, file_bytes, page=False),
        "page-cpu": cpu_verdict(params, kv, file_bytes, page=True),
        "webgpu": webgpu_verdict(gpu_needs, largest, limits) if limits else
                  {"fits": True, "needs": gpu_needs,
                   "why": "weights in their block format; the largest buffer fits WebGPU's "
                          "default 128 MiB binding" if binding_ok else
                          f"the largest buffer ({gib(largest)}) needs an adapter whose "
                          "maxStorageBufferBindingSize is at least that (desktop GPUs offer "
                          "2-4 GiB; the spec's default is 128 MiB)"},
    }


def cpu_verdict(params: int, kv: int, file_bytes: int, page: bool) -> dict:
    """The CPU engine's verdict natively (float32 weights within cpu/memory.py's budget, and
    with the cache within the machine's memory) or in the page (float32 weights within its
    budget, and all of it with the runtime within the wasm heap); `largest_params`:
    the most parameters whose float32 weights fit the budget, as the engine's own refusal says."""
    needs = 4 * params + kv + (PAGE_RUNTIME_BYTES if page else 0)
    budget, limit = float32_budget(page), WASM_HEAP_BYTES if page else memory_host()
    what = ("float32 weights, cache and the runtime against the page's 4 GiB wasm heap"
            if page else f"float32 weights (within half the memory) and cache against "
                         f"{gib(limit)} of memory")
    if budget is None or limit is None:    # natively, where the OS does not say
        return {"fits": True, "needs": needs, "why": "float32 weights and cache"}
    fits = 4 * params <= budget and needs <= limit
    why = what
    if 4 * params > budget:
        why += f"; the largest model that fits has {budget // 4 / 1e6:,.0f}M parameters"
    elif not fits:
        why += "; the KV cache at this context does not fit: a shorter context would"
    return {"fits": fits, "needs": needs, "why": why, "largest_params": budget // 4}


def page_refusal(c: dict, webgpu: bool, backend: str = "auto") -> PyspecError | None:
    """Why the page cannot run the model of card `c`, as the error to raise (None: it can);
    `webgpu`: the page has an adapter, `backend`: init's. Checked before the download."""
    if not c["runs"]:
        return ModelError(c["refusal"])
    engines = (["webgpu"] if webgpu and backend != "cpu" else []) + \
        (["page-cpu"] if backend != "webgpu" else [])
    if any(c["backends"][e]["fits"] for e in engines):
        return None
    why = "; ".join(f"{e}: {c['backends'][e]['why']} (needs {gib(c['backends'][e]['needs'])})"
                    for e in engines)
    return ModelTooLargeError(f"{c['file']} ({gib(c['bytes'])}) is too large for this device: "
                              f"{why}. A smaller quantization or model would run, or a device "
                              "whose GPU offers larger buffers")


def webgpu_verdict(needs: int, largest: int, limits: dict) -> dict:
    """This adapter's verdict: every whole buffer within one buffer and one storage binding."""
    limit = min(limits["maxBufferSize"], limits["maxStorageBufferBindingSize"])
    fits = largest <= limit
    why = (f"weights in their block format; the largest buffer ({gib(largest)}) fits this "
           f"adapter's binding limit ({gib(limit)})" if fits else
           f"the largest buffer ({largest} bytes, {gib(largest)}) is larger than this adapter's "
           f"buffer or binding limit ({limit} bytes, {gib(limit)}); a GPU whose "
           "maxStorageBufferBindingSize is at least that, or the CPU engine, would run it")
    return {"fits": fits, "needs": needs, "why": why, "limit": limit}


def gib(n: int | None) -> str:
    """Bytes in GiB, or MiB below one GiB."""
    if n is None:
        return "?"
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def render(c: dict) -> str:
    """The card as lines of text."""
    lines = [f"{c['file']}: {gib(c['bytes'])}"]
    if "architecture" in c:
        lines += [f"  architecture  {c['architecture']}" + (f" ({c['name']})" if c["name"] else ""),
                  f"  parameters    {c['parameters'] / 1e6:,.1f} M",
                  "  tensor types  " + ", ".join(f"{k} x{v}" for k, v in c["tensor_types"].items()),
                  f"  tokenizer     {c['tokenizer']} (pre: {c['pre']})",
                  f"  chat template {c['template']}"]
    if not c["runs"]:
        lines.append(f"  pyspec cannot run it: {c['refusal']}")
        return "\n".join(lines)
    lines += [f"  context       {c['context']:,} tokens, {c['layers']} layers, vocabulary "
              f"{c['vocab']:,}",
              f"  KV cache      {gib(c['kv_bytes'])} at {c['kv_context']:,} tokens (float32)",
              "  backends (memory rule: `pyspec info --help`):"]
    for name, b in c["backends"].items():
        verdict = "fits" if b["fits"] else "too large"
        lines.append(f"    {name:<9} {verdict:<9} needs {gib(b['needs'])}: {b['why']}")
    return "\n".join(lines)
