"""decoder.measure() ("measure on this device", web/measure.js -> worker.js -> Session.measure)
in headless Chromium on the tiny model: the gate's table and verdict come back, the verdict is
kept in OPFS (verdicts.json) keyed by champion, draft and device class, and draft "auto" follows
it at the next load; a verdict for another device class is ignored; a cancelled run, a sample
under the gate's minimum and bad input leave the table as it was. Also the demo's button, on
the page itself."""

from __future__ import annotations

import json

import pytest

from pyspec import verdicts
from pyspec.apps import gate

from .pageutil import Context

pytestmark = pytest.mark.browser

PRELUDE = """
const { SpecDecoder } = await import("./client.js");
const root = await navigator.storage.getDirectory();
const table = async () => {
  try { return await (await (await root.getFileHandle("verdicts.json")).getFile()).text(); }
  catch { return null; }
};
const setTable = async (text) => {
  if (text === null) { await root.removeEntry("verdicts.json").catch(() => {}); return; }
  const out = await (await root.getFileHandle("verdicts.json", { create: true })).createWritable();
  await out.write(text);
  await out.close();
};
const codeOf = async (f) => { try { await f(); return null; } catch (e) { return e.code; } };
const prompt = { id: "p-1", stratum: "copy",
                 messages: [{ role: "user", content: "the cat sat on the mat. the cat" }] };
"""

MEASURE = """async () => {%s
  await setTable(null);
  const d = await SpecDecoder.create({ champion: "tiny", backend: "cpu" });
  const progress = [];
  // 8 prompts, the gate's minimum sample: recorded
  const eight = Array.from({ length: 8 }, (_, i) => ({ ...prompt, id: `p-${i + 1}` }));
  const m = await d.measure({ drafts: ["ngram", "self:1"], workload: eight, perStratum: 0,
                              maxTokens: 4, onProgress: (p) => progress.push(p) });
  const stored = JSON.parse(await table());
  // 1 prompt: judged, not recorded, and the table stays as it was
  const few = await d.measure({ drafts: ["ngram"], workload: [prompt], maxTokens: 4 });
  const same = JSON.stringify(JSON.parse(await table())) === JSON.stringify(stored);
  // the shipped sample: one prompt of each stratum, 2 tokens each
  const shipped = await d.measure({ drafts: ["ngram"], maxTokens: 2 });
  d.terminate();
  return { m, progress, stored, few, same, shipped: shipped.report };
}""" % PRELUDE


@pytest.fixture(scope="module")
def page(browser, site_url):
    c = Context(browser, site_url)
    p = c.page("embed-example.html?model=none-such")   # its own decoder fails: ours run
    p.wait_for_function("() => window.embed && (embed.decoder || embed.error)")
    yield p
    c.ctx.close()
    assert not c.offsite, f"requests to other origins: {c.offsite}"


def model_sha(site_root, name: str) -> str:
    manifest = json.loads((site_root / "manifest.json").read_text())
    return next(a["sha256"] for a in manifest["artifacts"] if a.get("model") == name)


@pytest.fixture(scope="module")
def tiny_sha(site_root):
    return model_sha(site_root, "tiny")


