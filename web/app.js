// The demo page: a chat box over client.js, its controls, live stats and the receipt button.
//
// URL query (all optional): model (a manifest name, or a URL of a GGUF: its card shows before
// the download, and one this page cannot run is refused then; a file picked or dropped on the
// page loads the same way, cached in OPFS under its sha256), draft (auto | ngram |
// none | self:L | a manifest model name used as draft model), k, verify, temperature, seed,
// max_tokens, max_ctx, backend (auto | webgpu | cpu: a hint to apps/page_engine.make_engine),
// drills=1 (fault drills: run(prompt, {drill: "KIND@CYCLE"})), load_drill=KIND (a loading
// fault, see client.js; it turns drills on), top_k, top_p, min_p and the three penalties.
// Headless drivers (build.py demo --headless, e2e/) use window.pyspecApp:
//   await pyspecApp.ready; const result = await pyspecApp.run(prompt, config, onText);
// (run starts a fresh conversation; the chat box keeps its history).
// Any failure shows in #error (role=alert) and rejects; the page never waits forever on one.

import { SpecDecoder } from "./client.js";
import { gatePanel } from "./gate-view.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
let decoder = null, decoderKey = null, lastReceipt = null;
let loading = null;        // the load under way: {key, promise}
let streaming = false;     // a reply is being written
let measuring = false;     // "measure on this device" runs (gate-view.js)
let gate = null;           // its panel
let pendingChange = false; // a model or drafter chosen while it was: loaded after it
let lastGood = null;       // the control values of the last decoder that loaded
let conversation = 0;      // bumped by Clear: a reply of an older conversation is not kept
let manifestModels = [];
const pickedFiles = new Map();   // the model select's value "file:NAME" -> the File picked

// --- progress and errors ----------------------------------------------------------------------
const PHASES = { runtime: "loading Pyodide and pyspec", download: "downloading",
                 verify: "checking sha256",
                 load: "loading weights", card: "read the model card of",
                 import: "copying into the browser cache" };

// The model card (phase "card", before a download): what the file is and what this device
// can do with it, by pyspec/apps/info.py's stated memory rule.
function showCard({ card, header }) {
  const gib = (n) => (n >= 1 << 30 ? `${(n / (1 << 30)).toFixed(2)} GiB` : `${(n / (1 << 20)).toFixed(1)} MiB`);
  const lines = [`${card.file}: ${gib(card.bytes)}`];
  if (card.architecture) {
    lines.push(`architecture ${card.architecture}${card.name ? ` (${card.name})` : ""}, ` +
               `${(card.parameters / 1e6).toFixed(1)} M parameters`,
               `tensor types ${Object.entries(card.tensor_types).map(([k, v]) => `${k} x${v}`).join(", ")}`,
               `chat template ${card.template}`);
  }
  if (!card.runs) lines.push(`pyspec cannot run it: ${card.refusal}`);
  else {
    lines.push(`context ${card.context} tokens, ${card.layers} layers, vocabulary ${card.vocab}`);
    for (const [name, b] of Object.entries(card.backends)) {
      if (name !== "cpu") lines.push(`${name}: ${b.fits ? "fits" : "too large"}, needs ${gib(b.needs)}: ${b.why}`);
    }
  }
  lines.push(header.range ? `(header: ${gib(header.bytes)} read by HTTP Range requests)`
    : "(the server ignores Range requests: the header was read from the start of the full " +
      "download, which then downloads again)");
  $("card").hidden = false;
  $("card").textContent = lines.join("\n");
}

function showProgress(p) {
  if (p.phase === "card") showCard(p);
  // The worker's last report of a load (create or reload) is "load" complete: the bar goes.
  $("progress").hidden = p.phase === "load" && p.total > 0 && p.loaded >= p.total;
  const frac = p.total ? p.loaded / p.total : 0;
  $("progress-fill").style.width = `${Math.round(100 * frac)}%`;
  $("progress-fill").parentElement.setAttribute("aria-valuenow", String(Math.round(100 * frac)));
  const mb = (n) => (n / 1e6).toFixed(1);
  const sized = ["download", "verify", "import"].includes(p.phase);
  const size = sized ? ` ${mb(p.loaded)} / ${mb(p.total)} MB` : "";
  $("progress-label").textContent = `${PHASES[p.phase] ?? p.phase} ${p.label ?? ""}${size}`;
}

function showError(err) {
  const box = $("error");
  box.hidden = false;
  box.dataset.code = err?.code ?? "internal";
  box.textContent = `${err?.code ?? "error"}: ${err?.message ?? err}`;
}

