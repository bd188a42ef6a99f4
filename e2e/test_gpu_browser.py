"""The GPU engine in the browser: pyspec.gpu.browser on Chromium's WebGPU (SwiftShader), on the
tiny random model (pyspec.testmodels). The page must pick WebGPU, and its output and accept
decisions must equal the native engines': the CPU reference (tokens) and the same GPU engine on
wgpu-py (tokens and, where the drafts come from the GPU, the accept decisions too).

One page load serves the module. Native references run in a worker thread (Playwright's sync API
keeps an asyncio loop on the main one); the wgpu-py ones skip where there is no native adapter.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from pyspec import receipts

from .pageutil import Context, native_generate, ready, run

pytestmark = pytest.mark.browser

MESSAGES = [{"role": "user", "content": "the cat sat on the mat. the cat"}]
PROMPT = MESSAGES[0]["content"]
N = 32
REPLAY = {"temperature": 0.8, "seed": 5}
# The accept decisions a run logs (engine._stats), equal between two engines that agree.
DECISIONS = ("drafted_by_position", "accepted_by_position", "champion_passes")


@pytest.fixture(scope="module")
def gpu_page(browser, site_url, need):
    c = Context(browser, site_url)
    # backend=webgpu: "auto" prefers the CPU engine on a software adapter such as SwiftShader
    # drills=1: the lose_device drill below
    page = c.page("index.html?model=tiny&backend=webgpu&drills=1")
    info = ready(page)
    if info["adapter"] == "cpu-numpy":
        c.ctx.close()
        need("browser", f"Chromium gave no WebGPU adapter: {info.get('fallback')}")
    yield page, info
    c.ctx.close()
    assert not c.offsite, f"requests to other origins: {c.offsite}"


@pytest.fixture(scope="module")
def tiny_path(site_root):
    return str(site_root / "models" / "tiny.gguf")


@pytest.fixture(scope="module")
def native_wgpu(tiny_path, gpu):
    """run(draft, **options) -> Result of the GPU engine on wgpu-py (lavapipe on CI)."""
    from pyspec.engine import Engine
    from pyspec.formats.gguf import GGUFFile
    from pyspec.gpu import load_model, open_device
    from pyspec.load import backend
    from pyspec.options import Options
    from pyspec.text.tokenizer import Tokenizer

    pool = ThreadPoolExecutor(1)   # one thread owns the device
    f = GGUFFile.open(tiny_path)
    tokenizer = Tokenizer.from_metadata(f.metadata)
    model = pool.submit(lambda: load_model(open_device(), f)).result()

    def go(draft, **options):
        engine = Engine(backend(model, draft), tokenizer)
        return engine.generate(tokenizer.encode_chat(MESSAGES), Options(**options))

    yield lambda draft, **options: pool.submit(go, draft, **options).result()
    pool.submit(model.dev.destroy).result()
    pool.shutdown()


def test_the_page_runs_on_webgpu(gpu_page):
    page, info = gpu_page
    assert info["adapter"] != "cpu-numpy", info.get("fallback")
    assert "WebGPU" in info["adapter"] and info["fallback"] is None
    assert info["webgpu"]["available"]
    result = run(page, PROMPT, {"draft": "none", "max_tokens": 4})
    assert result["stats"]["adapter"] == info["adapter"]
    # The receipt names the adapter's class only, never its description.
    adapter_class = result["receipt"]["stats"]["adapter"]
    assert adapter_class in receipts.ADAPTER_CLASSES and adapter_class != "cpu-numpy"
    if info["webgpu"]["fallback"]:   # SwiftShader
        assert adapter_class == "software"
    assert info["adapter"] not in json.dumps(result["receipt"])
    assert result["receipt"]["fallbacks"] == []


def test_greedy_speculative_equals_champion_only_and_native(gpu_page, tiny_path, native_wgpu):
    page, _ = gpu_page
    cpu = native_generate(tiny_path, MESSAGES, "none", max_tokens=N)
    champion_only = run(page, PROMPT, {"draft": "none", "max_tokens": N})
    assert champion_only["tokens"] == cpu.tokens
    for draft in ("ngram", "self:1"):
        spec = run(page, PROMPT, {"draft": draft, "k": "fixed:3", "max_tokens": N})
        assert spec["stats"]["drafter"] == draft
        assert spec["stats"]["drafted"] > 0, draft
        assert spec["tokens"] == champion_only["tokens"], draft
        wgpu = native_wgpu(draft, k="fixed:3", max_tokens=N)
        assert wgpu.tokens == cpu.tokens, draft
        for key in DECISIONS:
            assert spec["stats"][key] == wgpu.stats[key], (draft, key)


def test_replay_equals_native_for_the_same_seed(gpu_page, tiny_path, native_wgpu):
    page, _ = gpu_page
    cpu = native_generate(tiny_path, MESSAGES, "none", max_tokens=N, **REPLAY)
    browser_none = run(page, PROMPT, {"draft": "none", "max_tokens": N, **REPLAY})
    assert browser_none["receipt"]["verify"] == "replay"
    assert browser_none["tokens"] == cpu.tokens
    for draft in ("ngram", "self:1"):
        spec = run(page, PROMPT, {"draft": draft, "k": "fixed:3", "max_tokens": N, **REPLAY})
        assert spec["tokens"] == cpu.tokens, draft
        wgpu = native_wgpu(draft, k="fixed:3", max_tokens=N, **REPLAY)
        assert wgpu.tokens == cpu.tokens, draft
        for key in DECISIONS:
            assert spec["stats"][key] == wgpu.stats[key], (draft, key)


def test_rejection_equals_the_native_gpu_engine_seed_by_seed(gpu_page, native_wgpu):
    """Rejection sampling in the page runs the GPU's whole rejection path (the draft's samples
    and q rows, p's rows, the accept kernel's tests, residual and bonus): for each seed its
    tokens and accept decisions equal the same engine's on wgpu-py, both adapters running the
    same kernels (one workgroup per row) on the same f32 rows. Its distribution is tested
    natively (tests/test_draft_architecture.py, tests/test_engine.py)."""
    page, _ = gpu_page
    seen = 0
    for seed in range(6):
        options = {"temperature": 0.9, "seed": seed, "verify": "rejection", "k": "fixed:2",
                   "max_tokens": 16}
        for draft in ("ngram", "self:1"):
            spec = run(page, PROMPT, {"draft": draft, **options})
            if spec["receipt"]["faults"]:
                # A recovery (the readback watchdog on a loaded machine, say) resumes rejection
                # with other drafts: a valid continuation, not these bytes (engine.generate).
                # The kernels are what is compared here, so the case runs once more.
                spec = run(page, PROMPT, {"draft": draft, **options})
            assert spec["receipt"]["verify"] == "rejection"
            wgpu = native_wgpu(draft, **options)
            assert spec["tokens"] == wgpu.tokens, _parted(draft, seed, spec, wgpu)
            for key in DECISIONS:
                assert spec["stats"][key] == wgpu.stats[key], (draft, seed, key)
            seen += spec["stats"]["drafted"]
    assert seen > 0


def _parted(draft, seed, spec, wgpu) -> str:
    """Where the page's tokens and wgpu-py's parted, and what each side decided: enough to tell
    a kernel's difference (same decisions until the token) from the cycles' (a decision first)."""
    a, b = spec["tokens"], wgpu.tokens
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    sides = {key: (spec["stats"][key], wgpu.stats[key]) for key in DECISIONS}
    return (f"{draft} seed {seed}: parted at token {at} ({a[at:at + 3]} vs {b[at:at + 3]}); "
            f"page, wgpu-py: {sides}; page faults {spec['receipt']['faults']}, prefilled "
            f"{spec['stats']['prefill_tokens']} after {spec['stats']['reused_tokens']} reused")


def test_the_pages_draft_model_drafts_on_the_device(browser, site_url, tiny_path, site_root, need,
                                                    native_wgpu):
    """The draft model given at init (`draft=tiny-close`) drafts on the GPU in the page, as a
    --draft file does natively (load.GivenDraft -> gpu/draft.GPUDraft): the stats say "device",
    every cycle is one submission and one readback, its tokens are champion-only's, and its
    accept decisions equal the same draft's on wgpu-py, greedy and replay."""
    c = Context(browser, site_url)
    try:
        page = c.page("index.html?model=tiny&draft=tiny-close&backend=webgpu")
        info = ready(page)
        if info["adapter"] == "cpu-numpy":
            need("browser", f"Chromium gave no WebGPU adapter: {info.get('fallback')}")
        assert info["draft"] == "model", info
        close = str(site_root / "models" / "tiny-close.gguf")
        for options in ({}, REPLAY):
            alone = native_generate(tiny_path, MESSAGES, "none", max_tokens=N, **options)
            spec = run(page, PROMPT, {"draft": "model", "k": "fixed:3", "max_tokens": N,
                                      **options})
            st, timing = spec["stats"], spec["stats"]["backend_timing"]
            assert spec["tokens"] == alone.tokens, options
            assert st["draft_path"] == "device" and st["drafted"] > 0, st
            assert timing["submissions"] == timing["readbacks"] == timing["cycles"], timing
            wgpu = native_wgpu(f"model:{close}", k="fixed:3", max_tokens=N, **options)
            assert wgpu.stats["draft_path"] == "device" and wgpu.tokens == alone.tokens
            for key in DECISIONS:
                assert st[key] == wgpu.stats[key], (options, key)
    finally:
        c.ctx.close()
    assert not c.offsite, f"requests to other origins: {c.offsite}"


