"""The commands README.md and docs/ show, run: every `python -m pyspec ...` line of their ```sh
blocks is found here, and each cheap one runs as written (with `--max-tokens 4`, and the
placeholders A.gguf, B.gguf, MODEL.gguf and receipt.json given real files) and must exit 0; the
costly ones (bench, gate, demo, chat) are named with the reason they do not run, and every
command's `--help` runs instead. Also: the example files the commands read (docs/examples/) are
what the commands take. About 15 s on two cores: the champion loads on the numpy engine."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pyspec import champion_path, trained_draft_path
from pyspec.apps import cli

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROGRAMS = ((".venv/bin/python", "-m", "pyspec"), ("python", "-m", "pyspec"),
            ("python3", "-m", "pyspec"), (".venv/bin/pyspec",), ("pyspec",))

# What a command does not run for, by its subcommand (or subcommand and action).
COSTLY = {"bench": "runs the workload's prompts side by side: minutes",
          "gate": "runs a sample of the workload: minutes",
          "demo": "decodes one prompt 8 times, timed",
          "chat": "reads stdin until it ends",
          ("verdicts", "show"): "needs a recorded verdict of that name",
          ("verdicts", "clear"): "needs a recorded verdict of that name (--all runs)"}
# Models the pages name as the reader's own, which the repository does not ship.
THEIR_OWN = {"qwen2.5.gguf"}


def doc_commands() -> list[tuple[str, list[str]]]:
    """(page, argv after the program) for every pyspec command in a ```sh block."""
    found = []
    for page in PAGES:
        for body in re.findall(r"```sh\n(.*?)```", page.read_text(), re.S):
            for line in body.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                for prog in PROGRAMS:
                    if tuple(words[:len(prog)]) == prog:
                        found.append((page.name, words[len(prog):]))
                        break
    return found


def why_not(argv: list[str]) -> str | None:
    """Why a command is not run here (None: it runs)."""
    action = (argv[0], argv[1]) if len(argv) > 1 else None
    if argv[:3] == ["verdicts", "clear", "--all"]:
        return None        # (the test's own verdict file)
    if argv[0] in COSTLY or action in COSTLY:
        return COSTLY.get(argv[0]) or COSTLY[action]
    if THEIR_OWN & set(argv):
        return "names a model of the reader's own"
    return None


def runnable(argv: list[str], files: dict[str, str]) -> list[str]:
    """argv made cheap: placeholders given files, generate cut to 4 tokens."""
    argv = [files.get(a, a) for a in argv]
    if argv[0] == "generate":
        if "--max-tokens" in argv:
            argv[argv.index("--max-tokens") + 1] = "4"
        else:
            argv += ["--max-tokens", "4"]
    return argv


def run(argv: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pyspec", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """No verdict of the user's own steers `--draft auto`; numpy on one thread a process."""
    tmp = tmp_path_factory.mktemp("doc-commands")
    return {**os.environ, "PYSPEC_VERDICTS": str(tmp / "verdicts.json"),
            "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def files(env, tmp_path_factory):
    """The placeholders' files: the champion, the shipped draft, and a receipt made here."""
    out = run(["generate", "--prompt", "Hi", "--max-tokens", "2", "--json"], env)
    assert out.returncode == 0, out.stderr
    receipt = tmp_path_factory.mktemp("receipt") / "receipt.json"
    receipt.write_text(json.dumps(json.loads(out.stdout)["receipt"]))
    return {"MODEL.gguf": str(champion_path()), "A.gguf": str(champion_path()),
            "B.gguf": str(trained_draft_path()), "receipt.json": str(receipt)}


def test_the_pages_show_commands_of_every_cheap_kind():
    kinds = {argv[0] for _, argv in doc_commands() if why_not(argv) is None}
    assert {"generate", "tokenize", "detokenize", "score", "check-pair", "info", "receipt",
            "verdicts"} <= kinds


def test_every_command_the_pages_show_is_a_command():
    commands = set(cli.parser()._subparsers._group_actions[0].choices)
    for page, argv in doc_commands():
        assert argv and argv[0] in commands, f"{page}: pyspec {' '.join(argv)}"


def test_the_cheap_commands_run(env, files):
    failed = []
    for page, argv in doc_commands():
        if why_not(argv) is None:
            out = run(runnable(argv, files), env)
            if out.returncode != 0:
                failed.append(f"{page}: pyspec {shlex.join(argv)}: exit {out.returncode}\n"
                              f"{out.stderr[-600:]}")
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("name", sorted(cli.parser()._subparsers._group_actions[0].choices))
def test_every_commands_help(name, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main([name, "--help"])
    assert done.value.code == 0
    assert f"pyspec {name}" in capsys.readouterr().out


def test_the_files_the_commands_read_are_shipped():
    """Every .json or .gguf a command names is in the repository, a placeholder or the
    reader's own model."""
    placeholders = {"MODEL.gguf", "A.gguf", "B.gguf", "receipt.json"} | THEIR_OWN
    for page, argv in doc_commands():
        for arg in argv:
            if arg.endswith((".json", ".jsonl", ".gguf")) and arg not in placeholders:
                assert (ROOT / arg).is_file(), f"{page}: pyspec {' '.join(argv)}: {arg}"


def test_the_example_tools_are_a_tools_list_the_options_take():
    """docs/examples/tools.json (whose command needs a model with a tools template)."""
    from pyspec.apps.request import read_tools
    from pyspec.options import Options

    tools = read_tools(str(ROOT / "docs" / "examples" / "tools.json"))
    Options(tools=tools).check()
    assert [t["function"]["name"] for t in tools] == ["get_weather"]
