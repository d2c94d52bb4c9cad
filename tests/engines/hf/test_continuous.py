"""Continuous batching: a row whose answer ended takes the next request while the others go on — and no
answer's tokens depend on when it was admitted or who shared the rows with it."""

import dataclasses
import itertools

import pytest

from conftest import generate_tokens, model_inputs

from vlmfast.engines.hf.continuous import AdmitPolicy, stream
from vlmfast.engines.hf.engine import Engine
from vlmfast.engines.hf.scheduler import Scheduler
from vlmfast.engines.rows import GenerationSettings
from vlmfast.inputs.requests import Request

PROMPT = "What shapes are in this image? Answer briefly."


def _requests(images, k=None):
    return [Request(f"{i}-{p.name}", (str(p),), PROMPT) for i, p in enumerate(images[:k] if k else images)]


def run_stream(engine, requests, width, length=None, policy=None):
    """Every answer by (id, sample), every admission's size, and the order answers and admissions came in."""
    length = length or max(engine.cost(r) for r in requests) + 64 + engine.settings.max_new_tokens
    rows, admissions, events, last = {}, [], [], None
    for out, timing in stream(engine, requests, width, length, policy):
        for r in out:
            rows[(r.id, r.sample)] = r
            events.append("answer")
        if timing is not None and timing.size:
            admissions.append(timing.size)
            events.append("admit")
        elif timing is not None:
            last = timing
    return rows, admissions, events, last


def static_rows(engine, requests, batch_size):
    return {(r.id, r.sample): r for _, rs, _ in Scheduler(engine).run(requests, {}, batch_size) for r in rs}


def ending_apart(loaded, requests, max_new):
    """An EOS list under which the answers end at several different steps (none at the first): taken from
    tokens the rows really produce."""
    tokens = [r.token_ids for r in static_rows(Engine(loaded, GenerationSettings(max_new_tokens=max_new, ignore_eos=True)),
                                               requests, len(requests)).values()]
    candidates = sorted({t for row in tokens for t in row[1:]})
    for stop in itertools.chain(itertools.combinations(candidates, 2), itertools.combinations(candidates, 3)):
        ends = [next((i for i, t in enumerate(row) if t in stop), None) for row in tokens]
        if sum(e is not None and e > 0 for e in ends) >= len(tokens) - 1 and len(set(ends)) >= 3:
            return dataclasses.replace(loaded, eos_token_ids=list(stop))
    raise AssertionError("no token pair ends the rows at different steps")


@pytest.fixture(scope="module")
def spread(loaded, images):
    """The tiny checkpoint with an EOS list that ends its six answers at different steps."""
    return ending_apart(loaded, _requests(images), 24)


def test_greedy_answers_admitted_into_freed_rows_are_each_requests_alone(spread, images):
    """Two rows for six requests: four are admitted into rows another answer just left, while the other
    row is mid-answer; each answer is the tokens plain generate gives that request alone, and the
    tokens of one static batch of all six."""
    reqs = _requests(images)
    engine = Engine(spread, GenerationSettings(max_new_tokens=24), sync_every=1)
    rows, admissions, events, last = run_stream(engine, reqs, 2)
    assert sum(admissions) == 6 and len(admissions) >= 4  # one or two at a time, as rows freed
    assert events.index("answer") < len(events) - 1 - events[::-1].index("admit")  # admitted after an answer ended
    whole = static_rows(Engine(spread, GenerationSettings(max_new_tokens=24)), reqs, 6)
    lengths = set()
    for r in reqs:
        alone = generate_tokens(spread, model_inputs(engine, [r]), 24, spread.eos_token_ids)[0]
        assert rows[(r.id, None)].token_ids == alone == whole[(r.id, None)].token_ids, r.id
        lengths.add(rows[(r.id, None)].n_new_tokens)
    assert len(lengths) >= 3  # the answers really ended apart
    useful = sum(r.n_new_tokens for r in rows.values())
    assert last.row_steps >= useful and last.steps > 1  # the loop's row-steps hold every answer token


