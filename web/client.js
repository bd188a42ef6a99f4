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
// once C cycles have run (here, for real, found by the checks above); the other KIND@C
// (device-lost, device-lost-repeat, gpu-oom, readback-throw, readback-hang, worker-oom) go to
// the worker (web.py SESSION_DRILLS); the create option loadDrill (opfs-truncate, opfs-flip,
// opfs-quota, opfs-unavailable, download-drop, opfs-stall) strikes while the first worker loads (worker.js
// LOAD_DRILLS); loseDevice() destroys the WebGPU device now. A worker that ran out of memory
// (code worker_oom) is replaced and resumed like a dead one. Faults met while loading arrive
// as notices too (the `ready` message's notices).
// Errors are SpecError with a `code` (see worker.js).
//
// The OpenAI-style facade (`d.chat.completions.create(request)`, below) is the same generate()
// in the shape of the OpenAI SDK and WebLLM; client.d.ts types both.

export class SpecError extends Error {
  constructor(code, message) {
    super(message);
    this.name = "SpecError";
    this.code = code;
  }
}

// Receipt fault kinds met while loading (web.py LOAD_FAULTS): noticed at init, not per request.
const LOAD_FAULTS = new Set(["opfs_truncated", "opfs_corrupt", "opfs_quota", "opfs_unavailable",
                             "download_dropped", "opfs_busy"]);
const GPU_FAULTS = { device_lost: "the GPU device was lost", gpu_error: "the GPU failed",
                     gpu_timeout: "a GPU readback hung" };

const TERMINAL = new Set(["ready", "done", "cancel_ack", "stats", "receipt", "lose_device_ack",
                          "error"]);

// --- the facade's request ----------------------------------------------------------------
// The engine's finish reasons in OpenAI's words. "cancelled" (an AbortSignal) becomes "abort",
// as in WebLLM: OpenAI has no word for a request the caller stopped.
const FINISH = { stop: "stop", length: "length", context: "length", cancelled: "abort" };
// Options of the OpenAI request that pyspec does not do yet: refused, never ignored.
const NOT_YET = {};
// The options it takes, by type; `pyspec` holds generate()'s own ({k, verify, draft, ...}).
// The sampling controls (OpenAI's top_p, presence_penalty, frequency_penalty, logit_bias, stop;
// top_k, min_p and repetition_penalty as WebLLM and vLLM take them) go to the worker as they
// are: web.py checks their values. stop is a string or a list of strings.
const FACADE_FIELDS = { temperature: "number", max_tokens: "number", seed: "number",
                        model: "string", pyspec: "object", top_p: "number", top_k: "number",
                        min_p: "number", repetition_penalty: "number",
                        presence_penalty: "number", frequency_penalty: "number",
                        logit_bias: "object", stop: ["string", "object"],
                        // {type: "json_schema", json_schema: {name, schema, strict}}: the
                        // output follows the schema (web.py checks it; the subset in the README)
                        response_format: "object" };

// The generate() config for a facade request (without messages, stream, signal), or a SpecError
// naming the option it cannot take. null or undefined means "not given", as in JSON.
function facadeConfig(request, champion) {
  const config = {};
  for (const [name, value] of Object.entries(request)) {
    if (value === undefined || value === null) continue;
    if (name in NOT_YET) {
      throw new SpecError("bad_config", `${name} is not supported yet (${NOT_YET[name]}); ` +
                          `leave ${name} out`);
    }
    if (!(name in FACADE_FIELDS)) {
      throw new SpecError("bad_config", `unknown option ${name}: chat.completions.create takes ` +
                          `messages, stream, signal, ${Object.keys(FACADE_FIELDS).join(", ")}`);
    }
    const kinds = [FACADE_FIELDS[name]].flat();
    if (!kinds.includes(typeof value)) {
      throw new SpecError("bad_config",
                          `${name} must be a ${kinds.join(" or ")}, got ${typeof value}`);
    }
    if (name === "model") {
      if (value !== champion) {
        throw new SpecError("bad_config", `model ${value} is not loaded: this decoder runs ` +
                            `${champion} (create another SpecDecoder for another model)`);
      }
    } else if (name === "pyspec") {
      Object.assign(config, value);     // {k, verify, draft, context_overflow}: the worker checks
    } else {
      config[name] = value;
    }
  }
  return config;
}

