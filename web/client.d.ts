// Types for web/client.js: SpecDecoder, its OpenAI-style facade (chat.completions.create) and
// SpecError. The SpecErrorCode union is written from the code that raises the errors
// (webtools/errorcodes.py; `python3 build.py site` refreshes it); the rest is kept next to
// client.js by hand. Shapes of stats and receipts are pyspec's own (pyspec/engine.py,
// pyspec/receipts.py): the fields below are the ones a page typically reads.

// BEGIN SpecErrorCode: written by webtools/errorcodes.py from the sources; do not edit
export type SpecErrorCode =
  | "bad_config"
  | "bad_draft"
  | "bad_input"
  | "bad_model"
  | "bad_request"
  | "bad_workload"
  | "corrupt_download"
  | "device_lost"
  | "download_failed"
  | "fatal"
  | "gpu_error"
  | "gpu_timeout"
  | "gpu_unrecoverable"
  | "incompatible_draft"
  | "insecure_context"
  | "internal"
  | "model_too_large"
  | "no_webgpu"
  | "not_ready"
  | "out_of_memory"
  | "prompt_too_long"
  | "terminated"
  | "unknown_model"
  | "weights_changed"
  | "worker_died"
  | "worker_oom";
// END SpecErrorCode

export declare class SpecError extends Error {
  constructor(code: SpecErrorCode, message: string);
  readonly name: "SpecError";
  readonly code: SpecErrorCode;
}

// --- the decoder ---------------------------------------------------------------------------------
/** A model in the site's manifest.json by name ("tiny", "smollm2"), or a GGUF by URL (`sha256`:
 *  64 hex digits, either case; without it the weights are not cached in OPFS). A draft
 *  by URL may bring its reduced head (`vocab`: a DRAFT.vocab.json, schema pyspec.draft-vocab/1),
 *  which the numpy engine's draft runs with; a site's draft brings the one its manifest lists.
 *  A File or Blob (one the user picked or dropped) is hashed as it is copied into OPFS and
 *  cached under its sha256. A model by URL or Blob gets its card first (SpecDecoder.card) and
 *  is refused before its download where this page cannot run it. */
export type ModelSpec = string | Blob | { url: string; sha256?: string; size?: number;
                                          vocab?: { url: string; sha256?: string } };

/** pyspec/apps/info.py's model card (`python -m pyspec info --json`), from the header alone. */
export interface ModelCard {
  file: string;
  bytes: number;
  runs: boolean;
  /** Why pyspec cannot run it (with `code`), else null. */
  refusal: string | null;
  code: string | null;
  architecture?: string;
  name?: string | null;
  parameters?: number;
  tensor_types?: Record<string, number>;
  template?: string;
  tokenizer?: string;
  pre?: string;
  context?: number;
  layers?: number;
  vocab?: number;
  kv_context?: number;
  kv_bytes?: number;
  largest_tensor?: { name: string; bytes: number };
  /** Each engine's verdict by the stated memory rule; webgpu by this adapter's limits. */
  backends?: Record<"cpu" | "page-cpu" | "webgpu",
                    { fits: boolean; needs: number; why: string; limit?: number;
                      /** cpu, page-cpu: the most parameters whose float32 weights fit here */
                      largest_params?: number }>;
}

/** SpecDecoder.card's answer. */
export interface CardResult {
  card: ModelCard;
  /** Why this page cannot run it (create() would throw this SpecError), else null. */
  error: { code: SpecErrorCode; message: string } | null;
  /** The header's bytes read; range false: the server ignored Range, and the start of the
   *  full download was read instead. */
  header: { bytes: number; range: boolean };
}

/** A message; an assistant's that called tools carries them (its content may be null), and a
 *  tool's result comes back as role "tool" with the call's id. The model's own chat template
 *  renders them all. */
export type ChatMessage =
  | { role: "system" | "user"; content: string }
  | { role: "assistant"; content: string | null; tool_calls?: ToolCall[] | null }
  | { role: "tool"; content: string; tool_call_id?: string };