_LOSE_DEVICE_MID_REQUEST = """async ([prompt, n]) => {
  const d = window.pyspecApp.decoder();
  const chunks = [];
  for await (const chunk of d.generate([{role: "user", content: prompt}],
                                       {draft: "ngram", k: "fixed:3", max_tokens: n})) {
    chunks.push({offset: chunk.offset, text: chunk.text});
    if (chunks.length === 1) await d.loseDevice();
  }
  return {chunks, result: d.lastResult};
}"""


def test_a_lost_device_goes_on_on_a_new_device_without_repeating_text(gpu_page, tiny_path):
    """DESIGN §8: the device is destroyed after the first chunk; the request goes on from its
    committed tokens on a new WebGPU device (web._recovery), the text is never shown twice, the
    receipt says what happened, and the next request gets a WebGPU device again."""
    page, info = gpu_page
    cpu = native_generate(tiny_path, MESSAGES, "none", max_tokens=N)
    out = page.evaluate(_LOSE_DEVICE_MID_REQUEST, [PROMPT, N])
    result, chunks = out["result"], out["chunks"]
    assert result["tokens"] == cpu.tokens
    text = "".join(c["text"] for c in chunks)
    assert text == result["text"] == cpu.text
    assert [c["offset"] for c in chunks] == [sum(len(c["text"]) for c in chunks[:i])
                                              for i in range(len(chunks))]
    faults = result["receipt"]["faults"]
    assert len(faults) == 1 and faults[0]["kind"] == "device_lost", faults
    assert 0 < faults[0]["at_token"] < N
    assert result["stats"]["adapter"] == info["adapter"]
    again = run(page, PROMPT, {"draft": "none", "max_tokens": 4})
    assert again["stats"]["adapter"] == info["adapter"] and again["receipt"]["faults"] == []


