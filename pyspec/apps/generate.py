"""The commands that generate: generate (one prompt) and chat (a conversation on stdin), and how
they print a stream and its stats.

Not here: the request's flags and prompt (request.py), the parser (cli.py), the side-by-side demo
(demo.py).
"""

from __future__ import annotations

import asyncio
import json
import sys

from .. import champion_path
from ..cpu.executor import CPUBackend
from ..cpu.model import Model
from ..drafters import parse_draft
from ..engine import Engine
from ..errors import PyspecError, UsageError
from ..load import backend, load_champion
from ..options import Options
from ..text import conversation
from ..text.conversation import Fitted
from .request import cli_error, options, prompt_ids, read_messages, utf8
from .verdict_table import notice

# --- commands -------------------------------------------------------------------------------
def make_engine(args) -> Engine:
    if args.ctx is not None and args.ctx < 1:
        raise UsageError(f"--ctx must be a positive number of positions, got {args.ctx}")
    if args.draft != "auto":
        parse_draft(args.draft)   # its spelling, before the model loads (self:L's L: after)
    champion, tok = load_champion(args.champion, args.backend, args.ctx)
    recover = None
    if args.backend == "wgpu":  # a lost device finishes the request on the CPU, champion-only
        def recover():
            return CPUBackend(Model.load(args.champion or champion_path()), None, args.ctx)
    return Engine(backend(champion, args.draft, args.ctx), tok, recover=recover)


FAULT_NOTES = {
    "bad_draft": "the draft model's logits were NaN or +inf (its weights may be corrupt), so the "
                 "request went on champion-only without it: check or download the draft again, "
                 "or use --draft ngram or none",
}


def verdict_note(engine: Engine) -> None:
    """A note on stderr naming the recorded gate verdict that chose the drafter of "auto"
    (verdict_table.notice), before any text: what it measured and how to clear it."""
    text = notice(getattr(engine.backend, "auto", None))
    if text:
        print(f"note: {text}", file=sys.stderr)


def fault_notes(receipt: dict) -> None:
    """A note on stderr for each fault the request recovered from (the receipt's faults)."""
    for fault in receipt.get("faults", []):
        text = FAULT_NOTES.get(fault["kind"], f"the GPU failed ({fault['kind']}); the request "
                                              "finished on the CPU engine")
        print(f"note: {text}", file=sys.stderr)


def cmd_generate(args) -> int:
    # The flags and files a user typed, checked before the model loads (a second or more):
    # only what needs the model (a --logit-bias id past the vocabulary, the prompt's length)
    # waits for it.
    opts = options(args)
    opts.check()
    if args.messages_json:
        read_messages(args.messages_json)
    engine = make_engine(args)
    verdict_note(engine)
    ids = prompt_ids(engine.tokenizer, args, engine.kv.max_ctx,
                     engine.champion.config.context_length, opts.tools)
    fitted = ids if isinstance(ids, Fitted) else Fitted(ids)
    if fitted.notice():
        print(f"note: {fitted.notice()}", file=sys.stderr)
    short = draft_context(engine)
    if short is not None and short < len(fitted.ids) + args.max_tokens:
        print(f"note: the draft's context is {short} positions: past position {short} the "
              "champion decodes alone", file=sys.stderr)
    if args.json:
        r = engine.generate(fitted.ids, opts)
        report = {"text": r.text, "tokens": r.tokens, "finish_reason": r.finish_reason,
                  "stats": r.stats, "receipt": r.receipt}
        fitted.annotate(report)
        keys = ["text", "tokens", "finish_reason", "stats", "receipt"]
        if opts.tools is not None:   # a tools request: its calls and the content before them
            report.update(tool_calls=r.tool_calls, content=r.content)
            keys[1:1] = ["content", "tool_calls"]
        print(json.dumps({k: report[k] for k in keys}))
        fault_notes(r.receipt)
        return 0
    report = stream_to_stdout(engine, fitted.ids, opts)
    fault_notes(report["receipt"])
    print_calls(report)
    print_stats(report["stats"])
    return 0


def print_calls(report: dict) -> None:
    """A tools request's calls on stderr, one a line (the text above shows them as written)."""
    for call in report.get("tool_calls") or ():
        print(f"tool call {call['id']}: {call['function']['name']} "
              f"{call['function']['arguments']}", file=sys.stderr)


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


