// The OpenAI-style facade of client.js's SpecDecoder: `d.chat.completions.create(request)`, the
// same generate() in the shape of the OpenAI SDK and WebLLM (client.d.ts types both). With
// stream: true it resolves to an async iterator of `chat.completion.chunk`s (the first delta
// carries the role; the last chunk carries finish_reason, usage and pyspec); otherwise to one
// `chat.completion`. A request it cannot honour is refused (SpecError bad_config naming the
// option) before anything runs. With `tools`, calls stream as OpenAI streams them (index, id
// and name first, then fragments of the arguments) and end in message.tool_calls with
// finish_reason "tool_calls": the worker's Python says where content and calls are in the
// output (each chunk's `tools`, text/toolcalls.py), and this file only slices the text there.
//
// Not here: the worker, restarts and resume (client.js), the option values' checks (the worker's
// Python session).

import { SpecError } from "./errors.js";
import { REQUEST_OPTIONS } from "./options.js";

// The engine's finish reasons in OpenAI's words. "cancelled" (an AbortSignal) becomes "abort",
// as in WebLLM: OpenAI has no word for a request the caller stopped.
const FINISH = { stop: "stop", length: "length", context: "length", cancelled: "abort",
                 tool_calls: "tool_calls" };
// Options of the OpenAI request that pyspec does not do yet: refused, never ignored.
const NOT_YET = {};
// OpenAI options pyspec honours only at one value, the one that asks for nothing more: taken
// at it (code written for OpenAI or WebLLM sends them), refused at any other. stream_options
// include_usage: the last chunk carries usage anyway.
const ONLY_AT = {
  n: [(v) => v === 1, "1"],
  logprobs: [(v) => v === false, "false"],
  stream_options: [(v) => typeof v === "object" && !Array.isArray(v) &&
                          Object.keys(v).every((key) => key === "include_usage"),
                   "{include_usage}"],
};
// The options it takes, by type (typeof): the request options that have an OpenAI name
// (pyspec/options.py REQUEST, through options.js: temperature, max_tokens, seed, the sampling
// controls as OpenAI, WebLLM and vLLM name them, response_format), `model`, and `pyspec`, which
// holds generate()'s own ({k, verify, draft, ...}). The worker's session checks their values.
const OPENAI = Object.fromEntries(Object.entries(REQUEST_OPTIONS)
  .filter(([, o]) => o.openai !== null).map(([name, o]) => [o.openai, { name, types: o.types }]));
const FACADE_FIELDS = { ...OPENAI, model: { types: ["string"] }, pyspec: { types: ["object"] } };

// The generate() config for a facade request (without messages, stream, signal), or a SpecError
// naming the option it cannot take. null or undefined means "not given", as in JSON.
function facadeConfig(request, champion) {
  const config = {};
  for (const [name, value] of Object.entries(request)) {
    if (value === undefined || value === null) continue;
    if (name in ONLY_AT) {
      const [takes, only] = ONLY_AT[name];
      if (!takes(value)) {
        throw new SpecError("bad_config", `${name} ${JSON.stringify(value)} is not supported: ` +
                            `only ${only} (or leave ${name} out)`);
      }
      continue;
    }
    if (name in NOT_YET) {
      throw new SpecError("bad_config", `${name} is not supported yet (${NOT_YET[name]}); ` +
                          `leave ${name} out`);
    }
    if (!(name in FACADE_FIELDS)) {
      throw new SpecError("bad_config", `unknown option ${name}: chat.completions.create takes ` +
                          `messages, stream, signal, ${Object.keys(FACADE_FIELDS).join(", ")}` +
                          ` (and ${Object.keys(ONLY_AT).join(", ")} at their defaults)`);
    }
    const kinds = FACADE_FIELDS[name].types;
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
      config[OPENAI[name].name] = value;
    }
  }
  // As OpenAI: a request above temperature 0 without a seed samples afresh each time (a
  // "regenerate" gets another answer). Its seed is drawn here, below 2^53 (JSON's exact
  // integers), and the receipt records it: the same request with it gives the same text again.
  if (config.seed === undefined && config.temperature > 0) config.seed = randomSeed();
  return config;
}

function randomSeed() {
  const [hi, lo] = crypto.getRandomValues(new Uint32Array(2));
  return (hi & 0x1fffff) * 2 ** 32 + lo;
}

// chat.completions.create for a decoder: `decoder.run(messages, config, req)` is its generate()
// with a request record (client.js #run), `decoder.cancel(req)` stops that request alone,
// `decoder.loaded()` names the loaded champion (undefined before the load) and
// `decoder.champion()` the one asked for.
export function completions(decoder) {
  return { create: (request) => createCompletion(decoder, request) };
}

