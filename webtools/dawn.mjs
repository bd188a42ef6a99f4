// The page's own runtime in Node: web/worker.js, unchanged, under Pyodide, with Dawn's WebGPU
// (npm `webgpu`, Chrome's implementation) as navigator.gpu. It runs what a browser worker runs
// (start-up, the manifest's checks, weights, the Python session, webgpu.js) wherever Dawn finds
// an adapter, with no browser and no window: on a GPU machine whose Chromium gets only a
// software adapter, this is how the page's stack meets the real GPU.
//
//   node webtools/dawn.mjs --site dist/site --champion PATH.gguf [--backend webgpu|cpu|auto]
//        [--draft D] [--prompt TEXT] [--max-tokens N] [--temperature T] [--seed S] [--k K]
//        [--tree SHAPE] [--repeat N] [--warmup N] [--workload FILE.jsonl]
//        [--draft-model PATH [--draft-vocab PATH]] [--sides JSON]
//        [--probe] [--null-gpu [--null-token ID]]
//
// --warmup N generates the first prompt N times first, unreported (pipeline compiles, the first
// readbacks), so no prompt is timed cold. --workload runs each line's messages ({id, stratum, messages, max_tokens}, the shared/workloads
// format; max_tokens capped by --max-tokens) in one start-up instead of --prompt; --draft-model
// loads a draft model from a file (with its reduced head, --draft-vocab) as the page loads one
// from a URL. --tree SHAPE is the request's tree option (widths per depth, `2,2,1`, or `auto`):
// each request asks for a tree, as generate({tree}) does in the page. --sides '{"NAME":
// {request options}, ...}' runs every prompt once per side in this one process, the sides in
// an order that rotates by one each prompt (warm-up: each side --warmup times), each run
// tagged with its side: sides measured in separate processes differ by the process (on an
// H100 host the same side's host time per cycle moved between 1.96 and 3.06 ms from one process
// to the next, bench/results/h100-dawn-609d0a7*.json), sides interleaved in one share its pace.
// Each side's options replace the command line's (draft: "none", "ngram", "model" for
// --draft-model's; k; tree); the worker keeps the guard's times per drafter across requests, as
// a page does, so the sides of one drafter (its chain and its tree) share them.
// It prints one JSON line: {adapter: {...} | null, ready, runs: [{id, stratum, text, tokens,
// stats, wall_s}]},
// or {error: {code, message}}. Dawn writes why it passes over an adapter to stderr from native
// code, which JavaScript cannot read: webtools/dawn.py runs this and keeps those lines. --probe stops after asking Dawn for an adapter. Exit status 0 when
// it ran, 3 when --backend webgpu was asked and Dawn found no adapter (its messages say why),
// 1 on any other failure. --null-gpu answers navigator.gpu with webtools/nullgpu.mjs instead of
// Dawn: a WebGPU that computes nothing, whose readbacks say "emit --null-token", so the runs'
// times are the page's own per-cycle host cost (each run then has `null_gpu`: the writes,
// submissions, dispatches, copies and maps it made).
//
// What is a stand-in here (protocol plumbing only, never the computation): the worker global
// (`self`, postMessage), `fetch` of file: URLs (Node's fetch has no file scheme; the worker asks
// for its site's files relative to its own URL, and for the weights by the URL it is given), and
// no OPFS (navigator.storage absent: the worker loads the weights into memory each time, as in a
// private window). Not here: the browser page, client.js (the e2e suite covers both).

import fs from "node:fs";
import { register } from "node:module";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const ARGS = parseArgs(process.argv.slice(2));
const NODE_MODULES = process.env.PYSPEC_NODE_MODULES ?? "";

function parseArgs(argv) {
  const out = { site: "dist/site", backend: "webgpu", draft: "none", prompt: "Hello",
                maxTokens: 16, temperature: 0, seed: 0, k: "heuristic", repeat: 1, warmup: 0,
                probe: false, nullGpu: false, nullToken: 100 };
  const names = { "--site": "site", "--champion": "champion", "--backend": "backend",
                  "--draft": "draft", "--prompt": "prompt", "--max-tokens": "maxTokens",
                  "--temperature": "temperature", "--seed": "seed", "--k": "k", "--tree": "tree",
                  "--repeat": "repeat", "--warmup": "warmup", "--workload": "workload",
                  "--draft-model": "draftModel", "--draft-vocab": "draftVocab",
                  "--null-token": "nullToken", "--sides": "sides" };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--probe") { out.probe = true; continue; }
    if (argv[i] === "--null-gpu") { out.nullGpu = true; continue; }
    const key = names[argv[i]];
    if (!key || i + 1 >= argv.length) throw new Error(`unknown or incomplete argument ${argv[i]}`);
    const v = argv[++i];
    out[key] = ["maxTokens", "temperature", "seed", "repeat", "warmup", "nullToken"].includes(key)
      ? Number(v) : key === "sides" ? JSON.parse(v) : v;
  }
  return out;
}

