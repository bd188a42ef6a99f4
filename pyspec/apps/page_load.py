"""Loading in the browser worker: Session.load's work, and the questions the worker
asks before any download (the model card from a file's first bytes; whether the draft "auto"
fetches the site's draft model).

load() reads the champion (and a draft model) from the sources the worker hands over
(page_engine.open_gguf), builds the engine of the chosen drafter through the session (its
_engine: page_engine.make_engine), applies "auto" (drafters.auto's rule, then a recorded gate
verdict: verdicts.choose) and puts the session back as it was when anything fails. Every
function here answers in JSON strings, as the session's methods do. Not here: requests,
cancellation, drills (session.py), the backend choice (page_engine.py), downloads and OPFS
(web/worker.js).
"""

from __future__ import annotations

import asyncio
import json
import time

from .. import __version__, gctime, verdicts
from ..cpu.model import Config
from ..drafters.auto import auto_draft as auto_rule
from ..engine import Engine
from ..formats.gguf import HeaderIncompleteError
from ..text.tokenizer import Tokenizer
from . import info, page_gate
from .page_engine import capped, open_gguf, page_draft_model
from .wire import (LOAD_FIELDS, SessionError, check_fields, error_reply, head_rows, parse_json,
                   read_load_faults)

# Most context a browser session allocates by default: the champion's full 8192 positions would
# cost 30 * 8192 * 3 * 64 * 4 B * 2 = 377 MB of KV cache in wasm memory.
DEFAULT_MAX_CTX = 2048


def draft_pays(engine: Engine, has_model: bool = True) -> tuple[bool, str]:
    """The draft "auto" (drafters.auto's rule) on `engine`: (whether the draft model drafts,
    why)."""
    dev = getattr(engine.champion, "dev", None)
    kind = "cpu" if dev is None else "software" if dev.is_cpu else "gpu"
    return auto_rule(has_model, kind, engine.adapter)


def chat_prefix(tokenizer: Tokenizer) -> list[int]:
    """The token ids every one-message chat starts with (the template's default system turn and
    the user turn's header): the common prefix of two chats that differ only in the message."""
    a = tokenizer.encode_chat([{"role": "user", "content": "a"}])
    b = tokenizer.encode_chat([{"role": "user", "content": "b"}])
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return a[:n]


# What load() replaces on the session; a failed load puts them back.
LOADED = ("file", "config", "tokenizer", "draft_model", "backend", "max_ctx", "gpu_limits",
          "default_draft", "engine", "engine_draft", "drills", "load_faults", "guard_timing",
          "auto_choice")


async def load(session, options_json: str, champion_buf, draft_buf=None) -> str:
    """Session.load (its docstring has the options and the reply): the last load's warm-up
    awaited, the models read, the engine built; a failure puts the session back as it was and
    is the reply."""
    if session.warming is not None:      # the last load's warm-up uses the engine replaced here
        warming, session.warming = session.warming, None
        await asyncio.gather(warming, return_exceptions=True)
    before = {name: getattr(session, name) for name in LOADED}
    try:
        return json.dumps(await read(session, options_json, champion_buf, draft_buf, before))
    except Exception as e:  # noqa: BLE001 - every error becomes a typed message
        # A failed init leaves the session as it was: a model loaded before still serves.
        for name, value in before.items():
            setattr(session, name, value)
        if isinstance(e, MemoryError):   # the model does not fit the page's wasm memory
            why = str(e) or "MemoryError"
            return error_reply(SessionError(
                "out_of_memory", f"the model does not fit in this page's memory ({why}): "
                "load a smaller model (or a smaller maxCtx), or use a browser with more "
                "memory for the page"))
        return error_reply(e)