/** OpenAI's tool: a function the model may call. Its name is 1-64 of [A-Za-z0-9_-]; its
 *  parameters an object schema of the json_schema subset (another keyword is refused as
 *  bad_config, by name). */
export interface Tool {
  type: "function";
  function: { name: string; description?: string; parameters?: JsonSchema;
              strict?: boolean | null };
}

/** "auto" (the model chooses; the default with tools) | "none" | "required" (at least one
 *  call) | one function (generate() also takes its name alone). */
export type ToolChoice = "auto" | "none" | "required" | string
  | { type: "function"; function: { name: string } };

/** A call the model made: `arguments` is the JSON text of an object valid against the tool's
 *  parameters. `id` is what the tool message of its result names. */
export interface ToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

export interface Progress {
  type: "progress";
  /** Python's start, a model's card (by URL or Blob, before its download), a weights
   *  download, a picked File/Blob copied into OPFS (and hashed), the weights' sha256 checked as
   *  they stream from OPFS (loaded / total bytes), the model built (its tensors streamed to the
   *  GPU). */
  phase: "runtime" | "card" | "download" | "import" | "verify" | "load";
  loaded: number;
  total: number;
  label?: string;
  /** phase "card": the card and how its header was read (CardResult's). */
  card?: ModelCard;
  header?: { bytes: number; range: boolean };
}

export interface Notice {
  code: string;           // "worker_died", "device_lost", "context_trimmed", "answer_capped", ...
  message: string;
  at_token?: number;
}

export interface SpecDecoderOptions {
  workerUrl?: string | URL;          // default: worker.js next to client.js
  /** Default "smollm2", a model of the full site's manifest; the npm package ships no models,
   *  so there give {url, sha256} of a GGUF your site serves. */
  champion?: ModelSpec;
  /** "ngram" (default) | "auto" | "none" | "self:L" | a draft model. "auto": the site's trained
   *  draft for the champion (its manifest's draft_for) on a hardware WebGPU adapter, where it is
   *  the fastest drafter measured, else "ngram" without downloading the draft; `info.draft_auto`
   *  says which and why. */
  draft?: ModelSpec;
  /** The context the engine holds, prompt and answer together: default 2048 tokens (the KV
   *  cache's memory), at most the champion's own (8192 for smollm2; a larger value is capped
   *  there, `info.context` says what it got). Longer conversations lose their oldest turns
   *  (the `context_trimmed` notice). */
  maxCtx?: number | null;
  backend?: "auto" | "webgpu" | "cpu";
  onProgress?: ((p: Progress) => void) | null;
  maxRestarts?: number;              // new workers per request after a death; default 1
  stallTimeoutMs?: number;           // default 60000; 0 turns the stall check off
  onNotice?: ((n: Notice) => void) | null;
  drills?: boolean;                  // fault drills (config.drill, loseDevice); default false
  /** create() only: aborting stops the load (the worker, its download, its hold on the cache);
   *  create() then rejects with SpecError "terminated". */
  signal?: AbortSignal | null;
  /** A loading fault drill for the first worker's load (drills: true): "opfs-truncate" |
   * "opfs-flip" | "opfs-quota" | "opfs-unavailable" | "download-drop" | "opfs-stall". */
  loadDrill?: string | null;
  /** Start Python from the Pyodide memory snapshot an earlier visit saved in OPFS (1 s instead
   *  of 4), making one for the next visit when there is none; default true. false: neither. */
  snapshot?: boolean;
  /** Tests: the WebGPU adapter's buffer and binding limits as the weights' upload reads them,
   *  lowered (bytes), so a small model's vocabulary tables go in row parts as a large model's
   *  do; default null (the adapter's own). */
  gpuLimits?: { maxBufferSize?: number; maxStorageBufferBindingSize?: number } | null;
}

/** The sampling controls, applied in this order (README "Sampling controls"): logit_bias,
 *  repetition_penalty (prompt and output tokens), presence and frequency penalties (output
 *  tokens), then temperature, top_k, top_p, min_p. null or left out: off. */
