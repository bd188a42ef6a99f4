// pyspec worker: Pyodide + the pyspec wheel, weights in OPFS, a typed message protocol.
//
// Everything comes from this worker's own origin: Pyodide's core, its numpy wheel and the
// snapshot of its start-up from ./pyodide/, the pyspec wheel and the models, as listed in
// ./manifest.json (sha256 checked here; the site build checked numpy's against Pyodide's own
// pyodide-lock.json).
//
// Requests (each carries an `id`; every reply carries the same id):
//   {type:'init', id, champion, draft, maxCtx, backend, drills, drill, snapshot}
//                                                -> {type:'progress', id, phase, loaded, total}*
//                                                   then {type:'ready', id, adapter, webgpu,
//                                                   notices, startup, ...}
//       champion: a manifest model name ('tiny', 'smollm2'), {url, sha256?} (sha256: 64 hex
//                 digits, either case; a model without one is not cached) or a File/Blob the
//                 user picked (hashed as it is copied into OPFS, weights.js importBlob). A
//                 model by URL or Blob gets its card first, before its download (header.js):
//                 {type:'progress', id, phase:'card', card, header}, or, where the page
//                 cannot run it, the error (bad_model, model_too_large) and no download
//       draft: 'ngram' (default) | 'auto' | 'none' | 'self:L' | a model name or {url, sha256?,
//              vocab?} or a File/Blob (a draft model; vocab: {url, sha256?} of its reduced
//              head, fetchVocab).
//              'auto': the manifest's trained draft for the champion where it pays, as
//              Python's rule decides (autoDraft), else n-gram; ready.draft_auto says why
//       drills: true switches fault drills on (lose_device, config.drill); off by default
//       drill: a loading fault drill (drills on), weights.js LOAD_DRILLS
//       gpuLimits: {maxBufferSize?, maxStorageBufferBindingSize?}: the adapter's limits as the
//       card and the weights' upload read them, lowered (tests: tables split into row parts)
//       snapshot: false starts Python without a Pyodide snapshot (shipped or saved) and imports
//       without the bytecode cache (runtime.js)
//       startup: {snapshot, bytecode, snapshot_error?, phases_ms: {pyodide, packages, import,
//       weights, model}}: how the runtime started (runtime.js), where the time went
//       (weights: their sha256 as they stream, stream.js; model: parse, upload, compile)
//       wasm_bytes: {before_weights, after_load}: the wasm heap's size (its high-water mark)
//       before the weights were hashed and after the model loaded: what streaming them cost
//       webgpu: {available, vendor, architecture, description, fallback, limits:
//       {maxBufferSize, maxStorageBufferBindingSize}} (webgpuInfo); card: the champion's card
//       when it was given by URL or Blob, else null
//       notices: [{code, message}] of faults met while loading, recovered from (a damaged
//       cache downloaded again, no OPFS, a dropped download resumed, ...); the receipt's faults
//       record them too (web.py LOAD_FAULTS)
//   {type:'generate', id, messages, config, resume}
//                                                -> {type:'started', id} once it is checked and
//                                                   about to run (none where it fails a check)
//                                                   then {type:'chunk', id, offset, text, tokens,
//                                                   ids, cycle}*
//                                                   then {type:'done', id, text, tokens, stats, receipt,
//                                                   finish_reason, notice}   (finish_reason
//                                                   'cancelled' after a cancel; stats and receipt
//                                                   null for a request cancelled before it
//                                                   started; notice: a message when the
//                                                   conversation was fitted to the context, else
//                                                   null)
//       config: {draft, k, tree, verify, temperature, seed, max_tokens, drill, context_overflow
//       ('drop_oldest' default | 'error'), json_schema or response_format, and the sampling
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
//   {type:'card', id, model, backend, maxCtx}   -> {type:'card', id, card, error, header}
//       model: as init's champion; the model card (pyspec/apps/info.py, the same as `python -m
//       pyspec info --json`) read from the header alone, with this adapter's limits (webgpu
//       below); error {code, message} when this page cannot run it, else null; header {bytes,
//       range}: the bytes read, and whether the server answered Range (header.js)
//   {type:'measure', id, drafts, perStratum, maxTokens, workload}
//                                                -> {type:'progress', id, phase:'measure',
//                                                   loaded, total, label}* (runs done, of all)
//                                                   then {type:'measured', id, result, verdicts,
//                                                   stored} or {type:'measured', id,
//                                                   cancelled: true} after a cancel
//       "measure on this device" (docs/gate.md): a sample of the shipped public workload (the
//       first perStratum prompts of each stratum, default 1, at most maxTokens new tokens each,
//       default 32; 0: all, no cap), or the JSONL text `workload`, side by side with
//       champion-only on this session's champion, judged by the gate's rule (Session.measure,
//       apps/page_gate.py). result: the gate's JSON (result.text: its table as the CLI prints
//       it; result.webgpu: the adapter, as ready's webgpu); verdicts: the new ones, also
//       merged into OPFS verdicts.json (stored: whether that write happened), which draft
//       "auto" follows from the next init on. A cancelled run stores nothing, nor does a
//       sample under the gate's minimum (verdicts [], each drafter's not_recorded says why).
//       A malformed or empty workload: code bad_workload.
//   {type:'cancel', id, target}  (target: the id of a generate or measure, running or waiting)
//                                                -> {type:'cancel_ack', id, cancelled}
//   {type:'stats', id} / {type:'receipt', id}     -> {type:'stats', id, stats, memory, startup} /
//                                                   {type:'receipt', ...}
//       startup: the ready message's, as of now, with jinja2: {loaded, first_render_ms}: whether
//       a model's own chat template has imported jinja2, and its first render's cost (ChatML
//       never imports it)
//       memory: {gpu_devices, gpu_bytes, wasm_bytes}: WebGPU devices alive, their buffers' bytes,
//       the wasm heap
//   {type:'lose_device', id}  (a fault drill, drills on: destroys the WebGPU device mid-request)
//                                                -> {type:'lose_device_ack', id, lost}
// Unasked: {type:'heartbeat'} every HEARTBEAT_MS while the event loop is free, and a Web Lock
// named after the worker (new Worker(url, {name})) held for its whole life, which the browser
// releases when the worker dies, terminate() included: client.js's liveness checks ({type:
// 'alive'}, once, says the lock is held, so the client may queue for it).
// Any failure replies {type:'error', id, code, message, fatal}; fatal means this worker is unusable
// (Pyodide crashed) and the client should start a new one. A message that is not an object, has
// no known type, or has a field of the wrong type (REQUESTS below) gets code 'bad_request' before
// anything runs; the worker stays usable. Fields the Python session reads (config, messages)
// are checked there and refused as 'bad_config'.
//
// Modules: runtime.js (start-up: Pyodide, the snapshot, the bytecode cache), weights.js (OPFS,
// downloads, the cache's lock), stream.js (the weights hashed and read by Python as they
// stream), header.js (the card), manifest.js (what they share); here the requests and their
// handlers.
// Not here: decoding (pyspec/apps/session.py and the engine), retries across workers (client.js).

