// The demo's model and drafter pickers (app.js uses them): the model select filled from
// manifest.json and the URL, a GGUF picked or dropped, the drafters offered for the chosen model
// with what each is, the drafter chosen in create()'s and the request's words, and the model
// card shown before a download. Not here: loading the decoder, the chat, the stats (app.js);
// the card's numbers (pyspec/apps/info.py, through the worker).

const $ = (id) => document.getElementById(id);
let manifestModels = [];          // manifest.json's models (fillModels)
const pickedFiles = new Map();    // the model select's value "file:NAME" -> the File picked

// The model card (phase "card", before a download): what the file is and what this device
// can do with it, by pyspec/apps/info.py's stated memory rule.
export function showCard({ card, header }) {
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

// The drafter the controls name: self:L with its L, else the drafter select's value.
export function drafterChoice() {
  const v = $("drafter").value;
  if (v === "self") return `self:${$("layers").value}`;
  // 'auto', 'ngram', 'model:NAME' or 'combo:NAME' (n-gram where the text repeats, else NAME)
  return v;
}

// What a choice needs at init: the draft model ('model:NAME', 'combo:NAME'), 'auto' (the worker
// decides, autoDraft), else null.
export const draftModelOf = (choice) => (choice === "auto" ? "auto"
  : /^(model|combo):/.test(choice) ? choice.slice(6) : null);

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

// The model select from manifest.json (a trained draft is offered as a drafter only) and the
// URL's model and draft (`params`: the page's URLSearchParams).
export async function fillModels(params) {
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
}

// The drafters for the chosen model: n-gram and self:L always; a draft model only where it can
// serve (the champion's tokenizer, and a trained draft only for the champion it was made for).
export function fillDrafters() {
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

// A GGUF picked (the file input) or dropped on the page: a choice of the model select, loaded as
// any other (a "change" event, as a person's choice).
export function wireFilePick() {
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
}

// What create() loads for the model select's value: the File picked, else the name or URL.
export const championOf = (model) => pickedFiles.get(model) ?? model;