def test_measure_returns_the_gates_table_and_keeps_the_verdict_in_opfs(page, tiny_sha):
    out = page.evaluate(MEASURE)
    m = out["m"]
    assert not m["cancelled"] and m["stored"]
    report = m["report"]
    assert report["schema"] == gate.SCHEMA and report["device_class"] == "cpu-numpy"
    assert report["thresholds"] == gate.THRESHOLDS
    assert report["webgpu"]["available"] in (True, False)    # the adapter, this page's only
    assert m["verdict"] == {d: x["verdict"] for d, x in report["drafters"].items()}
    assert m["text"] == report["text"] and f"ngram: {m['verdict']['ngram']}" in m["text"]
    # a warm-up of the 3 sides, then each prompt on each, then the end
    assert [(p["done"], p["total"]) for p in out["progress"]] == [(i, 27) for i in range(28)]
    keys = {(v["champion_sha256"], v["draft"], v["device_class"]) for v in m["verdicts"]}
    assert keys == {(tiny_sha, "ngram", "cpu-numpy"), (tiny_sha, "self:1", "cpu-numpy")}
    assert verdicts.parse(out["stored"], "OPFS verdicts.json") == m["verdicts"]
    few = out["few"]      # under the minimum sample: judged, printed, not recorded
    assert few["verdict"] == {"ngram": "keep off"} and not few["stored"] and few["verdicts"] == []
    ngram = few["report"]["drafters"]["ngram"]
    assert "1 prompts measured, fewer than 8" in ngram["reasons"][0]
    assert ngram["not_recorded"] == gate.unrecorded({"prompts": 1}) and out["same"]
    shipped = out["shipped"]
    assert shipped["workload"] == "workload.jsonl" and shipped["per_stratum"] == 1
    assert shipped["drafters"]["ngram"]["prompts"] + len(shipped["skipped"]) == 11


AUTO = """async ([tables]) => {%s
  const out = [];
  let d = null;
  for (const text of tables) {
    await setTable(text);
    if (d === null) d = await SpecDecoder.create({ champion: "tiny", backend: "cpu",
                                                   draft: "auto" });
    else await d.reload();      // a load reads OPFS afresh
    const gen = d.generate([prompt.messages[0]], { max_tokens: 4 });
    let step;
    while (!(step = await gen.next()).done);
    out.push({ draft: d.info.draft, model: d.info.draft_model, chose: d.info.draft_verdict,
               auto: step.value.receipt.draft.auto });
  }
  d.terminate();
  return out;
}""" % PRELUDE


def verdict(sha: str, draft: str, word: str, device: str) -> dict:
    return verdicts.record(champion_sha256=sha, draft=draft, device_class=device, verdict=word,
                           speedup={"median": 1.3, "low": 1.1, "high": 1.4},
                           rule_version=gate.RULE_VERSION, date="2026-12-05T00:00:00Z")


def test_auto_follows_a_verdict_for_this_device_class_and_ignores_another(page, tiny_sha,
                                                                          site_root):
    """Each load reads OPFS afresh; the site's draft for tiny (tiny-borrowing, which today's
    rule leaves undownloaded on the CPU) is fetched where a verdict promotes it."""
    kept_off = verdict(tiny_sha, "ngram", "keep off", "cpu-numpy")
    promoted = verdict(tiny_sha, "self:1", "promote", "cpu-numpy")
    elsewhere = [verdict(tiny_sha, "ngram", "keep off", "gpu:nvidia"),
                 verdict(tiny_sha, "self:1", "promote", "software")]
    draft = verdict(tiny_sha, model_sha(site_root, "tiny-borrowing"), "promote", "cpu-numpy")
    tables = [json.dumps({"schema": verdicts.SCHEMA, "verdicts": t})
              for t in ([kept_off], [kept_off, promoted], elsewhere, [kept_off, draft])]
    off, on, other, model = page.evaluate(AUTO, [tables])
    # today's rule picks ngram (no draft model on the CPU); its verdict keeps it off
    assert off == {"draft": "none", "model": None, "chose": kept_off["sha256"],
                   "auto": {"verdict": "keep off", "verdict_sha256": kept_off["sha256"]}}
    assert on == {"draft": "self:1", "model": None, "chose": promoted["sha256"],
                  "auto": {"verdict": "promote", "verdict_sha256": promoted["sha256"]}}
    # verdicts of other device classes only: today's rule, and the receipt says no verdict chose
    assert other == {"draft": "ngram", "model": None, "chose": None,
                     "auto": {"verdict": None, "verdict_sha256": None}}
    assert model == {"draft": "model", "model": "tiny-borrowing", "chose": draft["sha256"],
                     "auto": {"verdict": "promote", "verdict_sha256": draft["sha256"]}}