CHAT_HELP = ("commands: /reset (forget the conversation), /system TEXT, /tool RESULT (the "
             "result of the oldest call not yet answered, with --tools), /stats, /quit")


def cmd_chat(args) -> int:
    """An interactive chat on stdin: each line is a user message, the reply streams to stdout.
    The engine's conversation cache prefills only each turn's new tokens. With --tools a reply
    may call tools: the calls are listed, each `/tool RESULT` line answers the oldest one not yet
    answered, and once all are the model goes on. A refused line (a
    message that does not fit, an unknown command) does not end the chat; on piped input it
    makes the exit status 2, so a script learns that some of its lines got no reply."""
    # Why: the engine checks options at each request; a chat checks them before its first line
    # (and before the model loads, but for the ids of --logit-bias, which need its vocabulary),
    # so that a bad option ends it at once and never after the user has typed a message.
    opts, last, refused = options(args), None, 0
    opts.check()
    engine = make_engine(args)
    verdict_note(engine)
    tok = engine.tokenizer
    if tok.chat_template is None:
        raise UsageError("chat needs a model with a chat template, and this one has none; "
                         "use generate --raw --prompt TEXT for plain text")
    system = [{"role": "system", "content": args.system}] if args.system else []
    history: list[dict] = []
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
        elif command == "/tool":
            waiting = unanswered(history)
            if not waiting:
                print("error: /tool answers a tool call, and none is waiting", file=sys.stderr)
                refused += 1
                continue
            history.append({"role": "tool", "tool_call_id": waiting[0], "content": rest})
            if len(waiting) == 1:    # every call answered: the model goes on
                stats, history, ok = chat_turn(engine, args, opts, system, history, [])
                last, refused = stats or last, refused + (not ok)
        elif line.startswith("/"):
            print(f"error: unknown command {command}; {CHAT_HELP}", file=sys.stderr)
            refused += 1
        elif not utf8(line):
            print("error: this line is not valid UTF-8 text; it got no reply", file=sys.stderr)
            refused += 1
        elif line.strip():
            stats, history, ok = chat_turn(engine, args, opts, system, history,
                                           [{"role": "user", "content": line}])
            last, refused = stats or last, refused + (not ok)
    if refused and not interactive:
        print(f"error: {refused} line{'s' * (refused > 1)} of the input got no reply",
              file=sys.stderr)
        return 2
    return 0


def chat_turn(engine: Engine, args, opts: Options, system: list, history: list,
              new: list) -> tuple[dict | None, list, bool]:
    """One reply of the chat to history + `new`: (its stats, the history after it, whether it
    ran). A reply that calls tools goes into the history with its calls, which are listed."""
    try:
        fitted = conversation.fit(engine.tokenizer, system + history + new, opts.max_tokens,
                                  engine.kv.max_ctx, args.context_overflow,
                                  engine.champion.config.context_length, opts.tools)
    except PyspecError as e:       # this turn is refused; the conversation goes on
        print(f"error: {cli_error(e)}", file=sys.stderr)
        return None, history, False
    if fitted.notice():
        print(f"({fitted.notice()})", file=sys.stderr)
        # the dropped turns leave the history too, so later turns keep one prefix
        history = history[fitted.dropped_messages:]
    report = stream_to_stdout(engine, fitted.ids, opts)
    fault_notes(report["receipt"])
    reply = {"role": "assistant", "content": report["text"]}
    if report.get("tool_calls"):
        reply = {"role": "assistant", "content": report["content"],
                 "tool_calls": report["tool_calls"]}
        print_calls(report)
        print("(answer each call with /tool RESULT)", file=sys.stderr)
    if args.stats:
        print_stats(report["stats"])
    return report["stats"], history + new + [reply], True


def unanswered(history: list[dict]) -> list[str]:
    """The ids of the last reply's calls that no tool message has answered yet, in order."""
    last = next((m for m in reversed(history) if m["role"] == "assistant"), None)
    if last is None or not last.get("tool_calls"):
        return []
    answered = {m.get("tool_call_id") for m in history if m["role"] == "tool"}
    return [c["id"] for c in last["tool_calls"] if c["id"] not in answered]


def stream_to_stdout(engine: Engine, ids: list[int], opts: Options) -> dict:
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
