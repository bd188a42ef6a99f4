"""Record llama.cpp's logits and greedy continuations for the tiny model of every family and
format (pyspec/testmodels.py write_family_model) as golden data: tests/golden/family_logits.json,
read by tests/test_family_goldens.py (the CPU engines against it).

For each family and format (testmodels.FAMILY_FORMATS: F32, F16, Q8_0, Q4_K_M with its Q5_0 /
Q8_0 fallbacks, Q4_K_M-wide with Q4_K / Q6_K) the script writes the tiny model with pyspec (seed 3; the file's sha256
goes into the golden, so the test knows it rebuilds the same model), copies it with the reference
`gguf` package into a file whose integer metadata has the types llama.cpp's loader insists on
(UINT32 for counts and lengths: pyspec's writer stores small ints as INT32, which llama.cpp
refuses; every value and tensor byte is the same), and runs llama.cpp on the copy:
  - one batch over prompt_ids (a ChatML prompt of ~40 tokens, longer than gemma3's 8-key
    window), keeping every row's top-2 (id, logit) and the last row's full logits;
  - N_STEPS greedy steps, one `eval` per token, ties to the lowest id, each with its top-2;
  - prompt + continuation[:-1] again in one batch: llama.cpp's own argmax there, to show how
    far llama.cpp is from itself (its rounding noise floor).

llama.cpp runs on the CPU with n_ctx 256, logits_all, seed 0, flash attention off, n_batch 512,
and the KV cache in F32 (type_k = type_v = GGML_TYPE_F32: its default F16 cache is a rounding
pyspec does not make). Where llama.cpp's CPU path still differs from pyspec on purpose: the
activations of a product with a quantized matrix (Q8_0 here) are quantized to 8 bits (Q8_0
blocks) and those of an F16 matrix rounded to f16 before the dot product; GELU goes through an
f16 lookup table (gemma3). The test keeps pyspec's float64 reference beside llama.cpp for that.

Usage (the venv of scripts/build_llama_cpp.sh, by default .cache/llama-cpp/venv, with gguf==0.19.0
installed there):
  PYTHONPATH=. nice .cache/llama-cpp/venv/bin/python scripts/record_golden_forward.py [--out PATH]
Not part of the pyspec runtime; CI never runs it.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile

import numpy as np

from pyspec import testmodels
from pyspec.formats import gguf as pgguf
from pyspec.text.tokenizer import Tokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "golden" / "family_logits.json"
N_STEPS = 16
N_CTX = 256
SEED = 3
MESSAGES = [{"role": "user", "content": "the cat sat on the mat. the dog ate the bone."}]
SETTINGS = (f"Llama(path, n_ctx={N_CTX}, logits_all=True, seed=0, verbose=False, "
            "type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32, n_threads=2), other arguments default "
            "(CPU, flash_attn off, n_batch 512); llm.eval(prompt_ids) in one batch, then "
            f"{N_STEPS} greedy steps of llm.eval([token]) (argmax of llm.scores, ties to the "
            "lowest id); llama_batched_argmax: llm.eval(prompt_ids + continuation_ids[:-1])")


def retyped_copy(src: str, dst: str) -> None:
    """`src` rewritten by the reference gguf package with llama.cpp's metadata types: every
    non-negative int scalar UINT32, int arrays INT32, floats FLOAT32; tensors byte for byte."""
    import gguf

    reader = gguf.GGUFReader(src)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    w = gguf.GGUFWriter(dst, arch)
    f = pgguf.GGUFFile.open(src)
    for key, value in f.metadata.items():
        if key == "general.architecture":
            continue
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        elif value and isinstance(value[0], int) and not isinstance(value[0], bool):
            w.add_array(key, [int(v) for v in value])   # int arrays: INT32 (token types)
        else:
            w.add_array(key, value)
    for t in reader.tensors:
        info = f.tensor(t.name)
        w.add_tensor(t.name, np.asarray(t.data),   # a quantized tensor: (rows, row bytes) uint8
                     raw_dtype=gguf.GGMLQuantizationType(info.type_id))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def top2(row: np.ndarray) -> list:
    order = np.lexsort((np.arange(len(row)), -row))[:2]   # logit desc, then the lower id
    return [int(order[0]), float(row[order[0]]), int(order[1]), float(row[order[1]])]


def run_llama(path: str, prompt: list[int]) -> dict:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=path, n_ctx=N_CTX, logits_all=True, seed=0, verbose=False,
                          type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32,
                          n_threads=2)
    llm.eval(prompt)
    scores = np.array(llm.scores[:len(prompt)], dtype=np.float32)     # (m, vocab)
    out = {"prompt_top2": [top2(r) for r in scores],
           "last_logits": [round(float(v), 5) for v in scores[-1]]}
    ids, steps, row = [], [], scores[-1]
    for _ in range(N_STEPS):
        steps.append(top2(row))
        ids.append(steps[-1][0])
        llm.eval([ids[-1]])
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    out |= {"continuation_ids": ids, "llama_top2": steps}
    llm.reset()
    llm.eval(prompt + ids[:-1])
    forced = np.array(llm.scores[len(prompt) - 1:len(prompt) - 1 + N_STEPS], dtype=np.float32)
    out["llama_batched_argmax"] = [top2(r)[0] for r in forced]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    args = ap.parse_args()
    import llama_cpp

    models = []
    with tempfile.TemporaryDirectory() as tmp:
        for arch in testmodels.FAMILY_SHAPES:
            for fmt in testmodels.FAMILY_FORMATS:
                path, copy = f"{tmp}/{arch}-{fmt}.gguf", f"{tmp}/{arch}-{fmt}.llama.gguf"
                testmodels.write_family_format(path, arch, fmt, seed=SEED)
                retyped_copy(path, copy)
                f = pgguf.GGUFFile.open(path)
                tok = Tokenizer.from_metadata(f.metadata)
                prompt = tok.encode(tok.render_chat(MESSAGES), special=True)
                print(arch, fmt, len(prompt), flush=True)
                models.append({"arch": arch, "format": fmt, "seed": SEED,
                               "model_sha256": f.sha256(), "prompt_ids": prompt,
                               **run_llama(copy, prompt)})
    header = {"recorder": "scripts/record_golden_forward.py",
              "source": f"llama-cpp-python {llama_cpp.__version__}", "settings": SETTINGS,
              "n_steps": N_STEPS, "messages": MESSAGES}
    with open(args.out, "w", encoding="utf-8") as out:
        out.write(json.dumps(header) + "\n")
        out.writelines(json.dumps(m) + "\n" for m in models)


if __name__ == "__main__":
    main()
