// The demo's "measure on this device" panel (docs/gate.md): decoder.measure() (measure.js) on
// the stated sample, its progress, a Stop button, then the gate's table and verdicts as
// `python -m pyspec gate` prints them (the text comes from Python: nothing is computed here);
// and the verdicts kept in this browser, listed with a button that clears them
// (SpecDecoder.recordedVerdicts and clearVerdicts, as `python -m pyspec verdicts`).

import { SpecDecoder } from "./client.js";

// The sample the button runs: measure()'s defaults, stated in the page (index.html) too.
export const SAMPLE = { perStratum: 1, maxTokens: 32 };

// `decoder()`: the loaded SpecDecoder or null; `onBusy(bool)`: the page holds its Send button
// meanwhile; `showError(err)`. Returns run(options) and clearAll(): the buttons' actions, for
// headless drivers.
export function gatePanel({ decoder, onBusy, showError }) {
  const $ = (id) => document.getElementById(id);
  let stop = null;

  async function run(options = {}) {
    const d = decoder();
    if (!d || stop) return null;
    stop = new AbortController();
    onBusy(true);
    $("measure").disabled = true;
    $("verdicts-clear").disabled = true;    // the run writes its table when it ends
    $("measure-stop").hidden = false;
    $("gate-table").hidden = true;
    $("measure-progress").textContent = "starting…";
    try {
      const m = await d.measure({ ...SAMPLE, ...options, signal: stop.signal,
                                  onProgress: (p) => {
                                    $("measure-progress").textContent =
                                      `${p.done} / ${p.total} runs ${p.label ?? ""}`;
                                  } });
      show(m, d.info);
      await listVerdicts();
      return m;
    } catch (err) {
      $("measure-progress").textContent = "";
      showError(err);
      throw err;
    } finally {
      stop = null;
      onBusy(false);
      $("measure").disabled = false;
      $("verdicts-clear").disabled = false;
      $("measure-stop").hidden = true;
    }
  }

  function show(m, info) {
    if (m.cancelled) {
      $("measure-progress").textContent = "stopped: nothing was recorded";
      return;
    }
    const words = Object.entries(m.verdict).map(([d, v]) => `${d}: ${v}`).join(", ");
    const software = info?.fallback_kind === "software_adapter" || info?.webgpu?.fallback;
    const why = Object.values(m.report.drafters).find((x) => x.not_recorded)?.not_recorded;
    $("measure-progress").textContent = `${words}` +
      (software ? " (measured behind a software WebGPU adapter)" : "") +
      (m.stored ? "; recorded: the drafter \"auto\" follows it from the next load"
        : m.verdicts.length ? "; not recorded (this page has no OPFS)"
          : `; not recorded: ${why ?? "no prompt was measured"}`);
    $("gate-table").textContent = m.text;
    $("gate-table").hidden = false;
  }

  // One line per kept verdict (its sha256's first digits name it, as the CLI's listing does).
  async function listVerdicts() {
    let text;
    let any = true;
    try {
      const list = await SpecDecoder.recordedVerdicts();
      any = list.length > 0;
      text = any ? "Kept in this browser: " + list.map((v) => `${v.sha256.slice(0, 12)} ` +
        `${v.verdict} ${v.draft.replace(/[0-9a-f]{64}$/, (h) => `model ${h.slice(0, 12)}`)} ` +
        `on ${v.device_class} (x${v.speedup.median.toFixed(3)}, ${v.date})`).join("; ")
        : "No verdict kept in this browser: \"auto\" follows today's rule.";
    } catch (err) {
      text = err.message;       // a file that is not a table: the button clears it
    }
    $("verdicts-list").textContent = text;
    $("verdicts-clear").hidden = !any;
  }

  async function clearAll() {
    try {
      const { removed } = await SpecDecoder.clearVerdicts();
      $("measure-progress").textContent = `cleared ${removed.length} verdict` +
        `${removed.length === 1 ? "" : "s"}: "auto" follows today's rule from the next load`;
    } catch (err) {
      showError(err);
    }
    await listVerdicts();
  }

  $("measure").addEventListener("click", () => run().catch(() => {}));
  $("measure-stop").addEventListener("click", () => stop?.abort());
  $("verdicts-clear").addEventListener("click", () => clearAll());
  listVerdicts();
  return { run, clearAll, sync: (idle) => { $("measure").disabled = !idle || stop !== null; } };
}
