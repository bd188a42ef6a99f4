"""build.py's parts that run without installing anything: the `pyspec` command setup writes
into the venv from pyproject.toml's [project.scripts], and setup's output kept off stdout (a
command's stdout is its own: `build.py demo --headless --json` prints JSON alone there)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pyspec

ROOT = Path(__file__).resolve().parent.parent


def load_build():
    spec = importlib.util.spec_from_file_location("build_py", ROOT / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_setup_writes_a_working_pyspec_command(tmp_path):
    build = load_build()
    assert build.console_scripts() == {"pyspec": "pyspec.apps.cli:main"}
    (tmp_path / "bin").mkdir()
    [path] = build.write_launchers(str(tmp_path), python=sys.executable)
    assert path == str(tmp_path / "bin" / "pyspec") and os.access(path, os.X_OK)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([path, "--version"], capture_output=True, text=True, env=env,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == f"pyspec {pyspec.__version__}"
    done = subprocess.run([path, "info", str(tmp_path / "nope.gguf")], capture_output=True,
                          text=True, env=env, timeout=60)
    assert done.returncode == 2 and "nope.gguf: no such file" in done.stderr
    before = os.stat(path).st_mtime_ns
    build.write_launchers(str(tmp_path), python=sys.executable)   # unchanged: left as it is
    assert os.stat(path).st_mtime_ns == before


def test_setup_steps_and_notes_go_to_stderr(capfd, monkeypatch):
    build = load_build()
    build.run([sys.executable, "-c", "print('from the step')"])
    monkeypatch.setattr(build.os, "geteuid", lambda: 1000)    # not root: a note, no apt-get
    build.apt_install(["pyspec-no-such-package"])
    out, err = capfd.readouterr()
    assert out == ""
    assert "+ " in err and "from the step" in err and "note: install pyspec-no-such-package" in err
