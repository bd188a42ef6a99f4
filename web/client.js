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
// Resume, not replay (DESIGN §8). Each chunk from the worker carries the ids of the tokens behind
// its text; the client keeps them. When the worker dies mid-request, the client starts a new
// worker and sends the same request with resume {ids}: it prefills prompt + ids and goes on, so
// nothing is generated twice and the chunks continue at the next offset. Greedy and replay end
// byte-identical to an undisturbed run (random numbers are keyed by position); rejection goes on
// to a valid continuation. Text is appended by offset, so no character can show twice.
// `onNotice({code, message})` (and `notices`) says when that happened; the receipt's faults
// record it (kind 'worker_died', the cycle, recovery_s).
//
// Detecting a dead worker: worker.terminate() (or the browser killing it) fires neither onerror
// nor a message. Two checks: (1) the worker holds a Web Lock named after itself for its whole
// life, and the client queues for it, so the browser hands it over the moment the worker dies
// (within a few ms, wherever navigator.locks exists: Chromium, Firefox, Safari >= 15.4);
// (2) a stall timeout: the worker posts a heartbeat every second while its event loop is free,
// and a request with no message for `stallTimeoutMs` (default 60,000 ms; 0 turns it off) counts
// as a dead (or hung) worker. So a death is noticed within stallTimeoutMs at worst. A single
// synchronous step longer than that (the champion's weights being dequantized on a slow CPU, a
// prefill of thousands of tokens) would be taken for a hang: the request then restarts and
// resumes, which costs time but never text.
//
// Fault drills (`drills: true` only): config.drill 'worker-terminate@C' terminates the worker
// once C cycles have run (here, for real, found by the checks above); 'device-lost@C' goes to
// the worker (web.py); loseDevice() destroys the WebGPU device now.
// Errors are SpecError with a `code` (see worker.js).

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
  #lastSign = 0;        // performance.now() of the worker's last message
  #watchdog = null;
  info = null;          // the worker's `ready` message: adapter, webgpu, context, weights, ...
  lastResult = null;    // the last finished request: {text, tokens, stats, receipt, finish_reason}
  restarts = 0;
  notices = [];         // {code, message, at_token} of each recovery, in order

  constructor({ workerUrl = new URL("./worker.js", import.meta.url), champion = "smollm2",
                draft = "ngram", maxCtx = null, backend = "auto", onProgress = null,
                maxRestarts = 1, stallTimeoutMs = 60000, onNotice = null, drills = false } = {}) {
    this.#opts = { workerUrl, champion, draft, maxCtx, backend, onProgress, maxRestarts,
                   stallTimeoutMs, onNotice, drills };
  }

  // --- plumbing -----------------------------------------------------------------------------
  #spawn() {
    this.#worker?.terminate();
    const name = `pyspec-worker-${crypto.randomUUID()}`;
    const w = new Worker(this.#opts.workerUrl, { type: "module", name });
    this.#lastSign = performance.now();
    w.onmessage = (e) => {
      if (this.#worker !== w) return;
      this.#lastSign = performance.now();
      if (e.data?.type === "alive") this.#watchLock(w, name);
      else this.#route(e.data);
    };
    // An uncaught error or a failed module load: the worker cannot be trusted any more.
    w.onerror = (e) => {
      e.preventDefault?.();
      this.#died(new SpecError("worker_died", `the worker failed: ${e.message ?? "unknown error"}`));
    };
    this.#worker = w;
    this.#watchdog ??= setInterval(() => this.#checkStall(), 1000);
  }

  // The worker holds the lock `name` while it lives: ours is granted when it dies.
  #watchLock(w, name) {
    navigator.locks?.request(name, () => {
      if (this.#worker === w) this.#died(new SpecError("worker_died", "the worker stopped"));
    }).catch(() => {});
  }

  #checkStall() {
    const limit = this.#opts.stallTimeoutMs;
    if (this.#worker && this.#pending.size && limit > 0 && performance.now() - this.#lastSign > limit) {
      this.#died(new SpecError("worker_died", `the worker sent nothing for ${limit / 1000} s`));
    }
  }

  #notice(notice) {
    this.notices.push(notice);
    this.#opts.onNotice?.(notice);
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
    const { champion, draft, maxCtx, backend, onProgress, drills } = this.#opts;
    this.info = await this.#request("init", { champion, draft, maxCtx, backend, drills },
                                    { onEvent: onProgress });
  }

  // --- the API ------------------------------------------------------------------------------
  /** Stream a chat completion: yields {offset, text, tokens} as cycles commit text. */
  async *generate(messages, config = {}) {
    const { drill = null, ...workerConfig } = config;
    let terminateAt = this.#clientDrill(drill, workerConfig);   // a cycle count, or null
    let shown = 0;            // characters delivered to the caller
    const ids = [];           // the token ids behind them: what a new worker resumes from
    let cycle = 0;            // cycles the current worker's run has reported
    let resume = null, restarts = 0, faultAt = null;
    for (;;) {
      const id = ++this.#seq;
      const queue = [];
      let wake = null;
      const push = (item) => { queue.push(item); wake?.(); };
      this.#current = id;
      const done = this.#request("generate", { messages, config: workerConfig, resume },
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
            cycle = item.chunk.cycle;
            if (terminateAt !== null && cycle >= terminateAt) {
              // The drill: a real terminate(), found by the liveness checks like any death.
              terminateAt = null;
              faultAt = performance.now();
              this.#worker.terminate();
            }
            if (offset + text.length <= shown) continue;    // never shown twice
            ids.push(...item.chunk.ids);
            const fresh = text.slice(Math.max(0, shown - offset));
            shown += fresh.length;
            yield { offset: shown - fresh.length, text: fresh, tokens };
          } else if (item.done) {
            this.lastResult = item.done;
            // Faults the worker recovered from by itself (a lost GPU device: finished on the CPU).
            for (const f of item.done.receipt?.faults ?? []) {
              if (f.kind === "worker_died") continue;      // noticed above, when it happened
              this.#notice({ code: f.kind, at_token: f.at_token,
                             message: `the GPU failed after ${f.at_token} tokens; the request ` +
                                      `went on from there on the CPU` });
            }
            finished = true;
            return;
          } else {
            throw item.error;
          }
        }
      } catch (err) {
        const restartable = err.code === "worker_died" || err.code === "fatal";
        if (!restartable || restarts >= this.#opts.maxRestarts) throw err;
        // A new worker goes on from the committed ids: nothing is generated or shown twice.
        const since = faultAt ?? this.#lastSign;   // a real death: after its last message
        faultAt = null;
        restarts += 1;
        this.restarts += 1;
        this.#notice({ code: "worker_died", at_token: ids.length,
                       message: `${err.message}; a new worker goes on from the ` +
                                `${ids.length} tokens already shown` });
        await this.#start();
        resume = { ids: [...ids], fault: { kind: "worker_died", cycle,
                                           restart_s: (performance.now() - since) / 1000 } };
      } finally {
        if (this.#current === id) this.#current = null;
        if (!finished && this.#worker && this.#pending.has(id)) {
          this.#request("cancel", { target: id }).catch(() => {});   // the caller broke out
        }
      }
    }
  }

  // config.drill: 'worker-terminate@C' is run here (returns C); other kinds go to the worker.
  #clientDrill(drill, workerConfig) {
    if (drill === null) return null;
    if (!this.#opts.drills) {
      throw new SpecError("bad_config", "config.drill is a fault drill: create the decoder " +
                          "with drills: true to use it");
    }
    const m = /^worker-terminate@(\d+)$/.exec(drill);
    if (m) return Number(m[1]);
    workerConfig.drill = drill;
    return null;
  }

  /** Stop the running generation after its current cycle; resolves with whether one was running. */
  async cancel() {
    if (this.#current === null) return false;
    const ack = await this.#request("cancel", { target: this.#current });
    return ack.cancelled;
  }

  async stats() { return (await this.#request("stats")).stats; }
  async receipt() { return (await this.#request("receipt")).receipt; }
  // A fault drill (drills: true only): destroy the worker's WebGPU device, as a GPU reset would.
  // A running request finishes on the CPU from its committed tokens (the receipt records it).
  async loseDevice() { return (await this.#request("lose_device")).lost; }

  terminate() {
    clearInterval(this.#watchdog);
    this.#watchdog = null;
    this.#died(new SpecError("terminated", "the decoder was terminated"));
  }
}
