// pyspec worker (DESIGN §8): Pyodide + the pyspec wheel, weights in OPFS, a typed message protocol.
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
//       champion: a manifest model name ('tiny', 'smollm2') or {url, sha256?} (sha256: 64 hex
//                 digits, either case; a model without one is not cached)
//       draft: 'ngram' (default) | 'auto' | 'none' | 'self:L' | a model name or {url, sha256?,
//              vocab?} (a draft model; vocab: {url, sha256?} of its reduced head, fetchVocab).
//              'auto': the manifest's trained draft for the champion on a hardware WebGPU
//              adapter, else n-gram (autoDraft); ready.draft_auto says why
//       drills: true switches fault drills on (lose_device, config.drill); off by default
//       drill: a loading fault drill (drills on), LOAD_DRILLS below
//       snapshot: false starts Python without a Pyodide snapshot (shipped or saved) and imports
//       without the bytecode cache (startPyodide below)
//       startup: {snapshot, bytecode, snapshot_error?, phases_ms: {pyodide, packages, import,
//       weights, model}}: how the runtime started (startPyodide below), where the time went
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
//       config: {draft, k, verify, temperature, seed, max_tokens, drill, context_overflow
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
//   {type:'cancel', id, target}  (target: the id of a generate, running or waiting its turn)
//                                                -> {type:'cancel_ack', id, cancelled}
//   {type:'stats', id} / {type:'receipt', id}     -> {type:'stats', id, stats, memory, startup} /
//                                                   {type:'receipt', ...}
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
// Not here: decoding (pyspec/apps/session.py and the engine), retries across workers (client.js).

import { loadPyodide } from "./pyodide/pyodide.mjs";
import * as webgpuHelpers from "./webgpu.js";
import * as dequantKernels from "./dequant.js";
import { SNAPSHOT_NAME, checkSnapshot, readBytecode, readSnapshot, snapshotDir }
  from "./snapshot.js";

const SITE = new URL("./", import.meta.url);
const OPFS_DIR = "pyspec-weights";
const READ_BLOCK = 8 << 20;   // bytes per OPFS read, one progress report each
const HEARTBEAT_MS = 1000;    // client.js's stall timeout must be well above this
// A dropped download is retried this many times, after BACKOFF_MS, then 2x, 4x, ... (0.25 +
// 0.5 + 1 + 2 + 4 s at most), each from the byte it reached (a Range request).
const DOWNLOAD_RETRIES = 5;
const BACKOFF_MS = 250;
// The weights cache held by another page of this site (OPFS access handles are exclusive): wait
// for it this long, polling, before downloading into memory instead.
const BUSY_WAIT_MS = 30000;
// One try at the handle that has no answer after this long counts as refused (see tryAccess).
const ACCESS_TRY_MS = 2000;
// Loading fault drills (init's drill, drills on), each made real here:
//   opfs-truncate / opfs-flip   the cached file cut to half / bytes flipped, as a later load
//                               finds it: detected (size / sha256) and downloaded again
//   opfs-quota                  a write to OPFS refused with QuotaExceededError (on a first
//                               visit: the cached file is removed first): from memory
//   opfs-unavailable            no OPFS (as in a private window): from memory, with a notice
//   download-drop               the download (a first visit's) cut halfway, the connection
//                               cancelled: resumed with a Range request
//   opfs-stall                  the first try at the file's access handle never answers (as
//                               Chromium's at times does, tryAccess): asked again
const LOAD_DRILLS = ["opfs-truncate", "opfs-flip", "opfs-quota", "opfs-unavailable",
                     "download-drop", "opfs-stall"];

class WorkerError extends Error {
  constructor(code, message) { super(message); this.code = code; }
}

let manifestPromise = null;
let runtimePromise = null;     // {pyodide, session}
let queue = Promise.resolve(); // init and generate requests run one after another
const generating = new Set();  // ids of the generate requests queued or running here
const cancelledEarly = new Set();   // ... cancelled before the runtime existed (a fresh worker)

const post = (msg) => self.postMessage(msg);

// --- manifest and runtime ---------------------------------------------------------------------
function manifest() {
  // A failed fetch is not kept: a later init (reload) asks again.
  manifestPromise ??= fetch(new URL("manifest.json", SITE)).then(async (r) => {
    if (!r.ok) throw new WorkerError("download_failed", `manifest.json: HTTP ${r.status}`);
    const body = await r.text();
    try {
      return JSON.parse(body);
    } catch {
      // A host's single-page-app fallback answers a missing file with its index.html, 200.
      throw new WorkerError("download_failed", `manifest.json next to worker.js is not JSON ` +
                            `(served as '${r.headers.get("content-type")}': a missing file ` +
                            "answered with a page?); serve the site's manifest.json there");
    }
  }).catch((e) => {
    manifestPromise = null;
    throw e instanceof WorkerError ? e
      : new WorkerError("download_failed", `manifest.json could not be fetched (${e.message})`);
  });
  return manifestPromise;
}

