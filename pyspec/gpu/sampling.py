"""Host wrappers for the sampling and accept kernels (shaders/sample.wgsl, shaders/accept.wgsl),
and the device processors (shaders/penalize.wgsl, filter.wgsl, filter_split.wgsl).

One wrapper per entry point, named like it. Each owns its shape checks, builds its static params
uniform once and sizes its dispatch for capacity (rows_cap workgroups, or one), never for the
step's values, so a cycle's dispatch list is built once and re-encoded every cycle; everything
that changes per pass comes from the Step slot bound at binding 1 (step.py).

Buffers are given as a buffer (element offset 0) or a (buffer, element_offset) pair; offsets are in
elements (u32 / f32), so a draft step i writes its token straight into slot 1 + i of the
champion pass's token list: no CPU round trip. device.need checks a pair's size past its offset.
A buffer that a kernel writes must not also be bound to another of its bindings (WebGPU forbids
writable aliasing).

Random keys: the per-row kernels draw for row r at position step.pos + pos_shift + r. pos_shift
defaults to 1 because they share the forward pass's step, whose row r is the KV row pos + r and
predicts the token at pos + r + 1 (the champion pass starts at KV row c - 1, the last committed
token, and predicts positions c .. c + K). accept keys draft i at step.pos + pos_shift + i; its
pos_shift defaults to 0 (a slot with pos = c); pass 1 to share the champion pass's slot.
A pass whose logits hold only some of its rows (a draft step that feeds two tokens but samples
after the last) gives its sampling dispatch a step slot of its own with the rows and pos it has.

Not here: what is drafted or when (the cycle), choosing K (schedule.py), reading the result back.
"""

from __future__ import annotations

import numpy as np

from ..rules import rng

# accept's output layout and the workgroup sizes, which the shaders get under the same names
# (constants.py; shaders/accept.wgsl says what each accept word holds).
from .constants import (  # noqa: F401
    ACCEPT_HOW,
    ACCEPT_K_EFF,
    ACCEPT_N_ACCEPTED,
    ACCEPT_N_EMITTED,
    ACCEPT_P,
    ACCEPT_Q,
    ACCEPT_TESTS,
    ACCEPT_TOKENS,
    ACCEPT_WORDS,
    ARGMAX_CHUNK,
    HOW_BONUS,
    HOW_CHAMPION,
    HOW_EMPTY_RESIDUAL,
    HOW_RESIDUAL,
    NONE,
    RNG_FILL_WG,
    WG_ROW,
)
from .device import ROWS_MAX, Dispatch, ShapeError, need

HOW = {HOW_CHAMPION: "champion", HOW_RESIDUAL: "residual",
       HOW_EMPTY_RESIDUAL: "p_target (empty residual)", HOW_BONUS: "bonus"}


def _split(binding) -> tuple[object, int]:
    return binding if isinstance(binding, tuple) else (binding, 0)


def _check_rows(vocab: int, rows_cap: int) -> None:
    if not 0 < vocab < 2**24:
        raise ShapeError(f"vocab must be in [1, 2^24), got {vocab}")
    if not 0 < rows_cap <= ROWS_MAX:
        raise ShapeError(f"rows_cap must be in [1, {ROWS_MAX}], got {rows_cap}")


def _sample_params(dev, vocab, rows_cap, in_offset=0, in_stride=0, out_offset=0, out_stride=0,
                   conf_offset=0, pos_shift=1, stream=0, n=0, width=0):
    """sample.wgsl's Params, in its field order."""
    fields = [vocab, rows_cap, in_offset, in_stride or vocab, out_offset, out_stride or vocab,
              conf_offset, pos_shift, stream, n, width]
    return dev.uniform(np.array(fields, np.uint32), "sample.params")


def _whole(binding):
    """A storage binding from its buffer start (element offsets go into params instead)."""
    return _split(binding)[0]


