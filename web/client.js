// pyspec client: the embeddable API over web/worker.js (docs/embedding.md).
//
//   import { SpecDecoder } from "./client.js";
//   const d = await SpecDecoder.create({ workerUrl: "./worker.js", champion: "smollm2",
//                                        draft: "ngram", onProgress: (p) => {} });
//   for await (const chunk of d.generate([{ role: "user", content: "Hi" }], { max_tokens: 64 })) {
//     out.textContent += chunk.text;          // chunk = {offset, text, tokens}
//   }
//   d.lastResult;  await d.stats();  await d.receipt();  d.cancel();  d.terminate();
//
// Resume, not replay. Each chunk from the worker carries the ids of the tokens behind
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
// once C cycles have run (here, for real, found by the checks above); the other KIND@C
// (device-lost, device-lost-repeat, gpu-oom, readback-throw, readback-hang, worker-oom) go to
// the worker (web.py SESSION_DRILLS); the create option loadDrill (opfs-truncate, opfs-flip,
// opfs-quota, opfs-unavailable, download-drop, opfs-stall) strikes while the first worker loads (worker.js
// LOAD_DRILLS); loseDevice() destroys the WebGPU device now. A worker that ran out of memory
// (code worker_oom) is replaced and resumed like a dead one. Faults met while loading arrive
// as notices too (the `ready` message's notices).
// Errors are SpecError with a `code` (see worker.js).
//
// The OpenAI-style facade (`d.chat.completions.create(request)`, facade.js) is the same
// generate() in the shape of the OpenAI SDK and WebLLM; client.d.ts types both. Not here: the
// checks of the options an app hands it (checks.js), the weights cache's listing and clearing
// (cache.js), measuring (measure.js), the recorded verdicts' listing and clearing
// (verdicts.js), the notices a finished request brings (notices.js).

import { cachedModels, clearCache } from "./cache.js";
import { checkFinite, checkReloadOptions, createOptions } from "./checks.js";
import { SpecError } from "./errors.js";
import { completions } from "./facade.js";
import { measure } from "./measure.js";
import { resultNotices } from "./notices.js";
import { clearVerdicts, recordedVerdicts } from "./verdicts.js";

export { SpecError };

const TERMINAL = new Set(["ready", "done", "cancel_ack", "stats", "receipt", "lose_device_ack",
                          "card", "measured", "error"]);
const TERMINATED = "the decoder was terminated: create a new one";

export class SpecDecoder {
  /** Start a worker, load Pyodide, pyspec and the weights; resolves when ready to generate. */
  static async create(options = {}) {
    // signal: an AbortSignal that stops the load (an app that moves on while the weights
    // download): the worker goes, with its download and its hold on the cache, and create()
    // rejects with "terminated".
    const { signal = null, ...rest } = options ?? {};
    if (signal !== null && typeof signal?.aborted !== "boolean") {
      throw new SpecError("bad_config", "signal must be an AbortSignal (an AbortController's)");
    }
    const d = new SpecDecoder(rest);
    const aborted = () => new SpecError("terminated", "create() was aborted by its signal: the " +
                                        "worker loading the model was stopped");
    if (signal?.aborted) throw aborted();
    const abort = () => d.terminate();
    signal?.addEventListener("abort", abort, { once: true });
    try {
      await d.#start();
    } catch (e) {
      d.terminate();     // a decoder that never became ready leaves no worker behind
      throw signal?.aborted ? aborted() : e;
    } finally {
      signal?.removeEventListener("abort", abort);
    }
    return d;
  }

  // --- the weights cache (cache.js) ---------------------------------------------------
  /** The cached weights: [{sha256, bytes}], largest first ([] where OPFS is missing). */
  static cachedModels() {
    return cachedModels();
  }

  /** Remove cached weights, all but the sha256s in `keep`: {removed, kept, busy}, each a list
   *  of sha256s; busy ones are open in a running decoder (terminate it first). */
  static clearCache(options) {
    return clearCache(options);
  }

  // --- the gate's verdicts in OPFS, which draft "auto" follows (verdicts.js) ----------
  static recordedVerdicts() { return recordedVerdicts(); }
  static clearVerdicts(options) { return clearVerdicts(options); }

