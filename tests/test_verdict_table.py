"""`python -m pyspec verdicts` (apps/verdict_table.py, verdicts.find/remove/clear): the table
listed, one shown, verdicts cleared by name or all, and named errors for a name that is not one;
and the note `generate`, `chat` and `demo` print when a recorded verdict chose their drafter.
Every test has its own verdict file (PYSPEC_VERDICTS), never the user's."""

from __future__ import annotations

import io
import json

import pytest

from pyspec import verdicts
from pyspec.apps import cli
from pyspec.apps.provenance import sha256_file


@pytest.fixture
def store(tmp_path, monkeypatch):
    path = tmp_path / "verdicts.json"
    monkeypatch.setenv("PYSPEC_VERDICTS", str(path))
    return path


def verdict(draft: str, word: str, champion: str = "c" * 64, median: float = 1.3,
            device: str = "cpu-numpy") -> dict:
    return verdicts.record(champion_sha256=champion, draft=draft, device_class=device,
                           verdict=word, speedup={"median": median, "low": 1.1, "high": 1.4},
                           rule_version=1, date="2026-12-05T00:00:00Z")


def run(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_list_names_the_file_and_each_verdict(store, capsys):
    code, out, _ = run(capsys, "verdicts")
    assert code == 0 and out.startswith(f"no verdicts in {store}:")
    table = [verdict("ngram", "keep off", median=0.97), verdict("d" * 64, "promote")]
    verdicts.save(table)
    code, out, _ = run(capsys, "verdicts", "list")
    assert code == 0 and out.startswith(f"2 verdicts in {store} (PYSPEC_VERDICTS")
    assert (f"  {table[0]['sha256'][:12]}  keep off ngram on cpu-numpy, speedup x0.970 "
            "[1.100, 1.400], gate run of 2026-12-05T00:00:00Z; champion cccccccccccc") in out
    assert f"  {table[1]['sha256'][:12]}  promote model dddddddddddd on cpu-numpy" in out
    code, out, _ = run(capsys, "verdicts", "--json")
    assert code == 0 and json.loads(out) == {"file": str(store), "verdicts": table}


def test_show_one_by_its_first_digits(store, capsys):
    off, on = verdict("ngram", "keep off"), verdict("ngram+" + "d" * 64, "promote")
    verdicts.save([off, on])
    code, out, _ = run(capsys, "verdicts", "show", off["sha256"][:6])
    assert code == 0 and f"sha256        {off['sha256']}" in out and f"file          {store}" in out
    assert "measured      by the gate run of 2026-12-05T00:00:00Z, rule version 1" in out
    assert ("auto          runs no drafter for this champion on cpu-numpy where today's rule "
            "would pick ngram") in out
    assert f"`python -m pyspec verdicts clear {off['sha256'][:12]}` removes it" in out
    code, out, _ = run(capsys, "verdicts", "show", on["sha256"].upper(), "--json")
    assert code == 0 and json.loads(out) == on
    code, out, _ = run(capsys, "verdicts", "show", on["sha256"])
    assert "auto          runs ngram+model dddddddddddd for this champion" in out


def test_clear_one_leaves_the_others(store, capsys):
    table = [verdict("ngram", "keep off"), verdict("self:1", "promote"), verdict("d" * 64,
                                                                                "promote")]
    verdicts.save(table)
    code, out, _ = run(capsys, "verdicts", "clear", table[0]["sha256"][:8], table[2]["sha256"])
    assert code == 0 and f"removed {table[0]['sha256'][:12]} (keep off ngram on " in out
    assert out.count("removed") == 2 and str(store) in out
    assert verdicts.load() == [table[1]]


@pytest.mark.parametrize("name, words", [
    ("0123456789ab", "no verdict 0123456789ab in {store} (3 there): `python -m pyspec verdicts` "
                     "lists them"),
    ("abc", "'abc' is not a verdict's name: give its sha256, or at least its first 4 hex "
            "digits"),
    ("ngram", "'ngram' is not a verdict's name"),
], ids=["unknown", "short", "not-hex"])
def test_an_unknown_name_is_an_error_and_nothing_is_removed(store, capsys, name, words):
    verdicts.save([verdict("ngram", "keep off"), verdict("self:1", "promote"),
                   verdict("self:2", "promote")])
    before = store.read_bytes()
    for action in ("show", "clear"):
        code, out, err = run(capsys, "verdicts", action, name)
        assert code == 2 and err.startswith(f"error: {words.format(store=store)}") and not out
    # one bad name among good ones: none is removed
    good = verdicts.load()[0]["sha256"]
    assert run(capsys, "verdicts", "clear", good, name)[0] == 2
    assert store.read_bytes() == before


def test_a_prefix_that_names_two_is_refused(store, capsys):
    seen: dict[str, dict] = {}     # verdicts until two share their first 4 digits
    while True:
        v = verdict(f"self:{len(seen) + 1}", "promote")
        if v["sha256"][:4] in seen:
            break
        seen[v["sha256"][:4]] = v
    verdicts.save([*seen.values(), v])
    before = store.read_bytes()
    code, _, err = run(capsys, "verdicts", "clear", v["sha256"][:4])
    assert code == 2 and f"{v['sha256'][:4]} names 2 verdicts in {store}" in err
    assert "give more of its sha256" in err and store.read_bytes() == before
    assert run(capsys, "verdicts", "clear", v["sha256"])[0] == 0     # all of it: one
    assert v not in verdicts.load() and seen[v["sha256"][:4]] in verdicts.load()


def test_clear_needs_a_name_or_all(store, capsys):
    verdicts.save([verdict("ngram", "keep off")])
    for argv in (["clear"], ["clear", "--all", "abcd"]):
        code, _, err = run(capsys, "verdicts", *argv)
        assert code == 2 and "name the verdicts to clear" in err and "--all" in err
    code, out, _ = run(capsys, "verdicts", "clear", "--all")
    assert code == 0 and f"removed 1 verdict: {store} is gone" in out and not store.exists()
    code, out, _ = run(capsys, "verdicts", "clear", "--all")
    assert code == 0 and out == f"no verdicts in {store}: nothing to clear\n"


def test_a_store_that_is_not_one_is_named_and_clear_all_removes_it(store, capsys):
    store.write_text("not json")
    code, _, err = run(capsys, "verdicts")
    assert code == 2 and err.startswith(f"error: {store}: not JSON")
    code, out, _ = run(capsys, "verdicts", "clear", "--all")
    assert code == 0 and "(it was not a verdict table)" in out and not store.exists()


# --- the note of a generation that a verdict chose ------------------------------------------
def kept_off(tiny) -> dict:
    """A keep-off verdict for n-gram, the drafter today's rule picks for tiny on the CPU."""
    v = verdict("ngram", "keep off", champion=sha256_file(tiny.champion_path), median=0.97)
    verdicts.save([v])
    return v


def note_of(v, store) -> str:
    name = v["sha256"][:12]
    return (f"note: no drafter: kept off by the recorded gate verdict {name} (keep off ngram on "
            "cpu-numpy, speedup x0.970 [1.100, 1.400], gate run of 2026-12-05T00:00:00Z) in "
            f"{store}; `python -m pyspec verdicts clear {name}` removes it, `--draft NAME` "
            "overrides it\n")


def test_generate_names_the_verdict_that_chose_its_drafter(tiny, store, capsys):
    args = ["generate", "--champion", tiny.champion_path, "--prompt", "the cat", "--max-tokens",
            "3"]
    code, _, err = run(capsys, *args)
    assert code == 0 and "note:" not in err                # no verdict: no note
    v = kept_off(tiny)
    code, _, err = run(capsys, *args)
    assert code == 0 and err.startswith(note_of(v, store)) and "drafter none" in err
    code, out, err = run(capsys, *args, "--json")
    assert code == 0 and err == note_of(v, store)
    assert json.loads(out)["receipt"]["draft"]["auto"]["verdict_sha256"] == v["sha256"]
    code, _, err = run(capsys, *args, "--draft", "ngram")  # a named drafter: no verdict chose
    assert code == 0 and "note:" not in err


def test_a_promoted_verdict_is_named_too(tiny, store, capsys):
    v = verdict("self:1", "promote", champion=sha256_file(tiny.champion_path))
    verdicts.save([v])
    code, _, err = run(capsys, "generate", "--champion", tiny.champion_path, "--prompt", "the",
                       "--max-tokens", "2")
    assert code == 0 and (f"note: drafter self:1, chosen by the recorded gate verdict "
                          f"{v['sha256'][:12]} (promote self:1 on cpu-numpy") in err


def test_chat_and_demo_name_it(tiny, store, capsys, monkeypatch):
    v = kept_off(tiny)
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\n"))
    code, _, err = run(capsys, "chat", "--champion", tiny.champion_path, "--max-tokens", "2")
    assert code == 0 and err.startswith(note_of(v, store))
    code, _, err = run(capsys, "demo", "--champion", tiny.champion_path, "--draft", "auto",
                       "--max-tokens", "2")
    assert code in (0, 1) and err.count("note:") == 1 and note_of(v, store) in err
    assert err.index("note:") < err.index("identical output")
