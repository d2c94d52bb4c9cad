"""Progress on long work: answers done and the current tokens/s on stderr."""

from __future__ import annotations

import sys

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from vlmfast.report.terminal import stderr


class ProgressBar:
    """Answers and tokens/s on stderr: a live bar on a terminal, one plain line per batch otherwise (CI logs
    show progress without control characters). Each :meth:`start` begins a new count (a sweep starts one
    per checkpoint); the rate is the current one, over the last ``RATE_WINDOW_S`` seconds."""

    RATE_WINDOW_S = 10.0

    def __init__(self, enabled: bool | None = None, unit: str = "answers"):
        self.enabled = True if enabled is None else enabled
        self.unit = unit
        self.live = self.enabled and stderr.is_terminal
        self._progress = None
        self._task = None
        self._done = self._total = 0
        self._title = ""
        self._recent: list[tuple[float, int]] = []  # (time, tokens so far) of recent batches

    def start(self, total: int, title: str = "") -> None:
        """A new count of ``total`` answers (requests × answers per request), under ``title`` (e.g. a step)."""
        import time

        self.stop()  # the previous count's bar goes before the next one's starts
        self._total, self._done, self._title = total, 0, title
        self._recent = [(time.perf_counter(), 0)]
        if not self.live:
            return
        self._progress = Progress(
            TextColumn(f"[bold]{escape(title) or 'generating'}"), BarColumn(), MofNCompleteColumn(),
            TextColumn(self.unit), TextColumn("{task.fields[tps]}"), TimeElapsedColumn(), TimeRemainingColumn(),
            console=stderr, transient=True,
        )
        self._progress.start()
        self._task = self._progress.add_task("generate", total=total, tps="")

    def advance(self, answers: int, new_tokens: int) -> None:
        import time

        self._done += answers
        now = time.perf_counter()
        self._recent.append((now, self._recent[-1][1] + new_tokens))
        while len(self._recent) > 2 and now - self._recent[1][0] > self.RATE_WINDOW_S:
            self._recent.pop(0)
        (t0, k0), (t1, k1) = self._recent[0], self._recent[-1]
        tps = f"{(k1 - k0) / (t1 - t0):,.1f} tokens/s" if t1 > t0 else ""
        if self._progress is not None:
            self._progress.update(self._task, advance=answers, tps=tps)
        elif self.enabled:
            title = f"{self._title}: " if self._title else ""
            print(f"progress: {title}{self._done}/{self._total} {self.unit}, {tps}{f' (last {self.RATE_WINDOW_S:g} s)' if tps else ''}",
                  file=sys.stderr, flush=True)

    def mark(self) -> None:
        """The rate counts from now (a benchmark's timed runs begin, after its load and warm-up); the count goes on."""
        import time
        self._recent = [(time.perf_counter(), self._recent[-1][1] if self._recent else 0)]

    def note(self, text: str) -> None:
        """A line above the live bar (or a plain line): a sweep names each checkpoint as it starts."""
        (self._progress.console if self._progress is not None else stderr).print(f"[yellow]note:[/yellow] {escape(text)}")

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
