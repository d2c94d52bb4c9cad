"""When should free decode rows take waiting requests on a GPU? A scheduling model, fed with measured costs.

Not a measurement: a model of continuous batching where a decode step costs the same whatever rows are
live (CUDA graphs compute every row) and an admission stalls every row for its prefill. Its inputs were
measured on an H200 with the Qwen2.5-VL-3B shape in bf16 (benchmarks/RESULTS.md, GPU section): a step
of 32 rows 5.95 ms; the time to the first token of 1, 8 and 32 requests of one 448-px image 82, 122 and
417 ms (prefill, vision included). The answers are those of bench_lengths.py's 3B mix: each token ends
an answer with probability 594/151,936 (one stop id per 256 of the vocabulary), at most 512 tokens;
8 images × 4 draws × ``--n 8`` = 256 answers in 32 rows. The rows are harvested every 8 steps, as on CUDA.

Checked against the one run measured there (vlmfast 0.10's policy: admit once a quarter of the rows are
free, prefill only what they take): it measured 17.2 s, 78 % row utilization and 2,248 steps; static
batches 27.1 s and 43 %. The policies compared, per workload (medians over seeds):
  python benchmarks/model_admission.py
"""

from __future__ import annotations

import math
import random
import statistics

STEP_S = 5.95e-3
TTFT_S = [(0, 0.0), (1, 0.082), (8, 0.122), (32, 0.417)]  # requests in one prefill → seconds
STOP_P, MAX_NEW, ROWS, SYNC_EVERY = 594 / 151_936, 512, 32, 8


def prefill_s(k: int) -> float:
    for (a, fa), (b, fb) in zip(TTFT_S, TTFT_S[1:]):
        if k <= b:
            return fa + (fb - fa) * (k - a) / (b - a)
    (a, fa), (b, fb) = TTFT_S[-2:]
    return fb + (fb - fa) / (b - a) * (k - b)


def answers(rng: random.Random, n: int) -> list[int]:
    out = []
    for _ in range(n):
        k = 1
        while k < MAX_NEW and rng.random() > STOP_P:
            k += 1
        out.append(k)
    return out


def static(requests: list[list[int]], n: int) -> tuple[float, float, int, int]:
    seconds = row_steps = steps = 0
    per = ROWS // n
    for i in range(0, len(requests), per):
        longest = max(x for r in requests[i:i + per] for x in r)
        seconds += prefill_s(per) + (longest - 1) * STEP_S
        row_steps, steps = row_steps + ROWS * longest, steps + longest
    return seconds, sum(map(sum, requests)) / row_steps, len(requests) // per, steps


def continuous(requests: list[list[int]], n: int, min_free: float, ahead: float) -> tuple[float, float, int, int]:
    """vlmfast's loop: at a harvest, free rows take answers waiting prefilled; with none waiting and the
    policy due, the next requests are prefilled: enough for the free rows, or for ``ahead`` of all rows."""
    waiting, parked, rows = list(requests), [], [0] * ROWS  # tokens still to come per row (0: free)
    seconds = steps = prefills = 0
    while waiting or parked or any(rows):
        if steps % SYNC_EVERY == 0 or not any(rows):
            free = [i for i, r in enumerate(rows) if r == 0]
            while parked and free:
                rows[free.pop()] = parked.pop(0) - 1  # (the first token came from the prefill)
            live = ROWS - len(free)
            if not parked and waiting and free and (live == 0 or len(free) >= math.ceil(min_free * ROWS)):
                k = min(len(waiting), math.ceil(max(len(free), math.ceil(ahead * ROWS)) / n))
                take, waiting = waiting[:k], waiting[k:]
                seconds, prefills = seconds + prefill_s(k), prefills + 1
                for x in (x for r in take for x in r):
                    if free:
                        rows[free.pop()] = x - 1
                    else:
                        parked.append(x)
                continue
        if any(rows):
            seconds, steps = seconds + STEP_S, steps + 1
            rows = [max(0, r - 1) for r in rows]
    return seconds, sum(map(sum, requests)) / (steps * ROWS + len([x for r in requests for x in r])), prefills, steps


def main() -> None:
    policies = {
        "static batches": None,
        "0.10: once a quarter of the rows are free": (0.25, 0.0),
        "as soon as a row is free (the CPU's)": (0.0, 0.0),
        "0.11: a set of rows' answers prefilled ahead": (0.0, 1.0),
    }
    for n, ids in ((8, 32), (4, 64), (1, 256)):
        print(f"\n{ids} requests × --n {n} in {ROWS} rows (model; medians of 16 seeds)")
        print("| policy | seconds | row utilization | prefills | decode steps |\n|---|---|---|---|---|")
        for name, knobs in policies.items():
            runs = []
            for seed in range(16):
                rng = random.Random(seed)
                requests = [answers(rng, n) for _ in range(ids)]
                runs.append(static(requests, n) if knobs is None else continuous(requests, n, *knobs))
            med = [statistics.median(r[i] for r in runs) for i in range(4)]
            print(f"| {name} | {med[0]:.2f} | {med[1]:.0%} | {med[2]:.0f} | {med[3]:,.0f} |")


if __name__ == "__main__":
    main()
