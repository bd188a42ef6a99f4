"""Distill a draft from the champion on the champion's own answers, then write it as a GGUF.

    python train/distill.py --champion C.gguf --data DIR --layers 0,29 --work DIR \
        [--steps 1500] [--minutes 7] [--gguf OUT.gguf]

The draft is a small Llama at the champion's width: the champion layers named by --layers (in
order) as its starting point, the champion's final norm, and the champion's token embedding
quantized to Q4_1 as both its embedding and its head (tied, frozen: the head is most of a draft's
bytes, and the champion's already ranks tokens well). Only the layers and the final norm train.

Objective: forward KL(p_champion || q_draft) over the full vocabulary at every answer position,
with the champion run again on the same text (bf16 on the GPU) instead of stored top-k
probabilities. Verification accepts a drafted token with probability min(1, p/q) (greedy: when it
is the champion's argmax), and forward KL is the mass-covering choice that makes q spread where p
does. Prompt positions carry no loss: the draft never proposes inside a prompt.

`--reference R.gguf --keep F` selects tokens instead (AdaSPEC-style): R is a draft of the same
architecture already distilled with forward KL, and each batch trains on the fraction F of its
positions where the draft's KL exceeds R's by most. Positions where even R stays far from the
champion (text neither draft can fit at its size) carry no loss, so the capacity goes to tokens a
draft can learn to propose.

`--argmax-weight W` adds W times the draft's cross-entropy on the champion's argmax to the KL:
greedy verification accepts exactly the argmax, and where the champion is close to a tie between
two tokens (a third of the public workload's positions have p1 < 0.5:
bench/results/agreement-by-confidence.json) the KL alone lets the draft put the tie either way.

`--init D.gguf` goes on from a draft of this architecture instead of the champion's layers, and
`--qat` trains the layer matrices as Q4_1 reads them back (blocks of 32, f16 scale and minimum,
round to nearest, as the export writes them), with the gradient passed straight through to the
float weights: the file is Q4_1, so the weights learn where the grid puts them, instead of being
rounded once after float training (llama_torch.FakeQ4_1).

Resumable: the full training state (weights, AdamW moments, the position in the epoch; about
280 MB for the 4-layer draft) is saved to --work every 100 steps and at the end, written under a
temporary name and renamed, and a run with the same --work goes on from there, seeing the batches
an uninterrupted run would have. The checkpoint records the run's settings (the data's and the
starting draft's sha256, the steps, the objective, ...): a run with other settings refuses it
instead of training on from it. It lives in --work only (the device's scratch disk; a file of
that size does not come back through a call's 16 MiB), so a run resumes while its machine stays
warm; every run stops cleanly after --minutes. The report records every argument.
Evaluation on the held-out prompts (split.held_out, about 5% of each file) reports, for greedy
answers, the share of positions where the draft's argmax is the champion's token and the
acceptance rate of K=4 blocks (accepted drafted tokens / drafted tokens, as pyspec's stats count
it), and for sampled answers the mean of sum(min(p, q)), the expected acceptance per position.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.nn.utils import parametrize

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from llama_torch import (  # noqa: E402
    FakeQ4_1,
    cosine,
    from_gguf,
    grow,
    n_params,
    quantized_like,
    to_gguf,
)
from seed_prompts import data_bytes, read_jsonl  # noqa: E402
from split import SEEDS, held_out  # noqa: E402

from pyspec.formats import quant  # noqa: E402
from pyspec.cpu.model import LAYER_TENSORS  # noqa: E402
from pyspec.formats.gguf import GGUFFile  # noqa: E402

MAX_LEN = 1152


def load_sequences(data: str, by_set: dict | None = None
                   ) -> tuple[list[tuple[np.ndarray, int, float]], list, dict]:
    """(train, held, info): (ids, prompt length, temperature) per answer; held are the held-out
    prompts' answers. `by_set`, when given, also gets the held answers by prompt set (the id's
    prefix: "seed", "self")."""
    ids = [row["id"] for row in read_jsonl(SEEDS)]
    train, held, h = [], [], hashlib.sha256()
    for path in sorted(glob.glob(f"{data}/gen-*.npz")):
        h.update(Path(path).read_bytes())
        z = np.load(path)
        p_end, a_end = np.cumsum(z["prompt_len"]), np.cumsum(z["answer_len"])
        for i in range(len(z["prompt_len"])):
            p = z["prompt_ids"][p_end[i] - z["prompt_len"][i]:p_end[i]]
            a = z["answer_ids"][a_end[i] - z["answer_len"][i]:a_end[i]]
            seq = np.concatenate([p, a]).astype(np.int64)[:MAX_LEN]
            if len(seq) <= len(p) or len(a) == 0:
                continue
            item = (seq, len(p), float(z["temperature"][i]))
            # Why the fallback: shards made before prompt ids were stored index the seed set.
            pid = str(z["prompt_id"][i]) if "prompt_id" in z else ids[z["prompt_index"][i]]
            is_held = held_out(pid)
            (held if is_held else train).append(item)
            if is_held and by_set is not None:
                by_set.setdefault(pid.split("-")[0], []).append(item)
    info = {"answers": len(train) + len(held), "held_out_answers": len(held),
            "answer_tokens": int(sum(len(s) - p for s, p, _ in train + held)),
            "data_sha256": h.hexdigest()}
    listing = Path(data) / "prompts.json"
    if listing.exists():
        info["prompt_files"] = json.loads(listing.read_text(encoding="utf-8"))["files"]
    return train, held, info


def batches(items: list, batch_tokens: int, rng: np.random.Generator) -> list[list]:
    """Items of similar length together, at most batch_tokens padded tokens a batch, shuffled."""
    order = sorted(range(len(items)), key=lambda i: len(items[i][0]))
    out, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * len(items[i][0]) > batch_tokens:
            out.append(cur)
            cur = []
        cur.append(items[i])
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


def collate(batch: list, dev) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens (B, T) right-padded; mask (B, T): position t predicts the answer token t + 1."""
    T = max(len(s) for s, _, _ in batch)
    tokens = torch.zeros(len(batch), T, dtype=torch.long)
    mask = torch.zeros(len(batch), T, dtype=torch.bool)
    for b, (s, p, _) in enumerate(batch):
        tokens[b, :len(s)] = torch.from_numpy(s)
        mask[b, p - 1:len(s) - 1] = True
    return tokens.to(dev), mask.to(dev)


