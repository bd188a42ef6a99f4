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
// Not here: the model and drafter pickers and the model card (picker.js), the "measure on this
// device" panel (gate-view.js).

import { SpecDecoder } from "./client.js";
import { gatePanel } from "./gate-view.js";
import { championOf, draftModelOf, drafterChoice, fillDrafters, fillModels, showCard,
         wireFilePick } from "./picker.js";

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

// --- progress and errors ----------------------------------------------------------------------
const PHASES = { runtime: "loading Pyodide and pyspec", download: "downloading",
                 verify: "checking sha256",
                 load: "loading weights", card: "read the model card of",
                 import: "copying into the browser cache" };

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
      workerUrl: new URL("./worker.js", import.meta.url), champion: championOf(model),
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
// The URL's request options into their fields (fillModels took model and draft).
function fillFields() {
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
  wireFilePick();
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
  const ready = fillModels(params).then(() => {
    fillFields();
    syncControls();
    return ensureDecoder();
  });
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
