"""Host wrappers for the sampling and accept kernels (shaders/sample.wgsl, shaders/accept.wgsl).

One wrapper per entry point, named like it. Each owns its shape checks, builds its static params
uniform once and sizes its dispatch for capacity (rows_cap workgroups, or one), never for the
step's values, so a cycle's dispatch list is built once and re-encoded every cycle; everything
that changes per pass comes from the Step slot bound at binding 1 (step.py).

Buffers are given as a buffer (element offset 0) or a (buffer, element_offset) pair; offsets are in
elements (u32 / f32), so a draft step i writes its token straight into slot 1 + i of the
champion pass's token list and, through the optional `tokens2`, into the next draft step's embed
input: no copy, no CPU round trip. A buffer that a kernel writes must not also be bound to another
of its bindings (WebGPU forbids writable aliasing).

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

from .. import rng
from .device import ROWS_MAX, Dispatch, GPUError

WG = 128  # threads per workgroup of the per-row kernels and of accept (categorical.wgsl)
RNG_FILL_WG = 64

# accept's output (u32 words); see shaders/accept.wgsl for the full description.
ACCEPT_WORDS = 68
ACCEPT_N_ACCEPTED, ACCEPT_K_EFF, ACCEPT_N_EMITTED, ACCEPT_HOW = 0, 1, 2, 3
ACCEPT_TOKENS, ACCEPT_TESTS, ACCEPT_P, ACCEPT_Q = 4, 20, 36, 52
HOW = {0: "champion", 1: "residual", 2: "p_target (empty residual)", 3: "bonus"}
NONE = 0xFFFFFFFF


class SamplingShapeError(GPUError):
    """A buffer is too small for the shape a sampling wrapper was asked to serve."""


def _split(binding) -> tuple[object, int]:
    return binding if isinstance(binding, tuple) else (binding, 0)


def _need(dev, name: str, binding, elements: int) -> None:
    buf, offset = _split(binding)
    need = (offset + elements) * 4
    if dev.size_of(buf) < need:
        raise SamplingShapeError(
            f"{name} holds {dev.size_of(buf)} bytes but needs {need} (element offset {offset} + "
            f"{elements} elements of 4 bytes); allocate it for rows_cap = ROWS_MAX rows")


def _check_rows(vocab: int, rows_cap: int) -> None:
    if not 0 < vocab < 2**24:
        raise SamplingShapeError(f"vocab must be in [1, 2^24), got {vocab}")
    if not 0 < rows_cap <= ROWS_MAX:
        raise SamplingShapeError(f"rows_cap must be in [1, {ROWS_MAX}], got {rows_cap}")


def _sample_params(dev, vocab, rows_cap, in_offset=0, in_stride=0, out_offset=0, out_stride=0,
                   conf_offset=0, pos_shift=1, stream=0, n=0, out2=None):
    """sample.wgsl's Params, in its field order."""
    fields = [vocab, rows_cap, in_offset, in_stride or vocab, out_offset, out_stride or vocab,
              conf_offset, pos_shift, stream, n, _split(out2)[1] if out2 else 0, int(bool(out2))]
    return dev.uniform(np.array(fields, np.uint32), "sample.params")


def _second(dev, tokens2, rows_cap: int):
    """The second token output, or a scratch buffer when there is none: a binding must be
    bound, and binding the first output twice would alias a writable buffer."""
    if tokens2 is None:
        return dev.buffer(4 * rows_cap, label="sample.tokens2 (unused)")
    _need(dev, "tokens2", tokens2, rows_cap)
    return _whole(tokens2)


def _whole(binding):
    """A storage binding from its buffer start (element offsets go into params instead)."""
    return _split(binding)[0]


def argmax_rows(dev, logits, tokens, conf, step, *, vocab: int, rows_cap: int = ROWS_MAX,
                in_stride: int | None = None, pos_shift: int = 1, tokens2=None) -> Dispatch:
    """tokens[r] = argmax of row r (greedy, T = 0) or its Gumbel replay sample; conf[r] = the top
    probability of softmax(logits / T) (T = 1 when greedy), for rows r < step.rows.

    logits (rows_cap, in_stride) f32 from its element offset; tokens (rows_cap,) u32 and
    conf (rows_cap,) f32 from theirs; tokens2, if given, (rows_cap,) u32 gets the tokens too
    (e.g. the next draft step's embed input while `tokens` is the champion's token list).
    One workgroup per row.
    """
    _check_rows(vocab, rows_cap)
    stride = in_stride or vocab
    _need(dev, "logits", logits, (rows_cap - 1) * stride + vocab)
    _need(dev, "tokens", tokens, rows_cap)
    _need(dev, "conf", conf, rows_cap)
    params = _sample_params(dev, vocab, rows_cap, in_offset=_split(logits)[1], in_stride=stride,
                            out_offset=_split(tokens)[1], conf_offset=_split(conf)[1],
                            pos_shift=pos_shift, out2=tokens2)
    return dev.dispatch("sample", "argmax_rows",
                        [params, step, _whole(logits), _whole(tokens), _whole(conf),
                         _second(dev, tokens2, rows_cap)], rows_cap)


