#!/bin/bash
# The H200 job for a draft, in phases that fit the device tool's calls (10 minutes each, the
# machine warm for 30 s between them, /tmp kept only while it is warm). Training only: nothing
# here is part of pyspec's runtime.
#
#   bash train/device.sh setup     # champion parts, Vulkan loaders (.gl), wgpu wheels (.whl)
#                                  # into $W/site: whatever the call carried
#
# The champion (98 MB) travels in eight parts of 13 MB, .h200a/champ.a ... .h200h/champ.h
# (`split -b 13000000 -a 1 CHAMPION champ.`), one carried folder per call: the tree with
# models/draft-l4.gguf and the prompt sets is 50.6 MiB of the 64 MiB a call carries. Call `setup`
# with .h200a ... .h200g in turn, then `setup PHASE...` with .h200h (which also holds
# public.jsonl), .whl and .gl; the machine keeps /tmp only while warm (30 s between calls).
# Answers kept from an earlier session go back the same way, in parts of 13 MB.
#   GEN_PARTS=2 bash train/device.sh genback  # earlier answers, carried back part by part
#   bash train/device.sh train     # generate (resumable) + distill + export $W/models/$NAME.gguf
#                                  # (the two phases alone: gen, distill)
#   bash train/device.sh selfprompts  # the champion writes SELF_N (10000) user messages; `gen`
#                                  # then answers them together with the templated seed set
#   NAME=eagle-h1 STEPS=3000 bash train/device.sh eagle   # the EAGLE-style head instead
#   NAME=eagle-t TAPS=2,15 FEATURE=0 bash train/device.sh eagle   # with EAGLE-3's low and
#                                  # middle states too (HEAD_LAYERS=2: a two-layer head)
#   NAME=draft-l4f INIT_DRAFT=models/draft-l4.gguf QAT=1 FEATURE=0 bash train/device.sh eagle
#                                  # the shipped draft fed with the champion's states
#   bash train/device.sh bench     # acceptance (--k fixed:4) and speed (heuristic) on the public
#                                  # workload, native WebGPU, champion-only side by side
#
# Settings (environment): NAME (draft-l4), LAYERS (0,10,20,29), MATRIX (Q4_1), GEN_MIN (3.4),
# GEN_SEED (0: which answers, and which prompts first), GEN_SHARDS (0: all), GEN_BATCH (1536),
# GEN_TOKENS (400000), GEN_DIR ($W/gen), TRAIN_MIN (4.0), STEPS (1300), BATCH (24000), LR (5e-4);
# REFERENCE (a KL-distilled draft: token-selective distillation against it) and KEEP (0.8);
# INIT (a draft GGUF to go on from) and QAT (1: train on the Q4_1 grid); BORROW (1: train with
# the champion's own embedding and write a draft that borrows it) and GROW (champion layers to
# insert into INIT's, e.g. 5,15); ARGMAX (w: add w x cross-entropy on the champion's argmax).
# What should come back is copied under $OUT.
set -euo pipefail
# The device machine's scratch folder (kept only while the machine stays warm).
W=${PYSPEC_DEVICE_DIR:-$(dirname "$(mktemp -u)")}
NAME=${NAME:-draft-l4}
LAYERS=${LAYERS:-0,10,20,29}
MATRIX=${MATRIX:-Q4_1}
GEN_MIN=${GEN_MIN:-3.4}
TRAIN_MIN=${TRAIN_MIN:-4.0}
STEPS=${STEPS:-1300}
KEEP=${KEEP:-0.8}
OUT=${OUT:-$W/out}
export PYTHONPATH=$W/site VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"

