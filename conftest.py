"""What every test directory shares: PYSPEC_REQUIRE, which turns a missing part of the machine from
a skip into a failure.

`PYSPEC_REQUIRE=gpu,browser,llama` (CI sets it in .ci/run) says that this machine must have a
native WebGPU adapter (`gpu`: wgpu-py finds one, lavapipe on CI), Chromium with a WebGPU adapter
(`browser`) and llama.cpp's oracle files (`llama`: its test vocabularies and chat templates, which
`build.py setup` unpacks into .cache/llama.cpp/); `dawn` asks for an adapter that Dawn in Node
accepts (a hardware GPU: e2e/test_dawn.py), which CI's lavapipe is not. A test that needs a part
asks the `need` fixture: `need("gpu", why)` fails the test when the part is required, and skips
it, with the reason, when it is not; the `llama_fixtures` fixture asks for `llama`. Without the
variable these tests skip where their part is missing, as on a developer's laptop.
"""

from __future__ import annotations

import os
import pathlib

import pytest

PARTS = ("gpu", "browser", "dawn", "llama")
LLAMA_FIXTURES = pathlib.Path(__file__).resolve().parent / ".cache" / "llama.cpp"


def required() -> set[str]:
    """The parts PYSPEC_REQUIRE names; an unknown name is an error, not a silent no-op."""
    names = {n.strip() for n in os.environ.get("PYSPEC_REQUIRE", "").split(",") if n.strip()}
    unknown = names - set(PARTS)
    if unknown:
        raise pytest.UsageError(f"PYSPEC_REQUIRE names {sorted(unknown)}; the parts are "
                                f"{', '.join(PARTS)}")
    return names


def need(part: str, reason: str) -> None:
    """The missing `part` fails the test if PYSPEC_REQUIRE names it, else skips it."""
    if part not in PARTS:
        raise ValueError(f"unknown part {part!r}")
    if part in required():
        pytest.fail(f"{reason} (PYSPEC_REQUIRE={os.environ['PYSPEC_REQUIRE']} requires "
                    f"{part!r})", pytrace=False)
    pytest.skip(reason)


def pytest_configure(config):
    required()


@pytest.fixture(name="need", scope="session")
def need_fixture():
    return need


def need_llama(folder: pathlib.Path) -> pathlib.Path:
    """`folder`, if it holds llama.cpp's oracle files; else the `llama` part is missing. A file
    that setup left out of a folder it filled fails the test that opens it, never skips."""
    if not (folder / "ggml-vocab-gpt-2.gguf").exists():
        need("llama", f"llama.cpp's test vocabularies and templates are not in {folder}: run "
                      "`python3 build.py setup` (it unpacks them from the pinned "
                      "llama-cpp-python sdist)")
    return folder


@pytest.fixture(name="need_llama", scope="session")
def need_llama_fixture():
    return need_llama


@pytest.fixture(scope="session")
def llama_fixtures() -> pathlib.Path:
    """Request it to need llama.cpp's oracle files; it gives their folder."""
    return need_llama(LLAMA_FIXTURES)


@pytest.fixture(scope="session")
def gpu():
    """Request it (or mark a test `usefixtures("gpu")`) to need a native WebGPU adapter."""
    from pyspec.gpu import native

    if not native.available():
        need("gpu", "no native WebGPU adapter: install wgpu==0.32.0 and a Vulkan driver "
                    "(Debian: mesa-vulkan-drivers, for lavapipe)")