async function sha256Hex(bytes) {
  const digest = await crypto.subtle.digest("SHA-256", bytes);   // copies `bytes` synchronously
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}

// How this worker's runtime started (the ready message's `startup`): the snapshot's and the
// bytecode cache's fate and each phase's milliseconds; the phases of the weights and the model
// are each init's own.
let runtimeStartup = null;
let runtimeWheels = null;      // {artifacts, data}: what the caches' maker unpacks, until it runs

function runtime(progress, { snapshot = true, drill = null } = {}) {
  runtimePromise ??= (async () => {
    const caches = !snapshot ? "off" : drill === "opfs-unavailable" ? "unavailable" : null;
    const startup = runtimeStartup = { snapshot: caches, bytecode: caches, phases_ms: {} };
    const m = await manifest();
    progress("runtime", 0, 3);
    let t = performance.now();
    const lap = (phase) => {
      const now = performance.now();
      startup.phases_ms[phase] = Math.round(now - t);
      t = now;
    };
    // The wheels download (and are checked), and the caches are read, while Python starts.
    const artifacts = m.artifacts.filter((a) => a.kind === "pyodide-wheel" ||
                                                a.kind === "pyspec-wheel");
    const wheels = Promise.all(artifacts.map(wheel));
    wheels.catch(() => {});   // a failure is reported where they are awaited, not before
    const dir = caches === null ? await snapshotDir() : null;
    if (caches === null && !dir) startup.snapshot = startup.bytecode = "unavailable";
    const bytecode = dir ? readBytecode(dir, artifacts) : null;
    const shipped = m.artifacts.find((a) => a.kind === "pyodide-snapshot");
    await checkPyodideFiles(m);
    const pyodide = await startPyodide(startup, dir, shipped);
    pyodide.registerJsModule("pyspec_webgpu", webgpuHelpers);   // pyspec/gpu/browser.py's
    pyodide.registerJsModule("pyspec_dequant", dequantKernels); // pyspec/apps/session.py's
    lap("pyodide");
    progress("runtime", 1, 3);
    // numpy (Pyodide's own build, its sha256 checked against pyodide-lock.json when the site was
    // built, and against the manifest here) and pyspec are unpacked into site-packages, dist-info
    // included. Not loadPackage: it loads all 19 of numpy's shared libraries at once, 7.4 MB of
    // wasm; unpacked, an import loads the ones it needs (numpy.random's 2 MB are never loaded),
    // a second faster. No micropip: loading it, packaging and its resolver, another second.
    const sitePackages = pyodide.runPython("import sysconfig\nsysconfig.get_path('purelib')");
    const data = await wheels;
    for (const bytes of data) pyodide.unpackArchive(bytes, "zip", { extractDir: sitePackages });
    if (dir) {
      startup.bytecode = unpackBytecode(pyodide, await bytecode, sitePackages, startup);
      if (startup.bytecode === "making") runtimeWheels = { artifacts, data };
    }
    lap("packages");
    progress("runtime", 2, 3);
    const session = pyodide.runPython("from pyspec.apps.session import Session\nSession()");
    lap("import");
    progress("runtime", 3, 3);
    return { pyodide, session };
  })();
  runtimePromise.catch(() => { runtimePromise = null; });
  return runtimePromise;
}

// Pyodide's own files (the manifest's kind "pyodide"; pyodide.mjs has loaded with this worker),
// asked for with HEAD before Python starts: loadPyodide neither rejects nor returns when its
// wasm is missing or served as another type than application/wasm (the streaming compile
// refuses it, and Pyodide only logs a warning), and a missing python_stdlib.zip surfaces as a
// Python traceback. Either is a deployment mistake: download_failed, naming the file.
async function checkPyodideFiles(m) {
  const files = m.artifacts.filter((a) => a.kind === "pyodide" && !a.url.endsWith(".mjs"));
  await Promise.all(files.map(async (a) => {
    let resp;
    try {
      resp = await fetch(new URL(a.url, SITE), { method: "HEAD" });
    } catch (e) {
      throw new WorkerError("download_failed", `${a.url}: ${e.message ?? e}`);
    }
    if (resp.status === 405 || resp.status === 501) return;   // a host without HEAD: unchecked
    if (!resp.ok) throw new WorkerError("download_failed", `${a.url}: HTTP ${resp.status}`);
    const type = resp.headers.get("content-type") ?? "";
    if (a.url.endsWith(".wasm") && !type.startsWith("application/wasm")) {
      throw new WorkerError("download_failed", `${a.url} is served as '${type || "no type"}': ` +
                            "WebAssembly needs application/wasm; set that type for .wasm files " +
                            "on the server");
    }
  }));
}

