"""The engine's phases and its own decode loop, held to plain HF ``generate``: identical greedy tokens."""

import dataclasses
import itertools

import pytest

from conftest import generate_tokens, model_inputs

from vlmfast.engines.hf.engine import Engine
from vlmfast.engines.rows import GenerationSettings, parse_reasoning
from vlmfast.inputs.requests import Request
from vlmfast.engines.hf.scheduler import Scheduler

PROMPT = "What shapes are in this image? Answer briefly."


def _requests(images):
    return [Request(str(p), (str(p),), PROMPT) for p in images]


def _run(engine, requests, batch_size):
    out = {}
    for _, results, _ in Scheduler(engine).run(requests, {}, batch_size):
        out.update({r.id: r for r in results})
    return out


def _cut(tokens, eos):
    end = next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))
    return tokens[:end]


@pytest.fixture(scope="module")
def engine(loaded):
    return Engine(loaded, GenerationSettings(max_new_tokens=24))


def test_phases_give_plain_generate_tokens_for_batch_1_and_n(engine, images):
    reqs = _requests(images)
    one, four = _run(engine, reqs, 1), _run(engine, reqs, 4)
    inputs = model_inputs(engine, reqs)
    reference = generate_tokens(engine.loaded, inputs, 24, engine.loaded.eos_token_ids)
    for row, r in enumerate(reqs):
        assert one[r.id].token_ids == four[r.id].token_ids == reference[row], r.id
        assert one[r.id].text == four[r.id].text
    assert len({one[r.id].n_prompt_tokens for r in reqs}) > 1  # images of different sizes: left padding in play


def test_hf_decoder_is_plain_generate_with_the_cache_on_and_off(loaded, images):
    import torch

    reqs = _requests(images[:3])
    hf = Engine(loaded, GenerationSettings(max_new_tokens=24), decoder="hf")
    inputs = model_inputs(hf, reqs)
    n = inputs["input_ids"].shape[1]
    common = dict(max_new_tokens=24, do_sample=False, eos_token_id=loaded.eos_token_ids,
                  pad_token_id=loaded.pad_token_id, suppress_tokens=loaded.suppress_token_ids)
    with torch.inference_mode():
        off = loaded.model.generate(**inputs, use_cache=False, **common)[:, n:].tolist()
    ours = _run(hf, reqs, 3)
    vlm = _run(Engine(loaded, GenerationSettings(max_new_tokens=24)), reqs, 3)
    for row, r in enumerate(reqs):
        assert ours[r.id].token_ids == vlm[r.id].token_ids == _cut(off[row], loaded.eos_token_ids)


def _eos_ending_rows_apart(tokens: list[list[int]]) -> list[int]:
    """Two token ids that, taken as the EOS list, end the rows at different steps, none at the first."""
    for a, b in itertools.combinations(sorted({t for row in tokens for t in row[1:]}), 2):
        ends = [next((i for i, t in enumerate(row) if t in (a, b)), None) for row in tokens]
        if all(e is not None and e > 0 for e in ends[:2]) and len(set(ends)) >= 3:
            return [a, b]
    raise AssertionError("no token pair ends the rows at different steps")


def test_rows_ending_at_different_steps_match_generate(loaded, images):
    reqs = _requests(images[:4])
    long = Engine(loaded, GenerationSettings(max_new_tokens=20, ignore_eos=True))
    tokens = [long_run.token_ids for long_run in _run(long, reqs, 4).values()]
    eos = _eos_ending_rows_apart(tokens)
    stopping = dataclasses.replace(loaded, eos_token_ids=eos)
    engine = Engine(stopping, GenerationSettings(max_new_tokens=20), sync_every=1)
    results = _run(engine, reqs, 4)
    reference = generate_tokens(stopping, model_inputs(engine, reqs), 20, eos)
    lengths = []
    for row, r in enumerate(reqs):
        assert results[r.id].token_ids == reference[row], r.id
        assert results[r.id].finish_reason == ("eos" if reference[row][-1] in eos else "length")
        lengths.append(results[r.id].n_new_tokens)
    assert len(set(lengths)) >= 2 and min(lengths) < 20  # rows really ended apart, and early