def optimizer_state(model, key: str, work: Path, dev, lr: float, run: dict | None = None):
    """(trainable params, AdamW, state, checkpoint path), resumed from work/state.pt when it
    exists (the model's weights saved under `key`). `run`: the settings this run trains with
    (run_settings), kept in the state; a checkpoint of other settings is refused (SystemExit),
    since going on from it would train another run's weights, or, past its steps, export them."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    state = {"step": 0, "epoch": 0, "in_epoch": 0, "losses": [], "seconds": 0.0, "run": run}
    ckpt = work / "state.pt"
    if ckpt.exists():
        saved = torch.load(ckpt, map_location=dev, weights_only=False)
        before = saved["state"].get("run")
        if run is not None and before != run:
            changed = sorted(k for k in set(run) | set(before or {})
                             if (before or {}).get(k) != run.get(k))
            raise SystemExit(f"error: {ckpt} is the checkpoint of another run (it differs in "
                             f"{', '.join(changed)}); give another --work, or delete it to "
                             "start again")
        model.load_state_dict(saved[key])
        opt.load_state_dict(saved["opt"])
        state = saved["state"]
        print(f"resumed at step {state['step']}", flush=True)
    return params, opt, state, ckpt


def run_settings(args, info: dict, ignore=("minutes", "work", "gguf", "eval_limit")) -> dict:
    """What a checkpoint must match to be gone on from: every argument that changes the weights
    (not the time slice, the folders or the evaluation), with files named by their sha256."""
    out = {}
    for name, value in sorted(vars(args).items()):
        if name in ignore:
            continue
        path = Path(value) if isinstance(value, str) and value.endswith(".gguf") else None
        out[name] = sha256_of(path) if path is not None and path.exists() else value
    out["data_sha256"] = info["data_sha256"]
    return out


def sha256_of(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def git_commit() -> str | None:
    """The checkout's commit, where the training tree is a git checkout (a copy on the device
    may not be)."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def checkpointer(model, key: str, opt, state: dict, ckpt: Path):
    """save(): the model's weights (under `key`), the optimizer and `state` to ckpt, adding the
    seconds since the last save to state["seconds"] (training time, not loading)."""
    mark = [time.time()]

    def save():
        state["seconds"] += time.time() - mark[0]
        mark[0] = time.time()
        part = ckpt.with_name(ckpt.name + ".part")   # renamed once whole: a kill mid-write
        torch.save({key: model.state_dict(), "opt": opt.state_dict(), "state": state}, part)
        os.replace(part, ckpt)                       # leaves the last whole checkpoint
    return save


