"""Every family's static decode step attending by two matrix products (the compiled default on CUDA) keeps
the eager loop's greedy tokens: float32 on the CPU, the step run as the compiled one runs it (over the whole
cache under a mask), with the compiler left out so that each family costs seconds, not a compile."""

import dataclasses

import pytest

from vlmfast.checkpoints.families import BY_KEY
from vlmfast.engines.hf.engine import Engine
from vlmfast.engines.hf.scheduler import Scheduler
from vlmfast.engines.rows import GenerationSettings
from vlmfast.inputs.requests import Request


def _has_class(key: str) -> bool:
    import transformers

    return hasattr(transformers, BY_KEY[key].model_class)


FAMILIES = [pytest.param(k, marks=pytest.mark.skipif(not _has_class(k), reason="not in this transformers"))
            for k in BY_KEY]


def _tokens(engine, requests) -> dict[str, list[int]]:
    return {r.id: r.token_ids for _, results, _ in Scheduler(engine).run(requests, {}, len(requests)) for r in results}


@pytest.mark.parametrize("key", FAMILIES)
def test_each_familys_static_step_attending_by_two_products_gives_the_eager_tokens(key, family_ckpts, images,
                                                                                   monkeypatch):
    from vlmfast.checkpoints.load import load
    from vlmfast.engines.hf.text_decoder import PRODUCTS_DECODE_ATTENTION

    loaded = load(str(family_ckpts(key)), device="cpu")
    requests = [Request(str(p), (str(p),), "What shapes are in this image?") for p in images[:3]]
    # rows of different prompt lengths: the mask and each row's filled keys differ
    requests[1] = dataclasses.replace(requests[1], prompt="Name every colour in this picture, then count the shapes.")
    settings = GenerationSettings(max_new_tokens=10, ignore_eos=True)
    eager = _tokens(Engine(loaded, settings), requests)
    monkeypatch.setenv("VLMFAST_DECODE_ATTENTION", "products")
    static = Engine(loaded, settings, compile=True, compiler=lambda fn: fn)
    if not static.policy.enabled:  # a family whose decode has no static step (MoE expert dispatch, some versions)
        pytest.skip("; ".join(static.notes))
    got = _tokens(static, requests)
    assert [s.attention for s in static._static.values()] == [PRODUCTS_DECODE_ATTENTION]
    assert got == eager
