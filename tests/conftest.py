"""Shared fixtures: tiny random GGUF models written by pyspec itself (pyspec/testmodels.py)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from pyspec import testmodels
from pyspec.cpu.model import Model
from pyspec.text.tokenizer import Tokenizer

# Tests run bench and gate from whatever the checkout holds, often uncommitted work: their files
# say so ("dirty_allowed": "pytest"); tests/test_provenance.py checks the refusal without it.
os.environ.setdefault("PYSPEC_ALLOW_DIRTY", "pytest")


class Tiny:
    """A tiny champion plus related drafts, all sharing one tokenizer."""

    def __init__(self, root):
        self.champion_path = str(root / "champion.gguf")
        weights = testmodels.write_model(self.champion_path, seed=1)
        self.close_path = str(root / "close.gguf")      # champion + small noise: high acceptance
        testmodels.write_model(self.close_path, weights=testmodels.perturb(weights, 0.04, 7))
        self.far_path = str(root / "far.gguf")          # an unrelated small model, same tokenizer
        testmodels.write_model(self.far_path, seed=99, n_layers=1, d=32, n_heads=2, n_kv=1,
                               d_ff=64)
        self.champion = Model.load(self.champion_path)
        self.tokenizer = Tokenizer.from_metadata(self.champion.metadata)
        self.prompt = self.tokenizer.encode(self.tokenizer.render_chat(
            [{"role": "user", "content": "the cat sat on the mat. the cat"}]), special=True)
        self._gpu = None
        self._fast = None

    def on(self, backend: str):
        """The champion for a backend: the numpy Model ("cpu"), the row-at-a-time FastModel
        ("fastcpu", pyspec/cpu/fastcpu.py) or a GPUModel ("gpu")."""
        if backend == "cpu":
            return self.champion
        if backend == "fastcpu":
            if self._fast is None:
                from pyspec.cpu.fastcpu import FastModel
                self._fast = FastModel.load(self.champion_path)
            return self._fast
        if self._gpu is None:
            from pyspec.formats.gguf import GGUFFile
            from pyspec.gpu import load_model
            self._gpu = load_model(gpu_device(), GGUFFile.open(self.champion_path))
        return self._gpu


_DEVICE = []


def gpu_device():
    """One native WebGPU device for the whole session."""
    if not _DEVICE:
        from pyspec.gpu import open_device
        _DEVICE.append(open_device())
    return _DEVICE[0]


# A test that needs a native WebGPU adapter: skipped without one, failed when PYSPEC_REQUIRE
# names gpu (the root conftest.py).
requires_gpu = pytest.mark.usefixtures("gpu")
# Backends for tests parametrised over every one: the GPU case skips only where no adapter exists.
BACKENDS = ["cpu", "fastcpu", "gpu"]


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    if request.param == "gpu":
        request.getfixturevalue("gpu")
    return request.param


@pytest.fixture(scope="session")
def champion_gguf_pair():
    """The champion GGUF read by pyspec and by the reference `gguf` package."""
    import gguf as gguf_ref

    from pyspec import champion_path
    from pyspec.formats.gguf import GGUFFile

    path = champion_path()
    return GGUFFile.open(path), gguf_ref.GGUFReader(path)


@pytest.fixture(scope="session", autouse=True)
def no_user_verdicts(tmp_path_factory):
    """`auto` follows recorded gate verdicts (pyspec/verdicts.py): the tests read their own
    file, absent unless a test writes one, never the user's cache."""
    import os

    os.environ["PYSPEC_VERDICTS"] = str(tmp_path_factory.mktemp("verdicts") / "verdicts.json")


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> Tiny:
    return Tiny(tmp_path_factory.mktemp("tiny"))


def reference_decode(model: Model, prompt: list[int], n: int, pick) -> list[int]:
    """Champion-only decoding written as plainly as possible: prefill the whole prompt in one
    pass, then one token per pass. `pick(logits (vocab,), position) -> token`."""
    kv = model.new_cache()
    logits = model.forward(prompt, kv)[-1]
    kv.commit(len(prompt))
    out = []
    for i in range(n):
        token = int(pick(logits, len(prompt) + i))
        out.append(token)
        logits = model.forward([token], kv)[-1]
        kv.commit(1)
    return out


def greedy_pick(logits, position):
    return int(np.argmax(logits))


class Foreign:
    """Drafts for the tiny champion with other vocabularies (compat.py's classes): `perm_path`,
    the champion + 4% noise with every token id renamed ("idmap"), and `tli_path`, the same noisy
    model carried over to a vocabulary with extra and missing tokens ("tli"; tokens only it has
    get random rows, weak in the head)."""

    def __init__(self, tiny: Tiny, root):
        from pyspec.drafters.pairing import make_bridge
        weights = testmodels.perturb(testmodels.random_weights(tiny.champion.config.vocab_size,
                                                               2, 64, 4, 2, 128, seed=1), 0.04, 7)
        self.perm_path = str(root / "perm.gguf")
        md, permuted = testmodels.permute(testmodels.tokenizer_metadata(), weights, seed=3)
        testmodels.write_model(self.perm_path, tokenizer=md, weights=permuted)
        self.tli_path = str(root / "tli.gguf")
        md = testmodels.foreign_tokenizer()
        rows = make_bridge(Tokenizer.from_metadata(md), tiny.tokenizer).to_draft  # (draft vocab,)
        testmodels.write_model(self.tli_path, tokenizer=md,
                               weights=testmodels.reindex(weights, rows, seed=5, head_gain=0.3))


@pytest.fixture(scope="session")
def foreign(tiny, tmp_path_factory) -> Foreign:
    return Foreign(tiny, tmp_path_factory.mktemp("foreign"))
