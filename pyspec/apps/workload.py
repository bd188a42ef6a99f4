"""A benchmark's workload: JSONL lines of {id, stratum, messages[, max_tokens]} (the
workloads/ format), each checked before anything runs, and the first prompts of each
stratum. Used by the benchmarks (bench.py, webtools/bench.py) and the measuring scripts.

Not here: running a prompt (engine.py).
"""

from __future__ import annotations

import json
import os

from ..errors import PyspecError, UsageError, path_problem
from ..options import Options


# The preregistered public workload, in the repository (workloads/README.md): what `gate`, `bench`
# and the page's "measure on this device" run by default. Measure on it; never train on it.
PUBLIC_WORKLOAD = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "workloads", "public.jsonl")


class WorkloadError(UsageError):
    """A workload (a file, or the page's sample) that is not JSONL lines of prompts, or holds
    none: the message names it, and the line."""

    code = "bad_workload"


def read_workload(path: str) -> list[dict]:
    """The prompts of a workload file (parse_workload), or WorkloadError naming the file."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            text = f.read()
    except OSError as e:
        raise WorkloadError(path_problem(path, e)) from e
    except UnicodeDecodeError as e:
        raise WorkloadError(f"cannot read the workload {path}: {e}") from e
    return parse_workload(text, path)


def parse_workload(text: str, source: str) -> list[dict]:
    """JSONL lines of {id, stratum, messages[, max_tokens]} (the workloads/ format), each
    line checked before anything runs: WorkloadError naming `source` and the line otherwise (the
    messages themselves: check_messages, once the tokenizer is loaded)."""
    items = []
    for n, line in enumerate(text.removeprefix("\ufeff").split("\n"), 1):
        if not line.strip():
            continue
        try:
            it = json.loads(line)
        except json.JSONDecodeError as e:
            raise WorkloadError(f"{source} line {n} is not JSON ({e.msg})") from e
        except RecursionError:
            raise WorkloadError(f"{source} line {n}: its JSON is nested too deeply") from None
        problem = _line_problem(it)
        if problem:
            raise WorkloadError(f"{source} line {n}: {problem}")
        items.append({**it, "line": n})
    if not items:
        raise WorkloadError(f"{source} holds no prompts")
    return items


def _line_problem(it) -> str | None:
    """What is wrong with one workload line's fields, or None."""
    if not isinstance(it, dict) or not {"id", "stratum", "messages"} <= it.keys():
        return "each line needs id, stratum and messages"
    if not isinstance(it["id"], str) or not isinstance(it["stratum"], str):
        return "id and stratum must be strings"
    if not isinstance(it["messages"], list) or not it["messages"]:
        return "messages must be a non-empty list of {role, content}"
    tokens = it.get("max_tokens", Options.max_tokens)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        return f"max_tokens must be a positive integer, got {tokens!r:.40}"
    return None


def check_messages(items: list[dict], tok, path: str) -> list[list[int]]:
    """Each prompt's ids, or WorkloadError naming the line whose messages the template refuses."""
    try:
        out = []
        for it in items:
            out.append(tok.encode_chat(it["messages"]))
        return out
    except PyspecError as e:
        raise WorkloadError(f"{path} line {it['line']} ({it['id']}): {e}") from e


def first_per_stratum(items: list[dict], n: int | None) -> list[dict]:
    """The first `n` prompts of each stratum, in workload order (all of them when n is None)."""
    if not n:
        return items
    kept, seen = [], {}
    for it in items:
        seen[it["stratum"]] = seen.get(it["stratum"], 0) + 1
        if seen[it["stratum"]] <= n:
            kept.append(it)
    return kept
