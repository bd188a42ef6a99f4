// The Pyodide snapshot (docs/embedding.md, start-up): Python's start-up, saved once in OPFS.
//
// Python's initialisation and Pyodide's bootstrap imports take 3-4 s of every start on two cores.
// Pyodide 0.27 can save its wasm memory right after start-up (the experimental `_makeSnapshot`,
// `makeMemorySnapshot`) and start from that memory instead (`_loadSnapshot`), in about a second.
// The snapshot is taken before numpy or any other shared library loads (the memory holds no
// library code, so a snapshot taken after one would not run), and holds nothing of pyspec's: a
// new pyspec wheel does not stale it. Pyodide refuses a snapshot of another Pyodide build (its
// build id); a sha256 ahead of the memory refuses a damaged file.
//
// Who makes it: the site build, with Node (webtools/snapshot.mjs), ships one beside Pyodide; a
// page that cannot use it (no such file, damaged, or it fails to start) makes its own, saved in
// OPFS and tried first from then on. Not the page's own worker, though: the instance that makes
// a snapshot wraps the JS globals it gives Python in proxies that record what Python touched,
// and calls their getters through those proxies, which the browser refuses (navigator.gpu:
// "Illegal invocation"); and making one costs the 3-4 s start-up again. So when there is none,
// worker.js starts Python the ordinary way and, once ready is posted and it has been idle 2 s,
// starts snapshot-worker.js, a worker of its own on the other core, which starts a second
// Python, makes the snapshot and saves it for the next visit.
//
// The same worker then saves the bytecode cache: numpy's wheel ships Python source only, so
// every start compiled the numpy and pyspec modules it imports (about a second in wasm). The
// maker compiles them all once (unchecked-hash .pyc files: Python loads them without looking at
// the source) and saves them in one zip, named after the wheels' sha256, so another wheel never
// meets a stale cache. worker.js unpacks it beside the wheels' source.
//
// Not here: using them (worker.js startPyodide, runtime), making them (snapshot-worker.js).

export const SNAPSHOT_DIR = "pyspec-runtime";
// The packages whose bytecode the cache holds: numpy, pyspec, and jinja2 with MarkupSafe (a
// model's own chat template; compiled, its first render saves their compile).
export const CACHED_PACKAGES = ["numpy", "pyspec", "jinja2", "markupsafe"];
export const SNAPSHOT_NAME = "pyodide-0.27.7.snapshot";
// The standard library's modules that numpy, Pyodide's package loader and pyspec import: imported
// before the snapshot is taken, they are in it, which saves half a second of every later start.
// None holds per-start state (random's seed, a temp dir) or a shared library. A module that fails
// to import is left out (e2e: test_browser_opfs.py starts from such a snapshot).
export const SNAPSHOT_IMPORTS = [
  "__future__", "_blake2", "_compat_pickle", "_csv", "_ctypes", "_datetime", "_decimal", "_json",
  "_md5", "_pickle", "_sha1", "_sha3", "_statistics",
  "_sysconfigdata__emscripten_wasm32-emscripten", "base64", "calendar", "csv", "ctypes",
  "ctypes._endian", "dataclasses", "datetime", "decimal", "email", "email._encoded_words",
  "email._parseaddr", "email._policybase", "email.base64mime", "email.charset", "email.encoders",
  "email.errors", "email.header", "email.iterators", "email.message", "email.quoprimime",
  "email.utils", "encodings.cp437", "fractions", "glob", "hashlib", "importlib.metadata",
  "importlib.metadata._adapters", "importlib.metadata._collections",
  "importlib.metadata._functools", "importlib.metadata._itertools", "importlib.metadata._meta",
  "importlib.metadata._text", "mmap", "numbers", "pickle", "platform", "quopri", "statistics",
  "sysconfig", "tarfile", "unicodedata"
];

export async function snapshotDir() {
  try {
    const root = await navigator.storage.getDirectory();
    return await root.getDirectoryHandle(SNAPSHOT_DIR, { create: true });
  } catch {
    return null;   // no OPFS (a private window)
  }
}

// A snapshot file's memory (sha256(memory) + memory), or null when it is damaged.
export async function checkSnapshot(bytes) {
  const memory = bytes.subarray(32);
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", memory));
  return bytes.length > 32 && digest.every((b, i) => b === bytes[i]) ? memory : null;
}

// The saved snapshot's memory, or null (none yet, or `problem` says why it is unusable).
export async function readSnapshot(dir, problem) {
  try {
    const file = await (await dir.getFileHandle(SNAPSHOT_NAME)).getFile();
    const memory = await checkSnapshot(new Uint8Array(await file.arrayBuffer()));
    if (memory) return memory;
    problem("the saved snapshot is damaged (its sha256 does not match)");
  } catch (e) {
    if (e?.name !== "NotFoundError") problem(`cannot read the snapshot: ${e}`);
  }
  return null;
}

export async function saveSnapshot(dir, memory) {
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", memory));
  // createWritable writes a temporary file and swaps it in on close: another page reading the
  // snapshot meanwhile sees the old file or the new one, never half of one.
  const out = await (await dir.getFileHandle(SNAPSHOT_NAME, { create: true })).createWritable();
  await out.write(digest);
  await out.write(memory);
  await out.close();
}

// The bytecode cache's file for these wheels (their manifest artifacts).
export function bytecodeName(wheels) {
  return `bytecode-${wheels.map((w) => w.sha256.slice(0, 16)).join("-")}.zip`;
}

// The cached bytecode for these wheels, or null.
export async function readBytecode(dir, wheels) {
  try {
    const file = await (await dir.getFileHandle(bytecodeName(wheels))).getFile();
    return new Uint8Array(await file.arrayBuffer());
  } catch {
    return null;
  }
}

export async function saveBytecode(dir, wheels, bytes) {
  const name = bytecodeName(wheels);
  const out = await (await dir.getFileHandle(name, { create: true })).createWritable();
  await out.write(bytes);
  await out.close();
  for await (const other of dir.keys()) {   // an older wheel's cache is of no more use
    if (other.startsWith("bytecode-") && other !== name) await dir.removeEntry(other);
  }
}
