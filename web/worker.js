// pyspec worker (DESIGN §8): Pyodide + the pyspec wheel, weights in OPFS, a typed message protocol.
//
// Everything comes from this worker's own origin: Pyodide's core and its numpy / micropip /
// packaging wheels from ./pyodide/ (checked by Pyodide against pyodide-lock.json's sha256), the
// pyspec wheel and the models as listed in ./manifest.json (sha256 checked here).
//
// Requests (each carries an `id`; every reply carries the same id):
//   {type:'init', id, champion, draft, maxCtx, backend, drills}
//                                                -> {type:'progress', id, phase, loaded, total}*
//                                                   then {type:'ready', id, adapter, webgpu, ...}
//       champion: a manifest model name ('tiny', 'smollm2') or {url, sha256?}
//       draft: 'ngram' | 'none' | 'self:L' | a model name or {url, sha256?} (a draft model)
//       drills: true switches fault drills on (lose_device, config.drill); off by default
//   {type:'generate', id, messages, config, resume}
//                                                -> {type:'chunk', id, offset, text, tokens, ids,
//                                                   cycle}*
//                                                   then {type:'done', id, text, tokens, stats, receipt,
//                                                   finish_reason}   (finish_reason 'cancelled' after
//                                                   a cancel, with stats and receipt null)
//       config: {draft, k, verify, temperature, seed, max_tokens, drill, and the sampling
//       controls top_k, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty,
//       logit_bias, stop (web.py checks them)}; chunk.ids = the token
//       ids committed since the last chunk (tokens = their count), cycle = cycles run so far,
//       kinds and starts = each id's kind (champion, accepted, corrected, bonus, forced) and
//       where its text begins;
//       text offsets are in UTF-16 code units of the whole output. resume: {ids, fault} goes on
//       from the ids an interrupted run of the same request sent (client.js after a worker
//       death; fault {kind: 'worker_died', cycle, restart_s} goes to the receipt): its chunks
//       start at the offset after their text. drill 'device-lost@C' (drills on) destroys the
//       WebGPU device once C cycles have run.
//   {type:'cancel', id, target}  (target: the id of a generate)  -> {type:'cancel_ack', id, cancelled}
//   {type:'stats', id} / {type:'receipt', id}     -> {type:'stats', id, stats} / {type:'receipt', ...}
//   {type:'lose_device', id}  (a fault drill, drills on: destroys the WebGPU device mid-request)
//                                                -> {type:'lose_device_ack', id, lost}
// Unasked: {type:'heartbeat'} every HEARTBEAT_MS while the event loop is free, and a Web Lock
// named after the worker (new Worker(url, {name})) held for its whole life, which the browser
// releases when the worker dies, terminate() included: client.js's liveness checks.
// Any failure replies {type:'error', id, code, message, fatal}; fatal means this worker is unusable
// (Pyodide crashed) and the client should start a new one. A message that is not an object, has
// no known type, or has a field of the wrong type (REQUESTS below) gets code 'bad_request' before
// anything runs; the worker stays usable. Fields the Python session reads (config, messages)
// are checked there and refused as 'bad_config'.
//
// Not here: decoding (pyspec/web.py and the engine), retries across workers (client.js).

import { loadPyodide } from "./pyodide/pyodide.mjs";
import * as webgpuHelpers from "./webgpu.js";

const SITE = new URL("./", import.meta.url);
const OPFS_DIR = "pyspec-weights";
const READ_BLOCK = 8 << 20;   // bytes per OPFS read, one progress report each
const HEARTBEAT_MS = 1000;    // client.js's stall timeout must be well above this

class WorkerError extends Error {
  constructor(code, message) { super(message); this.code = code; }
}

let manifestPromise = null;
let runtimePromise = null;     // {pyodide, session}
let queue = Promise.resolve(); // init and generate requests run one after another

const post = (msg) => self.postMessage(msg);