def train_steps(state: dict, train: list, args, dev, loss_of, opt, params, deadline: float,
                save=None, every: int = 100, seed: int = 0) -> None:
    """The resumable training loop both candidates share: epochs of shuffled length-grouped
    batches (the epoch number seeds the order, so a resumed run sees the same batches), a
    cosine learning rate, clipped AdamW steps. `state` ({step, epoch, in_epoch, losses}) records
    where it is; it stops at args.steps or at `deadline` (time.time()), calling save() every
    `every` steps; loss_of(tokens, mask) is the step's loss."""
    while state["step"] < args.steps and time.time() < deadline:
        epoch = batches(train, args.batch_tokens, np.random.default_rng(seed + state["epoch"]))
        for bi in range(state.get("in_epoch", 0), len(epoch)):
            if state["step"] >= args.steps or time.time() > deadline:
                state["in_epoch"] = bi
                return
            for g in opt.param_groups:
                g["lr"] = cosine(state["step"], args.steps, args.lr, warmup=50)
            loss = loss_of(*collate(epoch[bi], dev))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            state["step"] += 1
            state["losses"].append(round(loss.item(), 5))
            state["in_epoch"] = bi + 1   # where a checkpoint saved now goes on from
            if state["step"] % every == 0:
                print(json.dumps({"step": state["step"],
                                  "loss": float(np.mean(state["losses"][-every:]))}), flush=True)
                if save is not None:
                    save()
        state["epoch"] += 1
        state["in_epoch"] = 0


def logits_at(model, tokens, mask):
    """(n, vocab) float32 logits at the masked positions."""
    h = model.hidden(tokens)[mask]
    return (h @ model.head_weight().T.to(h.dtype)).float()


def kl_loss(teacher, draft, tokens, mask, argmax_weight: float = 0.0):
    """Forward KL; with `argmax_weight` w > 0, plus w times the cross-entropy of the draft on the
    champion's argmax (the token greedy verification accepts)."""
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16, enabled=tokens.is_cuda):
        log_p = torch.log_softmax(logits_at(teacher, tokens, mask), -1)
    with torch.autocast("cuda", torch.bfloat16, enabled=tokens.is_cuda):
        log_q = torch.log_softmax(logits_at(draft, tokens, mask), -1)
    loss = (log_p.exp() * (log_p - log_q)).sum(-1).mean()
    if argmax_weight:
        loss = loss + argmax_weight * torch.nn.functional.nll_loss(log_q, log_p.argmax(-1))
    return loss