def argmax_rows(dev, logits, tokens, conf, step, *, vocab: int, rows_cap: int = ROWS_MAX,
                in_stride: int | None = None, pos_shift: int = 1, want_conf: bool = True,
                split: bool | None = None) -> list[Dispatch]:
    """tokens[r] = argmax of row r (greedy, T = 0) or its Gumbel replay sample; conf[r] = the top
    probability of softmax(logits / T) (T = 1 when greedy), for rows r < step.rows. Returns the
    dispatches, in order (a plan to extend another with).

    logits (rows_cap, in_stride) f32 from its element offset; tokens (rows_cap,) u32 and
    conf (rows_cap,) f32 from theirs. want_conf=False leaves conf unwritten and skips the
    softmax's second pass over each row (the champion's choices: only a draft's confidence is
    ever read). split (default: on a GPU, not on a software adapter): argmax_parts over chunks of
    ARGMAX_CHUNK ids, then argmax_merge per row, into a scratch buffer of its own
    (shaders/sample.wgsl says why); else one workgroup per row.
    """
    _check_rows(vocab, rows_cap)
    stride = in_stride or vocab
    need(dev, logits, 4 * ((rows_cap - 1) * stride + vocab), "logits")
    need(dev, tokens, 4 * rows_cap, "tokens")
    need(dev, conf, 4 * rows_cap, "conf")
    params = _sample_params(dev, vocab, rows_cap, in_offset=_split(logits)[1], in_stride=stride,
                            out_offset=_split(tokens)[1],
                            conf_offset=_split(conf)[1] if want_conf else NONE,
                            pos_shift=pos_shift)
    if not row_split(dev, split):
        return [dev.dispatch("sample", "argmax_rows",
                             [params, step, _whole(logits), _whole(tokens), _whole(conf)],
                             rows_cap)]
    parts, n_parts = _parts(dev, vocab, rows_cap, "argmax.parts")
    return [dev.dispatch("sample", "argmax_parts", [params, step, _whole(logits), parts],
                         (n_parts, rows_cap)),
            dev.dispatch("sample", "argmax_merge",
                         [params, step, parts, _whole(tokens), _whole(conf)], rows_cap)]


def topk_rows(dev, logits, tokens, step, *, vocab: int, width: int, rows_cap: int = ROWS_MAX,
              pos_shift: int = 1, split: bool | None = None) -> list[Dispatch]:
    """tokens[r * width + j] = row r's pick j: its `width` best ids by argmax_rows' score (the
    logit; logit / T + the replay noise of the row's position in replay mode), best first, ties
    to the lowest id (shaders/topk.wgsl), for rows r < step.rows; NONE past a row's ids. Returns
    the dispatches, in order (a draft tree's children: gpu/treedraft.py).

    logits (rows_cap, vocab) f32 from its element offset; tokens (rows_cap, width) u32 from its
    own. split (default: on a GPU): topk_parts over chunks of ARGMAX_CHUNK ids, then topk_merge
    per row; the picks are the same either way.
    """
    _check_rows(vocab, rows_cap)
    if not 1 <= width <= ROWS_MAX:
        raise ShapeError(f"width must be in [1, {ROWS_MAX}], got {width}")
    need(dev, logits, 4 * rows_cap * vocab, "logits")
    need(dev, tokens, 4 * rows_cap * width, "tokens")
    params = _sample_params(dev, vocab, rows_cap, in_offset=_split(logits)[1],
                            out_offset=_split(tokens)[1], out_stride=width, conf_offset=NONE,
                            pos_shift=pos_shift, width=width)
    if not row_split(dev, split):
        return [dev.dispatch("topk", "topk_rows", [params, step, _whole(logits), _whole(tokens)],
                             rows_cap)]
    parts, n_parts = _parts(dev, vocab, rows_cap * width, "topk.parts")
    return [dev.dispatch("topk", "topk_parts", [params, step, _whole(logits), parts],
                         (n_parts, rows_cap)),
            dev.dispatch("topk", "topk_merge", [params, step, parts, _whole(tokens)], rows_cap)]


def row_split(dev, split: bool | None) -> bool:
    """Whether a per-row kernel runs split over each row (default: on a GPU, where one workgroup
    per row leaves the chip idle; not on a software adapter: shaders/sample.wgsl)."""
    return (not dev.is_cpu) if split is None else split


