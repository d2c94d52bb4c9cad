"""A run of three same-shape checkpoints on vLLM: three fresh `infer --engine vllm` processes against one
`sweep --engine vllm` process (one engine; the later checkpoints' weights reloaded in place).

Workload: 3 checkpoints of the demo preset (different weight seeds), 8 images, 16 greedy new tokens,
vLLM's CPU build. Each repetition runs the three infers and the sweep (with the default canary, and with
--canary 0) as separate processes, as a user would, wall time measured around each process. Rows are
compared checkpoint by checkpoint (text and token counts). Reported: medians over --runs, the ratio
three infers ÷ one sweep, and the sweep's reload seconds against a fresh engine's start-up seconds.
Run (from .venv-vllm, on a quiet machine):
  .venv-vllm/bin/python benchmarks/bench_vllm_sweep.py --write
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_infer import PROMPT, record

STEPS = (100, 200, 300)
VLMFAST = Path(sys.executable).parent / "vlmfast"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_LOGGING_LEVEL": "ERROR"}


def _timed(args: list[str]) -> tuple[float, dict]:
    start = time.perf_counter()
    done = subprocess.run([str(VLMFAST), *args, "--json"], capture_output=True, text=True, env=ENV, timeout=1800)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"vlmfast {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return seconds, json.loads(done.stdout)


def _rows(path: Path) -> dict:
    return {r["id"]: (r["text"], r["n_new_tokens"]) for r in map(json.loads, path.read_text().splitlines())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()

    import vllm

    from vlmfast.checkpoints.tiny import build_checkpoint, make_images

    scratch = Path(tempfile.mkdtemp(prefix="vlmfast-bench-vllm-sweep-"))
    atexit.register(shutil.rmtree, scratch, True)  # what the run made goes with it
    run = scratch / "run"
    for step, seed in zip(STEPS, (0, 1, 2)):
        build_checkpoint(run / f"checkpoint-{step}", preset="demo", like="grpo", seed=seed)
    images = make_images(scratch / "images", n=8)
    manifest = scratch / "m.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"q{i}", "image": str(p), "prompt": PROMPT}) + "\n"
                                for i, p in enumerate(images)))
    common = ["--manifest", str(manifest), "--engine", "vllm", "--max-new-tokens", "16"]
    fresh_s, sweep_s, bare_s, startup_s, reload_s, equal = [], [], [], [], [], []
    for k in range(args.runs):
        fresh_rows, total = {}, 0.0
        for step in STEPS:
            out = scratch / f"fresh-{k}-{step}.jsonl"
            seconds, report = _timed(["infer", "--ckpt", str(run / f"checkpoint-{step}"), *common, "--out", str(out)])
            total += seconds
            startup_s.append(report["load_s"])
            fresh_rows[step] = _rows(out)
        fresh_s.append(total)
        for canary, into in (("8", sweep_s), ("0", bare_s)):
            out_dir = scratch / f"sweep-{k}-canary{canary}"
            seconds, report = _timed(["sweep", str(run), *common, "--out-dir", str(out_dir), "--canary", canary])
            into.append(seconds)
            reload_s += [c["reload_s"] for c in report["checkpoints"] if "reload_s" in c]
            equal.append(all(_rows(out_dir / f"step-{s}.jsonl") == fresh_rows[s] for s in STEPS))
    med = statistics.median
    lines = [
        "## vLLM sweep: one engine, weights reloaded in place (CPU, `.venv-vllm`)",
        "",
        f"vLLM {vllm.__version__}; 3 demo-preset checkpoints of one run, 8 images, 16 greedy new tokens; each figure "
        f"the median of {args.runs} runs, every command a separate process (wall time).",
        "",
        "| what | seconds |",
        "|---|---|",
        f"| 3 × `infer --engine vllm` (fresh engine each) | {med(fresh_s):.1f} |",
        f"| 1 × `sweep --engine vllm` (default canary: one extra fresh engine once) | {med(sweep_s):.1f} |",
        f"| 1 × `sweep --engine vllm --canary 0` | {med(bare_s):.1f} |",
        f"| vLLM start-up (`load_s` of a fresh infer) | {med(startup_s):.2f} |",
        f"| one in-place reload (`reload_s`) | {med(reload_s):.3f} |",
        "",
        f"Three infers ÷ one sweep: **{med(fresh_s) / med(sweep_s):.2f}×** with the canary, "
        f"**{med(fresh_s) / med(bare_s):.2f}×** without. Rows equal to the fresh infers in {sum(equal)}/{len(equal)} "
        "sweeps (every checkpoint, text and token counts).",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.write:
        record(text, "vllm-sweep")


if __name__ == "__main__":
    main()