// A wheel of the manifest, its bytes checked against the manifest's sha256.
async function wheel(artifact) {
  const resp = await fetch(new URL(artifact.url, SITE));
  if (!resp.ok) throw new WorkerError("download_failed", `${artifact.url}: HTTP ${resp.status}`);
  const data = new Uint8Array(await resp.arrayBuffer());
  if ((await sha256Hex(data)) !== artifact.sha256) {
    throw new WorkerError("corrupt_download", `${artifact.url} does not match its sha256`);
  }
  return data;
}

// The bytecode cache (snapshot.js) unpacked beside the wheels' source: "cached", or "making"
// when there is none for these wheels or it is damaged (its __pycache__ folders are removed
// then, so Python compiles the source as without a cache).
function unpackBytecode(pyodide, zip, sitePackages, startup) {
  if (!zip) return "making";
  try {
    pyodide.unpackArchive(zip, "zip", { extractDir: sitePackages });
    return "cached";
  } catch (e) {
    startup.snapshot_error = `the bytecode cache is damaged: ${e.message ?? e}`;
    pyodide.runPython("import os, shutil, sysconfig\nsite = sysconfig.get_path('purelib')\n" +
                      "for top in ('numpy', 'pyspec'):\n" +
                      "    for folder, _, _ in list(os.walk(os.path.join(site, top))):\n" +
                      "        if folder.endswith('__pycache__'): shutil.rmtree(folder)");
    return "making";
  }
}

// --- the Pyodide snapshot and the bytecode cache (snapshot.js) --------------------------------
// startup.snapshot and startup.bytecode, in the ready message (and in stats replies, as they
// change):
//   "restored"   Python started from the snapshot a visit before saved in OPFS
//   "shipped"    ... from the one the site ships (pyodide/, made at build), none saved here
//   "cached"     (bytecode) numpy and pyspec imported from the bytecode a visit before saved
//   "making"     none was usable: Python started the ordinary way (or compiled the source), and
//                once ready is posted snapshot-worker.js makes it for the next visit ("saved"
//                when it has, "failed" with snapshot_error when it could not)
//   "off"        init's snapshot: false;  "unavailable": no OPFS (a private window), where the
//                shipped snapshot still serves
async function startPyodide(startup, dir, shipped) {
  const indexURL = new URL("pyodide/", SITE).href;
  if (startup.snapshot === "off") return loadPyodide({ indexURL });
  // A saved snapshot that is damaged or does not start is removed, so later visits do not read
  // it again (the shipped one serves, or a new one is made).
  const sources = [];
  if (dir) {
    sources.push(["restored", "saved", (fail) => readSnapshot(dir, fail),
                  () => dir.removeEntry(SNAPSHOT_NAME).catch(() => {})]);
  }
  if (shipped) sources.push(["shipped", "shipped", (fail) => fetchSnapshot(shipped, fail), null]);
  for (const [state, which, read, discard] of sources) {
    let failed = false;
    const fail = (why) => { failed = true; startup.snapshot_error = why; };
    const memory = await read(fail);
    if (memory) {
      try {
        const pyodide = await loadPyodide({ indexURL, _loadSnapshot: memory });
        startup.snapshot = state;
        return pyodide;
      } catch (e) {
        fail(`the ${which} snapshot did not start: ${e}`);
      }
    }
    if (failed) await discard?.();
  }
  if (dir) startup.snapshot = "making";   // else it stays "unavailable": nowhere to save one
  return loadPyodide({ indexURL });
}

// The site's snapshot (its manifest artifact), or null.
async function fetchSnapshot(artifact, problem) {
  try {
    const resp = await fetch(new URL(artifact.url, SITE));
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    const memory = await checkSnapshot(new Uint8Array(await resp.arrayBuffer()));
    if (memory) return memory;
    problem(`the shipped snapshot ${artifact.url} is damaged (its sha256 does not match)`);
  } catch (e) {
    problem(`cannot fetch the shipped snapshot ${artifact.url}: ${e.message ?? e}`);
  }
  return null;
}

