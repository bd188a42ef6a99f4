// The demo page: a chat box over client.js, its controls, live stats and the receipt button.
//
// URL query (all optional): model (a manifest name, or a URL of a GGUF), draft (ngram | none |
// self:L | a manifest model name used as draft model), k, verify, temperature, seed, max_tokens,
// max_ctx, backend (auto | webgpu | cpu: a hint to pyspec.web.make_engine), drills=1 (fault
// drills: run(prompt, {drill: "KIND@CYCLE"}), and load_drill=KIND for a loading fault, see
// client.js). Headless drivers (build.py demo --headless, e2e/) use window.pyspecApp:
//   await pyspecApp.ready; const result = await pyspecApp.run(prompt, config, onText);
// (run starts a fresh conversation; the chat box keeps its history).
// Any failure shows in #error (role=alert) and rejects; the page never waits forever on one.

import { SpecDecoder } from "./client.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
let decoder = null, decoderKey = null, lastReceipt = null;

// --- progress and errors ----------------------------------------------------------------------
const PHASES = { runtime: "loading Pyodide and pyspec", download: "downloading",
                 cache: "reading from the browser cache", verify: "checking sha256",
                 load: "loading weights" };

function showProgress(p) {
  // The worker's last report of a load (create or reload) is "load" complete: the bar goes.
  $("progress").hidden = p.phase === "load" && p.total > 0 && p.loaded >= p.total;
  const frac = p.total ? p.loaded / p.total : 0;
  $("progress-fill").style.width = `${Math.round(100 * frac)}%`;
  const mb = (n) => (n / 1e6).toFixed(1);
  const size = p.phase === "download" || p.phase === "cache" ? ` ${mb(p.loaded)} / ${mb(p.total)} MB` : "";
  $("progress-label").textContent = `${PHASES[p.phase] ?? p.phase} ${p.label ?? ""}${size}`;
}

function showError(err) {
  const box = $("error");
  box.hidden = false;
  box.dataset.code = err?.code ?? "internal";
  box.textContent = `${err?.code ?? "error"}: ${err?.message ?? err}`;
}

function clearError() { $("error").hidden = true; $("error").textContent = ""; }

// A recovery (a worker restarted, a device lost): the text goes on, and the page says so.
function showNotice(n) {
  const box = $("notice");
  box.hidden = false;
  box.dataset.code = n.code;
  box.textContent = `${n.code}: ${n.message}`;
}

// --- the decoder ------------------------------------------------------------------------------
function drafterChoice() {
  const v = $("drafter").value;
  if (v === "self") return `self:${$("layers").value}`;
  return v;   // 'ngram', 'model:NAME' or 'combo:NAME' (n-gram where the text repeats, else NAME)
}

// The draft model a choice needs loaded at init ('model:NAME', 'combo:NAME'), else null.
const draftModelOf = (choice) => (/^(model|combo):/.test(choice) ? choice.slice(6) : null);

async function ensureDecoder() {
  const model = $("model").value;
  const choice = drafterChoice();
  const draftModel = draftModelOf(choice);
  const key = `${model}|${draftModel}`;
  if (decoder && decoderKey === key) return decoder;
  decoder?.terminate();
  decoder = null;
  $("send").disabled = true;
  $("adapter").textContent = "loading…";
  const t0 = performance.now();
  const d = await SpecDecoder.create({
    workerUrl: new URL("./worker.js", import.meta.url), champion: model,
    draft: draftModel ?? "ngram", maxCtx: Number(params.get("max_ctx")) || null,
    backend: params.get("backend") ?? "auto",
    onProgress: showProgress, onNotice: showNotice, drills: params.get("drills") === "1",
    loadDrill: params.get("load_drill"), snapshot: params.get("snapshot") !== "0",
  });
  decoder = d;
  decoderKey = key;
  $("progress").hidden = true;
  $("adapter").textContent = d.info.adapter;
  const gpu = d.info.webgpu;
  $("webgpu").textContent = gpu?.available ? `(WebGPU: ${gpu.vendor ?? "?"} ${gpu.architecture ?? ""})`
                                           : "(no WebGPU adapter)";
  d.info.page_load_ms = performance.now() - t0;
  $("send").disabled = false;
  return d;
}

function requestConfig(overrides = {}) {
  const choice = drafterChoice();
  const draft = !$("speculate").checked ? "none"
    : choice.startsWith("model:") ? "model" : choice.startsWith("combo:") ? "ngram+model" : choice;
  return { draft, k: $("k").value, verify: $("verify").value || null,
           temperature: Number($("temperature").value), seed: Number($("seed").value),
           max_tokens: Number($("max-tokens").value), ...samplingConfig(), ...jsonConfig(),
           ...overrides };
}

