"""web/client.d.ts type-checks what a web developer writes: the embed example's script (JSDoc-typed
JavaScript, `tsc --checkJs`) and a TypeScript use of the OpenAI-style facade; and the check can
fail: a misspelt method and a mistyped option are errors. The compiler is TypeScript from npm,
pinned in build.py (NODE_PINS) and installed by its setup into .cache/node; it is a test tool
only."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TSC = ROOT / ".cache" / "node" / "node_modules" / ".bin" / "tsc"
FLAGS = ["--noEmit", "--target", "es2022", "--module", "es2022", "--moduleResolution", "bundler",
         "--lib", "es2022,dom"]

FACADE_TS = """import { SpecDecoder, SpecError, type ChatCompletionChunk } from "./client.js";

const decoder: SpecDecoder = await SpecDecoder.create({ champion: { url: "/models/m.gguf" } });
const completion = await decoder.chat.completions.create({
  messages: [{ role: "user", content: "Hi" }], max_tokens: 16, temperature: 0.7, seed: 3 });
const text: string | null = completion.choices[0].message.content;
const used: number = completion.usage.completion_tokens + (completion.usage.prompt_tokens ?? 0);
const built: number | undefined = decoder.info?.load_ms.engine;
const gpu: boolean = decoder.info?.webgpu.available ?? false;
const stream = await decoder.chat.completions.create({
  messages: [{ role: "user", content: "Hi" }], stream: true, signal: new AbortController().signal });