function clearError() { $("error").hidden = true; $("error").textContent = ""; }
function clearNotice() { $("notice").hidden = true; $("notice").textContent = ""; }

// Send waits while a model loads and while a reply is written, and stays off while no model is
// loaded (a load failed: choose another model or drafter).
function syncSend() {
  $("send").disabled = streaming || measuring || loading !== null || decoder === null;
  gate?.sync(!streaming && loading === null && decoder !== null);
}

// A recovery (a worker restarted, a device lost): the text goes on, and the page says so.
// The page's own notes (`page`: true) show their message alone.
function showNotice(n) {
  const box = $("notice");
  box.hidden = false;
  box.dataset.code = n.code;
  box.textContent = n.page ? n.message : `${n.code}: ${n.message}`;
}

// --- the decoder ------------------------------------------------------------------------------
function drafterChoice() {
  const v = $("drafter").value;
  if (v === "self") return `self:${$("layers").value}`;
  // 'auto', 'ngram', 'model:NAME' or 'combo:NAME' (n-gram where the text repeats, else NAME)
  return v;
}

// What a choice needs at init: the draft model ('model:NAME', 'combo:NAME'), 'auto' (the worker
// decides, autoDraft), else null.
const draftModelOf = (choice) => (choice === "auto" ? "auto"
  : /^(model|combo):/.test(choice) ? choice.slice(6) : null);
let autoNote = null;       // what "auto" chose for the loaded decoder, and why (info.draft_auto)

// The decoder the controls name. One load at a time: a choice made while one loads is loaded
// after it (the latest choice wins, and no worker is left behind), and one made while a reply is
// written waits for the reply (the change handler). A load that fails puts the controls back to
// the last model that loaded and loads it again, so the page stays usable.
function ensureDecoder() {
  const model = $("model").value, draftModel = draftModelOf(drafterChoice());
  const key = `${model}|${draftModel}`;
  if (loading) {
    return loading.key === key ? loading.promise
      : loading.promise.catch(() => {}).then(() => ensureDecoder());
  }
  if (decoder && decoderKey === key) return Promise.resolve(decoder);
  const promise = load(model, draftModel, key);
  loading = { key, promise };
  syncSend();
  promise.finally(() => { loading = null; syncSend(); }).catch(() => {});
  return promise;
}

async function load(model, draftModel, key) {
  decoder?.terminate();     // its worker and memory go before the next one loads
  decoder = decoderKey = null;
  $("adapter").textContent = "loading…";
  $("webgpu").textContent = "";
  const t0 = performance.now();
  let d;
  try {
    d = await SpecDecoder.create({
      workerUrl: new URL("./worker.js", import.meta.url), champion: pickedFiles.get(model) ?? model,
      draft: draftModel ?? "ngram", maxCtx: Number(params.get("max_ctx")) || null,
      backend: params.get("backend") ?? "auto",
      onProgress: showProgress, onNotice: showNotice,
      drills: params.get("drills") === "1" || params.has("load_drill"),
      loadDrill: params.get("load_drill"), snapshot: params.get("snapshot") !== "0",
    });
  } catch (err) {
    $("progress").hidden = true;
    $("adapter").textContent = "not loaded";
    const back = lastGood;
    if (back && `${back.model}|${back.draftModel}` !== key) {
      // Back to what worked, once this load's promise has settled.
      setTimeout(() => {
        restoreControls(back);
        ensureDecoder().catch(showError);
      });
      err.message += ` (back to ${back.model}${back.draftModel ? ` with ${back.draftModel}` : ""})`;
    }
    throw err;
  }
  decoder = d;
  decoderKey = key;
  if (!d.info.card) $("card").hidden = true;   // a manifest model: no card was read
  lastGood = { model, draftModel, drafter: $("drafter").value, layers: $("layers").value };
  autoNote = d.info.draft_auto;
  syncControls();
  $("progress").hidden = true;
  $("adapter").textContent = d.info.adapter;
  const gpu = d.info.webgpu;
  // (info.fallback says why the CPU engine runs, in the API's words; the page says it in its own)
  $("webgpu").textContent = (gpu?.available
    ? `(WebGPU: ${gpu.vendor ?? "?"} ${gpu.architecture ?? ""})` : "(no WebGPU adapter)")
    + (d.info.fallback_kind === "software_adapter"
      ? " - a software adapter, slower than the CPU engine, which runs instead (add " +
        "?backend=webgpu to the URL to use WebGPU anyway)"
      : d.info.fallback ? ` ${d.info.fallback}` : "");
  // self:L's L for this model: 1 .. its layers - 1
  const top = Math.max(1, d.info.n_layers - 1);
  $("layers").max = String(top);
  if (Number($("layers").value) > top) $("layers").value = String(top);
  d.info.page_load_ms = performance.now() - t0;
  return d;
}