def test_an_eager_loop_computes_only_rows_that_run(spread, images):
    """Rows that ended are not computed: with nothing left to admit, the live rows move to the front
    and a step computes just them, so every row-step made an answer token (one check per step)."""
    reqs = _requests(images)
    rows, _, _, last = run_stream(Engine(spread, GenerationSettings(max_new_tokens=24), sync_every=1), reqs, 6)
    assert last.row_steps == sum(r.n_new_tokens for r in rows.values())
    static = Engine(spread, GenerationSettings(max_new_tokens=24), compile=True, compiler=lambda fn: fn)
    _, _, _, every_row = run_stream(static, reqs, 6)  # a static shape computes all of its rows
    assert every_row.row_steps > last.row_steps


def test_rows_split_by_length_each_attend_over_their_own_keys_with_the_same_tokens(spread, images, monkeypatch):
    """An eager step splits its rows into groups that each read only as many keys as their longest row
    (every possible group here: a group costs nothing); each answer keeps its tokens, whatever group it
    was in, and the rows that ended leave the others in their order."""
    from vlmfast.engines.hf import text_decoder
    from vlmfast.engines.hf.decode import DecodeState

    reqs = _requests(images)
    settings = GenerationSettings(max_new_tokens=24)
    whole, _, _, _ = run_stream(Engine(spread, settings, sync_every=1), reqs, 4)
    monkeypatch.setattr(text_decoder, "GROUP_COST_KEYS", 0)
    splits, orders = [], []
    row_groups, pack = DecodeState.row_groups, DecodeState.pack

    def spy_groups(state):
        groups = row_groups(state)
        splits.append([(a, b, n) for a, b, n, _ in groups])
        return groups

    def spy_pack(state):
        before = [o for o in state.owner if o is not None]
        pack(state)
        orders.append((before, [o for o in state.owner[:state.cache.active]]))

    monkeypatch.setattr(DecodeState, "row_groups", spy_groups)
    monkeypatch.setattr(DecodeState, "pack", spy_pack)
    grouped, _, _, _ = run_stream(Engine(spread, settings, sync_every=1), reqs, 4)
    assert {k: v.token_ids for k, v in grouped.items()} == {k: v.token_ids for k, v in whole.items()}
    assert any(len({n for _, _, n in split}) > 1 for split in splits)  # groups read different numbers of keys
    assert all(before == after for before, after in orders)  # packing keeps the live rows' order


def test_a_split_reads_fewer_keys_only_where_a_group_pays():
    from vlmfast.engines.hf.text_decoder import split_rows

    assert split_rows([]) == []
    assert split_rows([600] * 8 + [100] * 8, call_cost=512) == [(0, 8), (8, 16)]
    assert split_rows([600] * 8 + [590] * 8, call_cost=512) == [(0, 16)]  # 80 keys saved < one call
    assert split_rows([100, 600] * 8, call_cost=512) == [(0, 16)]  # groups are contiguous rows
    assert split_rows([5, 4, 3, 2], call_cost=0) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    rows = list(range(1000, 0, -1))  # many rows: boundaries among 16 evenly spaced ones
    assert all(a % 63 == 0 for a, _ in split_rows(rows, call_cost=0)) and len(split_rows(rows, call_cost=0)) == 16


def test_static_shapes_admit_into_freed_rows_with_the_eager_tokens(spread, images):
    """The path CUDA graphs and compiled steps take (all rows, device-side indices, additive mask),
    uncompiled here: rows freed and refilled mid-run give the eager loop's tokens."""
    reqs = _requests(images)
    settings = GenerationSettings(max_new_tokens=24)
    eager, _, _, _ = run_stream(Engine(spread, settings, sync_every=1), reqs, 2)
    static = Engine(spread, settings, compile=True, compiler=lambda fn: fn, sync_every=3)
    rows, admissions, _, _ = run_stream(static, reqs, 2)
    assert len(admissions) >= 3
    assert {k: v.token_ids for k, v in rows.items()} == {k: v.token_ids for k, v in eager.items()}


