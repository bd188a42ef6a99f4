#!/bin/bash
# The page's WebGPU stack (worker.js under Pyodide with Dawn, webtools/dawn.mjs) on the GPU
# machine, beside native wgpu-py: what travels, in parts, and what runs there. Nothing can be
# installed there, so Node, Dawn's binding and the site go with the calls.
#
# Here, once (needs `python3 build.py site` and setup's .cache/node):
#   bash webtools/dawn_device.sh pack      # .dawn1/ ... .dawnN/: parts of 13 MB (ignored paths)
# Then one device call per part folder, back to back (the machine keeps /tmp ~30 s between calls):
#   run(carry=[".dawnK"], command="bash webtools/dawn_device.sh setup")        # K = 1 .. N
# The champion goes as in train/device.sh (.h200a ... .h200h, `setup` there), and the Vulkan
# loaders as .gl (the device tool's README). Then, carrying .gl:
#   run(carry=[".gl"], command="bash webtools/dawn_device.sh probe")   # go/no-go: Dawn's adapter
#   run(carry=[".gl"], command="bash webtools/dawn_device.sh bench")   # Dawn against native wgpu
# What should come back is written under $OUT.
set -euo pipefail
W=${PYSPEC_DEVICE_DIR:-$(dirname "$(mktemp -u)")}
OUT=${OUT:-$W/out}
PART=13000000
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}

pack() {
    # node (one static-enough binary), the `webgpu` package with only linux-x64's dawn.node,
    # and dist/site without its models: one tar, xz, cut into folders of one part each.
    local staging
    staging=$(mktemp -d)
    mkdir -p "$staging/bin" "$staging/node_modules"
    cp "$(command -v node)" "$staging/bin/node"
    cp -r .cache/node/node_modules/webgpu "$staging/node_modules/"
    find "$staging/node_modules/webgpu/dist" -mindepth 1 -maxdepth 1 ! -name linux-x64 \
        -exec rm -rf {} +
    for dep in debug ms; do    # webgpu's own runtime dependencies
        if [ -d ".cache/node/node_modules/$dep" ]; then
            cp -r ".cache/node/node_modules/$dep" "$staging/node_modules/"
        fi
    done
    mkdir -p "$staging/site"
    (cd dist/site && tar cf - --exclude=./models .) | tar xf - -C "$staging/site"
    mkdir -p "$staging/site/models"
    rm -rf .dawn[0-9]*
    tar cf - -C "$staging" . | xz -T0 -6 | split -b $PART -d -a 2 - dawn.part.
    local i=1 f
    for f in dawn.part.*; do
        mkdir -p ".dawn$i"
        mv "$f" ".dawn$i/"
        i=$((i + 1))
    done
    rm -rf "$staging"
    grep -qx '/.dawn\*' .git/info/exclude 2>/dev/null || echo '/.dawn*' >> .git/info/exclude
    echo "pack: $((i - 1)) folders .dawn1 ... .dawn$((i - 1))"
}

setup() {
    local f
    for f in .dawn*/dawn.part.*; do
        if [ -f "$f" ]; then cp "$f" "$W/"; fi
    done
    if [ ! -d "$W/dawn" ] && ls "$W"/dawn.part.* >/dev/null 2>&1 \
            && cat "$W"/dawn.part.* | xz -t 2>/dev/null; then
        mkdir -p "$W/dawn"
        cat "$W"/dawn.part.* | xz -d | tar xf - -C "$W/dawn"
        echo "setup: node $("$W/dawn/bin/node" --version) unpacked in $W/dawn"
    else
        echo "setup: $(ls "$W"/dawn.part.* 2>/dev/null | wc -l) parts so far"
    fi
    if [ -d .gl ]; then for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig; fi
}

probe() {
    setup
    PATH="$W/dawn/bin:$PATH" PYSPEC_NODE_MODULES="$W/dawn/node_modules" \
        python3 -m webtools.dawn --probe --site "$W/dawn/site" 2>&1 | tee "$OUT/dawn-probe.json"
}

bench() {
    # Dawn's champion-only and n-gram runs on a few public prompts, then native wgpu-py's, the
    # same prompts and options, one JSON each (the champion from train/device.sh's setup).
    setup
    mkdir -p "$W/dawn/site/models"
    local p
    for p in "Tell me about octopuses." "Rewrite this more formally: the cat sat on the mat." ; do
        for d in none ngram; do
            PATH="$W/dawn/bin:$PATH" PYSPEC_NODE_MODULES="$W/dawn/node_modules" \
                python3 -m webtools.dawn --site "$W/dawn/site" --champion "$W/champ.gguf" \
                --backend webgpu --draft "$d" --prompt "$p" --max-tokens 64 --repeat 2 \
                >> "$OUT/dawn-runs.jsonl"
        done
    done
    PYTHONPATH="$W/site:." python3 -m pyspec bench --backend wgpu --champion "$W/champ.gguf" \
        --workload "$W/public.jsonl" --per-stratum 1 --max-tokens 64 --drafts ngram \
        --out "$OUT/native" 2>&1 | tail -20
}

mkdir -p "$OUT"
"${1:?usage: dawn_device.sh pack | setup | probe | bench}"