function restoreControls(good) {
  $("model").value = good.model;
  fillDrafters();
  $("drafter").value = good.drafter;
  $("layers").value = good.layers;
  syncControls();
}

function requestConfig(overrides = {}) {
  const choice = drafterChoice();
  const draft = !$("speculate").checked ? "none"
    : choice.startsWith("model:") ? "model" : choice.startsWith("combo:") ? "ngram+model"
    : choice;   // 'auto' too: the worker's choice at load
  return { draft, k: $("k").value, verify: $("verify").value || null,
           temperature: num("temperature"), seed: num("seed"), max_tokens: num("max-tokens"),
           ...samplingConfig(), ...jsonConfig(), ...overrides };
}

// A number field's value, or null (the default) when it is empty.
const num = (id) => ($(id).value.trim() === "" ? null : Number($(id).value));

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

// The Sampling section (docs/sampling-and-json.md): empty fields are off; stop strings one per
// line (\n and \t written as escapes); logit_bias as "ID=BIAS, ID=BIAS". The worker checks
// the values and refuses bad ones by name.
function samplingConfig() {
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
  // Only the newest span can grow: its token's text ends where the next token's begins.
  const next = chunk.starts.length ? chunk.starts[0] : out.full.length;
  if (out.lastSpan) out.lastSpan.textContent = spanText(out.full, out.lastStart, next);
  chunk.kinds.forEach((kind, i) => {
    const span = document.createElement("span");
    span.className = `tok tok-${kind}`;
    span.title = KIND_NAMES[kind];
    const start = chunk.starts[i];
    const end = i + 1 < chunk.starts.length ? chunk.starts[i + 1] : out.full.length;
    span.textContent = spanText(out.full, start, end);
    out.append(span);
    out.lastSpan = span;
    out.lastStart = start;
  });
}

const spanText = (full, start, end) => full.slice(start, Math.max(start, end));

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
  // A loading fault's notice stays until Clear (what happened to this page's model); the note
  // that a choice waits for a reply goes with the reply.
  if ($("notice").dataset.code === "later") clearNotice();
  if (streaming) throw new Error("a reply is being written: wait for it, or press Stop");
  const d = await ensureDecoder();
  const config = requestConfig(overrides);
  const mine = conversation;
  history.push({ role: "user", content: prompt });
  const asked = bubble("user", prompt);
  if ($("prompt").value.trim() === prompt) $("prompt").value = "";   // back in it on failure
  const out = bubble("assistant");
  out.classList.add("streaming");
  resetStats();        // the last reply's stats are not this one's
  streaming = true;
  const sendHadFocus = document.activeElement === $("send");
  syncSend();
  $("stop").disabled = false;
  if (sendHadFocus) $("stop").focus();
  // The live rate counts from the first text, as the engine's tokens_per_s leaves the prefill out.
  let tFirst = null, tokens = 0;
  let result;
  try {
    // A copy: a resumed request sends its messages again, whatever Clear did meanwhile.
    const stream = d.generate([...history], config);
    for (;;) {
      const step = await stream.next();
      if (step.done) { result = step.value; break; }
      const chunk = step.value;
      appendTokens(out, chunk);
      if (tFirst === null) {
        tFirst = performance.now();
      } else {
        tokens += chunk.tokens;
        if (mine === conversation) {
          $("s-tps").textContent = (tokens / ((performance.now() - tFirst) / 1000)).toFixed(2);
        }
      }
      $("messages").scrollTop = $("messages").scrollHeight;
      onText?.(chunk.text, chunk);
    }
  } catch (err) {
    if (mine === conversation) {
      if (out.textContent) {
        // Text already shown stays, and so does its turn (a request stopped mid-way, e.g. at
        // the GPU retry limit): what the page shows is the conversation.
        out.classList.add("failed");
        history.push({ role: "assistant", content: out.textContent });
      } else {   // nothing came: the turn goes, its prompt back in the box
        history.pop();
        out.remove();
        asked.remove();
        $("prompt").value = prompt;
      }
    }
    throw err;
  } finally {
    out.classList.remove("streaming");
    streaming = false;
    const stopHadFocus = document.activeElement === $("stop");
    syncSend();
    $("stop").disabled = true;
    if (stopHadFocus) $("prompt").focus();
    if (pendingChange) {
      pendingChange = false;
      ensureDecoder().then(() => {   // the note that the choice waits goes once it has loaded
        if ($("notice").dataset.code === "later") clearNotice();
      }).catch(showError);
    }
  }
  if (mine === conversation) {   // else Clear started another conversation meanwhile
    history.push({ role: "assistant", content: out.textContent });
    showStats(result);
  }
  return result;
}

