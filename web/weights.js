// The worker's weights (worker.js): models resolved from the manifest or a URL, kept in OPFS
// keyed by sha256 (downloaded once with progress under a temporary name and a per-file lock,
// resumed by Range requests when the connection drops, checked, downloaded again when corrupt),
// handed to Python as a source it streams (stream.js); the loading fault drills (LOAD_DRILLS)
// made real. `load` collects the faults met, recovered
// from (init's notices, the receipts' faults).
//
// Not here: Pyodide's start (runtime.js), the requests (worker.js).

import { SITE, WorkerError, manifest, sha256Hex, sleep } from "./manifest.js";
import { hashBlob, mismatch, weightSource } from "./stream.js";

const OPFS_DIR = "pyspec-weights";
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
export const LOAD_DRILLS = ["opfs-truncate", "opfs-flip", "opfs-quota", "opfs-unavailable",
                            "download-drop", "opfs-stall"];


// A model as the worker uses it: {name, url, sha256, size, vocab, shipped (a manifest model,
// trusted: no card before its download), blob (a File/Blob the user picked)}.
export async function resolveModel(spec) {
  if (spec instanceof Blob) {
    return { name: spec.name || "model.gguf", url: null, blob: spec, sha256: null,
             size: spec.size, vocab: null };
  }
  const m = await manifest();
  if (typeof spec === "string") {
    const a = m.artifacts.find((x) => x.kind === "model" && x.model === spec);
    if (a) {
      // A draft's reduced head (DRAFT.vocab.json), where the site ships one: see fetchVocab.
      const v = m.artifacts.find((x) => x.kind === "draft-vocab" && x.model === spec);
      // (shipped: sent with the draft whatever the champion; web.py leaves it out for a draft
      // with another vocabulary, which runs bridged on its full head.)
      return { name: spec, url: new URL(a.url, SITE).href, sha256: a.sha256, size: a.size,
               shipped: true,
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
export async function fetchVocab(vocab, load) {
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
// opfs-stall drill's try, which never answers. `mode`: "readwrite" (exclusive) or "read-only"
// (shared with other readers, exclusive with a writer).
function tryAccess(dir, name, stall, mode = "readwrite") {
  const attempt = stall ? new Promise(() => {})
    : dir.getFileHandle(name, { create: true }).then((f) => f.createSyncAccessHandle({ mode }));
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
async function accessHandle(dir, name, load, mode = "readwrite") {
  const t0 = performance.now();
  let held = false;      // did another page hold it? (a slow but free handle is no one's fault)
  let stalled = false;   // did a try go unanswered?
  const who = () => (held ? "another page of this site held the weights cache"
    : `the browser left a request for the weights cache unanswered for ${ACCESS_TRY_MS / 1000} s`);
  for (let wait = 50; ; wait = Math.min(2 * wait, 1000)) {
    try {
      const stall = load.drill === "opfs-stall";
      if (stall) load.drill = null;
      const handle = await tryAccess(dir, name, stall, mode);
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

// Stage 1, in parallel with loading Pyodide: make sure OPFS holds a file of the right size
// (download it when missing or truncated). Without OPFS (or without a known sha256), keep the
// downloaded chunks in memory instead. `load` collects the faults met (init's notices).
export async function fetchWeights(model, progress, stats, load) {
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
  return cacheLock(name, () => cacheWeights(dir, name, model, progress, stats, load));
}

// The pages of this site that load one model write its OPFS file one at a time (Web Locks,
// where the browser has them): a second page waits for the first's download and then finds the
// file whole, instead of writing it again beside it. Readers take no lock (openWeights reads a
// File snapshot). Without navigator.locks the writes are only as safe as the file's exclusive
// access handle makes them.
function cacheLock(name, fn) {
  return navigator.locks ? navigator.locks.request(`pyspec-weights/${name}`, fn) : fn();
}

// fetchWeights' OPFS half, under the file's lock: cached whole, or downloaded (toOpfs).
async function cacheWeights(dir, name, model, progress, stats, load) {
  const memory = () => fetchWeights({ ...model, sha256: null, expected: model.sha256 },
                                    progress, stats, load);
  const drill = load.drill;
  if (drill === "opfs-quota" || drill === "download-drop") {
    await dir.removeEntry(name).catch(() => {});   // these drills strike on a first visit
  }
  const whole = (size) => size === model.size || (model.size == null && size > 0);
  let size = await cachedSize(dir, name, load);
  try {
    if (size !== null && (drill === "opfs-truncate" || drill === "opfs-flip")) {
      load.drill = null;
      if (!whole(size) && !await toOpfs(dir, name, model, progress, stats, load)) return memory();
      size = await damage(dir, name, drill, model, load);
    }
    if (size === null) return memory();   // held by another page all along: no cache this time
    // A model given by URL without its size: a file there is the one its sha256 names, checked
    // as it is read (openWeights downloads it again where it is not).
    if (whole(size)) {
      stats.cached = true;
      return { model, dir, name };
    }
    const t0 = performance.now();
    if (!await toOpfs(dir, name, model, progress, stats, load)) return memory();
    if (size > 0) {
      load.fault("opfs_truncated", t0, `the cached ${model.name} was incomplete (${size} ` +
                 `of ${model.size} bytes); it was downloaded again`);
    }
  } catch (e) {
    if (e?.name !== "QuotaExceededError") throw e;
    const t0 = performance.now();
    const fetched = await memory();
    load.fault("opfs_quota", t0, "the browser's storage quota is full: the weights run from " +
               "memory this time (free some site data to cache them)");
    return fetched;
  }
  return { model, dir, name };
}

// The cached file's size (0: none), read through a read-only access handle (shared with the
// pages reading it), which waits while another page writes it (accessHandle); null when it
// stays held.
async function cachedSize(dir, name, load) {
  if (!await dir.getFileHandle(name).then(() => true, () => false)) return 0;
  const access = await accessHandle(dir, name, load, "read-only");
  if (!access) return null;
  try {
    return access.getSize();
  } finally {
    access.close();
  }
}

// A File or Blob the user picked: copied into OPFS under a temporary name and hashed as it goes
// (stream.js hashBlob), then moved to its sha256 name under that file's lock (where that file
// is already cached whole, the copy goes instead). Without OPFS the Blob itself is read.
// Then it loads as a cached download would (openWeights).
export async function importBlob(pyodide, model, progress, load) {
  const dir = await opfsDir(load.drill);
  const tmp = `import-${crypto.randomUUID()}.part`;
  const access = dir && await accessHandle(dir, tmp, load);
  let sha256;
  try {
    sha256 = await hashBlob(pyodide, model.blob, (phase, ...rest) => progress("import", ...rest),
                            model.name, access && ((chunk, at) => access.write(chunk, { at })));
    access?.flush();
  } catch (e) {
    access?.close();
    await dir?.removeEntry(tmp).catch(() => {});   // nothing half-written stays
    throw e;
  }
  model = { ...model, sha256 };
  if (!access) return { model, dir: null, blob: model.blob };
  access.close();
  const name = `${sha256}.gguf`;
  await cacheLock(name, async () => {
    const cached = await dir.getFileHandle(name).then((h) => h.getFile(), () => null);
    if (cached?.size === model.size) await dir.removeEntry(tmp);
    else {
      if (cached) await dir.removeEntry(name).catch(() => {});   // a cut copy of an earlier try
      await (await dir.getFileHandle(tmp)).move(name);
    }
  });
  return { model, dir, name };
}

// Download `model` into OPFS under a temporary name, moved to `name` once whole (the caller
// holds the file's lock): a page closed mid-download leaves no cut file under the sha256 name.
// False when another page holds the temporary file all along (the caller goes on from memory).
async function toOpfs(dir, name, model, progress, stats, load) {
  const tmp = name.replace(/\.gguf$/, ".part");
  const access = await accessHandle(dir, tmp, load);
  if (!access) return false;
  try {
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
  } catch (e) {
    access.close();
    await dir.removeEntry(tmp).catch(() => {});
    throw e;
  }
  access.close();
  await dir.removeEntry(name).catch(() => {});
  await (await dir.getFileHandle(tmp)).move(name);
  return true;
}

// The opfs-truncate / opfs-flip drills: the cache as a later load finds it after a crash
// mid-write or a bad disk. Returns the file's size after.
async function damage(dir, name, drill, model, load) {
  const access = await accessHandle(dir, name, load);
  try {
    if (drill === "opfs-truncate") {
      access.truncate(Math.floor(model.size / 2));
    } else {
      const bytes = new Uint8Array(64);
      access.read(bytes, { at: 4096 });
      for (let i = 0; i < bytes.length; i++) bytes[i] ^= 0xff;
      access.write(bytes, { at: 4096 });
    }
    access.flush();
    return access.getSize();
  } finally {
    access.close();
  }
}

// Stage 2: the weights as Python will read them (stream.js weightSource), their sha256 checked
// first as they stream through Python's hashlib a block at a time: the wasm heap never holds the
// file. A mismatch (a corrupt or stale OPFS file) downloads the file again, once; a second one
// removes it (under its lock: nothing half-written stays) and is corrupt_download.
export async function openWeights(pyodide, fetched, progress, stats, load) {
  const { model, dir, name } = fetched;
  if (!dir) {
    const blob = fetched.blob ?? new Blob(fetched.chunks.splice(0));
    const want = model.sha256 ?? model.expected;
    const got = await hashBlob(pyodide, blob, progress, model.name);
    if (want && got !== want) throw mismatch(model.url, want, got, "");
    return weightSource(blob, got);
  }
  let corruptAt = null, got = null;
  for (let attempt = 0; attempt < 2; attempt++) {
    if (attempt > 0 && !await cacheLock(name, () => toOpfs(dir, name, model, progress, stats,
                                                            load))) {
      const again = await fetchWeights({ ...model, sha256: null, expected: model.sha256 },
                                       progress, stats, load);
      return openWeights(pyodide, again, progress, stats, load);
    }
    const file = await (await dir.getFileHandle(name)).getFile();
    got = await hashBlob(pyodide, file, progress, model.name);
    if (got === model.sha256) {
      if (corruptAt !== null) {
        load.fault("opfs_corrupt", corruptAt, `the cached ${model.name} did not match its ` +
                   "sha256 (corrupt bytes); it was downloaded again");
      }
      // (a read-only handle for the load's bulk reads: 4x faster than FileReaderSync)
      return weightSource(file, got, () => tryAccess(dir, name, false, "read-only"));
    }
    stats.corrupt += 1;
    corruptAt ??= performance.now();
  }
  await cacheLock(name, () => dir.removeEntry(name)).catch(() => {});
  throw mismatch(model.url, model.sha256, got, " after a fresh download");
}