// The options SpecDecoder.create takes (client.d.ts SpecDecoderOptions); any other is refused.
const CREATE_OPTIONS = ["workerUrl", "champion", "draft", "maxCtx", "backend", "onProgress",
                        "maxRestarts", "stallTimeoutMs", "onNotice", "drills", "loadDrill",
                        "snapshot"];

export class SpecDecoder {
  /** Start a worker, load Pyodide, pyspec and the weights; resolves when ready to generate. */
  static async create(options = {}) {
    const d = new SpecDecoder(options);
    try {
      await d.#start();
    } catch (e) {
      d.terminate();     // a decoder that never became ready leaves no worker behind
      throw e;
    }
    return d;
  }

  #opts; #worker = null; #seq = 0; #pending = new Map();
  #active = new Set();  // the worker ids of this decoder's generate requests in flight
  #restarting = null;   // the restart under way (one for every request the death stopped)
  #terminated = false;
  #lastSign = 0;        // performance.now() of the worker's last message
  #watchdog = null;
  info = null;          // the worker's `ready` message: adapter, webgpu, context, weights, ...
  lastResult = null;    // the last finished request: {text, tokens, stats, receipt, finish_reason}
  restarts = 0;
  notices = [];         // {code, message, at_token} of each recovery, in order
  chat = { completions: { create: (request) => this.#createCompletion(request) } };

  constructor(options = {}) {
    const unknown = Object.keys(options ?? {}).filter((name) => !CREATE_OPTIONS.includes(name));
    if (unknown.length) {
      throw new SpecError("bad_config", `unknown option ${unknown.join(", ")}: ` +
                          `SpecDecoder.create takes ${CREATE_OPTIONS.join(", ")}`);
    }
    const { workerUrl = new URL("./worker.js", import.meta.url), champion = "smollm2",
            draft = "ngram", maxCtx = null, backend = "auto", onProgress = null,
            maxRestarts = 1, stallTimeoutMs = 60000, onNotice = null, drills = false,
            loadDrill = null, snapshot = true } = options ?? {};
    this.#opts = { workerUrl, champion, draft, maxCtx, backend, onProgress, maxRestarts,
                   stallTimeoutMs, onNotice, drills, loadDrill, snapshot };
  }

  // --- plumbing -----------------------------------------------------------------------------
  #spawn() {
    // A worker replaced while requests wait on it: they fail as for a death, never hang.
    if (this.#worker) this.#died(new SpecError("worker_died", "the worker was replaced"));
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
      if (this.#terminated) {
        reject(new SpecError("terminated", "the decoder was terminated: create a new one"));
        return;
      }
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
    this.#spawn();
    await this.#init();
  }

  // A new worker after a death, shared by every request that death stopped: each of them then
  // resumes there (a second spawn would replace the first one's worker under it).
  #restart() {
    this.#restarting ??= this.#start().finally(() => { this.#restarting = null; });
    return this.#restarting;
  }

