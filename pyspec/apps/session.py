"""The Python side of the browser worker (web/worker.js, DESIGN §8): one Session per worker.

The worker fetches the weights (OPFS, sha256-checked) and hands them here as buffers; a Session
loads the champion and an optional draft model from them, then serves requests with the same
engine.Engine, Options and Tokenizer.encode_chat that `python -m pyspec generate` uses: nothing
here decodes, drafts or verifies on its own.

The boundary with JavaScript is deliberately plain: every public method takes and returns JSON
strings (and numbers), never Python objects, so no proxy outlives a call and an error is a value,
`{"error": {"code", "message"}}`, that the worker forwards as a typed message. The code is the
exception's own (errors.py); anything else is `internal` (a bug: the message carries the
traceback). A request's JSON is checked field by field (LOAD_FIELDS, GENERATE_FIELDS) before
anything runs: a malformed one is `bad_config` and changes nothing, so the session stays usable.

`make_engine` is the one place that chooses the backend. Not here: downloads, OPFS, messages.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import time
import traceback

from .. import __version__
from ..cpu.executor import CPUBackend
from ..cpu.fastcpu import FastModel
from ..cpu.model import Config, Model
from ..drafters import BridgedModel, Combo, DraftSpecError, model_drafter, parse_draft
from ..drafters.eagle import is_eagle
from ..drafters.ngram import NgramDrafter
from ..drafters.pairing import bind_borrowed, check_pair
from ..engine import Engine, Resume
from ..errors import PyspecError, error_code
from ..formats import quant
from ..formats.gguf import GGUFFile
from ..gpu.device import DEVICE_DRILLS
from ..load import backend as backend_for
from ..load import parse_reduced_head
from ..options import Options
from ..text import conversation
from ..text.tokenizer import Tokenizer, TokenizerError

# Most context a browser session allocates by default: the champion's full 8192 positions would
# cost 30 * 8192 * 3 * 64 * 4 B * 2 = 377 MB of KV cache in wasm memory.
DEFAULT_MAX_CTX = 2048

class SessionError(PyspecError):
    """An error of the session itself (not_ready, a draft choice it cannot serve)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


# What each field of a request may hold; null or absent means the default. A field of another
# type is refused (bad_config) before anything runs, so a malformed request changes nothing.
LOAD_FIELDS = {"draft": str, "max_ctx": int, "backend": str, "champion_name": str,
               "draft_name": str, "draft_vocab": str, "draft_vocab_shipped": bool,
               "drills": bool, "load_faults": list, "warm": bool}
GENERATE_FIELDS = {"max_tokens": int, "temperature": (int, float), "seed": int, "verify": str,
                   "k": str, "draft": str, "drill": str, "context_overflow": str,
                   # the sampling controls (processors.py, stops.py), OpenAI's names
                   "top_k": int, "top_p": (int, float), "min_p": (int, float),
                   "repetition_penalty": (int, float), "presence_penalty": (int, float),
                   "frequency_penalty": (int, float), "logit_bias": dict, "stop": (list, str),
                   # constrained output: a JSON schema, or OpenAI's response_format (_schema)
                   "json_schema": dict, "response_format": dict}


def _parse(text: str, what: str):
    """A request's JSON value, or SessionError(bad_config) saying why not."""
    try:
        return json.loads(text)
    except (TypeError, ValueError) as e:   # not a str; not JSON; an integer too long to convert
        raise SessionError("bad_config", f"{what} is not valid JSON: {e}") from None
    except RecursionError:
        raise SessionError("bad_config", f"{what} is nested too deeply") from None


def _cancelled(text: str) -> str:
    """generate's reply for a request stopped before the engine reported on it."""
    return json.dumps({"text": text, "tokens": None, "finish_reason": "cancelled",
                       "stats": None, "receipt": None})


def _fields(text: str, what: str, fields: dict) -> dict:
    """A request's JSON object whose fields are each null or of their type (`fields`: name ->
    type or tuple of types; a bool is not an int). A field it does not know is refused, never
    ignored: a misspelt option would otherwise run with the default."""
    obj = _parse(text, what)
    if not isinstance(obj, dict):
        raise SessionError("bad_config", f"{what} must be a JSON object, got "
                           f"{type(obj).__name__}")
    unknown = sorted(str(name) for name in obj if name not in fields)
    if unknown:
        raise SessionError("bad_config", f"unknown {what} option {', '.join(unknown)}: use "
                           f"{', '.join(fields)}")
    for name, kinds in fields.items():
        value = obj.get(name)
        kinds = kinds if isinstance(kinds, tuple) else (kinds,)
        if value is not None and ((isinstance(value, bool) and bool not in kinds)
                                  or not isinstance(value, kinds)):
            names = " or ".join(t.__name__ for t in kinds)
            raise SessionError("bad_config", f"{what} field {name!r} must be {names} (or null), "
                               f"got {type(value).__name__} {value!r:.40}")
    return obj


