"""Drafts with other vocabularies, derived from a draft GGUF, to measure what a bridge costs.

    .venv/bin/python bench/foreign_drafts.py models/draft-l4.gguf OUT_DIR

writes three GGUFs with the same weights (dequantized and written again in their own formats):
- same.gguf: the champion's tokenizer ("identical"), the baseline;
- perm.gguf: every token id renamed, the embedding rows with them ("idmap");
- tli.gguf: the last quarter of the merges dropped with the tokens they made, so the vocabulary
  is a subset of the champion's and cuts text into more tokens ("tli").
Then `python -m pyspec bench --drafts OUT/same.gguf,OUT/perm.gguf,OUT/tli.gguf` compares them
side by side. A measurement helper, not part of the package: no real draft with another
tokenizer ships with pyspec.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyspec import champion_path  # noqa: E402
from pyspec.formats import gguf  # noqa: E402
from pyspec.drafters.pairing import bind_borrowed  # noqa: E402
from pyspec.text.bpe import TOKEN_NORMAL  # noqa: E402

SPECIAL_KEYS = ("bos", "eos", "unknown", "padding")
DROP_SHARE = 0.25   # tli: share of the merges dropped (the highest ranks)


def reindexed(md: dict, tensors: dict, rows: np.ndarray) -> tuple[dict, dict]:
    """Token j of the result is token rows[j] of the source (tokenizer and embedding rows)."""
    old_to_new = {int(old): new for new, old in enumerate(rows)}
    out = {**md, "tokenizer.ggml.tokens": [md["tokenizer.ggml.tokens"][i] for i in rows],
           "tokenizer.ggml.token_type": [md["tokenizer.ggml.token_type"][i] for i in rows],
           "llama.vocab_size": len(rows)}
    for key in SPECIAL_KEYS:
        k = f"tokenizer.ggml.{key}_token_id"
        if k in md:
            out[k] = old_to_new[md[k]]
    new = dict(tensors)
    for name in ("token_embd.weight", "output.weight"):
        if name in tensors:
            values, kind = tensors[name]
            new[name] = (values[rows], kind)           # (vocab', d)
    return out, new


def dropped_merges(md: dict) -> tuple[dict, np.ndarray]:
    """The tokenizer without its last DROP_SHARE of merges, and the token rows it keeps."""
    merges = md["tokenizer.ggml.merges"]
    keep = merges[:int(len(merges) * (1 - DROP_SHARE))]
    made = {m.replace(" ", "", 1) for m in merges[len(keep):]}
    made -= {m.replace(" ", "", 1) for m in keep}
    tokens, types = md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"]
    rows = np.array([i for i, (t, kind) in enumerate(zip(tokens, types))
                     if not (kind == TOKEN_NORMAL and len(t) > 1 and t in made)])
    return {**md, "tokenizer.ggml.merges": keep}, rows


def main(src: str, out_dir: str) -> None:
    f = gguf.GGUFFile.open(src)
    # A draft that borrows the champion's embedding gets its own copy here: another vocabulary
    # reorders or drops the rows, so the foreign drafts cannot borrow them.
    bind_borrowed(f, gguf.GGUFFile.open(champion_path()))
    md = {k: v for k, v in f.metadata.items() if not k.startswith("pyspec.borrowed.")}
    tensors = {name: (f.dequantize(name), f.tensor(name).type_id)
               for name in [*f.tensors, *f.borrowed]}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = len(md["tokenizer.ggml.tokens"])
    perm = np.random.default_rng(0).permutation(vocab)
    tli_md, tli_rows = dropped_merges(md)
    for name, (m, t) in {"same": (md, tensors),
                         "perm": reindexed(md, tensors, perm),
                         "tli": reindexed(tli_md, tensors, tli_rows)}.items():
        gguf.write(out / f"{name}.gguf", m, t)
        print(f"{out / name}.gguf: vocabulary {len(m['tokenizer.ggml.tokens'])}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