# Prepended to worker.js: a browser whose WebGPU gives no adapter (as when the GPU is blocklisted).
NO_ADAPTER = "GPU.prototype.requestAdapter = async () => null;\n"


def test_no_adapter_falls_back_to_the_cpu_with_the_reason(browser, site_url, tiny_path):
    c = Context(browser, site_url)

    def worker_without_adapter(route):
        response = route.fetch()   # keeps its headers: COEP must hold for the worker too
        route.fulfill(response=response, body=NO_ADAPTER + response.text())

    c.ctx.route("**/worker.js", worker_without_adapter)
    try:
        page = c.page("index.html?model=tiny")
        info = ready(page)
        assert info["adapter"] == "cpu-numpy"
        assert "no adapter" in info["fallback"]
        result = run(page, PROMPT, {"draft": "ngram", "k": "fixed:3", "max_tokens": 8})
        assert result["stats"]["adapter"] == "cpu-numpy"
        assert result["receipt"]["fallbacks"] == [{"kind": "no_webgpu", "adapter": "cpu-numpy"}]
        assert result["tokens"] == native_generate(tiny_path, MESSAGES, "none", max_tokens=8).tokens
    finally:
        c.ctx.close()
    assert not c.offsite, f"requests to other origins: {c.offsite}"


_COMPILE = """async ([sources, limitKeys]) => {
  const adapter = await navigator.gpu.requestAdapter();
  const requiredLimits = Object.fromEntries(limitKeys.map((k) => [k, adapter.limits[k]]));
  const device = await adapter.requestDevice({ requiredLimits });
  const errors = {};
  for (const [name, [code, entries]] of Object.entries(sources)) {
    const module = device.createShaderModule({ code, label: name });
    const info = await module.getCompilationInfo();
    const found = info.messages.filter((m) => m.type === "error")
      .map((m) => `${m.lineNum}:${m.linePos} ${m.message}`);
    for (const entryPoint of entries) {
      device.pushErrorScope("validation");
      device.createComputePipeline({ layout: "auto", compute: { module, entryPoint } });
      const e = await device.popErrorScope();
      if (e) found.push(`${entryPoint}: ${e.message}`);
    }
    if (found.length) errors[name] = found;
  }
  device.destroy();
  return errors;
}"""


def test_every_shader_compiles_in_the_browser(gpu_page):
    """Chromium's WGSL compiler accepts every shader module and entry point that wgpu-native's
    does, including those the page does not run on a software adapter (a draft model's cycles fed
    on the device, shaders/ahead.wgsl, are for GPUs), with the limits the page asks for."""
    import re

    from pyspec.gpu import browser
    from pyspec.gpu.device import load_shader, shader_dir

    sources = {}
    for path in sorted(shader_dir().glob("*.wgsl")):
        code = load_shader(path.stem)
        entries = re.findall(r"@compute[^\n]*\n\s*fn (\w+)", code)
        assert len(entries) == code.count("@compute"), path.name
        if entries:   # else a fragment others include (step, rng, categorical): compiled there
            sources[path.stem] = [code, entries]
    assert sources["ahead"][1] == ["advance"] and len(sources) >= 10
    page, _ = gpu_page
    assert page.evaluate(_COMPILE, [sources, list(browser._LIMITS)]) == {}