export interface SamplingConfig {
  logit_bias?: Record<string, number> | null;   // token id -> bias in [-100, 100]
  repetition_penalty?: number | null;  // > 0; 1 = off (HF semantics)
  presence_penalty?: number | null;    // [-2, 2] (OpenAI)
  frequency_penalty?: number | null;   // [-2, 2] (OpenAI)
  top_k?: number | null;               // integer >= 0; 0 = off
  top_p?: number | null;               // (0, 1]; 1 = off
  min_p?: number | null;               // [0, 1]; 0 = off
  /** Up to 4; the output ends before the first to appear (not included), finish_reason "stop". */
  stop?: string | string[] | null;
  /** Constrained output: the text is compact JSON that follows the schema (the subset in the
   * README; another keyword is refused as bad_config, by name). */
  json_schema?: JsonSchema | null;
  /** OpenAI's form of the same; { type: "text" } is no constraint. Give one of the two. */
  response_format?: ResponseFormat | null;
  /** Tool calls: the functions the model may call, in the call format its chat template
   *  writes (Qwen 2.5 / Hermes, Llama 3.x; another template is refused as bad_config). A call's
   *  name is one of them and its arguments follow its parameters, decoded under that grammar. */
  tools?: Tool[] | null;
  tool_choice?: ToolChoice | null;
  /** Several calls in one answer where the template's format takes them; default true. */
  parallel_tool_calls?: boolean | null;
}

/** A JSON Schema object (type, properties, required, additionalProperties: false, items,
 * minItems, maxItems, maxLength, enum). */
export type JsonSchema = { [keyword: string]: unknown };

/** OpenAI's response_format; `strict` is accepted, and the schema is always followed. */
export type ResponseFormat =
  | { type: "text" }
  | { type: "json_schema"; json_schema: { name?: string; schema: JsonSchema;
                                          strict?: boolean | null } };

/** generate()'s config; every field may be null or left out for its default. */
export interface GenerateConfig extends SamplingConfig {
  max_tokens?: number | null;        // default 128
  temperature?: number | null;       // default 0 (greedy)
  seed?: number | null;              // default 0
  verify?: "greedy" | "replay" | "rejection" | null;
  k?: string | null;                 // "heuristic" (default) | "fixed:N" | ...
  tree?: string | null;              // a tree of drafts per pass: widths per depth "2,2,1"
                                     // or "auto"; n-gram's on either engine, a draft model's
                                     // on the CPU engine, and on WebGPU of fixed widths under
                                     // greedy or replay (grown on the device; "auto" is
                                     // refused by name); not with the sampling controls or a
                                     // schema; default chains
  draft?: string | null;             // this request's drafter (the loaded one by default;
                                     // "ngram+model": n-gram where the text repeats, the
                                     // loaded draft model elsewhere; "auto": the loaded
                                     // draft model where it pays, else "ngram")
  context_overflow?: "drop_oldest" | "error" | null;
  /** A fault drill, "KIND@C" (drills: true): worker-terminate, worker-oom, device-lost,
   * device-lost-repeat, gpu-oom, readback-throw or readback-hang, once C cycles have run. */
  drill?: string | null;
}

/** What each token was: a plain decode step, a draft the champion accepted, the champion's token
 * at the first rejected draft, its token after a block accepted whole, or a JSON-schema token
 * that was the only one allowed. */
export type TokenKind = "champion" | "accepted" | "corrected" | "bonus" | "forced";

export interface Chunk {
  offset: number;                    // UTF-16 offset of `text` in the whole output
  text: string;
  tokens: number;                    // tokens committed with this text
  kinds: TokenKind[];                // one per token committed with this text
  starts: number[];                  // UTF-16 offset where each of those tokens' text begins
  /** A tools request: the output so far as content and calls (UTF-16 offsets in the whole
   *  output; a tail that may yet start a call is held back from the content). */
  tools?: ToolSplit;
}