def test_sampled_answers_do_not_depend_on_width_order_or_admission(loaded, images):
    """--n 2, sampled: each of a request's answers leaves on its own; the same (seed, id, sample) gives
    the same answer in 2, 3 or 8 rows, admitted in another order, or in one static batch."""
    reqs = _requests(images)
    settings = GenerationSettings(max_new_tokens=16, temperature=1.0, top_p=0.9, seed=11, n=2)
    engine = Engine(ending_apart(loaded, reqs, 16), settings, sync_every=1)
    runs = [run_stream(engine, order, width)[0] for order, width in ((reqs, 2), (reqs[::-1], 3), (reqs, 8))]
    runs.append(static_rows(engine, reqs, 6))
    tokens = [{k: v.token_ids for k, v in run.items()} for run in runs]
    assert all(t == tokens[0] for t in tokens[1:])
    assert sorted(tokens[0]) == sorted((r.id, k) for r in reqs for k in range(2))
    assert len({len(t) for t in tokens[0].values()}) >= 2  # answers of spread lengths


def test_a_prompt_longer_than_planned_moves_the_run_to_a_longer_cache(spread, images):
    reqs = _requests(images)
    engine = Engine(spread, GenerationSettings(max_new_tokens=24), sync_every=1)
    planned, _, _, _ = run_stream(engine, reqs, 2)
    short, _, _, _ = run_stream(engine, reqs, 2, length=30)  # shorter than any prompt
    assert {k: v.token_ids for k, v in short.items()} == {k: v.token_ids for k, v in planned.items()}


def test_a_gpu_policy_prefills_a_set_of_rows_ahead_and_a_cpu_one_what_is_free():
    gpu, cpu = AdmitPolicy.for_device(True), AdmitPolicy.for_device(False)
    assert gpu.due(free=1, width=8, live=7, waiting=5) and cpu.due(free=1, width=8, live=7, waiting=5)
    assert not gpu.due(free=0, width=8, live=8, waiting=5) and not cpu.due(free=8, width=8, live=0, waiting=0)
    assert gpu.requests(free=1, width=8, n=2, waiting=9) == 4  # a set of rows' answers: 1 seated, 7 wait prefilled
    assert gpu.requests(free=1, width=8, n=3, waiting=9) == 3 and gpu.requests(free=1, width=8, n=2, waiting=2) == 2
    assert cpu.requests(free=1, width=8, n=2, waiting=9) == 1 and cpu.requests(free=5, width=8, n=2, waiting=9) == 3
    quarter = AdmitPolicy(0.25, 0.0, "once a quarter of the rows are free")
    assert not quarter.due(free=1, width=8, live=7, waiting=5) and quarter.due(free=2, width=8, live=6, waiting=5)
    assert quarter.due(free=1, width=8, live=0, waiting=1)


def test_answers_prefilled_ahead_take_rows_as_they_free_with_the_tokens_of_each_alone(spread, images):
    """The GPU's policy (run here on the CPU's eager loop): one prefill makes answers for every row, those
    without a row wait prefilled and take rows as they free; fewer prefills than admitting per free row,
    the same tokens."""
    reqs = _requests(images)
    engine = Engine(spread, GenerationSettings(max_new_tokens=24), sync_every=1)
    per_row, per_row_admissions, _, _ = run_stream(engine, reqs, 2, policy=AdmitPolicy.for_device(False))
    ahead, admissions, _, _ = run_stream(engine, reqs, 2, policy=AdmitPolicy.for_device(True))
    assert {k: v.token_ids for k, v in ahead.items()} == {k: v.token_ids for k, v in per_row.items()}
    assert admissions == [2, 2, 2] and len(per_row_admissions) > 3  # each prefill: a set of 2 rows' answers
    assert "answer(s) waited, prefilled, for a row" in engine.admissions and " 0 answer(s) waited" not in engine.admissions


