"""webtools/serve.py answers Range requests (a dropped download resumes from the byte it reached),
and the fault drills are named alike everywhere they are struck from (session.py, worker.js,
client.js, `build.py demo --fault`)."""

from __future__ import annotations

import argparse
import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from pyspec.apps import wire
from webtools import browser, serve

ROOT = Path(__file__).resolve().parent.parent
DATA = bytes(range(256)) * 40     # (10240,) bytes


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    (site / "w.gguf").write_bytes(DATA)
    server, url = serve.start(site)
    yield url
    server.shutdown()


def get(url: str, range_: str | None = None):
    request = urllib.request.Request(url, headers={"Range": range_} if range_ else {})
    with urllib.request.urlopen(request) as r:
        return r.status, dict(r.headers), r.read()


@pytest.mark.parametrize("range_, start, end", [("bytes=5000-", 5000, 10239),
                                                 ("bytes=10-19", 10, 19),
                                                 ("bytes=10200-99999", 10200, 10239)])
def test_a_range_request_gets_206_with_those_bytes(base, range_, start, end):
    status, headers, body = get(base + "w.gguf", range_)
    assert status == 206 and body == DATA[start:end + 1]
    assert headers["Content-Range"] == f"bytes {start}-{end}/{len(DATA)}"
    assert int(headers["Content-Length"]) == end - start + 1
    assert headers["Cross-Origin-Resource-Policy"] == "same-origin"


def test_no_range_gets_the_whole_file_and_a_range_past_the_end_416(base):
    assert get(base + "w.gguf")[::2] == (200, DATA)
    with pytest.raises(urllib.error.HTTPError) as e:
        get(base + "w.gguf", "bytes=10240-")
    assert e.value.code == 416


def test_every_fault_drill_has_one_name_everywhere():
    weights = (ROOT / "web" / "weights.js").read_text()
    load = re.search(r"const LOAD_DRILLS = \[([^\]]*)\]", weights)[1]
    assert tuple(re.findall(r'"([a-z-]+)"', load)) == browser.LOAD_FAULTS
    client = (ROOT / "web" / "client.js").read_text()
    assert "worker-terminate@" in client
    request_kinds = {*wire.SESSION_DRILLS, "worker-terminate"}
    assert request_kinds | set(browser.LOAD_FAULTS) | {"two-pages"} == set(browser.FAULTS)
    assert set(browser.GPU_FAULTS) <= set(wire.SESSION_DRILLS)
    for kind in browser.FAULTS:
        assert browser.fault_spec(f"{kind}@3") == f"{kind}@3"
    assert browser.fault_spec("opfs-flip") == "opfs-flip@0"
    with pytest.raises(argparse.ArgumentTypeError):
        browser.fault_spec("device-lost")      # a request's fault needs its cycle


def test_the_demo_takes_the_clis_drafter_names_and_opens_the_page_as_asked():
    """`build.py demo --draft auto|trained|ngram+trained` mean in the page what they mean in the
    CLI, and the URL the serve mode prints carries every request option (app.js reads them)."""
    from urllib.parse import parse_qs, urlparse

    from webtools import site

    assert browser.page_draft("auto") == ("auto", "auto")
    assert browser.page_draft("self:3") == ("self:3", "self:3")
    assert browser.page_draft("trained") == (site.TRAINED_DRAFT, "model")
    assert browser.page_draft("ngram+trained") == (site.TRAINED_DRAFT, "ngram+model")
    assert browser.page_draft("tiny-close") == ("tiny-close", "model")
    args = browser.parser().parse_args(["--model", "tiny", "--draft", "trained", "--k", "fixed:3",
                                        "--temperature", "0.5", "--seed", "7", "--max-tokens",
                                        "8", "--verify", "replay"])
    query = {k: v[0] for k, v in parse_qs(urlparse(browser.page_url("http://x/", args)).query)
             .items()}
    assert query == {"model": "tiny", "draft": site.TRAINED_DRAFT, "backend": "auto",
                     "k": "fixed:3", "temperature": "0.5", "seed": "7", "max_tokens": "8",
                     "verify": "replay"}
    assert browser.main(["--headless", "--model", "tiny", "--max-tokens", "0"]) == 2