for await (const chunk of stream) {
  const c: ChatCompletionChunk = chunk;
  console.log(c.choices[0].delta.content ?? "", text, used, built, gpu);
}
try { await decoder.cancel(); } catch (e) { if (e instanceof SpecError) console.log(e.code); }
"""


def embed_script(page: str = "embed-example.html") -> str:
    html = (ROOT / "web" / page).read_text()
    return re.search(r'<script type="module">(.*?)</script>', html, re.S).group(1)


def tsc(tmp_path: Path, name: str, source: str, *extra: str) -> subprocess.CompletedProcess:
    if not TSC.exists():
        pytest.fail(f"{TSC} is missing: run `python3 build.py setup` (it installs TypeScript "
                    "from npm)")
    shutil.copyfile(ROOT / "web" / "client.d.ts", tmp_path / "client.d.ts")
    (tmp_path / name).write_text(source)
    return subprocess.run([str(TSC), *FLAGS, *extra, name], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)


def test_the_embed_example_type_checks(tmp_path):
    done = tsc(tmp_path, "embed.js", embed_script(), "--allowJs", "--checkJs")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_tools_example_type_checks(tmp_path):
    """web/tools-example.html: tools, tool_choice, streamed call deltas, tool messages."""
    done = tsc(tmp_path, "tools.js", embed_script("tools-example.html"), "--allowJs",
               "--checkJs")
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_misspelt_method_in_the_example_is_caught(tmp_path):
    script = embed_script()
    assert "embed.decoder.generate(" in script
    done = tsc(tmp_path, "embed.js", script.replace("embed.decoder.generate(",
                                                    "embed.decoder.generat("),
               "--allowJs", "--checkJs")
    assert done.returncode != 0 and "generat" in done.stdout


def test_the_facade_type_checks_in_typescript(tmp_path):
    done = tsc(tmp_path, "app.ts", FACADE_TS, "--strict")
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_mistyped_option_is_caught(tmp_path):
    done = tsc(tmp_path, "app.ts", FACADE_TS.replace("max_tokens: 16", 'max_tokens: "16"'),
               "--strict")
    assert done.returncode != 0 and "app.ts(5," in done.stdout   # the create() call's line
    assert "'string' is not assignable to type 'number'" in done.stdout


def readme_decoder_script() -> str:
    """docs/embedding.md's two examples of the decoder (generate(), then the facade) as one module,
    with the page element they write to declared and the annotations TypeScript wants where
    JavaScript has none (a literal's role widens to string)."""
    blocks = re.findall(r"```js\n(.*?)```", (ROOT / "docs" / "embedding.md").read_text(), re.S)
    start = next(i for i, b in enumerate(blocks) if 'from "./client.js"' in b)
    first, facade = blocks[start], blocks[start + 1]
    assert "chat.completions.create" in facade
    script = ("declare const out: HTMLElement;\n" + first
              + facade.replace("const engine =", "const engine: SpecDecoder =")
              .replace("const messages =", "const messages: ChatMessage[] ="))
    return script.replace('import { SpecDecoder } from "./client.js";',
                          'import { SpecDecoder, type ChatMessage } from "./client.js";')


def test_the_documented_examples_type_check(tmp_path):
    """What a developer pastes from docs/embedding.md compiles under --strict: the last chunk is told
    from the others by `chunk.usage`, and its stats may be null."""
    done = tsc(tmp_path, "readme.ts", readme_decoder_script(), "--strict")
    assert done.returncode == 0, done.stdout + done.stderr
    done = tsc(tmp_path, "readme.ts", readme_decoder_script().replace(
        "chunk.pyspec.stats?.accepted", "chunk.pyspec.stats.accepted"), "--strict")
    assert done.returncode != 0 and "possibly 'null'" in done.stdout


def test_the_facade_takes_the_schema_as_response_format_only(tmp_path):
    """client.js refuses generate()'s json_schema in a facade request (bad_config); the types
    say so before it runs."""
    schema = '{ type: "object" }'
    bad = FACADE_TS.replace("seed: 3 }", f"seed: 3, json_schema: {schema} }}")
    done = tsc(tmp_path, "app.ts", bad, "--strict")
    assert done.returncode != 0 and "json_schema" in done.stdout
    good = FACADE_TS.replace("seed: 3 }", "seed: 3, response_format: { type: \"json_schema\", "
                             f"json_schema: {{ name: \"x\", schema: {schema} }} }} }}")
    done = tsc(tmp_path, "app.ts", good, "--strict")
    assert done.returncode == 0, done.stdout + done.stderr


def test_usage_may_be_null_where_the_prompt_was_never_counted(tmp_path):
    """A request aborted while it waited has no prompt count: usage says null, and the types
    make the page handle it."""
    script = FACADE_TS.replace("(completion.usage.prompt_tokens ?? 0)",
                               "completion.usage.prompt_tokens")
    done = tsc(tmp_path, "app.ts", script, "--strict")
    assert done.returncode != 0 and "possibly 'null'" in done.stdout


MEASURE_TS = """import { SpecDecoder, type MeasureResult, type Verdict, type VerdictWord
         } from "./client.js";

const decoder = await SpecDecoder.create({ champion: "smollm2", draft: "auto" });
const stop = new AbortController();
const m: MeasureResult = await decoder.measure({
  drafts: ["ngram"], perStratum: 1, maxTokens: 32, signal: stop.signal,
  onProgress: (p) => console.log(`${p.done} / ${p.total} ${p.label}`) });
const word: VerdictWord | undefined = m.verdict.ngram;
const low: number | undefined = m.report?.drafters.ngram.speedup.low;
const chose: string | null | undefined = decoder.info?.draft_verdict;
console.log(m.cancelled, m.text ?? "", word, low, chose, m.verdicts[0]?.device_class, m.stored);
const why: string | null | undefined = m.report?.drafters.ngram.not_recorded;
const kept: Verdict[] = await SpecDecoder.recordedVerdicts();
const one = await SpecDecoder.clearVerdicts({ only: [kept[0]?.sha256 ?? "abcd"] });
const all: string[] = (await SpecDecoder.clearVerdicts()).removed;
console.log(why, one.kept, all);
"""


def test_measure_type_checks_and_a_misspelt_option_is_caught(tmp_path):
    """decoder.measure() as an embedder writes it (docs/embedding.md): typed options, progress,
    the verdict per drafter, the recorded verdicts listed and cleared; a misspelt option and a
    mistyped one are errors."""
    done = tsc(tmp_path, "measure.ts", MEASURE_TS, "--strict")
    assert done.returncode == 0, done.stdout + done.stderr
    done = tsc(tmp_path, "measure.ts", MEASURE_TS.replace("perStratum", "per_stratum"),
               "--strict")
    assert done.returncode != 0 and "per_stratum" in done.stdout
    done = tsc(tmp_path, "measure.ts", MEASURE_TS.replace('{ only: [kept[0]?.sha256 ?? "abcd"] }',
                                                          '{ only: "abcd" }'), "--strict")
    assert done.returncode != 0 and "not assignable to type 'string[]'" in done.stdout
