"""Record llama.cpp's forward of every family model on llama.cpp's own dequantization of its
weights (tests/golden/family_dequant_logits.json, read by tests/test_family_goldens.py).

llama.cpp's CPU path quantizes the activations of every product with a quantized matrix (Q8_0 /
Q8_K blocks) and rounds those of an F16 matrix to f16; pyspec does not, so against llama.cpp's
own quantized run (tests/golden/family_logits.json) a quantized model can only be held to
0.4-0.65 logits, loose enough to pass a RoPE base 5% off. This golden takes that rounding out
and keeps everything else: for each model of family_logits.json (same file, same prompt),
scripts/llama_logits.cpp has llama.cpp dequantize every tensor with its own `to_float`
(llama_model_quantize to ALL_F32, allow_requantize) and run the F32 result with the settings of
the other golden (n_ctx 256, F32 KV cache, flash attention off, 2 threads): the prompt in one
batch, then N_STEPS greedy steps. The golden keeps every row's top-2, the last prompt row's
full logits, the greedy continuation, and the sha256 of each tensor llama.cpp dequantized (the
test checks pyspec's dequantization against them bit for bit).

Build the driver with the recipe of scripts/record_golden_token_types.py (libllama from the
sdist's vendor/llama.cpp), then:
  g++ -O2 -std=c++17 -I $L/include -I $L/ggml/include scripts/llama_logits.cpp \\
    build/lb/src/libllama.a build/lb/ggml/src/libggml.a build/lb/ggml/src/libggml-cpu.a \\
    build/lb/ggml/src/libggml-base.a -lpthread -fopenmp -o build/llama_logits
  python scripts/record_golden_dequant.py --driver build/llama_logits [--out PATH]
Needs the `gguf` package (retyped_copy of record_golden_forward.py); never run in CI.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from record_golden_forward import N_STEPS, retyped_copy, top2  # noqa: E402

from pyspec import testmodels  # noqa: E402
from pyspec.formats import gguf  # noqa: E402

SOURCE = ROOT / "tests" / "golden" / "family_logits.json"
DEFAULT_OUT = ROOT / "tests" / "golden" / "family_dequant_logits.json"
SETTINGS = ("llama_model_quantize(ftype=LLAMA_FTYPE_ALL_F32, allow_requantize=true), then the F32 "
            "model with n_ctx=256, n_batch=512, type_k=type_v=GGML_TYPE_F32, flash attention "
            f"disabled, 2 threads: the prompt in one batch, then {N_STEPS} greedy steps (argmax, "
            "ties to the lowest id), one llama_decode a token")


def record_one(driver: str, entry: dict, tmp: pathlib.Path) -> dict:
    name = f"{entry['arch']}-{entry['format']}"
    path, copy, f32 = tmp / f"{name}.gguf", tmp / f"{name}.llama.gguf", tmp / f"{name}.f32.gguf"
    testmodels.write_family_format(str(path), entry["arch"], entry["format"], seed=entry["seed"])
    assert gguf.GGUFFile.open(path).sha256() == entry["model_sha256"], name
    retyped_copy(str(path), str(copy))
    prompt = entry["prompt_ids"]
    (tmp / "prompt.txt").write_text(" ".join(map(str, prompt)) + f"\n{N_STEPS}\n")
    subprocess.run([driver, str(copy), str(f32), str(tmp / "prompt.txt"), str(tmp / "out.txt")],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lines = (tmp / "out.txt").read_text().splitlines()
    rows = np.array([[float(v) for v in line.split()] for line in lines[:len(prompt)]],
                    dtype=np.float32)                                         # (prompt, vocab)
    steps = [line.split() for line in lines[len(prompt):]]
    assert len(steps) == N_STEPS, name
    after = np.array([[float(v) for v in s[1:]] for s in steps], dtype=np.float32)  # (N, vocab)
    dequantized = gguf.GGUFFile.open(f32)
    assert all(t.type_id == 0 for t in dequantized.tensors.values()), f"{name}: not all F32"
    return {"arch": entry["arch"], "format": entry["format"], "model_sha256": entry["model_sha256"],
            "prompt_ids": prompt, "continuation_ids": [int(s[0]) for s in steps],
            "rows_top2": [top2(r) for r in np.concatenate([rows, after])],
            "last_logits": [round(float(v), 5) for v in rows[-1]],
            "tensor_sha256": {n: hashlib.sha256(np.ascontiguousarray(
                dequantized.dequantize(n), dtype=np.float32).tobytes()).hexdigest()
                for n in sorted(dequantized.tensors)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--driver", required=True, help="scripts/llama_logits.cpp, built")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    args = ap.parse_args()
    entries = [json.loads(line) for line in SOURCE.read_text().splitlines()[1:]]
    models = []
    with tempfile.TemporaryDirectory() as tmp:
        for entry in entries:
            models.append(record_one(args.driver, entry, pathlib.Path(tmp)))
            print(entry["arch"], entry["format"], models[-1]["continuation_ids"], flush=True)
    header = {"source": "llama.cpp as vendored in llama-cpp-python 0.3.36, through "
                        "scripts/llama_logits.cpp; scripts/record_golden_dequant.py",
              "settings": SETTINGS, "n_steps": N_STEPS}
    with open(args.out, "w", encoding="utf-8") as out:
        out.write(json.dumps(header) + "\n")
        out.writelines(json.dumps(m) + "\n" for m in models)


if __name__ == "__main__":
    main()
