// The model card before the download (worker.js): a GGUF's header read from the start of a URL
// by HTTP Range requests, or of a File/Blob by slice(), grown until Python's header-only parser
// has all of it (Session.card -> pyspec/apps/info.py card_from_header: the same card as
// `python -m pyspec info`). A 150k-262k vocabulary makes a header of a few MB: the first read is
// FIRST_BYTES, each next one at least twice as large.
//
// A server that does not answer Range (200 and the whole body instead of 206): the start of
// that full download is read, as far as the header needs, and the connection cancelled; the
// card says so (header.range false). Its size is then the Content-Length, or, where the server
// gives none, the card waits for the whole body.
//
// Not here: the download (weights.js), the rule that decides (info.py).

import { WorkerError } from "./manifest.js";
import { pyBuffer } from "./stream.js";

const FIRST_BYTES = 1 << 20;

// The card of `model` (resolveModel's: a url or a blob) for this page: {card, error, header:
// {bytes, range}}; error {code, message} when the page cannot run it. facts: Session.card's.
export async function modelCard(pyodide, session, model, facts) {
  const source = model.blob ? blobSource(model.blob) : urlSource(model.url);
  try {
    for (let n = FIRST_BYTES; ;) {
      const { bytes, total, range } = await source.read(n);
      const { buf, view } = pyBuffer(pyodide, bytes.length);
      view.data.set(bytes);
      view.release();
      let out;
      try {
        out = JSON.parse(session.card(buf, total, model.name, JSON.stringify(facts)));
      } finally {
        buf.destroy();
      }
      if (out.needed == null) return { ...out, header: { bytes: bytes.length, range } };
      n = Math.max(out.needed, 2 * n);
    }
  } finally {
    source.close();
  }
}

function blobSource(blob) {
  return { read: async (n) => ({ bytes: new Uint8Array(await blob.slice(0, n).arrayBuffer()),
                                 total: blob.size, range: true }),
           close: () => {} };
}

// Range requests while the server answers them; else one full download whose start is read.
function urlSource(url) {
  let full = null;   // {reader, parts, length, total} once the server has answered 200
  const fail = (why) => new WorkerError("download_failed", `${url}: ${why}`);
  const read = async (n) => {
    if (!full) {
      let resp;
      try {
        resp = await fetch(url, { headers: { Range: `bytes=0-${n - 1}` } });
      } catch (e) {
        throw fail(`cannot fetch it (${e.message})`);
      }
      if (resp.status === 206) {
        const total = Number(/\/(\d+)$/.exec(resp.headers.get("content-range") ?? "")?.[1]);
        if (!Number.isSafeInteger(total)) throw fail("a Range answer without the file's size");
        return { bytes: new Uint8Array(await resp.arrayBuffer()), total, range: true };
      }
      if (!resp.ok) throw fail(`HTTP ${resp.status}`);
      full = { reader: resp.body.getReader(), parts: [], length: 0,
               total: Number(resp.headers.get("content-length")) || null };
    }
    while ((full.length < n || full.total == null) && full.length !== full.total) {
      const { done, value } = await full.reader.read();
      if (done) break;
      full.parts.push(value);
      full.length += value.length;
    }
    const bytes = new Uint8Array(full.length);
    let at = 0;
    for (const p of full.parts) { bytes.set(p, at); at += p.length; }
    return { bytes, total: full.total ?? full.length, range: false };
  };
  return { read, close: () => full?.reader.cancel().catch(() => {}) };
}