async def read(session, options_json: str, champion_buf, draft_buf, before: dict) -> dict:
    """load's work: the options checked, the models read, the engine of the drafter built
    ("auto" applied); returns the reply's facts (the adapter, the drafter, where the time went)."""
    opts = check_fields(options_json, "init options", LOAD_FIELDS)
    if opts.get("max_ctx") is not None and opts["max_ctx"] < 1:
        raise SessionError("bad_config", f"max_ctx must be a positive number of "
                           f"positions, got {opts['max_ctx']}")
    capped(session.open_device, opts.get("gpu_limits"))   # checked before the model is read
    # The same champion bytes again (a reload): keep the file, so the engine's GPU
    # model is lent to the new one rather than uploaded (and compiled) again.
    t0 = time.perf_counter()
    file = open_gguf(champion_buf, opts.get("champion_name") or "champion")
    same = session.file is not None and session.file.sha256() == file.sha256()
    if same:
        # The same bytes, read from now on through the new source: the old one may be gone
        # (its OPFS file written again by a drill or a fresh download).
        session.file.reader = file.reader
        file = session.file
    config = Config.from_metadata(file.metadata)
    t1 = time.perf_counter()
    tokenizer = Tokenizer.from_metadata(file.metadata)
    t2 = time.perf_counter()
    draft_model = None if draft_buf is None else page_draft_model(file, draft_buf, opts)
    session.file, session.config, session.tokenizer = file, config, tokenizer
    session.draft_model = draft_model
    session.backend = opts.get("backend") or "auto"
    session.max_ctx = min(opts.get("max_ctx") or DEFAULT_MAX_CTX, config.context_length)
    requested = opts.get("draft") or ("model" if draft_model else "ngram")
    auto = requested == "auto"
    session.default_draft = ("model" if draft_model else "ngram") if auto else requested
    session.drills = bool(opts.get("drills"))
    session.gpu_limits = opts.get("gpu_limits")
    session.load_faults = read_load_faults(opts.get("load_faults"))
    if not (same and (session.backend, session.max_ctx, session.gpu_limits)
            == (before["backend"], before["max_ctx"], before["gpu_limits"])):
        session.engine = None
    session.engine_draft = None     # a new engine (and cache); the champion may be lent
    session.guard_timing = {}       # other models: their times are measured afresh
    t3 = time.perf_counter()
    engine, auto_note = await choose(session, auto, opts.get("verdicts"))
    t4 = time.perf_counter()
    old = getattr(getattr(before["engine"], "champion", None), "dev", None)
    if old is not None and old is not getattr(engine.champion, "dev", None):
        old.destroy()            # the replaced engine's device, with its buffers
    session.warm_next = (engine, chat_prefix(tokenizer)) if opts.get("warm") else None
    gctime.settle()   # the loaded models out of the collector's walks (pyspec/gctime.py)
    return reply(session, engine, config, draft_model, auto_note,
                 {"parse": t1 - t0, "tokenizer": t2 - t1, "draft": t3 - t2, "engine": t4 - t3})


async def choose(session, auto: bool, table_json: str | None) -> tuple[Engine, str | None]:
    """The engine of the session's drafter, with "auto" applied: a draft model that does not
    pay on this engine gives way to n-gram, then the recorded verdicts; (engine, why "auto"
    chose otherwise than the worker expected, else None)."""
    engine = await session._engine(session.default_draft)
    auto_note = None
    if auto and session.default_draft == "model":
        pays, why = draft_pays(engine)
        if not pays:
            # "auto" (the worker sent the draft, expecting a hardware adapter) on an engine
            # where a draft model does not pay: n-gram, as natively.
            auto_note, session.default_draft = why, "ngram"
            engine = await session._engine("ngram")
    session.auto_choice = None
    if auto:
        engine = await follow_verdicts(session, engine, table_json)
        said = verdicts.explain(session.auto_choice)
        if said:    # the verdict that chose, where it is kept and how to clear it
            auto_note = (f"{said} in this browser (OPFS verdicts.json); "
                         "SpecDecoder.clearVerdicts() removes it")
    return engine, auto_note