def test_the_demo_checks_self_l_against_the_models_layers_before_a_page_opens(tmp_path,
                                                                              monkeypatch):
    """`--draft self:L` with L past the model's layers is refused before any page opens (one
    error line, exit 2); a model the manifest lacks is left to the page."""
    from pyspec import testmodels
    from pyspec.drafters import DraftSpecError

    testmodels.write_model(tmp_path / "m.gguf", n_layers=3)
    (tmp_path / "manifest.json").write_text(json.dumps({"artifacts": [
        {"kind": "model", "model": "m", "url": "m.gguf"}]}))
    args = browser.parser().parse_args(["--model", "m", "--draft", "self:3"])
    with pytest.raises(DraftSpecError, match="L must be an integer in 1..2"):
        browser.check_layers(tmp_path, args)
    browser.check_layers(tmp_path, browser.parser().parse_args(["--model", "m", "--draft",
                                                                "self:2"]))
    browser.check_layers(tmp_path, browser.parser().parse_args(["--model", "other", "--draft",
                                                                "self:9"]))
    monkeypatch.setattr(browser.site, "build", lambda **kw: str(tmp_path / "manifest.json"))
    monkeypatch.setattr(browser, "run_headless", lambda *a: pytest.fail("a page opened"))
    assert browser.main(["--headless", "--model", "m", "--draft", "self:7"]) == 2


def test_a_local_file_is_served_at_its_url_and_nothing_else_outside_the_site(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    local = tmp_path / "elsewhere" / "my.gguf"
    local.parent.mkdir()
    local.write_bytes(DATA)
    (tmp_path / "elsewhere" / "secret.txt").write_text("no")
    server, url = serve.start(site, files={"local/my.gguf": local})
    try:
        assert get(url + "local/my.gguf")[::2] == (200, DATA)
        status, headers, body = get(url + "local/my.gguf?x=1", "bytes=10-19")
        assert status == 206 and body == DATA[10:20]
        for other in ("local/secret.txt", "local/../elsewhere/secret.txt", "elsewhere/secret.txt"):
            with pytest.raises(urllib.error.HTTPError) as e:
                get(url + other)
            assert e.value.code == 404, other
    finally:
        server.shutdown()


def test_the_demo_serves_a_local_model_and_names_a_missing_one(tmp_path, monkeypatch, capsys):
    """--model PATH (and --draft PATH, ngram+PATH) become local/NAME URLs the page opens; a
    manifest name or a URL stays as it is; a path that names no file is refused before a site
    is built, in the CLI's words."""
    from urllib.parse import parse_qs, urlparse

    model, draft = tmp_path / "a" / "m.gguf", tmp_path / "b" / "m.gguf"
    for path in (model, draft):
        path.parent.mkdir()
        path.write_bytes(DATA)
    args = browser.parser().parse_args(["--model", str(model), "--draft", f"ngram+{draft}"])
    files = browser.serve_local(args)
    assert files == {"local/m.gguf": model.resolve(), "local/2-m.gguf": draft.resolve()}
    assert (args.model, args.draft) == ("local/m.gguf", "ngram+local/2-m.gguf")
    query = parse_qs(urlparse(browser.page_url("http://x/", args)).query)
    assert query["model"] == ["local/m.gguf"] and query["draft"] == ["local/2-m.gguf"]
    args = browser.parser().parse_args(["--model", "tiny", "--draft", "tiny-close"])
    assert browser.serve_local(args) == {} and (args.model, args.draft) == ("tiny", "tiny-close")
    assert browser.local_file("https://example.org/m.gguf") is None
    monkeypatch.setattr(browser.site, "build", lambda **kw: pytest.fail("a site was built"))
    missing = tmp_path / "nope.gguf"
    assert browser.main(["--headless", "--model", str(missing)]) == 2
    assert capsys.readouterr().err == f"error: {missing}: no such file; check the path.\n"
    assert browser.main(["--headless", "--model", "tiny", "--temperature", "-1"]) == 2
    assert capsys.readouterr().err.startswith("error: --temperature must be")
