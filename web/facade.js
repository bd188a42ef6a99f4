// The OpenAI-style facade of client.js's SpecDecoder: `d.chat.completions.create(request)`, the
// same generate() in the shape of the OpenAI SDK and WebLLM (client.d.ts types both). With
// stream: true it resolves to an async iterator of `chat.completion.chunk`s (the first delta
// carries the role; the last chunk carries finish_reason, usage and pyspec); otherwise to one
// `chat.completion`. A request it cannot honour is refused (SpecError bad_config naming the
// option) before anything runs.
//
// Not here: the worker, restarts and resume (client.js), the option values' checks (the worker's
// Python session).

import { SpecError } from "./errors.js";
import { REQUEST_OPTIONS } from "./options.js";

// The engine's finish reasons in OpenAI's words. "cancelled" (an AbortSignal) becomes "abort",
// as in WebLLM: OpenAI has no word for a request the caller stopped.
const FINISH = { stop: "stop", length: "length", context: "length", cancelled: "abort" };
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
  for await (const chunk of chunks) {
    content += chunk.choices[0].delta.content ?? "";
    last = chunk;
  }
  return { ...head, object: "chat.completion",
           choices: [{ index: 0, message: { role: "assistant", content },
                       finish_reason: last.choices[0].finish_reason, logprobs: null }],
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
  let step = null;
  try {
    while (!(step = await run.next()).done) {
      const c = step.value;
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
  // stats is null for a request stopped before it ran (aborted while it waited): then the
  // prompt was never counted, and usage says so with null rather than a made-up 0.
  const prompt = stats?.prompt_tokens ?? null;
  completion = stats?.generated_tokens ?? completion;
  const delta = role.role ? { ...role, content: "" } : {};   // no text at all: still the role
  yield chunk(delta, FINISH[finish_reason] ?? finish_reason, {
    usage: { prompt_tokens: prompt, completion_tokens: completion,
             total_tokens: prompt === null ? null : prompt + completion },
    pyspec: { finish_reason, stats, receipt, notice } });
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
