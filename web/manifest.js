// What every part of the worker shares (worker.js, runtime.js, weights.js): the site's
// manifest.json (every artifact's url, sha256 and size), WorkerError (a failure with its
// protocol code) and the sha256 of bytes.

export const SITE = new URL("./", import.meta.url);

export class WorkerError extends Error {
  constructor(code, message) { super(message); this.code = code; }
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

let manifestPromise = null;

export function manifest() {
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

export async function sha256Hex(bytes) {
  const digest = await crypto.subtle.digest("SHA-256", bytes);   // copies `bytes` synchronously
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}
