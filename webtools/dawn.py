"""Run the page's worker in Node under Dawn (webtools/dawn.mjs) and read its answer.

    python -m webtools.dawn --probe                       does Dawn find an adapter here?
    python -m webtools.dawn --champion M.gguf --prompt "Hi" --max-tokens 32 [--backend cpu]
        [--draft ngram] [--k fixed:3] [--tree 2,2,1|auto]
    python -m webtools.dawn ... --workload W.jsonl --sides '{"chain": {}, "tree": {"tree":
        "2,2,1"}}' --split DIR          sides interleaved in one process, one file per side

Dawn says why it passes over an adapter from native code, on stderr; this keeps those lines
(`Run.dawn`) so a missing adapter is reported in Dawn's own words. Node is the machine's; the npm
package `webgpu` (Dawn's Node binding) comes from build.py's NODE_PINS in .cache/node, or from
PYSPEC_NODE_MODULES. The site is dist/site/ (`python3 build.py site`).

Not here: the harness itself (dawn.mjs), the page in a browser (e2e/).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "webtools" / "dawn.mjs"
NODE_MODULES = ROOT / ".cache" / "node" / "node_modules"
# Lines Dawn's Vulkan loader prints on a machine without a display; they say nothing of adapters.
NOISE = ("XDG_RUNTIME_DIR",)


class DawnError(RuntimeError):
    """The harness could not run (no Node, no `webgpu` package, no site) or failed."""


@dataclass
class Run:
    adapter: dict | None          # Dawn's adapter (vendor, architecture, limits), None: none found
    dawn: list[str]               # what Dawn printed on stderr (why an adapter was passed over)
    ready: dict | None = None     # the worker's ready message
    runs: list[dict] = field(default_factory=list)   # one per --repeat: text, tokens, stats, wall_s

    def sides(self) -> dict[str, "Run"]:
        """The answer of a --sides run as one Run per side (in the order the runs came)."""
        out: dict[str, Run] = {}
        for r in self.runs:
            out.setdefault(r["side"], Run(self.adapter, self.dawn, self.ready)).runs.append(r)
        return out

    def why_no_adapter(self) -> str:
        said = " / ".join(self.dawn) or "no message"
        return f"Dawn (npm webgpu) found no WebGPU adapter on this machine: {said}"


def node_modules() -> Path:
    where = Path(os.environ.get("PYSPEC_NODE_MODULES", NODE_MODULES))
    if not (where / "webgpu" / "package.json").exists():
        raise DawnError(f"the npm package `webgpu` is not in {where}: run `python3 build.py setup` "
                        "(it installs build.py's NODE_PINS) or set PYSPEC_NODE_MODULES")
    return where


def run(champion: str | None = None, *, site: Path = ROOT / "dist" / "site", probe: bool = False,
        timeout: float = 1800, **options) -> Run:
    """Run the harness; `options` are dawn.mjs's flags without dashes (max_tokens=16, ...)."""
    node = shutil.which("node")
    if node is None:
        raise DawnError("no `node` on PATH: install Node.js (Debian: nodejs)")
    if not probe and not (site / "worker.js").exists():
        raise DawnError(f"no site at {site}: run `python3 build.py site`")
    cmd = [node, str(HARNESS), "--site", str(site)]
    if probe:
        cmd.append("--probe")
    if champion:
        cmd += ["--champion", champion]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if key == "sides" and not isinstance(value, str):
            value = json.dumps(value)
        cmd += [flag] if value is True else [flag, str(value)]   # a switch (null_gpu=True)
    env = {**os.environ, "PYSPEC_NODE_MODULES": str(node_modules())}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    dawn = [line.strip() for line in proc.stderr.splitlines()
            if line.strip() and not any(n in line for n in NOISE)]
    try:
        answer = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise DawnError(f"the harness printed no answer (exit {proc.returncode}): "
                        f"{proc.stderr.strip()[-2000:]}") from None
    if "error" in answer:
        raise DawnError(f"the worker failed: {answer['error']['code']}: "
                        f"{answer['error']['message']}")
    return Run(answer["adapter"], dawn, answer.get("ready"), answer.get("runs", []))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m webtools.dawn", description=__doc__.split("\n")[0])
    ap.add_argument("--probe", action="store_true", help="only ask Dawn for an adapter")
    ap.add_argument("--null-gpu", action="store_true", default=None,
                    help="a WebGPU that computes nothing (webtools/nullgpu.mjs): the page's own "
                         "per-cycle host cost")
    ap.add_argument("--null-token")
    ap.add_argument("--champion", help="the champion GGUF (a path)")
    ap.add_argument("--site", type=Path, default=ROOT / "dist" / "site")
    for flag in ("--backend", "--draft", "--prompt", "--max-tokens", "--temperature", "--seed",
                 "--k", "--repeat", "--warmup", "--workload", "--draft-model", "--draft-vocab"):
        ap.add_argument(flag)
    ap.add_argument("--tree", metavar="SHAPE", help="each request's tree of drafts: widths per "
                    "depth (2,2,1) or auto (the request option `tree`)")
    ap.add_argument("--sides", metavar="JSON", help="{name: request options}: every prompt once "
                    "per side, interleaved in one process (dawn.mjs)")
    ap.add_argument("--split", metavar="DIR", type=Path, help="with --sides: write "
                    "DIR/dawn-NAME.json per side (what one process per side would have printed)")
    args = vars(ap.parse_args(argv))
    probe, champion, site = args.pop("probe"), args.pop("champion"), args.pop("site")
    folder = args.pop("split")
    if folder is not None and args.get("sides") is None:
        ap.error("--split needs --sides")
    options = {k: v for k, v in args.items() if v is not None}
    try:
        result = run(champion, site=site, probe=probe, **options)
    except DawnError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        for side, part in result.sides().items():
            (folder / f"dawn-{side}.json").write_text(json.dumps(part.__dict__, indent=1))
    print(json.dumps(result.__dict__, indent=1))
    return 0 if result.adapter or probe or options.get("backend") == "cpu" else 3


if __name__ == "__main__":
    sys.exit(main())
