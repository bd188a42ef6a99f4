"""Build the npm-packable runtime: dist/package/ and `npm pack`'s tarball beside it.

    dist/package/
      package.json    name "pyspec", ES module, exports "." (client.js + client.d.ts) and
                      "./worker.js"; no dependencies, so `npm install ./pyspec-X.tgz` is offline
      client.js client.d.ts worker.js and every module they load (runtime_files)
      manifest.json   the site's manifest without models
      pyodide/        Pyodide 0.27.7 core + its numpy wheel (as the site)
      wheels/         the pyspec wheel, jinja2 and a pure-Python MarkupSafe (as the site)
      LICENSES/       the licence text of pyspec and of everything bundled, with an index
      README.md       for web developers: install, serve, the Content-Security-Policy, weights

It is the site (site.py) minus the demo page and the weights: a web app serves this folder (or
node_modules/pyspec/) as static files and gives the champion by URL, {url, sha256}, which the
worker resolves against its own location, so a path such as "/models/x.gguf" is the app's own
origin. Nothing is published; e2e/test_browser_package.py installs the tarball into a scratch app.

Not here: the site and its downloads (site.py), serving (serve.py).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from . import site

ROOT = site.ROOT
PACKAGE = ROOT / "dist" / "package"
# A module a web/*.js file loads: `import ... from "./x.js"`, `import("./x.js")` or
# `new URL("./x.js", import.meta.url)` (a worker's script).
_LOADS = re.compile(r'(?:from |import\(|new URL\()\s*"\./([\w.-]+\.js)"')


def runtime_files(web: Path = ROOT / "web") -> tuple[str, ...]:
    """client.js, client.d.ts, worker.js and every web/ module they load, directly or not."""
    found, todo = [], ["client.js", "worker.js"]
    while todo:
        name = todo.pop(0)
        if name not in found:
            found.append(name)
            todo += _LOADS.findall((web / name).read_text())
    return ("client.d.ts", *sorted(found))


RUNTIME_FILES = runtime_files()

# The Content-Security-Policy the runtime needs, and no more: Pyodide compiles WebAssembly
# ('wasm-unsafe-eval'); the worker, its module imports, the wheels and the weights all come from
# the app's origin. The README states it and the e2e test serves a page under exactly it.
CSP = ("default-src 'self'; script-src 'self' 'wasm-unsafe-eval'; worker-src 'self'; "
       "connect-src 'self'; img-src 'self' data:; style-src 'self'")

# Licences: (component, SPDX id, where its text comes from). Pyodide's npm package names its
# licence in package.json but ships no text, so that text comes from Debian's common-licenses;
# CPython's (inside pyodide.asm.wasm and python_stdlib.zip) from the build machine's Python.
SYSTEM_LICENSES = (("Pyodide 0.27.7", "MPL-2.0", "/usr/share/common-licenses/MPL-2.0"),
                   ("pyspec", "Apache-2.0", "/usr/share/common-licenses/Apache-2.0"))
PYTHON_LICENSE = ("CPython 3.12 (in Pyodide)", "PSF-2.0")


class PackageError(RuntimeError):
    """The package cannot be built; the message says what is missing."""


def version() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    return re.search(r'^version = "([^"]+)"', text, re.M).group(1)


def _licenses(out: Path, wheels: list[Path]) -> None:
    """LICENSES/: each bundled wheel's dist-info licence files, the system texts, an index."""
    out.mkdir()
    index = ["# Licences of what this package bundles", ""]
    for name, spdx, path in SYSTEM_LICENSES:
        if not Path(path).exists():
            raise PackageError(f"{path} is missing; install Debian's base-files (common-licenses)")
        dst = out / f"{name.split()[0]}-{spdx}.txt"
        shutil.copyfile(path, dst)
        index.append(f"- {name}: {spdx}, `{dst.name}`")
    python_license = Path(sys.base_prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "LICENSE.txt"
    if python_license.exists():
        shutil.copyfile(python_license, out / "CPython-PSF-2.0.txt")
        index.append(f"- {PYTHON_LICENSE[0]}: {PYTHON_LICENSE[1]}, `CPython-PSF-2.0.txt`")
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if ".dist-info/" in n
                     and re.search(r"/(licenses/)?(LICEN[CS]E|COPYING)[^/]*$", n)]
            dist = wheel.name.split("-")[0]
            for n in names:
                dst = out / f"{dist}-{Path(n).name}"
                dst.write_bytes(z.read(n))
                index.append(f"- {wheel.name}: `{dst.name}`")
    (out / "README.md").write_text("\n".join(index) + "\n")