# Faults a client may say interrupted the run it resumes (a code, never free text: it goes to
# the receipt): client.js sends worker_died after it restarted a dead worker, worker_oom after
# it replaced one that ran out of memory.
RESUME_FAULTS = ("worker_died", "worker_oom")

# Faults the worker met while it loaded the weights (worker.js; codes only, for the receipt):
# a truncated or corrupt OPFS file (downloaded again), a full quota or no OPFS at all (weights
# kept in memory), a download that dropped (resumed by Range requests), the cache held by
# another page (downloaded into memory).
LOAD_FAULTS = ("opfs_truncated", "opfs_corrupt", "opfs_quota", "opfs_unavailable",
               "download_dropped", "opfs_busy")


def _load_faults(items) -> list[dict]:
    """init's load_faults: [{"kind": one of LOAD_FAULTS, "recovery_s": seconds}] as receipt
    faults (at_token 0, cycle 0: before any request)."""
    out = []
    for item in items or []:
        if (not isinstance(item, dict) or item.get("kind") not in LOAD_FAULTS
                or not isinstance(item.get("recovery_s", 0), (int, float))):
            raise SessionError("bad_config", f"load_faults items must be {{\"kind\": one of "
                               f"{LOAD_FAULTS}, \"recovery_s\": seconds}}, got {item!r:.60}")
        out.append({"kind": item["kind"], "at_token": 0, "cycle": 0,
                    "recovery_s": float(item.get("recovery_s", 0))})
    return out


class _Utf16:
    """The engine's offsets count code points; JavaScript strings count UTF-16 code units, which
    differ after every character outside the BMP (an emoji). The worker's chunks carry UTF-16
    offsets, so client.js's bookkeeping (`shown`, never showing text twice) stays right."""

    def __init__(self):
        self.n = 0              # code points seen
        self.astral: list = []  # their positions that take two UTF-16 units

    def add(self, text: str) -> None:
        self.astral += [self.n + i for i, c in enumerate(text) if ord(c) > 0xFFFF]
        self.n += len(text)

    def at(self, i: int) -> int:
        return i + bisect.bisect_left(self.astral, i)


def _resume(text: str) -> Resume | None:
    """A generate request's `resume`: null, or {"ids": [token id, ...], "fault": null or
    {"kind": one of RESUME_FAULTS, "cycle": int >= 0, "restart_s": number >= 0}}. The engine
    checks the ids against the vocabulary and the context."""
    obj = _parse(text, "resume")
    if obj is None:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("ids"), list):
        raise SessionError("bad_config", "resume must be {\"ids\": [the token ids the "
                           "interrupted run's chunks carried], \"fault\": null or {...}}")
    fault = obj.get("fault")
    if fault is not None:
        number = (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0)
        if (not isinstance(fault, dict) or fault.get("kind") not in RESUME_FAULTS
                or not isinstance(fault.get("cycle"), int) or not number(fault["cycle"])
                or not number(fault.get("restart_s", 0))):
            raise SessionError("bad_config", "resume.fault must be {\"kind\": one of "
                               f"{RESUME_FAULTS}, \"cycle\": int >= 0, \"restart_s\": "
                               "seconds >= 0}")
        fault = {"kind": fault["kind"], "cycle": fault["cycle"],
                 "restart_s": float(fault.get("restart_s", 0))}
    return Resume(obj["ids"], fault)


# Fault drills the Session itself injects (config "drill": "KIND@CYCLE", only on a session loaded
# with drills on); client.js injects worker-terminate and worker.js the loading ones (OPFS,
# downloads), and never send them here. All but worker-oom need the WebGPU engine:
#   device-lost         the device destroyed (device.destroy()): go on on a new device
#   device-lost-repeat  destroyed again on every new device: stops at engine.MAX_RECOVERIES
#   gpu-oom, readback-throw, readback-hang   gpu/device.py's DEVICE_DRILLS, at the next readback
#   worker-oom          wasm memory allocated until an allocation fails (MemoryError)
SESSION_DRILLS = ("device-lost", "device-lost-repeat", *DEVICE_DRILLS, "worker-oom")


