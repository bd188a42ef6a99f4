"""Privacy-safe run receipts.

A receipt says what ran and how it went: artifact, tokenizer and template hashes, the policy and
its version, the seed, the k schedule, acceptance by position, call counts, timings, peak bytes,
faults and fallbacks. It never holds prompt or output text, their token ids, file paths or
anything else about the user; `check` enforces the shape and tests/test_receipts.py checks the
public workload against it.

The adapter is named by a coarse class (ADAPTER_CLASSES: the vendor family of a hardware GPU,
"software" for a fallback adapter, "cpu-numpy" for the numpy engine), never by its description:
a description (exact GPU model, driver and LLVM versions) would help fingerprint the user. The
stats a run reports locally keep the description; only the receipt is coarse.
"""

from __future__ import annotations

import re

from . import __version__
from .verdicts import VERDICTS

SCHEMA = "pyspec.receipt/1"
POLICY_VERSION = 2   # 2: the n-gram drafter is scored by previews instead of probes

# Every value a receipt's `adapter` fields may hold.
ADAPTER_CLASSES = ("gpu:nvidia", "gpu:amd", "gpu:intel", "gpu:apple", "gpu:other", "software",
                   "cpu-numpy")
_FAMILIES = ("nvidia", "amd", "intel", "apple")
# PCI vendor ids of the families (what wgpu-py reports natively as `vendor_id`).
_PCI_VENDORS = {0x10DE: "nvidia", 0x1002: "amd", 0x1022: "amd", 0x8086: "intel", 0x106B: "apple"}


def adapter_class(vendor: str | int | None, software: bool) -> str:
    """The receipt's class of a WebGPU adapter: "software" for a fallback (CPU) adapter such as
    SwiftShader or lavapipe, else "gpu:" + the vendor family, from a WebGPU vendor name
    (GPUAdapterInfo.vendor: "nvidia", "amd", ...) or a PCI vendor id; "gpu:other" for the rest."""
    if software:
        return "software"
    name = _PCI_VENDORS.get(vendor, "") if isinstance(vendor, int) else str(vendor or "").lower()
    return "gpu:" + next((family for family in _FAMILIES if family in name), "other")


# Exactly the stats keys a receipt may copy (no text, no ids, no paths); `adapter` becomes the
# engine's adapter class.
_STATS_KEYS = ("adapter", "generated_tokens", "finish_reason", "champion_passes", "draft_calls",
               "drafted", "accepted", "acceptance_rate", "tokens_per_pass",
               "drafted_by_position", "accepted_by_position", "schedule", "tokens_per_s",
               "ttft_s", "prefill_s", "draft_s", "verify_s", "wall_s", "peak_bytes",
               "resumed_tokens", "forced_tokens")


def build(engine, opts, mode: str, stats: dict, drafter) -> dict:
    """The receipt of a request `engine` ran with `opts` under verify `mode`, drafted by
    `drafter` (its draft source: a combination, a schema's forced drafts, ...)."""
    draft_kind = getattr(drafter, "kind", "custom") if drafter else "none"
    if draft_kind not in DRAFT_KINDS:   # a drafter of the caller's own, whatever it calls itself
        draft_kind = "custom"
    # a combination (drafters/combo.py): n-gram and its draft model, whose weights are named
    # (a draft model's `model`, an EAGLE-style head's `head`)
    inner = drafter.model if draft_kind == "combo" else drafter
    model = getattr(inner, "model", None) or getattr(inner, "head", None)
    receipt = {
        "schema": SCHEMA,
        "pyspec_version": __version__,
        "champion_sha256": engine.champion.sha256(),
        "draft": {"kind": draft_kind,
                  "layers": getattr(drafter, "layers", None),
                  "sha256": (model.sha256() if draft_kind in ("model", "combo", "eagle")
                             else None),
                  # another vocabulary: {"kind": "idmap" | "tli", "shared_tokens",
                  # "champion_vocab", "share", "outside_stops"} (drafters/bridge.py)
                  "bridge": getattr(drafter, "bridge_stats", None),
                  # the request's draft was "auto": {"verdict", "verdict_sha256"} of the gate
                  # verdict that chose the drafter (verdicts.py), both null where today's rule
                  # did; null when the request named its drafter
                  "auto": _auto(engine.backend)},
        "tokenizer_hash": engine.tokenizer.fingerprint(),
        "template_hash": engine.tokenizer.template_hash(),
        # tree: the request's --tree (widths per depth "2,2,1", "auto"), null for chains
        "policy": {"name": stats["schedule"]["policy"], "version": POLICY_VERSION,
                   "tree": opts.tree or None},
        "verify": mode,
        "temperature": opts.temperature,
        "seed": opts.seed,
        "max_tokens": opts.max_tokens,
        # the sampling controls (processors.py); logit_bias and stop as counts: a receipt
        # carries no user text
        "sampling": {"top_k": opts.top_k, "top_p": opts.top_p, "min_p": opts.min_p,
                     "repetition_penalty": opts.repetition_penalty,
                     "presence_penalty": opts.presence_penalty,
                     "frequency_penalty": opts.frequency_penalty,
                     "logit_bias": len(opts.logit_bias), "stop": len(opts.stop)},
        "stats": {**{k: stats[k] for k in _STATS_KEYS}, "adapter": engine.adapter_class},
        # e.g. [{"kind": "device_lost", "at_token": 17, "cycle": 6, "recovery_s": 0.8,
        # "adapter": "gpu:nvidia"}]: faults this request recovered from (a GPU fault through
        # Engine's recover; a dead worker through a Resume, kind "worker_died"), with the count
        # of tokens committed before it, the cycle, the seconds until decoding went on, and
        # the class of the adapter that failed. stats.resumed_tokens > 0: it went on from the
        # committed tokens of an interrupted run.
        "faults": list(engine.faults),
        # e.g. [{"kind": "no_webgpu", "adapter": "cpu-numpy"}]: set by web.make_engine when the
        # browser's WebGPU was not usable (codes only: a receipt carries no free text).
        "fallbacks": list(engine.fallbacks),
    }
    validate(receipt)
    return receipt


