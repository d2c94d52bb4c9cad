"""Compilation paid once per machine, not once per run — and only where it pays.

``torch.compile`` of the decode step fuses the small kernels of norms, rotary positions and the MLP
gate, but costs tens of seconds the first time. vlmfast keeps inductor's caches in its own directory
(``VLMFAST_CACHE``, else ``$XDG_CACHE_HOME/vlmfast``, else ``~/.cache/vlmfast``), one subdirectory per
torch/transformers/vlmfast version, so a second run on the same machine reuses the compiled kernels.
Per shape key (model config, dtype, batch bucket, cache length bucket, device, versions) it records
what compiling cost and what it saved, and :func:`decide` weighs the two for the next workload.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from vlmfast.files import atomic_write, cache_root  # noqa: F401 - cache_root importable from here

# Until this machine has measured them: compile seconds of the decode step and the share of a step that
# fusion saves. CUDA, measured on an H200 with the Qwen2.5-VL-3B shape (torch 2.11, transformers 5.24):
# an `infer --compile` spent 26.1 s compiling and capturing cold and 8.2 s with inductor's cache warm
# (vlmfast 0.6; earlier H100 builds took 34–42 s cold: the cold figure keeps that margin). The compiled
# step was 36 % (batch 1) and 43 % (32) shorter than the CUDA-graph step in vlmfast 0.10
# (3.08 against 4.84 ms at batch 1; 0.6: 24–33 %): the smallest is the estimate. CPU: 2 cores, tiny model.
DEFAULT_COLD_COMPILE_S = {"cuda": 35.0, "cpu": 30.0}
DEFAULT_WARM_COMPILE_S = {"cuda": 8.2, "cpu": 6.0}
DEFAULT_GAIN = {"cuda": 0.36, "cpu": 0.2}
# On CUDA the vision blocks compile with the decode step (their norms, rotary positions and casts fused):
# measured on an H200, 3B shape, 32 × 448 px: the tower took 88.7 ms against 180.3 eager (51 % saved), and
# its two graphs compiled in 8 s on a machine whose cache had never seen them (vlmfast 0.13, torch 2.11).
VISION_GAIN = 0.5
VISION_COMPILE_S = 10.0


def _kind(device: str) -> str:
    return "cuda" if device.startswith("cuda") else "cpu"


@dataclass
class Decision:
    compile: bool
    reason: str


class CompileCache:
    """The persistent compile cache of one run: where inductor writes, what each compile cost."""

    def __init__(self, versions: dict, root: Path | None = None):
        self.root = Path(root) if root is not None else cache_root()
        tag = "-".join(f"{k}{versions[k]}" for k in ("torch", "transformers", "vlmfast") if k in versions)
        self.inductor_dir = self.root / "inductor" / hashlib.sha256(tag.encode()).hexdigest()[:12]
        self.stats_path = self.root / "compile-stats.json"
        self.versions = versions
        self.events: list[dict] = []  # one per compiled shape this run: key, seconds, hit/miss
        self._steps: dict[tuple[str, bool], list[float]] = {}  # (shape key, compiled) → decode ms per step
        self.note: str | None = None

    def activate(self) -> None:
        """Point inductor at our directory. Call it before the model loads: loading makes torch settle
        on its default directory, and some of inductor's paths are memoized at first use. A
        TORCHINDUCTOR_CACHE_DIR the user set is respected and said aloud."""
        own = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        if own and Path(own) != self.inductor_dir and not _torch_default(own):
            self.inductor_dir = Path(own)
            self.note = f"compile cache: TORCHINDUCTOR_CACHE_DIR={own} (set outside vlmfast) is used"
            return
        self.inductor_dir.mkdir(parents=True, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(self.inductor_dir)

    def key(self, model, dtype: str, batch: int, length: int, device_name: str) -> str:
        config = model.config.get_text_config().to_dict()
        config = {k: v for k, v in config.items() if k not in ("use_cache", "_name_or_path", "transformers_version")}
        blob = json.dumps([config, dtype, batch, length, device_name, self.versions], sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def measure(self, key: str, run) -> tuple[float, str]:
        """Run ``run()`` (whatever triggers the compile) and record its seconds and whether inductor
        served it from the cache. Returns (seconds, "hit" | "miss" | "partial")."""
        from torch._dynamo.utils import counters

        before = dict(counters["inductor"])
        start = time.perf_counter()
        run()
        seconds = time.perf_counter() - start
        hits = counters["inductor"]["fxgraph_cache_hit"] - before.get("fxgraph_cache_hit", 0)
        misses = counters["inductor"]["fxgraph_cache_miss"] - before.get("fxgraph_cache_miss", 0)
        status = "hit" if hits and not misses else "miss" if misses and not hits else "partial" if hits else "none"
        self.events.append({"key": key, "seconds": round(seconds, 3), "cache": status})
        self._store(key, {f"compile_s_{'warm' if status == 'hit' else 'cold'}": round(seconds, 3)})
        return seconds, status

    def observe(self, key: str, compiled: bool, step_ms: float) -> None:
        """One batch's decode time per step on shape ``key``, compiled or not (kept until :meth:`flush`)."""
        self._steps.setdefault((key, compiled), []).append(step_ms)

    def flush(self) -> None:
        """Store the median step time of each shape and mode seen this run, for the next decision."""
        import statistics

        for (key, compiled), times in self._steps.items():
            self._store(key, {"compiled_step_ms" if compiled else "eager_step_ms": round(statistics.median(times), 4)})
        self._steps.clear()

    def stats(self, key: str) -> dict:
        return self._read().get(key, {})

    def _read(self) -> dict:
        try:
            data = json.loads(self.stats_path.read_text(encoding="utf-8"))
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def _store(self, key: str, values: dict) -> None:
        try:
            data = self._read()
            data.setdefault(key, {}).update(values)
            self.stats_path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.stats_path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())
        except OSError:  # a read-only cache dir costs the next run a guess, never this run
            pass

    def summary(self) -> dict:
        """For the report: where the cache is and what each compile cost."""
        return {"dir": str(self.inductor_dir), "compiles": list(self.events)}


