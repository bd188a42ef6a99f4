"""Record llama.cpp's token types, ends of generation and ids for texts full of special and
control-looking strings (tests/golden/token_types.json, read by tests/test_token_types.py).

For each vocabulary of tests/token_type_cases.py (a base per pre-tokenizer, and three variants of
each that append the control-looking texts it lacks, with assorted file types and declared ids),
write it as a vocabulary-only GGUF, then run scripts/llama_tokenize.cpp on it: the ids of every
text of `token_type_cases.texts` with parse_special false and true (llama_tokenize, add_special
false), and each token's attribute bits and `llama_vocab_is_eog` after llama.cpp's load. The
golden keeps the attributes that differ from the file's types, the ends, and the ids.

The driver is llama.cpp itself (the sdist's vendor/llama.cpp), built without Python:
  mkdir -p build && tar xzf .cache/downloads/llama_cpp_python-0.3.36.tar.gz -C build
  L=build/llama_cpp_python-0.3.36/vendor/llama.cpp F="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  cmake -S $L -B build/lb -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \\
    -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF \\
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF \\
    -DCMAKE_C_FLAGS="$F" -DCMAKE_CXX_FLAGS="$F"
  nice ninja -C build/lb -j2 llama           # about 4 minutes on 2 cores
  g++ -O2 -std=c++17 -I $L/include -I $L/ggml/include scripts/llama_tokenize.cpp \\
    build/lb/src/libllama.a build/lb/ggml/src/libggml.a build/lb/ggml/src/libggml-cpu.a \\
    build/lb/ggml/src/libggml-base.a -lpthread -fopenmp -o build/llama_tokenize
Usage: python scripts/record_golden_token_types.py --driver build/llama_tokenize [--out PATH]
Needs the `gguf` package (the test venv has it); never run in CI.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import re
import subprocess
import sys
import tarfile
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))

import token_type_cases as cases  # noqa: E402
from record_golden_families import write_gemma3_vocab  # noqa: E402

from pyspec import champion_path  # noqa: E402
from pyspec.formats.gguf import GGUFFile  # noqa: E402

FIXTURES = ROOT / ".cache" / "llama.cpp"
SDIST = ROOT / ".cache" / "downloads" / "llama_cpp_python-0.3.36.tar.gz"
DEFAULT_OUT = ROOT / "tests" / "golden" / "token_types.json"
# GGUF token type -> the attribute bits llama.cpp gives it before its rules (llama_token_attr).
PLAIN_ATTR = {0: 0, 1: 4, 2: 1, 3: 8, 4: 16, 5: 2, 6: 32}


def check_control_looking() -> None:
    """Every text llama_vocab::impl::load compares a token with is in CONTROL_LOOKING."""
    with tarfile.open(SDIST) as tar:
        source = tar.extractfile("llama_cpp_python-0.3.36/vendor/llama.cpp/src/llama-vocab.cpp")
        text = source.read().decode("utf-8")
    start = text.index("void llama_vocab::impl::load(")
    load = text[start:text.index("enum llama_vocab_type llama_vocab::impl::get_type", start)]
    named = set(re.findall(r'(?:t\.first|text) == "([^"]+)"', load))
    named.update(("</s>", "<unk>", "<s>", "<|endoftext|>"))   # Phi-3's right strip, by list
    missing = named - set(cases.CONTROL_LOOKING)
    if missing:
        sys.exit(f"tests/token_type_cases.py CONTROL_LOOKING lacks {sorted(missing)}")


def base_file(name: str, tmp: pathlib.Path) -> pathlib.Path:
    if name == "smollm":
        return pathlib.Path(champion_path())
    if name == "gemma3-settings":
        path = tmp / "gemma3-settings.gguf"
        write_gemma3_vocab(path)
        return path
    return FIXTURES / f"ggml-vocab-{name}.gguf"


def write_variant(base: pathlib.Path, changes: dict, out: pathlib.Path) -> None:
    """The base's key-values (no tensors) with `changes` in place of theirs."""
    import gguf

    reader = gguf.GGUFReader(base)
    writer = gguf.GGUFWriter(str(out), reader.fields["general.architecture"].contents())
    kinds = {"tokens": gguf.GGUFValueType.STRING, "token_type": gguf.GGUFValueType.INT32,
             "scores": gguf.GGUFValueType.FLOAT32}
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in changes:
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), kind, sub)
    for name, value in changes.items():
        short = name[len("tokenizer.ggml."):]
        if short in kinds:
            writer.add_key_value(name, value, gguf.GGUFValueType.ARRAY, kinds[short])
        else:
            writer.add_key_value(name, value, gguf.GGUFValueType.UINT32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()


def run_driver(driver: str, path: pathlib.Path, texts: list[str], tmp: pathlib.Path):
    rec, ids, attrs = tmp / "texts.rec", tmp / "out.ids", tmp / "out.attrs"
    with open(rec, "wb") as f:
        for special in (0, 1):
            for text in texts:
                data = text.encode("utf-8")
                f.write(f"{special} {len(data)}\n".encode() + data + b"\n")
    subprocess.run([driver, str(path), str(rec), str(ids), str(attrs)], check=True,
                   stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    lines = [[int(x) for x in line.split()] for line in ids.read_text().splitlines()]
    assert len(lines) == 2 * len(texts), path
    pairs = [tuple(map(int, line.split())) for line in attrs.read_text().splitlines()]
    return lines[:len(texts)], lines[len(texts):], pairs


def record(driver: str, tmp: pathlib.Path) -> dict:
    vocabs = {}
    for base in cases.BASES:
        path = base_file(base, tmp)
        md = GGUFFile.open(path).metadata
        sha = hashlib.sha256(path.read_bytes()).hexdigest() if base != "gemma3-settings" else None
        for v in (None, *cases.VARIANTS):
            name, vpath, vmd = base, path, md
            if v is not None:
                changes = cases.variant(md, v)
                name, vpath, vmd = f"{base}+v{v}", tmp / f"{base}+v{v}.gguf", {**md, **changes}
                write_variant(path, changes, vpath)
            texts = cases.texts(vmd, own=v is None)
            plain, special, attrs = run_driver(driver, vpath, texts, tmp)
            types = vmd["tokenizer.ggml.token_type"]
            assert len(attrs) == len(types), name
            vocabs[name] = {
                "base_sha256": sha,
                "texts_sha256": hashlib.sha256(json.dumps(texts).encode()).hexdigest(),
                "attrs": {str(i): a for i, (a, _) in enumerate(attrs) if a != PLAIN_ATTR[types[i]]},
                "eog": [i for i, (_, e) in enumerate(attrs) if e],
                "ids": plain, "ids_special": special}
            print(f"{name}: {len(texts)} texts, {len(vocabs[name]['attrs'])} attributes changed, "
                  f"eog {vocabs[name]['eog']}")
    return {"source": "llama.cpp as vendored in llama-cpp-python 0.3.36: llama_tokenize(vocab, "
                      "text, add_special=false, parse_special=false/true), llama_vocab_get_attr, "
                      "llama_vocab_is_eog, through scripts/llama_tokenize.cpp; "
                      "scripts/record_golden_token_types.py",
            "vocabs": vocabs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--driver", required=True, help="scripts/llama_tokenize.cpp, built")
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    check_control_looking()
    with tempfile.TemporaryDirectory() as tmp:
        golden = record(args.driver, pathlib.Path(tmp))
    args.out.write_text(json.dumps(golden, ensure_ascii=False, separators=(",", ":")) + "\n",
                        encoding="utf-8")
    print(f"wrote {args.out}: {len(golden['vocabs'])} vocabularies")


if __name__ == "__main__":
    main()
