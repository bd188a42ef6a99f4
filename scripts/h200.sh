#!/bin/bash
# The H200 runs of the Dawn issue and the families-and-trees issue (docs/benchmarks.md), in calls
# that fit the device tool: at most 64 MiB carried per call with the tree, 10 minutes a call, the
# machine warm 30 s between calls and its /tmp kept only while warm. Nothing can be installed
# there, so everything travels: Vulkan loaders, wgpu-py's wheels, Node with Dawn's binding and the
# site, the champion, and llama.cpp's source (its CUDA llama-bench is built there).
#
# Here, once (needs `python3 build.py setup` and `python3 build.py site`):
#   bash scripts/h200.sh pack       # .h200p1 ... .h200pN: one tar stream cut into parts
# There, one call per part, back to back, each carrying its folder:
#   run(carry=[".h200pK"], command="bash scripts/h200.sh recv")
#     every call unpacks what has arrived; once llama.cpp's source is whole (the first part) its
#     CUDA build starts in the background (scripts/build_llama_cpp_cuda.sh, log in $W/llama.log)
#   run(command="bash scripts/h200.sh probe")     # go/no-go: does Dawn find the H200?
#   run(command="bash scripts/h200.sh dawn")      # the champion through Dawn and native wgpu-py
#   run(command="bash scripts/h200.sh shapes")    # real shapes: native WebGPU vs llama.cpp CUDA
#   run(carry=[".h200old"], command="bash scripts/h200.sh before_after")   # speed before/after
# What should come back is written under $OUT.
set -uo pipefail
W=${PYSPEC_DEVICE_DIR:-$(dirname "$(mktemp -u)")}/pyspec
OUT=${OUT:-$W/out}
P=$W/payload
PART=${PART:-29000000}          # 64 MiB less the tree (37.3 MB), with room to spare
SHAPES=${SHAPES:-Qwen3-0.6B,Llama-3.2-1B,Qwen2.5-1.5B,SmolLM2-1.7B}
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export PYTHONUNBUFFERED=1
mkdir -p "$W" "$OUT"