let nullCounts = null;   // --null-gpu: what the runs asked of WebGPU

async function dawnGPU() {
  if (ARGS.nullGpu) {
    const { create, globals, counts } = await import("./nullgpu.mjs");
    Object.assign(globalThis, globals);
    nullCounts = counts;
    return create(ARGS.nullToken);
  }
  const where = NODE_MODULES ? path.join(NODE_MODULES, "webgpu", "index.js") : "webgpu";
  const { create, globals } = await import(NODE_MODULES ? pathToFileURL(where).href : where);
  Object.assign(globalThis, globals);   // GPUBufferUsage, GPUMapMode, ... as a browser has them
  return create([]);
}

async function adapterInfo(gpu) {
  const adapter = await gpu.requestAdapter({ powerPreference: "high-performance" });
  if (!adapter) return null;
  const info = adapter.info ?? {};
  return { vendor: info.vendor, architecture: info.architecture, device: info.device,
           description: info.description,
           max_buffer_size: adapter.limits.maxBufferSize,
           max_storage_binding: adapter.limits.maxStorageBufferBindingSize };
}

// As webtools/serve.py types them: the worker checks that WebAssembly comes as application/wasm.
const MIME = { ".wasm": "application/wasm", ".mjs": "text/javascript", ".js": "text/javascript",
               ".json": "application/json", ".zip": "application/zip", ".whl": "application/zip" };

// Pyodide in Node takes its indexURL as a path, and the worker gives it a URL (new URL("pyodide/",
// its own URL)): the worker's `import ... from "./pyodide/pyodide.mjs"` is answered with a module
// that hands Pyodide's loadPyodide the path of a file: indexURL, and is Pyodide's otherwise.
const PYODIDE_HOOKS = `
export async function resolve(specifier, context, next) {
  const found = await next(specifier, context);
  if (found.url.endsWith("/pyodide/pyodide.mjs") && !context.parentURL?.startsWith("pyspec-dawn:"))
    return { url: "pyspec-dawn:pyodide?" + encodeURIComponent(found.url), shortCircuit: true };
  return found;
}
export async function load(url, context, next) {
  if (!url.startsWith("pyspec-dawn:pyodide?")) return next(url, context);
  const real = JSON.stringify(decodeURIComponent(url.slice(url.indexOf("?") + 1)));
  return { format: "module", shortCircuit: true, source:
    "import { loadPyodide as real } from " + real + "; import { fileURLToPath } from 'node:url';" +
    "export * from " + real + ";" +
    "export function loadPyodide(o = {}) { const i = String(o.indexURL ?? '');" +
    " return real(i.startsWith('file:') ? { ...o, indexURL: fileURLToPath(i) } : o); }" };
}`;
register("data:text/javascript," + encodeURIComponent(PYODIDE_HOOKS));

// fetch for file: URLs (HEAD, GET, and one `bytes=START-[END]` range, as webtools/serve.py answers).
function fileFetch(nodeFetch) {
  return async (input, init = {}) => {
    const url = new URL(typeof input === "string" ? input : input.url ?? String(input));
    if (url.protocol !== "file:") return nodeFetch(input, init);
    const file = fileURLToPath(url);
    if (!fs.existsSync(file)) return new Response("not found", { status: 404 });
    const size = fs.statSync(file).size;
    const range = /^bytes=(\d+)-(\d*)$/.exec(new Headers(init.headers ?? {}).get("range") ?? "");
    const start = range ? Number(range[1]) : 0;
    const end = range && range[2] ? Number(range[2]) : size - 1;
    const headers = { "content-length": String(end - start + 1),
                      "content-type": MIME[path.extname(file)] ?? "application/octet-stream" };
    if (range) headers["content-range"] = `bytes ${start}-${end}/${size}`;
    const status = range ? 206 : 200;
    if ((init.method ?? "GET").toUpperCase() === "HEAD") return new Response(null, { status, headers });
    const body = fs.createReadStream(file, { start, end });
    return new Response(ReadableStreamFrom(body), { status, headers });
  };
}

