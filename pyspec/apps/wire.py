"""The JSON boundary between the page's worker and its Session (session.py): every request's JSON
read and checked field by field before anything runs (a malformed one is `bad_config` and
changes nothing), and every error made a value, `{"error": {"code", "message"}}`, that the worker
forwards as a typed message. The code is the exception's own (errors.py); anything else is
`internal` (a bug: the message carries the traceback). The generate fields are the options
table's (options.py REQUEST).

Not here: loading, engines and generation (session.py, page_engine.py).
"""

from __future__ import annotations

import bisect
import json
import traceback

from ..engine import Resume
from ..errors import PyspecError, error_code
from ..gpu.device import DEVICE_DRILLS
from ..options import REQUEST


class SessionError(PyspecError):
    """An error of the session itself (not_ready, a draft choice it cannot serve)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


# What each field of a request may hold; null or absent means the default. A field of another
# type is refused (bad_config) before anything runs, so a malformed request changes nothing.
LOAD_FIELDS = {"draft": str, "max_ctx": int, "backend": str, "champion_name": str,
               "draft_name": str, "draft_vocab": str, "draft_vocab_shipped": bool,
               "drills": bool, "load_faults": list, "warm": bool,
               # the adapter's buffer and binding limits lowered (tests: tables split as a
               # large model's do), {"maxBufferSize", "maxStorageBufferBindingSize"}: bytes
               "gpu_limits": dict,
               # the page's recorded gate verdicts (OPFS verdicts.json's text; docs/gate.md)
               "verdicts": str}
GENERATE_FIELDS = {o.name: o.types for o in REQUEST}


def parse_json(text: str, what: str):
    """A request's JSON value, or SessionError(bad_config) saying why not."""
    try:
        return json.loads(text)
    except (TypeError, ValueError) as e:   # not a str; not JSON; an integer too long to convert
        raise SessionError("bad_config", f"{what} is not valid JSON: {e}") from None
    except RecursionError:
        raise SessionError("bad_config", f"{what} is nested too deeply") from None


def cancelled_reply(text: str) -> str:
    """generate's reply for a request stopped before the engine reported on it."""
    return json.dumps({"text": text, "tokens": None, "finish_reason": "cancelled",
                       "stats": None, "receipt": None})


def check_fields(text: str, what: str, fields: dict) -> dict:
    """A request's JSON object whose fields are each null or of their type (`fields`: name ->
    type or tuple of types; a bool is not an int). A field it does not know is refused, never
    ignored: a misspelt option would otherwise run with the default."""
    obj = parse_json(text, what)
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


def read_load_faults(items) -> list[dict]:
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


class Utf16:
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


def read_resume(text: str) -> Resume | None:
    """A generate request's `resume`: null, or {"ids": [token id, ...], "fault": null or
    {"kind": one of RESUME_FAULTS, "cycle": int >= 0, "restart_s": number >= 0}}. The engine
    checks the ids against the vocabulary and the context."""
    obj = parse_json(text, "resume")
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


def read_drill(spec: str | None, enabled: bool) -> tuple[str, int] | None:
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


def head_rows(draft) -> int | None:
    ids = getattr(draft, "head_ids", None)
    return None if ids is None else len(ids)


def error_reply(e: BaseException, other: str = "internal") -> str:
    """The JSON error for an exception; `other` is the code for an exception of no named kind
    (bad_config while reading a request)."""
    code = error_code(e) if isinstance(e, PyspecError) else other
    message = str(e) if code != "internal" else "".join(traceback.format_exception(e))
    return json.dumps({"error": {"code": code, "message": message}})


def worker_oom(e: MemoryError) -> str:
    """The wasm heap is exhausted: nothing here can be trusted to allocate again, so the worker
    reports it fatal and client.js resumes the request on a new worker."""
    return error_reply(SessionError("worker_oom", f"the worker ran out of memory ({e})"))


def schema_of(config: dict) -> dict | None:
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


def exhaust_memory() -> None:
    """The worker-oom drill: take 256 MiB blocks (uninitialised: wasm pages are committed only
    when touched) until an allocation fails; the MemoryError propagates, the blocks are freed."""
    import numpy as np

    held = []
    for _ in range(64):   # wasm32 fails within 16 blocks (4 GiB); natively memory is overcommitted
        held.append(np.empty(256 << 20, np.uint8))
    raise MemoryError("the worker-oom drill allocated 16 GiB without a failure")