import { WorkerError, manifest, sleep } from "./manifest.js";
import { busyEnd, busyStart, hasRuntime, makeCachesWhenIdle, requireRuntime, runtime,
         runtimeStartup } from "./runtime.js";
import { modelCard } from "./header.js";
import { readVerdicts, shippedWorkload, writeVerdicts } from "./verdicts.js";
import { LOAD_DRILLS, fetchVocab, fetchWeights, importBlob, openWeights,
         resolveModel } from "./weights.js";

const HEARTBEAT_MS = 1000;    // client.js's stall timeout must be well above this

let queue = Promise.resolve(); // init and generate requests run one after another
const generating = new Set();  // ids of the generate and measure requests queued or running
const cancelledEarly = new Set();   // ... cancelled before the runtime existed (a fresh worker)

const post = (msg) => self.postMessage(msg);

// --- the draft "auto" -------------------------------------------------------------------------
// Python's rule (pyspec/drafters/auto.py, through Session.auto_draft), given what only the
// worker knows before anything downloads: whether the manifest lists a trained draft for this
// champion (draft_for), and the WebGPU adapter. {draft: a manifest name or "ngram", reason,
// webgpu: webgpuInfo()'s answer when asked}.
async function autoDraft(running, champion, backend) {
  const m = await manifest();
  const trained = m.artifacts.find((x) => x.kind === "model" && x.draft_for === champion.name);
  const webgpu = backend === "cpu" ? null : await webgpuInfo();
  const { session } = await running;
  // A verdict recorded here (verdicts.js) for this champion and draft comes first.
  const facts = { has_model: Boolean(trained), backend, webgpu, verdicts: await readVerdicts(),
                  champion_sha256: champion.sha256, draft_sha256: trained?.sha256 ?? null };
  const { model, reason } = JSON.parse(session.auto_draft(JSON.stringify(facts)));
  return { draft: model ? trained.model : "ngram", reason, webgpu };
}