// The Output section: with "JSON" ticked the reply follows the schema in the box (the worker
// refuses a keyword outside the supported subset by name).
function jsonConfig() {
  if (!$("json").checked) return {};
  try {
    return { json_schema: JSON.parse($("json-schema").value) };
  } catch (e) {
    throw new Error(`the JSON schema box does not hold valid JSON: ${e.message}`);
  }
}

// The Sampling section (README "Sampling controls"): empty fields are off; stop strings one per
// line (\n and \t written as escapes); logit_bias as "ID=BIAS, ID=BIAS". The worker checks
// the values and refuses bad ones by name.
function samplingConfig() {
  const num = (id) => ($(id).value.trim() === "" ? null : Number($(id).value));
  const stop = $("stop-strings").value.split("\n").filter((s) => s !== "")
    .map((s) => s.replaceAll("\\n", "\n").replaceAll("\\t", "\t"));
  const bias = {};
  for (const item of $("logit-bias").value.split(",").map((s) => s.trim()).filter(Boolean)) {
    const [id, value] = item.split("=");
    bias[id.trim()] = Number(value);
  }
  return { top_p: num("top-p"), top_k: num("top-k"), min_p: num("min-p"),
           repetition_penalty: num("repetition-penalty"),
           presence_penalty: num("presence-penalty"), frequency_penalty: num("frequency-penalty"),
           stop: stop.length ? stop : null, logit_bias: Object.keys(bias).length ? bias : null };
}

// --- chat -----------------------------------------------------------------------------------
const history = [];

// An assistant bubble holds its text as one span per token, classed by the token's kind
// (champion, accepted, corrected, bonus, forced: style.css; the legend names them), so the page
// shows what speculation did. A token whose bytes end mid-character gets an empty span; the
// switch above the chat (#show-kinds) turns the styles off, not the spans.
function appendTokens(out, chunk) {
  out.full = (out.full ?? "") + chunk.text;
  out.marks = (out.marks ?? []).concat(chunk.kinds.map((kind, i) => [kind, chunk.starts[i]]));
  const spans = out.marks.map(([kind, start], i) => {
    const span = document.createElement("span");
    span.className = `tok tok-${kind}`;
    span.title = KIND_NAMES[kind];
    const end = i + 1 < out.marks.length ? out.marks[i + 1][1] : out.full.length;
    span.textContent = out.full.slice(start, Math.max(start, end));
    return span;
  });
  out.replaceChildren(...spans);
}

const KIND_NAMES = { champion: "the champion's token (no draft)", accepted: "draft accepted",
                     corrected: "the champion's correction", bonus: "bonus token",
                     forced: "forced by the schema" };

function bubble(role, text = "") {
  const div = document.createElement("div");
  div.className = `msg ${role}`;
  div.textContent = text;
  $("messages").append(div);
  return div;
}

async function run(prompt, overrides = {}, onText = null) {
  clearError();
  const d = await ensureDecoder();
  const config = requestConfig(overrides);
  history.push({ role: "user", content: prompt });
  bubble("user", prompt);
  const out = bubble("assistant");
  out.classList.add("streaming");
  $("send").disabled = true;
  $("stop").disabled = false;
  const t0 = performance.now();
  let tokens = 0;
  try {
    for await (const chunk of d.generate(history, config)) {
      appendTokens(out, chunk);
      tokens += chunk.tokens;
      $("s-tps").textContent = (tokens / ((performance.now() - t0) / 1000)).toFixed(2);
      $("messages").scrollTop = $("messages").scrollHeight;
      onText?.(chunk.text, chunk);
    }
  } catch (err) {
    history.pop();
    // Text already shown stays (a request stopped mid-way, e.g. at the GPU retry limit).
    if (out.textContent) out.classList.add("failed");
    else out.remove();
    throw err;
  } finally {
    out.classList.remove("streaming");
    $("send").disabled = false;
    $("stop").disabled = true;
  }
  const result = d.lastResult;
  history.push({ role: "assistant", content: out.textContent });
  showStats(result);
  return result;
}

// --- stats ----------------------------------------------------------------------------------
function showStats(result) {
  const s = result.stats;
  $("s-finish").textContent = result.finish_reason;
  if (!s) return;
  lastReceipt = result.receipt;
  $("receipt").disabled = !lastReceipt;
  $("s-tps").textContent = s.tokens_per_s.toFixed(2);
  $("s-tpp").textContent = s.tokens_per_pass.toFixed(2);
  $("s-acc").textContent = `${(100 * s.acceptance_rate).toFixed(0)}% (${s.accepted}/${s.drafted})`;
  $("s-passes").textContent = s.champion_passes;
  $("s-ttft").textContent = `${(1000 * s.ttft_s).toFixed(0)} ms`;
  const sch = s.schedule;
  $("s-guard").textContent = s.drafter === "none" ? "speculation off (by you)"
    : sch.guard_off > 0 ? `turned speculation off for ${sch.guard_off} cycles` : "speculation on";
  drawChart(s.accepted_by_position, s.drafted_by_position);
}