  async #init() {
    const { champion, draft, maxCtx, backend, onProgress, drills, loadDrill,
            snapshot } = this.#opts;
    this.#opts.loadDrill = null;   // the first worker's load only
    this.info = await this.#request("init", { champion, draft, maxCtx, backend, drills,
                                              drill: loadDrill, snapshot },
                                    { onEvent: onProgress });
    for (const n of this.info.notices ?? []) this.#notice({ ...n, at_token: 0 });
  }

  // --- the API ------------------------------------------------------------------------------
  /** Stream a chat completion: yields {offset, text, tokens} as cycles commit text; returns
   *  its result (as lastResult, which concurrent requests share). */
  async *generate(messages, config = {}) {
    return yield* this.#run(messages, config, {});
  }

  // generate(); `handle.id` follows the worker id of the request (a new one after a restart),
  // so that the facade's AbortSignal cancels this request and no other; handle.onPosted() runs
  // each time the request has gone to a worker.
  async *#run(messages, config, handle) {
    if (config === null || typeof config !== "object" || Array.isArray(config)) {
      throw new SpecError("bad_config", "generate's config must be an object of options");
    }
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
      handle.id = id;
      this.#active.add(id);
      const done = this.#request("generate", { messages, config: workerConfig, resume },
                                 { id, onEvent: (msg) => push({ chunk: msg }) });
      done.then((msg) => push({ done: msg }), (err) => push({ error: err }));
      handle.onPosted?.();
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
            yield { offset: shown - fresh.length, text: fresh, tokens,
                    kinds: item.chunk.kinds, starts: item.chunk.starts };
          } else if (item.done) {
            this.lastResult = item.done;
            // The context-full policy left out the oldest turns (counts in receipt.context).
            if (item.done.notice) this.#notice({ code: "context_trimmed", message: item.done.notice });
            // Faults the worker recovered from by itself (a lost GPU device: finished on the CPU).
            const faults = item.done.receipt?.faults ?? [];
            faults.forEach((f, i) => {
              // A dead worker was noticed when it happened, loading faults at init.
              if (f.kind === "worker_died" || f.kind === "worker_oom" || LOAD_FAULTS.has(f.kind)) return;
              const next = faults[i + 1]?.adapter ?? item.done.receipt.stats.adapter;
              this.#notice({ code: f.kind, at_token: f.at_token,
                             message: `${GPU_FAULTS[f.kind] ?? f.kind} after ${f.at_token} ` +
                                      "tokens; the request went on from there " +
                                      (next === "cpu-numpy" ? "on the CPU" : "on a new device") });
            });
            finished = true;
            return item.done;
          } else {
            throw item.error;
          }
        }
      } catch (err) {
        const restartable = ["worker_died", "fatal", "worker_oom"].includes(err.code);
        if (!restartable || restarts >= this.#opts.maxRestarts) throw err;
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
        await this.#restart();
        resume = { ids: [...ids], fault: { kind, cycle,
                                           restart_s: (performance.now() - since) / 1000 } };
      } finally {
        this.#active.delete(id);
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

  /** Stop this decoder's generations, the running one after its current cycle and those
   *  waiting behind it before they start (each ends with finish_reason "cancelled"); resolves
   *  with whether there was one to stop. */
  async cancel() {
    return this.#cancel([...this.#active]);
  }

  async #cancel(ids) {
    const acks = await Promise.all(ids.map((target) => this.#request("cancel", { target })));
    return acks.some((ack) => ack.cancelled);
  }

  /** Load the weights again in the same worker (Pyodide stays loaded). `champion` and `maxCtx`
   *  (as for create()) load another model or context there instead; they stay this decoder's,
   *  so a restarted worker loads them too. With drills: true, `loadDrill` makes a loading fault
   *  strike meanwhile (worker.js LOAD_DRILLS); its notices arrive as for create(). Resolves
   *  with the new `ready` message (also `info`). */
  async reload({ loadDrill = null, champion, maxCtx } = {}) {
    const before = { champion: this.#opts.champion, maxCtx: this.#opts.maxCtx };
    if (champion !== undefined) this.#opts.champion = champion;
    if (maxCtx !== undefined) this.#opts.maxCtx = maxCtx;
    this.#opts.loadDrill = loadDrill;
    try {
      await this.#init();
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

  // --- the OpenAI-style facade -------------------------------------------------------------
  // chat.completions.create(request): with stream: true, resolves to an async iterator of
  // `chat.completion.chunk`s (the first delta carries the role; the last chunk carries
  // finish_reason, usage and pyspec); otherwise to one `chat.completion`. Both run generate()
  // with the same messages and config, so the text is the SpecDecoder's own. A request it
  // cannot honour is refused (SpecError bad_config naming the option) before anything runs.
  async #createCompletion(request) {
    const { messages, stream = false, signal = null, ...rest } = request ?? {};
    const config = facadeConfig(rest, this.info?.champion);
    if (!Array.isArray(messages)) {
      throw new SpecError("bad_config", "messages must be an array of {role, content}");
    }
    if (signal !== null && typeof signal?.aborted !== "boolean") {
      throw new SpecError("bad_config", "signal must be an AbortSignal (an AbortController's)");
    }
    const head = { id: `chatcmpl-${crypto.randomUUID()}`, created: Math.floor(Date.now() / 1000),
                   model: this.info?.champion ?? this.#opts.champion };
    const chunks = this.#completionChunks(messages, config, signal, head);
    if (stream) return chunks;
    let content = "", last = null;
    for await (const chunk of chunks) {
      content += chunk.choices[0].delta.content ?? "";
      last = chunk;
    }
    return { ...head, object: "chat.completion",
             choices: [{ index: 0, message: { role: "assistant", content },
                         finish_reason: last.choices[0].finish_reason, logprobs: null }],
             usage: last.usage, pyspec: last.pyspec };
  }

  async *#completionChunks(messages, config, signal, head) {
    const chunk = (delta, finish_reason = null, extra = {}) => (
      { ...head, object: "chat.completion.chunk",
        choices: [{ index: 0, delta, finish_reason, logprobs: null }], ...extra });
    // Abort cancels this request (not the decoder's others): it stops after its current cycle,
    // or before it starts where it waits behind another, and ends as usual, its last chunk
    // saying finish_reason "abort". A cancel that finds nothing to stop yet is sent again at the
    // next chunk.
    let cancel = "idle";      // idle -> sent -> done (or back to idle: nothing to stop yet)
    const abort = () => {
      if (cancel !== "idle" || handle.id === null) return;
      cancel = "sent";
      this.#cancel([handle.id]).then((ok) => { cancel = ok ? "done" : "idle"; },
                                     () => { cancel = "idle"; });
    };
    // An abort before the request went to a worker, or before a restart, cancels it there.
    const handle = { id: null,
                     onPosted: () => { if (signal?.aborted) { cancel = "idle"; abort(); } } };
    signal?.addEventListener("abort", abort, { once: true });
    let role = { role: "assistant" }, completion = 0;
    const run = this.#run(messages, config, handle);
    let step = null;
    try {
      while (!(step = await run.next()).done) {
        const c = step.value;
        if (signal?.aborted) abort();
        completion += c.tokens;
        yield chunk({ ...role, content: c.text }, null,
                    { pyspec: { offset: c.offset, tokens: c.tokens } });
        role = {};
      }
    } finally {
      signal?.removeEventListener("abort", abort);
      if (!step?.done) await run.return();   // the caller broke out: the request is cancelled
    }
    // This request's own result (lastResult may be a concurrent request's by now).
    const { finish_reason, stats, receipt, notice = null } = step.value;
    const prompt = stats?.prompt_tokens ?? null;    // stats is null only when the worker had none
    completion = stats?.generated_tokens ?? completion;
    const delta = role.role ? { ...role, content: "" } : {};   // no text at all: still the role
    yield chunk(delta, FINISH[finish_reason] ?? finish_reason, {
      usage: { prompt_tokens: prompt, completion_tokens: completion,
               total_tokens: prompt === null ? null : prompt + completion },
      pyspec: { finish_reason, stats, receipt, notice } });
  }

  /** Stop the worker now; the decoder is done (later calls throw SpecError "terminated"). */
  terminate() {
    this.#terminated = true;
    clearInterval(this.#watchdog);
    this.#watchdog = null;
    this.#died(new SpecError("terminated", "the decoder was terminated"));
  }
}
