"""Record golden token ids of the tokenizer families from llama.cpp (through llama-cpp-python).

For llama.cpp's test vocabularies (llama-bpe, qwen2, llama-spm, phi-3, gpt-2; `build.py setup`
puts them in .cache/llama.cpp/) and a vocabulary GGUF with Gemma 3's settings written here from
`pyspec.testmodels.gemma3_tokenizer_metadata` (no space prefix, byte fallback, <eos> = 1), tokenize
seeded random texts (code, emoji, CJK, RTL scripts, whitespace runs, digit runs, control-token
strings) with `Llama(path, vocab_only=True).tokenize(text.encode(), add_bos=False, special=...)`
and write tests/golden/family_ids.json (read by tests/test_tokenizer_families.py).

Usage: python scripts/record_golden_families.py [--out PATH.json] [--count N]
Needs llama-cpp-python 0.3.36 and the `gguf` package (scripts/build_llama_cpp.sh builds both into
.cache/llama-cpp/venv); not part of the pyspec runtime, never run in CI.

Without llama-cpp-python, the same llama.cpp sources (its sdist's vendor/llama.cpp) can tokenize
through scripts/llama_tokenize.cpp (llama_tokenize with add_special=false, as Llama.tokenize
calls it): `--driver-input DIR` writes the texts (DIR/texts.rec) and the Gemma 3 settings GGUF
there; run `llama_tokenize VOCAB.gguf DIR/texts.rec DIR/NAME.ids` per vocabulary; then
`--driver-output DIR` writes the golden file from those ids.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import random
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from record_golden_tokens import CODE, EMOJI, NUMBERS, SCRIPTS, WHITESPACE  # noqa: E402

from pyspec import testmodels  # noqa: E402

FIXTURES = ROOT / ".cache" / "llama.cpp"
VOCABS = ["llama-bpe", "qwen2", "llama-spm", "phi-3", "gpt-2"]
DEFAULT_OUT = ROOT / "tests" / "golden" / "family_ids.json"
PIECES = {
    "code": CODE, "emoji": EMOJI, "scripts": SCRIPTS,
    "rtl": ["مرحبا بالعالم", "שלום עולם", "العربية ١٢٣", "עברית 123 text", "\u200fرتل\u200e"],
    "cjk": ["中文文本", "日本語のテキスト", "한국어 텍스트", "我爱自然语言处理。", "ｶﾀｶﾅ１２３"],
    "whitespace": WHITESPACE, "digits": NUMBERS + ["1" * 17, "12 345 6789", "3.14159265358979"],
    "control": ["<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<s>", "</s>", "<|endoftext|>",
                "<start_of_turn>", "<|end|>", "<eos>", "<0x41>"],
}


def random_texts(count: int, seed: int = 45) -> list[tuple[str, bool]]:
    """(text, parse specials) pairs: 1-6 pieces of the kinds above, joined by random separators."""
    rng = random.Random(seed)
    kinds = sorted(PIECES)
    out = []
    for n in range(count):
        parts = [rng.choice(PIECES[rng.choice(kinds)]) for _ in range(rng.randint(1, 6))]
        text = "".join(p + rng.choice(["", " ", "  ", "\n", "\t", " \n ", "", ""]) for p in parts)
        out.append((text, n % 4 == 3))
    return out


def write_gemma3_vocab(path: pathlib.Path) -> None:
    """A vocabulary-only GGUF with Gemma 3's tokenizer settings and llama-spm's hyperparameters."""
    import gguf

    md = testmodels.gemma3_tokenizer_metadata()
    reader = gguf.GGUFReader(FIXTURES / "ggml-vocab-llama-spm.gguf")
    writer = gguf.GGUFWriter(str(path), "llama")
    for name, field in reader.fields.items():
        if name.startswith("llama.") and field.types and field.types[0] != gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, field.contents(), field.types[0])
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(md["tokenizer.ggml.tokens"])
    writer.add_token_scores(md["tokenizer.ggml.scores"])
    writer.add_token_types(md["tokenizer.ggml.token_type"])
    writer.add_bos_token_id(md["tokenizer.ggml.bos_token_id"])
    writer.add_eos_token_id(md["tokenizer.ggml.eos_token_id"])
    writer.add_unk_token_id(md["tokenizer.ggml.unknown_token_id"])
    writer.add_pad_token_id(md["tokenizer.ggml.padding_token_id"])
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_driver_input(folder: pathlib.Path, texts: list[tuple[str, bool]]) -> None:
    """Records "<special> <nbytes>\n<bytes>\n" for llama_tokenize.cpp, and the Gemma 3 vocab."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "texts.rec", "wb") as f:
        for text, special in texts:
            data = text.encode("utf-8")
            f.write(f"{int(special)} {len(data)}\n".encode() + data + b"\n")
    write_gemma3_vocab(folder / "ggml-vocab-gemma3-settings.gguf")


def from_driver_output(folder: pathlib.Path, texts: list[tuple[str, bool]]) -> dict:
    vocabs = {}
    for name in [*VOCABS, "gemma3-settings"]:
        lines = (folder / f"{name}.ids").read_text().splitlines()
        assert len(lines) == len(texts), name
        sha = (hashlib.sha256((FIXTURES / f"ggml-vocab-{name}.gguf").read_bytes()).hexdigest()
               if name in VOCABS else None)
        vocabs[name] = {"sha256": sha, "cases": [[t, s, [int(x) for x in line.split()]]
                                                 for (t, s), line in zip(texts, lines)]}
    return {"source": "llama.cpp as vendored in llama-cpp-python 0.3.36: llama_tokenize(vocab, "
                      "text, add_special=false, parse_special=...) through "
                      "scripts/llama_tokenize.cpp; scripts/record_golden_families.py",
            "vocabs": vocabs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    parser.add_argument("--count", type=int, default=160)
    parser.add_argument("--driver-input", type=pathlib.Path)
    parser.add_argument("--driver-output", type=pathlib.Path)
    args = parser.parse_args()
    texts = random_texts(args.count)
    if args.driver_input:
        return write_driver_input(args.driver_input, texts)
    if args.driver_output:
        return write_golden(args.out, from_driver_output(args.driver_output, texts))
    import llama_cpp

    with tempfile.TemporaryDirectory() as tmp:
        paths = {name: FIXTURES / f"ggml-vocab-{name}.gguf" for name in VOCABS}
        paths["gemma3-settings"] = pathlib.Path(tmp) / "gemma3-settings.gguf"
        write_gemma3_vocab(paths["gemma3-settings"])
        vocabs = {}
        for name, path in paths.items():
            llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
            cases = [[text, special, llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)]
                     for text, special in texts]
            sha = hashlib.sha256(path.read_bytes()).hexdigest() if name in VOCABS else None
            vocabs[name] = {"sha256": sha, "cases": cases}
            del llm
    golden = {"source": f"llama-cpp-python {llama_cpp.__version__}: Llama(path, vocab_only=True)"
                        ".tokenize(text, add_bos=False, special=...); scripts/record_golden_families.py",
              "vocabs": vocabs}
    write_golden(args.out, golden)


def write_golden(out: pathlib.Path, golden: dict) -> None:
    out.write_text(json.dumps(golden, ensure_ascii=False, separators=(",", ":")) + "\n",
                   encoding="utf-8")
    print(f"wrote {out}: {len(golden['vocabs'])} vocabularies")


if __name__ == "__main__":
    main()