function drawChart(accepted, drafted) {
  const c = $("chart"), g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  const n = drafted.findLastIndex((x) => x > 0) + 1;
  if (!n) { g.fillText("no drafts", 8, 16); return; }
  const w = c.width / Math.max(n, 4), h = c.height - 14;
  for (let i = 0; i < n; i++) {
    const rate = drafted[i] ? accepted[i] / drafted[i] : 0;
    g.fillStyle = "#3b7ddd";
    g.fillRect(i * w + 2, h * (1 - rate), w - 4, h * rate);
    g.fillStyle = "#333";
    g.fillText(String(i + 1), i * w + w / 2 - 3, c.height - 2);
  }
}

function downloadReceipt() {
  const blob = new Blob([JSON.stringify(lastReceipt, null, 1)], { type: "application/json" });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = "pyspec-receipt.json";
  a.click();
  URL.revokeObjectURL(a.href);
}

// --- wiring ---------------------------------------------------------------------------------
async function fillModels() {
  const manifest = await (await fetch("manifest.json")).json();
  const models = manifest.artifacts.filter((a) => a.kind === "model");
  // A trained draft (draft_for: its champion) is offered as a drafter only, not as a model.
  const names = models.filter((a) => !a.draft_for).map((a) => a.model);
  const want = params.get("model") ?? (names.includes("smollm2") ? "smollm2" : names[0]);
  for (const name of new Set([...names, want])) $("model").add(new Option(name, name));
  $("model").value = want;
  for (const a of models) {
    const label = a.draft_for ? `trained draft ${a.model} (for ${a.draft_for})` : `draft model ${a.model}`;
    $("drafter").add(new Option(label, `model:${a.model}`));
    if (a.draft_for) $("drafter").add(new Option(`n-gram + ${label}`, `combo:${a.model}`));
  }
  const draft = params.get("draft");
  if (draft === "none") $("speculate").checked = false;
  else if (draft?.startsWith("self:")) { $("drafter").value = "self"; $("layers").value = draft.slice(5); }
  else if (draft && draft !== "ngram") {
    if (!models.some((a) => a.model === draft)) $("drafter").add(new Option(`draft model ${draft}`, `model:${draft}`));
    $("drafter").value = `model:${draft}`;
  }
  const fields = { k: "k", verify: "verify", temperature: "temperature", seed: "seed",
                   max_tokens: "max-tokens", top_p: "top-p", top_k: "top-k", min_p: "min-p",
                   repetition_penalty: "repetition-penalty",
                   presence_penalty: "presence-penalty", frequency_penalty: "frequency-penalty" };
  for (const [param, id] of Object.entries(fields)) if (params.has(param)) $(id).value = params.get(param);
}

function start() {
  $("form").addEventListener("submit", (e) => {
    e.preventDefault();
    const prompt = $("prompt").value.trim();
    if (prompt) run(prompt).catch(showError);
  });
  $("stop").addEventListener("click", () => decoder?.cancel().catch(showError));
  $("clear").addEventListener("click", () => { history.length = 0; $("messages").textContent = ""; });
  $("receipt").addEventListener("click", downloadReceipt);
  const syncKinds = () => $("messages").classList.toggle("plain", !$("show-kinds").checked);
  $("show-kinds").addEventListener("change", syncKinds);
  syncKinds();
  for (const id of ["model", "drafter", "layers"]) {
    $(id).addEventListener("change", () => { clearError(); ensureDecoder().catch(showError); });
  }
  // L applies to the self:L drafter only; other controls apply to every drafter.
  const syncControls = () => { $("layers-label").hidden = $("drafter").value !== "self"; };
  $("drafter").addEventListener("change", syncControls);
  const ready = fillModels().then(() => { syncControls(); return ensureDecoder(); });
  ready.catch(showError);
  window.pyspecApp = {
    ready: ready.then(() => decoder.info),
    // One request in a fresh conversation (what a headless driver wants).
    run: (prompt, config = {}, onText = null) => {
      history.length = 0;
      // The page shows the error as for its own Send button (and the caller gets it too).
      return run(prompt, config, onText).catch((err) => { showError(err); throw err; });
    },
    decoder: () => decoder,
  };
}

start();