async function webgpuInfo() {
  try {
    // Unanswered (a GPU process restarting) is reported as unavailable, not waited for.
    const answer = navigator.gpu?.requestAdapter();
    const adapter = await Promise.race([answer, sleep(20000).then(() => {
      throw new Error("navigator.gpu.requestAdapter gave no answer in 20 s");
    })]);
    if (!adapter) return { available: false };
    const info = adapter.info ?? {};
    // (GPUAdapterInfo.isFallbackAdapter; GPUAdapter's in older browsers, as browser.py reads it)
    const { maxBufferSize, maxStorageBufferBindingSize } = adapter.limits;
    return { available: true, vendor: info.vendor, architecture: info.architecture,
             description: info.description,
             limits: { maxBufferSize, maxStorageBufferBindingSize },
             fallback: info.isFallbackAdapter ?? adapter.isFallbackAdapter ?? null };
  } catch (e) {
    return { available: false, error: String(e) };
  }
}

// --- requests --------------------------------------------------------------------------------
// What each request's fields must be when present (null or absent means the default).
const isObject = (v) => typeof v === "object" && v !== null && !Array.isArray(v);
// A sha256 is 64 hex digits: "" or another form would otherwise turn the check off or fail it.
const isUrlSpec = (v) => isObject(v) && typeof v.url === "string" &&
  (v.sha256 == null || (typeof v.sha256 === "string" && /^[0-9a-f]{64}$/i.test(v.sha256)));
const isModelSpec = (v) => (typeof v === "string" && v.length > 0) || v instanceof Blob ||
  (isUrlSpec(v) && (v.size == null || Number.isSafeInteger(v.size)) &&
   (v.vocab == null || isUrlSpec(v.vocab)));