def softmax_rows(dev, logits, probs, conf, step, *, vocab: int, rows_cap: int = ROWS_MAX,
                 in_stride: int | None = None, out_stride: int | None = None) -> Dispatch:
    """probs[r] = softmax(logits[r] / T) (T <= 0 taken as 1), conf[r] = max(probs[r]).

    logits (rows_cap, in_stride) f32; probs (rows_cap, out_stride) f32, each from its element
    offset (draft step i passes (q_draft, i * vocab) with rows_cap = 1); conf (rows_cap,) f32.
    """
    _check_rows(vocab, rows_cap)
    in_stride, out_stride = in_stride or vocab, out_stride or vocab
    _need(dev, "logits", logits, (rows_cap - 1) * in_stride + vocab)
    _need(dev, "probs", probs, (rows_cap - 1) * out_stride + vocab)
    _need(dev, "conf", conf, rows_cap)
    params = _sample_params(dev, vocab, rows_cap, in_offset=_split(logits)[1], in_stride=in_stride,
                            out_offset=_split(probs)[1], out_stride=out_stride,
                            conf_offset=_split(conf)[1])
    return dev.dispatch("sample", "softmax_rows",
                        [params, step, _whole(logits), _whole(probs), _whole(conf)], rows_cap)


def sample_rows(dev, probs, tokens, step, *, vocab: int, stream: int = rng.STREAM_DRAFT,
                rows_cap: int = ROWS_MAX, in_stride: int | None = None,
                pos_shift: int = 1, tokens2=None) -> Dispatch:
    """tokens[r] = an exact inverse-CDF sample of probs row r with
    u = uniform(seed, step.pos + pos_shift + r, stream, 0) (verify.sample_categorical_rows).

    probs (rows_cap, in_stride) f32 with entries in [0, 1]; tokens (rows_cap,) u32; tokens2 as
    in argmax_rows.
    """
    _check_rows(vocab, rows_cap)
    stride = in_stride or vocab
    _need(dev, "probs", probs, (rows_cap - 1) * stride + vocab)
    _need(dev, "tokens", tokens, rows_cap)
    params = _sample_params(dev, vocab, rows_cap, in_offset=_split(probs)[1], in_stride=stride,
                            out_offset=_split(tokens)[1], pos_shift=pos_shift, stream=stream,
                            out2=tokens2)
    return dev.dispatch("sample", "sample_rows",
                        [params, step, _whole(probs), _whole(tokens),
                         _second(dev, tokens2, rows_cap)], rows_cap)


def rng_fill(dev, keys, out, step, *, n: int) -> Dispatch:
    """Tests: out[i] = (hash, uniform bits, Gumbel bits, 0) for keys[i] =
    ((seed_lo, seed_hi, position, stream), (index, 0, 0, 0)); keys (n, 2, 4) u32, out (n, 4)."""
    if n < 1:
        raise SamplingShapeError(f"rng_fill needs at least one key, got n = {n}")
    _need(dev, "keys", keys, 8 * n)
    _need(dev, "out", out, 4 * n)
    params = _sample_params(dev, 1, 1, n=n)
    return dev.dispatch("sample", "rng_fill", [params, step, keys, out],
                        -(-n // RNG_FILL_WG))


def accept(dev, champion, p_target, q_draft, drafts, conf, out, step, *, vocab: int,
           conf_threshold: float = 0.0, pos_shift: int = 0, rejection: bool = True) -> Dispatch:
    """The accept kernel (one workgroup): verify.py's rule for step.mode, writing ACCEPT_WORDS u32
    to `out` (n_accepted, K_eff, n_emitted, how, tokens[16], tests[16], p[16], q[16]).

    champion (K+1,) u32 (argmax_rows, greedy / replay); p_target (K+1, vocab) f32 and
    q_draft (K, vocab) f32 (softmax_rows; rejection; q is not read with FLAG_ONE_HOT, bind any
    buffer); drafts (K,) u32; conf (K,) f32 (read only when conf_threshold > 0). Shapes are
    checked for capacity, K + 1 = ROWS_MAX rows. rejection=False declares a plan that never runs
    in rejection mode, so p_target and q_draft may be any small buffer (they are bound, not read).
    """
    if not 0 < vocab < 2**24:
        raise SamplingShapeError(f"vocab must be in [1, 2^24), got {vocab}")
    if not 0.0 <= conf_threshold <= 1.0:
        raise SamplingShapeError(f"conf_threshold must be in [0, 1], got {conf_threshold}")
    _need(dev, "champion", champion, ROWS_MAX)
    if rejection:
        _need(dev, "p_target", p_target, ROWS_MAX * vocab)
    if conf_threshold > 0:
        _need(dev, "conf", conf, ROWS_MAX - 1)
    _need(dev, "drafts", drafts, ROWS_MAX - 1)
    _need(dev, "out", out, ACCEPT_WORDS)
    fields = np.array([vocab, _split(p_target)[1], vocab, _split(q_draft)[1], vocab,
                       _split(champion)[1], _split(drafts)[1], _split(conf)[1], 0, pos_shift,
                       _split(out)[1]], np.uint32)
    fields[8] = np.float32(conf_threshold).view(np.uint32)
    params = dev.uniform(fields, "accept.params")
    return dev.dispatch("accept", "accept",
                        [params, step, _whole(champion), _whole(p_target), _whole(q_draft),
                         _whole(drafts), _whole(conf), _whole(out)], 1)


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