def test_answers_that_find_no_free_row_wait_prefilled_and_keep_their_tokens(loaded, images):
    """--n 3 in 4 rows: a request's answers need not find 3 free rows at once. Those that find none wait,
    prefilled, for the next rows to free, so no row waits for n to free: every row computes from the
    first step to the last request, and every answer's tokens are those of the request run alone."""
    reqs = _requests(images, 4)
    settings = GenerationSettings(max_new_tokens=16, temperature=1.0, top_p=0.9, seed=5, n=3)
    engine = Engine(ending_apart(loaded, reqs, 16), settings, sync_every=1)
    rows, admissions, _, last = run_stream(engine, reqs, 4)
    said = engine.admissions
    alone = {k: v for r in reqs for k, v in run_stream(engine, [r], 3)[0].items()}
    assert {k: v.token_ids for k, v in rows.items()} == {k: v.token_ids for k, v in alone.items()}
    assert admissions[0] == 2  # 4 free rows: two requests prefilled, the second's last 2 answers wait
    assert sum(admissions) == len(reqs)  # each request prefilled once, however its answers were seated
    assert last.cache_fill_s is not None
    assert "answer(s) waited, prefilled, for a row" in said and " 0 answer(s) waited" not in said


def test_a_run_that_decides_to_compile_midway_keeps_every_token(spread, images, monkeypatch, tmp_path):
    """With no --compile / --no-compile, a continuous run weighs compiling after its first steps; when it
    pays, the rows in flight move into a compiled (here: static, uncompiled) state and decode on there."""
    from vlmfast.engines.hf import compile_policy, continuous
    from vlmfast.engines.hf.compile_policy import CompileCache, Decision

    monkeypatch.setattr(continuous, "DECIDE_AFTER", 4)
    monkeypatch.setattr(compile_policy, "decide", lambda *a, **k: Decision(True, "compile on: it pays"))
    reqs = _requests(images)
    settings = GenerationSettings(max_new_tokens=24)
    eager, _, _, _ = run_stream(Engine(spread, settings, sync_every=1), reqs, 2)
    engine = Engine(spread, settings, sync_every=1, compile=None, compiler=lambda fn: fn,
                    compile_cache=CompileCache({}, root=tmp_path))
    rows, _, _, _ = run_stream(engine, reqs, 2)
    assert engine.policy.enabled and "compile on: it pays" in engine.policy.notes
    assert [state.static for state in engine._static.values()] == [True]
    assert {k: v.token_ids for k, v in rows.items()} == {k: v.token_ids for k, v in eager.items()}


def test_the_steps_to_go_count_what_live_answers_still_need():
    """The compile decision's estimate: answers that ended early are the short ones, so their mean alone
    said "1 decode step to go" with 14 answers still running; a live answer that ran k tokens runs k more
    (up to the limit)."""
    from types import SimpleNamespace

    from vlmfast.engines.hf.continuous import steps_to_go

    state = SimpleNamespace(batch=32, produced=[32] * 14 + [3] * 18, owner=["a"] * 14 + [None] * 18)
    assert steps_to_go(state, answers=14, mean=3.0, max_new=200) == 32
    assert steps_to_go(state, answers=14, mean=3.0, max_new=40) == 8  # the limit is near
    assert steps_to_go(state, answers=600, mean=100.0, max_new=200) == 1875  # many answers to come decide


def test_images_decoded_ahead_by_a_worker_give_the_same_answers(spread, images):
    """--overlap (on by default on CUDA): a worker decodes the next requests' images while rows decode."""
    reqs = _requests(images)
    engine = Engine(spread, GenerationSettings(max_new_tokens=24), sync_every=1)
    plain, _, _, _ = run_stream(engine, reqs, 2)
    length = max(engine.cost(r) for r in reqs) + 64 + 24
    ahead = {(r.id, r.sample): r.token_ids for out, _ in stream(engine, reqs, 2, length, overlap=True) for r in out}
    assert ahead == {k: v.token_ids for k, v in plain.items()}


