"""Rewrite a draft GGUF so that it borrows tensors from its champion instead of holding them.

    python train/borrow.py --draft D.gguf --champion C.gguf --out OUT.gguf [--tensors token_embd.weight]

Every other tensor is copied byte for byte. The borrowed tensors are read from the champion at
load time (pyspec/formats/gguf.py), bound by the sha256 of their bytes (compat.bind_borrowed), so the
draft's file holds only what it does not share. The draft then reads the champion's own tensor:
for this champion's token embedding that is Q8_0 where a draft distilled with a Q4_1 copy read
Q4_1, so the draft computes something slightly different and its acceptance must be measured
again (train/README.md).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyspec.formats import gguf, ggufwrite  # noqa: E402

_BORROWED_KEYS = (gguf.BORROWED_NAMES, gguf.BORROWED_TYPES, gguf.BORROWED_SHA256)


def borrow(draft: gguf.GGUFFile, champion: gguf.GGUFFile, names: list[str], out: str) -> None:
    """Write `draft` to `out` with the tensors `names` borrowed from `champion`."""
    for n in names:
        d, c = draft.tensor(n), champion.tensor(n)
        if d.shape != c.shape:
            raise SystemExit(f"{n}: the draft's is {d.shape}, the champion's {c.shape}")
    keep = {n: ggufwrite.RawTensor(draft.raw(n), t.shape, t.type_id)
            for n, t in draft.tensors.items() if n not in names}
    metadata = {k: v for k, v in draft.metadata.items()
                if k not in _BORROWED_KEYS and k != "general.alignment"}
    metadata.update(ggufwrite.borrowed_metadata(champion, names))
    metadata["pyspec.borrowed.from_champion_sha256"] = champion.sha256()
    ggufwrite.write(out, metadata, keep, alignment=draft.alignment)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draft", required=True)
    ap.add_argument("--champion", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tensors", default="token_embd.weight",
                    help="comma-separated names of the tensors to borrow")
    args = ap.parse_args(argv)
    borrow(gguf.GGUFFile.open(args.draft), gguf.GGUFFile.open(args.champion),
           args.tensors.split(","), args.out)
    data = Path(args.out).read_bytes()
    print(f"{args.out}: {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
