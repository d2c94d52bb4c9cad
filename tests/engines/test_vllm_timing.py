"""The timing of a chunk vLLM generated, from its per-request stats: a greedy ``--n`` answer vLLM decoded once
and vlmfast copied to the request's other rows counts its tokens once."""

from types import SimpleNamespace

from vlmfast.engines.rows import SampleResult
from vlmfast.engines.vllm.support import chunk_timing


def _row(sample: int, copied: bool) -> SampleResult:
    return SampleResult(id="a", images=[], prompt="p", n_new_tokens=5, sample=sample, token_ids=[1] * 5, copied=copied)


def test_copied_greedy_rows_are_not_counted_as_decoded():
    metrics = [SimpleNamespace(queued_ts=1.0, first_token_ts=1.5, last_token_ts=2.0, arrival_time=0.0)]
    rows = [_row(0, False), _row(1, True), _row(2, True)]  # greedy --n 3: one decode, two copies
    timing = chunk_timing(metrics, rows, 0.5, 0.9, 2.1, 0.0)
    assert timing.new_tokens == 5
    assert timing.size == 3  # every row is still delivered
    assert (timing.ttft_s, timing.decode_s) == (0.5, 0.5)
