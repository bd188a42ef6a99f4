// The weights cache seen from the page: SpecDecoder.cachedModels() and clearCache() (client.js
// delegates to these; client.d.ts types them, docs/embedding.md describes them).
//
// Weights given with a sha256 are kept in this origin's OPFS (directory "pyspec-weights",
// weights.js OPFS_DIR, one file "<sha256>.gguf" each) for the next visit, and nothing evicts
// them: an app that moves to another model clears the ones it no longer uses here. Not here:
// writing, checking and reading the files (weights.js, in the worker), the decoder (client.js).

import { SpecError } from "./errors.js";

// The weights' OPFS directory (weights.js OPFS_DIR), or null where the page has no OPFS.
async function weightsDir() {
  try {
    const root = await navigator.storage.getDirectory();
    return await root.getDirectoryHandle("pyspec-weights", { create: true });
  } catch {
    return null;
  }
}

/** The cached weights: [{sha256, bytes}], largest first ([] where OPFS is missing). */
export async function cachedModels() {
  const dir = await weightsDir();
  const out = [];
  for await (const [name, handle] of dir?.entries() ?? []) {
    const match = /^([0-9a-f]{64})\.gguf$/.exec(name);
    if (match && handle.kind === "file") {
      out.push({ sha256: match[1], bytes: (await handle.getFile()).size });
    }
  }
  return out.sort((a, b) => b.bytes - a.bytes);
}

/** Remove cached weights, all but the sha256s in `keep`: {removed, kept, busy}, each a list of
 *  sha256s; busy ones are open in a running decoder (terminate it first). */
export async function clearCache({ keep = [] } = {}) {
  if (!Array.isArray(keep) || !keep.every((h) => /^[0-9a-fA-F]{64}$/.test(h))) {
    throw new SpecError("bad_config", "keep must be a list of sha256s (64 hex digits)");
  }
  const kept = new Set(keep.map((h) => h.toLowerCase()));
  const dir = await weightsDir();
  const out = { removed: [], kept: [], busy: [] };
  for (const { sha256 } of await cachedModels()) {
    if (kept.has(sha256)) {
      out.kept.push(sha256);
      continue;
    }
    try {
      await dir.removeEntry(`${sha256}.gguf`);
      out.removed.push(sha256);
    } catch {   // NoModificationAllowedError: a worker holds it open
      out.busy.push(sha256);
    }
  }
  return out;
}