/** Where the content and the calls are in a tools request's output: output.slice(0,
 *  content_end) is content, output.slice(start, end) call i's arguments so far (`closed` once
 *  they are whole). */
export interface ToolSplit {
  content_end: number;
  calls: { id: string; name: string; start: number; end: number; closed: boolean }[];
}

/** "tool_calls": the answer ended after its calls (a tools request). */
export type EngineFinishReason = "stop" | "length" | "context" | "cancelled" | "tool_calls";

/** How a request's decode cycles spent their time on the WebGPU engine (an empty object on the
 *  CPU engine). */
export interface BackendTiming {
  cycles: number;
  /** Seconds of host work: encoding and submitting the cycles (and a host accept's rule). */
  host_s: number;
  /** Each cycle's own host seconds, for the first 256 cycles: for medians, since a software
   *  adapter's threads interrupt some cycles' encoding. */
  host_s_cycles: number[];
  /** Seconds awaiting readbacks. */
  wait_s: number;
  readbacks: number;
  /** Cycles submitted before the one in flight was read (pipelined). */
  ahead: number;
  /** Queue submissions of the decode (after the prefill): one per cycle on the device path. */
  submissions: number;
  /** Cycles whose drafts were sampled or looked up on the GPU inside the cycle's submission. */
  drafted_on_device: number;
  /** Cycles whose drafts were proposed on the host and written up. */
  drafted_on_host: number;
  host_accept_s?: number;
  mask_s?: number;
}

export interface Stats {
  adapter: string;
  drafter: string;
  /** Where the drafts were made: on the GPU inside each cycle's submission ("device"), on the
   *  host ("host"), both ("device+host"), or null when nothing was drafted. */
  draft_path: "device" | "host" | "device+host" | null;
  generated_tokens: number;
  prompt_tokens: number;
  prefill_tokens: number;
  reused_tokens: number;
  resumed_tokens: number;
  finish_reason: EngineFinishReason;
  champion_passes: number;
  drafted: number;
  accepted: number;
  acceptance_rate: number;
  tokens_per_pass: number;
  /** Tokens written where a JSON schema allowed exactly one (0 without a schema). */
  forced_tokens: number;
  tokens_per_s: number;
  ttft_s: number | null;
  backend_timing: Partial<BackendTiming>;
  [field: string]: unknown;
}

export interface Receipt {
  schema: string;
  pyspec_version: string;
  champion_sha256: string;
  stats: Partial<Stats>;
  /** draft.auto: for a request that left its drafter to "auto", the verdict that chose it
   *  (both fields null: today's rule chose); null when the request named its drafter. */
  draft?: { auto: { verdict: VerdictWord | null; verdict_sha256: string | null } | null;
            [field: string]: unknown };
  /** Faults this request recovered from: a GPU fault or a dead worker (cycle, at_token; the
   *  adapter that failed; restart_s, a worker's restart), or one met while the weights loaded
   *  (kind, recovery_s, and at_token and cycle 0: the first request after the load carries
   *  them). */
  faults?: { kind: string; recovery_s: number; cycle?: number; at_token?: number;
             adapter?: string; restart_s?: number }[];
  [field: string]: unknown;
}

export interface GenerateResult {
  text: string;
  tokens: number[] | null;
  finish_reason: EngineFinishReason;
  stats: Stats | null;
  receipt: Receipt | null;
  notice?: string | null;
  /** A tools request: its calls ([] when it made none) and the content before them (null where
   *  there is none); absent otherwise. */
  tool_calls?: ToolCall[] | null;
  content?: string | null;
}