// Requests (init, generate) queued or running, and when the last one ended: the caches' maker
// waits for the worker to be idle IDLE_MS, so it does not compete with a first request for the
// two cores (a visitor usually reads or types for a while after ready).
let busy = 0;
let lastBusy = 0;
const IDLE_MS = 2000;

function whenIdle(task) {
  const poll = () => {
    if (busy === 0 && performance.now() - lastBusy >= IDLE_MS) task();
    else setTimeout(poll, 250);
  };
  poll();
}

// The snapshot and bytecode for the next visit, made by a worker of its own; once per worker.
let cacheMaker = null;

function makeCaches(startup) {
  cacheMaker ??= new Promise((resolve) => {
    const { artifacts, data } = runtimeWheels ?? { artifacts: [], data: [] };
    runtimeWheels = null;
    const maker = new Worker(new URL("./snapshot-worker.js", import.meta.url),
                             { type: "module", name: "pyspec-snapshot" });
    const done = (outcome, error) => {
      for (const key of ["snapshot", "bytecode"]) {
        if (startup[key] === "making") startup[key] = outcome;
      }
      if (error) startup.snapshot_error = error;
      maker.terminate();
      resolve();
    };
    maker.onmessage = (e) => (e.data?.saved ? done("saved") : done("failed", e.data?.error));
    maker.onerror = (e) => done("failed", `the snapshot worker failed: ${e.message ?? e}`);
    maker.postMessage({ snapshot: startup.snapshot === "making",
                        wheels: artifacts.map((a) => ({ sha256: a.sha256 })), data });
  });
  return cacheMaker;
}

// The draft "auto" (pyspec.load.default_draft's rule for the page): the trained draft the
// manifest lists for this champion (draft_for) on a hardware WebGPU adapter, where it ran 1.43x
// champion-only on the H200 against n-gram's 1.19x (bench/results/h200.json); n-gram on the CPU
// engine and on a software adapter, where the draft does not pay (browser-cpu-guard3.json).
// {draft: a manifest name or "ngram", reason, webgpu: webgpuInfo()'s answer when asked}.
async function autoDraft(champion, backend) {
  const m = await manifest();
  const trained = m.artifacts.find((x) => x.kind === "model" && x.draft_for === champion.name);
  if (!trained) {
    return { draft: "ngram", reason: `manifest.json has no trained draft for ${champion.name}: ` +
             "prompt n-gram" };
  }
  if (backend === "cpu") {
    return { draft: "ngram", reason: "the CPU engine was asked for (backend cpu), where the " +
             "trained draft does not pay: prompt n-gram" };
  }
  const webgpu = await webgpuInfo();
  if (!webgpu.available) {
    return { draft: "ngram", webgpu, reason: "no WebGPU adapter, so the CPU engine runs, where " +
             "the trained draft does not pay: prompt n-gram" };
  }
  if (webgpu.fallback === true) {
    return { draft: "ngram", webgpu, reason: "a software WebGPU adapter, where the trained " +
             "draft does not pay: prompt n-gram" };
  }
  return { draft: trained.model, webgpu, reason: `a hardware WebGPU adapter: the trained draft ` +
           `${trained.model}` };
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
    return { available: true, vendor: info.vendor, architecture: info.architecture,
             description: info.description,
             fallback: info.isFallbackAdapter ?? adapter.isFallbackAdapter ?? null };
  } catch (e) {
    return { available: false, error: String(e) };
  }
}

// --- weights: OPFS keyed by sha256 --------------------------------------------------------------
async function resolveModel(spec) {
  const m = await manifest();
  if (typeof spec === "string") {
    const a = m.artifacts.find((x) => x.kind === "model" && x.model === spec);
    if (a) {
      // A draft's reduced head (DRAFT.vocab.json), where the site ships one: see fetchVocab.
      const v = m.artifacts.find((x) => x.kind === "draft-vocab" && x.model === spec);
      // (shipped: sent with the draft whatever the champion; web.py leaves it out for a draft
      // with another vocabulary, which runs bridged on its full head.)
      return { name: spec, url: new URL(a.url, SITE).href, sha256: a.sha256, size: a.size,
               vocab: v ? { url: new URL(v.url, SITE).href, sha256: v.sha256, shipped: true }
                 : null };
    }
    if (!spec.includes("/") && !spec.endsWith(".gguf")) {
      const names = m.artifacts.filter((x) => x.kind === "model").map((x) => x.model);
      throw new WorkerError("unknown_model", `no model named '${spec}' in manifest.json; ` + (
        names.length ? `use one of ${names.join(", ")} or a URL`
          : "this build ships no models (the npm package does not): give the model as " +
            "{url, sha256} of a GGUF your site serves"));
    }
    spec = { url: spec };
  }
  const url = new URL(spec.url, SITE);
  // Lower case, as sha256Hex writes it (and the OPFS file is named).
  return { name: url.pathname.split("/").pop(), url: url.href,
           sha256: spec.sha256?.toLowerCase() ?? null, size: spec.size ?? null,
           vocab: spec.vocab ? { url: new URL(spec.vocab.url, SITE).href,
                                 sha256: spec.vocab.sha256?.toLowerCase() ?? null } : null };
}