def test_suppressed_tokens_are_never_emitted_and_match_generate(loaded, images):
    reqs = _requests(images[:3])
    free = Engine(dataclasses.replace(loaded, suppress_token_ids=[]), GenerationSettings(max_new_tokens=12, ignore_eos=True))
    emitted = [t for r in _run(free, reqs, 3).values() for t in r.token_ids]
    banned = sorted(set(emitted), key=emitted.count)[-1]  # the most frequent token, suppressed from now on
    held = dataclasses.replace(loaded, suppress_token_ids=[banned, *loaded.suppress_token_ids])
    engine = Engine(held, GenerationSettings(max_new_tokens=12, ignore_eos=True))
    results = _run(engine, reqs, 3)
    reference = generate_tokens(held, model_inputs(engine, reqs), 12, [])
    for row, r in enumerate(reqs):
        assert banned not in results[r.id].token_ids and not set(results[r.id].token_ids) & set(loaded.suppress_token_ids)
        assert results[r.id].token_ids == reference[row]


def test_static_shapes_give_the_eager_tokens(loaded, images):
    """The path CUDA graphs and torch.compile use (whole cache + mask, device-side positions and write
    index, spare batch rows) must not change a token; here without compiling, on the CPU."""
    reqs = _requests(images[:3])
    settings = GenerationSettings(max_new_tokens=16)
    eager = _run(Engine(loaded, settings), reqs, 3)
    static = Engine(loaded, settings, compile=True, compiler=lambda fn: fn)  # static shapes, not compiled
    results = _run(static, reqs, 3)
    assert {k: v.token_ids for k, v in results.items()} == {k: v.token_ids for k, v in eager.items()}
    assert static._static and all(state.static for state in static._static.values())


def test_seeded_sampling_is_reproducible(loaded, images):
    reqs = _requests(images[:3])

    def sample(seed):
        return {k: v.token_ids for k, v in _run(Engine(loaded, GenerationSettings(
            max_new_tokens=12, temperature=0.9, top_p=0.95, seed=seed, ignore_eos=True)), reqs, 3).items()}

    first, again, other = sample(7), sample(7), sample(8)
    assert first == again and first != other