/** The worker's `ready` message. */
export interface ReadyInfo {
  /** The engine's adapter: a WebGPU adapter's name, or "cpu-numpy". */
  adapter: string;
  /** Why the GPU is not used (a software adapter, no WebGPU, a shader error, backend "cpu");
   *  null when it is. */
  fallback: string | null;
  /** Its kind: "software_adapter" | "no_webgpu" | "webgpu_error" | "cpu_requested"; null. */
  fallback_kind: string | null;
  /** What navigator.gpu offered, whatever the engine chose. */
  webgpu: { available: boolean; vendor?: string; architecture?: string; description?: string;
            fallback?: boolean | null; error?: string;
            limits?: { maxBufferSize: number; maxStorageBufferBindingSize: number } };
  /** The champion's card when it was given by URL or Blob; null for a manifest model. */
  card: ModelCard | null;
  champion: string;
  /** The draft model's name when one was loaded, else null. */
  draft_model: string | null;
  /** The default drafter: "ngram", "none", "self:L", "model", ... ("auto" resolved). */
  draft: string;
  /** With draft "auto": what it chose and why, in words (the recorded verdict that chose it,
   *  and how to clear it); else null. */
  draft_auto: string | null;
  /** With draft "auto": the sha256 of the recorded gate verdict (measure(), OPFS) that chose
   *  `draft` for this champion, draft and device class; null when today's rule chose. */
  draft_verdict: string | null;
  context: number;
  vocab: number;
  n_layers: number;
  pyspec_version: string;
  weight_bytes: number;
  /** The CPU engine's row kernel; null on WebGPU. */
  cpu_kernel: string | null;
  /** The draft's head rows on the numpy engine when it runs a reduced head; null: its full head. */
  draft_head_rows?: number | null;
  /** Milliseconds of the model's build: the GGUF's header, the tokenizer, the draft model, the
   *  engine (weights dequantized or uploaded, kernels compiled). */
  load_ms: { parse: number; tokenizer: number; draft: number; engine: number };
  /** Milliseconds from the init request to ready. */
  init_ms: number;
  /** The wasm heap's size (its high-water mark) before the weights were hashed and after the
   *  model loaded: the weights stream a tensor at a time, so the growth stays near the largest
   *  tensor, not the file. */
  wasm_bytes: { before_weights: number; after_load: number };
  startup: Startup;
  /** Faults met while loading and recovered from (a damaged cache downloaded again, no OPFS,
   *  a dropped download resumed, ...); each also went to onNotice. */
  notices: Notice[];
  /** The weights' bytes downloaded this load, whether they came from OPFS, damaged copies met. */
  weights: { downloaded: number; cached: boolean; corrupt: number };
  [field: string]: unknown;
}

/** How the worker's runtime started. snapshot: "shipped" (Python started from the Pyodide
 *  snapshot the site ships: 1 s instead of 4), "restored" (from one a visit before saved in
 *  OPFS, when the shipped one was missing or unusable), "making" (none was usable: started the
 *  ordinary way, and a worker of its own is making one for the next visit; `startup()` shows
 *  "saved" or "failed" when it is done), "off" (snapshot: false), "unavailable" (no OPFS and
 *  no shipped snapshot). bytecode: the same for the compiled numpy and pyspec modules, saved
 *  in OPFS ("cached" when used); snapshot_error says why a snapshot or cache was not used. */
export interface Startup {
  snapshot: "shipped" | "restored" | "making" | "saved" | "failed" | "off" | "unavailable";
  bytecode: "cached" | "making" | "saved" | "failed" | "off" | "unavailable";
  snapshot_error?: string;
  /** Milliseconds: Python's start, the wheels unpacked, numpy and pyspec imported, the weights
   *  read from OPFS (or the network) and checked, the model built (parse, tokenizer, dequantize). */
  phases_ms: { pyodide: number; packages: number; import: number; weights: number; model: number };
  /** (`startup()` only) whether a model's own chat template has imported jinja2, and that first
   *  render's milliseconds (null before one); a ChatML template never imports it. */
  jinja2?: { loaded: boolean; first_render_ms: number | null };
}

// --- the OpenAI-style facade -----------------------------------------------------------------
/** What pyspec adds to the OpenAI request: generate()'s own options. */
export type PyspecRequestOptions = Pick<GenerateConfig,
  "k" | "tree" | "verify" | "draft" | "context_overflow" | "drill">;

