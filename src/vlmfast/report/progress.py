"""Progress on long work: answers done and the current tokens/s on stderr."""

from __future__ import annotations

import sys

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from vlmfast.report.terminal import stderr


class ProgressBar:
    """Answers and tokens/s on stderr: a live bar on a terminal; otherwise (a CI log, ``nohup``, ``| tee``) plain
    lines without control characters, one for the first answers, then at most one every ``PLAIN_EVERY_S``
    seconds (30), and always one for the count's last answer. Each :meth:`start` begins a new count (a sweep
    starts one per checkpoint). The rate is the current one, over the batches of about the last
    ``RATE_WINDOW_S`` seconds (the last two batches at least: a batch of 60 s gives a window of 60 s); a plain
    line names the window it was measured over. ``clock``: seconds, ``time.perf_counter`` unless given."""

    RATE_WINDOW_S = 10.0
    PLAIN_EVERY_S = 30.0
    MIN_WINDOW_S = 0.1

    def __init__(self, enabled: bool | None = None, unit: str = "answers", clock=None):
        import time

        self.enabled = True if enabled is None else enabled
        self.unit = unit
        self.live = self.enabled and stderr.is_terminal
        self.clock = clock if clock is not None else time.perf_counter
        self._progress = None
        self._task = None
        self._done = self._total = 0
        self._title = ""
        self._recent: list[tuple[float, int]] = []  # (time, tokens so far) of recent batches
        self._printed: float | None = None  # when the count's last plain line was printed (None: none yet)

    def start(self, total: int, title: str = "") -> None:
        """A new count of ``total`` answers (requests × answers per request), under ``title`` (e.g. a step)."""
        self.stop()  # the previous count's bar goes before the next one's starts
        self._total, self._done, self._title = total, 0, title
        self._recent = [(self.clock(), 0)]
        self._printed = None
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
        self._done += answers
        now = self.clock()
        self._recent.append((now, self._recent[-1][1] + new_tokens))
        while len(self._recent) > 2 and now - self._recent[1][0] > self.RATE_WINDOW_S:
            self._recent.pop(0)
        (t0, k0), (t1, k1) = self._recent[0], self._recent[-1]
        # no rate over less than MIN_WINDOW_S (error rows of --skip-bad come first, microseconds apart)
        tps = f"{(k1 - k0) / (t1 - t0):,.1f} tokens/s" if t1 - t0 >= self.MIN_WINDOW_S else ""
        if self._progress is not None:
            self._progress.update(self._task, advance=answers, tps=tps)
            return
        last = self._done >= self._total
        if not self.enabled or not (last or self._printed is None or now - self._printed >= self.PLAIN_EVERY_S):
            return
        self._printed = now
        title = f"{self._title}: " if self._title else ""
        rate = f", {tps} over the last {_seconds(t1 - t0)} s" if tps else ""
        print(f"progress: {title}{self._done}/{self._total} {self.unit}{rate}", file=sys.stderr, flush=True)

    def mark(self) -> None:
        """The rate counts from now (a benchmark's timed runs begin, after its load and warm-up); the count goes on."""
        self._recent = [(self.clock(), self._recent[-1][1] if self._recent else 0)]

    def note(self, text: str) -> None:
        """A line above the live bar (or a plain line): a sweep names each checkpoint as it starts."""
        (self._progress.console if self._progress is not None else stderr).print(f"[yellow]note:[/yellow] {escape(text)}")

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def _seconds(span: float) -> str:
    """A window's length for a line: whole seconds from 10 s, tenths below (0.1 … 9.9)."""
    return f"{span:.0f}" if span >= 10 else f"{span:.1f}"
