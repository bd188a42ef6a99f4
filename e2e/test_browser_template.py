"""A model's own chat template in the page: jinja2 and a pure-Python MarkupSafe ship in the site
(webtools/wheels.py) and render tiny-llama3's Llama-3-style template (testmodels.LLAMA3_STYLE) to
the native engine's prompt and output; a ChatML model never imports jinja2. One page load."""

from __future__ import annotations

import json

import pytest

from pyspec.formats.gguf import GGUFFile
from pyspec.text.tokenizer import Tokenizer

from .pageutil import native_generate, ready, run

pytestmark = pytest.mark.browser

# Spaces that the template's `trim` removes, and a control token's text, which stays text.
MESSAGES = [{"role": "user", "content": "  the cat <|im_end|> sat on the mat. the cat "}]
_RELOAD = "async (options) => pyspecApp.decoder().reload(options)"
_STARTUP = "async () => pyspecApp.decoder().startup()"


def test_a_llama3_template_renders_in_the_page_as_natively(context, site_root):
    manifest = json.loads((site_root / "manifest.json").read_text())
    shipped = {a["url"] for a in manifest["artifacts"] if a["kind"] == "wheel"}
    assert shipped == {"wheels/jinja2-3.1.6-py3-none-any.whl",
                       "wheels/markupsafe-3.0.4-py3-none-any.whl"}
    page = context.page("index.html?model=tiny")
    ready(page)
    assert run(page, MESSAGES[0]["content"], {"max_tokens": 4})["tokens"]
    chatml = page.evaluate(_STARTUP)["jinja2"]
    assert chatml == {"loaded": False, "first_render_ms": None}, "ChatML imported jinja2"
    assert any(u.endswith("/wheels/markupsafe-3.0.4-py3-none-any.whl") for u in context.requests)

    path = str(site_root / "models" / "tiny-llama3.gguf")
    prompt = Tokenizer.from_metadata(GGUFFile.open(path).metadata).encode_chat(MESSAGES)
    native = native_generate(path, MESSAGES, "none", max_tokens=24)
    page.evaluate(_RELOAD, {"champion": "tiny-llama3"})
    result = run(page, MESSAGES[0]["content"], {"draft": "none", "max_tokens": 24})
    assert result["stats"]["prompt_tokens"] == len(prompt)
    assert (result["tokens"], result["text"]) == (native.tokens, native.text)
    jinja2 = page.evaluate(_STARTUP)["jinja2"]
    assert jinja2["loaded"] and jinja2["first_render_ms"] > 0
    print(f"page: first Llama-3-style render {jinja2['first_render_ms']:.0f} ms")