// --- manifest and runtime ---------------------------------------------------------------------
function manifest() {
  manifestPromise ??= fetch(new URL("manifest.json", SITE)).then((r) => {
    if (!r.ok) throw new WorkerError("download_failed", `manifest.json: HTTP ${r.status}`);
    return r.json();
  });
  return manifestPromise;
}

async function sha256Hex(bytes) {
  const digest = await crypto.subtle.digest("SHA-256", bytes);   // copies `bytes` synchronously
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}

function runtime(progress) {
  runtimePromise ??= (async () => {
    const m = await manifest();
    progress("runtime", 0, 3);
    const pyodide = await loadPyodide({ indexURL: new URL("pyodide/", SITE).href });
    pyodide.registerJsModule("pyspec_webgpu", webgpuHelpers);   // pyspec/gpu/browser.py's
    progress("runtime", 1, 3);
    // Resolved from indexURL + the lock file's file_name, with its sha256 as SRI; no CDN.
    await pyodide.loadPackage(m.pyodide_packages, { messageCallback: () => {} });
    progress("runtime", 2, 3);
    const wheel = m.artifacts.find((a) => a.kind === "pyspec-wheel");
    const resp = await fetch(new URL(wheel.url, SITE));
    if (!resp.ok) throw new WorkerError("download_failed", `${wheel.url}: HTTP ${resp.status}`);
    const data = new Uint8Array(await resp.arrayBuffer());
    if ((await sha256Hex(data)) !== wheel.sha256) {
      throw new WorkerError("corrupt_download", `${wheel.url} does not match its sha256`);
    }
    // A file in Pyodide's in-memory file system (inside this worker; /home/pyodide is its
    // default home), where micropip installs it from.
    const path = "/home/pyodide/" + wheel.url.split("/").pop();
    pyodide.FS.writeFile(path, data);
    const micropip = pyodide.pyimport("micropip");
    await micropip.install.callKwargs("emfs:" + path, { deps: false });
    micropip.destroy();
    const session = pyodide.runPython("from pyspec.web import Session\nSession()");
    progress("runtime", 3, 3);
    return { pyodide, session };
  })();
  runtimePromise.catch(() => { runtimePromise = null; });
  return runtimePromise;
}

async function webgpuInfo() {
  try {
    const adapter = await navigator.gpu?.requestAdapter();
    if (!adapter) return { available: false };
    const info = adapter.info ?? {};
    return { available: true, vendor: info.vendor, architecture: info.architecture,
             description: info.description, fallback: adapter.isFallbackAdapter ?? null };
  } catch (e) {
    return { available: false, error: String(e) };
  }
}

// --- weights: OPFS keyed by sha256 --------------------------------------------------------------
async function resolveModel(spec) {
  const m = await manifest();
  if (typeof spec === "string") {
    const a = m.artifacts.find((x) => x.kind === "model" && x.model === spec);
    if (a) return { name: spec, url: new URL(a.url, SITE).href, sha256: a.sha256, size: a.size };
    if (!spec.includes("/") && !spec.endsWith(".gguf")) {
      const names = m.artifacts.filter((x) => x.kind === "model").map((x) => x.model);
      throw new WorkerError("unknown_model", `no model named '${spec}' in manifest.json; ` +
                            `use one of ${names.join(", ")} or a URL`);
    }
    spec = { url: spec };
  }
  const url = new URL(spec.url, SITE);
  return { name: url.pathname.split("/").pop(), url: url.href, sha256: spec.sha256 ?? null,
           size: spec.size ?? null };
}

async function opfsDir() {
  try {
    const root = await navigator.storage.getDirectory();
    return await root.getDirectoryHandle(OPFS_DIR, { create: true });
  } catch {
    return null;   // no OPFS here (e.g. a private window): download every time
  }
}