  /** The model card of `source` (a URL, {url, sha256?}, a manifest name or a File/Blob), read
   *  from its header alone before any download, in a worker of its own: {card, error, header}.
   *  card: pyspec/apps/info.py's (as `python -m pyspec info --json`) with this device's WebGPU
   *  limits; error {code, message} where this page cannot run it (create() would refuse it with
   *  that SpecError); header {bytes, range}: the bytes read, and whether the server took Range
   *  requests. options: workerUrl, backend, maxCtx (as create's). */
  static async card(source, options = {}) {
    const d = new SpecDecoder({ ...options, champion: source });
    const { backend, maxCtx } = d.#opts;
    d.#started = true;
    try {
      d.#spawn();
      const { card, error, header } = await d.#request("card", { model: source, backend,
                                                                 maxCtx });
      return { card, error, header };
    } finally {
      d.terminate();
    }
  }

  #opts; #worker = null; #seq = 0; #pending = new Map();
  #active = new Set();  // the records of this decoder's generate requests in flight (#run)
  #restarting = null;   // the restart under way (one for every request the death stopped)
  #terminated = false;
  #started = false;     // a worker was made (create): a missing one then died, else never was
  #lastSign = 0;        // performance.now() of the worker's last message
  #watchdog = null;
  info = null;          // the worker's `ready` message: adapter, webgpu, context, weights, ...
  lastResult = null;    // the last finished request: {text, tokens, stats, receipt, finish_reason}
  restarts = 0;
  notices = [];         // {code, message, at_token} of each recovery, in order
  chat = { completions: completions({
    run: (messages, config, req) => this.#run(messages, config, req),
    cancel: (req) => this.#cancelRequest(req),
    loaded: () => this.info?.champion,
    champion: () => this.info?.champion ?? this.#opts.champion,
  }) };

  constructor(options = {}) {
    // checks.js: refused now, not after Pyodide has started and the weights have downloaded.
    this.#opts = createOptions(options, new URL("./worker.js", import.meta.url));
  }

  // --- plumbing -----------------------------------------------------------------------------
  #spawn() {
    // terminate() may run meanwhile (from onNotice, during a restart): start nothing then.
    if (this.#terminated) throw new SpecError("terminated", TERMINATED);
    // A worker replaced while requests wait on it: they fail as for a death, never hang.
    if (this.#worker) this.#died(new SpecError("worker_died", "the worker was replaced"));
    const name = `pyspec-worker-${crypto.randomUUID()}`;
    const url = this.#opts.workerUrl;
    let w;
    try {
      w = new Worker(url, { type: "module", name });
    } catch (e) {   // a malformed URL (SyntaxError), another origin's (SecurityError)
      throw new SpecError("bad_config", `workerUrl ${url} cannot start a worker (${e?.name}: ` +
                          `${e?.message}); give the URL of the site's worker.js, on this origin`);
    }
    let heard = false;    // a message came: worker.js and its imports loaded
    this.#lastSign = performance.now();
    w.onmessage = (e) => {
      if (this.#worker !== w) return;
      heard = true;
      this.#lastSign = performance.now();
      if (e.data?.type === "alive") this.#watchLock(w, name);
      else this.#route(e.data);
    };
    // An uncaught error or a failed module load: the worker cannot be trusted any more.
    w.onerror = (e) => {
      e.preventDefault?.();
      if (this.#worker !== w) return;
      this.#died(heard
        ? new SpecError("worker_died", `the worker failed: ${e.message ?? "unknown error"}`)
        : new SpecError("download_failed", `the worker could not start: ${url} (or pyodide/ ` +
                        `beside it) could not be loaded${e.message ? ` (${e.message})` : ""}; ` +
                        "check workerUrl and that the site's files are served there"));
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
    // Between requests (none pending, running or restarting a worker): said now, and the next
    // request or reload() starts a new worker before it runs, as a request of its own.
    const idle = this.#worker !== null && !this.#pending.size && !this.#active.size &&
      this.#restarting === null;
    this.#worker?.terminate();
    this.#worker = null;
    const pending = [...this.#pending.values()];
    this.#pending.clear();
    for (const p of pending) p.onDeath(error);
    if (idle && !this.#terminated) {
      this.#notice({ code: "worker_died", at_token: 0,
                     message: `${error.message} between requests; the next request (or ` +
                              "reload()) starts a new one" });
    }
  }

  // A worker that died between requests is replaced before a request or reload() uses it.
  #revive() {
    return !this.#worker && this.#started && !this.#terminated ? this.#restart() : null;
  }

  // One request: resolves with its terminal reply, rejects with a SpecError.
  #request(type, payload = {}, { onEvent = null, id = ++this.#seq } = {}) {
    return new Promise((resolve, reject) => {
      if (this.#terminated) {
        reject(new SpecError("terminated", TERMINATED));
        return;
      }
      if (!this.#worker) {
        reject(this.#started ? new SpecError("worker_died", "the worker is not running (it " +
                                             "stopped): the next generate() or reload() " +
                                             "starts a new one")
          : new SpecError("not_ready", "this decoder has not started: make it with " +
                          "`await SpecDecoder.create(options)`, not the constructor alone"));
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
      try {
        this.#worker.postMessage({ type, id, ...payload });
      } catch (e) {   // a value structured clone cannot copy (a function, a Proxy, ...)
        this.#pending.delete(id);
        reject(new SpecError("bad_request", `the ${type} request cannot be sent to the worker ` +
                             `(${e?.name}: ${e?.message}); pass plain data`));
      }
    });
  }

  async #start() {
    this.#started = true;
    this.#spawn();
    await this.#init();
  }

  // A new worker after a death, shared by every request that death stopped: each of them then
  // resumes there (a second spawn would replace the first one's worker under it). One that
  // fails to load goes, so that a request stopped by the same death restarts afresh.
  #restart() {
    this.#restarting ??= this.#start()
      .catch((e) => { this.#died(e); throw e; })
      .finally(() => { this.#restarting = null; });
    return this.#restarting;
  }

  async #init() {
    const { champion, draft, maxCtx, backend, onProgress, drills, loadDrill,
            snapshot, gpuLimits } = this.#opts;
    this.#opts.loadDrill = null;   // the first worker's load only
    this.info = await this.#request("init", { champion, draft, maxCtx, backend, drills,
                                              drill: loadDrill, snapshot, gpuLimits },
                                    { onEvent: onProgress });
    for (const n of this.info.notices ?? []) this.#notice({ ...n, at_token: 0 });
  }

  // --- the API ------------------------------------------------------------------------------
  /** Stream a chat completion: yields {offset, text, tokens} as cycles commit text; returns
   *  its result (as lastResult, which concurrent requests share). */
  async *generate(messages, config = {}) {
    return yield* this.#run(messages, config, {});
  }

  // generate(); `req` is the request's record while it runs: req.id its worker id (a new one
  // after a restart), req.worker the worker it went to (null while it waits for a new one),
  // req.cancelled set by cancel() and the facade's AbortSignal (it outlives a worker), and
  // req.onStarted() run when a worker has checked the request and starts it.
  async *#run(messages, config, req) {
    if (config === null || typeof config !== "object" || Array.isArray(config)) {
      throw new SpecError("bad_config", "generate's config must be an object of options");
    }
    checkFinite(config, "");
    const { drill = null, ...workerConfig } = config;
    let terminateAt = this.#clientDrill(drill, workerConfig);   // a cycle count, or null
    let shown = 0, text = ""; // characters delivered to the caller
    const ids = [];           // the token ids behind them: what a new worker resumes from
    let cycle = 0;            // cycles the current worker's run has reported
    let resume = null, restarts = 0, faultAt = null;
    this.#active.add(req);
    try {
      for (;;) {
        if (resume === null) await this.#revive();   // it died before this request
        const id = ++this.#seq;
        const queue = [];
        let wake = null;
        const push = (item) => { queue.push(item); wake?.(); };
        req.id = id;
        req.worker = this.#worker;
        const onEvent = (msg) => (msg.type === "started" ? req.onStarted?.()
                                                         : push({ chunk: msg }));
        const done = this.#request("generate", { messages, config: workerConfig, resume },
                                   { id, onEvent });
        done.then((msg) => push({ done: msg }), (err) => push({ error: err }));
        if (req.cancelled) this.#cancelRequest(req);   // asked before it went to this worker
        let finished = false;
        try {
          for (;;) {
            if (!queue.length) await new Promise((r) => { wake = r; });
            wake = null;
            const item = queue.shift();
            if (item.chunk) {
              const { offset, tokens } = item.chunk;
              cycle = item.chunk.cycle;
              if (terminateAt !== null && cycle >= terminateAt) {
                // The drill: a real terminate(), found by the liveness checks like any death.
                terminateAt = null;
                faultAt = performance.now();
                this.#worker.terminate();
              }
              if (offset + item.chunk.text.length <= shown) continue;    // never shown twice
              ids.push(...item.chunk.ids);
              const fresh = item.chunk.text.slice(Math.max(0, shown - offset));
              shown += fresh.length;
              text += fresh;
              yield { offset: shown - fresh.length, text: fresh, tokens,
                      kinds: item.chunk.kinds, starts: item.chunk.starts,
                      ...(item.chunk.tools ? { tools: item.chunk.tools } : {}) };
            } else if (item.done) {
              finished = true;
              return this.#finish(item.done);
            } else {
              throw item.error;
            }
          }
        } catch (err) {
          const restartable = ["worker_died", "fatal", "worker_oom"].includes(err.code);
          if (!restartable || restarts >= this.#opts.maxRestarts) throw err;
          const dead = req.worker;
          req.worker = null;     // a cancel() from here on only sets req.cancelled
          // A new worker goes on from the committed ids: nothing is generated or shown twice.
          const since = faultAt ?? this.#lastSign;   // a real death: after its last message
          faultAt = null;
          restarts += 1;
          this.restarts += 1;
          const kind = err.code === "worker_oom" ? "worker_oom" : "worker_died";
          delete workerConfig.drill;   // a drill strikes once: not again on the new worker
          this.#notice({ code: kind, at_token: ids.length,
                         message: `${err.message}; a new worker goes on from the ` +
                                  `${ids.length} tokens already shown` });
          // Only the request that finds its own worker dead starts one: another stopped by
          // the same death (its consumer slower to pull) goes on on the new one.
          if (!this.#worker || this.#worker === dead) await this.#restart();
          else await this.#restarting;
          if (req.cancelled) {     // cancelled while it had no worker: it ends here
            finished = true;
            return this.#finish({ text, tokens: [...ids], finish_reason: "cancelled",
                                  stats: null, receipt: null });
          }
          resume = { ids: [...ids], fault: { kind, cycle,
                                             restart_s: (performance.now() - since) / 1000 } };
        } finally {
          if (!finished && this.#worker && this.#pending.has(id)) {
            this.#request("cancel", { target: id }).catch(() => {});   // the caller broke out
          }
        }
      }
    } finally {
      this.#active.delete(req);
    }
  }

  // A request's result: lastResult, and the notices it brings (notices.js).
  #finish(result) {
    this.lastResult = result;
    for (const notice of resultNotices(result)) this.#notice(notice);
    return result;
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

  /** "Measure on this device" (measure.js): a sample side by side with champion-only, the
   *  gate's table and verdicts, recorded in OPFS for draft "auto"; cancel() stops it too. */
  async measure(options = {}) {
    await this.#revive();
    const req = { id: null, worker: this.#worker, cancelled: false };   // as #run's records
    this.#active.add(req);
    try {
      return await measure(options, {
        send: (fields, onEvent) => {
          req.id = ++this.#seq;
          return this.#request("measure", fields, { id: req.id, onEvent });
        },
        cancel: () => this.#cancelRequest(req),
      });
    } finally {
      this.#active.delete(req);
    }
  }

  /** Stop this decoder's generations (and a measure()), the running one after its current cycle and those
   *  waiting behind it (or for a new worker) before they start (each ends with finish_reason
   *  "cancelled"); resolves with whether there was one to stop. */
  async cancel() {
    if (this.#terminated) throw new SpecError("terminated", TERMINATED);
    const asked = await Promise.all([...this.#active].map((req) => this.#cancelRequest(req)));
    return asked.some(Boolean);
  }

  // Ask one request (a #run record) to stop. Between workers the flag alone does it: #run
  // ends the request before sending it again, and sends a cancel after any later post.
  async #cancelRequest(req) {
    req.cancelled = true;
    if (!req.worker || req.worker !== this.#worker) return true;
    try {
      return (await this.#request("cancel", { target: req.id })).cancelled;
    } catch {
      return true;     // its worker died meanwhile: the flag stops it after the restart
    }
  }

  /** Load the weights again in the same worker (Pyodide stays loaded). `champion` and `maxCtx`
   *  (as for create()) load another model or context there instead; they stay this decoder's,
   *  so a restarted worker loads them too. With drills: true, `loadDrill` makes a loading fault
   *  strike meanwhile (worker.js LOAD_DRILLS); its notices arrive as for create(). Resolves
   *  with the new `ready` message (also `info`). */
  async reload(options = {}) {
    checkReloadOptions(options);
    const { loadDrill = null, champion, maxCtx } = options ?? {};
    const before = { champion: this.#opts.champion, maxCtx: this.#opts.maxCtx };
    if (champion !== undefined) this.#opts.champion = champion;
    if (maxCtx !== undefined) this.#opts.maxCtx = maxCtx;
    this.#opts.loadDrill = loadDrill;
    try {
      await (this.#revive() ?? this.#init());   // a worker that died is started anew
    } catch (e) {
      // The worker keeps the model it had (web.py), and so does a worker started later.
      Object.assign(this.#opts, before);
      throw e;
    }
    return this.info;
  }

  async stats() { return (await this.#request("stats")).stats; }
  /** The worker's memory: {gpu_devices, gpu_bytes, wasm_bytes} (WebGPU devices alive, the bytes
   *  of their buffers, the wasm heap), for leak checks. */
  async memory() { return (await this.#request("stats")).memory; }
  /** How the worker's runtime started (info.startup as of now): its snapshot's state moves from
   *  "making" to "saved" or "failed" after ready. */
  async startup() { return (await this.#request("stats")).startup; }
  async receipt() { return (await this.#request("receipt")).receipt; }
  // A fault drill (drills: true only): destroy the worker's WebGPU device, as a GPU reset would.
  // A running request finishes on the CPU from its committed tokens (the receipt records it).
  async loseDevice() { return (await this.#request("lose_device")).lost; }

  /** Stop the worker now; the decoder is done (later calls throw SpecError "terminated"). */
  terminate() {
    this.#terminated = true;
    clearInterval(this.#watchdog);
    this.#watchdog = null;
    this.#died(new SpecError("terminated", "the decoder was terminated"));
  }
}