def leaves(node, key=None):
    """Yield (key, value) for every leaf of a JSON tree (list items carry their list's key)."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from leaves(v, k)
    elif isinstance(node, list):
        for v in node:
            yield from leaves(v, key)
    else:
        yield key, node


def _scan(node, key, names: set, strings: list, floats: list, negatives: list) -> None:
    """One walk of a JSON tree for validate and check: every object key into `names`, every
    string leaf as (key, value) into `strings`, every float into `floats`, every negative int
    as (key, value) into `negatives` (a plain recursion: generators over the tree cost a
    millisecond a receipt, a tenth of a tiny model's request)."""
    if isinstance(node, dict):
        for k, v in node.items():
            names.add(k)
            _scan(v, k, names, strings, floats, negatives)
    elif isinstance(node, list):
        for v in node:
            _scan(v, key, names, strings, floats, negatives)
    elif isinstance(node, str):
        strings.append((key, node))
    elif isinstance(node, float):
        floats.append(node)
    elif isinstance(node, int) and not isinstance(node, bool) and node < 0:
        negatives.append((key, node))


def string_fields(node):
    """(key, value) for every string leaf of a JSON tree."""
    return ((k, v) for k, v in leaves(node) if isinstance(v, str))


# The fields a receipt has (build, then conversation.Fitted.annotate's context): any other is
# refused, so that a field carrying token ids or text cannot pass as a receipt's. Every one but
# `context` (there only when turns were left out) is in every receipt build makes.
_FIELDS = {"schema", "pyspec_version", "champion_sha256", "draft", "tokenizer_hash",
           "template_hash", "policy", "verify", "temperature", "seed", "max_tokens", "sampling",
           "stats", "faults", "fallbacks", "context"}
_REQUIRED = _FIELDS - {"context"}
# draft.kind: "none", a drafter's kind (drafters/, gpu/backend.py), "forced" (a schema request
# with no drafter: drafters/forced.py) or "custom" (a drafter of the caller's own).
DRAFT_KINDS = ("none", "ngram", "self", "model", "combo", "eagle", "forced", "custom")
# sampling: the controls as Options names them; logit_bias and stop as counts.
_SAMPLING_KEYS = ("top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                  "frequency_penalty", "logit_bias", "stop")


def validate(receipt) -> None:
    """Refuse what is not a receipt: a field a receipt does not have (token ids, text), a
    number that is not finite, a sha256 that is not one, settings out of their range, and what
    `check` refuses. `pyspec receipt` runs it on a file; build on every receipt it makes."""
    if not isinstance(receipt, dict) or receipt.get("schema") != SCHEMA:
        raise ValueError(f"a receipt is a JSON object with \"schema\": \"{SCHEMA}\"")
    names, strings, numbers, negatives = set(receipt), [], [], []
    for k, v in receipt.items():   # (the penalties in sampling may be negative)
        _scan(v, k, names, strings, numbers, negatives if k != "sampling" else [])
    _check(names, strings)
    unknown = sorted(set(receipt) - _FIELDS)
    if unknown:
        raise ValueError(f"receipt field {unknown[0]!r} is not a receipt's (they are "
                         f"{', '.join(sorted(_FIELDS))})")
    missing = sorted(_REQUIRED - set(receipt))
    if missing:
        raise ValueError(f"a receipt needs {', '.join(missing)}")
    sha = receipt["champion_sha256"]
    if not (isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)):
        raise ValueError("champion_sha256 must be 64 lowercase hex digits")
    stats = receipt["stats"]
    if not isinstance(stats, dict) or not set(stats) <= set(_STATS_KEYS):
        extra = sorted(set(stats) - set(_STATS_KEYS)) if isinstance(stats, dict) else []
        raise ValueError(f"receipt stats must be an object of {', '.join(_STATS_KEYS)}"
                         + (f"; {extra[0]!r} is not one" if extra else ""))
    if any(n != n or n in (float("inf"), float("-inf")) for n in numbers):
        raise ValueError("a receipt's numbers are finite")
    t, m = receipt["temperature"], receipt["max_tokens"]
    if isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0:
        raise ValueError(f"temperature must be a number >= 0, got {t!r}")
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ValueError(f"max_tokens must be a positive integer, got {m!r}")
    _check_settings(receipt)
    draft = receipt["draft"]
    if not isinstance(draft, dict) or draft.get("kind") not in DRAFT_KINDS:
        kind = draft.get("kind") if isinstance(draft, dict) else draft
        raise ValueError(f"draft.kind must be one of {', '.join(DRAFT_KINDS)}, got {kind!r}")
    _check_auto(draft.get("auto"))
    # Its integers are counts, sizes and positions, never negative (the penalties, which may be,
    # are checked above). Times are not held to it: a GPU cycle's share of its draft and verify
    # is an estimate (gpu/backend.py), and build must never refuse a request's own receipt.
    if negatives:
        key, value = negatives[0]
        raise ValueError(f"receipt field {key!r} is {value}; counts and sizes are never "
                         "negative")


def _auto(backend) -> dict | None:
    """draft.auto from the executor's `auto` (load.backend: a verdicts.Choice where the request
    left its drafter to "auto", else None)."""
    choice = getattr(backend, "auto", None)
    return choice.receipt() if choice is not None else None


def _check_auto(auto) -> None:
    """draft.auto: null, or the gate verdict that chose the drafter ({"verdict",
    "verdict_sha256"}: one of VERDICTS and a sha256, or both null for today's rule)."""
    if auto is None:
        return
    sha = auto.get("verdict_sha256") if isinstance(auto, dict) else None
    if (not isinstance(auto, dict) or set(auto) != {"verdict", "verdict_sha256"}
            or (auto["verdict"] is None) != (sha is None)
            or auto["verdict"] not in (None, *VERDICTS)
            or sha is not None and not _SHA256.fullmatch(str(sha))):
        raise ValueError("draft.auto must be null or {\"verdict\": one of "
                         f"{VERDICTS} or null, \"verdict_sha256\": its sha256 or null}}")


_SHA256 = re.compile(r"[0-9a-f]{64}")
_TREE = re.compile(r"auto|[0-9]{1,3}(,[0-9]{1,3}){0,15}")   # a --tree shape, never text


def _check_settings(receipt: dict) -> None:
    """verify, seed and the sampling controls, by the rules a request's options are checked by
    (processors.Sampling.check for the controls), and verify as the mode those settings ran."""
    from .rules.processors import Sampling, SamplingError

    sampling = receipt["sampling"]
    if not isinstance(sampling, dict) or set(sampling) != set(_SAMPLING_KEYS):
        raise ValueError(f"receipt sampling must be an object of {', '.join(_SAMPLING_KEYS)}")
    for key in ("logit_bias", "stop"):
        n = sampling[key]
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"sampling.{key} is a count >= 0, got {n!r}")
    try:
        Sampling(**{k: sampling[k] for k in _SAMPLING_KEYS[:6]}).check()
    except SamplingError as e:
        raise ValueError(str(e)) from None
    seed = receipt["seed"]
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 1 << 64:
        raise ValueError(f"seed must be an integer in [0, 2^64), got {seed!r}")
    # T = 0 always runs greedy (engine.Options.resolved_verify); above it, replay or rejection
    ran = ("greedy",) if receipt["temperature"] == 0 else ("replay", "rejection")
    if receipt["verify"] not in ran:
        raise ValueError(f"verify {receipt['verify']!r} is not a mode temperature "
                         f"{receipt['temperature']} runs ({' or '.join(ran)}): a receipt "
                         "records the mode that ran")


