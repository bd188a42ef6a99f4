// The demo's "measure on this device" panel (docs/gate.md): decoder.measure() (measure.js) on
// the stated sample, its progress, a Stop button, then the gate's table and verdicts as
// `python -m pyspec gate` prints them (the text comes from Python: nothing is computed here).

// The sample the button runs: measure()'s defaults, stated in the page (index.html) too.
export const SAMPLE = { perStratum: 1, maxTokens: 32 };

// `decoder()`: the loaded SpecDecoder or null; `onBusy(bool)`: the page holds its Send button
// meanwhile; `showError(err)`. Returns run(options): the button's action, for headless drivers.
export function gatePanel({ decoder, onBusy, showError }) {
  const $ = (id) => document.getElementById(id);
  let stop = null;

  async function run(options = {}) {
    const d = decoder();
    if (!d || stop) return null;
    stop = new AbortController();
    onBusy(true);
    $("measure").disabled = true;
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
      return m;
    } catch (err) {
      $("measure-progress").textContent = "";
      showError(err);
      throw err;
    } finally {
      stop = null;
      onBusy(false);
      $("measure").disabled = false;
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

  $("measure").addEventListener("click", () => run().catch(() => {}));
  $("measure-stop").addEventListener("click", () => stop?.abort());
  return { run, sync: (idle) => { $("measure").disabled = !idle || stop !== null; } };
}