def test_decode_reads_back_at_most_once_every_k_steps(loaded, images):
    from vlmfast.engines.hf.decode import run_loop

    reqs = _requests(images[:2])
    timing = next(iter(Scheduler(Engine(loaded, GenerationSettings(max_new_tokens=20), sync_every=4)).run(reqs, {}, 2)))[2]
    assert 0 < timing.syncs <= -(-timing.steps // 4)

    class Counting:  # a loop that never ends by EOS: how often is the device asked?
        max_new, t, asked, row_steps = 17, 1, 0, 0

        def live(self):
            return 1

        def harvest(self):
            self.asked += 1
            return [(0, [7] * self.t)] if self.t == self.max_new else []

        def pack(self):
            pass

        def step(self):
            self.t += 1

    loop = Counting()
    decoded = run_loop(loop, stop_on_eos=True, sync_every=4)
    # at t = 4, 8, 12, 16, and the final collection of the rows still held
    assert (decoded.steps, decoded.syncs, loop.asked) == (17, 4, 5)
    assert run_loop(Counting(), stop_on_eos=False, sync_every=1).syncs == 0  # --ignore-eos: never


def test_results_keep_input_order_fields_and_phase_timings(engine, images):
    reqs = _requests(images)
    order = []
    for indices, results, timing in Scheduler(engine).run(reqs, {str(p): (100, 100) for p in images}, 4):
        assert [reqs[i].id for i in indices] == [r.id for r in results]
        order.extend(indices)
        assert timing.size == len(results) and timing.ttft_s > 0 and timing.decode_s > 0
        assert 0 < timing.vision_s < timing.ttft_s  # the vision tower is part of prefill
        assert timing.cache_fill_s > 0  # the prefill caches copied into the decode rows, timed on their own
        assert all(r.model_image_sizes and r.model_image_sizes[0][0] % 28 == 0 for r in results)
    assert sorted(order) == list(range(len(reqs)))


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
    inline = {r.id: r.token_ids for _, rs, _ in Scheduler(Engine(loaded, settings), overlap=False).run(reqs, {}, 2) for r in rs}
    overlapped = {}
    for k, (_, rs, timing) in enumerate(Scheduler(Engine(loaded, settings), overlap=True).run(reqs, {}, 2)):
        overlapped.update({r.id: r.token_ids for r in rs})
        assert 0 <= timing.preprocess_exposed_s <= timing.preprocess_s
        assert k > 0 or timing.preprocess_exposed_s > 0  # nothing to hide the first batch behind
    assert inline == overlapped and len(inline) == len(reqs)


def test_impossible_settings_are_usage_errors(loaded):
    from vlmfast.errors import UsageError

    with pytest.raises(UsageError, match="need 0 < min <= max"):
        Engine(loaded, GenerationSettings(), max_pixels=0)
    with pytest.raises(UsageError):
        Engine(loaded, GenerationSettings(), min_pixels=10_000, max_pixels=5_000)
    with pytest.raises(UsageError, match="plain generate"):
        Engine(loaded, GenerationSettings(), decoder="hf", compile=True)
    with pytest.raises(UsageError, match="unknown"):
        Engine(loaded, GenerationSettings(), decoder="fast")
    # a temperature whose division overflows the scores sampled token 0 at every step, silently
    for temperature, said in ((1e-40, "below 1e-05 the scores divided by it overflow"), (float("nan"), "finite"),
                              (float("inf"), "finite"), (-0.5, "expected 0")):
        with pytest.raises(UsageError, match=said):
            GenerationSettings(temperature=temperature)
    assert GenerationSettings(temperature=1e-5).temperature == 1e-5
    with pytest.raises(UsageError, match="expected a finite number above 0"):
        GenerationSettings(repetition_penalty=float("inf"))


def test_decode_attention_is_sdpa_whatever_the_model_loaded_with(grpo_ckpt, images):
    """A model loaded with eager attention (or flash-attn, on CUDA) decodes through vlmfast's sdpa decode
    attention with the loop's mask — counted, per layer and step; the loaded setting is restored, and the
    tokens are generate's."""
    from transformers import AttentionInterface

    from vlmfast.engines.hf import decode
    from vlmfast.checkpoints.load import load

    calls = []

    def counting(*args, **kwargs):
        calls.append(1)
        return decode.decode_attention(*args, **kwargs)

    eager = load(str(grpo_ckpt), device="cpu", attn="eager")
    reqs = _requests(images[:3])
    engine = Engine(eager, GenerationSettings(max_new_tokens=16, ignore_eos=True))
    AttentionInterface.register(decode.DECODE_ATTENTION, counting)
    try:
        results = _run(engine, reqs, 3)
    finally:
        AttentionInterface.register(decode.DECODE_ATTENTION, decode.decode_attention)
    layers = len(engine._decoder().layers)
    assert len(calls) == layers * 15  # every layer of every step after the first token (prefill's is HF's own)
    assert engine._decoder().attention_config._attn_implementation == "eager"
    reference = generate_tokens(eager, model_inputs(engine, reqs), 16, [])
    assert [results[r.id].token_ids for r in reqs] == reference


def test_prefill_in_groups_decodes_the_batch_as_one(loaded, images):
    """Rows prefilled in several groups (a small token budget) and decoded together give the tokens
    of one whole-batch prefill, and of plain generate."""
    reqs = _requests(images)
    settings = GenerationSettings(max_new_tokens=16)
    whole = Engine(loaded, settings, max_batch_tokens=10_000)
    split = Engine(loaded, settings, max_batch_tokens=40)  # a few rows per group
    ordered = sorted(reqs, key=lambda r: -split.cost(r))  # a batch comes most expensive first
    assert len(split.prepare(ordered).groups) >= 3 and len(whole.prepare(ordered).groups) == 1
    a, b = _run(whole, ordered, 6), _run(split, ordered, 6)
    reference = generate_tokens(loaded, model_inputs(whole, ordered), 16, loaded.eos_token_ids)
    assert [b[r.id].token_ids for r in ordered] == [a[r.id].token_ids for r in ordered] == reference
    assert [b[r.id].n_prompt_tokens for r in ordered] == [a[r.id].n_prompt_tokens for r in ordered]


def test_n_answers_per_request_share_one_prefill(loaded, images):
    """--n: the prompt goes through the model (vision tower included) once; its cache serves n decode rows.
    Greedy answers are all the one-answer tokens; sampled ones differ across samples and repeat with a seed."""
    reqs = _requests(images[:3])
    one = _run(Engine(loaded, GenerationSettings(max_new_tokens=12)), reqs, 3)
    vision_calls = []
    handle = loaded.model.model.visual.register_forward_hook(lambda *_: vision_calls.append(1))
    try:
        greedy = Engine(loaded, GenerationSettings(max_new_tokens=12, n=3))
        rows = [r for _, rs, _ in Scheduler(greedy).run(reqs, {}, 3) for r in rs]
    finally:
        handle.remove()
    assert len(vision_calls) == 1 and len(rows) == 9  # one prefill for 3 requests × 3 answers
    assert [(r.id, r.sample) for r in rows] == [(q.id, k) for q in reqs for k in range(3)]
    assert all(r.token_ids == one[r.id].token_ids for r in rows)

    def sample(seed):
        engine = Engine(loaded, GenerationSettings(max_new_tokens=12, temperature=1.0, n=4, seed=seed, ignore_eos=True))
        return [(r.id, r.sample, tuple(r.token_ids)) for _, rs, _ in Scheduler(engine).run(reqs, {}, 3) for r in rs]

    first = sample(5)
    assert first == sample(5) and first != sample(6)
    per_request = {}
    for rid, _, tokens in first:
        per_request.setdefault(rid, set()).add(tokens)
    assert all(len(answers) > 1 for answers in per_request.values())  # the samples are not copies of one another


def test_n_answers_through_plain_generate_too(loaded, images):
    reqs = _requests(images[:2])
    engine = Engine(loaded, GenerationSettings(max_new_tokens=8, temperature=1.0, n=3, seed=1), decoder="hf")
    rows = [r for _, rs, _ in Scheduler(engine).run(reqs, {}, 2) for r in rs]
    assert [(r.id, r.sample) for r in rows] == [(q.id, k) for q in reqs for k in range(3)]
    assert all(r.n_new_tokens >= 1 and r.error is None for r in rows)


def test_plain_generate_draws_by_the_seed_rule(loaded, images):
    """``--decoder hf`` samples each answer from its own key (seed, request id, sample), as vlmfast's loop
    does: the same answers whatever the batch, and the same as the loop's for the same request."""
    reqs = _requests(images[:3])
    settings = GenerationSettings(max_new_tokens=10, temperature=1.0, top_p=0.9, n=2, seed=3, ignore_eos=True)

    def answers(decoder, batch_size):
        engine = Engine(loaded, settings, decoder=decoder)
        return {(r.id, r.sample): r.token_ids for _, rs, _ in Scheduler(engine).run(reqs, {}, batch_size) for r in rs}

    by_three, by_one = answers("hf", 3), answers("hf", 1)
    assert by_three == by_one
    assert len(set(map(tuple, by_three.values()))) > 3  # draws, not copies of one answer
    assert by_three == answers("vlmfast", 3)


def test_a_used_decode_shape_is_kept_over_one_unused_since_longer(loaded, monkeypatch):
    """Eviction is least-recently-used: a hit refreshes a shape, so the shape evicted is the one unused
    the longest, not the one built first."""
    from vlmfast.engines.hf.capacity import RESIDENT_SHAPES
    from vlmfast.engines.hf.engine import Engine, GenerationSettings

    released = []

    class Built:
        def __init__(self, shape):
            self.shape = shape

        def release(self):
            released.append(self.shape)

    engine = Engine(loaded, GenerationSettings(max_new_tokens=4))
    monkeypatch.setattr(engine, "_build_static", Built)
    resident = RESIDENT_SHAPES["cpu"]
    shapes = [(1, 256 * (k + 1)) for k in range(resident + 1)]
    for shape in [*shapes[:resident], shapes[0], shapes[resident]]:  # fill, use the first again, one more
        engine.last_shape = shape
        assert engine._static_state().shape == shape
    assert released == [shapes[1]] and shapes[0] in engine._static


def test_a_static_step_attends_to_the_filled_keys_only_and_tokens_do_not_change(loaded, images, monkeypatch):
    """Uncompiled static shapes (CUDA graphs' path; here without graphs) attend to the filled keys rounded up
    to ATTEND_STEP, not to the whole cache: the attended length grows with the answer, and the tokens are
    the eager loop's (which attends to exactly the filled keys). A small step makes every batch cross several."""
    from vlmfast.engines.hf import decode

    monkeypatch.setattr(decode, "ATTEND_STEP", 16)
    seen = []
    body = decode.DecodeState._body
    monkeypatch.setattr(decode.DecodeState, "_body", lambda self: seen.append(self.cache.attend) or body(self))
    reqs = _requests(images[:3])
    settings = GenerationSettings(max_new_tokens=40, ignore_eos=True)
    eager = _run(Engine(loaded, settings), reqs, 3)
    seen.clear()
    static = Engine(loaded, settings, compile=True)
    static.policy.forward = lambda: decode.forward_static  # the step CUDA graphs capture, run as it is
    assert {k: v.token_ids for k, v in _run(static, reqs, 3).items()} == {k: v.token_ids for k, v in eager.items()}
    state = next(iter(static._static.values()))
    warm_up, *attended = seen
    assert warm_up == state.max_len  # building the shape runs one step over the whole cache
    assert len(set(attended)) >= 3 and attended == sorted(attended)  # grows with the answer, never shrinks
    assert max(attended) < state.max_len and all(a % 16 == 0 for a in attended)


def _attention_reference(q, k, v, mask, scaling):
    """Attention in float64 with every key/value head repeated for its query heads (as transformers'
    ``repeat_kv``): no head grouping shared with the code under test."""
    import torch

    groups = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(groups, dim=1) for t in (k, v))
    scores = q.double() @ k.transpose(-1, -2) * scaling + mask.double()
    return (torch.softmax(scores, -1) @ v).transpose(1, 2)


