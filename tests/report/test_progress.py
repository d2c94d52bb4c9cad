"""The progress bar's plain lines (stderr not a terminal: a CI log, nohup, a pipe), on a scripted clock."""

from __future__ import annotations

from vlmfast.report.progress import ProgressBar


def _plain(times: list[float]) -> ProgressBar:
    bar = ProgressBar(enabled=True)
    bar.live = False  # plain lines, as in a CI log
    bar.clock = iter(times).__next__
    return bar


def _lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("progress:")]


def test_plain_lines_come_at_most_every_30_s_and_for_the_last_answer(capsys):
    """Ten answers of 10 tokens each: a line for the first, then one when 30 s have passed since the last line
    printed (at 31 s and at 62 s), and one for the tenth answer, however soon it comes."""
    times = [0.0, 1.0, 5.0, 20.0, 31.0, 40.0, 62.0, 70.0, 75.0, 80.0, 200.0]  # start, then one answer each
    bar = _plain(times)
    bar.start(10, title="step 100")
    for _ in times[1:]:
        bar.advance(1, 10)
    assert _lines(capsys) == [
        "progress: step 100: 1/10 answers, 10.0 tokens/s over the last 1.0 s",
        "progress: step 100: 4/10 answers, 0.9 tokens/s over the last 11 s",  # 20 s → 31 s: the batches of the last ~10 s
        "progress: step 100: 6/10 answers, 0.5 tokens/s over the last 22 s",  # one batch of 22 s: a window of 22 s
        "progress: step 100: 10/10 answers, 0.1 tokens/s over the last 120 s",  # the last answer: always said
    ]


def test_many_quick_batches_print_two_lines_not_one_per_batch(capsys):
    """500 batches in 20 s (a 10,000-request run printed one line per batch): the first and the last."""
    times = [0.0] + [0.04 * (k + 1) for k in range(500)]
    bar = _plain(times)
    bar.start(500 * 32)
    for _ in range(500):
        bar.advance(32, 32 * 20)
    lines = _lines(capsys)
    assert [line.split(",")[0] for line in lines] == ["progress: 32/16000 answers", "progress: 16000/16000 answers"]
    assert lines[-1].endswith("tokens/s over the last 10 s")


def test_each_count_starts_its_own_lines_and_a_disabled_bar_prints_none(capsys):
    """A sweep's next checkpoint starts a new count: its first answer is said again, not held back by the
    previous count's last line; a bar off (another process than the main one) says nothing."""
    bar = _plain([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    bar.start(2)
    bar.advance(1, 5)
    bar.start(2)
    bar.advance(1, 5)
    bar.advance(1, 5)
    assert [line.split(",")[0] for line in _lines(capsys)] == ["progress: 1/2 answers", "progress: 1/2 answers",
                                                               "progress: 2/2 answers"]
    off = ProgressBar(enabled=False)
    off.clock = iter([0.0, 1.0, 2.0]).__next__
    off.start(2)
    off.advance(1, 5)
    off.advance(1, 5)
    assert _lines(capsys) == []


def test_no_rate_is_given_over_a_window_too_short_to_measure(capsys):
    """--skip-bad's error rows come first, microseconds apart: no rate over 20 µs (it read "0.0 tokens/s over
    the last 2e-05 s"), and a window under 10 s is said in tenths."""
    bar = _plain([0.0, 2e-05, 2.54])
    bar.start(3)
    bar.advance(1, 0)
    bar.advance(2, 20)
    assert _lines(capsys) == ["progress: 1/3 answers", "progress: 3/3 answers, 7.9 tokens/s over the last 2.5 s"]
