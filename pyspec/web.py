"""The Python side of the browser worker (web/worker.js, DESIGN §8): one Session per worker.

The worker fetches the weights (OPFS, sha256-checked) and hands them here as buffers; a Session
loads the champion and an optional draft model from them, then serves requests with the same
engine.Engine, Options and Tokenizer.encode_chat that `python -m pyspec generate` uses: nothing
here decodes, drafts or verifies on its own.

The boundary with JavaScript is deliberately plain: every public method takes and returns JSON
strings (and numbers), never Python objects, so no proxy outlives a call and an error is a value,
`{"error": {"code", "message"}}`, that the worker forwards as a typed message. Codes:
  bad_model (a corrupt or unsupported GGUF), incompatible_draft (compat.check_pair refused the
  pair), prompt_too_long (engine.PromptTooLongError), bad_config (an option), not_ready (no model
  loaded), internal (a bug: the message carries the traceback).

`make_engine` is the one place that chooses the backend. Not here: downloads, OPFS, messages.
"""

from __future__ import annotations

import json
import traceback

from . import __version__
from .compat import IncompatiblePairError, check_pair
from .drafters import DraftSpecError
from .drafters.model_draft import ModelDrafter
from .engine import Engine, Options, OptionsError, PromptTooLongError
from .gguf import GGUFError, GGUFFile
from .kv import ContextOverflowError
from .model import Model, ModelError
from .schedule import ScheduleError
from .tokenizer import Tokenizer, TokenizerError

# Most context a browser session allocates by default: the champion's full 8192 positions would
# cost 30 * 8192 * 3 * 64 * 4 B * 2 = 377 MB of KV cache in wasm memory.
DEFAULT_MAX_CTX = 2048

_ERROR_CODES = (
    (IncompatiblePairError, "incompatible_draft"),
    (PromptTooLongError, "prompt_too_long"),
    (ContextOverflowError, "prompt_too_long"),
    ((GGUFError, ModelError, TokenizerError), "bad_model"),
    ((OptionsError, ScheduleError, DraftSpecError, KeyError, TypeError, ValueError), "bad_config"),
)


