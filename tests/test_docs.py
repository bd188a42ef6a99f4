"""README.md, docs/ and bench/results/README.md kept true: the README's two commands and size, the
figures made from their result files (webtools/results.py), every link (and its #fragment) and
result file named, no pointer outside the repository, the layers as tests/test_layout.py has
them, and the sampling defaults as Options has them. tests/test_doc_commands.py runs the
commands the pages show."""

from __future__ import annotations

import re
from pathlib import Path

from pyspec.options import Options
from test_layout import LAYERS
from webtools import optionsjs, results

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
RESULTS = ROOT / "bench" / "results"


def block(path: Path, marker: str) -> str:
    """The text between `<!-- MARKER... -->` and `<!-- /MARKER -->` in a page."""
    found = re.search(rf"<!-- {marker}[^>]*-->\n(.*?)<!-- /{marker} -->", path.read_text(), re.S)
    assert found, f"{path.name} lost its <!-- {marker} --> block"
    return found.group(1)


def test_the_readme_is_a_front_door_with_the_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    assert 'python3 build.py demo --headless --prompt "Tell me about octopuses."' in text
    assert "\npython3 build.py test " in text


def test_the_figures_are_made_from_their_files():
    """Every block webtools/results.py makes is in its page as made (python -m webtools.results)."""
    made = results.blocks()
    assert ("README.md", "headline table") in made
    for (page, marker), text in made.items():
        assert block(ROOT / page, marker) == text, f"{page}: {marker}"


def anchors(page: Path) -> set[str]:
    """The #fragments a page has: GitHub's slug of each heading, and each <a id="...">."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    slugs: set[str] = set()
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = sum(s == slug or s.startswith(f"{slug}-") and s[len(slug) + 1:].isdigit()
                for s in slugs)
        slugs.add(f"{slug}-{n}" if n else slug)     # a repeated heading: -1, -2, ...
    return slugs | set(re.findall(r'<a id="([^"]+)">', text))


def test_every_link_and_named_result_file_exists():
    """Every relative link in README.md and docs/ (and bench/results/README.md) names a file of
    the repository, and a #fragment one of that page's headings."""
    for page in [README, *DOCS, RESULTS / "README.md"]:
        text = page.read_text()
        for target, fragment in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text):
            if target.startswith(("http:", "https:", "mailto:")):
                continue
            path = (page.parent / target) if target else page
            assert path.exists(), f"{page.name} links to {target}"
            if fragment and path.suffix == ".md":
                assert fragment in anchors(path), f"{page.name} links to {target}#{fragment}"
        for name in re.findall(r"bench/results/([\w.-]+\.(?:json|png))(?!` at)", text):
            assert (RESULTS / name).exists(), f"{page.name} names bench/results/{name}"


def test_no_page_points_outside_the_repository():
    """README.md and docs/ name only files of the repository: no design notes, issue tracker
    or seed document that a reader of the repository does not have."""
    outside = re.compile(r"design notes|\bDESIGN\b|§|the seed's|\bthe issue\b|\bissue \d+|"
                         r"\.\./shared|/work/")
    for page in [README, *DOCS]:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            assert not outside.search(line), f"{page.name}:{n}: {line.strip()}"


def test_every_picture_in_docs_screenshots_is_shown():
    shown = "".join(page.read_text() for page in [README, *DOCS])
    for png in (ROOT / "docs" / "screenshots").glob("*.png"):
        assert f"screenshots/{png.name}" in shown, f"nothing shows docs/screenshots/{png.name}"


def test_the_faults_table_names_real_codes():
    """docs/faults.md's table: each code a SpecError code or a loading fault's receipt kind."""
    from pyspec.apps import wire
    from webtools import errorcodes

    table = (ROOT / "docs" / "faults.md").read_text().split("## What the user sees")[1]
    codes = re.findall(r"^\| `(\w+)` \|", table.split("\n## ")[0], re.M)
    assert len(codes) >= 14
    assert set(codes) <= set(errorcodes.codes()) | set(wire.LOAD_FAULTS)


def test_every_result_file_is_behind_a_claim():
    """bench/results/ keeps the files its README lists (superseded runs leave the tree)."""
    listed = RESULTS.joinpath("README.md").read_text()
    for path in RESULTS.iterdir():
        if path.name != "README.md":
            stem = path.name.rsplit(".", 1)[0]
            assert f"`{path.name}`" in listed or f"`{stem}.json`, `.png`" in listed, path.name


def test_the_layer_picture_is_the_layout_tests():
    lines = [ln.split("—")[0].split() for ln in block(ROOT / "docs" / "architecture.md",
                                                      "layers").splitlines() if "—" in ln]
    want = [[m.removeprefix("pyspec.") for m in layer] for layer in reversed(LAYERS)]
    assert lines == want


def test_the_sampling_defaults_are_the_options():
    rows = re.findall(r"^\| `(\w+)` \| `?([^|`]+)`? \|", block(
        ROOT / "docs" / "sampling-and-json.md", "defaults"), re.M)
    assert len(rows) >= 10
    for name, default in rows:
        assert str(getattr(Options(), name)) == default.strip(), name