def _parts(dev, vocab: int, rows_cap: int, label: str) -> tuple[object, int]:
    """A split kernel's scratch: (rows_cap, parts) of 4 u32, one part per ARGMAX_CHUNK ids."""
    n_parts = -(-vocab // ARGMAX_CHUNK)
    return dev.buffer(16 * rows_cap * n_parts, label=label), n_parts


def softmax_rows(dev, logits, probs, conf, step, *, vocab: int, rows_cap: int = ROWS_MAX,
                 in_stride: int | None = None, out_stride: int | None = None,
                 split: bool | None = None) -> list[Dispatch]:
    """probs[r] = softmax(logits[r] / T) (T <= 0 taken as 1), conf[r] = max(probs[r]). Returns
    the dispatches, in order.

    logits (rows_cap, in_stride) f32; probs (rows_cap, out_stride) f32, each from its element
    offset (draft step i passes (q_draft, i * vocab) with rows_cap = 1); conf (rows_cap,) f32.
    split (default: on a GPU): softmax_parts over chunks of ARGMAX_CHUNK ids, then
    softmax_write over the same chunks; else one workgroup per row.
    """
    _check_rows(vocab, rows_cap)
    in_stride, out_stride = in_stride or vocab, out_stride or vocab
    need(dev, logits, 4 * ((rows_cap - 1) * in_stride + vocab), "logits")
    need(dev, probs, 4 * ((rows_cap - 1) * out_stride + vocab), "probs")
    need(dev, conf, 4 * rows_cap, "conf")
    params = _sample_params(dev, vocab, rows_cap, in_offset=_split(logits)[1], in_stride=in_stride,
                            out_offset=_split(probs)[1], out_stride=out_stride,
                            conf_offset=_split(conf)[1])
    if not row_split(dev, split):
        return [dev.dispatch("sample", "softmax_rows",
                             [params, step, _whole(logits), _whole(probs), _whole(conf)],
                             rows_cap)]
    parts, n_parts = _parts(dev, vocab, rows_cap, "softmax.parts")
    return [dev.dispatch("sample", "softmax_parts", [params, step, _whole(logits), parts],
                         (n_parts, rows_cap)),
            dev.dispatch("sample", "softmax_write",
                         [params, step, _whole(logits), _whole(probs), _whole(conf), parts],
                         (n_parts, rows_cap))]


def sample_rows(dev, probs, tokens, step, *, vocab: int, stream: int = rng.STREAM_DRAFT,
                rows_cap: int = ROWS_MAX, in_stride: int | None = None,
                pos_shift: int = 1, split: bool | None = None) -> list[Dispatch]:
    """tokens[r] = an exact inverse-CDF sample of probs row r with
    u = uniform(seed, step.pos + pos_shift + r, stream, 0) (verify.sample_categorical_rows).
    Returns the dispatches, in order.

    probs (rows_cap, in_stride) f32 with entries in [0, 1]; tokens (rows_cap,) u32. split
    (default: on a GPU): sample_parts, each part's exact sum, then sample_pick per row; the
    token is the same either way.
    """
    _check_rows(vocab, rows_cap)
    stride = in_stride or vocab
    need(dev, probs, 4 * ((rows_cap - 1) * stride + vocab), "probs")
    need(dev, tokens, 4 * rows_cap, "tokens")
    params = _sample_params(dev, vocab, rows_cap, in_offset=_split(probs)[1], in_stride=stride,
                            out_offset=_split(tokens)[1], pos_shift=pos_shift, stream=stream)
    if not row_split(dev, split):
        return [dev.dispatch("sample", "sample_rows",
                             [params, step, _whole(probs), _whole(tokens)], rows_cap)]
    parts, n_parts = _parts(dev, vocab, rows_cap, "sample.parts")
    return [dev.dispatch("sample", "sample_parts", [params, step, _whole(probs), parts],
                         (n_parts, rows_cap)),
            dev.dispatch("sample", "sample_pick",
                         [params, step, _whole(probs), _whole(tokens), parts], rows_cap)]


def rng_fill(dev, keys, out, step, *, n: int) -> Dispatch:
    """Tests: out[i] = (hash, uniform bits, Gumbel bits, 0) for keys[i] =
    ((seed_lo, seed_hi, position, stream), (index, 0, 0, 0)); keys (n, 2, 4) u32, out (n, 4)."""
    if n < 1:
        raise ShapeError(f"rng_fill needs at least one key, got n = {n}")
    need(dev, keys, 32 * n, "keys")
    need(dev, out, 16 * n, "out")
    params = _sample_params(dev, 1, 1, n=n)
    return dev.dispatch("sample", "rng_fill", [params, step, keys, out],
                        -(-n // RNG_FILL_WG))


def accept(dev, champion, p_target, q_draft, drafts, conf, out, step, *, vocab: int,
           conf_threshold: float = 0.0, pos_shift: int = 0, rejection: bool = True,
           split: bool = False) -> list[Dispatch]:
    """The accept kernel (one workgroup): verify.py's rule for step.mode, writing ACCEPT_WORDS u32
    to `out` (n_accepted, K_eff, n_emitted, how, tokens[16], tests[16], p[16], q[16]). Returns
    the dispatches, in order.

    champion (K+1,) u32 (argmax_rows, greedy / replay); p_target (K+1, vocab) f32 and
    q_draft (K, vocab) f32 (softmax_rows; rejection; q is not read with FLAG_ONE_HOT, bind any
    buffer); drafts (K,) u32; conf (K,) f32 (read only when conf_threshold > 0). Shapes are
    checked for capacity, K + 1 = ROWS_MAX rows. rejection=False declares a plan that never runs
    in rejection mode, so p_target and q_draft may be any small buffer (they are bound, not read).
    split (a plan that runs only in rejection mode, on a GPU): accept_parts over chunks of
    ARGMAX_CHUNK ids, then accept_pick, which write what accept does (shaders/accept.wgsl).
    """
    if not 0 < vocab < 2**24:
        raise ShapeError(f"vocab must be in [1, 2^24), got {vocab}")
    if not 0.0 <= conf_threshold <= 1.0:
        raise ShapeError(f"conf_threshold must be in [0, 1], got {conf_threshold}")
    need(dev, champion, 4 * ROWS_MAX, "champion")
    if rejection:
        need(dev, p_target, 4 * ROWS_MAX * vocab, "p_target")
    if conf_threshold > 0:
        need(dev, conf, 4 * (ROWS_MAX - 1), "conf")
    need(dev, drafts, 4 * (ROWS_MAX - 1), "drafts")
    need(dev, out, 4 * ACCEPT_WORDS, "out")
    fields = np.array([vocab, _split(p_target)[1], vocab, _split(q_draft)[1], vocab,
                       _split(champion)[1], _split(drafts)[1], _split(conf)[1], 0, pos_shift,
                       _split(out)[1]], np.uint32)
    fields[8] = np.float32(conf_threshold).view(np.uint32)
    params = dev.uniform(fields, "accept.params")
    inputs = [params, step, _whole(champion), _whole(p_target), _whole(q_draft), _whole(drafts),
              _whole(conf)]
    if not split:
        return [dev.dispatch("accept", "accept", [*inputs, _whole(out)], 1)]
    if not rejection:
        raise ShapeError("a split accept samples in rejection mode only: its plan needs "
                         "p_target and q_draft")
    n_parts = -(-vocab // ARGMAX_CHUNK)
    parts = dev.buffer(32 * n_parts, label="accept.parts")   # (parts, 2) 128-bit sums
    return [dev.dispatch("accept", "accept_parts", [*inputs, parts], n_parts),
            dev.dispatch("accept", "accept_pick", [*inputs, _whole(out), parts], 1)]


def penalty_params(dev, vocab: int, rows_cap: int = ROWS_MAX):
    """penalize.wgsl's Params as a uniform buffer, written per request by `set_penalties`
    (its plan's bind group is built once)."""
    _check_rows(vocab, rows_cap)
    fields = np.array([vocab, rows_cap, 0, 0, 0, 0, 0, 0], np.uint32)
    fields[2] = np.float32(1.0).view(np.uint32)
    return dev.uniform(fields, "penalize.params")


def set_penalties(dev, params, vocab: int, repetition: float, presence: float, frequency: float,
                  has_bias: bool, rows_cap: int = ROWS_MAX, out_offset: int = 0) -> None:
    """Write a request's penalties into a penalty_params buffer."""
    fields = np.array([vocab, rows_cap, 0, 0, 0, int(has_bias), out_offset, 0], np.uint32)
    fields[2:5] = np.array([repetition, presence, frequency], np.float32).view(np.uint32)
    dev.write(params, fields)


def penalize_rows(dev, params, logits, counts, bias, context, step, *, vocab: int,
                  rows_cap: int = ROWS_MAX) -> Dispatch:
    """In place on logits (rows_cap, vocab) f32 from element 0: logit_bias, repetition_penalty
    (tokens with seen > 0), presence and frequency penalties (output counts), row r counting
    context[1..r] too (processors.Penalties). counts (2, vocab) u32: seen (prompt + output),
    output; bias (vocab,) f32; context (ROWS_MAX,) u32, the pass's token list."""
    _check_rows(vocab, rows_cap)
    need(dev, logits, 4 * rows_cap * vocab, "logits")
    need(dev, counts, 8 * vocab, "counts")
    need(dev, bias, 4 * vocab, "bias")
    need(dev, context, 4 * ROWS_MAX, "context")
    return dev.dispatch("penalize", "penalize_rows",
                        [params, step, _whole(logits), counts, bias, _whole(context)],
                        (-(-vocab // ARGMAX_CHUNK), rows_cap))


def count_tokens(dev, params, words, counts, step, *, vocab: int) -> Dispatch:
    """counts (2, vocab) u32 += the emitted tokens of accept's words (ACCEPT_WORDS,) u32 (the
    params' out_offset is their element offset; 0 here)."""
    need(dev, words, 4 * ACCEPT_WORDS, "words")
    need(dev, counts, 8 * vocab, "counts")
    return dev.dispatch("penalize", "count_tokens", [params, step, _whole(words), counts], 1)


MASK_OFF = 0         # filter params' mask_words: no mask
TOP_P_ONE = 1 << 24  # filter params' top_p: off
TOP_P_VOCAB_MAX = 1 << 20   # filter.wgsl's top_p sums 12-bit pieces of vocab weights in a u32


def mask_words(vocab: int) -> int:
    """u32 words per mask row: vocab bits, word i / 32, bit i % 32 (jsonmask.Mask's packed bits
    read as little-endian u32)."""
    return -(-vocab // 32)


def filter_params(dev, vocab: int, rows_cap: int = ROWS_MAX):
    """filter.wgsl's Params as a uniform buffer (all off), written per request by `set_filters`
    (its plan's bind group is built once)."""
    _check_rows(vocab, rows_cap)
    return dev.uniform(_filter_fields(vocab, rows_cap, False, 0, 1.0, 0.0), "filter.params")


def _filter_fields(vocab, rows_cap, masked, top_k, top_p, min_p) -> np.ndarray:
    """filter.wgsl's Params in field order; top_p as floor(top_p 2^24) (at least 1): rounded
    down, so a cut where the mass is exactly top_p as a fraction (600 of 1000 equal tokens at
    0.6) keeps what the host's float64 cumsum keeps."""
    fields = np.zeros(8, np.uint32)
    fields[:5] = [vocab, rows_cap, mask_words(vocab) if masked else MASK_OFF,
                  min(top_k, vocab),   # k >= vocab keeps every token, as k = 0
                  min(TOP_P_ONE, max(1, int(top_p * TOP_P_ONE)))]
    fields[5] = np.float32(min_p).view(np.uint32)
    return fields


def set_filters(dev, params, vocab: int, masked: bool, top_k: int = 0, top_p: float = 1.0,
                min_p: float = 0.0, rows_cap: int = ROWS_MAX) -> None:
    """Write a request's mask switch and filters into a filter_params buffer."""
    if top_k < 0 or not 0.0 < top_p <= 1.0 or not 0.0 <= min_p <= 1.0:
        raise ShapeError(f"filters out of range: top_k {top_k}, top_p {top_p}, min_p {min_p}")
    if top_p < 1.0 and vocab > TOP_P_VOCAB_MAX:
        raise ShapeError(f"top_p on the device needs vocab <= {TOP_P_VOCAB_MAX}, got {vocab}: "
                         "use the host accept")
    dev.write(params, _filter_fields(vocab, rows_cap, masked, top_k, top_p, min_p))


FILTER_RADIX = 256         # filter.wgsl's RADIX: digits of a radix level
FILTER_ROW_WORDS = 8256    # filter_split.wgsl's ROW_WORDS: u32 words of scratch per row
FILTER_SPLIT = ("filter_mask", "filter_k0", "filter_k1", "filter_k2", "filter_k3",
                "filter_k_apply", "filter_p1", "filter_p2", "filter_p3", "filter_p_apply")


def filter_rows(dev, params, logits, mask, weights, step, *, vocab: int,
                rows_cap: int = ROWS_MAX, split: bool | None = None) -> list[Dispatch]:
    """In place on logits (rows_cap, vocab) f32 from element 0, rows r < step.rows: the mask
    (mask (rows_cap, mask_words(vocab)) u32), then at step.temperature > 0 top_k, top_p and
    min_p; excluded tokens become -FLT_MAX (shaders/filter.wgsl states the rules and ties).
    weights (rows_cap, vocab) f32 is its scratch: exp((x - max) / T) of the survivors. Returns
    the dispatches, in order.

    split (default: on a GPU, not on a software adapter): the FILTER_SPLIT kernels of
    shaders/filter_split.wgsl, each a workgroup per ARGMAX_CHUNK ids of a row, over scratch
    buffers of their own; the logits and weights come out the same bit for bit. Else
    filter_rows, one workgroup per row.
    """
    _check_rows(vocab, rows_cap)
    need(dev, logits, 4 * rows_cap * vocab, "logits")
    need(dev, mask, 4 * rows_cap * mask_words(vocab), "mask")
    need(dev, weights, 4 * rows_cap * vocab, "weights")
    bindings = [params, step, _whole(logits), mask, weights]
    if not row_split(dev, split):
        return [dev.dispatch("filter", "filter_rows", bindings, rows_cap)]
    n_parts = -(-vocab // ARGMAX_CHUNK)
    scratch = dev.buffer(4 * rows_cap * FILTER_ROW_WORDS, label="filter.scratch")
    ties = dev.buffer(4 * rows_cap * n_parts * FILTER_RADIX, label="filter.ties")
    return [dev.dispatch("filter_split", entry, [*bindings, scratch, ties], (n_parts, rows_cap))
            for entry in FILTER_SPLIT]


def decode_accept(words: np.ndarray) -> dict:
    """accept's output words (ACCEPT_WORDS,) u32 as Python values, for the cycle and the tests."""
    words = np.asarray(words, np.uint32)
    n, k_eff = int(words[ACCEPT_N_ACCEPTED]), int(words[ACCEPT_K_EFF])
    return {
        "n_accepted": n,
        "k_eff": k_eff,
        "tokens": tuple(int(t) for t in words[ACCEPT_TOKENS:ACCEPT_TOKENS + n + 1]),
        "how": HOW[int(words[ACCEPT_HOW])],
        "tests": tuple(int(t) for t in words[ACCEPT_TESTS:ACCEPT_TESTS + k_eff]),
        "p_of_draft": words[ACCEPT_P:ACCEPT_P + k_eff].view(np.float32).copy(),
        "q_of_draft": words[ACCEPT_Q:ACCEPT_Q + k_eff].view(np.float32).copy(),
    }
