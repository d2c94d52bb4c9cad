"""How the vLLM engine cuts a workload into ``LLM.generate`` calls: ``--batch-size`` counts answers, as the HF
engine and ``bench --batch-sizes`` count them, so ``--n K`` puts batch-size ÷ K requests in a chunk."""

from types import SimpleNamespace

from vlmfast.engines.rows import GenerationSettings
from vlmfast.engines.vllm.backend import VLLM_CHUNK, VllmBackend


def _backend(n: int) -> SimpleNamespace:
    return SimpleNamespace(settings=GenerationSettings(n=n, temperature=1.0 if n > 1 else 0.0), device="cpu",
                           reload=SimpleNamespace(canary_due=False))


def test_a_chunk_holds_batch_size_answers_whole_requests_at_least_one():
    requests = list(range(10))
    assert VllmBackend.plan(_backend(1), requests, {}, 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert VllmBackend.plan(_backend(4), requests, {}, 8) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert VllmBackend.plan(_backend(4), requests, {}, 2) == [[i] for i in requests]  # fewer than n: one request


def test_the_default_chunk_stays_at_its_number_of_requests_with_n_answers():
    for n in (1, 4):
        size, _ = VllmBackend.ready(_backend(n), [], {}, None)
        assert size == VLLM_CHUNK["cpu"] * n
        assert len(VllmBackend.plan(_backend(n), list(range(20)), {}, size)[0]) == VLLM_CHUNK["cpu"]


def test_a_sweep_hears_how_long_vllms_engine_took_to_start_once():
    """vLLM starts on first use, after the sweep timed the checkpoint's load: the start-up reaches the step's
    figures through the engine's news, once, beside the canary's verdict."""
    from vlmfast.engines.vllm.reload import ReloadState
    from vlmfast.report.terminal import _switches

    state = ReloadState()
    assert state.news() == ({}, [])
    state.started_s = 31.25
    assert state.news() == ({"engine_start_s": 31.25}, [])
    assert state.news() == ({}, [])  # said once
    state.started_s, state.canary_s = 2.0, 40.0
    state.notes.append("canary: same")
    assert state.news() == ({"engine_start_s": 2.0, "canary_s": 40.0}, ["canary: same"])
    line = _switches([{"load_s": 0.8, "engine_start_s": 31.25}, {"reload_s": 0.2}])
    assert line == "loaded 1× (0.8 s) · vLLM engine started 1× (31.2 s) · reloaded 1× (0.2 s)"