_KEY = re.compile(r"[a-z0-9_]+")


def check(receipt: dict) -> None:
    """Refuse a receipt that has grown a string field that could carry user text, a key that is
    not a plain name (a key can carry a path as well as a value can), or whose adapter is named
    by anything but its class."""
    names, strings = set(), []
    _scan(receipt, None, names, strings, [], [])
    _check(names, strings)


def _check(names: set, strings: list) -> None:
    for key in names:
        # (int keys: k_histogram's K, which JSON writes as digits)
        if not (isinstance(key, int) and not isinstance(key, bool)
                or isinstance(key, str) and _KEY.fullmatch(key)):
            raise ValueError(f"receipt key {key!r} is not a field name (lower-case letters, "
                             "digits, _); receipts carry no names or paths")
    allowed_strings = {"schema", "pyspec_version", "champion_sha256", "sha256", "kind",
                       "tokenizer_hash", "template_hash", "name", "verify", "adapter",
                       "finish_reason", "policy", "verdict", "verdict_sha256", "tree"}
    for key, value in strings:
        if key not in allowed_strings:
            raise ValueError(f"receipt field {key!r} holds a string; receipts carry no text")
        if key == "tree" and not _TREE.fullmatch(value):
            raise ValueError(f"receipt tree {value!r} is not a tree shape (auto or W1,W2,...)")
        if key == "adapter" and value not in ADAPTER_CLASSES:
            raise ValueError(f"receipt adapter {value!r} is not one of {ADAPTER_CLASSES}; "
                             "receipts name an adapter's class, never its description")