def reply(session, engine: Engine, config, draft_model, auto_note: str | None,
          seconds: dict) -> dict:
    """The ready reply's facts: the adapter, the drafter and why, where the load's time went."""
    return {"adapter": engine.adapter, "pyspec_version": __version__,
            "fallback": engine.fallback_reason,
            # its kind (receipts' fallbacks): software_adapter, no_webgpu, webgpu_error,
            # cpu_requested
            "fallback_kind": engine.fallbacks[0]["kind"] if engine.fallbacks else None,
            "vocab": config.vocab_size, "context": session.max_ctx,
            "n_layers": config.n_layers, "draft": session.default_draft,
            # the gate verdict that chose it (its sha256), else null
            "draft_verdict": (session.auto_choice.receipt()["verdict_sha256"]
                              if session.auto_choice else None),
            # why "auto" chose otherwise than the worker expected, else null
            "draft_auto": auto_note,
            # the draft's head rows on the numpy engine (null: its full head)
            "draft_head_rows": head_rows(draft_model),
            "weight_bytes": engine.champion.weight_bytes,
            # the CPU engine's row kernel (fastcpu.choose_kernel), else null
            "cpu_kernel": getattr(engine.champion, "kernel", None),
            # where the load's time went (ms): the GGUF's header, the tokenizer, the draft
            # model, the engine (weights dequantized or uploaded, kernels compiled)
            "load_ms": {name: round(1000 * dt) for name, dt in seconds.items()}}


async def follow_verdicts(session, engine: Engine, table_json: str | None) -> Engine:
    """"auto" at load: a recorded gate verdict for this champion, draft and the engine's
    device class (verdicts.choose, as load.auto_choice natively) over the rule above; the
    engine for its choice. Sets auto_choice, which the receipts of "auto" requests name."""
    table = verdicts.parse(parse_json(table_json, "verdicts"), "the verdicts init option") \
        if table_json else []
    choice = None
    if table:
        candidates = verdicts.weightless(table)
        if session.draft_model is not None:
            candidates[session.draft_model.sha256()] = "model"   # a bridged one's own
        choice = verdicts.choose(table, engine.champion.sha256(), engine.device_class,
                                 candidates, session.default_draft)
    session.auto_choice = choice or verdicts.Choice(session.default_draft)
    if session.auto_choice.drafter != session.default_draft:
        session.default_draft = session.auto_choice.drafter
        engine = await session._engine(session.default_draft)
    return engine


def auto_draft(facts_json: str) -> str:
    """The draft "auto" for the worker, asked before any draft downloads: facts {"has_model":
    the site has a draft model for this champion, "backend": init's, "webgpu": {available,
    fallback (a software adapter), description}, and the gate's verdicts (page_gate.
    draft_download)} -> {"model": whether to fetch and load the draft model, "reason"}."""
    facts = json.loads(facts_json)
    webgpu = facts.get("webgpu") or {}
    if facts.get("backend") == "cpu":
        kind, name = "cpu", "the CPU engine (backend cpu)"
    elif not webgpu.get("available"):
        kind, name = "cpu", "the CPU engine (no WebGPU adapter)"
    else:
        kind = "software" if webgpu.get("fallback") is True else "gpu"
        name = webgpu.get("description") or webgpu.get("vendor") or "WebGPU"
    model, reason = auto_rule(bool(facts.get("has_model")), kind, name)
    model, reason = page_gate.draft_download(facts, kind, model, reason)
    return json.dumps({"model": model, "reason": reason})


def card(head, total: int, name: str, facts_json: str) -> str:
    """The model card from a file's first bytes (`head`, a bytearray) and its size, asked
    before the download: {"needed": bytes} where the header runs on past `head` (the worker
    reads more), else {"card", "error"}: error {code, message} when this page cannot run the
    model (info.page_refusal), else null. facts: {"limits": the adapter's maxBufferSize and
    maxStorageBufferBindingSize or null, "backend": init's, "ctx": maxCtx or null}."""
    facts = json.loads(facts_json)
    limits = facts.get("limits")
    try:
        c = info.card_from_header(head, total, name, facts.get("ctx") or DEFAULT_MAX_CTX,
                                  limits)
    except HeaderIncompleteError as e:
        return json.dumps({"needed": e.needed})
    refusal = info.page_refusal(c, limits is not None, facts.get("backend") or "auto")
    error = json.loads(error_reply(refusal))["error"] if refusal else None
    return json.dumps({"card": c, "error": error})