def selective_kl_loss(teacher, reference, draft, tokens, mask, keep: float):
    """Forward KL on the `keep` fraction of positions with the largest gap between the draft's
    KL and the reference draft's (see the module docstring)."""
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16, enabled=tokens.is_cuda):
        log_p = torch.log_softmax(logits_at(teacher, tokens, mask), -1)
        log_r = torch.log_softmax(logits_at(reference, tokens, mask), -1)
        kl_ref = (log_p.exp() * (log_p - log_r)).sum(-1)
    with torch.autocast("cuda", torch.bfloat16, enabled=tokens.is_cuda):
        log_q = torch.log_softmax(logits_at(draft, tokens, mask), -1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    n = max(1, int(keep * kl.shape[0]))
    chosen = torch.topk(kl.detach() - kl_ref, n).indices
    return kl[chosen].mean()


@torch.no_grad()
def evaluate(teacher, draft, held: list, dev, k: int = 4) -> dict:
    """Greedy answers: argmax agreement and K-block acceptance; sampled: mean sum(min(p, q))."""
    match_runs, overlap, by_pos = [], [], np.zeros((2, k))
    for item in held:
        tokens, mask = collate([item], dev)
        with torch.autocast("cuda", torch.bfloat16, enabled=tokens.is_cuda):
            p = torch.softmax(logits_at(teacher, tokens, mask), -1)
            q = torch.softmax(logits_at(draft, tokens, mask), -1)
        if item[2] == 0.0:
            target = tokens[0, 1:][mask[0, :-1]]   # the champion's own greedy tokens
            match_runs.append((q.argmax(-1) == target).cpu().numpy())
        else:
            overlap.append(torch.minimum(p, q).sum(-1).mean().item())
    drafted = accepted = 0
    for m in match_runs:                        # walk each answer in blocks of k drafts
        i = 0
        while i < len(m):
            n = 0
            while n < k and i + n < len(m) and m[i + n]:
                n += 1
            block = min(k, len(m) - i)
            drafted += block
            accepted += n
            for j in range(block):
                by_pos[0, j] += 1
                by_pos[1, j] += j < n
            i += n + 1                           # the accepted drafts, then the champion's token
    return {"greedy_argmax_agreement": float(np.mean(np.concatenate(match_runs))) if match_runs else None,
            "greedy_acceptance_rate_k4": accepted / max(1, drafted),
            "greedy_acceptance_by_position": (by_pos[1] / np.maximum(1, by_pos[0])).round(4).tolist(),
            "sampled_expected_acceptance": float(np.mean(overlap)) if overlap else None,
            "held_out_answers": len(held)}


@torch.no_grad()
def quantize_layers(model, type_id: int) -> None:
    """Replace each layer matrix by what it reads back as after quantizing to `type_id` (norms
    stay float32, as to_gguf writes them)."""
    for layer in model.layers:
        for name in LAYER_TENSORS:
            if name.endswith("norm"):
                continue
            p = getattr(layer, name)
            w = p if isinstance(p, torch.nn.Parameter) else p.weight
            q = quantized_like(w.detach().float().cpu().numpy(), type_id)
            w.copy_(torch.from_numpy(q).to(w.device, w.dtype))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--champion", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--layers", default="",
                    help="champion layers to start from, e.g. 0,10,20,29 (not with --init, whose "
                         "draft names its own)")
    ap.add_argument("--work", required=True)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--minutes", type=float, default=7.0)
    ap.add_argument("--batch-tokens", type=int, default=24_000)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--gguf", default="")
    ap.add_argument("--matrix-type", choices=["Q8_0", "Q4_1"], default="Q8_0",
                    help="the GGUF type of the layers' matrices (Q4_1 is the champion's own)")
    ap.add_argument("--eval-limit", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reference", default="",
                    help="a KL-distilled draft GGUF: train on the tokens selected against it")
    ap.add_argument("--keep", type=float, default=0.8,
                    help="with --reference: the fraction of each batch's positions kept")
    ap.add_argument("--init", default="",
                    help="a draft GGUF of this architecture to go on from (its layers, its norm) "
                         "instead of the champion's --layers")
    ap.add_argument("--argmax-weight", type=float, default=0.0,
                    help="add this times the cross-entropy on the champion's argmax to the KL")
    ap.add_argument("--qat", action="store_true",
                    help="quantization-aware: the layer matrices train as Q4_1 reads them back "
                         "(straight-through gradient); needs --matrix-type Q4_1")
    ap.add_argument("--borrow-embedding", action="store_true",
                    help="train with the champion's own token embedding (as its file reads back) "
                         "and write a draft that borrows it instead of a Q4_1 copy")
    ap.add_argument("--grow", default="",
                    help="champion layers to insert, one after each of the starting draft's "
                         "layers in turn, their output products zeroed (llama_torch.grow)")
    args = ap.parse_args(argv)
    t0 = time.time()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(args.seed)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if bool(args.layers) == bool(args.init):
        ap.error("give --layers (champion layers to start from) or --init (a draft to go on "
                 "from), one of the two")
    layers = [int(x) for x in args.layers.split(",") if x]

    teacher, md = from_gguf(args.champion, device=dev)
    teacher = teacher.eval().requires_grad_(False)
    if args.qat and args.matrix_type != "Q4_1":
        ap.error("--qat trains for the Q4_1 grid: give --matrix-type Q4_1")
    if args.init:
        draft, init_md = from_gguf(args.init, device=dev, lender=args.champion)
        layers = list(init_md["pyspec.draft.init_layers"])
    else:
        draft, _ = from_gguf(args.champion, layers=layers, device=dev)
    if args.borrow_embedding:   # the champion's embedding as pyspec reads it (Q8_0 here)
        with torch.no_grad():
            draft.tok_embd.weight.copy_(teacher.tok_embd.weight)
    grown_check, picks = None, [int(x) for x in args.grow.split(",") if x]
    if picks:
        probe = torch.randint(0, draft.s.vocab, (2, 48), device=dev)
        with torch.no_grad():
            before = draft(probe)
            draft = grow(draft, teacher, picks)
            grown_check = float((draft(probe) - before).abs().max())   # 0: the same function
        layers = [x for i, a in enumerate(layers)
                  for x in ([a, picks[i]] if i < len(picks) else [a])]
    if args.qat:
        for layer in draft.layers:
            for name in LAYER_TENSORS:
                if not name.endswith("norm"):
                    parametrize.register_parametrization(getattr(layer, name), "weight", FakeQ4_1())
    if not args.borrow_embedding:
        with torch.no_grad():  # the head the GGUF will hold: the embedding as Q4_1 reads it back
            e = draft.tok_embd.weight.detach().cpu().numpy()
            draft.tok_embd.weight.copy_(torch.from_numpy(quantized_like(e, quant.Q4_1.type_id)))
    draft.tok_embd.weight.requires_grad_(False)
    if draft.head is not None:   # a champion with a head of its own: the draft's, frozen, as
        with torch.no_grad():    # the file will hold it (llama_torch.to_gguf)
            h = draft.head.weight.detach().cpu().numpy()
            draft.head.weight.copy_(torch.from_numpy(quantized_like(h, quant.Q4_1.type_id)))
        draft.head.weight.requires_grad_(False)
    held_sets: dict[str, list] = {}
    train, held, info = load_sequences(args.data, held_sets)
    held = held[:args.eval_limit]
    params, opt, state, ckpt = optimizer_state(draft, "draft", work, dev, args.lr,
                                               run_settings(args, info))
    print(json.dumps({"layers": layers, "trainable_params": n_params(draft), **info}), flush=True)

    save = checkpointer(draft, "draft", opt, state, ckpt)

    if args.reference:
        reference = from_gguf(args.reference, device=dev)[0].eval().requires_grad_(False)
        objective = (f"token-selective forward KL: the {args.keep:.0%} of each batch's positions "
                     f"where the draft's KL exceeds the reference draft's most (AdaSPEC-style; "
                     f"reference sha256 "
                     f"{hashlib.sha256(Path(args.reference).read_bytes()).hexdigest()})")

        def loss_of(t, m):
            return selective_kl_loss(teacher, reference, draft, t, m, args.keep)
    else:
        objective = "forward KL(p_champion || q_draft), full vocabulary"
        if args.argmax_weight:
            objective += (f", plus {args.argmax_weight} x cross-entropy on the champion's "
                          "argmax")

        def loss_of(t, m):
            return kl_loss(teacher, draft, t, m, args.argmax_weight)
    train_steps(state, train, args, dev, loss_of, opt, params, t0 + args.minutes * 60, save,
                seed=args.seed)
    save()
    report = {"layers": layers, "steps": state["step"], "epochs": state["epoch"],
              "train_seconds": round(state["seconds"], 1),
              "final_loss": float(np.mean(state["losses"][-50:])) if state["losses"] else None,
              "objective": objective,
              "trainable_params": n_params(draft), "batch_tokens": args.batch_tokens,
              "lr": args.lr, **info, "args": vars(args), "git_commit": git_commit()}
    report["matrix_type"] = args.matrix_type
    report["quantization_aware"] = args.qat
    report["embedding"] = ("borrowed: the champion's own token_embd.weight" if args.borrow_embedding
                           else "a Q4_1 copy of the champion's")
    if picks:
        report["grown_with_champion_layers"] = picks
        report["grown_max_logit_change_at_step_0"] = grown_check
    if args.init:
        report["init"] = {"gguf": Path(args.init).name,
                          "sha256": hashlib.sha256(Path(args.init).read_bytes()).hexdigest()}
    report["champion_sha256"] = hashlib.sha256(Path(args.champion).read_bytes()).hexdigest()
    report["seed_prompts_sha256"] = hashlib.sha256(data_bytes(SEEDS)).hexdigest()
    if state["step"] >= args.steps:
        matrix_type = quant.BY_NAME[args.matrix_type].type_id
        if args.qat:  # keep the weights as trained (on the grid), then quantize them as always
            for layer in draft.layers:
                for name in LAYER_TENSORS:
                    if not name.endswith("norm"):
                        parametrize.remove_parametrizations(getattr(layer, name), "weight")
        quantize_layers(draft, matrix_type)  # score what the GGUF will hold, not the float weights
        report["held_out"] = evaluate(teacher, draft, held, dev)
        if len(held_sets) > 1:
            report["held_out_by_prompt_set"] = {
                name: evaluate(teacher, draft, items[:args.eval_limit], dev)
                for name, items in sorted(held_sets.items())}
        if args.gguf:
            to_gguf(draft.float(), md, args.gguf, f"pyspec-draft-L{len(layers)}",
                    {"pyspec.draft.init_layers": layers}, matrix_type=matrix_type,
                    borrow_from=GGUFFile.open(args.champion) if args.borrow_embedding else None)
            report["gguf_sha256"] = hashlib.sha256(Path(args.gguf).read_bytes()).hexdigest()
            report["gguf_bytes"] = Path(args.gguf).stat().st_size
    (work / "report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