// Stream the response body into `sink(chunk)`, reporting progress.
async function download(model, progress, sink) {
  let resp;
  try {
    resp = await fetch(model.url);
  } catch (e) {
    throw new WorkerError("download_failed", `cannot fetch ${model.url}: ${e.message}`);
  }
  if (!resp.ok) throw new WorkerError("download_failed", `${model.url}: HTTP ${resp.status}`);
  const total = Number(resp.headers.get("content-length")) || model.size || 0;
  const reader = resp.body.getReader();
  let loaded = 0, last = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    sink(value, loaded);
    loaded += value.length;
    if (loaded - last > (1 << 20) || loaded === total) {
      progress("download", loaded, total, model.name);
      last = loaded;
    }
  }
  return loaded;
}

// A Python bytearray of `size` bytes and a Uint8Array view of it in wasm memory. The view is
// valid only until Python next allocates (wasm memory may grow), so use it at once.
function pyBuffer(pyodide, size) {
  const builtins = pyodide.pyimport("builtins");
  const buf = builtins.bytearray(size);
  builtins.destroy();
  const view = buf.getBuffer("u8");
  return { buf, view };
}

// Stage 1, in parallel with loading Pyodide: make sure OPFS holds a file of the right size
// (download it when missing or truncated). Without OPFS (or without a known sha256), keep the
// downloaded chunks in memory instead.
async function fetchWeights(model, progress, stats) {
  const dir = model.sha256 ? await opfsDir() : null;
  if (!dir) {
    const chunks = [];
    stats.downloaded += await download(model, progress, (c) => chunks.push(c));
    return { model, dir: null, chunks };
  }
  const name = `${model.sha256}.gguf`;
  let access;
  try {
    access = await (await dir.getFileHandle(name, { create: true })).createSyncAccessHandle();
  } catch {
    // Locked by another tab's worker, or the quota is gone: go on without the cache.
    return fetchWeights({ ...model, sha256: null, expected: model.sha256 }, progress, stats);
  }
  try {
    if (access.getSize() === model.size) {
      stats.cached = true;
    } else {
      await toOpfs(access, model, progress, stats);
    }
  } finally {
    access.close();
  }
  return { model, dir, name };
}

async function toOpfs(access, model, progress, stats) {
  access.truncate(0);
  stats.downloaded += await download(model, progress, (c, at) => access.write(c, { at }));
  access.flush();
}

// Stage 2: copy the bytes straight into a Python bytearray (wasm memory) and check their sha256
// there, so no second full copy stays in JavaScript. A mismatch (a corrupt or stale OPFS file)
// downloads the file again, once.
async function readWeights(pyodide, fetched, progress, stats) {
  const { model, dir, name } = fetched;
  if (!dir) {
    const size = fetched.chunks.reduce((n, c) => n + c.length, 0);
    const { buf, view } = pyBuffer(pyodide, size);
    let at = 0;
    for (const c of fetched.chunks.splice(0)) { view.data.set(c, at); at += c.length; }
    const want = model.sha256 ?? model.expected;
    const ok = !want || (await sha256Hex(view.data)) === want;
    view.release();
    if (!ok) { buf.destroy(); throw new WorkerError("corrupt_download", `${model.url} does not match its sha256`); }
    return buf;
  }
  const access = await (await dir.getFileHandle(name)).createSyncAccessHandle();
  try {
    for (let attempt = 0; attempt < 2; attempt++) {
      if (attempt > 0) await toOpfs(access, model, progress, stats);
      const size = access.getSize();
      const { buf, view } = pyBuffer(pyodide, size);
      for (let at = 0; at < size; at += READ_BLOCK) {
        access.read(view.data.subarray(at, Math.min(at + READ_BLOCK, size)), { at });
        progress("cache", Math.min(at + READ_BLOCK, size), size, model.name);
      }
      progress("verify", 0, 1, model.name);
      const ok = (await sha256Hex(view.data)) === model.sha256;
      view.release();
      if (ok) return buf;
      buf.destroy();
      stats.corrupt += 1;
    }
  } finally {
    access.close();
  }
  await dir.removeEntry(name).catch(() => {});
  throw new WorkerError("corrupt_download",
                        `${model.url} does not match its sha256 after a fresh download`);
}

