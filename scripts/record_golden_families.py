"""Record golden token ids of the tokenizer families from llama.cpp (through llama-cpp-python).

For llama.cpp's test vocabularies (llama-bpe, qwen2, llama-spm, phi-3, gpt-2; `build.py setup`
puts them in .cache/llama.cpp/) and a vocabulary GGUF with Gemma 3's settings written here from
`pyspec.testmodels.gemma3_tokenizer_metadata` (no space prefix, byte fallback, <eos> = 1), tokenize
seeded random texts (code, emoji, CJK, RTL scripts, whitespace runs, digit runs, control-token
strings) with `Llama(path, vocab_only=True).tokenize(text.encode(), add_bos=False, special=...)`
and write tests/golden/family_ids.json (read by tests/test_families.py).

Usage: python scripts/record_golden_families.py [--out PATH.json] [--count N]
Needs llama-cpp-python 0.3.36 and the `gguf` package; not part of the pyspec runtime, never run in CI.
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


def main() -> None:
    import llama_cpp

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    parser.add_argument("--count", type=int, default=160)
    args = parser.parse_args()
    texts = random_texts(args.count)
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
    args.out.write_text(json.dumps(golden, ensure_ascii=False, separators=(",", ":")) + "\n",
                        encoding="utf-8")
    print(f"wrote {args.out}: {len(texts)} texts x {len(vocabs)} vocabularies")


if __name__ == "__main__":
    main()