async function createCompletion(decoder, request) {
  const { messages, stream = false, signal = null, ...rest } = request ?? {};
  const config = facadeConfig(rest, decoder.loaded());
  if (!Array.isArray(messages)) {
    throw new SpecError("bad_config", "messages must be an array of {role, content}");
  }
  if (signal !== null && typeof signal?.aborted !== "boolean") {
    throw new SpecError("bad_config", "signal must be an AbortSignal (an AbortController's)");
  }
  const head = { id: `chatcmpl-${crypto.randomUUID()}`, created: Math.floor(Date.now() / 1000),
                 model: decoder.champion() };
  let started;
  const checked = new Promise((resolve) => { started = resolve; });
  const req = { onStarted: () => started() };
  const chunks = completionChunks(decoder, messages, config, signal, head, req);
  if (stream) {
    // The stream is returned once a worker has checked the request and started it (or it
    // ended first), so a bad value rejects this call, as the OpenAI SDK's create() rejects on
    // the server's answer. A request queued behind another resolves when its turn comes.
    const first = chunks.next();
    first.catch(() => {});     // its rejection is this call's, below, or the stream's
    await Promise.race([checked, first]);
    return streamFrom(first, chunks);
  }
  let content = "", last = null;
  const calls = [];
  for await (const chunk of chunks) {
    const delta = chunk.choices[0].delta;
    content += delta.content ?? "";
    for (const d of delta.tool_calls ?? []) {   // as the OpenAI SDK gathers a stream's calls
      calls[d.index] ??= { id: d.id, type: "function", function: { name: d.function.name,
                                                                    arguments: "" } };
      calls[d.index].function.arguments += d.function.arguments;
    }
    last = chunk;
  }
  const message = calls.length ? { role: "assistant", content: content || null,
                                   tool_calls: calls }
                               : { role: "assistant", content };
  return { ...head, object: "chat.completion",
           choices: [{ index: 0, message, finish_reason: last.choices[0].finish_reason,
                       logprobs: null }],
           usage: last.usage, pyspec: last.pyspec };
}

async function* completionChunks(decoder, messages, config, signal, head, req) {
  const chunk = (delta, finish_reason = null, extra = {}) => (
    { ...head, object: "chat.completion.chunk",
      choices: [{ index: 0, delta, finish_reason, logprobs: null }], ...extra });
  // Abort cancels this request (not the decoder's others): it stops after its current cycle,
  // or before it starts where it waits behind another or for a new worker, and ends as usual,
  // its last chunk saying finish_reason "abort". A signal aborted already: at once.
  const abort = () => { decoder.cancel(req); };
  req.cancelled = Boolean(signal?.aborted);
  signal?.addEventListener("abort", abort, { once: true });
  let role = { role: "assistant" }, completion = 0;
  const run = decoder.run(messages, config, req);
  const calls = config.tools ? new ToolDeltas() : null;
  let step = null;
  try {
    while (!(step = await run.next()).done) {
      const c = step.value;
      completion += c.tokens;
      const delta = calls ? calls.next(c) : { content: c.text };
      yield chunk({ ...role, ...delta }, null,
                  { pyspec: { offset: c.offset, tokens: c.tokens } });
      role = {};
    }
  } finally {
    signal?.removeEventListener("abort", abort);
    if (!step?.done) await run.return();   // the caller broke out: the request is cancelled
  }
  // This request's own result (lastResult may be a concurrent request's by now).
  const { finish_reason, stats, receipt, notice = null } = step.value;
  // stats is null for a request stopped before it ran (aborted while it waited): then the
  // prompt was never counted, and usage says so with null rather than a made-up 0.
  const prompt = stats?.prompt_tokens ?? null;
  completion = stats?.generated_tokens ?? completion;
  // What the stream has not shown of the result (content held back while it might have been a
  // call's start; the last call's last fragment), then the end.
  const rest = calls ? calls.rest(step.value) : {};
  const delta = role.role ? { ...role, content: "", ...rest } : rest;
  yield chunk(delta, FINISH[finish_reason] ?? finish_reason, {
    usage: { prompt_tokens: prompt, completion_tokens: completion,
             total_tokens: prompt === null ? null : prompt + completion },
    pyspec: { finish_reason, stats, receipt, notice } });
}

// A tools request's deltas: each chunk's `tools` (content_end, calls [{id, name, start, end}],
// UTF-16 offsets in the whole output) says where content and calls are; the deltas are the
// parts of them not shown yet. Offsets are absolute, so a resumed stream shows nothing twice.
class ToolDeltas {
  #text = ""; #content = 0; #args = [];

  next(c) {
    this.#text = this.#text.slice(0, c.offset) + c.text;
    const { content_end, calls } = c.tools;
    const delta = {};
    if (content_end > this.#content) {
      delta.content = this.#text.slice(this.#content, content_end);
      this.#content = content_end;
    }
    const out = calls.map((call, index) => this.#call(index, call.id, call.name,
                                                      this.#text.slice(call.start, call.end)))
      .filter(Boolean);
    if (out.length) delta.tool_calls = out;
    return delta;
  }

  // The result's content and calls past what was shown.
  rest(result) {
    const delta = {};
    const content = result.content ?? "";
    if (content.length > this.#content) delta.content = content.slice(this.#content);
    // (a call not shown yet: its name, then all of its arguments)
    const out = (result.tool_calls ?? []).flatMap((call, index) => [0, 1].map(() => this.#call(
      index, call.id, call.function.name, call.function.arguments))).filter(Boolean);
    if (out.length) delta.tool_calls = out;
    return delta;
  }

  // A call's delta: its id and name first (arguments ""), then each time the fragment of its
  // arguments not shown yet; null when there is nothing new.
  #call(index, id, name, args) {
    if (this.#args[index] === undefined) {
      this.#args[index] = 0;
      return { index, id, type: "function", function: { name, arguments: "" } };
    }
    const shown = this.#args[index];
    if (args.length <= shown) return null;
    this.#args[index] = args.length;
    return { index, function: { arguments: args.slice(shown) } };
  }
}

// The facade's stream, once create() has its first step: that step, then the rest. The rest
// is closed however the caller stops, so a request it broke out of is cancelled.
async function* streamFrom(first, rest) {
  try {
    const step = await first;
    if (step.done) return;
    yield step.value;
    yield* rest;
  } finally {
    await rest.return();
  }
}
