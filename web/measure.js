// "Measure on this device" for embedders: SpecDecoder.measure(options) (docs/gate.md).
//
//   const m = await decoder.measure({ drafts: ["ngram"], perStratum: 1, maxTokens: 32,
//                                     onProgress: (p) => {}, signal });
//   m.verdict.ngram;   // "promote" | "keep off"
//   m.text;            // the table, as `python -m pyspec gate` prints it
//
// The worker runs a sample of the public workload (the site ships it: the first `perStratum`
// prompts of each of its 11 strata, default 1; each at most `maxTokens` new tokens, default 32;
// 0: all, no cap), or `workload` (JSONL text, or a list of {id, stratum, messages,
// max_tokens?}), side by side with champion-only on the loaded champion, and judges each
// drafter by the gate's own Python (apps/page_gate.py, apps/gate.py): nothing is measured or
// judged here. The verdicts go to OPFS (verdicts.json), keyed by the champion's sha256, the
// draft and the device class, and draft "auto" follows them from the next load (create or
// reload). onProgress({phase: "measure", done, total, label}) after each run. An aborted
// `signal` (or decoder.cancel()) stops the run after its current cycle: it resolves with
// cancelled true, and nothing is recorded. A malformed or empty sample: SpecError bad_workload.

import { SpecError } from "./errors.js";

const MEASURE_OPTIONS = ["drafts", "perStratum", "maxTokens", "workload", "signal",
                         "onProgress"];

// The worker's request fields from measure()'s options, or a SpecError naming the bad one.
function requestOf(options) {
  if (options === null || typeof options !== "object" || Array.isArray(options)) {
    throw new SpecError("bad_config", "measure's options must be an object");
  }
  const unknown = Object.keys(options).filter((name) => !MEASURE_OPTIONS.includes(name));
  if (unknown.length) {
    throw new SpecError("bad_config", `unknown option ${unknown.join(", ")}: measure takes ` +
                        MEASURE_OPTIONS.join(", "));
  }
  const { drafts = null, perStratum = null, maxTokens = null, workload = null } = options;
  if (drafts !== null && !(Array.isArray(drafts) && drafts.length &&
                           drafts.every((d) => typeof d === "string"))) {
    throw new SpecError("bad_config", "drafts must be a non-empty list of drafters " +
                        "(\"ngram\", \"model\", \"ngram+model\", \"self:L\") or null");
  }
  for (const [name, value] of [["perStratum", perStratum], ["maxTokens", maxTokens]]) {
    if (value !== null && !(Number.isSafeInteger(value) && value >= 0)) {
      throw new SpecError("bad_config", `${name} must be an integer >= 0 (0: no limit) or ` +
                          `null, got ${value}`);
    }
  }
  return { drafts, perStratum, maxTokens, workload: workloadText(workload) };
}

// The sample as JSONL text: a list of prompts is written one a line (Python checks each).
function workloadText(workload) {
  if (workload === null || typeof workload === "string") return workload;
  if (!Array.isArray(workload)) {
    throw new SpecError("bad_workload", "workload must be JSONL text or a list of {id, " +
                        `stratum, messages, max_tokens?}, got ${typeof workload}`);
  }
  try {
    return workload.map((item) => JSON.stringify(item)).join("\n");
  } catch (e) {
    throw new SpecError("bad_workload", `workload cannot be written as JSON: ${e.message}`);
  }
}

/** measure() over the decoder's plumbing: `send(fields, onEvent)` posts the request and
 *  resolves with its `measured` reply; `cancel()` stops it. */
export async function measure(options, { send, cancel }) {
  const request = requestOf(options ?? {});
  const { signal = null, onProgress = null } = options ?? {};
  if (signal !== null && typeof signal?.aborted !== "boolean") {
    throw new SpecError("bad_config", "signal must be an AbortSignal (an AbortController's)");
  }
  if (onProgress !== null && typeof onProgress !== "function") {
    throw new SpecError("bad_config", "onProgress must be a function or null");
  }
  const cancelled = { cancelled: true, verdict: {}, text: null, report: null, verdicts: [],
                      stored: false };
  if (signal?.aborted) return cancelled;
  const abort = () => { cancel(); };
  signal?.addEventListener("abort", abort, { once: true });
  try {
    const msg = await send(request, (m) => {
      if (m.type === "progress" && m.phase === "measure") {
        onProgress?.({ phase: "measure", done: m.loaded, total: m.total, label: m.label });
      }
    });
    if (msg.cancelled) return cancelled;
    const verdict = Object.fromEntries(Object.entries(msg.result.drafters)
      .map(([name, m]) => [name, m.verdict]));
    return { cancelled: false, verdict, text: msg.result.text, report: msg.result,
             verdicts: msg.verdicts, stored: msg.stored };
  } finally {
    signal?.removeEventListener("abort", abort);
  }
}
