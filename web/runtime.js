// The worker's start-up (worker.js): Pyodide from this origin, started from a memory snapshot
// where there is one (saved by an earlier visit in OPFS, or shipped by the site), the numpy and
// pyspec wheels unpacked (each checked by sha256) with a bytecode cache, and the Python Session
// made; once the worker has been idle a while, snapshot-worker.js makes the caches for the next
// visit. `startup` (the ready message's and the stats reply's) says how it went.
//
// Not here: the weights (weights.js), the requests (worker.js).

import { loadPyodide } from "./pyodide/pyodide.mjs";
import * as webgpuHelpers from "./webgpu.js";
import * as dequantKernels from "./dequant.js";
import { CACHED_PACKAGES, SNAPSHOT_NAME, checkSnapshot, readBytecode, readSnapshot,
         snapshotDir } from "./snapshot.js";
import { SITE, WorkerError, manifest, sha256Hex } from "./manifest.js";

let runtimePromise = null;     // {pyodide, session}

// The manifest's wheels, all unpacked into site-packages: numpy (Pyodide's), pyspec, and
// ("wheel") jinja2 with a pure-Python MarkupSafe, imported only when a model's own chat template
// is rendered (pyspec/text/template.py; a ChatML template never imports them).
const WHEEL_KINDS = ["pyodide-wheel", "pyspec-wheel", "wheel"];

// How this worker's runtime started (the ready message's `startup`): the snapshot's and the
// bytecode cache's fate and each phase's milliseconds; the phases of the weights and the model
// are each init's own.
export let runtimeStartup = null;
let runtimeWheels = null;      // {artifacts, data}: what the caches' maker unpacks, until it runs

// The runtime started (or starting), or not_ready where no init began it.
export async function requireRuntime() {
  if (!runtimePromise) throw new WorkerError("not_ready", "send init first");
  return runtimePromise;
}

// Whether a runtime is started or starting (a fresh worker has none until its first init).
export const hasRuntime = () => runtimePromise !== null;

export function runtime(progress, { snapshot = true, drill = null } = {}) {
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
    const artifacts = m.artifacts.filter((a) => WHEEL_KINDS.includes(a.kind));
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
                      `for top in ${JSON.stringify(CACHED_PACKAGES)}:\n` +
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

// Requests (init, generate) start and end: the caches' maker waits for the worker to be idle.
export function busyStart() { busy += 1; }
export function busyEnd() { busy -= 1; lastBusy = performance.now(); }

// Once the worker has been idle a while: the caches that were "making", for the next visit.
export function makeCachesWhenIdle() {
  const startup = runtimeStartup;
  if ([startup.snapshot, startup.bytecode].includes("making")) whenIdle(() => makeCaches(startup));
}
