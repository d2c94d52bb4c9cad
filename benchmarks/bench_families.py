"""The own decode loop against plain generate on every model family, side by side in one run.

Workload per family: its tiny random checkpoint (`vlmfast make-checkpoint --family …`), 4 images in one
batch, 32 new tokens (forced), greedy, float32 on the CPU. Per family and decoder, the decode time per
step (first new token → last, over the steps after the first) from the engine's own clocks; each
repetition runs both decoders of every family, interleaved; medians. Also whether the greedy tokens of
the two decoders are identical. Run:
  .venv/bin/python benchmarks/bench_families.py --write      (and with .venv-tf4: the families 4.57 has)
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from bench_infer import PROMPT, record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()

    import torch
    import transformers

    from vlmfast.checkpoints.load import load
    from vlmfast.engines.hf.engine import Engine
    from vlmfast.errors import UsageError
    from vlmfast.checkpoints.families import FAMILIES
    from vlmfast.inputs.requests import collect
    from vlmfast.engines.rows import GenerationSettings
    from vlmfast.engines.hf.scheduler import Scheduler
    from vlmfast.checkpoints.tiny import build_checkpoint, make_images

    work = Path(tempfile.mkdtemp(prefix="vlmfast-bench-families-"))
    atexit.register(shutil.rmtree, work, True)  # what the run made goes with it
    images = [str(p) for p in make_images(work / "images", n=4)]
    requests = collect(images=images, prompt=PROMPT).requests
    settings = GenerationSettings(max_new_tokens=args.new_tokens, ignore_eos=True)
    engines = {}
    for family in FAMILIES:
        try:
            loaded = load(str(build_checkpoint(work / family.key, family=family.key)), device="cpu")
        except UsageError as exc:  # a family this transformers does not have
            print(f"{family.key}: skipped ({exc.message})", file=sys.stderr)
            continue
        engines[family.key] = {decoder: Engine(loaded, settings, decoder=decoder) for decoder in ("vlmfast", "hf")}

    def step_ms(engine) -> tuple[float, list[list[int]]]:
        rows, timings = [], []
        for _, results, timing in Scheduler(engine).run(requests, {}, len(requests)):
            rows += [r.token_ids for r in results]
            timings.append(timing)
        (t,) = timings
        return t.decode_s * 1000 / (t.steps - 1), rows

    ms: dict[tuple[str, str], list[float]] = {}
    tokens: dict[tuple[str, str], list] = {}
    for rep in range(args.runs + 1):  # the first repetition warms up
        for key, pair in engines.items():
            for decoder, engine in pair.items():
                value, tokens[(key, decoder)] = step_ms(engine)
                if rep:
                    ms.setdefault((key, decoder), []).append(value)
    lines = [
        f"### Own decode loop per model family — transformers {transformers.__version__}, torch {torch.__version__}",
        "",
        f"Tiny random checkpoint of each family, 4 images in one batch, {args.new_tokens} new tokens (forced), greedy, "
        f"CPU float32, {torch.get_num_threads()} threads; 1 warm-up + median of {args.runs} interleaved runs.",
        "",
        "| family | own loop ms/step | `--decoder hf` ms/step | hf ÷ own (target ≥ 1.3×) | identical greedy rows |",
        "|---|---|---|---|---|",
    ]
    for key in engines:
        own, hf = statistics.median(ms[(key, "vlmfast")]), statistics.median(ms[(key, "hf")])
        same = sum(a == b for a, b in zip(tokens[(key, "vlmfast")], tokens[(key, "hf")]))
        lines.append(f"| {key} | {own:.2f} | {hf:.2f} | {hf / own:.2f}× | {same}/{len(requests)} |")
    text = "\n".join(lines + [""])
    print(text)
    if args.write:
        record(text, f"families-tf{transformers.__version__.split('.')[0]}")


if __name__ == "__main__":
    main()
