"""Conversation benchmarks (issue 14), on the numpy engine with the real champion.

    .venv/bin/python -m experiments.bench_conversation --out bench/results/conversation-cpu.json

- Time to first token of a one-message conversation, and of the 10th user turn of a
  conversation built turn by turn on one engine (the conversation cache prefills only each
  turn's new tokens) and on a fresh engine (the whole conversation prefilled); median of runs.
- Cancel during the prefill of a 4,000-token prompt: the time from the cancel (should_stop
  turning true) to the end of the stream, over several cancel points.
The conversation's messages are the first user messages of the public workload, in order.
Timing goals belong here, never in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path

from pyspec.apps import provenance
from pyspec.engine import Engine, Options
from pyspec.load import backend, load_champion

WORKLOAD = Path(__file__).resolve().parent.parent / "workloads" / "public.jsonl"


def ttft(engine: Engine, ids: list[int], max_tokens: int = 4) -> tuple[float, dict]:
    r = engine.generate(ids, Options(max_tokens=max_tokens, k="fixed:0"))
    return r.stats["ttft_s"], r


def conversation(engine: Engine, tok, users: list[str], max_tokens: int) -> tuple[list, list]:
    """Build a conversation turn by turn on `engine`; returns (messages, per-turn stats)."""
    messages, per_turn = [], []
    for text in users:
        messages.append({"role": "user", "content": text})
        r = engine.generate(tok.encode_chat(messages), Options(max_tokens=max_tokens, k="fixed:0"))
        per_turn.append({"ttft_s": r.stats["ttft_s"], "prompt_tokens": len(tok.encode_chat(messages)),
                         "reused_tokens": r.stats["reused_tokens"],
                         "prefill_tokens": r.stats["prefill_tokens"]})
        messages.append({"role": "assistant", "content": r.text})
    return messages, per_turn


def cancel_latency(engine: Engine, ids: list[int], after_s: float) -> dict:
    """Cancel `after_s` seconds into the prefill; seconds from the cancel to the stream's end."""
    t0, state = time.perf_counter(), {}

    def should_stop():
        now = time.perf_counter()
        if now - t0 >= after_s:
            state.setdefault("t_cancel", now)
            return True
        return False

    report: dict = {}

    async def run():
        async for _ in engine.stream(ids, Options(max_tokens=4), report, should_stop):
            pass

    asyncio.run(run())
    end = time.perf_counter()
    # The cancel is seen at the first check after after_s: measure from after_s itself, the
    # moment a user's cancel would have arrived.
    return {"cancel_at_s": after_s, "latency_s": end - (t0 + after_s),
            "finish_reason": report["finish_reason"], "rows_kept": engine.kv.committed}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args(argv)
    champion, tok = load_champion(None, "cpu")
    users = [json.loads(line)["messages"][0]["content"]
             for line in WORKLOAD.read_text().splitlines()][:args.turns]
    ttft(Engine(backend(champion, "none", 8192), tok), tok.encode_chat(
        [{"role": "user", "content": users[1]}]))            # warm-up: first calls, allocations
    one = [ttft(Engine(backend(champion, "none", 8192), tok),
                tok.encode_chat([{"role": "user", "content": users[0]}]))[0]
           for _ in range(args.runs)]
    cached, fresh, runs = [], [], []
    for _ in range(args.runs):   # the conversation built turn by turn, each run on a new engine
        engine = Engine(backend(champion, "none", 8192), tok)
        messages, per_turn = conversation(engine, tok, users, args.max_tokens)
        runs.append(per_turn)
        cached.append(per_turn[-1]["ttft_s"])
        last_prompt = tok.encode_chat(messages[:-1])
        fresh.append(ttft(Engine(backend(champion, "none", 8192), tok), last_prompt)[0])

    every = [json.loads(line)["messages"][-1]["content"] for line in WORKLOAD.read_text().splitlines()]
    long_text = " ".join(every)
    while len(tok.encode(long_text)) < 4100:
        long_text += " " + " ".join(every)
    long_ids = tok.encode_chat([{"role": "user", "content": long_text}])[:4000]
    cancels = [cancel_latency(Engine(backend(champion, "none", 8192), tok), long_ids, at)
               for at in (0.5, 1.0, 2.0, 3.0, 5.0)]

    result = {
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "backend": "cpu-numpy", "turns": args.turns, "max_tokens_per_turn": args.max_tokens,
        "ttft_one_message_s": statistics.median(one),
        "ttft_turn10_cached_s": statistics.median(cached),
        "ttft_turn10_fresh_s": statistics.median(fresh),
        "turn10_over_one_message_cached": statistics.median(cached) / statistics.median(one),
        "turn10_prompt_tokens": len(last_prompt),
        "per_turn": runs,
        "cancel_during_prefill": {"prompt_tokens": len(long_ids), "runs": cancels,
                                  "max_latency_s": max(c["latency_s"] for c in cancels)},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    provenance.write(args.out, provenance.stamp(result))
    print(json.dumps({k: v for k, v in result.items() if k != "per_turn"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
