// A model's weights streamed to Python (worker.js; docs/embedding.md): its bytes as a Blob
// (its OPFS file, a File the user picked, or the download's chunks where there is no OPFS),
// hashed (WebCrypto's one-shot digest up to ONE_SHOT_MAX; past it a block at a time by Python's
// hashlib: WebCrypto has no incremental digest, and hashlib needs no new dependency), then read by Python a tensor at a time as it goes to the
// GPU (weightSource: FileReaderSync, synchronous in a worker, so Python's model loader stays a
// plain loop), each tensor going to its GPU buffer 4 MiB of the file at a time
// (pyspec/gpu/weights.py stream_rows). The wasm heap never holds the whole file: during a load it
// grows by the header's metadata and the tokenizer, plus one 4 MiB part and its padded copy, or
// a layer's fused weight (Q, K, V or gate and up: its parts and their stack), whichever is
// larger; 16 MiB bounds the tiny models' growth (e2e/test_browser_stream.py), and the 98 MB
// champion's was 25 MiB, less than its largest tensor (29 MiB; docs/embedding.md).
//
// Not here: OPFS, downloads and the cache's lock (weights.js), the tensors' order and their
// upload (pyspec/apps/page_engine.py open_gguf, pyspec/gpu/model.py).

import { WorkerError } from "./manifest.js";

export const READ_BLOCK = 8 << 20;   // bytes per read while hashing, one progress report each

// A Python bytearray of `size` bytes and a Uint8Array view of it in wasm memory. The view is
// valid only until Python next allocates (wasm memory may grow), so use it at once.
// (header.js puts a header's bytes into Python this way.)
export function pyBuffer(pyodide, size) {
  const builtins = pyodide.pyimport("builtins");
  const buf = builtins.bytearray(size);
  builtins.destroy();
  const view = buf.getBuffer("u8");
  return { buf, view };
}

// Up to this size a file's digest is WebCrypto's one-shot over a transient JS ArrayBuffer, outside
// the wasm heap: 0.38 s for the 96 MB champion against 1.7 s through hashlib in wasm (Node,
// measured), which kept the champion's start-up where it was before streaming. Past it, hashlib
// a block at a time, so that no buffer holds the file.
export const ONE_SHOT_MAX = 256 << 20;

// The sha256 (hex) of `blob`'s bytes: WebCrypto's one-shot digest up to ONE_SHOT_MAX, else read
// READ_BLOCK at a time (awaited: the worker's heartbeat goes on) into Python's incremental
// hashlib.sha256; `each(chunk, at)`, where given, gets every block too (importBlob copies them
// into OPFS).
export async function hashBlob(pyodide, blob, progress, label, each = null) {
  if (blob.size <= ONE_SHOT_MAX && globalThis.crypto?.subtle) {
    const bytes = new Uint8Array(await blob.arrayBuffer());
    for (let at = 0; at < bytes.length; at += READ_BLOCK) {
      each?.(bytes.subarray(at, at + READ_BLOCK), at);
    }
    const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
    progress("verify", blob.size, blob.size, label);
    return Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
  }
  return hashBlocks(pyodide, blob, progress, label, each);
}

async function hashBlocks(pyodide, blob, progress, label, each) {
  const hasher = pyodide.pyimport("hashlib").sha256();
  try {
    for (let at = 0; at < blob.size; at += READ_BLOCK) {
      const chunk = new Uint8Array(await blob.slice(at, at + READ_BLOCK).arrayBuffer());
      const { buf, view } = pyBuffer(pyodide, chunk.length);
      view.data.set(chunk);
      view.release();
      try {
        hasher.update(buf);
      } finally {
        buf.destroy();
      }
      each?.(chunk, at);
      progress("verify", at + chunk.length, blob.size, label);
    }
    return hasher.hexdigest();
  } finally {
    hasher.destroy();
  }
}

// What Python reads a model from (page_engine.open_gguf): {size, sha256, read(offset, into),
// open(), close()}, read filling the bytearray `into` (Python's, lent for the call) with the
// bytes from `offset`. Between open() and close() (the load: worker.js) reads go through a
// read-only OPFS access handle straight into `into`, where `openAccess` gives one (shared with
// other pages' readers; 96 MB in 273 reads took 0.17 s this way against 0.66-0.83 s through
// FileReaderSync, measured in Chromium 156); otherwise, and later (a device lost, another
// drafter's engine), through FileReaderSync over the Blob, holding no handle that would make a
// writer wait. A Blob read after its OPFS file changed (another page wrote it again) throws
// NotReadableError, which Python names (weights_changed). Where there is no FileReaderSync (Node:
// the Dawn harness, webtools/dawn.mjs), open() reads the Blob once into a JS ArrayBuffer, outside
// the wasm heap, kept for later reads.
export function weightSource(blob, sha256, openAccess = null) {
  const reader = globalThis.FileReaderSync ? new FileReaderSync() : null;
  let access = null, whole = null;
  return {
    size: blob.size, sha256,
    async open() {
      access = openAccess && await openAccess().catch(() => null);
      if (!reader && !whole) whole = new Uint8Array(await blob.arrayBuffer());
    },
    close() {
      access?.close();
      access = null;
    },
    read(offset, into) {
      const view = into.getBuffer("u8");
      try {
        if (access && access.read(view.data, { at: offset }) === view.data.length) return;
        if (whole) return view.data.set(whole.subarray(offset, offset + view.data.length));
        view.data.set(new Uint8Array(reader.readAsArrayBuffer(
          blob.slice(offset, offset + view.data.length))));
      } finally {
        view.release();
      }
    },
  };
}

// The bytes' sha256 is not the one given: both digests, so a mistyped sha256 shows as one.
export function mismatch(url, want, got, when) {
  return new WorkerError("corrupt_download",
                         `${url} does not match its sha256${when}: its bytes hash to ${got}, ` +
                         `the sha256 given is ${want}; check the sha256 (or the file the ` +
                         "server sends)");
}
