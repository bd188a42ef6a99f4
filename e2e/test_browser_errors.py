"""Errors a user can cause show a visible message in the page (#error, role=alert), never a hang.
(A prompt over the context is in test_browser_tiny.py, on the already loaded page.)"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser


@pytest.mark.parametrize("query, code, words", [
    ("model=models/nope.gguf", "download_failed", "404"),
    ("model=nope", "unknown_model", "tiny"),
    ("model=tiny&draft=tiny-mismatch", "incompatible_draft", "tokenizer"),
])
def test_visible_error(context, query, code, words):
    page = context.page(f"index.html?{query}")
    error = page.locator("#error")
    error.wait_for(state="visible", timeout=240_000)
    assert error.get_attribute("data-code") == code
    assert words in error.text_content()
    assert page.locator("#send").is_disabled()