def _torch_default(path: str) -> bool:
    """Whether ``path`` is where torch put its cache on its own (it writes that into the environment)."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:
        return False
    return os.path.abspath(path) == os.path.abspath(default_cache_dir())


def decide(stats: dict | list[dict], *, device: str, step_ms: float, remaining_steps: int,
           vision_s: float = 0.0) -> Decision:
    """Compile the decode step when the steps still to run, times what fusion saves per step, outweigh
    what compiling costs on this machine: one compile per decode shape the rest of the run will use
    (``stats``: each shape's measurements; a shape measured before costs its measured seconds, else a
    default). The saving is judged on the first shape's measured gain, else a default. On CUDA the vision
    blocks compile too: ``vision_s``, the seconds of vision tower still to run, adds what fusing them
    saves (:data:`VISION_GAIN`) and what compiling them costs (:data:`VISION_COMPILE_S`)."""
    kind = _kind(device)
    shapes = [stats] if isinstance(stats, dict) else list(stats) or [{}]
    costs = [_compile_cost(s, kind) for s in shapes]
    cost = sum(seconds for seconds, _ in costs)
    cost_is = costs[0][1] if len(costs) == 1 else f"{len(costs)} decode shapes, each compiled anew"
    first = shapes[0]
    if first.get("eager_step_ms") and first.get("compiled_step_ms"):
        gain, gain_is = max(0.0, 1 - first["compiled_step_ms"] / first["eager_step_ms"]), "measured"
    else:
        gain, gain_is = DEFAULT_GAIN[kind], "estimate"
    saving = remaining_steps * step_ms / 1000 * gain
    saved = f"{remaining_steps} decode steps to go × {step_ms:.2f} ms × {gain:.0%} saved ({gain_is}) = {saving:.1f} s"
    if kind == "cuda" and vision_s > 0:
        saving, cost = saving + vision_s * VISION_GAIN, cost + VISION_COMPILE_S
        saved = f"{saved} + {vision_s:.1f} s of vision tower × {VISION_GAIN:.0%} (estimate) = {saving:.1f} s"
        cost_is = f"{cost_is}; the vision blocks {VISION_COMPILE_S:.0f} s"
    verdict = saving > cost
    reason = f"compile {'on' if verdict else 'off'}: {saved} {'>' if verdict else '<='} {cost:.1f} s to compile ({cost_is})"
    return Decision(verdict, reason)


def _compile_cost(stats: dict, kind: str) -> tuple[float, str]:
    """Seconds one shape's compile will take here, and how that is known."""
    if "compile_s_warm" in stats:
        return stats["compile_s_warm"], "measured, cache warm"
    if "compile_s_cold" in stats:  # compiled once here: inductor's cache is warm now
        return min(stats["compile_s_cold"], DEFAULT_WARM_COMPILE_S[kind]), "cache warm since the last compile (estimate)"
    return DEFAULT_COLD_COMPILE_S[kind], "first compile on this machine (estimate)"


def prepare_cache(decoder: str, requested: bool | None) -> CompileCache | None:
    """The persistent compile cache, pointed at before the model loads (see :meth:`CompileCache.activate`);
    None when nothing can compile (``--decoder hf``, ``--no-compile``)."""
    if decoder != "vlmfast" or requested is False:
        return None
    from vlmfast.timing import versions

    cache = CompileCache(versions())
    cache.activate()
    return cache