def test_hundreds_of_stop_tokens_end_answers_where_a_few_do(spread, images):
    """A stop set of hundreds of ids (the real-length benchmark makes one on a 151k vocabulary) is compared
    in one broadcast, the way a CUDA graph can capture: the ids no answer produces change no token, in the
    eager loop and in the static step alike."""
    reqs = _requests(images)
    settings = GenerationSettings(max_new_tokens=24)
    few, _, _, _ = run_stream(Engine(spread, settings), reqs, 2)
    produced = {t for r in few.values() for t in r.token_ids}
    unused = [t for t in range(spread.model.config.get_text_config().vocab_size) if t not in produced][:400]
    many = dataclasses.replace(spread, eos_token_ids=[*spread.eos_token_ids, *unused])
    assert len(many.eos_token_ids) > 300
    eager, _, _, _ = run_stream(Engine(many, settings, sync_every=1), reqs, 2)
    static, _, _, _ = run_stream(Engine(many, settings, compile=True, compiler=lambda fn: fn, sync_every=3), reqs, 2)
    expected = {k: v.token_ids for k, v in few.items()}
    assert {k: v.token_ids for k, v in eager.items()} == expected == {k: v.token_ids for k, v in static.items()}
    assert any(len(t) < settings.max_new_tokens for t in expected.values())  # the real stops still end answers


def test_the_decode_clock_stops_while_the_caller_handles_ended_answers(loaded, images):
    """The runner scores (a --reward function may take seconds), writes and fsyncs each answer as it ends,
    inside the stream's loop: that time is not decoding. A static batch's clock stops before its rows are
    made; so must the continuous loop's, or decode_ms_per_token (and the compile decision) count the reward."""
    import time

    reqs = _requests(images)
    engine = Engine(loaded, GenerationSettings(max_new_tokens=3), sync_every=1)
    length = max(engine.cost(r) for r in reqs) + 64 + 3
    answers, pauses, last = 0, 0, None
    for out, timing in stream(engine, reqs, 2, length):
        if out:
            answers += len(out)
            pauses += 1
            time.sleep(1.0)  # a slow reward function, a slow disk
        if timing is not None and not timing.size:
            last = timing
    assert answers == len(reqs) and pauses >= 3
    assert last.decode_s < 1.0, last.decode_s  # a few steps of a tiny model, not the caller's 3+ seconds


def test_after_an_out_of_memory_error_the_steps_that_made_the_answers_given_still_count(loaded, images, monkeypatch):
    """A CUDA out-of-memory error mid-run sends the answers not yet given to halved static batches; the answers
    given before it were decoded by the continuous loop, whose steps must reach the report — else it shows
    more answer tokens than row-steps (decode_row_utilization 2.0), "static" batching and a decode time
    without those steps."""
    from vlmfast.engines.hf import scheduler

    class FakeOutOfMemory(RuntimeError):
        pass

    monkeypatch.setattr(scheduler, "is_out_of_memory", lambda exc: isinstance(exc, FakeOutOfMemory))
    engine = Engine(loaded, GenerationSettings(max_new_tokens=6), sync_every=1)
    prefill, calls = engine.prefill, []

    def failing_prefill(prepared):
        calls.append(1)
        if len(calls) == 3:
            raise FakeOutOfMemory("CUDA out of memory (simulated)")
        return prefill(prepared)

    monkeypatch.setattr(engine, "prefill", failing_prefill)
    reqs = _requests(images)
    s = Scheduler(engine)
    rows, timings, before = [], [], None
    for _, out, timing in s.continuous(reqs, {}, list(range(len(reqs))), 2):
        rows += out
        timings += [timing] if timing is not None else []
        if timing is not None and timing.size == 0 and before is None:
            before = list(rows)  # the answers the continuous loop gave before the error
    assert s.oom_splits == 1 and sorted(r.id for r in rows) == sorted(r.id for r in reqs)
    loop = [t for t in timings if t.size == 0]
    assert loop and before and loop[0].row_steps >= sum(r.n_new_tokens for r in before)
    assert sum(t.row_steps for t in timings) >= sum(r.n_new_tokens for r in rows)  # utilization at most 1