function ReadableStreamFrom(nodeStream) {
  return new ReadableStream({
    start(controller) {
      nodeStream.on("data", (c) => controller.enqueue(new Uint8Array(c)));
      nodeStream.on("end", () => controller.close());
      nodeStream.on("error", (e) => controller.error(e));
    },
    cancel() { nodeStream.destroy(); },
  });
}

// The worker's global scope: messages it posts come back to `inbox`, one listener per request id.
function workerScope(gpu) {
  const listeners = new Map();
  globalThis.self = globalThis;
  globalThis.postMessage = (msg) => listeners.get(msg?.id)?.(msg);
  Object.defineProperty(globalThis, "navigator", {
    value: { gpu, hardwareConcurrency: 1, userAgent: "pyspec-dawn-harness" },
    configurable: true });
  globalThis.fetch = fileFetch(globalThis.fetch);
  return {
    request(msg, onMessage = () => {}) {
      return new Promise((resolve, reject) => {
        listeners.set(msg.id, (reply) => {
          onMessage(reply);
          if (reply.type === "error") reject(Object.assign(new Error(reply.message), reply));
          else if (reply.type === "ready" || reply.type === "done") resolve(reply);
        });
        globalThis.onmessage({ data: msg });
      });
    },
  };
}

async function main() {
  const gpu = await dawnGPU();
  const adapter = await adapterInfo(gpu);
  const report = { adapter, ready: null, runs: [] };
  if (ARGS.probe || (!adapter && ARGS.backend === "webgpu")) {
    console.log(JSON.stringify(report));
    return adapter || ARGS.probe ? 0 : 3;
  }
  const worker = workerScope(gpu);
  const site = path.resolve(ARGS.site);
  await import(pathToFileURL(path.join(site, "worker.js")).href);
  const fileUrl = (p) => pathToFileURL(path.resolve(p)).href;
  const champion = { url: fileUrl(ARGS.champion) };
  const draft = !ARGS.draftModel ? ARGS.draft
    : { url: fileUrl(ARGS.draftModel), ...(ARGS.draftVocab ? { vocab: { url: fileUrl(ARGS.draftVocab) } } : {}) };
  report.ready = await worker.request({ type: "init", id: "init", champion, draft,
                                        backend: ARGS.backend, snapshot: false });
  const items = ARGS.workload
    ? fs.readFileSync(ARGS.workload, "utf8").split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l))
    : [{ id: "prompt", stratum: null, messages: [{ role: "user", content: ARGS.prompt }] }];
  const configOf = (item) => ({ draft: ARGS.draftModel ? undefined : ARGS.draft, k: ARGS.k,
                                tree: ARGS.tree,     // undefined (no --tree): chains
                                temperature: ARGS.temperature, seed: ARGS.seed,
                                max_tokens: Math.min(ARGS.maxTokens, item.max_tokens ?? ARGS.maxTokens) });
  const sides = ARGS.sides ? Object.entries(ARGS.sides) : [[null, {}]];
  let n = 0;
  for (let i = 0; i < ARGS.warmup; i++) {     // compiles and first readbacks, not reported
    for (const [, options] of sides) {
      await worker.request({ type: "generate", id: `w${n++}`,
                             config: { ...configOf(items[0]), ...options },
                             messages: items[0].messages });
    }
  }
  report.warmup = ARGS.warmup;
  for (const [j, item] of items.entries()) {
    const turn = j % sides.length;
    for (const [side, options] of [...sides.slice(turn), ...sides.slice(0, turn)]) {
      const config = { ...configOf(item), ...options };
      for (let i = 0; i < ARGS.repeat; i++) {
        const before = nullCounts && { ...nullCounts };
        const t0 = performance.now();
        const done = await worker.request({ type: "generate", id: `g${n++}`, config,
                                            messages: item.messages });
        report.runs.push({ id: item.id, stratum: item.stratum, ...(side !== null && { side }),
                           text: done.text, tokens: done.tokens, stats: done.stats,
                           finish_reason: done.finish_reason,
                           wall_s: (performance.now() - t0) / 1e3,
                           ...(before && { null_gpu: Object.fromEntries(
                             Object.entries(nullCounts).map(([k, v]) => [k, v - before[k]])) }) });
      }
    }
  }
  console.log(JSON.stringify(report));
  return 0;
}

main().then((code) => process.exit(code), (e) => {
  console.log(JSON.stringify({ error: { code: e.code ?? "internal", message: e.message } }));
  process.exit(1);
});