const REQUESTS = {
  init: { champion: [isModelSpec, "a model name or {url, sha256?} with sha256 64 hex digits"],
          draft: [isModelSpec, "a draft spec, a model name or {url, sha256?, vocab?} with " +
                  "each sha256 64 hex digits"],
          maxCtx: [(v) => Number.isSafeInteger(v) && v > 0, "a positive integer"],
          backend: [(v) => typeof v === "string", "a string"],
          drills: [(v) => typeof v === "boolean", "true or false"],
          drill: [(v) => typeof v === "string", "a loading fault drill"],
          snapshot: [(v) => typeof v === "boolean", "true or false"],
          gpuLimits: [isObject, "{maxBufferSize?, maxStorageBufferBindingSize?} in bytes"] },
  generate: { messages: [Array.isArray, "an array of {role, content}"],
              config: [isObject, "an object"],
              resume: [(v) => isObject(v) && Array.isArray(v.ids), "{ids: [token ids], fault}"] },
  card: { model: [isModelSpec, "a model name, {url, sha256?} or a File/Blob"],
          maxCtx: [(v) => Number.isSafeInteger(v) && v > 0, "a positive integer"],
          backend: [(v) => typeof v === "string", "a string"] },
  measure: { drafts: [(v) => Array.isArray(v) && v.every((d) => typeof d === "string"),
                      "a list of drafter names"],
             perStratum: [(v) => Number.isSafeInteger(v) && v >= 0, "an integer >= 0"],
             maxTokens: [(v) => Number.isSafeInteger(v) && v >= 0, "an integer >= 0"],
             workload: [(v) => typeof v === "string", "JSONL text"] },
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
// NaN and Infinity would become null, that is the option's default: refused by name instead
// (bad_config, as client.js refuses them before posting).
function toJson(value, what) {
  const finite = (key, v) => {
    if (typeof v === "number" && !Number.isFinite(v)) {
      throw new WorkerError("bad_config", `${what}${key === "" ? "" : `.${key}`} must be a ` +
                            `finite number, got ${v}`);
    }
    return v;
  };
  try {
    return JSON.stringify(value, finite);
  } catch (e) {
    if (e instanceof WorkerError) throw e;
    throw new WorkerError("bad_request", `${what} cannot be sent as JSON: ${e.message}`);
  }
}

// --- handlers -------------------------------------------------------------------------------
const NON_MODEL_DRAFTS = /^(ngram|none|self:\d+)$/;

async function init(msg) {
  const progress = (phase, loaded, total, label) =>
    post({ type: "progress", id: msg.id, phase, loaded, total, ...(label != null && { label }) });
  const t0 = performance.now();
  const champion = await resolveModel(msg.champion ?? "smollm2");
  const weights = { downloaded: 0, cached: false, corrupt: 0 };
  if (msg.drill != null && (!msg.drills || !LOAD_DRILLS.includes(msg.drill))) {
    throw new WorkerError("bad_config", `init's drill must be one of ${LOAD_DRILLS.join(", ")}` +
                          " and needs drills: true");
  }
  // The faults met while loading, recovered from: the ready message's notices, the receipts'.
  const load = { drill: msg.drill ?? null, faults: [], notices: [],
                 fault(kind, t0, message) {
                   this.faults.push({ kind, recovery_s: (performance.now() - t0) / 1000 });
                   this.notices.push({ code: kind, message });
                 } };
  const { pyodide, session, champFetched, auto, draft, draftFetched, draftVocab } =
    await fetchModels(msg, champion, progress, weights, load);
  const t1 = performance.now();
  const heap = () => pyodide._module.HEAP8.buffer.byteLength;   // grows only: its high mark
  const wasmBefore = heap();
  // The weights as sources Python streams a tensor at a time (stream.js), checked by sha256.
  const champSource = await openWeights(pyodide, champFetched, progress, weights, load);
  const draftSource = draft && await openWeights(pyodide, draftFetched, progress, weights, load);
  const t2 = performance.now();
  progress("load", 0, 1, champion.name);
  // backend: "auto" (make_engine's choice) | "webgpu" | "cpu"; a hint make_engine may honour.
  const options = { draft: auto ? "auto" : draft ? "model" : msg.draft ?? "ngram",
                    max_ctx: msg.maxCtx ?? null,
                    backend: msg.backend ?? "auto", champion_name: champion.name,
                    draft_name: draft?.name, draft_vocab: draftVocab || null,
                    draft_vocab_shipped: draft?.vocab?.shipped ?? false,
                    drills: msg.drills ?? false,
                    gpu_limits: msg.gpuLimits ?? null,
                    load_faults: load.faults,
                    verdicts: await readVerdicts(),   // the gate's, for draft "auto"
                    warm: true };   // the system turn is prefilled after ready (Session.warm)
  await Promise.all([champSource.open(), draftSource?.open()]);   // fast reads for the load
  let info;
  try {
    info = JSON.parse(await session.load(JSON.stringify(options), champSource,
                                         draftSource || null));
  } finally {
    champSource.close();
    draftSource?.close();
  }
  if (info.error) throw new WorkerError(info.error.code, info.error.message);
  Object.assign(runtimeStartup.phases_ms, { weights: Math.round(t2 - t1),
                                            model: Math.round(performance.now() - t2) });
  progress("load", 1, 1, champion.name);
  post({ type: "ready", id: msg.id, ...info, webgpu: auto?.webgpu ?? await webgpuInfo(),
         draft_auto: auto ? info.draft_auto ?? auto.reason : null,
         champion: champion.name, draft_model: draft?.name ?? null, weights,
         card: champFetched.card ?? null,
         notices: load.notices, startup: structuredClone(runtimeStartup),
         wasm_bytes: { before_weights: wasmBefore, after_load: heap() },
         init_ms: performance.now() - t0 });
  // Once ready is out: the system turn's prefill (Session.warm), and, once this worker has
  // been idle a while, the snapshot and bytecode for the next visit, on another core.
  session.warm();
  makeCachesWhenIdle();
  return null;      // posted above
}

// The runtime started and the models fetched, all at once: the champion downloads while Pyodide
// loads (a bad URL fails here without waiting for the runtime). A draft "auto" is decided by
// Python once the runtime is up (autoDraft), before the draft downloads, so a page where the
// draft does not pay never fetches it.
async function fetchModels(msg, champion, progress, weights, load) {
  const running = runtime(progress, { snapshot: msg.snapshot ?? true, drill: load.drill });
  const draftModel = async (drafter) => {
    const isModel = drafter && !(typeof drafter === "string" && NON_MODEL_DRAFTS.test(drafter));
    return isModel ? resolveModel(drafter).catch((e) => {
      e.message = `draft: ${e.message}`;   // which of the two models it is about
      throw e;
    }) : null;
  };
  const given = msg.draft === "auto" ? null : await draftModel(msg.draft);
  const drafting = (async () => {
    const auto = msg.draft === "auto" ? await autoDraft(running, champion, msg.backend ?? "auto")
      : null;
    const draft = auto ? await draftModel(auto.draft) : given;
    const [draftFetched, draftVocab] = await Promise.all([
      draft && obtain(draft, running, msg, progress, weights, load),
      draft?.vocab && fetchVocab(draft.vocab, load)]);
    return { auto, draft, draftFetched, draftVocab };
  })();
  const [{ pyodide, session }, champFetched, drafted] = await Promise.all([
    running, obtain(champion, running, msg, progress, weights, load), drafting]);
  return { pyodide, session, champFetched, ...drafted };
}

// A model's bytes. A manifest model's download starts at once; one by URL or Blob waits for the
// runtime and its card, and is refused there, before any download, when this page cannot run
// it; a Blob is then copied into OPFS (importBlob). The card goes out as a progress message.
async function obtain(model, running, msg, progress, weights, load) {
  if (model.shipped) return fetchWeights(model, progress, weights, load);
  const { pyodide, session } = await running;
  const { card, error, header } = await checkCard(pyodide, session, model, msg);
  post({ type: "progress", id: msg.id, phase: "card", loaded: 1, total: 1, label: model.name,
         card, header });
  if (error) throw new WorkerError(error.code, error.message);
  const fetched = model.blob ? await importBlob(pyodide, model, progress, load)
    : await fetchWeights(model, progress, weights, load);
  return { ...fetched, card };
}

// The card of `model` for this page: the adapter's limits (none with backend cpu or no WebGPU)
// and init's maxCtx decide (Session.card).
async function checkCard(pyodide, session, model, { backend = "auto", maxCtx = null,
                                                   gpuLimits = null }) {
  const gpu = backend === "cpu" ? null : await webgpuInfo();
  const limits = gpu?.available ? { ...gpu.limits } : null;
  for (const [key, cap] of Object.entries((limits && gpuLimits) ?? {})) {
    if (key in limits) limits[key] = Math.min(limits[key], cap);   // init's lowered limits
  }
  const facts = { limits, backend, ctx: maxCtx };
  return modelCard(pyodide, session, model, facts);
}

async function generate(msg) {
  const { session } = await requireRuntime();
  if (cancelledEarly.delete(msg.id)) session.cancel(msg.id, true);   // ends before it starts
  const onChunk = (offset, text, tokens, ids, cycle, marks) =>
    post({ type: "chunk", id: msg.id, offset, text, tokens, ids: JSON.parse(ids), cycle,
           ...JSON.parse(marks) });
  const onStart = () => post({ type: "started", id: msg.id });
  const out = JSON.parse(await session.generate(msg.id, toJson(msg.messages ?? [], "messages"),
                                                toJson(msg.config ?? {}, "config"), onChunk,
                                                toJson(msg.resume ?? null, "resume"), onStart));
  if (out.error) throw new WorkerError(out.error.code, out.error.message);
  return { type: "done", id: msg.id, ...out };
}

// "Measure on this device": Python runs and judges the sample (Session.measure); the table it
// returns goes to OPFS only when the run finished.
async function measure(msg) {
  const { session } = await requireRuntime();
  if (cancelledEarly.delete(msg.id)) session.cancel(msg.id, true);
  const workload = msg.workload != null ? { text: msg.workload, name: "the workload given" }
    : await shippedWorkload();
  const options = { drafts: msg.drafts ?? null, per_stratum: msg.perStratum ?? null,
                    max_tokens: msg.maxTokens ?? null, source: workload.name };
  const onProgress = (loaded, total, label) =>
    post({ type: "progress", id: msg.id, phase: "measure", loaded, total, label });
  const out = JSON.parse(await session.measure(msg.id, JSON.stringify(options), workload.text,
                                               await readVerdicts(), onProgress));
  if (out.error) throw new WorkerError(out.error.code, out.error.message);
  if (out.cancelled) return { type: "measured", id: msg.id, cancelled: true, result: null };
  // A sample under the gate's minimum records nothing (gate.unrecorded): the table stays as it was.
  const stored = out.verdicts.length ? await writeVerdicts(out.table) : false;
  // The WebGPU adapter behind the engine's class (a software one: SwiftShader), for this page
  // only: the verdict keeps the class alone.
  const webgpu = await webgpuInfo();
  return { type: "measured", id: msg.id, cancelled: false, result: { ...out.result, webgpu },
           verdicts: out.verdicts, stored };
}

const QUEUED = { init, generate, measure };

async function handle(msg) {
  checkRequest(msg);
  switch (msg.type) {
    case "init":
    case "generate":
    case "measure": {
      // One at a time, in arrival order: a request waits for the one before it to finish.
      busyStart();
      if (msg.type !== "init") generating.add(msg.id);
      const run = queue.then(() => QUEUED[msg.type](msg));
      queue = run.catch(() => {});
      run.finally(() => {
        busyEnd();
        if (msg.type !== "init") generating.delete(msg.id);
      }).catch(() => {});
      return run;
    }
    case "cancel": {
      // A request still waiting its turn (or being set up) is cancelled too: it ends before
      // its first cycle (web.py Session.cancel).
      const target = msg.target ?? msg.id;
      if (!hasRuntime()) {   // a new worker still starting: its queued request ends unrun
        const queued = generating.has(target);
        if (queued) cancelledEarly.add(target);
        return { type: "cancel_ack", id: msg.id, cancelled: queued };
      }
      const { session } = await requireRuntime();
      return { type: "cancel_ack", id: msg.id,
               ...JSON.parse(session.cancel(target, generating.has(target))) };
    }
    case "stats":
    case "receipt": {
      const { pyodide, session } = await requireRuntime();
      const out = { type: msg.type, id: msg.id, ...JSON.parse(session[msg.type]()) };
      if (msg.type === "stats") {   // the snapshot's progress, and jinja2's (on first use)
        out.startup = { ...runtimeStartup, jinja2: out.jinja2 };
        delete out.jinja2;
      }
      // stats.memory adds the wasm heap (it only grows: its high-water mark).
      if (out.memory) out.memory.wasm_bytes = pyodide._module.HEAP8.buffer.byteLength;
      return out;
    }
    case "card": {   // no queue: it reads a header, alongside a load or a request
      const { pyodide, session } = await runtime(() => {});
      const model = await resolveModel(msg.model);
      return { type: "card", id: msg.id, ...await checkCard(pyodide, session, model, msg) };
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
  handle(msg).then((reply) => reply && post(reply), (e) => {
    // A PythonError after a fatal error, or a wasm abort, leaves Pyodide unusable.
    // worker_oom: the wasm heap ran out (web.py); a new worker is the only safe place to go on.
    const fatal = e?.code === "worker_oom" ||
      /fatal error|RuntimeError: (memory access|unreachable)|Aborted/.test(String(e?.message));
    // A code is always one of ours, a string (a DOMException's numeric code is not).
    const named = e instanceof DOMException ? `${e.name}: ` : "";
    post({ type: "error", id: msg?.id ?? null,
           code: (String(e?.code) === e?.code && e.code) || (fatal ? "fatal" : "internal"),
           message: named + String(e?.message ?? e), fatal });
  });
};