def _drill(spec: str | None, enabled: bool) -> tuple[str, int] | None:
    """config.drill "KIND@CYCLE" as (kind, cycle): the fault strikes once the request has run
    CYCLE cycles (on the first chunk whose cycle count reaches it)."""
    if spec is None:
        return None
    if not enabled:
        raise SessionError("bad_config", "config.drill is a fault drill: load the session with "
                           "drills on (init option drills: true) to use it")
    kind, _, cycle = spec.partition("@")
    if kind not in SESSION_DRILLS or not cycle.isdigit():
        raise SessionError("bad_config", f"config.drill must be KIND@CYCLE with KIND one of "
                           f"{SESSION_DRILLS} and CYCLE a number of cycles, got {spec!r:.60}")
    return kind, int(cycle)


def _head_rows(draft) -> int | None:
    ids = getattr(draft, "head_ids", None)
    return None if ids is None else len(ids)


def _error(e: BaseException, other: str = "internal") -> str:
    """The JSON error for an exception; `other` is the code for an exception of no named kind
    (bad_config while reading a request)."""
    code = error_code(e) if isinstance(e, PyspecError) else other
    message = str(e) if code != "internal" else "".join(traceback.format_exception(e))
    return json.dumps({"error": {"code": code, "message": message}})


def _worker_oom(e: MemoryError) -> str:
    """The wasm heap is exhausted: nothing here can be trusted to allocate again, so the worker
    reports it fatal and client.js resumes the request on a new worker."""
    return _error(SessionError("worker_oom", f"the worker ran out of memory ({e})"))


# --- the backend ------------------------------------------------------------------------------
BACKENDS = ("auto", "webgpu", "cpu")


async def _browser_device():
    from ..gpu.browser import BrowserDevice

    return await BrowserDevice.create()


async def make_engine(file: GGUFFile, tokenizer: Tokenizer, draft, max_ctx: int,
                      previous: Engine | None = None, backend: str = "auto",
                      open_device=_browser_device) -> Engine:
    """THE backend choice, in one place.

    "webgpu": the champion uploaded to a pyspec.gpu.browser device, the same GPU engine as
    natively. "cpu": the numpy engine (adapter "cpu-numpy") over a fastcpu.FastModel (products
    row by row, einsum in Pyodide). "auto" (the default): WebGPU on a hardware adapter; on a
    software adapter (SwiftShader: `is_cpu`, the adapter's isFallbackAdapter) the numpy engine,
    which runs the 135M champion far faster in wasm than SwiftShader runs its kernels (0.8 vs
    0.013 tokens/s measured on 2 cores with model.py's tiles, see bench/results/README.md).
    Whenever the GPU is not used the reason is in `engine.fallback_reason` and a code in the
    receipt's fallbacks (Engine fields).

    The CPU Model (which dequantizes every weight: about 540 MB for the champion in wasm) is made
    only when the CPU engine is chosen. The champion goes to the GPU once per session:
    `previous` (the engine this one replaces, for another drafter) lends its GPU model.
    `open_device()` (awaited) gives the WebGPU device: navigator.gpu's in the page; tests pass
    another."""
    from ..gpu import GPUError, NoAdapterError
    from ..gpu.model import GPUModel

    if backend not in BACKENDS:
        raise SessionError("bad_config", f"unknown backend {backend!r}: use one of {BACKENDS}")
    fallbacks = previous.fallbacks if previous is not None else []
    if fallbacks:
        # This session already chose the CPU: keep that choice and its reason.
        kind, reason = fallbacks[0]["kind"], previous.fallback_reason
    elif backend == "cpu":
        kind, reason = "cpu_requested", "the CPU engine was requested (backend=cpu)"
    else:
        try:
            gpu_model = getattr(previous, "champion", None)
            if (not isinstance(gpu_model, GPUModel) or gpu_model.file is not file
                    or gpu_model.dev.lost is not None):
                from ..gpu import load_model
                from ..gpu.step import SLOT_CHAMPION

                dev = await open_device()
                if backend == "auto" and dev.is_cpu:
                    dev.destroy()
                    raise _SoftwareAdapter(f"the WebGPU adapter ({dev.name}) is a software "
                                           "renderer, slower than the CPU engine; "
                                           "pass backend=webgpu to use it anyway")
                gpu_model = load_model(dev, file, max_ctx=max_ctx)
                # Compile the forward's pipelines now: a shader this browser rejects falls back
                # to the CPU here rather than failing the first request (and TTFT excludes it).
                gpu_model.forward_dispatches(SLOT_CHAMPION)
                await dev.check()
            return Engine(backend_for(gpu_model, draft, max_ctx), tokenizer,
                          recover=_recovery(gpu_model, file, max_ctx, open_device))
        except _SoftwareAdapter as e:
            kind, reason = "software_adapter", str(e)
        except NoAdapterError as e:
            kind, reason = "no_webgpu", str(e)
        except GPUError as e:   # ShapeError among them: a tensor the GPU kernels do not take
            kind, reason = "webgpu_error", str(e)
    champion = previous.champion if fallbacks else FastModel(file)
    return Engine(backend_for(champion, draft, max_ctx), tokenizer, fallback_reason=reason,
                  fallbacks=[{"kind": kind, "adapter": "cpu-numpy"}])