def _readme(v: str) -> str:
    return f"""# pyspec {v}: exact speculative decoding in the browser

The runtime of pyspec as static files: `client.js` (the `SpecDecoder` and its OpenAI-style facade,
typed by `client.d.ts`), `worker.js` (Pyodide 0.27.7 in a Web Worker, WebGPU or numpy) and what the
worker loads (`pyodide/`, `wheels/`, `manifest.json`). Everything comes from your origin: nothing
is fetched from a CDN.

## Install and serve

    npm install ./pyspec-{v}.tgz

Serve `node_modules/pyspec/` as static files with the rest of your app (any static host: no
COOP/COEP headers are needed). `.wasm` must be served as `application/wasm`.

`workerUrl` defaults to `worker.js` next to `client.js` (`new URL("./worker.js",
import.meta.url)`). A bundler that copies or pre-bundles `client.js` elsewhere (Vite's
dependency pre-bundling does) moves `import.meta.url` away from `worker.js` and its `pyodide/`:
give `workerUrl` as the URL where `node_modules/pyspec/worker.js` is served, as below, or
exclude the package from pre-bundling (Vite: `optimizeDeps.exclude: ["pyspec"]`).

```js
import {{ SpecDecoder }} from "./node_modules/pyspec/client.js";
const decoder = await SpecDecoder.create({{
  // sha256: the file's own, 64 hex digits (`sha256sum FILE`), or leave it out (no cache)
  champion: {{ url: "/models/SmolLM2-135M-Instruct.Q4_1.gguf" }},
  workerUrl: "/node_modules/pyspec/worker.js",
}});
const reply = await decoder.chat.completions.create({{
  messages: [{{ role: "user", content: "Hello" }}], max_tokens: 64,
}});
```

## Weights

The package holds no weights, and so no model names: `champion: "smollm2"` (the demo site's
name) is refused here with `unknown_model`. Give the champion (and a draft model, if any) by
URL; a relative URL resolves against the worker's location (`node_modules/pyspec/`), not your
page's, so give a path from your origin's root (`/models/...`) or a full URL. With a `sha256`
the download is checked, and the file is cached in the origin's private file system (OPFS)
under that hash. A model on another origin needs CORS there: `Access-Control-Allow-Origin` and
`Access-Control-Expose-Headers: Content-Range` (the model card reads the header by Range
requests).

## Content-Security-Policy

The runtime works under this policy (tested):

    {CSP}

`'wasm-unsafe-eval'` is what Pyodide needs to compile WebAssembly; nothing uses `eval`. If your
weights come from another origin, add it to `connect-src`.

## Licences

pyspec is Apache-2.0. `LICENSES/` holds the licence of everything bundled (Pyodide: MPL-2.0;
CPython: PSF; numpy: BSD-3-Clause).
"""


def build(out: Path = PACKAGE, pack: bool = True) -> Path:
    """Write the package folder; with `pack`, run `npm pack` and return the tarball's path."""
    with tempfile.TemporaryDirectory() as tmp:
        manifest = json.loads(site.build(Path(tmp), champion=False).read_text())
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        for name in RUNTIME_FILES:
            shutil.copyfile(Path(tmp) / name, out / name)
        shutil.copytree(Path(tmp) / "pyodide", out / "pyodide")
        shutil.copytree(Path(tmp) / "wheels", out / "wheels")
    # The weights stay out: the manifest keeps the runtime's artifacts, not the models (nor
    # the site's workload: measure() in an app takes the app's own sample).
    manifest["artifacts"] = [a for a in manifest["artifacts"]
                             if a["kind"] not in ("model", "draft-vocab", "workload")
                             and (a["kind"] != "web"
                                                          or a["url"] in RUNTIME_FILES)]
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    _licenses(out / "LICENSES", sorted((out / "pyodide").glob("*.whl"))
              + sorted((out / "wheels").glob("*.whl")))
    v = version()
    (out / "README.md").write_text(_readme(v))
    package = {
        "name": "pyspec", "version": v, "description":
        "Exact speculative decoding for small language models, in the browser (Pyodide + WebGPU)",
        "license": "Apache-2.0", "type": "module", "main": "./client.js", "types": "./client.d.ts",
        "exports": {".": {"types": "./client.d.ts", "default": "./client.js"},
                    "./worker.js": "./worker.js", "./package.json": "./package.json"},
        "files": [*RUNTIME_FILES, "manifest.json", "pyodide/", "wheels/", "LICENSES/"],
        "sideEffects": False,
    }
    (out / "package.json").write_text(json.dumps(package, indent=2) + "\n")
    if not pack:
        return out
    if shutil.which("npm") is None:
        raise PackageError("npm is not installed; install Debian's npm (or run with --no-pack)")
    done = subprocess.run(["npm", "pack", "--silent", "--pack-destination", str(out.parent)],
                          cwd=out, capture_output=True, text=True)
    if done.returncode != 0:
        raise PackageError(f"npm pack failed: {done.stderr.strip()}")
    tarball = out.parent / done.stdout.strip().splitlines()[-1]
    with tarfile.open(tarball) as t:   # npm pack's own check: what was packed is what we wrote
        if "package/pyodide/pyodide.asm.wasm" not in t.getnames():
            raise PackageError(f"{tarball} lacks pyodide/pyodide.asm.wasm")
    return tarball


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="build the npm-packable runtime into dist/package/")
    ap.add_argument("--out", type=Path, default=PACKAGE)
    ap.add_argument("--no-pack", action="store_true", help="write the folder only (no npm pack)")
    args = ap.parse_args(argv)
    try:
        path = build(args.out, pack=not args.no_pack)
    except (PackageError, site.SiteError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"package: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
