"""A draft that borrows tensors from its champion (gguf.py, compat.bind_borrowed).

The shipped draft holds its layers only and reads the champion's token embedding (its tied
head) from the champion's file. Here a tiny draft is written twice: once holding a byte copy of
the tiny champion's embedding, once borrowing it. Bound to that champion, the borrowing one must
compute bit for bit what the copy computes, on numpy and on native WebGPU (where it reads the
champion's own buffer, uploaded once), draft exactly as often, and leave output identical to
champion-only. Bound to any other champion, or read on its own, it must say what to do.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest

from pyspec import testmodels
from pyspec.apps import cli
from pyspec.cpu.model import Model, ModelError
from pyspec.drafters.pairing import IncompatiblePairError, bind_borrowed
from pyspec.engine import Engine
from pyspec.formats import gguf, ggufwrite, quant
from pyspec.formats.gguf import GGUFError, GGUFFile
from pyspec.load import backend as backend_for
from pyspec.load import load_draft_checked
from pyspec.options import Options

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "train"))
from borrow import borrow  # noqa: E402  (train/borrow.py: rewrites a draft to borrow)

EMBD = "token_embd.weight"


@pytest.fixture(scope="module")
def drafts(tiny, tmp_path_factory):
    """(copy, borrowing) paths: one layer of the tiny champion perturbed, its final norm, and its
    embedding as a tied head, held as a byte copy or borrowed."""
    root = tmp_path_factory.mktemp("borrow")
    champion = GGUFFile.open(tiny.champion_path)
    noisy = testmodels.perturb({n: champion.dequantize(n) for n in champion.tensors
                                if n.startswith("blk.1.")}, 0.1, 5)
    weights = {n.replace("blk.1.", "blk.0."): v for n, v in noisy.items()}
    weights["output_norm.weight"] = champion.dequantize("output_norm.weight")
    borrowing = str(root / "borrowing.gguf")
    testmodels.write_borrowing_draft(borrowing, tiny.champion_path, weights, n_layers=1)
    f = GGUFFile.open(borrowing)
    t = champion.tensor(EMBD)
    copy = str(root / "copy.gguf")
    md = {k: v for k, v in f.metadata.items() if not k.startswith("pyspec.borrowed.")}
    ggufwrite.write(copy, md, {n: ggufwrite.RawTensor(f.raw(n), f.tensor(n).shape, f.tensor(n).type_id)
                          for n in f.tensors}
               | {EMBD: ggufwrite.RawTensor(champion.raw(EMBD), t.shape, t.type_id)})
    return copy, borrowing


def bound(path: str, champion_path: str) -> GGUFFile:
    f = GGUFFile.open(path)
    bind_borrowed(f, GGUFFile.open(champion_path))
    return f


def test_the_borrowing_file_holds_no_embedding_and_names_the_bytes(tiny, drafts):
    copy, borrowing = drafts
    f = GGUFFile.open(borrowing)
    champion = GGUFFile.open(tiny.champion_path)
    assert EMBD not in f.tensors and f.has(EMBD)
    assert f.borrowed[EMBD].sha256 == hashlib.sha256(champion.raw(EMBD)).hexdigest()
    assert f.borrowed[EMBD].type_id == quant.Q8_0.type_id
    shrink = Path(copy).stat().st_size - Path(borrowing).stat().st_size
    assert shrink >= champion.tensor(EMBD).nbytes - 256    # less the borrowing's metadata


def test_read_on_its_own_it_says_to_load_it_beside_its_champion(drafts):
    _, borrowing = drafts
    with pytest.raises(GGUFError, match="borrowed from the champion"):
        GGUFFile.open(borrowing).tensor(EMBD)
    with pytest.raises(ModelError, match="load the file as a draft with that champion"):
        Model.load(borrowing)


def test_bound_it_reads_the_champions_bytes_and_computes_what_the_copy_computes(tiny, drafts):
    copy, borrowing = drafts
    f = bound(borrowing, tiny.champion_path)
    assert np.array_equal(f.raw(EMBD), GGUFFile.open(copy).raw(EMBD))
    a, b = Model(GGUFFile.open(copy)), Model(f)
    tokens = tiny.prompt
    la = a.forward(tokens, a.new_cache(len(tokens)))
    lb = b.forward(tokens, b.new_cache(len(tokens)))
    assert np.array_equal(la.view(np.uint32), lb.view(np.uint32))


def test_another_champion_is_refused(tiny, drafts, tmp_path):
    _, borrowing = drafts
    other = str(tmp_path / "other.gguf")
    testmodels.write_model(other, seed=2)          # same shape and tokenizer, other bytes
    with pytest.raises(IncompatiblePairError, match="other bytes"):
        bind_borrowed(GGUFFile.open(borrowing), GGUFFile.open(other))
    f32 = str(tmp_path / "f32.gguf")                 # the same values in another type
    testmodels.write_model(f32, seed=1, embd_type=quant.F32.type_id)
    with pytest.raises(IncompatiblePairError, match="other bytes"):
        bind_borrowed(GGUFFile.open(borrowing), GGUFFile.open(f32))
    # a champion that itself borrows lends nothing
    with pytest.raises(IncompatiblePairError, match="no such tensor"):
        bind_borrowed(GGUFFile.open(borrowing), GGUFFile.open(borrowing))
    # and the loaders say so before loading anything
    with pytest.raises(IncompatiblePairError):
        load_draft_checked(Model.load(other))(borrowing)


def test_malformed_borrow_entries_are_gguf_errors(tiny, tmp_path):
    md = testmodels.tokenizer_metadata()
    good = ggufwrite.borrowed_metadata(GGUFFile.open(tiny.champion_path), [EMBD])
    cases = {
        "lengths": {**good, gguf.BORROWED_TYPES: []},
        "short hash": {**good, gguf.BORROWED_SHA256: ["ab"]},
        "unknown type": {**good, gguf.BORROWED_TYPES: [999]},
        "held and borrowed": {**good},
    }
    for name, extra in cases.items():
        path = tmp_path / f"{name}.gguf"
        tensors = {EMBD: (np.zeros((4, 32), np.float32), quant.F32.type_id)} \
            if name == "held and borrowed" else {"x": (np.zeros(32, np.float32), quant.F32.type_id)}
        ggufwrite.write(path, {**md, **extra}, tensors)
        with pytest.raises(GGUFError):
            GGUFFile.open(path)


def test_raw_tensors_are_written_byte_for_byte_and_checked(tmp_path):
    rng = np.random.default_rng(3)
    packed = quant.quantize(rng.standard_normal((2, 64)).astype(np.float32), quant.Q4_1.type_id)
    raw = np.frombuffer(packed.tobytes(), np.uint8)
    path = tmp_path / "raw.gguf"
    ggufwrite.write(path, {}, {"w": ggufwrite.RawTensor(raw, (2, 64), quant.Q4_1.type_id)})
    assert np.array_equal(GGUFFile.open(path).raw("w"), raw)
    with pytest.raises(ValueError, match="bytes"):
        ggufwrite.write(path, {}, {"w": ggufwrite.RawTensor(raw[:-1], (2, 64), quant.Q4_1.type_id)})


def test_train_borrow_rewrites_a_draft_that_computes_the_same(tiny, drafts, tmp_path):
    copy, borrowing = drafts
    out = str(tmp_path / "rewritten.gguf")
    borrow(GGUFFile.open(copy), GGUFFile.open(tiny.champion_path), [EMBD], out)
    f = bound(out, tiny.champion_path)
    assert set(f.tensors) == set(GGUFFile.open(borrowing).tensors)
    for n in f.tensors:
        assert np.array_equal(f.raw(n), GGUFFile.open(copy).raw(n)), n
    assert f.metadata["pyspec.borrowed.from_champion_sha256"] == \
        GGUFFile.open(tiny.champion_path).sha256()


def run_both(tiny, drafts, backend: str) -> list:
    """Greedy runs with no draft, the copy and the borrowing draft: (tokens, stats) each."""
    out = []
    champion = tiny.on(backend)
    for draft in ("none", *drafts):
        engine = Engine(backend_for(champion, draft), tiny.tokenizer)
        r = engine.generate(tiny.prompt, Options(max_tokens=12, k="fixed:3"))
        out.append((r.tokens, r.stats))
    return out


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_greedy_with_the_borrowing_draft_equals_champion_only_and_the_copy(tiny, drafts, backend,
                                                                          request):
    if backend == "gpu":
        request.getfixturevalue("gpu")
    (alone, _), (with_copy, s_copy), (with_borrow, s_borrow) = run_both(tiny, drafts, backend)
    assert with_borrow == with_copy == alone
    assert s_borrow["drafted"] == s_copy["drafted"] > 0
    assert s_borrow["accepted"] == s_copy["accepted"]


def test_on_the_gpu_the_draft_reads_the_champions_buffer(tiny, drafts, gpu):
    from pyspec.gpu import load_model

    copy, borrowing = drafts
    champion = tiny.on("gpu")
    draft = load_model(champion.dev, bound(borrowing, tiny.champion_path), 64, "draft", champion)
    held = load_model(champion.dev, GGUFFile.open(copy), 64, "draft")
    assert draft.tok_embd is champion.tok_embd and draft.head is champion.tok_embd
    assert held.weight_bytes - draft.weight_bytes == champion.tok_embd.nbytes


def test_check_pair_names_the_borrowed_tensor_or_refuses(tiny, drafts, tmp_path, capsys):
    _, borrowing = drafts
    assert cli.main(["check-pair", "--champion", tiny.champion_path, "--draft", borrowing]) == 0
    assert "borrows token_embd.weight from this champion" in capsys.readouterr().out
    other = str(tmp_path / "other.gguf")
    testmodels.write_model(other, seed=2)
    assert cli.main(["check-pair", "--champion", other, "--draft", borrowing]) == 1
    assert "NOT compatible" in capsys.readouterr().out
