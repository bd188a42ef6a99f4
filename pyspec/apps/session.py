"""The Python side of the browser worker (web/worker.js): one Session per worker.

The worker fetches the weights (OPFS, sha256-checked as they stream) and hands them here as
sources read a tensor at a time (page_engine.open_gguf); a Session loads the champion and an
optional draft model from them, then serves requests with the same
engine.Engine, Options and Tokenizer.encode_chat that `python -m pyspec generate` uses: nothing
here decodes, drafts or verifies on its own.

The boundary with JavaScript is deliberately plain: every public method takes and returns JSON
strings (and numbers), never Python objects, so no proxy outlives a call and an error is a value
(wire.py: the requests' checks, the errors' JSON). page_engine.make_engine is the one place that
chooses the backend. Not here: loading and the questions asked before it (page_load.py), the
page's gate (page_gate.py), downloads, OPFS, messages.
"""

from __future__ import annotations

import asyncio
import json
import sys

from .. import verdicts
from ..drafters import parse_draft
from ..engine import Engine
from ..formats.gguf import GGUFFile
from ..load import GivenDraft
from ..options import from_request
from ..text import conversation, template, toolcalls
from ..text.tokenizer import Tokenizer, TokenizerError
from . import page_gate, page_load
from .page_engine import browser_device, capped, lend_dequant_kernels, make_engine
from .page_load import DEFAULT_MAX_CTX, draft_pays
from .wire import (
    GENERATE_FIELDS,
    RESUME_FAULTS,
    SessionError,
    Utf16,
    cancelled_reply,
    check_fields,
    error_reply,
    exhaust_memory,
    parse_json,
    read_drill,
    read_resume,
    schema_of,
    worker_oom,
)