// A draft's reduced head: a JSON ranking of token ids (schema pyspec.draft-vocab/1) whose first
// head_rows the numpy engine's draft keeps (load.parse_reduced_head); 242 KB for draft-l4, so
// fetched each init (the HTTP cache keeps it), not kept in OPFS. Fetched as weights are
// (download: retries, a dropped body resumed), then checked against its sha256.
async function fetchVocab(vocab, load) {
  const parts = [];
  const quiet = { drill: null, fault: (...args) => load.fault(...args) };   // drills: the models'
  const name = vocab.url.split("/").pop();
  const n = await download({ url: vocab.url, name, size: null }, () => {},
                           (chunk, at) => parts.push([chunk, at]), quiet);
  const bytes = new Uint8Array(n);
  for (const [chunk, at] of parts) bytes.set(chunk, at);
  if (vocab.sha256 && await sha256Hex(bytes) !== vocab.sha256) {
    throw new WorkerError("corrupt_download", `${vocab.url} does not match its sha256`);
  }
  return new TextDecoder().decode(bytes);
}

async function opfsDir(drill) {
  if (drill === "opfs-unavailable") return null;
  try {
    const root = await navigator.storage.getDirectory();
    return await root.getDirectoryHandle(OPFS_DIR, { create: true });
  } catch {
    return null;   // no OPFS here (e.g. a private window): download every time
  }
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Stream the response body into `sink(chunk, at)`, reporting progress. A connection that drops
// mid-body is retried (DOWNLOAD_RETRIES, with backoff) from the byte it reached, by a Range
// request; a server that answers it with the whole file (200) restarts the sink at 0.
async function download(model, progress, sink, load) {
  let loaded = 0, last = 0, total = 0, dropped = null;
  for (let attempt = 0; ; attempt++) {
    let resp;
    try {
      resp = await fetch(model.url, loaded ? { headers: { Range: `bytes=${loaded}-` } } : {});
    } catch (e) {
      if (attempt >= DOWNLOAD_RETRIES) {
        throw new WorkerError("download_failed", `cannot fetch ${model.url}: ${e.message}`);
      }
      await sleep(BACKOFF_MS * 2 ** attempt);
      continue;
    }
    if (!resp.ok) throw new WorkerError("download_failed", `${model.url}: HTTP ${resp.status}`);
    if (resp.status !== 206) loaded = 0;
    total = loaded + (Number(resp.headers.get("content-length")) || (model.size ?? 0) - loaded);
    const reader = resp.body.getReader();
    let drop = null;       // a read that failed: the connection dropped
    for (;;) {
      let chunk;
      try {
        chunk = await reader.read();
      } catch (e) {
        drop = e;
        break;
      }
      if (chunk.done) break;
      let value = chunk.value;
      const half = Math.floor(total / 2);
      const cut = load.drill === "download-drop" && loaded + value.length > half;
      if (cut) value = value.subarray(0, half - loaded);   // the drill: cut at half, for real
      sink(value, loaded);
      loaded += value.length;
      if (loaded - last > (1 << 20) || loaded === total) {
        progress("download", loaded, total, model.name);
        last = loaded;
      }
      if (cut) {
        load.drill = null;
        await reader.cancel();
        drop = new TypeError("network error (the connection dropped)");
        break;
      }
    }
    if (drop) {
      if (attempt >= DOWNLOAD_RETRIES) {
        throw new WorkerError("download_failed", `${model.url} dropped at byte ${loaded} of ` +
                              `${total} ${attempt + 1} times: ${drop.message}`);
      }
      dropped ??= { at: loaded, t0: performance.now() };
      await sleep(BACKOFF_MS * 2 ** attempt);
      continue;
    }
    if (dropped) {
      load.fault("download_dropped", dropped.t0,
                 `the download of ${model.name} dropped at byte ${dropped.at} of ${total}; ` +
                 `it went on from there (a Range request) and completed`);
    }
    return loaded;
  }
}

// One try at an access handle for `name`. Chromium at times never settles
// createSyncAccessHandle while pages contend for the file (e2e test_two_pages_load_at_once met
// it about once in five runs: a try made while a third page held the handle stayed pending for
// good). So a try with no answer in ACCESS_TRY_MS fails with a TimeoutError, to be tried again,
// and a handle it gives later is closed at once, never kept locked by no one. `stall`: the
// opfs-stall drill's try, which never answers.
function tryAccess(dir, name, stall) {
  const attempt = stall ? new Promise(() => {})
    : dir.getFileHandle(name, { create: true }).then((f) => f.createSyncAccessHandle());
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      attempt.then((late) => late.close(), () => {});
      reject(new DOMException(`no answer in ${ACCESS_TRY_MS} ms`, "TimeoutError"));
    }, ACCESS_TRY_MS);
    attempt.then((handle) => { clearTimeout(timer); resolve(handle); },
                 (e) => { clearTimeout(timer); reject(e); });
  });
}

