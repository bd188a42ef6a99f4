// pyspec client: the embeddable API over web/worker.js (DESIGN §8).
//
//   import { SpecDecoder } from "./client.js";
//   const d = await SpecDecoder.create({ workerUrl: "./worker.js", champion: "smollm2",
//                                        draft: "ngram", onProgress: (p) => {} });
//   for await (const chunk of d.generate([{ role: "user", content: "Hi" }], { max_tokens: 64 })) {
//     out.textContent += chunk.text;          // chunk = {offset, text, tokens}
//   }
//   d.lastResult;  await d.stats();  await d.receipt();  d.cancel();  d.terminate();
//
// Text is appended by offset: a chunk that repeats text already delivered (after a worker
// restart replays a request) is trimmed, so nothing shows twice. Decoding is deterministic for a
// seed (greedy and replay are byte-identical whatever the draft), which is what makes a replay
// after a restart continue the same text. Errors are SpecError with a `code` (see worker.js).

export class SpecError extends Error {
  constructor(code, message) {
    super(message);
    this.name = "SpecError";
    this.code = code;
  }
}

const TERMINAL = new Set(["ready", "done", "cancel_ack", "stats", "receipt", "lose_device_ack",
                          "error"]);

export class SpecDecoder {
  /** Start a worker, load Pyodide, pyspec and the weights; resolves when ready to generate. */
  static async create(options = {}) {
    const d = new SpecDecoder(options);
    await d.#start();
    return d;
  }

  #opts; #worker = null; #seq = 0; #pending = new Map(); #current = null;
  info = null;          // the worker's `ready` message: adapter, webgpu, context, weights, ...
  lastResult = null;    // the last finished request: {text, tokens, stats, receipt, finish_reason}
  restarts = 0;

  constructor({ workerUrl = new URL("./worker.js", import.meta.url), champion = "smollm2",
                draft = "ngram", maxCtx = null, backend = "auto", onProgress = null,
                maxRestarts = 1 } = {}) {
    this.#opts = { workerUrl, champion, draft, maxCtx, backend, onProgress, maxRestarts };
  }

  // --- plumbing -----------------------------------------------------------------------------
  #spawn() {
    this.#worker?.terminate();
    const w = new Worker(this.#opts.workerUrl, { type: "module" });
    w.onmessage = (e) => this.#route(e.data);
    // An uncaught error or a failed module load: the worker cannot be trusted any more.
    w.onerror = (e) => {
      e.preventDefault?.();
      this.#died(new SpecError("worker_died", `the worker failed: ${e.message ?? "unknown error"}`));
    };
    this.#worker = w;
  }

  #route(msg) {
    const p = this.#pending.get(msg.id);
    if (!p) return;
    if (msg.type === "error" && msg.fatal) {
      this.#died(new SpecError(msg.code, msg.message));
      return;
    }
    if (TERMINAL.has(msg.type)) this.#pending.delete(msg.id);
    p.onMessage(msg);
  }

  #died(error) {
    this.#worker?.terminate();
    this.#worker = null;
    const pending = [...this.#pending.values()];
    this.#pending.clear();
    for (const p of pending) p.onDeath(error);
  }

  // One request: resolves with its terminal reply, rejects with a SpecError.
  #request(type, payload = {}, { onEvent = null, id = ++this.#seq } = {}) {
    return new Promise((resolve, reject) => {
      if (!this.#worker) {
        reject(new SpecError("worker_died", "the worker is not running"));
        return;
      }
      this.#pending.set(id, {
        onMessage: (msg) => {
          if (msg.type === "error") reject(new SpecError(msg.code, msg.message));
          else if (TERMINAL.has(msg.type)) resolve(msg);
          else onEvent?.(msg);
        },
        onDeath: reject,
      });
      this.#worker.postMessage({ type, id, ...payload });
    });
  }

  async #start() {
    this.#spawn();
    const { champion, draft, maxCtx, backend, onProgress } = this.#opts;
    this.info = await this.#request("init", { champion, draft, maxCtx, backend },
                                    { onEvent: onProgress });
  }

  // --- the API ------------------------------------------------------------------------------
  /** Stream a chat completion: yields {offset, text, tokens} as cycles commit text. */
  async *generate(messages, config = {}) {
    let shown = 0;                         // characters delivered to the caller
    let restarts = 0;
    for (;;) {
      const id = ++this.#seq;
      const queue = [];
      let wake = null;
      const push = (item) => { queue.push(item); wake?.(); };
      this.#current = id;
      const done = this.#request("generate", { messages, config },
                                 { id, onEvent: (msg) => push({ chunk: msg }) });
      done.then((msg) => push({ done: msg }), (err) => push({ error: err }));
      let finished = false;
      try {
        for (;;) {
          if (!queue.length) await new Promise((r) => { wake = r; });
          wake = null;
          const item = queue.shift();
          if (item.chunk) {
            const { offset, text, tokens } = item.chunk;
            if (offset + text.length <= shown) continue;    // replayed: already delivered
            const fresh = text.slice(Math.max(0, shown - offset));
            shown += fresh.length;
            yield { offset: shown - fresh.length, text: fresh, tokens };
          } else if (item.done) {
            this.lastResult = item.done;
            finished = true;
            return;
          } else {
            throw item.error;
          }
        }
      } catch (err) {
        const restartable = err.code === "worker_died" || err.code === "fatal";
        if (!restartable || restarts >= this.#opts.maxRestarts) throw err;
        // Start a new worker and replay the request; the offsets trim what was shown.
        restarts += 1;
        this.restarts += 1;
        await this.#start();
      } finally {
        if (this.#current === id) this.#current = null;
        if (!finished && this.#worker && this.#pending.has(id)) {
          this.#request("cancel", { target: id }).catch(() => {});   // the caller broke out
        }
      }
    }
  }

  /** Stop the running generation after its current cycle; resolves with whether one was running. */
  async cancel() {
    if (this.#current === null) return false;
    const ack = await this.#request("cancel", { target: this.#current });
    return ack.cancelled;
  }

  async stats() { return (await this.#request("stats")).stats; }
  async receipt() { return (await this.#request("receipt")).receipt; }
  // A fault drill: destroy the worker's WebGPU device, as a GPU reset would. A running request
  // finishes on the CPU from its committed tokens (the receipt records the fault).
  async loseDevice() { return (await this.#request("lose_device")).lost; }

  terminate() {
    this.#died(new SpecError("terminated", "the decoder was terminated"));
  }
}