def _draft_pays(engine: Engine) -> bool:
    """Whether a draft model is the page's fastest drafter on `engine` (the draft "auto"): on
    a hardware WebGPU adapter, as natively (load.default_draft: on the H200 the trained draft ran
    1.43x champion-only against n-gram's 1.19x, bench/results/h200.json); not on the numpy engine
    or a software adapter, where it ran 1.00x against n-gram's 1.00x with every stratum at 0.988x
    or more (bench/results/browser-cpu-guard3.json)."""
    dev = getattr(engine.champion, "dev", None)
    return dev is not None and not dev.is_cpu


def _recovery(gpu_model, file: GGUFFile, max_ctx: int, open_device):
    """The engine's `recover` (DESIGN §8): after a GPU fault the request goes on, champion-only,
    from its committed tokens. A lost device is replaced by a new one of the same adapter (its
    weights uploaded again); any other fault (a readback that threw or hung, an out-of-memory),
    or no new device, goes to the numpy champion. A device that failed but is not lost is
    destroyed, so its buffers go with it."""
    from ..gpu import GPUError, load_model
    from ..gpu.backend import GPUBackend

    current = [gpu_model]

    async def recover():
        failed = current[0]
        if failed is not None and failed.dev.lost is None:
            failed.dev.destroy()
        elif failed is not None:
            try:
                dev = await open_device()
                current[0] = load_model(dev, file, max_ctx=max_ctx)
                return GPUBackend(current[0], "none", max_ctx)
            except GPUError:
                pass
        current[0] = None
        return CPUBackend(FastModel(file), "none", max_ctx)

    return recover


def _or(value, default):
    """A request field's value; its default when it is null or absent (0 is a value)."""
    return default if value is None else value


def _sampling(config: dict) -> dict:
    """The sampling controls of a generate config as Options fields (null: off); a stop string
    alone is a list of one, as in the OpenAI API. Options.check judges the values."""
    defaults = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0,
                "presence_penalty": 0.0, "frequency_penalty": 0.0}
    out = {name: _or(config.get(name), d) for name, d in defaults.items()}
    stop = _or(config.get("stop"), [])
    return {**out, "logit_bias": _or(config.get("logit_bias"), {}),
            "stop": tuple([stop] if isinstance(stop, str) else stop)}


def _schema(config: dict) -> dict | None:
    """The JSON schema of a generate config: `json_schema` (a schema), or OpenAI's
    `response_format` {type: "json_schema", json_schema: {name, schema, strict}} (type "text"
    is no constraint). The output always follows the schema, whatever `strict` says."""
    fmt = config.get("response_format")
    if fmt is None or fmt.get("type") == "text":
        return config.get("json_schema")
    if config.get("json_schema") is not None:
        raise SessionError("bad_config", "give json_schema or response_format, not both")
    inner = fmt.get("json_schema")
    if fmt.get("type") != "json_schema" or not isinstance(inner, dict) or not isinstance(
            inner.get("schema"), dict):
        raise SessionError("bad_config", "response_format must be {type: 'json_schema', "
                           "json_schema: {name, schema, strict}} with the schema an object, or "
                           "{type: 'text'}; json_object without a schema is not supported")
    return inner["schema"]


def _exhaust_memory() -> None:
    """The worker-oom drill: take 256 MiB blocks (uninitialised: wasm pages are committed only
    when touched) until an allocation fails; the MemoryError propagates, the blocks are freed."""
    import numpy as np

    held = []
    for _ in range(64):   # wasm32 fails within 16 blocks (4 GiB); natively memory is overcommitted
        held.append(np.empty(256 << 20, np.uint8))
    raise MemoryError("the worker-oom drill allocated 16 GiB without a failure")


def chat_prefix(tokenizer: Tokenizer) -> list[int]:
    """The token ids every one-message chat starts with (the template's default system turn and
    the user turn's header): the common prefix of two chats that differ only in the message."""
    a = tokenizer.encode_chat([{"role": "user", "content": "a"}])
    b = tokenizer.encode_chat([{"role": "user", "content": "b"}])
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return a[:n]


class _SoftwareAdapter(Exception):
    """auto chose the CPU over a software WebGPU adapter."""


# --- the session ------------------------------------------------------------------------------
def _lend_dequant_kernels() -> None:
    """In the page, dequantize with web/dequant.js (worker.js registers it as `pyspec_dequant`):
    bit-identical to quant.py's numpy, and ten times faster in wasm, the bulk of model load."""
    try:
        import pyspec_dequant
    except ImportError:   # natively, and in tests: numpy's own
        return
    quant.use_kernels({"Q4_1": pyspec_dequant.q4_1, "Q8_0": pyspec_dequant.q8_0})