# --- the session ------------------------------------------------------------------------------
class Session:
    """Models loaded from buffers, an engine per drafter choice, the last request's result."""

    def __init__(self, open_device=browser_device):
        lend_dequant_kernels()
        self.open_device = open_device        # make_engine's WebGPU device (navigator.gpu's)
        self.file: GGUFFile | None = None     # the champion's GGUF (read through its source)
        self.config = None
        self.backend = "auto"
        self.tokenizer: Tokenizer | None = None
        self.draft_model: GivenDraft | None = None   # init's draft model (load.GivenDraft)
        self.max_ctx = DEFAULT_MAX_CTX
        self.engine: Engine | None = None
        self.engine_draft: str | None = None
        self.guard_timing: dict = {}       # every engine's guard times (Engine.guard_timing)
        self.default_draft = "ngram"
        self.auto_choice: verdicts.Choice | None = None   # what "auto" chose at load, and why
        self.last: dict | None = None      # the last finished request: text, tokens, stats, receipt
        self.cancelled: set[int] = set()   # request ids asked to stop
        self.running: int | None = None
        self.gpu_limits: dict | None = None   # init's gpuLimits (page_engine.capped)
        self.drills = False                # fault drills (lose_device, config.drill) allowed
        self.load_faults: list[dict] = []  # faults met loading the weights (receipt faults)
        self.warming = None                # the warm-up task warm() started (init option warm)
        self.warm_next = None              # (engine, prefix) load() left for warm() to start

    # --- loading (page_load.py) -----------------------------------------------------------
    async def load(self, options_json: str, champion_buf, draft_buf=None) -> str:
        """Load the champion (and a draft model) from GGUF buffers. options: {"draft": ngram |
        none | self:L | model | auto (the draft model where it pays, draft_pays, else ngram;
        the worker sends the draft only where auto_draft said so), "max_ctx": int,
        "backend": auto | webgpu | cpu (make_engine),
        "champion_name", "draft_name", "warm": prefill the chat template's system turn when
        warm() is called after load, while the visitor types (the page sets it; generate waits
        for it)}. Returns
        {"adapter", "vocab", "context", "n_layers", "draft" (the drafter chosen), ...} or an
        error."""
        return await page_load.load(self, options_json, champion_buf, draft_buf)

    def auto_draft(self, facts_json: str) -> str:
        """The draft "auto" for the worker, asked before any draft downloads (page_load.
        auto_draft)."""
        return page_load.auto_draft(facts_json)

    def card(self, head, total: int, name: str, facts_json: str) -> str:
        """The model card from a file's first bytes, asked before the download (page_load.
        card)."""
        return page_load.card(head, total, name, facts_json)

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
            parsed = parse_draft(draft, self.config.n_layers)
            if parsed.needs_weights:
                # The page's draft model arrives as a buffer at init; no paths in the browser.
                if parsed.path is not None or self.draft_model is None:
                    raise SessionError("bad_config", f"draft {draft!r} needs a draft model: "
                                       "give it at init and choose draft 'model' (or "
                                       "'ngram+model': n-gram where the text repeats)")
            previous = self.engine
            self.engine = await make_engine(self.file, self.tokenizer, draft, self.max_ctx,
                                            previous, self.backend,
                                            capped(self.open_device, self.gpu_limits),
                                            given=self.draft_model)
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
        called once per cycle that commits text (ids_json: the JSON list of the ids committed since
        the last chunk; cycle: cycles run so far; marks_json: {"kinds", "starts"}, each id's
        chunks.TOKEN_KINDS entry and where its text begins, and for a tools request "tools": the
        output so far as content and calls (_tool_split); offsets in UTF-16 code units, as
        JavaScript counts). config: {max_tokens, temperature, seed, verify, k, tree, draft, drill,
        ...} (options.REQUEST). resume: null or {ids, fault} (_resume): go on from the ids an
        interrupted run of this request committed. `on_start()`, when given, is called once the
        request is checked and about to run (worker.js posts `started`: the facade's create()
        resolves then). Returns {"text", "tokens", "finish_reason", "stats", "receipt"}
        (finish_reason "cancelled" when cancel() stopped it: the engine checks before every cycle;
        one cancelled before it began has no stats or receipt), and for a tools request
        "tool_calls" and "content" (text/toolcalls.result), or an error."""
        try:
            return await self._generate(request_id, messages_json, config_json, on_chunk,
                                        resume_json, on_start)
        finally:
            self.cancelled.discard(request_id)

    async def _generate(self, request_id: int, messages_json: str, config_json: str, on_chunk,
                        resume_json: str, on_start) -> str:
        await self._unwarm()
        if request_id in self.cancelled:    # cancelled while it waited its turn
            return cancelled_reply("")
        try:     # reading and checking the request: whatever fails is the request's fault
            messages = parse_json(messages_json, "messages")
            config = check_fields(config_json, "config", GENERATE_FIELDS)
            opts = from_request({**config, "json_schema": schema_of(config)})
            opts.check()
            resume = read_resume(resume_json)
            drill = read_drill(config.get("drill"), self.drills)
        except Exception as e:  # noqa: BLE001
            return error_reply(e, "bad_config")
        try:     # building the engine: a failure of no named kind is a bug (internal)
            engine, fitted = await self._prepare(messages, config, opts, drill)
        except MemoryError as e:
            return worker_oom(e)
        except Exception as e:  # noqa: BLE001
            return error_reply(e)
        if on_start is not None:
            on_start()
        self.running = request_id
        report: dict = {}
        try:
            text = await self._stream(engine, fitted.ids, opts, report, resume, drill,
                                      lambda: request_id in self.cancelled, on_chunk,
                                      self._tool_split(engine, opts, fitted.ids))
        except MemoryError as e:
            return worker_oom(e)
        except Exception as e:  # noqa: BLE001
            return error_reply(e)
        finally:
            self.running = None
        if not report:
            return cancelled_reply(text)
        return self._finish(engine, fitted, report)

    async def _unwarm(self) -> None:
        """A request came first: it prefills for itself (never two prefills on one cache)."""
        self.warm_next = None
        if self.warming is not None:
            warming, self.warming = self.warming, None
            await asyncio.gather(warming, return_exceptions=True)  # a failed warm-up: no rows

    async def measure(self, request_id: int, options_json: str, workload_text: str,
                      table_json: str | None, on_progress) -> str:
        """"Measure on this device" (page_gate.measure: the sample side by side with
        champion-only, judged by the gate's rule). `table_json`: OPFS verdicts.json's text, or
        null. Returns {"result", "verdicts", "table"} (the worker writes `table` back), or
        {"cancelled": true} after cancel(request_id) (no verdict), or an error."""
        await self._unwarm()
        self.running = request_id
        try:
            out = await page_gate.measure(self, options_json, workload_text, table_json,
                                          on_progress, lambda: request_id in self.cancelled)
        except MemoryError as e:
            return worker_oom(e)
        except Exception as e:  # noqa: BLE001 - every error becomes a typed message
            return error_reply(e)
        finally:
            self.running = None
            self.cancelled.discard(request_id)
        return json.dumps(out if out is not None else {"cancelled": True})

    async def _prepare(self, messages, config: dict, opts, drill):
        """The engine of a request's drafter and its prompt fitted to the context."""
        draft = config.get("draft") or self.default_draft
        if draft == "auto" and self.auto_choice is not None:   # the load's "auto"
            draft = self.default_draft
        if draft == "auto":    # what "auto" would choose for this engine
            draft = "model" if self.draft_model is not None and (
                self.engine is None or draft_pays(self.engine)[0]) else "ngram"
        engine = await self._engine(draft)
        # the receipt's draft.auto: the load's choice, for a request that left it to "auto"
        chose = self.auto_choice is not None and config.get("draft") in (None, "auto") \
            and draft == self.default_draft
        engine.backend.auto = self.auto_choice if chose else None
        if drill and drill[0] != "worker-oom" and getattr(engine.champion, "dev", None) is None:
            raise SessionError("bad_config", f"the {drill[0]} drill needs the WebGPU engine, "
                               f"not {engine.adapter}: load with backend webgpu")
        try:
            return engine, conversation.fit(self.tokenizer, messages, opts.max_tokens,
                                            engine.kv.max_ctx,
                                            config.get("context_overflow") or "drop_oldest",
                                            tools=opts.tools)
        except TokenizerError as e:   # malformed messages: the request's fault, not the model's
            raise SessionError("bad_config", str(e)) from e

    def _tool_split(self, engine: Engine, opts, prompt: list[int]):
        """For a tools request, a function (the output so far, its Utf16) -> the chunk's
        "tools": {"content_end", "calls": [{"id", "name", "start", "end", "closed"}]}, UTF-16
        offsets in the whole output (text/toolcalls.split); None for any other request."""
        if opts.tools is None:
            return None
        fmt, salt = toolcalls.detect(engine.tokenizer), toolcalls.salt(prompt)

        def split(full: str, units: Utf16) -> dict:
            s = toolcalls.split(full, fmt)
            return {"content_end": units.at(s.content_end), "calls": [
                {"id": toolcalls.call_id(salt, n), "name": c.name, "start": units.at(c.start),
                 "end": units.at(c.end), "closed": c.closed} for n, c in enumerate(s.calls)]}
        return split

    async def _stream(self, engine: Engine, prompt: list[int], opts, report: dict, resume,
                      drill, should_stop, on_chunk, tool_split=None) -> str:
        """Run the request, each chunk to on_chunk with UTF-16 offsets; returns its text."""
        text = full = ""
        stream = engine.stream(prompt, opts, report, resume=resume, should_stop=should_stop)
        try:
            units = None
            async for chunk in stream:
                if units is None:      # the text a resumed run showed comes first
                    units = Utf16()
                    if resume is not None:
                        full = self.tokenizer.decode(resume.ids)[:chunk.offset]
                        units.add(full)
                offset = units.at(chunk.offset)
                units.add(chunk.text)
                full += chunk.text
                marks = {"kinds": chunk.kinds, "starts": [units.at(s) for s in chunk.starts]}
                if tool_split is not None:
                    marks["tools"] = tool_split(full, units)
                on_chunk(offset, chunk.text, chunk.n_tokens, json.dumps(chunk.ids),
                         chunk.cycle, json.dumps(marks))
                text += chunk.text
                if drill and chunk.cycle >= drill[1]:
                    drill = self._strike(drill, chunk.cycle)
        finally:
            await stream.aclose()
        return text

    def _finish(self, engine: Engine, fitted, report: dict) -> str:
        """A finished request's reply; after a fault, the engine the next request gets."""
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
        keys = ("text", "tokens", "finish_reason", "stats", "receipt", "notice")
        if report.get("tool_calls") is not None:   # a tools request
            keys += ("tool_calls", "content")
        return json.dumps({k: report[k] for k in keys})

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
            return error_reply(SessionError("bad_request", "lose_device is a fault drill: load the "
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
            exhaust_memory()
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
        """The last request's stats, `memory`: the WebGPU devices alive and their buffer bytes
        (gpu.browser.live; zeros natively), for the page's leak checks, and `jinja2`: whether it
        is imported and the first render of a model's own chat template's milliseconds (None
        before one; a ChatML template never imports it)."""
        memory = {"gpu_devices": 0, "gpu_bytes": 0}
        try:
            from ..gpu import browser
            memory = browser.live()
        except ImportError:  # pragma: no cover - the browser module imports everywhere
            pass
        return json.dumps({"stats": self.last["stats"] if self.last else None,
                           "memory": memory,
                           "jinja2": {"loaded": "jinja2" in sys.modules,
                                      "first_render_ms": template.first_render_ms()}})

    def receipt(self) -> str:
        return json.dumps({"receipt": self.last["receipt"] if self.last else None})