CANCEL_AND_BAD = """async () => {%s
  await setTable('{"schema": "pyspec.verdicts/1", "verdicts": []}');
  const before = await table();
  const d = await SpecDecoder.create({ champion: "tiny", backend: "cpu" });
  const stop = new AbortController();
  // enough runs after the first that the cancel reaches the worker before the last ends (it
  // is read between runs: on a loaded machine two prompts could finish before it arrived)
  const workload = [1, 2, 3, 4, 5, 6].map((i) => ({ ...prompt, id: `p-${i}` }));
  const cancelled = await d.measure({ drafts: ["ngram"], workload, maxTokens: 8,
                                      signal: stop.signal,
                                      onProgress: (p) => { if (p.done === 1) stop.abort(); } });
  // decoder.cancel() stops one too
  const viaCancel = d.measure({ drafts: ["ngram"], workload, maxTokens: 8,
                                onProgress: (p) => { if (p.done === 1) d.cancel(); } });
  const codes = {
    empty: await codeOf(() => d.measure({ workload: "" })),
    none: await codeOf(() => d.measure({ workload: [] })),
    malformed: await codeOf(() => d.measure({ workload: "not json\\n" })),
    fields: await codeOf(() => d.measure({ workload: [{ id: "x" }] })),
    type: await codeOf(() => d.measure({ workload: 7 })),
    negative: await codeOf(() => d.measure({ perStratum: -1 })),
    unknown: await codeOf(() => d.measure({ per_stratum: 1 })),
    drafter: await codeOf(() => d.measure({ drafts: ["none"], workload: [prompt] })),
  };
  let message = null;
  try { await d.measure({ workload: "not json\\n" }); } catch (e) { message = e.message; }
  const out = { cancelled, viaCancel: await viaCancel, codes, message,
                same: (await table()) === before };
  d.terminate();
  return out;
}""" % PRELUDE


def test_a_cancelled_run_and_bad_input_leave_no_verdict(page):
    out = page.evaluate(CANCEL_AND_BAD)
    for run in (out["cancelled"], out["viaCancel"]):
        assert run == {"cancelled": True, "verdict": {}, "text": None, "report": None,
                       "verdicts": [], "stored": False}
    assert out["codes"] == {"empty": "bad_workload", "none": "bad_workload",
                            "malformed": "bad_workload", "fields": "bad_workload",
                            "type": "bad_workload", "negative": "bad_config",
                            "unknown": "bad_config", "drafter": "bad_config"}
    assert "the workload given line 1 is not JSON" in out["message"]
    assert out["same"], "OPFS verdicts.json changed"


LIST_AND_CLEAR = """async ([text]) => {%s
  await setTable(text);
  const list = await SpecDecoder.recordedVerdicts();
  const first = list[0].sha256;
  const one = await SpecDecoder.clearVerdicts({ only: [first.slice(0, 8).toUpperCase()] });
  const after = await SpecDecoder.recordedVerdicts();
  let unknown = null;
  try { await SpecDecoder.clearVerdicts({ only: [list[1].sha256, "0123456789ab"] }); }
  catch (e) { unknown = { code: e.code, message: e.message }; }
  const kept = (await SpecDecoder.recordedVerdicts()).length;
  const badOption = await codeOf(() => SpecDecoder.clearVerdicts({ only: "abcd" }));
  const all = await SpecDecoder.clearVerdicts();
  const none = await SpecDecoder.recordedVerdicts();
  const file = await table();
  await setTable("not json");
  let broken = null;
  try { await SpecDecoder.recordedVerdicts(); } catch (e) { broken = e.message; }
  const cleared = await SpecDecoder.clearVerdicts();
  return { list, first, one, after, unknown, kept, badOption, all, none, file, broken, cleared,
           gone: await table() };
}""" % PRELUDE


