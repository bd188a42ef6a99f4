"""README.md, docs/ and bench/results/README.md kept true: the README's two commands and size, the
figures made from their result files (webtools/results.py), every link and result file named,
the layers as tests/test_layout.py has them, and the sampling defaults as Options has them."""

from __future__ import annotations

import re
from pathlib import Path

from pyspec.options import Options
from test_layout import LAYERS
from webtools import results

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


def test_every_link_and_named_result_file_exists():
    for page in [README, *DOCS, RESULTS / "README.md"]:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if not target.startswith("http"):
                assert (page.parent / target).exists(), f"{page.name} links to {target}"
        for name in re.findall(r"bench/results/([\w.-]+\.(?:json|png))(?!` at)", text):
            assert (RESULTS / name).exists(), f"{page.name} names bench/results/{name}"


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