setup() {
    local part
    for part in .h200?/champ.?; do
        if [ -f "$part" ]; then cp "$part" $W/; fi
    done
    # the last part's folder also holds public.jsonl: every part is there by then
    if [ -f .h200?/public.jsonl ] && [ ! -f $W/champ.gguf ]; then
        cat $W/champ.? > $W/champ.gguf
    fi
    if [ -f .h200?/public.jsonl ]; then cp .h200?/public.jsonl $W/public.jsonl; fi
    if [ -d .gl ]; then for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig; fi
    if [ -d .whl ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target $W/site .whl/*.whl
    fi
    if [ -f $W/champ.gguf ]; then sha256sum $W/champ.gguf; fi
}

selfprompts() {
    # the champion writes SELF_N user messages (train/self_prompts.py) into $W/$SELF_FILE; they
    # come back to be committed under train/data/, and `gen` answers them with the seed set. A
    # later set (SELF_FILE=self_prompts_3.jsonl.gz SELF_SEED=2) excludes the sets already
    # committed (gzipped) and continues their ids.
    local file=${SELF_FILE:-self_prompts.jsonl.gz} earlier=() first=0
    for f in train/data/self_prompts*.jsonl.gz; do
        if [ -f "$f" ] && [ "$(basename "$f")" != "$file" ]; then
            earlier+=(--exclude "$f"); first=$((first + $(zcat "$f" | wc -l)))
        fi
    done
    python3 train/self_prompts.py --champion $W/champ.gguf --n "${SELF_N:-10000}" \
        --seed "${SELF_SEED:-0}" --first-id $first "${earlier[@]}" \
        --out $W/$file --workload $W/public.jsonl 2>&1 | tail -25 | tee -a "$OUT/train.log"
    cp $W/$file "$OUT/"
}

gen() {
    # the seed set and every self-written set, committed or just written in $W, in a fixed
    # order: the committed sets as the shipped draft's chain gave them (train/split.py
    # SHIPPED_ORDER; the shuffle depends on the order, and a glob's order on the locale), then
    # any set just written. GEN_SHARDS caps the shards (0: all), GEN_BATCH and GEN_TOKENS
    # batch the answers (the chain used 1536 and 400000), GEN_DIR is the folder (generate.py
    # refuses one made by other settings).
    local prompts=(--prompts train/data/seed_prompts.jsonl.gz) f
    for f in train/data/self_prompts_2.jsonl.gz train/data/self_prompts.jsonl.gz \
             $(LC_ALL=C ls $W/self_prompts*.jsonl* 2>/dev/null); do
        if [ -f "$f" ] && { [[ $f == train/* ]] || [ ! -f "train/data/$(basename "$f" .gz).gz" ]; }; then
            prompts+=(--prompts "$f")
        fi
    done
    python3 train/generate.py --champion $W/champ.gguf --out "${GEN_DIR:-$W/gen}" \
        --minutes "$GEN_MIN" --shards "${GEN_SHARDS:-0}" \
        --max-batch "${GEN_BATCH:-1536}" --batch-tokens "${GEN_TOKENS:-400000}" \
        --seed "${GEN_SEED:-0}" "${prompts[@]}" \
        2>&1 | tee -a "$OUT/train.log"
    local dir=${GEN_DIR:-$W/gen}
    tar cf - -C "$(dirname "$dir")" "$(basename "$dir")" | gzip -1 \
        | split -b 13000000 -d - "$OUT/gen.tar.gz.part"
}

distill() {
    mkdir -p $W/models
    # with INIT the draft names its own layers (LAYERS is for a draft made from the champion's)
    local layers=(--layers "$LAYERS")
    if [ -n "${INIT:-}" ]; then layers=(); fi
    python3 train/distill.py --champion $W/champ.gguf --data "${GEN_DIR:-$W/gen}" \
        "${layers[@]}" \
        --work $W/work-$NAME --steps "$STEPS" --minutes "$TRAIN_MIN" --matrix-type "$MATRIX" \
        --batch-tokens "${BATCH:-24000}" --lr "${LR:-5e-4}" \
        ${REFERENCE:+--reference "$REFERENCE" --keep "$KEEP"} ${INIT:+--init "$INIT"} \
        ${QAT:+--qat} ${BORROW:+--borrow-embedding} ${GROW:+--grow "$GROW"} \
        ${ARGMAX:+--argmax-weight "$ARGMAX"} \
        --gguf $W/models/$NAME.gguf 2>&1 | tee -a "$OUT/train.log"
    cp $W/work-$NAME/report.json "$OUT/$NAME-report.json"
    if [ -f $W/models/$NAME.gguf ]; then
        split -b 15M -d $W/models/$NAME.gguf "$OUT/$NAME.gguf.part"
    fi
}

eagle() {
    # the EAGLE-style head over the champion's states (train/eagle.py), Q8_0, about 4.5 MB; with
    # INIT_DRAFT (e.g. models/draft-l4.gguf) a draft model fed with the states (about 29 MB, QAT=1
    # for its Q4_1 layers; FEATURE=0 drops the feature loss; LR, BATCH)
    mkdir -p $W/models
    python3 train/eagle.py --champion $W/champ.gguf --data "${GEN_DIR:-$W/gen}" \
        --work $W/work-$NAME \
        --steps "$STEPS" --minutes "$TRAIN_MIN" --lr "${LR:-5e-4}" \
        --batch-tokens "${BATCH:-16000}" --feature-loss "${FEATURE:-0.1}" \
        ${INIT_DRAFT:+--init-draft "$INIT_DRAFT"} ${QAT:+--qat} \
        ${TAPS:+--taps "$TAPS"} ${HEAD_LAYERS:+--head-layers "$HEAD_LAYERS"} \
        --gguf $W/models/$NAME.gguf 2>&1 | tee -a "$OUT/train.log"
    cp $W/work-$NAME/report.json "$OUT/$NAME-report.json"
    if [ -f $W/models/$NAME.gguf ]; then
        split -b 15M -d $W/models/$NAME.gguf "$OUT/$NAME.gguf.part"
    fi
}

genback() {
    # answers generated in an earlier session (gen's $OUT/gen.tar.gz.partNN, kept off git) come
    # back in carried folders, at most one call's 64 MiB each: every call with a part copies it
    # into $W; once the last has arrived (GEN_PARTS of them), they are unpacked into $W/gen,
    # and `gen` goes on from the first shard missing.
    local f
    for f in .h200?/gen.tar.gz.part*; do
        if [ -f "$f" ]; then cp "$f" $W/; fi
    done
    if [ "$(ls $W/gen.tar.gz.part* 2>/dev/null | wc -l)" -ge "${GEN_PARTS:-1}" ]; then
        cat $W/gen.tar.gz.part* | tar xzf - -C $W && ls $W/gen | wc -l
    fi
}

train() { gen; distill; }

bench() {
    # the draft just trained, else the shipped one; the plots are redrawn from the JSON at home
    # (at most 8 files come back from a call). Each run has the A/Bs of drafting on the host
    # (ngram@host, D@host). BENCH_EXTRA: more --k policies (e.g. "fixed:2 fixed:3"), each into
    # $OUT/<policy>.
    local draft=$W/models/$NAME.gguf k
    if [ ! -f "$draft" ]; then draft=models/draft-l4.gguf; fi
    python3 -m pyspec check-pair --champion $W/champ.gguf --draft "$draft"
    for k in fixed:4 heuristic ${BENCH_EXTRA:-}; do
        local dir=${k/:/}
        case $k in fixed:4) dir=acc ;; heuristic) dir=speed ;; esac
        python3 -m pyspec bench --backend wgpu --champion $W/champ.gguf \
            --workload $W/public.jsonl --drafts "ngram,$draft" --k "$k" --max-tokens 64 \
            --ctx 2048 --out "$OUT/$dir" 2>&1 | tail -30
        rm -f "$OUT/$dir"/*.png
    done
}

for phase in "$@"; do "$phase"; done