// --- requests --------------------------------------------------------------------------------
// What each request's fields must be when present (null or absent means the default).
const isObject = (v) => typeof v === "object" && v !== null && !Array.isArray(v);
const isModelSpec = (v) => (typeof v === "string" && v.length > 0) ||
  (isObject(v) && typeof v.url === "string" && (v.sha256 == null || typeof v.sha256 === "string")
   && (v.size == null || Number.isSafeInteger(v.size)));
const REQUESTS = {
  init: { champion: [isModelSpec, "a model name or {url, sha256?}"],
          draft: [isModelSpec, "a draft spec, a model name or {url, sha256?}"],
          maxCtx: [(v) => Number.isSafeInteger(v) && v > 0, "a positive integer"],
          backend: [(v) => typeof v === "string", "a string"],
          drills: [(v) => typeof v === "boolean", "true or false"] },
  generate: { messages: [Array.isArray, "an array of {role, content}"],
              config: [isObject, "an object"],
              resume: [(v) => isObject(v) && Array.isArray(v.ids), "{ids: [token ids], fault}"] },
  cancel: { target: [(v) => Number.isFinite(v) || typeof v === "string", "a request id"] },
  stats: {}, receipt: {}, lose_device: {},
};

function checkRequest(msg) {
  if (!isObject(msg)) {
    throw new WorkerError("bad_request", `a request must be an object {type, id, ...}, got ${
      msg === null ? "null" : Array.isArray(msg) ? "an array" : typeof msg}`);
  }
  if (!Object.hasOwn(REQUESTS, msg.type)) {
    const type = typeof msg.type === "string" ? JSON.stringify(msg.type) : `(a ${typeof msg.type})`;
    throw new WorkerError("bad_request", `unknown message type ${type}; use one of ${
      Object.keys(REQUESTS).join(", ")}`);
  }
  if (msg.id != null && !Number.isFinite(msg.id) && typeof msg.id !== "string") {
    throw new WorkerError("bad_request", `${msg.type}: id must be a number or a string`);
  }
  for (const [field, [ok, what]] of Object.entries(REQUESTS[msg.type])) {
    if (msg[field] != null && !ok(msg[field])) {
      throw new WorkerError("bad_request", `${msg.type}: ${field} must be ${what}`);
    }
  }
}

// JSON for the Python session; a value JSON cannot hold (a cycle, a BigInt) is the request's fault.
function toJson(value, what) {
  try {
    return JSON.stringify(value);
  } catch (e) {
    throw new WorkerError("bad_request", `${what} cannot be sent as JSON: ${e.message}`);
  }
}

// --- handlers -------------------------------------------------------------------------------
const NON_MODEL_DRAFTS = /^(ngram|none|self:\d+)$/;

