// The client's checks of what an app hands SpecDecoder (client.js), made at once, before a
// worker starts, Pyodide loads or the weights download: create's options (their defaults filled
// in), reload's, and generate's config numbers. A bad one is SpecError bad_config naming it (an
// insecure page: insecure_context). Not here: the checks that need the model or the engine
// (the worker's and pyspec/apps/wire.py's), the facade's request fields (facade.js).

import { SpecError } from "./errors.js";

// The options SpecDecoder.create takes (client.d.ts SpecDecoderOptions); any other is refused.
const CREATE_OPTIONS = ["workerUrl", "champion", "draft", "maxCtx", "backend", "onProgress",
                        "maxRestarts", "stallTimeoutMs", "onNotice", "drills", "loadDrill",
                        "snapshot", "gpuLimits"];
const RELOAD_OPTIONS = ["loadDrill", "champion", "maxCtx"];
const BACKENDS = ["auto", "webgpu", "cpu"];   // pyspec/apps/page_engine.py BACKENDS

function refuseUnknown(options, known, taker) {
  const unknown = Object.keys(options ?? {}).filter((name) => !known.includes(name));
  if (unknown.length) {
    throw new SpecError("bad_config", `unknown option ${unknown.join(", ")}: ` +
                        `${taker} takes ${known.join(", ")}`);
  }
}

/** create's options checked, with their defaults (`workerUrl`: the worker next to client.js). */
export function createOptions(options, defaultWorkerUrl) {
  // Browsers give crypto.randomUUID, OPFS and Web Locks to secure contexts only.
  if (globalThis.isSecureContext === false) {
    throw new SpecError("insecure_context", `pyspec needs a secure context: ` +
                        `${globalThis.location?.origin} is not one; serve the page over ` +
                        "HTTPS (or from http://localhost while developing)");
  }
  refuseUnknown(options, CREATE_OPTIONS, "SpecDecoder.create");
  const { workerUrl = defaultWorkerUrl, champion = "smollm2", draft = "ngram", maxCtx = null,
          backend = "auto", onProgress = null, maxRestarts = 1, stallTimeoutMs = 60000, onNotice = null,
          drills = false, loadDrill = null, snapshot = true, gpuLimits = null } = options ?? {};
  for (const [name, value] of [["onProgress", onProgress], ["onNotice", onNotice]]) {
    if (value != null && typeof value !== "function") {
      throw new SpecError("bad_config", `${name} must be a function or null, got ` +
                          `${typeof value}`);
    }
  }
  // Checked here, not after Pyodide has started and the weights have downloaded.
  if (!BACKENDS.includes(backend)) {
    throw new SpecError("bad_config", `backend ${JSON.stringify(backend)} is not one of ` +
                        `${BACKENDS.join(", ")}`);
  }
  if (maxCtx !== null && !(Number.isSafeInteger(maxCtx) && maxCtx > 0)) {
    throw new SpecError("bad_config", `maxCtx must be a positive integer (tokens) or null, ` +
                        `got ${maxCtx}`);
  }
  return { workerUrl, champion, draft, maxCtx, backend, onProgress, maxRestarts, stallTimeoutMs,
           onNotice, drills, loadDrill, snapshot, gpuLimits };
}

/** reload's options: only those it takes. */
export function checkReloadOptions(options) {
  refuseUnknown(options, RELOAD_OPTIONS, "reload");
}

/** A number JSON cannot carry (NaN, Infinity) would reach the worker as null, that is as the
 *  option's default: refused instead, by the option's name (`logit_bias.101`, ...). */
export function checkFinite(value, name, seen = new Set()) {
  if (typeof value === "number" && !Number.isFinite(value)) {
    throw new SpecError("bad_config", `${name} must be a finite number, got ${value}`);
  }
  if (value === null || typeof value !== "object" || seen.has(value)) return;
  seen.add(value);
  for (const [key, item] of Object.entries(value)) {
    checkFinite(item, name ? `${name}.${key}` : key, seen);
  }
}
