"""The constants Python and WGSL share, defined once here and rendered as WGSL for every shader.

device.load_shader puts the block that `wgsl()` renders above every shader, so no .wgsl file keeps
its own copy, and the Python side imports the same names from here (device.ROWS_MAX, ops.WG,
sampling.ACCEPT_*, step.MODES, ...): STYLE's "a fact both sides need has one source".
tests/test_gpu_constants.py parses the shaders to keep it so. A WGSL name is the Python name,
except the modes: MODES["greedy"] is MODE_GREEDY. The RNG stream ids stay in rng.py, the CPU side
of the same hash, and are rendered from there.

Why the values live here and not in the modules that use them: device.py renders the block, and
ops.py, sampling.py and step.py import device.py, so their values read from device.py would be an
import circle (tests/test_layout.py). This module imports only rng.

Not here: a constant only one side uses (a shader's float limits), and struct layouts (Step, each
kernel's Params), which their packers keep in field order.
"""

from __future__ import annotations

from ..rules import rng

ROWS_MAX = 16        # the most rows one pass carries: K + 1 <= 16 (thin matrix products, M <= 16)

# --- workgroups ---------------------------------------------------------------------------------
WG = 64              # threads per workgroup of the forward's kernels (ops.py)
MATMUL_OUTS = 4      # consecutive outputs per matmul thread
WG_ROW = 128         # threads per workgroup of the per-row sampling kernels and of accept
ARGMAX_CHUNK = 1024  # ids per workgroup of a per-row kernel split over a row, on a GPU (argmax_,
                     # softmax_, sample_ and accept_parts: shaders/sample.wgsl, accept.wgsl)
RNG_FILL_WG = 64     # threads per workgroup of rng_fill (tests)
ATTN_WG = 256        # threads per workgroup of attention on a GPU (one workgroup per row and head)
ATTN_WG_CPU = 64     # ... on a software adapter (attention_cpu: fewer idle threads per barrier)

# --- block formats on the GPU (shaders/blocks.wgsl): KIND_Q4_1, ... in WGSL. Python picks a
# product's entry point by name (matmul_q4_k) and encodes a code only for the V rows of a Q, K, V
# product whose V is in another format (weights.Weight.upload_stack).
BLOCK_KINDS = {"q4_1": 0, "q8_0": 1, "q5_0": 2, "q5_1": 3, "q4_k": 4, "q5_k": 5, "q6_k": 6,
               "q4_0": 7}

# --- the Step uniform (step.py): mode and flags ---------------------------------------------------
MODES = {"greedy": 0, "replay": 1, "rejection": 2}
FLAG_ONE_HOT = 1     # the drafts are deterministic: q_draft is one-hot and accept does not read it
FLAG_TREE = 2        # the pass's rows are a tree's nodes (Step.tree holds depth and parent per row)
TREE_NO_PARENT = 0xFFFF   # a tree word's parent field for the root (row 0)

# --- accept's output: ACCEPT_WORDS u32 from its offset (shaders/accept.wgsl says what each holds)
NONE = 0xFFFFFFFF    # "no token" in a u32 token slot
ACCEPT_N_ACCEPTED, ACCEPT_K_EFF, ACCEPT_N_EMITTED, ACCEPT_HOW = 0, 1, 2, 3
ACCEPT_TOKENS = 4                        # (ROWS_MAX,) the emitted tokens, NONE after them
ACCEPT_TESTS = ACCEPT_TOKENS + ROWS_MAX  # (ROWS_MAX,) each draft's test, 1 pass / 0 fail
ACCEPT_P = ACCEPT_TESTS + ROWS_MAX       # (ROWS_MAX,) f32 bits: p_target of each draft
ACCEPT_Q = ACCEPT_P + ROWS_MAX           # (ROWS_MAX,) f32 bits: q_draft of each draft
ACCEPT_WORDS = ACCEPT_Q + ROWS_MAX       # 68
# How accept chose the last token (word ACCEPT_HOW).
HOW_CHAMPION = 0         # the champion's own token (greedy / replay)
HOW_RESIDUAL = 1         # a sample of the residual at the first rejection
HOW_EMPTY_RESIDUAL = 2   # a sample of p_target, because the residual was all zero
HOW_BONUS = 3            # the bonus sample after K accepted drafts (rejection)

_HERE = ("ROWS_MAX", "WG", "MATMUL_OUTS", "WG_ROW", "ARGMAX_CHUNK", "RNG_FILL_WG", "ATTN_WG",
         "ATTN_WG_CPU", "FLAG_ONE_HOT", "FLAG_TREE", "TREE_NO_PARENT", "NONE",
         "ACCEPT_N_ACCEPTED", "ACCEPT_K_EFF", "ACCEPT_N_EMITTED", "ACCEPT_HOW", "ACCEPT_TOKENS",
         "ACCEPT_TESTS", "ACCEPT_P", "ACCEPT_Q", "ACCEPT_WORDS",
         "HOW_CHAMPION", "HOW_RESIDUAL", "HOW_EMPTY_RESIDUAL", "HOW_BONUS")
_STREAMS = ("STREAM_ACCEPT", "STREAM_RESIDUAL", "STREAM_BONUS", "STREAM_DRAFT", "STREAM_GUMBEL")


def values() -> dict[str, int]:
    """Every constant of the WGSL block by its WGSL name (all u32), in the block's order."""
    out = {name: globals()[name] for name in _HERE}
    out |= {f"MODE_{mode.upper()}": value for mode, value in MODES.items()}
    out |= {f"KIND_{kind.upper()}": value for kind, value in BLOCK_KINDS.items()}
    out |= {name: getattr(rng, name) for name in _STREAMS}
    return out


def wgsl() -> str:
    """The block: one `const NAME: u32 = VALUEu;` per constant."""
    lines = ["// Shared with Python: generated from pyspec/gpu/constants.py; do not redeclare."]
    for name, value in values().items():
        if not (isinstance(value, int) and 0 <= value < 2**32):
            raise ValueError(f"{name} = {value!r} is not a u32; WGSL cannot share it")
        lines.append(f"const {name}: u32 = {value:#x}u;" if value > 0xFFFF
                     else f"const {name}: u32 = {value}u;")
    return "\n".join(lines) + "\n\n"