async function init(msg) {
  const progress = (phase, loaded, total, label) =>
    post({ type: "progress", id: msg.id, phase, loaded, total, label });
  const t0 = performance.now();
  const draftIsModel = msg.draft && !(typeof msg.draft === "string" && NON_MODEL_DRAFTS.test(msg.draft));
  const champion = await resolveModel(msg.champion ?? "smollm2");
  const draft = draftIsModel ? await resolveModel(msg.draft) : null;
  const weights = { downloaded: 0, cached: false, corrupt: 0 };
  // Downloads run while Pyodide loads; a bad URL fails here without waiting for the runtime.
  const [{ pyodide, session }, champFetched, draftFetched] = await Promise.all([
    runtime(progress), fetchWeights(champion, progress, weights),
    draft && fetchWeights(draft, progress, weights)]);
  const champBuf = await readWeights(pyodide, champFetched, progress, weights);
  let draftBuf = null;
  try {
    if (draft) draftBuf = await readWeights(pyodide, draftFetched, progress, weights);
    progress("load", 0, 1, champion.name);
    // backend: "auto" (web.make_engine's choice) | "webgpu" | "cpu"; a hint make_engine may honour.
    const options = { draft: draft ? "model" : msg.draft ?? "ngram", max_ctx: msg.maxCtx ?? null,
                      backend: msg.backend ?? "auto", champion_name: champion.name,
                      draft_name: draft?.name, drills: msg.drills ?? false,
                      warm: true };   // the system turn is prefilled after ready (web.py)
    const info = JSON.parse(await session.load(JSON.stringify(options), champBuf, draftBuf));
    if (info.error) throw new WorkerError(info.error.code, info.error.message);
    progress("load", 1, 1, champion.name);
    return { type: "ready", id: msg.id, ...info, webgpu: await webgpuInfo(),
             champion: champion.name, draft_model: draft?.name ?? null, weights,
             init_ms: performance.now() - t0 };
  } finally {
    champBuf.destroy();           // Python keeps its own reference; drop the JS handle
    draftBuf?.destroy();
  }
}

async function generate(msg) {
  const { session } = await requireRuntime();
  const onChunk = (offset, text, tokens, ids, cycle, marks) =>
    post({ type: "chunk", id: msg.id, offset, text, tokens, ids: JSON.parse(ids), cycle,
           ...JSON.parse(marks) });
  const out = JSON.parse(await session.generate(msg.id, toJson(msg.messages ?? [], "messages"),
                                                toJson(msg.config ?? {}, "config"), onChunk,
                                                toJson(msg.resume ?? null, "resume")));
  if (out.error) throw new WorkerError(out.error.code, out.error.message);
  return { type: "done", id: msg.id, ...out };
}

async function requireRuntime() {
  if (!runtimePromise) throw new WorkerError("not_ready", "send init first");
  return runtimePromise;
}

async function handle(msg) {
  checkRequest(msg);
  switch (msg.type) {
    case "init":
    case "generate": {
      // One at a time, in arrival order: a request waits for the one before it to finish.
      const run = queue.then(() => (msg.type === "init" ? init(msg) : generate(msg)));
      queue = run.catch(() => {});
      return run;
    }
    case "cancel": {
      const { session } = await requireRuntime();
      return { type: "cancel_ack", id: msg.id, ...JSON.parse(session.cancel(msg.target ?? msg.id)) };
    }
    case "stats":
    case "receipt": {
      const { session } = await requireRuntime();
      return { type: msg.type, id: msg.id, ...JSON.parse(session[msg.type]()) };
    }
    case "lose_device": {
      const { session } = await requireRuntime();
      const out = JSON.parse(session.lose_device());   // refused unless init had drills: true
      if (out.error) throw new WorkerError(out.error.code, out.error.message);
      return { type: "lose_device_ack", id: msg.id, ...out };
    }
  }
}

// --- liveness (client.js) ---------------------------------------------------------------------
setInterval(() => post({ type: "heartbeat" }), HEARTBEAT_MS);
if (self.name && navigator.locks) {
  // Held until this worker dies; 'alive' tells the client it may now queue for the lock.
  navigator.locks.request(self.name, () => {
    post({ type: "alive" });
    return new Promise(() => {});
  }).catch(() => {});
}

self.onmessage = (event) => {
  const msg = event.data;
  handle(msg).then(post, (e) => {
    // A PythonError after a fatal error, or a wasm abort, leaves Pyodide unusable.
    const fatal = /fatal error|RuntimeError: (memory access|unreachable)|Aborted/.test(String(e?.message));
    post({ type: "error", id: msg?.id ?? null, code: e?.code ?? (fatal ? "fatal" : "internal"),
           message: String(e?.message ?? e), fatal });
  });
};