def quiet_cuda_home_warning() -> None:
    """Compiling on a CPU imports torch's C++ extension helper, which logs "No CUDA runtime is found, using
    CUDA_HOME=…" when a CUDA toolkit is installed without a GPU: true, and nothing to act on for a CPU run."""
    import logging

    log = logging.getLogger("torch.utils.cpp_extension")
    if not any(getattr(f, "vlmfast", False) for f in log.filters):
        def drop(record) -> bool:
            return not str(record.msg).startswith("No CUDA runtime is found")
        drop.vlmfast = True
        log.addFilter(drop)


# dynamo stops recompiling a function after 8 shapes by default, and decode has a shape per bucket; past the
# limit it would run the step uncompiled while the report says compiled, so it is told to fail instead
# (the policy then turns compiling off for the shapes still to come, said aloud)
RECOMPILE_LIMIT = 64


class CompilePolicy:
    """Whether the decode step is compiled, and what compiling cost — decided here and nowhere else.

    ``requested``: True / False (``--compile`` / ``--no-compile``), or None: off for the first batch, then
    :meth:`decide` weighs what compiling would save on the rest of the run against what it cost on this
    machine. A compile that fails switches compiling off for the run (said in :attr:`notes`).
    :attr:`compile_s` (compiling and CUDA-graph capture) is kept out of every clock of the report.
    ``compiler`` replaces ``torch.compile`` (tests run the static path uncompiled with ``lambda fn: fn``)."""

    def __init__(self, requested: bool | None, *, device: str, cache: CompileCache | None = None, compiler=None):
        self.requested = requested
        self.enabled = bool(requested)
        self.device = device
        self.cache = cache
        self.compiler = compiler
        self.compile_s = 0.0
        self.notes: list[str] = []
        self._decided = requested is not None
        self._forward = None

    def forward(self):
        """The static decode step to run: compiled once per run (one function for every shape), or as is."""
        from vlmfast.engines.hf.decode import forward_static, step_static

        if not self.enabled:
            return forward_static
        if self._forward is None:
            import torch

            if self.cache is not None:
                self.cache.activate()  # before inductor first looks for its cache directory
            config = torch._dynamo.config
            for name in ("recompile_limit", "cache_size_limit"):  # the name changed across torch versions
                if hasattr(config, name):
                    setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))
            if hasattr(config, "fail_on_recompile_limit_hit"):
                config.fail_on_recompile_limit_hit = True
            if not self.device.startswith("cuda"):
                quiet_cuda_home_warning()
            compiler = self.compiler or (lambda fn: torch.compile(fn, dynamic=False, fullgraph=False))
            self._forward = compiler(step_static)  # the forward and the token choice, one graph
        return self._forward

    def timed(self, build):
        """Run ``build()`` (capture and/or compile a decode shape), its seconds added to :attr:`compile_s`."""
        from vlmfast.timing import now

        start = now(self.device)
        try:
            return build()
        finally:
            self.compile_s += now(self.device) - start

    def build(self, key: str | None, run) -> bool:
        """Run ``run()``, which compiles when compiling is on (measured into the cache under ``key``).
        False when the compile failed: compiling is then off and the caller builds again uncompiled.
        Out-of-memory errors are not compile failures: they propagate (the scheduler halves the batch)."""
        if not self.enabled:
            run()
            return True
        try:
            if self.cache is not None and key is not None:
                self.cache.measure(key, run)
            else:
                run()
            return True
        except Exception as exc:
            from vlmfast.timing import is_out_of_memory

            if is_out_of_memory(exc):
                raise
            # a machine without a C++ compiler for inductor, an op it cannot compile: run uncompiled
            self.enabled, self._forward = False, None
            if "RecompileLimit" in type(exc).__name__:
                self.notes.append(f"more decode shapes than torch.compile's recompile limit ({RECOMPILE_LIMIT}): the "
                                  "shapes built so far stay compiled, later ones decode uncompiled")
            else:
                self.notes.append(f"torch.compile failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                                  "decoding uncompiled")
            return False

    @property
    def undecided(self) -> bool:
        return not self._decided and self.cache is not None

    def decide(self, keys: list[str], *, step_ms: float, remaining_steps: int, vision_s: float = 0.0) -> bool:
        """After the first batch (``requested`` None): compile from now on if it pays, counting one compile for
        each decode shape (``keys``) the rest of the run will build (and ``vision_s`` of vision tower still to
        run, on CUDA). True when it switched on."""
        self._decided = True
        verdict = decide([self.cache.stats(k) for k in keys], device=self.device, step_ms=step_ms,
                         remaining_steps=remaining_steps, vision_s=vision_s)
        self.notes.append(verdict.reason)
        self.enabled = verdict.compile
        return verdict.compile

    def observe(self, key: str | None, step_ms: float) -> None:
        if self.cache is not None and key is not None:
            self.cache.observe(key, self.enabled, step_ms)

    def flush(self) -> None:
        if self.cache is not None:
            self.cache.flush()  # what a step cost here, compiled or not: the next run's decision

    def summary(self) -> dict | None:
        return self.cache.summary() if self.cache is not None and self.enabled else None