/** The request: the sampling controls under their OpenAI names (the schema as
 *  response_format; generate()'s json_schema is not an OpenAI field). */
export interface ChatCompletionRequest extends Omit<SamplingConfig, "json_schema"> {
  messages: ChatMessage[];
  stream?: boolean | null;
  /** Must name the loaded champion, when given. */
  model?: string | null;
  /** Default 0 (greedy), not OpenAI's 1. */
  temperature?: number | null;
  /** Default 128 (generate()'s), not the rest of the context. */
  max_tokens?: number | null;
  /** Without one each request draws its own (as OpenAI: a regenerate samples afresh), which
   *  pyspec.receipt.seed records; with one, the same request gives the same text again. */
  seed?: number | null;
  /** Accepted at 1 only (one choice). */
  n?: 1 | null;
  /** Accepted at false only. */
  logprobs?: false | null;
  /** Accepted; the last chunk carries usage whatever it says. */
  stream_options?: { include_usage?: boolean } | null;
  /** Aborting stops this request only (the decoder's others go on), after its current cycle or
   *  before it starts; it ends with finish_reason "abort". */
  signal?: AbortSignal | null;
  pyspec?: PyspecRequestOptions | null;
}

/** "abort": an AbortSignal stopped it (as in WebLLM); "length": max_tokens or the context;
 *  "tool_calls": the answer is calls (message.tool_calls). */
export type FinishReason = "stop" | "length" | "abort" | "tool_calls";

/** prompt_tokens and total_tokens are null (unlike OpenAI's) for a request stopped before it
 *  ran, aborted while it waited behind another: its prompt was never counted. */
export interface CompletionUsage {
  prompt_tokens: number | null;
  completion_tokens: number;
  total_tokens: number | null;
}

/** The speculation behind a finished request. */
export interface PyspecUsage {
  finish_reason: EngineFinishReason;
  stats: Stats | null;
  receipt: Receipt | null;
  notice: string | null;
}

interface ChatCompletionChunkBase {
  id: string;                        // "chatcmpl-...", the same for every chunk of a request
  object: "chat.completion.chunk";
  created: number;                   // Unix seconds
  model: string;
  choices: [{
    index: 0;
    /** A call streams as OpenAI streams it: its index, id and name first (arguments ""),
     *  then fragments of its arguments. */
    delta: { role?: "assistant"; content?: string; tool_calls?: ToolCallDelta[] };
    finish_reason: FinishReason | null;   // null until the last chunk
    logprobs: null;
  }];
}

export interface ToolCallDelta {
  index: number;
  id?: string;
  type?: "function";
  function: { name?: string; arguments: string };
}

/** A chunk of text: its offset and token count. */
export interface ChatCompletionContentChunk extends ChatCompletionChunkBase {
  usage?: undefined;
  pyspec: { offset: number; tokens: number };
}

/** The last chunk: finish_reason, usage and the speculation behind the request. */
export interface ChatCompletionLastChunk extends ChatCompletionChunkBase {
  usage: CompletionUsage;
  pyspec: PyspecUsage;
}

/** `if (chunk.usage)` tells the last chunk from the others. */
export type ChatCompletionChunk = ChatCompletionContentChunk | ChatCompletionLastChunk;

export interface ChatCompletion {
  id: string;
  object: "chat.completion";
  created: number;
  model: string;
  choices: [{
    index: 0;
    /** content is null where the answer is calls only. */
    message: { role: "assistant"; content: string | null; tool_calls?: ToolCall[] };
    finish_reason: FinishReason;
    logprobs: null;
  }];
  usage: CompletionUsage;
  pyspec: PyspecUsage;
}

/** With stream: true, create() resolves once a worker has checked the request and started it
 *  (a request queued behind another: when its turn comes), so a bad value rejects the call. */
export interface Completions {
  create(request: ChatCompletionRequest & { stream: true }):
    Promise<AsyncGenerator<ChatCompletionChunk, void, undefined>>;
  create(request: ChatCompletionRequest & { stream?: false | null }): Promise<ChatCompletion>;
  create(request: ChatCompletionRequest):
    Promise<ChatCompletion | AsyncGenerator<ChatCompletionChunk, void, undefined>>;
}

