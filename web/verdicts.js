// The page's gate verdicts in OPFS, and the sample the gate measures (docs/gate.md).
//
// verdicts.json at the root of this origin's private file system holds the table that
// `python -m pyspec gate` keeps in a cache file natively (pyspec/verdicts.py: each verdict keyed
// by the champion's sha256, the draft and the device class). The worker reads its text before
// every init (Session.load follows it for draft "auto") and before a measurement, and writes
// the table Python returns after one that recorded verdicts; a cancelled one, or one under the
// gate's minimum sample, writes nothing. The client lists and clears the table
// (SpecDecoder.recordedVerdicts and clearVerdicts, as `python -m pyspec verdicts` natively),
// naming verdicts by their sha256 as Python does (verdicts.find); nothing here judges a verdict
// or follows one: Python does (verdicts.parse, verdicts.choose).
//
// The sample: the public workload's JSONL, shipped with the site (manifest kind "workload",
// checked by its sha256), of which Python takes the first prompts of each stratum.

import { SpecError } from "./errors.js";
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

// --- listing and clearing (client.js's statics) ---------------------------------------------
const NOT_A_TABLE = `this origin's ${VERDICTS_FILE} is not a verdict table: ` +
  "SpecDecoder.clearVerdicts() removes it (draft \"auto\" then follows today's rule)";

// The table as stored ({schema, verdicts}, or a bare list as Python also reads it) and its list,
// or null where there is none (or no OPFS).
async function storedTable() {
  const text = await readVerdicts();
  if (text === null) return null;
  let table = null;
  try { table = JSON.parse(text); } catch { /* not JSON: below */ }
  const list = Array.isArray(table) ? table : table?.verdicts;
  if (!Array.isArray(list) || !list.every((v) => /^[0-9a-f]{64}$/.test(v?.sha256))) {
    throw new SpecError("bad_config", NOT_A_TABLE);
  }
  return { table, list };
}

/** The recorded verdicts draft "auto" follows, as stored; [] where there are none. */
export async function recordedVerdicts() {
  return (await storedTable())?.list ?? [];
}

// The verdict `name` names: its sha256, or at least its first 4 hex digits (verdicts.find).
function findVerdict(list, name) {
  const hits = list.filter((v) => v.sha256.startsWith(name.toLowerCase()));
  if (hits.length === 1) return hits[0];
  throw new SpecError("bad_config", hits.length
    ? `${name} names ${hits.length} verdicts: give more of its sha256`
    : `no verdict ${name} in this origin's ${VERDICTS_FILE}: ` +
      "SpecDecoder.recordedVerdicts() lists them");
}

/** Remove recorded verdicts: those `only` names (sha256s, or their first digits; an unknown
 *  one removes nothing and throws bad_config), else all of them (the file, whatever it holds).
 *  {removed, kept}: the sha256s of each. */
export async function clearVerdicts({ only = null } = {}) {
  if (only !== null && !(Array.isArray(only) &&
                         only.every((n) => /^[0-9a-fA-F]{4,64}$/.test(n)))) {
    throw new SpecError("bad_config", "only must be a list of verdicts' sha256s (or their " +
                        "first digits, at least 4) or null (all of them)");
  }
  if (only === null) {
    const list = await recordedVerdicts().catch(() => []);
    try {
      await (await navigator.storage.getDirectory()).removeEntry(VERDICTS_FILE);
    } catch { /* none there, or no OPFS */ }
    return { removed: list.map((v) => v.sha256), kept: [] };
  }
  const stored = await storedTable();
  const list = stored?.list ?? [];
  const gone = new Set(only.map((name) => findVerdict(list, name)));
  const kept = list.filter((v) => !gone.has(v));
  const table = Array.isArray(stored?.table) ? kept : { ...stored?.table, verdicts: kept };
  if (gone.size && !await writeVerdicts(table)) {
    throw new SpecError("bad_config", `${VERDICTS_FILE} could not be written: try again`);
  }
  return { removed: [...gone].map((v) => v.sha256), kept: kept.map((v) => v.sha256) };
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