class Session:
    """Models loaded from buffers, an engine per drafter choice, the last request's result."""

    def __init__(self, open_device=_browser_device):
        _lend_dequant_kernels()
        self.open_device = open_device        # make_engine's WebGPU device (navigator.gpu's)
        self.file: GGUFFile | None = None     # the champion's GGUF (its buffer stays in wasm)
        self.config = None
        self.backend = "auto"
        self.tokenizer: Tokenizer | None = None
        self.draft_model: Model | BridgedModel | None = None
        self.max_ctx = DEFAULT_MAX_CTX
        self.engine: Engine | None = None
        self.engine_draft: str | None = None
        self.guard_timing: dict = {}       # every engine's guard times (Engine.guard_timing)
        self.default_draft = "ngram"
        self.last: dict | None = None      # the last finished request: text, tokens, stats, receipt
        self.cancelled: set[int] = set()   # request ids asked to stop
        self.running: int | None = None
        self.drills = False                # fault drills (lose_device, config.drill) allowed
        self.load_faults: list[dict] = []  # faults met loading the weights (receipt faults)
        self.warming = None                # the warm-up task warm() started (init option warm)
        self.warm_next = None              # (engine, prefix) load() left for warm() to start

    # --- loading --------------------------------------------------------------------------
    # What load() replaces; a failed load puts them back.
    _LOADED = ("file", "config", "tokenizer", "draft_model", "backend", "max_ctx",
               "default_draft", "engine", "engine_draft", "drills", "load_faults",
               "guard_timing")

    async def load(self, options_json: str, champion_buf, draft_buf=None) -> str:
        """Load the champion (and a draft model) from GGUF buffers. options: {"draft": ngram |
        none | self:L | model | auto (the draft model where it pays, _draft_pays, else ngram;
        the worker sends the draft only for a hardware adapter), "max_ctx": int,
        "backend": auto | webgpu | cpu (make_engine),
        "champion_name", "draft_name", "warm": prefill the chat template's system turn when
        warm() is called after load, while the visitor types (the page sets it; generate waits
        for it)}. Returns
        {"adapter", "vocab", "context", "n_layers", "draft" (the drafter chosen), ...} or an
        error."""
        if self.warming is not None:      # the last load's warm-up uses the engine replaced here
            warming, self.warming = self.warming, None
            await asyncio.gather(warming, return_exceptions=True)
        before = {name: getattr(self, name) for name in self._LOADED}
        try:
            opts = _fields(options_json, "init options", LOAD_FIELDS)
            if opts.get("max_ctx") is not None and opts["max_ctx"] < 1:
                raise SessionError("bad_config", f"max_ctx must be a positive number of "
                                   f"positions, got {opts['max_ctx']}")
            # The same champion bytes again (a reload): keep the file, so the engine's GPU
            # model is lent to the new one rather than uploaded (and compiled) again.
            t0 = time.perf_counter()
            same = self.file is not None and self.file.buf == champion_buf
            file = self.file if same else GGUFFile(champion_buf,
                                                   opts.get("champion_name") or "champion")
            config = Config.from_metadata(file.metadata)
            t1 = time.perf_counter()
            tokenizer = Tokenizer.from_metadata(file.metadata)
            t2 = time.perf_counter()
            draft_model = None
            if draft_buf is not None:
                draft_file = GGUFFile(draft_buf, opts.get("draft_name") or "draft")
                pair = check_pair(file.metadata, draft_file.metadata)   # its class (compat.py)
                pair.raise_if_bad()
                bind_borrowed(draft_file, file)     # its embedding may be the champion's
                if is_eagle(draft_file.metadata):
                    raise DraftSpecError(f"{draft_file.source} is an EAGLE-style head: it runs "
                                         "in the numpy engine of the CLI so far, not in the "
                                         "page; give a draft model, or use ngram")
                draft_model = Model(draft_file)
                vocab = opts.get("draft_vocab")
                if vocab is not None and pair.bridge is not None:
                    if not opts.get("draft_vocab_shipped"):
                        raise DraftSpecError(f"{draft_file.source} has another vocabulary than "
                                             "the champion: a reduced head (draft_vocab) is for "
                                             "a draft with the champion's tokenizer; drop it")
                    # The site's, which the worker sends with the draft whatever the champion:
                    # with another vocabulary the draft runs bridged on its full head, as in
                    # the CLI.
                    vocab = None
                if vocab is not None:
                    # Its reduced head (load.reduced_head_ids' sidecar, fetched by the worker):
                    # the numpy engine's draft steps shrink; a GPU draft keeps its full head.
                    draft_model.reduce_head(parse_reduced_head(
                        vocab, draft_model.config.vocab_size,
                        f"{draft_file.source}'s vocab.json"))
                if pair.bridge is not None:   # another vocabulary: drafts through the bridge
                    draft_model = BridgedModel(draft_model, pair.bridge)
            self.file, self.config, self.tokenizer = file, config, tokenizer
            self.draft_model = draft_model
            self.backend = opts.get("backend") or "auto"
            self.max_ctx = min(opts.get("max_ctx") or DEFAULT_MAX_CTX, config.context_length)
            requested = opts.get("draft") or ("model" if draft_model else "ngram")
            auto = requested == "auto"
            self.default_draft = ("model" if draft_model else "ngram") if auto else requested
            self.drills = bool(opts.get("drills"))
            self.load_faults = _load_faults(opts.get("load_faults"))
            if not (same and (self.backend, self.max_ctx) == (before["backend"],
                                                                before["max_ctx"])):
                self.engine = None
            self.engine_draft = None     # a new engine (and cache); the champion may be lent
            self.guard_timing = {}       # other models: their times are measured afresh
            t3 = time.perf_counter()
            engine = await self._engine(self.default_draft)
            auto_note = None
            if auto and self.default_draft == "model" and not _draft_pays(engine):
                # "auto" (the worker sent the draft for a hardware adapter) on an engine where a
                # draft model does not pay: n-gram, as load.default_draft chooses natively.
                auto_note = (f"the engine runs on {engine.adapter}, where the draft model does "
                             "not pay: prompt n-gram")
                self.default_draft = "ngram"
                engine = await self._engine("ngram")
            t4 = time.perf_counter()
            old = getattr(getattr(before["engine"], "champion", None), "dev", None)
            if old is not None and old is not getattr(engine.champion, "dev", None):
                old.destroy()            # the replaced engine's device, with its buffers
            self.warm_next = (engine, chat_prefix(tokenizer)) if opts.get("warm") else None
            return json.dumps({"adapter": engine.adapter, "pyspec_version": __version__,
                               "fallback": engine.fallback_reason,
                               # its kind (receipts' fallbacks): software_adapter, no_webgpu,
                               # webgpu_error, cpu_requested
                               "fallback_kind": (engine.fallbacks[0]["kind"]
                                                 if engine.fallbacks else None),
                               "vocab": config.vocab_size, "context": self.max_ctx,
                               "n_layers": config.n_layers,
                               "draft": self.default_draft,
                               # why "auto" chose otherwise than the worker expected, else null
                               "draft_auto": auto_note,
                               # the draft's head rows on the numpy engine (null: its full head)
                               "draft_head_rows": _head_rows(draft_model),
                               "weight_bytes": engine.champion.weight_bytes,
                               # the CPU engine's row kernel (fastcpu.choose_kernel), else null
                               "cpu_kernel": getattr(engine.champion, "kernel", None),
                               # where the load's time went (ms): the GGUF's header, the
                               # tokenizer, the draft model, the engine (weights dequantized
                               # or uploaded, kernels compiled)
                               "load_ms": {name: round(1000 * dt) for name, dt in (
                                   ("parse", t1 - t0), ("tokenizer", t2 - t1),
                                   ("draft", t3 - t2), ("engine", t4 - t3))}})
        except Exception as e:  # noqa: BLE001 - every error becomes a typed message
            # A failed init leaves the session as it was: a model loaded before still serves.
            for name, value in before.items():
                setattr(self, name, value)
            if isinstance(e, MemoryError):   # the model does not fit the page's wasm memory
                why = str(e) or "MemoryError"
                return _error(SessionError(
                    "out_of_memory", f"the model does not fit in this page's memory ({why}): "
                    "load a smaller model (or a smaller maxCtx), or use a browser with more "
                    "memory for the page"))
            return _error(e)

    def warm(self) -> None:
        """Start the warm-up load's "warm" option asked for: the chat template's system turn goes
        into the cache while the visitor types, and the first request prefills only its own
        message. worker.js calls this once `ready` is posted: a task started inside load() ran
        before the worker got back control (1.3 s of the champion's start on two cores)."""
        pending, self.warm_next = self.warm_next, None
        if pending is not None and pending[0] is self.engine and self.warming is None:
            self.warming = asyncio.ensure_future(pending[0].warm(pending[1]))

    async def _engine(self, draft: str) -> Engine:
        """The engine for a drafter choice; rebuilt (with a fresh cache) when the choice changes."""
        if self.file is None:
            raise SessionError("not_ready", "no model is loaded: send init first")
        lost = getattr(getattr(self.engine, "champion", None), "dev", None)
        if (self.engine is None or self.engine_draft != draft
                or (lost is not None and lost.lost is not None)):   # a new device for a lost one
            if draft in ("trained", "ngram+trained"):   # the CLI's name: a file in models/
                raise SessionError("bad_config", f"draft {draft!r} names the command line's "
                                   "trained draft: in the page give the draft model at init "
                                   "(a model of the site's manifest, or its URL) and choose "
                                   "draft 'model' (or 'ngram+model')")
            spec, parsed = draft, parse_draft(draft, self.config.n_layers)
            if parsed.needs_weights:
                # The page's draft model arrives as a buffer at init; no paths in the browser.
                if parsed.path is not None or self.draft_model is None:
                    raise SessionError("bad_config", f"draft {draft!r} needs a draft model: "
                                       "give it at init and choose draft 'model' (or "
                                       "'ngram+model': n-gram where the text repeats)")
                spec = model_drafter(self.draft_model, self.max_ctx)
                if parsed.kind == "combo":
                    spec = Combo(NgramDrafter(), spec)
            previous = self.engine
            self.engine = await make_engine(self.file, self.tokenizer, spec, self.max_ctx,
                                            previous, self.backend, self.open_device)
            # The guard's times and acceptance per (adapter, drafter) outlive the engine: a
            # drafter chosen again starts from what it measured before (in the page as in one
            # native engine), not from a champion-only baseline and a probe (for a draft model
            # a catch-up over the whole context) at every request.
            self.engine.guard_timing = self.guard_timing
            self.engine_draft = draft
            if previous is not None:
                # Its own buffers go now (a lent GPU model stays, with the new engine).
                previous.close()
        return self.engine

    # --- generation -----------------------------------------------------------------------
    async def generate(self, request_id: int, messages_json: str, config_json: str,
                       on_chunk, resume_json: str = "null", on_start=None) -> str:
        """Stream one request. `on_chunk(offset, text, n_tokens, ids_json, cycle, marks_json)` is
        called once per cycle that commits text (ids_json: the JSON list of the ids committed
        since the last chunk; cycle: cycles run so far; marks_json: {"kinds", "starts"}, each
        id's engine.TOKEN_KINDS entry and where its text begins; offsets in UTF-16 code units,
        as JavaScript counts). config: {max_tokens, temperature, seed, verify, k, draft, drill}.
        resume: null or {ids, fault} (_resume): go on from the ids an interrupted run of this
        request committed. `on_start()`, when given, is called once the request is checked and
        about to run (worker.js posts `started`: the facade's create() resolves then). Returns
        {"text", "tokens", "finish_reason", "stats", "receipt"} (finish_reason "cancelled"
        when cancel() stopped it: the engine checks before every cycle; one cancelled before it
        began has no stats or receipt), or an error."""
        try:
            return await self._generate(request_id, messages_json, config_json, on_chunk,
                                        resume_json, on_start)
        finally:
            self.cancelled.discard(request_id)

    async def _generate(self, request_id: int, messages_json: str, config_json: str, on_chunk,
                        resume_json: str, on_start) -> str:
        self.warm_next = None           # a request came first: it prefills for itself
        if self.warming is not None:    # never two prefills on one cache at once
            warming, self.warming = self.warming, None
            await asyncio.gather(warming, return_exceptions=True)  # a failed warm-up: no rows
        if request_id in self.cancelled:    # cancelled while it waited its turn
            return _cancelled("")
        try:     # reading and checking the request: whatever fails is the request's fault
            messages = _parse(messages_json, "messages")
            config = _fields(config_json, "config", GENERATE_FIELDS)
            opts = Options(max_tokens=_or(config.get("max_tokens"), 128),
                           temperature=float(_or(config.get("temperature"), 0.0)),
                           seed=_or(config.get("seed"), 0), verify=config.get("verify") or None,
                           k=config.get("k") or "heuristic", json_schema=_schema(config),
                           **_sampling(config))
            opts.check()
            resume = _resume(resume_json)
            drill = _drill(config.get("drill"), self.drills)
        except Exception as e:  # noqa: BLE001
            return _error(e, "bad_config")
        try:     # building the engine: a failure of no named kind is a bug (internal)
            draft = config.get("draft") or self.default_draft
            if draft == "auto":    # what "auto" chose at load, or would choose for this engine
                draft = "model" if self.draft_model is not None and (
                    self.engine is None or _draft_pays(self.engine)) else "ngram"
            engine = await self._engine(draft)
            if drill and drill[0] != "worker-oom" and getattr(engine.champion, "dev", None) is None:
                raise SessionError("bad_config", f"the {drill[0]} drill needs the WebGPU engine, "
                                   f"not {engine.adapter}: load with backend webgpu")
            try:
                fitted = conversation.fit(self.tokenizer, messages, opts.max_tokens,
                                          engine.kv.max_ctx,
                                          config.get("context_overflow") or "drop_oldest")
            except TokenizerError as e:   # malformed messages: the request's fault, not the model's
                raise SessionError("bad_config", str(e)) from e
            prompt = fitted.ids
        except MemoryError as e:
            return _worker_oom(e)
        except Exception as e:  # noqa: BLE001
            return _error(e)
        if on_start is not None:
            on_start()
        self.running = request_id
        report: dict = {}
        text = ""
        try:
            stream = engine.stream(prompt, opts, report, resume=resume,
                                   should_stop=lambda: request_id in self.cancelled)
            try:
                units = None
                async for chunk in stream:
                    if units is None:      # the text a resumed run showed comes first
                        units = _Utf16()
                        if resume is not None:
                            units.add(self.tokenizer.decode(resume.ids)[:chunk.offset])
                    offset = units.at(chunk.offset)
                    units.add(chunk.text)
                    on_chunk(offset, chunk.text, chunk.n_tokens, json.dumps(chunk.ids),
                             chunk.cycle, json.dumps({"kinds": chunk.kinds, "starts": [
                                 units.at(s) for s in chunk.starts]}))
                    text += chunk.text
                    if drill and chunk.cycle >= drill[1]:
                        drill = self._strike(drill, chunk.cycle)
            finally:
                await stream.aclose()
        except MemoryError as e:
            return _worker_oom(e)
        except Exception as e:  # noqa: BLE001
            return _error(e)
        finally:
            self.running = None
        if not report:
            return _cancelled(text)
        fitted.annotate(report)
        if self.load_faults:   # in the receipt of the first request after the load
            report["receipt"]["faults"] = self.load_faults + report["receipt"]["faults"]
            self.load_faults = []
        self.last = report
        if any(f["kind"] not in RESUME_FAULTS for f in engine.faults):
            # The request finished champion-only. On a new device: the next request's engine
            # borrows it (with its drafter again); on the CPU: the next one seeks a device.
            dev = getattr(engine.champion, "dev", None)
            if dev is not None and dev.lost is None:
                self.engine_draft = None
            else:
                self.engine = None
        return json.dumps({k: report[k] for k in ("text", "tokens", "finish_reason", "stats",
                                                  "receipt", "notice")})

    def cancel(self, request_id: int, waiting: bool = False) -> str:
        """Ask a request to stop: the running one after its current cycle; with `waiting` (the
        worker has it queued behind another, or it is being set up) before its first cycle.
        Says whether there was such a request."""
        if self.running == request_id or waiting:
            self.cancelled.add(request_id)
            return json.dumps({"cancelled": True})
        return json.dumps({"cancelled": False})

    def lose_device(self) -> str:
        """A fault drill (only on a session loaded with drills on): destroy the engine's WebGPU
        device, as a GPU reset would. The request in flight finishes on the CPU from its
        committed tokens; the next one seeks a device."""
        if not self.drills:
            return _error(SessionError("bad_request", "lose_device is a fault drill: load the "
                                       "session with drills on (init option drills: true)"))
        return json.dumps({"lost": self._destroy_device()})

    def _strike(self, drill: tuple[str, int], cycle: int) -> tuple[str, int] | None:
        """Make the drilled fault happen (SESSION_DRILLS); returns the drill still to come:
        device-lost-repeat strikes again at the next chunk, on whatever device is then in use."""
        kind = drill[0]
        if kind in ("device-lost", "device-lost-repeat"):
            lost = self._destroy_device()
            return (kind, cycle + 1) if kind == "device-lost-repeat" and lost else None
        if kind == "worker-oom":
            _exhaust_memory()
        else:
            self.engine.champion.dev.drill = kind
        return None

    def _destroy_device(self) -> bool:
        dev = getattr(getattr(self.engine, "champion", None), "dev", None)
        if dev is None:
            return False
        dev.destroy()
        return True

    def stats(self) -> str:
        """The last request's stats, and `memory`: the WebGPU devices alive and their buffer
        bytes (gpu.browser.live; zeros natively), for the page's leak checks."""
        memory = {"gpu_devices": 0, "gpu_bytes": 0}
        try:
            from ..gpu import browser
            memory = browser.live()
        except ImportError:  # pragma: no cover - the browser module imports everywhere
            pass
        return json.dumps({"stats": self.last["stats"] if self.last else None,
                           "memory": memory})

    def receipt(self) -> str:
        return json.dumps({"receipt": self.last["receipt"] if self.last else None})