// An OPFS access handle for `name`, waiting while another page of this site holds it (they are
// exclusive: NoModificationAllowedError); null when it stays held for BUSY_WAIT_MS.
async function accessHandle(dir, name, load) {
  const t0 = performance.now();
  let held = false;      // did another page hold it? (a slow but free handle is no one's fault)
  let stalled = false;   // did a try go unanswered?
  const who = () => (held ? "another page of this site held the weights cache"
    : `the browser left a request for the weights cache unanswered for ${ACCESS_TRY_MS / 1000} s`);
  for (let wait = 50; ; wait = Math.min(2 * wait, 1000)) {
    try {
      const stall = load.drill === "opfs-stall";
      if (stall) load.drill = null;
      const handle = await tryAccess(dir, name, stall);
      if (held || stalled) {
        load.fault("opfs_busy", t0, `${who()}; this page waited ` +
                   `${((performance.now() - t0) / 1000).toFixed(1)} s for it`);
      }
      return handle;
    } catch (e) {
      const retry = e?.name === "NoModificationAllowedError" || e?.name === "TimeoutError";
      if (!retry || performance.now() - t0 > BUSY_WAIT_MS) {
        if (retry) {
          load.fault("opfs_busy", t0, `${who()}; this page downloaded the weights into memory ` +
                     "instead");
        } else {
          load.fault("opfs_unavailable", t0, `the weights cache could not be opened (${e?.name}: ` +
                     `${e?.message}); the weights run from memory and are downloaded again on ` +
                     "the next visit");
        }
        return null;
      }
      held ||= e.name === "NoModificationAllowedError";
      stalled ||= e.name === "TimeoutError";
      await sleep(wait);
    }
  }
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
// downloaded chunks in memory instead. `load` collects the faults met (init's notices).
async function fetchWeights(model, progress, stats, load) {
  const dir = model.sha256 ? await opfsDir(load.drill) : null;
  if (model.sha256 && !dir) {
    load.fault("opfs_unavailable", performance.now(), "this browser gives the page no " +
               "storage (OPFS), as in a private window: the weights run from memory and are " +
               "downloaded again on every visit");
  }
  if (!dir) {
    const chunks = [];
    stats.downloaded += await download(model, progress, (c, at) => {
      if (at === 0) chunks.length = 0;
      chunks.push(c);
    }, load);
    return { model, dir: null, chunks };
  }
  const name = `${model.sha256}.gguf`;
  const memory = () => fetchWeights({ ...model, sha256: null, expected: model.sha256 },
                                    progress, stats, load);
  if (load.drill === "opfs-quota" || load.drill === "download-drop") {
    await dir.removeEntry(name).catch(() => {});   // these drills strike on a first visit
  }
  const access = await accessHandle(dir, name, load);
  if (!access) return memory();   // held by another page all along: go on without the cache
  try {
    if (load.drill === "opfs-truncate" || load.drill === "opfs-flip") {
      await damage(access, model, progress, stats, load);
    }
    const size = access.getSize();
    // A model given by URL without its size: a file there is the one its sha256 names, checked
    // as it is read (readWeights downloads it again where it is not).
    if (size === model.size || (model.size == null && size > 0)) {
      stats.cached = true;
    } else {
      const t0 = performance.now();
      await toOpfs(access, model, progress, stats, load);
      if (size > 0) {
        load.fault("opfs_truncated", t0, `the cached ${model.name} was incomplete (${size} ` +
                   `of ${model.size} bytes); it was downloaded again`);
      }
    }
  } catch (e) {
    if (e?.name !== "QuotaExceededError") throw e;
    const t0 = performance.now();
    access.truncate(0);
    access.close();
    await dir.removeEntry(name).catch(() => {});
    const fetched = await memory();
    load.fault("opfs_quota", t0, "the browser's storage quota is full: the weights run from " +
               "memory this time (free some site data to cache them)");
    return fetched;
  } finally {
    access.close();
  }
  return { model, dir, name };
}

async function toOpfs(access, model, progress, stats, load) {
  access.truncate(0);
  const quotaAt = load.drill === "opfs-quota" ? (model.size ?? 2) / 2 : Infinity;
  stats.downloaded += await download(model, progress, (c, at) => {
    if (at + c.length > quotaAt) {
      // The drill: OPFS refuses the write as a full quota would.
      throw new DOMException("the storage quota is exceeded", "QuotaExceededError");
    }
    access.write(c, { at });
  }, load);
  access.flush();
}

// The opfs-truncate / opfs-flip drills: the cache as a later load finds it after a crash
// mid-write or a bad disk (the file is downloaded first where it is not cached yet).
async function damage(access, model, progress, stats, load) {
  const drill = load.drill;
  load.drill = null;
  if (access.getSize() !== model.size) await toOpfs(access, model, progress, stats, load);
  if (drill === "opfs-truncate") {
    access.truncate(Math.floor(model.size / 2));
  } else {
    const bytes = new Uint8Array(64);
    access.read(bytes, { at: 4096 });
    for (let i = 0; i < bytes.length; i++) bytes[i] ^= 0xff;
    access.write(bytes, { at: 4096 });
  }
  access.flush();
}

// Stage 2: copy the bytes straight into a Python bytearray (wasm memory) and check their sha256
// there, so no second full copy stays in JavaScript. A mismatch (a corrupt or stale OPFS file)
// downloads the file again, once.
async function readWeights(pyodide, fetched, progress, stats, load) {
  const { model, dir, name } = fetched;
  if (!dir) {
    const size = fetched.chunks.reduce((n, c) => n + c.length, 0);
    const { buf, view } = pyBuffer(pyodide, size);
    let at = 0;
    for (const c of fetched.chunks.splice(0)) { view.data.set(c, at); at += c.length; }
    const want = model.sha256 ?? model.expected;
    const got = want ? await sha256Hex(view.data) : null;
    view.release();
    if (want && got !== want) { buf.destroy(); throw mismatch(model.url, want, got, ""); }
    return buf;
  }
  const access = await accessHandle(dir, name, load);
  if (!access) {   // another page took the cache between the stages: read into memory instead
    const again = await fetchWeights({ ...model, sha256: null, expected: model.sha256 },
                                     progress, stats, load);
    return readWeights(pyodide, again, progress, stats, load);
  }
  let corruptAt = null, got = null;
  try {
    for (let attempt = 0; attempt < 2; attempt++) {
      if (attempt > 0) await toOpfs(access, model, progress, stats, load);
      const size = access.getSize();
      const { buf, view } = pyBuffer(pyodide, size);
      for (let at = 0; at < size; at += READ_BLOCK) {
        access.read(view.data.subarray(at, Math.min(at + READ_BLOCK, size)), { at });
        progress("cache", Math.min(at + READ_BLOCK, size), size, model.name);
      }
      progress("verify", 0, 1, model.name);
      got = await sha256Hex(view.data);
      const ok = got === model.sha256;
      view.release();
      if (ok) {
        if (corruptAt !== null) {
          load.fault("opfs_corrupt", corruptAt, `the cached ${model.name} did not match its ` +
                     "sha256 (corrupt bytes); it was downloaded again");
        }
        return buf;
      }
      buf.destroy();
      stats.corrupt += 1;
      corruptAt ??= performance.now();
    }
  } finally {
    access.close();
  }
  await dir.removeEntry(name).catch(() => {});
  throw mismatch(model.url, model.sha256, got, " after a fresh download");
}

// The bytes' sha256 is not the one given: both digests, so a mistyped sha256 shows as one.
function mismatch(url, want, got, when) {
  return new WorkerError("corrupt_download",
                         `${url} does not match its sha256${when}: its bytes hash to ${got}, ` +
                         `the sha256 given is ${want}; check the sha256 (or the file the ` +
                         "server sends)");
}

// --- requests --------------------------------------------------------------------------------
// What each request's fields must be when present (null or absent means the default).
const isObject = (v) => typeof v === "object" && v !== null && !Array.isArray(v);
// A sha256 is 64 hex digits: "" or another form would otherwise turn the check off or fail it.
const isUrlSpec = (v) => isObject(v) && typeof v.url === "string" &&
  (v.sha256 == null || (typeof v.sha256 === "string" && /^[0-9a-f]{64}$/i.test(v.sha256)));
const isModelSpec = (v) => (typeof v === "string" && v.length > 0) ||
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
          snapshot: [(v) => typeof v === "boolean", "true or false"] },
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
  // "auto": the site's trained draft for this champion where it pays (a hardware adapter), else
  // n-gram; decided before anything downloads, so a page on a CPU never fetches the draft.
  const auto = msg.draft === "auto" ? await autoDraft(champion, msg.backend ?? "auto") : null;
  const drafter = auto ? auto.draft : msg.draft;
  const draftIsModel = drafter && !(typeof drafter === "string" && NON_MODEL_DRAFTS.test(drafter));
  const draft = draftIsModel ? await resolveModel(drafter).catch((e) => {
    e.message = `draft: ${e.message}`;   // which of the two models it is about
    throw e;
  }) : null;
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
  // Downloads run while Pyodide loads; a bad URL fails here without waiting for the runtime.
  const [{ pyodide, session }, champFetched, draftFetched, draftVocab] = await Promise.all([
    runtime(progress, { snapshot: msg.snapshot ?? true, drill: load.drill }),
    fetchWeights(champion, progress, weights, load),
    draft && fetchWeights(draft, progress, weights, load),
    draft?.vocab && fetchVocab(draft.vocab, load)]);
  const t1 = performance.now();
  const champBuf = await readWeights(pyodide, champFetched, progress, weights, load);
  let draftBuf = null;
  try {
    if (draft) draftBuf = await readWeights(pyodide, draftFetched, progress, weights, load);
    const t2 = performance.now();
    progress("load", 0, 1, champion.name);
    // backend: "auto" (web.make_engine's choice) | "webgpu" | "cpu"; a hint make_engine may honour.
    const options = { draft: auto ? "auto" : draft ? "model" : msg.draft ?? "ngram",
                      max_ctx: msg.maxCtx ?? null,
                      backend: msg.backend ?? "auto", champion_name: champion.name,
                      draft_name: draft?.name, draft_vocab: draftVocab || null,
                      draft_vocab_shipped: draft?.vocab?.shipped ?? false,
                      drills: msg.drills ?? false,
                      load_faults: load.faults,
                      warm: true };   // the system turn is prefilled after ready (web.py)
    const info = JSON.parse(await session.load(JSON.stringify(options), champBuf, draftBuf));
    if (info.error) throw new WorkerError(info.error.code, info.error.message);
    Object.assign(runtimeStartup.phases_ms, { weights: Math.round(t2 - t1),
                                              model: Math.round(performance.now() - t2) });
    progress("load", 1, 1, champion.name);
    post({ type: "ready", id: msg.id, ...info, webgpu: auto?.webgpu ?? await webgpuInfo(),
           draft_auto: auto ? info.draft_auto ?? auto.reason : null,
           champion: champion.name, draft_model: draft?.name ?? null, weights,
           notices: load.notices, startup: structuredClone(runtimeStartup),
           init_ms: performance.now() - t0 });
    // Once ready is out: the system turn's prefill (web.py Session.warm), and, once this worker
    // has been idle a while, the snapshot and bytecode for the next visit, on another core.
    session.warm();
    if ([runtimeStartup.snapshot, runtimeStartup.bytecode].includes("making")) {
      whenIdle(() => makeCaches(runtimeStartup));
    }
    return null;      // posted above
  } finally {
    champBuf.destroy();           // Python keeps its own reference; drop the JS handle
    draftBuf?.destroy();
  }
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
      busy += 1;
      if (msg.type === "generate") generating.add(msg.id);
      const run = queue.then(() => (msg.type === "init" ? init(msg) : generate(msg)));
      queue = run.catch(() => {});
      run.finally(() => {
        busy -= 1;
        lastBusy = performance.now();
        if (msg.type === "generate") generating.delete(msg.id);
      }).catch(() => {});
      return run;
    }
    case "cancel": {
      // A request still waiting its turn (or being set up) is cancelled too: it ends before
      // its first cycle (web.py Session.cancel).
      const target = msg.target ?? msg.id;
      if (!runtimePromise) {   // a new worker still starting: its queued request ends unrun
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
      if (msg.type === "stats") out.startup = runtimeStartup;   // the snapshot's progress
      // stats.memory adds the wasm heap (it only grows: its high-water mark).
      if (out.memory) out.memory.wasm_bytes = pyodide._module.HEAP8.buffer.byteLength;
      return out;
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
