import pytest

from vlmfast.timing import percentile


def test_percentile_linear_interpolation_like_numpy():
    xs = [10.0, 1.0, 4.0, 3.0]
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 10.0
    assert percentile(xs, 50) == 3.5
    assert percentile(xs, 90) == pytest.approx(8.2)
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile(xs, 101)