def test_a_run_that_decides_to_compile_midway_counts_every_step_it_decoded(spread, images, monkeypatch, tmp_path):
    """The decode clock across a mid-run compile decision: on a clock that moves one second per decode step
    and stands still otherwise (admissions, harvests, building the compiled state), decode_s is the number of
    steps taken. It used to lose the steps decoded between the last restart of the clock and the decision."""
    from vlmfast.engines.hf import compile_policy, continuous
    from vlmfast.engines.hf.compile_policy import CompileCache, Decision
    from vlmfast.engines.hf.decode import DecodeState

    clock = [0.0]
    step = DecodeState.step

    def one_second_step(self):
        clock[0] += 1.0
        step(self)

    monkeypatch.setattr(DecodeState, "step", one_second_step)
    monkeypatch.setattr(continuous, "now", lambda device=None: clock[0])
    monkeypatch.setattr(continuous, "DECIDE_AFTER", 4)
    monkeypatch.setattr(compile_policy, "decide", lambda *a, **k: Decision(True, "compile on: it pays"))
    settings = GenerationSettings(max_new_tokens=12, ignore_eos=True)  # no answer ends before the decision
    engine = Engine(spread, settings, sync_every=1, compile=None, compiler=lambda fn: fn,
                    compile_cache=CompileCache({}, root=tmp_path))
    rows, _, _, last = run_stream(engine, _requests(images), 2)
    assert engine.policy.enabled and "compile on: it pays" in engine.policy.notes  # the decision was taken
    steps = last.steps - 1  # the loop's timing counts one more (each answer's first token comes from prefill)
    assert steps == 3 * 11  # 6 answers of 12 tokens through 2 rows: 11 decode steps per pair
    assert last.decode_s == steps


def test_a_batch_that_ran_out_of_memory_leaves_no_decode_shape_behind(loaded, images, monkeypatch):
    """The static path halves a batch that runs out of memory; the halves must not run beside the failed
    batch's decode shape (its KV cache and, on a GPU, its CUDA graphs): a shape is evicted only when another
    is stored, so a half that also runs out of memory would leave it resident for the whole run."""
    from vlmfast.engines.hf import kv, scheduler

    class FakeOutOfMemory(RuntimeError):
        pass

    monkeypatch.setattr(scheduler, "is_out_of_memory", lambda exc: isinstance(exc, FakeOutOfMemory))
    engine = Engine(loaded, GenerationSettings(max_new_tokens=4, ignore_eos=True), compile=True,
                    compiler=lambda fn: fn)  # static decode shapes, uncompiled
    admit, resident = kv.StaticKV.admit, []

    def failing_admit(self, rows, cache, prompts):
        if self.batch == 4:  # the 4-row shape was built, then admitting into it ran out of memory
            raise FakeOutOfMemory("CUDA out of memory (simulated)")
        resident.append(sorted(batch for batch, _ in engine._static))
        return admit(self, rows, cache, prompts)

    monkeypatch.setattr(kv.StaticKV, "admit", failing_admit)
    s = Scheduler(engine, overlap=False)
    rows = [r for _, out, _ in s.run(_requests(images, 4), {}, 4) for r in out]
    assert s.oom_splits == 1 and sorted(r.id for r in rows) == sorted(r.id for r in _requests(images, 4))
    assert not any(r.error for r in rows) and all(r.n_new_tokens == 4 for r in rows)
    assert resident and all(4 not in batches for batches in resident), resident