@pytest.mark.parametrize("q_len", [1, 3])
def test_products_decode_attention_against_an_independent_reference(q_len):
    """The two-product attention a static step may take (float32 here) equals attention with repeated key/value
    heads, for query heads grouped over fewer key/value heads and each row's padding and unwritten keys
    masked (for one new token and for several); so does SDPA's (decode_attention); a masked key changes nothing."""
    import torch

    from vlmfast.engines.hf.text_decoder import decode_attention, products_decode_attention

    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 8, q_len, 16, generator=g)
    k, v = torch.randn(3, 2, 40, 16, generator=g), torch.randn(3, 2, 40, 16, generator=g)
    index = torch.arange(40)
    seen = (index >= torch.tensor([0, 3, 5])[:, None]) & (index <= torch.tensor([39, 20, 9])[:, None])
    mask = torch.zeros(seen.shape).masked_fill_(~seen, torch.finfo(torch.float32).min)[:, None, None, :]
    want = _attention_reference(q, k, v, mask, 0.25).float()
    got, _ = products_decode_attention(None, q, k, v, mask, scaling=0.25)
    assert got.shape == want.shape == (3, q_len, 8, 16)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if q_len == 1:  # SDPA's path packs the grouped heads for one new token only
        torch.testing.assert_close(decode_attention(None, q, k, v, mask, scaling=0.25)[0], want, rtol=1e-5, atol=1e-5)
    k[1, :, 21:] = 1e3  # keys row 1 must not see change nothing
    torch.testing.assert_close(products_decode_attention(None, q, k, v, mask, scaling=0.25)[0][1], want[1],
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(products_decode_attention(None, q, k, v, mask)[0],  # scale 1/sqrt(head dim) by default
                               _attention_reference(q, k, v, mask, 16 ** -0.5).float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("compiled", [False, True])
def test_static_steps_attending_by_two_products_give_the_eager_tokens(loaded, images, monkeypatch, compiled):
    """``VLMFAST_DECODE_ATTENTION=products`` moves static steps (CUDA graphs' path; with ``compiled``, compiled
    for real here on the CPU) to the two-product attention: rows of different prompt lengths keep the eager
    loop's tokens, eager steps keep SDPA, and the run says which attention its static steps used."""
    import torch

    from vlmfast.engines.hf.text_decoder import DECODE_ATTENTION, PRODUCTS_DECODE_ATTENTION

    reqs = _requests(images[:3])
    reqs[1] = dataclasses.replace(reqs[1], prompt=PROMPT + " Then name every colour you see, one by one.")
    settings = GenerationSettings(max_new_tokens=12, ignore_eos=True)
    monkeypatch.setenv("VLMFAST_DECODE_ATTENTION", "products")
    plain = Engine(loaded, settings)
    eager = _run(plain, reqs, 3)
    assert plain._new_state(3, 64, static=False).attention == DECODE_ATTENTION
    torch._dynamo.reset()
    static = Engine(loaded, settings, compile=True, **({} if compiled else {"compiler": lambda fn: fn}))
    got = _run(static, reqs, 3)
    torch._dynamo.reset()
    assert static.policy.enabled, static.notes + static.policy.notes
    assert [s.attention for s in static._static.values()] == [PRODUCTS_DECODE_ATTENTION]
    assert {k: v.token_ids for k, v in got.items()} == {k: v.token_ids for k, v in eager.items()}
    assert [n for n in static.decode_notes() if n.startswith("decode attention")] == [
        "decode attention: two matrix products around a float32 softmax in the static decode steps "
        "(VLMFAST_DECODE_ATTENTION=sdpa compares SDPA)"]
    assert not [n for n in plain.decode_notes() if n.startswith("decode attention")]


def test_a_static_state_attends_as_a_compiled_one_exactly_when_its_step_is_compiled(loaded, monkeypatch):
    """What DecodeState tells static_attention: compiled for the policy's compiled step (one length, the whole
    cache), not for the uncompiled step of CUDA graphs (attending in buckets) — on a CPU both pick SDPA, so
    the flag itself is checked."""
    from vlmfast.engines.hf.decode import forward_static

    monkeypatch.setattr("vlmfast.engines.hf.decode.static_attention", lambda *, compiled, cuda: f"compiled={compiled}")
    engine = Engine(loaded, GenerationSettings(), compile=True, compiler=lambda fn: fn)
    assert engine._new_state(1, 512, static=True, forward=engine.policy.forward()).attention == "compiled=True"
    assert engine._new_state(1, 512, static=True, forward=forward_static).attention == "compiled=False"
    assert engine._new_state(1, 512, static=True).attention == "compiled=False"  # no forward: the uncompiled step


def test_compiled_steps_on_cuda_attend_by_products_others_by_sdpa_unless_told_and_a_misspelt_choice_stops(loaded, monkeypatch):
    """The static step's attention: two products where it is compiled on CUDA (measured faster there), SDPA for
    every other static step (an uncompiled graph, a compiled step on a CPU); the variable overrides both."""
    from vlmfast.engines.hf.text_decoder import DECODE_ATTENTION, PRODUCTS_DECODE_ATTENTION, static_attention
    from vlmfast.errors import UsageError

    monkeypatch.delenv("VLMFAST_DECODE_ATTENTION", raising=False)
    assert static_attention(compiled=True, cuda=True) == PRODUCTS_DECODE_ATTENTION
    monkeypatch.setattr("vlmfast.engines.hf.text_decoder.FLOAT32_SCORES", False)  # a torch before 2.8, or ROCm
    assert static_attention(compiled=True, cuda=True) == DECODE_ATTENTION
    monkeypatch.setattr("vlmfast.engines.hf.text_decoder.FLOAT32_SCORES", True)
    assert static_attention(compiled=False, cuda=True) == DECODE_ATTENTION
    assert static_attention(compiled=True, cuda=False) == DECODE_ATTENTION
    engine = Engine(loaded, GenerationSettings(), compile=True)  # on this model's device, a CPU here
    assert engine._new_state(1, 64, static=True, forward=engine.policy.forward()).attention == DECODE_ATTENTION
    monkeypatch.setenv("VLMFAST_DECODE_ATTENTION", " Products ")
    assert static_attention(compiled=False, cuda=False) == PRODUCTS_DECODE_ATTENTION
    monkeypatch.setenv("VLMFAST_DECODE_ATTENTION", "sdpa")
    assert static_attention(compiled=True, cuda=True) == DECODE_ATTENTION
    monkeypatch.setenv("VLMFAST_DECODE_ATTENTION", "flash")
    with pytest.raises(UsageError, match="VLMFAST_DECODE_ATTENTION='flash' is not a decode attention") as caught:
        Engine(loaded, GenerationSettings())
    assert caught.value.hint == "use one of sdpa, products, or unset it (products for compiled steps on CUDA, sdpa otherwise)"


@pytest.mark.parametrize("decoder", ["vlmfast", "hf"])
def test_the_decode_loop_is_built_when_the_backend_gets_ready_not_in_a_first_ttft(loaded, decoder):
    """On a CPU building the loop packs the weights: done in ready(), before any clock starts, it stays out of
    the first static batch's time to the first token. Plain generate (--decoder hf) needs no loop."""
    from vlmfast.engines.hf.backend import HfBackend

    engine = Engine(loaded, GenerationSettings(max_new_tokens=2), decoder=decoder)
    assert engine._text is None
    backend = HfBackend.around(engine)
    backend.ready([], {}, 2)
    assert (engine._text is not None) is (decoder == "vlmfast")
    assert (backend.build_s > 0) is (decoder == "vlmfast")  # counted with the load, in load_s
