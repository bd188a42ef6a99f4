"""The commands that look rather than generate: tokenize, detokenize, score (teacher-forced
logits of a continuation), check-pair (may this draft serve this champion) and receipt.

Not here: generation (generate.py), the parser (cli.py).
"""

from __future__ import annotations

import json
import os

import numpy as np

from .. import champion_path, receipts
from ..cpu.model import Config, Model, ModelError
from ..drafters import parse_draft
from ..drafters.eagle import binding_problem, is_eagle
from ..drafters.pairing import IncompatiblePairError, bind_borrowed, check_pair
from ..errors import UsageError, path_problem
from ..formats.gguf import GGUFFile
from ..load import check_tensors, load_champion, reduced_head_ids, vocab_sidecar
from ..rules.verify import log_softmax
from ..text.tokenizer import Tokenizer
from .request import prompt_ids, read_json, utf8


def cmd_tokenize(args) -> int:
    tok = Tokenizer.from_metadata(GGUFFile.open(args.model or champion_path()).metadata)
    if args.text is not None:
        if not utf8(args.text):   # Python hands argv bytes that are not UTF-8 over as surrogates
            raise UsageError("--text is not valid UTF-8 text; pass UTF-8, or put the text in a "
                             "--jsonl file")
        print(json.dumps(tok.encode(args.text, special=args.special)))
        return 0
    try:
        with open(args.jsonl, "rb") as f:
            lines = f.read().removeprefix(b"\xef\xbb\xbf").splitlines()  # (a byte-order mark)
    except OSError as e:
        raise UsageError(path_problem(args.jsonl, e)) from e
    for n, raw in enumerate(lines, 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UsageError(f"{args.jsonl} line {n} is not valid UTF-8 (byte {e.start + 1} of "
                             "the line); save the file as UTF-8") from None
        if not line.strip():
            continue
        try:
            text = json.loads(line)["text"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise UsageError(f"{args.jsonl} line {n}: expected {{\"text\": ...}}") from e
        if not isinstance(text, str):
            raise UsageError(f"{args.jsonl} line {n}: \"text\" must be a string")
        if not utf8(text):   # JSON's \ud800 to \udfff escapes, one alone
            raise UsageError(f"{args.jsonl} line {n}: \"text\" holds a lone surrogate escape "
                             "(\\ud800 to \\udfff without its pair), which is no character; "
                             "remove it or write the character it was part of")
        print(json.dumps(tok.encode(text, special=args.special)))
    return 0


def token_ids(text: str, flag: str) -> list[int]:
    """A flag's JSON list of integer token ids, or a UsageError that says what is wanted."""
    try:
        ids = json.loads(text)
    except (ValueError, RecursionError):
        ids = None
    if not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise UsageError(f"{flag} must be a JSON list of integer token ids, e.g. [19, 2]")
    if not ids:
        raise UsageError(f"{flag} is empty")
    return ids


def cmd_detokenize(args) -> int:
    """The text of token ids (tokenize's inverse), as a JSON string."""
    tok = Tokenizer.from_metadata(GGUFFile.open(args.model or champion_path()).metadata)
    ids = token_ids(args.ids, "--ids")
    bad = [t for t in ids if not 0 <= t < tok.vocab_size]
    if bad:
        raise UsageError(f"--ids {bad[:5]} are outside the vocabulary [0, {tok.vocab_size})")
    print(json.dumps(tok.decode(ids, special=args.special), ensure_ascii=False))
    return 0


def cmd_score(args) -> int:
    champion, tok = load_champion(args.champion)
    ids = prompt_ids(tok, args)
    continuation = token_ids(args.continuation_ids, "--continuation-ids")
    if not ids:
        # Why: the logits predicting continuation[0] come from the last prompt row; with no
        # prompt there is none, and the slice below would silently misalign every position.
        raise UsageError("the prompt is empty; scoring needs at least one prompt token")
    vocab = champion.config.vocab_size
    bad = [t for t in continuation if not 0 <= t < vocab]
    if bad:
        raise UsageError(f"--continuation-ids {bad[:5]} are outside the vocabulary [0, {vocab})")
    if args.top < 0:
        raise UsageError(f"--top must be >= 0, got {args.top}")
    print(json.dumps({"positions": score(champion, ids, continuation, args.top)}))
    return 0


def score(model: Model, prompt: list[int], continuation: list[int], top: int) -> list[dict]:
    """Teacher-forced: the logits predicting each continuation token, from one batched pass."""
    seq = prompt + continuation
    if len(seq) - 1 > model.config.context_length:
        raise UsageError(f"prompt + continuation are {len(seq)} tokens; the model's context holds "
                       f"{model.config.context_length}")
    kv = model.new_cache(len(seq))
    # Only the rows that predict continuation tokens go through the head.
    logits = model.forward(seq[:-1], kv, logits_from=len(prompt) - 1)   # (len(continuation), vocab)
    logprobs = log_softmax(logits)                                        # (len(continuation), vocab)
    out = []
    for row, lp, token in zip(logits, logprobs, continuation):
        best = np.argsort(-row, kind="stable")[:top]
        out.append({"argmax": int(np.argmax(row)),
                    "top": [[int(i), float(row[i])] for i in best],
                    "logprob": float(lp[token])})
    return out


def cmd_check_pair(args) -> int:
    notes = []
    if args.draft == "auto":   # generate's default: the trained draft on a GPU, else ngram
        notes.append("--draft auto drafts with this model on a GPU and with ngram on the numpy "
                     "engine and CPU adapters (load.default_draft)")
    spec = parse_draft("trained" if args.draft == "auto" else args.draft)
    draft = spec.path
    if draft is None and spec.kind in ("model", "combo"):
        raise UsageError(f"--draft {args.draft}: `model` names the draft model given to the page "
                         "at init; give check-pair its path (a .gguf file, or model:PATH) or "
                         "trained")
    if draft is None:
        raise UsageError(f"--draft {args.draft} needs no draft model, so there is no pair to "
                         "check: check-pair checks a draft model's GGUF (a path, or trained)")
    champion_file, draft_file = GGUFFile.open(args.champion or champion_path()), GGUFFile.open(draft)
    report = check_pair(champion_file.metadata, draft_file.metadata)
    report.notes += notes
    if report.ok and is_eagle(draft_file.metadata):   # a head is bound to one champion file
        problem = binding_problem(draft_file.metadata, champion_file.metadata,
                                  champion_file.sha256())
        if problem:
            report.ok, report.reasons = False, [problem]
        else:
            report.notes.append("an EAGLE-style head over this champion's states (the numpy "
                                "engine runs it: --backend cpu)")
    if report.ok and draft_file.borrowed:   # tensors read from the champion: the same bytes?
        try:
            names = bind_borrowed(draft_file, champion_file)
        except IncompatiblePairError as e:
            report.ok, report.reasons = False, [str(e)]
        else:
            report.notes.append(f"borrows {', '.join(names)} from this champion (the same "
                                "bytes, checked by sha256)")
    if report.ok and not is_eagle(draft_file.metadata):   # the tensors generate would load
        try:
            check_tensors(draft_file)
        except ModelError as e:
            report.ok, report.reasons = False, [str(e)]
    if report.ok and report.bridge is None and os.path.exists(vocab_sidecar(draft)):
        try:   # what the numpy engine will load with it (load.reduced_head_ids)
            ids = reduced_head_ids(draft, Config.from_metadata(draft_file.metadata).vocab_size)
        except ModelError as e:
            report.ok, report.reasons = False, [str(e)]
        else:
            report.notes.append(f"the numpy engine runs its head cut to the {len(ids):,} ids "
                                f"{os.path.basename(vocab_sidecar(draft))} ranks first")
    if report.ok:
        report.notes += pair_warnings(champion_file, draft_file, report)
    if args.json:
        print(json.dumps(report.to_json()))
    else:
        print(report.describe())   # the class (compat.py) and what it implies
        for note in report.notes:
            print("  " + note)
    return 0 if report.ok else 1


# Below this share of the champion's vocabulary a bridged draft can rarely propose its token.
LOW_SHARE = 0.05


def pair_warnings(champion_file: GGUFFile, draft_file: GGUFFile, report) -> list[str]:
    """Notes for a pair that is compatible but cannot pay: a draft as large as the champion
    costs a champion pass per draft token, and a draft that shares few of the champion's tokens
    proposes little it can accept."""
    notes = []
    if not is_eagle(draft_file.metadata):
        champ = Config.from_metadata(champion_file.metadata)
        drf = Config.from_metadata(draft_file.metadata)
        if drf.n_layers * drf.d_model >= champ.n_layers * champ.d_model:
            notes.append(f"the draft is as large as the champion ({drf.n_layers} layers of "
                         f"{drf.d_model} against {champ.n_layers} of {champ.d_model}): each "
                         "draft token costs about a champion pass, so it cannot make decoding "
                         "faster")
    if report.bridge is not None and report.bridge.share < LOW_SHARE:
        notes.append(f"only {100 * report.bridge.share:.1f}% of the champion's tokens are shared: "
                     "the draft can propose few of them, so expect acceptance near 0")
    return notes


def cmd_receipt(args) -> int:
    """Validate a receipt (a file of one, or of `generate --json`'s output) and print it."""
    data = read_json(args.file, "a receipt")
    if isinstance(data, dict) and "schema" not in data and isinstance(data.get("receipt"), dict):
        data = data["receipt"]              # the output of generate --json
    if not isinstance(data, dict) or data.get("schema") != receipts.SCHEMA:
        raise UsageError(f"{args.file} is not a pyspec receipt: a receipt is a JSON object with "
                         f"\"schema\": \"{receipts.SCHEMA}\"")
    try:
        receipts.validate(data)
    except ValueError as e:
        raise UsageError(f"{args.file} is not a valid receipt: {e}") from None
    if args.json:
        print(json.dumps(data))
    else:
        for key, value in _flatten(data):
            print(f"{key}: {value}")
    return 0


def _flatten(node: dict, prefix: str = ""):
    """(dotted key, text) for each leaf of nested objects; a value that is not a string is
    written as JSON (lists on one line, null, true)."""
    for key, value in node.items():
        if isinstance(value, dict) and value:
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield prefix + key, value if isinstance(value, str) else json.dumps(value)