pack() {
    # payload/: llama.cpp's source first (its build starts with the first call), the loaders and
    # wheels, Node + Dawn + the site (xz: whole after the second part, for the go/no-go probe),
    # then the champion. One tar, cut into parts.
    set -e
    local st sdist champ
    st=$(mktemp -d)
    mkdir -p "$st/gl" "$st/whl" "$st/dawn/bin" "$st/dawn/node_modules" "$st/dawn/site/models"
    sdist=${LLAMA_SDIST:-.cache/downloads/llama_cpp_python-0.3.36.tar.gz}
    local l=llama_cpp_python-0.3.36/vendor/llama.cpp
    tar xzf "$sdist" -C "$st" --wildcards "$l/*" --exclude="$l/models" --exclude="$l/docs" \
        --exclude="$l/examples" --exclude="$l/media" --exclude="$l/tests" \
        --exclude="$l/gguf-py" --exclude="$l/tools/server/public*" \
        --exclude="$l/tools/server/webui*" --exclude="$l/tools/ui" 
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
    cp "${WORKLOAD:-../shared/workloads/public.jsonl}" "$st/public.jsonl"
    cp "$(command -v node)" "$st/dawn/bin/node"
    cp -r .cache/node/node_modules/webgpu "$st/dawn/node_modules/"
    find "$st/dawn/node_modules/webgpu/dist" -mindepth 1 -maxdepth 1 ! -name linux-x64 \
        -exec rm -rf {} +
    (cd dist/site && tar cf - --exclude=./models .) | tar xf - -C "$st/dawn/site"
    tar cf - -C "$st" dawn | xz -T0 -6 > "$st/dawn.tar.xz"
    rm -rf "$st/dawn"
    (cd "$st" && sha256sum llama.tar.xz gl/* whl/* champ.gguf public.jsonl dawn.tar.xz \
        > MANIFEST)
    rm -rf .h200p[0-9]*
    tar cf - -C "$st" MANIFEST llama.tar.xz gl whl dawn.tar.xz public.jsonl champ.gguf \
        | split -b "$PART" -d -a 2 - h200.part.
    local i=1 f
    for f in h200.part.*; do
        mkdir -p ".h200p$i"; mv "$f" ".h200p$i/"; cp "$st/MANIFEST" ".h200p$i/"; i=$((i + 1))
    done
    rm -rf "$st"
    grep -qx '/.h200p\*' .git/info/exclude 2>/dev/null || echo '/.h200p*' >> .git/info/exclude
    du -sh .h200p*
}

have() {   # have FILE: the payload's FILE is whole (its sha256 as in MANIFEST)
    [ -f "$P/$1" ] && grep -F "  $1" "$P/MANIFEST" | (cd "$P" && sha256sum -c --status -)
}

recv() {
    local f
    for f in .h200p*/h200.part.*; do [ -f "$f" ] && cp "$f" "$W/"; done
    mkdir -p "$P"
    cat "$W"/h200.part.* | tar xBf - -C "$P" 2>/dev/null    # a cut stream: its whole files
    echo "recv: $(ls "$W"/h200.part.* | wc -l) parts; whole: $(for f in llama.tar.xz champ.gguf \
        public.jsonl dawn.tar.xz; do have $f && printf '%s ' $f; done)"
    if have llama.tar.xz && [ ! -d "$W/llama.cpp" ]; then
        xz -dc "$P/llama.tar.xz" | tar xf - -C "$W"
        setsid nohup bash scripts/build_llama_cpp_cuda.sh "$W/llama.cpp" > "$W/llama.log" 2>&1 &
        echo "recv: llama.cpp's CUDA build started (log $W/llama.log)"
    fi
    if [ ! -d "$W/shapes" ]; then     # the real shapes' random models, one process each
        mkdir -p "$W/shapes"
        for f in ${SHAPES//,/ }; do
            PYTHONPATH=. setsid nohup python3 scripts/real_shapes.py write "$W/shapes" --only "$f" \
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
}

probe() {
    dawn_env
    python3 -m webtools.dawn --probe --site "$W/dawn/site" > "$OUT/dawn-probe.json" 2> "$OUT/dawn-probe.err"
    cat "$OUT/dawn-probe.json" "$OUT/dawn-probe.err"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/nvidia-smi.txt"
}

dawn() {
    # The public workload (PER_STRATUM prompts of each stratum, MAX_TOKENS each): native wgpu-py's
    # bench (champion-only beside n-gram and the trained draft), then the same prompts through
    # Dawn: champion-only, n-gram and the trained draft.
    dawn_env
    local per=${PER_STRATUM:-1} max=${MAX_TOKENS:-64} d
    python3 -c 'import json, sys
from pyspec.apps.workload import first_per_stratum, read_workload
for it in first_per_stratum(read_workload(sys.argv[1]), int(sys.argv[2])):
    print(json.dumps(it))' "$P/public.jsonl" "$per" > "$W/sample.jsonl"
    PYTHONPATH="$W/site:." timeout 120 python3 -m pyspec bench --backend wgpu \
        --champion "$P/champ.gguf" --workload "$P/public.jsonl" --per-stratum "$per" \
        --max-tokens "$max" --drafts ngram,models/draft-l4.gguf --out "$OUT/native" 2>&1 | tail -8
    for d in none ngram trained; do
        local extra=(--draft "$d")
        [ "$d" = trained ] && extra=(--draft-model models/draft-l4.gguf --draft-vocab models/draft-l4.vocab.json)
        timeout "${DAWN_TIMEOUT:-140}" python3 -m webtools.dawn --site "$W/dawn/site" \
            --champion "$P/champ.gguf" --backend webgpu "${extra[@]}" --workload "$W/sample.jsonl" \
            --max-tokens "$max" > "$OUT/dawn-$d.json" 2>> "$OUT/dawn.err"
        echo "dawn $d: exit $? $(tail -c 300 "$OUT/dawn.err")"
    done
}

shapes() {
    # Random Q4_K_M models of the real shapes (scripts/real_shapes.py, written in the background
    # since the first call), each on native WebGPU (scripts/gpu_shapes.py) and through llama.cpp's
    # CUDA llama-bench; the champion's own file too.
    local names=$SHAPES bench n
    for n in ${names//,/ }; do
        for _ in $(seq 150); do grep -q "MB in" "$W/shapes/$n.log" 2>/dev/null && break; sleep 2; done
    done
    local champ=() models=${names//,/ }
    if have champ.gguf; then champ=(--champion "$P/champ.gguf"); models="$P/champ $models"; fi
    PYTHONPATH="$W/site:." timeout 360 python3 scripts/gpu_shapes.py measure "$W/shapes" \
        --names "$names" "${champ[@]}" --out "$OUT/h200-shapes-raw.json" 2>&1 | tail -30
    bench=$W/llama.cpp/build/bin/llama-bench
    for _ in $(seq 60); do      # the build started with the first call
        [ -x "$bench" ] || grep -q "FAILED\|Error" "$W/llama.log" && break; sleep 3
    done
    if [ -x "$bench" ]; then
        for n in $models; do
            [ "$n" = "$P/champ" ] || n="$W/shapes/$n"
            timeout 120 "$bench" -m "$n.gguf" -ngl 99 -p 1024 -n 128 -r 3 -o json \
                > "$OUT/llama-bench-$(basename "$n").json" 2>> "$OUT/llama-bench.err"
            echo "llama-bench $(basename "$n"): exit $?"
        done
    else
        echo "no llama-bench: $(tail -5 "$W/llama.log")"
    fi
}

before_after() {
    # The house rebuild's speed check: native wgpu-py's bench at the commit before it (carried as
    # .h200old/: `git archive d7d93e7 pyspec shaders`) and now, interleaved, the same prompts.
    local per=${PER_STRATUM:-1} max=${MAX_TOKENS:-64} i
    for i in 1 2; do
        for side in old new; do
            local path=.; [ $side = old ] && path=.h200old
            PYTHONPATH="$W/site:$path" timeout 100 python3 -m pyspec bench --backend wgpu \
                --champion "$P/champ.gguf" --workload "$P/public.jsonl" --per-stratum "$per" \
                --max-tokens "$max" --drafts ngram,models/draft-l4.gguf --out "$OUT/$side$i" \
                2>&1 | tail -4
        done
    done
}

"${1:?usage: h200.sh pack | recv | probe | dawn | shapes | before_after}"