class SessionError(Exception):
    """An error with a code for the worker protocol."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def _error(e: BaseException) -> str:
    if isinstance(e, SessionError):
        code = e.code
    else:
        code = next((c for kinds, c in _ERROR_CODES if isinstance(e, kinds)), "internal")
    message = str(e) if code != "internal" else "".join(traceback.format_exception(e))
    return json.dumps({"error": {"code": code, "message": message}})


# --- the backend ------------------------------------------------------------------------------
def make_engine(champion: Model, tokenizer: Tokenizer, draft, max_ctx: int) -> Engine:
    """THE backend choice, in one place.

    Today: the CPU numpy engine (adapter "cpu-numpy"), in Pyodide as natively. When the GPU
    backend (pyspec/gpu/, same Engine API) and the browser device adapter land, this function
    tries WebGPU first and falls back to the CPU, recording the fallback in the receipt.
    Note: the CPU Model dequantizes every weight to float32 (about 540 MB for the champion), which
    is heavy in wasm; the real champion in the browser wants the GPU backend."""
    return Engine(champion, tokenizer, draft, max_ctx=max_ctx, adapter="cpu-numpy")


# --- the session ------------------------------------------------------------------------------
class Session:
    """Models loaded from buffers, an engine per drafter choice, the last request's result."""

    def __init__(self):
        self.champion: Model | None = None
        self.tokenizer: Tokenizer | None = None
        self.draft_model: Model | None = None
        self.max_ctx = DEFAULT_MAX_CTX
        self.engine: Engine | None = None
        self.engine_draft: str | None = None
        self.default_draft = "ngram"
        self.last: dict | None = None      # the last finished request: text, tokens, stats, receipt
        self.cancelled: set[int] = set()   # request ids asked to stop
        self.running: int | None = None

    # --- loading --------------------------------------------------------------------------
    def load(self, options_json: str, champion_buf, draft_buf=None) -> str:
        """Load the champion (and a draft model) from GGUF buffers. options: {"draft": ngram |
        none | self:L | model, "max_ctx": int, "champion_name", "draft_name"}. Returns
        {"adapter", "vocab", "context", "n_layers", "draft"} or an error."""
        try:
            opts = json.loads(options_json)
            champion = Model(GGUFFile(champion_buf, opts.get("champion_name", "champion")))
            tokenizer = Tokenizer.from_metadata(champion.metadata)
            draft_model = None
            if draft_buf is not None:
                draft_file = GGUFFile(draft_buf, opts.get("draft_name", "draft"))
                check_pair(champion.metadata, draft_file.metadata).raise_if_bad()
                draft_model = Model(draft_file)
            self.champion, self.tokenizer, self.draft_model = champion, tokenizer, draft_model
            self.max_ctx = min(int(opts.get("max_ctx") or DEFAULT_MAX_CTX),
                               champion.config.context_length)
            self.default_draft = opts.get("draft") or ("model" if draft_model else "ngram")
            self.engine = None
            engine = self._engine(self.default_draft)
            return json.dumps({"adapter": engine.adapter, "pyspec_version": __version__,
                               "vocab": champion.config.vocab_size, "context": self.max_ctx,
                               "n_layers": champion.config.n_layers,
                               "draft": self.default_draft,
                               "weight_bytes": engine.champion.weight_bytes})
        except Exception as e:  # noqa: BLE001 - every error becomes a typed message
            return _error(e)

    def _engine(self, draft: str) -> Engine:
        """The engine for a drafter choice; rebuilt (with a fresh cache) when the choice changes."""
        if self.champion is None:
            raise SessionError("not_ready", "no model is loaded: send init first")
        if self.engine is None or self.engine_draft != draft:
            spec = draft
            if draft == "model":
                if self.draft_model is None:
                    raise SessionError("bad_config", "draft 'model' needs a draft model at init")
                spec = ModelDrafter(self.draft_model, self.max_ctx)
            self.engine = make_engine(self.champion, self.tokenizer, spec, self.max_ctx)
            self.engine_draft = draft
        return self.engine

    # --- generation -----------------------------------------------------------------------
    async def generate(self, request_id: int, messages_json: str, config_json: str,
                       on_chunk) -> str:
        """Stream one request. `on_chunk(offset, text, n_tokens)` is called once per cycle that
        commits text. config: {max_tokens, temperature, seed, verify, k, draft}. Returns
        {"text", "tokens", "finish_reason", "stats", "receipt"}, or the same with
        finish_reason "cancelled" and no stats when cancel() stopped it, or an error."""
        try:
            messages = json.loads(messages_json)
            config = json.loads(config_json)
            engine = self._engine(config.get("draft") or self.default_draft)
            opts = Options(max_tokens=int(config.get("max_tokens", 128)),
                           temperature=float(config.get("temperature", 0.0)),
                           seed=int(config.get("seed", 0)), verify=config.get("verify") or None,
                           k=config.get("k") or "heuristic")
            prompt = self.tokenizer.encode_chat(messages)
        except Exception as e:  # noqa: BLE001
            return _error(e)
        self.running = request_id
        report: dict = {}
        text = ""
        try:
            stream = engine.stream(prompt, opts, report)
            try:
                async for chunk in stream:
                    on_chunk(chunk.offset, chunk.text, chunk.n_tokens)
                    text += chunk.text
                    # Why here: the engine yields once per cycle that commits text, so a cancel
                    # is seen within one cycle. (An engine-level stop hook would also catch
                    # cycles that commit no text, and fill the stats of a cancelled request.)
                    if request_id in self.cancelled:
                        break
            finally:
                await stream.aclose()
        except Exception as e:  # noqa: BLE001
            return _error(e)
        finally:
            self.running = None
            self.cancelled.discard(request_id)
        if not report:
            return json.dumps({"text": text, "tokens": None, "finish_reason": "cancelled",
                               "stats": None, "receipt": None})
        self.last = report
        return json.dumps({k: report[k] for k in ("text", "tokens", "finish_reason", "stats",
                                                  "receipt")})

    def cancel(self, request_id: int) -> str:
        """Ask a running request to stop after its current cycle."""
        if self.running == request_id:
            self.cancelled.add(request_id)
            return json.dumps({"cancelled": True})
        return json.dumps({"cancelled": False})

    def stats(self) -> str:
        return json.dumps({"stats": self.last["stats"] if self.last else None})

    def receipt(self) -> str:
        return json.dumps({"receipt": self.last["receipt"] if self.last else None})
