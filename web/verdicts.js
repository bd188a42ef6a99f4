// The page's gate verdicts in OPFS, and the sample the gate measures (docs/gate.md).
//
// verdicts.json at the root of this origin's private file system holds the table that
// `python -m pyspec gate` keeps in a cache file natively (pyspec/verdicts.py: each verdict keyed
// by the champion's sha256, the draft and the device class). The worker reads its text before
// every init (Session.load follows it for draft "auto") and before a measurement, and writes
// the table Python returns after one that finished; a cancelled one writes nothing. Nothing here
// reads or judges a verdict: Python does (verdicts.parse, verdicts.choose).
//
// The sample: the public workload's JSONL, shipped with the site (manifest kind "workload",
// checked by its sha256), of which Python takes the first prompts of each stratum.

import { SITE, WorkerError, manifest, sha256Hex } from "./manifest.js";

export const VERDICTS_FILE = "verdicts.json";

// The table's text, or null where there is none (or no OPFS: a private window).
export async function readVerdicts() {
  try {
    const root = await navigator.storage.getDirectory();
    const file = await (await root.getFileHandle(VERDICTS_FILE)).getFile();
    return await file.text();
  } catch {
    return null;
  }
}

// Replace the table (a writable stream commits on close, so a worker stopped midway leaves the
// old one). Returns whether it was stored; without OPFS it is not, and the result says so.
export async function writeVerdicts(table) {
  try {
    const root = await navigator.storage.getDirectory();
    const handle = await root.getFileHandle(VERDICTS_FILE, { create: true });
    const out = await handle.createWritable();
    await out.write(JSON.stringify(table, null, 1));
    await out.close();
    return true;
  } catch {
    return false;
  }
}

// The shipped workload's text, checked against the manifest's sha256.
export async function shippedWorkload() {
  const entry = (await manifest()).artifacts.find((a) => a.kind === "workload");
  if (!entry) {
    throw new WorkerError("bad_workload", "this site ships no workload (manifest kind " +
                          "'workload'): rebuild it with `python3 build.py site`, or give " +
                          "measure() a workload of your own");
  }
  const r = await fetch(new URL(entry.url, SITE));
  if (!r.ok) throw new WorkerError("download_failed", `${entry.url}: HTTP ${r.status}`);
  const bytes = new Uint8Array(await r.arrayBuffer());
  if (await sha256Hex(bytes) !== entry.sha256) {
    throw new WorkerError("corrupt_download", `${entry.url} does not match its sha256 in ` +
                          "manifest.json: reload the page (or rebuild the site)");
  }
  return { text: new TextDecoder().decode(bytes), name: entry.url };
}
