import pytest

from vlmfast.engine import Engine, GenerationSettings, parse_reasoning
from vlmfast.inputs import Request

PROMPT = "What shapes are in this image? Answer briefly."


def _requests(images):
    return [Request(str(p), (str(p),), PROMPT) for p in images]


def _run(engine, requests, batch_size):
    out = {}
    for _, results, _ in engine.run(requests, {}, batch_size):
        out.update({r.id: r for r in results})
    return out


@pytest.fixture(scope="module")
def engine(loaded):
    return Engine(loaded, GenerationSettings(max_new_tokens=24))


def test_batch_1_equals_batch_n(engine, images):
    reqs = _requests(images)
    one = _run(engine, reqs, 1)
    four = _run(engine, reqs, 4)
    assert len(four) == len(reqs)
    for r in reqs:
        assert one[r.id].token_ids == four[r.id].token_ids, r.id
        assert one[r.id].text == four[r.id].text
    # the padding really differed: images of different sizes shared a batch
    assert len({one[r.id].n_prompt_tokens for r in reqs}) > 1


def test_cache_on_equals_cache_off_and_plain_hf_generate(engine, images):
    """Fidelity: vlmfast's tokens equal plain HF generate with the cache on and with it off."""
    reqs = _requests(images[:3])
    inputs = engine.preprocess(reqs)
    model = engine.loaded.model
    common = dict(max_new_tokens=24, do_sample=False, eos_token_id=engine.loaded.eos_token_ids,
                  pad_token_id=engine.loaded.pad_token_id, suppress_tokens=engine.loaded.suppress_token_ids)
    n = inputs["input_ids"].shape[1]
    hf_on = model.generate(**inputs, use_cache=True, **common)[:, n:].tolist()
    hf_off = model.generate(**inputs, use_cache=False, **common)[:, n:].tolist()
    ours = engine.generate(inputs)[:, n:].tolist()
    assert ours == hf_on == hf_off
    results = _run(engine, reqs, 3)
    eos = set(engine.loaded.eos_token_ids)
    for row, r in enumerate(reqs):
        toks = hf_on[row]
        end = next((i + 1 for i, t in enumerate(toks) if t in eos), len(toks))
        assert results[r.id].token_ids == toks[:end]


def test_results_keep_input_order_and_fields(engine, images):
    reqs = _requests(images)
    order = []
    for indices, results, timing in engine.run(reqs, {str(p): (100, 100) for p in images}, 4):
        assert [reqs[i].id for i in indices] == [r.id for r in results]
        order.extend(indices)
        assert timing.size == len(results) and timing.ttft_s > 0 and timing.decode_s > 0
    assert sorted(order) == list(range(len(reqs)))


def test_ignore_eos_forces_length_and_placeholders_are_never_emitted(loaded, images):
    engine = Engine(loaded, GenerationSettings(max_new_tokens=40, ignore_eos=True))
    results = _run(engine, _requests(images[:4]), 4)
    for r in results.values():
        assert r.n_new_tokens == 40 and r.finish_reason == "length"
        assert not set(r.token_ids) & set(loaded.suppress_token_ids)
        assert r.n_image_tokens > 0 and r.n_prompt_tokens > r.n_image_tokens


def test_eos_stops_and_is_counted(loaded, images):
    eos = loaded.eos_token_ids[0]
    engine = Engine(loaded, GenerationSettings(max_new_tokens=30))
    # Make EOS the best token from the 3rd step on, through the real generate path.
    from transformers import LogitsProcessor

    class ForceEos(LogitsProcessor):
        def __call__(self, input_ids, scores):
            if input_ids.shape[1] - n >= 2:
                scores[:, eos] = scores.max() + 10
            return scores

    inputs = engine.preprocess(_requests(images[:2]))
    n = inputs["input_ids"].shape[1]
    out = engine.loaded.model.generate(**inputs, **engine.generate_kwargs, logits_processor=[ForceEos()])
    assert out.shape[1] - n == 3  # stopped right after the EOS
    result = engine._result(_requests(images[:1])[0], inputs, 0, out[0, n:].tolist())
    assert (result.finish_reason, result.n_new_tokens, result.token_ids[-1]) == ("eos", 3, eos)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("<think>two boxes</think><answer>2</answer>", ("two boxes", "2")),
        ("<think> a\nb </think>\n<answer>\n red \n</answer> trailing", ("a\nb", "red")),
        ("<think>no answer here</think> so 3", ("no answer here", None)),
        ("<think>cut off mid thou", ("cut off mid thou", None)),
        ("<answer>unclosed", (None, None)),
        ("plain text", (None, None)),
        ("reasoning first</think><answer>x</answer>", ("reasoning first", "x")),
        ("<answer>a</answer><answer>b</answer>", (None, "a")),
    ],
)
def test_parse_reasoning(text, expected):
    assert parse_reasoning(text) == expected


def test_overlapped_preprocessing_gives_the_same_tokens(loaded, images):
    reqs = _requests(images)
    settings = GenerationSettings(max_new_tokens=12)
    inline = Engine(loaded, settings, overlap=False)
    overlapped = Engine(loaded, settings, overlap=True)
    a = {r.id: r.token_ids for _, rs, _ in inline.run(reqs, {}, 2) for r in rs}
    b = {}
    for k, (_, rs, timing) in enumerate(overlapped.run(reqs, {}, 2)):
        b.update({r.id: r.token_ids for r in rs})
        assert 0 <= timing.preprocess_exposed_s <= timing.preprocess_s
        assert k > 0 or timing.preprocess_exposed_s > 0  # nothing to hide the first batch behind
    assert a == b and len(a) == len(reqs)


def test_static_cache_and_compile_give_the_same_tokens(loaded, images):
    """--compile: a static KV cache, bucketed prompt lengths and torch.compile of the decode step —
    the tokens must not change. Compiling on a CPU takes ~20 s, once per shape: one small batch."""
    reqs = _requests(images[:2])
    settings = GenerationSettings(max_new_tokens=6, ignore_eos=True)
    eager = Engine(loaded, settings, overlap=False)
    compiled = Engine(loaded, settings, overlap=False, compile=True)
    inputs = compiled.preprocess(reqs)
    assert inputs["input_ids"].shape[1] % 64 == 0  # bucketed length
    seconds, did_compile = compiled.warm_up(reqs)
    assert did_compile and seconds > 0
    a = {r.id: r.token_ids for _, rs, _ in eager.run(reqs, {}, 2) for r in rs}
    b = {r.id: r.token_ids for _, rs, _ in compiled.run(reqs, {}, 2) for r in rs}
    assert a == b and all(len(t) == 6 for t in a.values())


def test_impossible_pixel_limits_are_a_usage_error(loaded):
    from vlmfast.errors import UsageError

    with pytest.raises(UsageError, match="need 0 < min <= max"):
        Engine(loaded, GenerationSettings(), max_pixels=0)
    with pytest.raises(UsageError):
        Engine(loaded, GenerationSettings(), min_pixels=10_000, max_pixels=5_000)