def test_the_readme_example_is_the_type_checked_one():
    """README's embedding example is docs/embedding.md's first, which tests/test_types.py checks."""
    def js(path):
        return re.findall(r"```js\n(.*?)```", path.read_text(), re.S)
    assert js(README)[0] == js(ROOT / "docs" / "embedding.md")[0]


def js_blocks(path: Path) -> list[str]:
    return re.findall(r"```js\n(.*?)```", path.read_text(), re.S)


def checks_js_create_defaults() -> dict[str, str]:
    """web/checks.js: the options SpecDecoder.create takes (CREATE_OPTIONS, plus the `signal`
    create() reads itself) -> their defaults as createOptions writes them."""
    text = (ROOT / "web" / "checks.js").read_text()
    names = re.findall(r'"(\w+)"', re.search(r"const CREATE_OPTIONS = \[(.*?)\];", text, re.S)[1])
    body = re.search(r"const \{(.*?)\} = options \?\? \{\};", text, re.S)[1]
    defaults = dict(re.findall(r"(\w+) = ([^,]+?)\s*(?:,|$)", body.strip()))
    assert set(defaults) == set(names)
    client = (ROOT / "web" / "client.js").read_text()
    assert "const { signal = null, ...rest } = options" in client
    return {**defaults, "signal": "null"}


def test_the_create_options_table_is_what_the_client_takes():
    rows = dict(re.findall(r"^\| `(\w+)` \| (.+?) \|", block(ROOT / "docs" / "embedding.md",
                                                              "create options"), re.M))
    defaults = checks_js_create_defaults()
    assert set(rows) == set(defaults)
    dts = re.search(r"export interface SpecDecoderOptions \{(.*?)\n\}",
                    (ROOT / "web" / "client.d.ts").read_text(), re.S)[1]
    assert set(re.findall(r"^  (\w+)\?:", dts, re.M)) == set(defaults)
    for name, cell in rows.items():
        if name != "workerUrl":   # (checks.js: the worker beside client.js, as the table says)
            assert cell == f"`{defaults[name]}`", (name, cell, defaults[name])


def test_the_generate_options_table_is_written_from_the_options():
    assert block(ROOT / "docs" / "embedding.md", "generate options") == optionsjs.docs_table(), (
        "docs/embedding.md's options table is stale: run `python -m webtools.optionsjs`")


def test_the_readme_snippet_works_with_the_site_and_the_npm_package():
    """README's embedding example gives only what both the site and the npm package take: the
    champion by the URL the site serves it at (the package has no manifest names), a drafter
    that needs no manifest model, create() options the client knows, generate() options of the
    table; and the package's own README points at the same file."""
    from pyspec import champion_path
    from pyspec.options import OPTION
    from webtools import package

    snippet = js_blocks(README)[0]
    create = re.search(r"SpecDecoder\.create\(\{(.*?)\}\);", snippet, re.S)[1]
    top = re.sub(r"\{[^{}]*\}", "{}", create)     # the top level's keys only
    assert set(re.findall(r"(\w+):", top)) <= set(checks_js_create_defaults())
    url = re.search(r'champion: \{ url: "([^"]+)" \}', create)[1]
    assert url == f"/models/{Path(champion_path()).name}"      # site.py: models/<the file>
    assert f'url: "{url}"' in package._readme("0")
    weights = (ROOT / "web" / "weights.js").read_text()
    assert "names.length ? `use one of" in weights   # a bare name needs a manifest model
    draft = re.search(r'draft: "([^"]+)"', create)[1]
    assert draft in ("ngram", "none", "auto") or draft.startswith("self:")
    config = re.search(r"d\.generate\(.*?\], \{(.*?)\}\)", snippet, re.S)[1]
    assert set(re.findall(r"(\w+):", config)) <= set(OPTION)


def test_the_flags_table_is_every_commands_help_and_cli_md_names_no_other_flag():
    """docs/cli.md's table holds each command's flags (and positionals) as its --help does, one
    row a command; every --flag cli.md names anywhere is one that a command (or build.py,
    which it mentions) takes."""
    import argparse

    from pyspec.apps import cli

    commands = cli.parser()._subparsers._group_actions[0].choices
    page = ROOT / "docs" / "cli.md"
    table = dict(re.findall(r"^\| `([\w-]+)` \| (.+) \|$", block(page, "flags"), re.M))
    assert set(table) == set(commands), "docs/cli.md's flags table needs one row per command"
    known = {"--help", "--version"}
    for name, parser in commands.items():
        shown = {a.option_strings[-1] if a.option_strings else a.dest.upper()
                 for a in parser._actions
                 if a.help is not argparse.SUPPRESS and "--help" not in a.option_strings}
        documented = set(re.findall(r"`([\w-]+)`", table[name]))
        assert documented == shown, (name, "in --help only:", shown - documented,
                                     "in docs/cli.md only:", documented - shown)
        known |= {s for a in parser._actions for s in a.option_strings}
        for a in parser._actions:        # a command's own actions (verdicts clear --all)
            if isinstance(a, argparse._SubParsersAction):
                known |= {s for sub in a.choices.values() for b in sub._actions
                          for s in b.option_strings}
    known |= set(re.findall(r'"(--[\w-]+)" in rest', (ROOT / "build.py").read_text()))
    named = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", page.read_text()))
    assert named <= known, f"docs/cli.md names flags no command takes: {named - known}"