function clearConversation() {
  conversation += 1;
  history.length = 0;
  $("messages").textContent = "";
  if (streaming) decoder?.cancel().catch(showError);
  resetStats();
  clearError();
  clearNotice();
}

// Every stat back to "–", no chart, no receipt: a reply starts, or the conversation is cleared.
function resetStats() {
  for (const id of ["s-finish", "s-tps", "s-tpp", "s-acc", "s-passes", "s-ttft", "s-guard"]) {
    $(id).textContent = "–";
  }
  drawChart([], []);
  lastReceipt = null;
  $("receipt").disabled = true;
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
  $("s-acc").textContent = s.drafted
    ? `${(100 * s.acceptance_rate).toFixed(0)}% (${s.accepted}/${s.drafted})` : "– (no drafts)";
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
  // The same numbers as text, for whoever cannot see the chart.
  c.textContent = n ? drafted.slice(0, n)
    .map((d, i) => `position ${i + 1}: ${accepted[i]} of ${d} accepted`).join("; ") : "no drafts";
  if (!n) { if (drafted.length) g.fillText("no drafts", 8, 16); return; }
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
// What each drafter is, on hover (the option's title) and under the list.
const DRAFTER_HELP = {
  auto: "auto: the trained draft on a GPU, prompt n-gram on the CPU engine (the fastest of each, " +
        "measured)",
  ngram: "prompt n-gram: proposes what followed the last words where they appeared before " +
         "(pays where the answer copies the prompt or repeats itself)",
  self: "self:L: the champion's own first L layers propose (no second model)",
  model: "a draft model: a smaller model with the champion's tokenizer proposes",
  trained: "the trained draft: 4 layers distilled from the champion (models/MANIFEST.json)",
  combo: "n-gram where the text repeats, the trained draft elsewhere",
};

async function fillModels() {
  const manifest = await (await fetch("manifest.json")).json();
  manifestModels = manifest.artifacts.filter((a) => a.kind === "model");
  // A trained draft (draft_for: its champion) is offered as a drafter only, not as a model;
  // the tiny random test models sit in a group of their own.
  const champions = manifestModels.filter((a) => !a.draft_for);
  const fallback = champions.some((a) => a.model === "smollm2") ? "smollm2" : champions[0]?.model;
  const want = params.get("model") ?? fallback;
  const tests = document.createElement("optgroup");
  tests.label = "test models (tiny, random weights)";
  for (const a of champions) (a.test ? tests : $("model")).append(new Option(a.model, a.model));
  if (tests.children.length) $("model").append(tests);
  if (!champions.some((a) => a.model === want)) $("model").add(new Option(want, want));
  $("model").value = want;
  fillDrafters();
  const draft = params.get("draft") ?? "auto";
  if (draft === "none") {           // no draft to download either
    $("speculate").checked = false;
    $("drafter").value = "ngram";
  }
  else if (draft?.startsWith("self:")) { $("drafter").value = "self"; $("layers").value = draft.slice(5); }
  else if (draft === "auto" || draft === "ngram") {
    // auto where this model has a trained draft (fillDrafters offers it), else n-gram
    $("drafter").value = [...$("drafter").options].some((o) => o.value === draft) ? draft
      : "ngram";
  } else if (draft) {
    // Named in the URL: offered even where the list would not (a test of what the worker says).
    if (![...$("drafter").options].some((o) => o.value === `model:${draft}`)) {
      $("drafter").add(new Option(`draft model ${draft}`, `model:${draft}`));
    }
    $("drafter").value = `model:${draft}`;
  }
  const fields = { k: "k", verify: "verify", temperature: "temperature", seed: "seed",
                   max_tokens: "max-tokens", top_p: "top-p", top_k: "top-k", min_p: "min-p",
                   repetition_penalty: "repetition-penalty",
                   presence_penalty: "presence-penalty", frequency_penalty: "frequency-penalty" };
  const ignored = [];
  for (const [param, id] of Object.entries(fields)) {
    if (!params.has(param)) continue;
    $(id).value = params.get(param);
    // a number field keeps "" for a value it cannot hold: the default is used, and said so
    const given = params.get(param);
    if ($(id).value === "" && given !== "") ignored.push(`${param}=${given}`);
  }
  if (ignored.length) {
    showNotice({ code: "url", page: true, message: `Not a number, so the default is used: ` +
                 `${ignored.join(", ")} (in the page's URL).` });
  }
}

// The drafters for the chosen model: n-gram and self:L always; a draft model only where it can
// serve (the champion's tokenizer, and a trained draft only for the champion it was made for).
function fillDrafters() {
  const model = $("model").value, was = $("drafter").value;
  const champion = manifestModels.find((a) => a.model === model);
  const sel = $("drafter");
  for (const o of [...sel.options]) if (o.value.includes(":") || o.value === "auto") o.remove();
  // "auto" where the model has a trained draft (else it is n-gram), first and the default.
  if (manifestModels.some((a) => a.draft_for === model)) {
    const auto = new Option("auto", "auto");
    auto.title = DRAFTER_HELP.auto;
    sel.add(auto, 0);
  }
  for (const a of manifestModels) {
    const fits = a.draft_for ? a.draft_for === model
      : a.model !== model && a.tokenizer != null && a.tokenizer === champion?.tokenizer;
    if (!fits) continue;
    const label = a.draft_for ? `trained draft ${a.model}` : `draft model ${a.model}`;
    const o = new Option(label, `model:${a.model}`);
    o.title = a.draft_for ? DRAFTER_HELP.trained : DRAFTER_HELP.model;
    sel.add(o);
    if (a.draft_for) {
      const combo = new Option(`n-gram + ${label}`, `combo:${a.model}`);
      combo.title = DRAFTER_HELP.combo;
      sel.add(combo);
    }
  }
  sel.querySelector("option[value='ngram']").title = DRAFTER_HELP.ngram;
  sel.querySelector("option[value='self']").title = DRAFTER_HELP.self;
  sel.value = [...sel.options].some((o) => o.value === was) ? was : sel.options[0].value;
}

function syncControls() {
  // L applies to the self:L drafter only; other controls apply to every drafter.
  $("layers-label").hidden = $("drafter").value !== "self";
  const help = $("drafter").selectedOptions[0]?.title ?? "";
  // auto, once loaded: what it chose here and why
  $("drafter-help").textContent = $("drafter").value === "auto" && autoNote && decoder
    ? `auto: ${autoNote}` : help;
}

function start() {
  $("form").addEventListener("submit", (e) => {
    e.preventDefault();
    const prompt = $("prompt").value.trim();
    if (prompt) run(prompt).catch(showError);
  });
  // Enter sends, Shift+Enter is a new line (not while an input method composes a character).
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing && !$("send").disabled) {
      e.preventDefault();
      $("form").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => decoder?.cancel().catch(showError));
  $("clear").addEventListener("click", clearConversation);
  $("receipt").addEventListener("click", downloadReceipt);
  const syncKinds = () => $("messages").classList.toggle("plain", !$("show-kinds").checked);
  $("show-kinds").addEventListener("change", syncKinds);
  syncKinds();
  $("model").addEventListener("change", () => { fillDrafters(); syncControls(); });
  // A GGUF picked or dropped: a choice of the model select, loaded as any other.
  const pick = (file) => {
    if (!file) return;
    const value = `file:${file.name}`;
    pickedFiles.set(value, file);
    if (![...$("model").options].some((o) => o.value === value)) $("model").add(new Option(file.name, value));
    $("model").value = value;
    $("model").dispatchEvent(new Event("change"));
  };
  $("model-file").addEventListener("change", () => pick($("model-file").files[0]));
  document.addEventListener("dragover", (e) => e.preventDefault());
  document.addEventListener("drop", (e) => { e.preventDefault(); pick(e.dataTransfer?.files[0]); });
  $("drafter").addEventListener("change", syncControls);
  for (const id of ["model", "drafter", "layers"]) {
    $(id).addEventListener("change", () => {
      clearError();
      if (streaming) {   // the reply goes on with the model it began with
        pendingChange = true;
        showNotice({ code: "later", page: true,
                     message: "Your new choice loads when this reply is done." });
      } else {
        ensureDecoder().catch(showError);
      }
    });
  }
  gate = gatePanel({ decoder: () => decoder, showError,
                     onBusy: (busy) => { measuring = busy; syncSend(); } });
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
    // "Measure on this device" (the button), with measure()'s options over the stated sample.
    measure: (options = {}) => gate.run(options),
  };
}

start();