// --- "measure on this device" (measure.js, docs/gate.md) ---------------------------------------
/** A prompt of a workload (the shared/workloads format). */
export interface WorkloadItem {
  id: string;
  stratum: string;
  messages: ChatMessage[];
  max_tokens?: number;
}

export interface MeasureOptions {
  /** The drafters to judge: "ngram", "model" (the loaded draft model), "ngram+model",
   *  "self:L"; default those "auto" chooses among (ngram, and the loaded draft model). */
  drafts?: string[] | null;
  /** Prompts of each stratum of the sample (default 1: 11 prompts; 0: all 44). */
  perStratum?: number | null;
  /** At most this many new tokens a prompt (default 32; 0: each prompt's own). */
  maxTokens?: number | null;
  /** Another sample than the site's public workload: JSONL text or its lines (a malformed or
   *  empty one: SpecError bad_workload). */
  workload?: string | WorkloadItem[] | null;
  /** Aborting it stops the run after its current cycle: cancelled true, nothing recorded. */
  signal?: AbortSignal | null;
  onProgress?: ((p: MeasureProgress) => void) | null;
}

/** After each run of the sample: `done` of `total` runs (prompts x sides); label: the next
 *  run's prompt id and side. */
export interface MeasureProgress {
  phase: "measure";
  done: number;
  total: number;
  label: string;
}

export type VerdictWord = "promote" | "keep off";

/** A recorded verdict (pyspec/verdicts.py), as kept in OPFS verdicts.json. */
export interface Verdict {
  champion_sha256: string;
  /** A draft model's sha256 ("ngram+" before it for the combination), else the drafter's kind. */
  draft: string;
  /** "cpu-numpy", "software", or a GPU's vendor family and architecture: "gpu:nvidia/ampere"
   *  ("gpu:nvidia" where the browser names no architecture). */
  device_class: string;
  verdict: VerdictWord;
  speedup: { median: number; low: number; high: number };
  rule_version: number;
  date: string;
  sha256: string;
}

/** One drafter's line of the gate (apps/gate.py measure and judge). */
export interface GateDrafter {
  verdict: VerdictWord;
  /** Why not promoted, one line each (empty: promoted). */
  reasons: string[];
  prompts: number;
  tokens_per_pass: { median: number; min: number; max: number };
  acceptance: number;
  acceptance_by_position: (number | null)[];
  speedup: { median: number; low: number; high: number; min: number; max: number; n: number };
  ttft_change_s: number;
  ttft_allowed_s: number;
  draft_pass_s: number;
  peak_bytes: number;
  baseline_peak_bytes: number;
  /** Why this verdict was not recorded (a sample under the gate's minimum, THRESHOLDS
   *  prompts), else null. */
  not_recorded: string | null;
  /** The recorded verdict's sha256 (null: not recorded). */
  verdict_sha256: string | null;
  [field: string]: unknown;
}

/** The gate's JSON (schema "pyspec.gate/1"), as `python -m pyspec gate` writes it. */
export interface GateReport {
  schema: "pyspec.gate/1";
  adapter: string;
  device_class: string;
  thresholds: Record<string, number>;
  rule_version: number;
  drafters: Record<string, GateDrafter>;
  /** The table as the CLI prints it. */
  text: string;
  /** The WebGPU adapter behind the engine (ReadyInfo's webgpu): this page's, never recorded. */
  webgpu: ReadyInfo["webgpu"];
  [field: string]: unknown;
}

export interface MeasureResult {
  /** true when its signal (or cancel()) stopped it: then nothing was recorded. */
  cancelled: boolean;
  /** drafter -> its verdict ({} when cancelled). */
  verdict: Record<string, VerdictWord>;
  text: string | null;
  report: GateReport | null;
  /** The verdicts recorded, which draft "auto" follows from the next load ([] for a sample
   *  under the gate's minimum: each drafter's not_recorded says so). */
  verdicts: Verdict[];
  /** Whether they were written to OPFS (not in a page without it, nor when none was
   *  recorded). */
  stored: boolean;
}

