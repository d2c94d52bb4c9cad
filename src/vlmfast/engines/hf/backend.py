"""vlmfast's engine behind the :class:`~vlmfast.engines.contract.Backend` contract: the model loaded by
:func:`vlmfast.checkpoints.load.load`, an :class:`~vlmfast.engines.hf.engine.Engine` run by a
:class:`~vlmfast.engines.hf.scheduler.Scheduler`."""

from __future__ import annotations

from collections.abc import Sequence

from vlmfast.engines.contract import Switched
from vlmfast.engines.facts import EngineFacts
from vlmfast.timing import now

# measured on 2 cores with prefill in groups: decode keeps gaining up to 32 rows (benchmarks/RESULTS.md)
CPU_BATCH_SIZE = 32


class HfBackend:
    """vlmfast's own engine: the model loaded by :func:`vlmfast.checkpoints.load.load`, batches formed by cost
    and run by the scheduler (prefetch, out-of-memory halving), the compile decision after the first batch."""

    def __init__(self, options, loaded, compile_cache=None, notes: Sequence[str] = (), distributed: bool = False):
        self.options, self.compile_cache, self.distributed = options, compile_cache, distributed
        self._build(loaded)
        self.device = self.engine.device
        # --max-batch-tokens bounds the padded prompt tokens prefilled at once: vlmfast's decoder prefills a
        # batch in groups within it; plain generate prefills the whole batch, so there it bounds the batch
        self.batch_token_cap = options.max_batch_tokens if options.decoder == "hf" else None
        self.notes = list(notes) + list(loaded.notes) + ([compile_cache.note] if compile_cache is not None and compile_cache.note else [])

    @classmethod
    def around(cls, engine) -> HfBackend:
        """A backend running an engine the caller built (bench: per-step clocks, the as-saved reference),
        with no prefetch and no compile decision of its own."""
        from vlmfast.engines.hf.scheduler import Scheduler

        backend = cls.__new__(cls)
        backend.options, backend.compile_cache, backend.loaded = None, None, engine.loaded
        backend.engine, backend.scheduler = engine, Scheduler(engine)
        backend.device, backend.batch_token_cap, backend.notes, backend.distributed = engine.device, None, [], False
        backend.build_s = 0.0
        return backend

    def _build(self, loaded) -> None:
        from vlmfast.engines.hf.engine import Engine
        from vlmfast.engines.hf.scheduler import Scheduler

        o = self.options
        self.loaded, self.build_s = loaded, 0.0  # build_s: the decode loop built in ready(), counted with the load
        self.engine = Engine(loaded, o.generation, min_pixels=o.min_pixels, max_pixels=o.max_pixels, decoder=o.decoder,
                             cuda_graphs=o.cuda_graphs, compile=o.compile, compile_cache=self.compile_cache,
                             max_batch_tokens=o.max_batch_tokens, resize_rule=o.resize_rule)
        self.scheduler = Scheduler(self.engine, overlap=o.overlap)

    def context_problems(self, requests, image_sizes):
        return self.engine.context_problems(requests, image_sizes)

    def ready(self, requests, image_sizes, requested):
        """``requested``, or the largest batch whose KV cache and activations fit the GPU memory left after
        loading (a CPU: a measured default); never fewer decode rows than ``--n`` (a request's answers start
        from one prefill, in one batch), said when raised."""
        size, note = self._batch_size(requests, image_sizes, requested)
        if self.engine.decoder_name != "hf":  # built now, not inside a first batch's TTFT: reported with the load
            start = now(self.device)
            self.engine.suppress()
            self.build_s = now(self.device) - start  # after a device sync: none of it left for the first TTFT
        n = self.engine.settings.n
        if self.continuous and n <= len(requests) * n < size:  # each decode row holds a KV cache: none idle
            rows = f"{len(requests) * n} decode rows, one per answer to give (batch size {size})"
            size, note = len(requests) * n, rows if note is None else f"{note}; {rows}"
        if size >= n:
            return size, note
        raised = f"batch size {size} is below --n {n}: {n} decode rows (a request's {n} answers start from one prefill)"
        return n, raised if note is None else f"{note}; {raised}"

    def _batch_size(self, requests, image_sizes, requested):
        if requested:
            return requested, None
        if not self.engine.on_cuda:
            return CPU_BATCH_SIZE, f"batch size auto: {CPU_BATCH_SIZE} on a CPU"
        import torch

        from vlmfast.engines.bandwidth import shape_from_model
        from vlmfast.engines.hf.capacity import cuda_batch_size

        free, _ = torch.cuda.mem_get_info(torch.device(self.device))
        widest = max((self.engine.cost(r, image_sizes) for r in requests), default=0)
        shape = shape_from_model(self.loaded.model, self.loaded.runtime.dtype)
        # vision tower activations for the widest sample: ~4 patches per image token, a dozen live tensors
        vision_hidden = getattr(self.loaded.model.config.vision_config, "hidden_size", 1280)
        size, memory = cuda_batch_size(shape, free, widest, self.engine.settings.max_new_tokens,
                                       vision_bytes_per_sample=widest * 4 * vision_hidden * shape.dtype_bytes * 12,
                                       sampled=not self.engine.settings.greedy)
        return size, (f"batch size auto: {size} (free GPU memory {free / 2**30:.1f} GiB, prompts up to {widest} + "
                      f"{self.engine.settings.max_new_tokens} new tokens, {memory.total_bytes / 2**30:.1f} GiB planned "
                      "with CUDA-graph buckets, two resident decode shapes and the batch's prefill caches)")

    def plan(self, requests, image_sizes, batch_size):
        """Continuous batching (vlmfast's decoder): one round of every request, most expensive first, through
        ``batch_size`` decode rows. Static batches (``--decoder hf``, ``--batching static``): batches of
        ``batch_size`` decode rows, with n answers per request batch_size // n requests each."""
        from vlmfast.engines.hf.scheduler import plan

        self.width = max(batch_size, self.engine.settings.n)  # bench plans its own sizes
        if self.continuous:
            order = [i for batch in plan(self.engine, requests, image_sizes, len(requests) or 1) for i in batch]
            return [order] if order else []
        per_batch = max(1, batch_size // self.engine.settings.n)
        return plan(self.engine, requests, image_sizes, per_batch, self.batch_token_cap)

    @property
    def continuous(self) -> bool:
        """Continuous batching runs a process's whole share as one round; a run of several processes keeps
        static batches, whose boundaries are the collective checks that stop every process together."""
        batching = getattr(self.options, "batching", "continuous") if self.options is not None else "static"
        return self.engine.decoder_name == "vlmfast" and batching == "continuous" and not self.distributed

    def batches(self, requests, image_sizes, planned):
        if self.continuous:
            try:
                for order in planned:
                    yield self.scheduler.continuous(requests, image_sizes, order, self.width)
            finally:
                self.engine.policy.flush()
            return
        try:
            for k, parts in enumerate(self.scheduler.batches(requests, image_sizes, planned)):
                yield parts
                first = next((t for _, _, t in parts if t is not None), None)
                if k == 0 and first is not None:
                    self.engine.decide_compile(first, self.engine.planned_shapes(requests, image_sizes, planned[1:]))
        finally:
            self.engine.policy.flush()

    def facts(self) -> EngineFacts:
        from vlmfast.engines.bandwidth import shape_from_model

        loaded, engine, runtime = self.loaded, self.engine, self.loaded.runtime
        device_name = None
        if engine.on_cuda:
            import torch

            device_name = torch.cuda.get_device_name(torch.device(runtime.device))
        return EngineFacts(
            engine="hf", checkpoint=loaded.source, load_s=loaded.load_s + self.build_s, cache=loaded.cache.as_dict(),
            device=runtime.device, dtype=runtime.dtype, attn=runtime.attn, decoder=engine.decoder_name,
            cuda_graphs=engine.cuda_graphs, compiled=engine.policy.enabled, max_pixels=engine.max_pixels,
            max_pixels_capped=engine.max_pixels_capped, repetition_penalty=engine.penalty, compile_s=engine.policy.compile_s,
            oom_splits=self.scheduler.oom_splits, compile_cache=engine.policy.summary(),
            model_shape=shape_from_model(loaded.model, runtime.dtype), device_name=device_name,
            notes=self.notes + engine.notes + engine.policy.notes + engine.decode_notes()
            + ([engine.admissions] if engine.admissions else []),
        )

    def switch_to(self, found, canary: int | None = None) -> Switched:
        """Run the next checkpoint ``found`` on this backend: its weights copied into the loaded model when
        the shapes allow (CUDA graphs and compiled steps stay valid), else a full load. Returns
        ("swap" | "load", seconds, why a swap was not possible). A swap copies every tensor exactly: no
        ``canary`` check is needed."""
        from vlmfast.checkpoints.swap import plan_swap, swap_into

        plan = plan_swap(self.loaded, found.path) if found.is_local else None
        if plan is not None and plan.files is not None:
            swapped = swap_into(self.loaded, found, plan)
            # the checkpoint's own repetition penalty (its generation config's, unless --repetition-penalty)
            from vlmfast.engines.generation_config import generation_config_processors

            engine = self.engine
            penalty, said = generation_config_processors(swapped.model.generation_config, engine.decoder_name,
                                                         engine.settings.repetition_penalty, sampling=not engine.settings.greedy,
                                                         where=swapped.config_dir / "generation_config.json")
            if swapped.eos_token_ids != self.loaded.eos_token_ids or penalty != engine.penalty:
                engine.forget_shapes()  # decode states hold the EOS list and the penalty
            engine.notes = [n for n in engine.notes if n not in engine.config_notes] + said
            engine.penalty, engine.config_notes = penalty, said
            self.loaded = engine.loaded = swapped
            self.notes = list(swapped.notes)
            return Switched("swap", swapped.load_s, None)
        from vlmfast.checkpoints.load import load

        o, runtime = self.options, self.loaded.runtime
        self.close()
        self.loaded = self.engine = self.scheduler = None  # the old model goes before the new one loads
        from vlmfast.timing import free_memory

        free_memory()
        loaded = load(found, device=runtime.device, dtype=o.dtype, attn=o.attn, trust_remote_code=o.trust_remote_code,
                      allow_pickle=o.allow_pickle, base=o.base if found.kind == "adapter" else None,  # a sweep's
                      merge=o.merge)  # --base carries its LoRA adapters, not its full checkpoints
        self._build(loaded)
        self.notes = list(loaded.notes)
        return Switched("load", loaded.load_s, plan.reason if plan is not None else "not a local checkpoint")

    def news(self) -> tuple[dict, list[str]]:
        return {}, []  # nothing checked on its own: a swap is exact

    def close(self) -> None:
        if self.engine is not None:  # None after a switch whose load failed: nothing is held
            self.engine.forget_shapes()


def open_hf(options, found, loaded, dist) -> HfBackend:
    """vlmfast's engine on the located checkpoint (or an already ``loaded`` model). The compile cache is
    pointed at before the model loads."""
    from vlmfast.checkpoints.load import load
    from vlmfast.engines.hf.compile_policy import prepare_cache

    compile_cache = prepare_cache(options.decoder, options.compile)
    device, notes = _device(options, dist)
    if loaded is None:
        loaded = load(found, device=device, dtype=options.dtype, attn=options.attn,
                      trust_remote_code=options.trust_remote_code, allow_pickle=options.allow_pickle,
                      base=options.base, merge=options.merge)
    if loaded.runtime.device == "cpu" or options.threads:
        import torch

        from vlmfast.engines.hf.capacity import cpu_threads

        threads, why = cpu_threads(options.threads)
        torch.set_num_threads(threads)
        notes.append(f"CPU threads: {threads} ({why})")
    if options.decoder == "hf" and getattr(options, "batching", None) == "continuous":
        notes.append("--decoder hf: static batches (plain generate decodes a batch whole; continuous batching is "
                     "vlmfast's decode loop's)")
    if dist.world > 1 and options.decoder == "vlmfast" and getattr(options, "batching", "continuous") == "continuous":
        notes.append(f"static batches across the {dist.world} processes (each batch boundary is a check that stops "
                     "every process together); continuous batching runs in one process")
    return HfBackend(options, loaded, compile_cache, notes, distributed=dist.world > 1)


def _device(options, dist) -> tuple[str | None, list[str]]:
    """The device to load on (None: the loader's choice) and what to say: ``--device``, but with several
    processes each uses its own, not all one."""
    device = options.device
    if dist.world > 1 and device not in (None, "cpu", "auto"):
        return dist.device, [f"--device {device} ignored: each of the {dist.world} processes uses its own ({dist.device})"]
    return device or dist.device, []


def check_machine(options, dist) -> None:
    """What :func:`open_hf` would refuse on this machine, said without loading anything: for a run with
    nothing left to do (every row already in ``--out``), so that a command is refused alike whether or not
    it would load the model. The values themselves were checked with the options; here, whether this
    machine can run them: a CUDA device, flash-attn, CUDA graphs. Torch is imported only when one of them
    asks for CUDA."""
    from vlmfast.engines.hf import check_cuda_graphs

    device, _ = _device(options, dist)
    if not ((device or "auto").lower().startswith("cuda") or options.attn == "flash_attention_2" or options.cuda_graphs):
        return  # the CPU or the loader's choice: any machine runs it
    from vlmfast.checkpoints.load import detect_runtime

    runtime = detect_runtime(device, options.dtype, options.attn)
    check_cuda_graphs(options.cuda_graphs, runtime.device.startswith("cuda"))
