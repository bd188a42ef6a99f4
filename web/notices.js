// What a finished request's result says to the app as notices (SpecDecoder's onNotice and
// `notices`, client.js #finish): the context-full policy's (context_trimmed, answer_capped) and
// one per fault the worker recovered from by itself (a lost GPU device: finished on the CPU; a
// draft that gave NaN: champion-only). Not here: the notices of a dead worker (client.js says
// them when it happens) nor of loading faults (the `ready` message's notices, at init).

// Receipt fault kinds met while loading (web.py LOAD_FAULTS): noticed at init, not per request.
const LOAD_FAULTS = new Set(["opfs_truncated", "opfs_corrupt", "opfs_quota", "opfs_unavailable",
                             "download_dropped", "opfs_busy"]);
const GPU_FAULTS = { device_lost: "the GPU device was lost", gpu_error: "the GPU failed",
                     gpu_timeout: "a GPU readback hung",
                     bad_draft: "the draft gave numbers it cannot draft from (NaN or infinite)" };

/** The notices of a request's result ({code, message, at_token?}), in order. */
export function resultNotices(result) {
  const notices = [];
  // The context-full policy left out the oldest turns (counts in receipt.context), or the
  // answer can run only to the context's end (max_tokens past it).
  if (result.notice) {
    const trimmed = (result.receipt?.context?.dropped_messages ?? 0) > 0;
    notices.push({ code: trimmed ? "context_trimmed" : "answer_capped", message: result.notice });
  }
  const faults = result.receipt?.faults ?? [];
  faults.forEach((f, i) => {
    // A dead worker was noticed when it happened, loading faults at init.
    if (f.kind === "worker_died" || f.kind === "worker_oom" || LOAD_FAULTS.has(f.kind)) return;
    const next = faults[i + 1]?.adapter ?? result.receipt.stats.adapter;
    const how = f.kind === "bad_draft" ? "without the draft (champion-only: the same text)"
      : next === "cpu-numpy" ? "on the CPU" : "on a new device";
    notices.push({ code: f.kind, at_token: f.at_token,
                   message: `${GPU_FAULTS[f.kind] ?? f.kind} after ${f.at_token} ` +
                            `tokens; the request went on from there ${how}` });
  });
  return notices;
}