export declare class SpecDecoder {
  /** Start a worker, load Pyodide, pyspec and the weights; resolves when ready to generate. */
  static create(options?: SpecDecoderOptions): Promise<SpecDecoder>;
  /** Checks the options only; no worker starts (a request then is not_ready): use create. */
  constructor(options?: SpecDecoderOptions);
  /** The weights cached in this origin's OPFS (one file per sha256, kept across visits and
   *  never evicted by pyspec), largest first; [] without OPFS. */
  static cachedModels(): Promise<{ sha256: string; bytes: number }[]>;
  /** The model card of a URL, manifest name or File/Blob, from its header alone, before any
   *  download, in a worker of its own. */
  static card(source: ModelSpec, options?: { workerUrl?: string | URL;
                                             backend?: "auto" | "webgpu" | "cpu";
                                             maxCtx?: number | null }): Promise<CardResult>;
  /** Remove cached weights but those in `keep`; busy: open in a running decoder. */
  static clearCache(options?: { keep?: string[] }): Promise<{
    removed: string[]; kept: string[]; busy: string[] }>;
  /** The gate verdicts measure() recorded in this origin's OPFS (verdicts.json), which draft
   *  "auto" follows from the next load; [] where there are none. A file that is not a verdict
   *  table: SpecError bad_config (clearVerdicts() removes it). */
  static recordedVerdicts(): Promise<Verdict[]>;
  /** Remove recorded verdicts: those `only` names (each a sha256, or at least its first 4 hex
   *  digits; one that names no verdict, or several, is SpecError bad_config and nothing is
   *  removed), else all of them. removed, kept: sha256s. */
  static clearVerdicts(options?: { only?: string[] | null }): Promise<{
    removed: string[]; kept: string[] }>;
  info: ReadyInfo | null;
  lastResult: GenerateResult | null;
  restarts: number;
  notices: Notice[];
  /** The OpenAI-style facade: `await decoder.chat.completions.create({messages, stream})`. */
  readonly chat: { completions: Completions };
  /** Stream a chat completion: yields chunks as cycles commit text; returns the request's
   *  result (also lastResult, which concurrent requests share). */
  generate(messages: ChatMessage[], config?: GenerateConfig):
    AsyncGenerator<Chunk, GenerateResult, undefined>;
  /** "Measure on this device": a sample of the public workload side by side with
   *  champion-only, the gate's table and a verdict per drafter, recorded in OPFS for draft
   *  "auto" (which follows it from the next load). */
  measure(options?: MeasureOptions): Promise<MeasureResult>;
  /** Stop this decoder's generations (and measure()): the running one after its current cycle, those waiting
   *  behind it or for a new worker before they start (finish_reason "cancelled"); resolves
   *  with whether one was there to stop. */
  cancel(): Promise<boolean>;
  stats(): Promise<Stats | null>;
  /** info.startup as of now: the snapshot's state moves from "making" to "saved" or "failed". */
  startup(): Promise<Startup>;
  receipt(): Promise<Receipt | null>;
  loseDevice(): Promise<boolean>;
  /** Load the weights again in the same worker; another champion or maxCtx instead when given
   *  (they stay the decoder's); loadDrill, champion and maxCtx as SpecDecoderOptions' (any
   *  other option is refused, bad_config). */
  reload(options?: { loadDrill?: string | null; champion?: ModelSpec;
                     maxCtx?: number | null }): Promise<ReadyInfo>;
  /** WebGPU devices alive, their buffers' bytes and the wasm heap, for leak checks. */
  memory(): Promise<{ gpu_devices: number; gpu_bytes: number; wasm_bytes: number }>;
  /** Stop the worker now; the decoder is done: later calls throw SpecError "terminated". */
  terminate(): void;
}