def test_the_client_lists_and_clears_the_recorded_verdicts(page, tiny_sha):
    """SpecDecoder.recordedVerdicts() and clearVerdicts() (web/verdicts.js), with no decoder:
    one by the first digits of its sha256, an unknown name refused with nothing removed, all,
    and a file that is not a table."""
    table = [verdict(tiny_sha, d, "promote", "cpu-numpy") for d in ("ngram", "self:1", "self:2")]
    out = page.evaluate(LIST_AND_CLEAR, [json.dumps({"schema": verdicts.SCHEMA,
                                                     "verdicts": table})])
    assert out["list"] == table
    rest = [v["sha256"] for v in table if v["sha256"] != out["first"]]
    assert out["one"] == {"removed": [out["first"]], "kept": rest}
    assert [v["sha256"] for v in out["after"]] == rest
    assert out["unknown"]["code"] == "bad_config" and out["kept"] == 2
    assert "no verdict 0123456789ab in this origin's verdicts.json" in out["unknown"]["message"]
    assert out["badOption"] == "bad_config"
    assert out["all"] == {"removed": rest, "kept": []} and out["none"] == []
    assert out["file"] is None
    assert "verdicts.json is not a verdict table: SpecDecoder.clearVerdicts()" in out["broken"]
    assert out["cleared"] == {"removed": [], "kept": []} and out["gone"] is None


def test_the_demos_button_states_its_sample_and_shows_the_table(context):
    """The demo page (index.html + app.js + gate-view.js): the sample is stated beside the
    button, and a run (pyspecApp.measure, the button's action) shows the CLI's table."""
    from .pageutil import ready

    page = context.page("index.html?model=tiny&backend=cpu")
    ready(page)
    stated = page.inner_text("#measure-box")
    assert "first prompt of each of its 11 strata" in stated and "32 new tokens" in stated
    assert f"from {gate.THRESHOLDS['prompts']} prompts up" in stated
    sample = page.evaluate("async () => (await import('./gate-view.js')).SAMPLE")
    assert sample == {"perStratum": 1, "maxTokens": 32}     # what the page says it runs
    assert page.is_enabled("#measure")
    kept = verdict("0" * 64, "ngram", "promote", "cpu-numpy")     # another champion's
    page.evaluate("""async ([text]) => {
      const root = await navigator.storage.getDirectory();
      const out = await (await root.getFileHandle("verdicts.json", { create: true }))
        .createWritable();
      await out.write(text);
      await out.close();
    }""", [json.dumps({"schema": verdicts.SCHEMA, "verdicts": [kept]})])
    m = page.evaluate("""() => pyspecApp.measure({ drafts: ["ngram"], maxTokens: 4,
      workload: [{ id: "p", stratum: "s",
                   messages: [{ role: "user", content: "the cat sat on the mat. the cat" }] }]
    })""")
    assert m["verdict"] == {"ngram": "keep off"}
    table = page.inner_text("#gate-table")
    assert table == m["text"] and "ngram: keep off" in table and "speedup" in table
    progress = page.inner_text("#measure-progress")   # 1 prompt: under the minimum sample
    assert "ngram: keep off" in progress
    assert f"not recorded: {gate.unrecorded({'prompts': 1})}" in progress
    # the verdicts kept here, listed after the run; the button clears them
    assert page.inner_text("#verdicts-list").startswith(
        f"Kept in this browser: {kept['sha256'][:12]} promote ngram on cpu-numpy (x1.300, ")
    page.click("#verdicts-clear")
    page.wait_for_function("() => document.getElementById('verdicts-clear').hidden")
    assert page.inner_text("#verdicts-list") == ('No verdict kept in this browser: "auto" '
                                                 "follows today's rule.")
    assert page.inner_text("#measure-progress").startswith("cleared 1 verdict: ")
    assert page.is_enabled("#measure") and page.is_enabled("#send")
