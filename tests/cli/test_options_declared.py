"""Each option is declared once, on the library's options dataclass: the command line and a Python caller
get the same defaults, and no option exists on one side only."""

from __future__ import annotations

import dataclasses

import pytest
import typer

from vlmfast.cli import app
from vlmfast.cli.build import REQUIRED
from vlmfast.declared import KEY, Nested, default_of
from vlmfast.engines.rows import GenerationSettings
from vlmfast.run.bench import BenchOptions
from vlmfast.run.options import InferOptions
from vlmfast.run.sweep_options import PER_CHECKPOINT, SweepOptions

GROUP = typer.main.get_command(app)
# command-line-only parameters: how the report is shown, not what runs
RENDERING = {"json_out", "report_dir"}
# fields a command fills in itself, not options
NOT_OPTIONS = {"explicit", "rows_to_stdout"}


def _options(cls, without=()) -> set[str]:
    """The option names of ``cls``'s fields, nested dataclasses' expanded."""
    names = set()
    for f in dataclasses.fields(cls):
        meta = f.metadata.get(KEY)
        if f.name in without:
            continue
        if meta is None:
            assert f.name in NOT_OPTIONS, f"{cls.__name__}.{f.name} is neither an option nor set by the command"
        elif isinstance(meta, Nested):
            names |= _options(typing_of(cls, f.name), meta.without)
        else:
            names.add(f.name)
    return names


def typing_of(cls, name):
    import typing

    return typing.get_type_hints(cls)[name]


def _params(command: str) -> dict:
    return {p.name: p for p in GROUP.commands[command].params if p.name != "help"}


@pytest.mark.parametrize("command,cls,without", [
    ("infer", InferOptions, ()),
    ("bench", BenchOptions, ()),
    ("sweep", SweepOptions, ()),
])
def test_every_option_is_a_field_and_every_field_an_option(command, cls, without):
    params = set(_params(command)) - RENDERING
    assert params == _options(cls, without)


def test_sweep_takes_infer_options_but_those_it_sets_itself():
    infer = _options(InferOptions)
    sweep = set(_params("sweep"))
    assert infer - set(PER_CHECKPOINT) <= sweep
    assert not (set(PER_CHECKPOINT) - {"base", "overwrite", "retry_errors"}) & sweep  # sweep's own, set per checkpoint
    assert sweep - infer - RENDERING == _options(SweepOptions) - infer


class _Built(Exception):
    """Raised by a stand-in for the library call: carries the options the command built."""


@pytest.mark.parametrize("command,call,args,library", [
    ("infer", "vlmfast.run.runner.infer", ["--ckpt", "ck", "--images", "a.png"],
     lambda: InferOptions(ckpt="ck", images=["a.png"], rows_to_stdout=True, explicit=frozenset({"ckpt", "images"}))),
    ("bench", "vlmfast.run.bench.run_bench", ["--ckpt", "ck", "--synthetic", "2"],
     lambda: BenchOptions(ckpt="ck", synthetic=2)),
    ("sweep", "vlmfast.run.sweep.sweep", ["run", "--manifest", "m.jsonl", "--out-dir", "o"],
     lambda: SweepOptions(run_dir="run", out_dir="o", infer=InferOptions(
         ckpt="run", manifest="m.jsonl", explicit=frozenset({"run_dir", "manifest", "out_dir"})))),
])
def test_the_command_line_defaults_are_the_library_defaults(monkeypatch, command, call, args, library):
    """The options a command builds from a command line giving only what is required equal the library's
    own defaults for the same required values."""
    from typer.testing import CliRunner

    def built(options, **_):
        raise _Built(options)

    monkeypatch.setattr(call, built)
    result = CliRunner().invoke(app, [command, *args])
    assert isinstance(result.exception, _Built), result.output
    assert result.exception.args[0] == library()


def _mismatches(command) -> list[str]:
    """Parameters of ``command`` (a click command built from a dataclass) whose default is not their field's."""
    params = {p.name: p for p in command.params}
    return [declared.name for declared in command.callback.params
            if declared.default is not REQUIRED and not declared.cli.required
            and params[declared.name].default != declared.default]


@pytest.mark.parametrize("command", ["infer", "bench", "sweep"])
def test_every_declared_default_is_the_one_on_the_command_line(command):
    assert _mismatches(GROUP.commands[command]) == []


def test_a_default_that_differs_from_its_field_is_caught():
    import copy

    doctored = copy.deepcopy(GROUP.commands["infer"])
    [option] = [p for p in doctored.params if p.name == "max_new_tokens"]
    option.default = 512
    assert _mismatches(doctored) == ["max_new_tokens"]


@pytest.mark.parametrize("command,names", [
    ("score", ("prompt_key", "answer_key", "image_key", "scorer", "iou", "bbox_space", "reward", "reward_weights",
               "reward_kwargs", "reward_threshold")),
])
def test_other_commands_taking_infer_options_keep_their_defaults(command, names):
    params = _params(command)
    for name in names:
        assert params[name].default == default_of(InferOptions, name), name
        assert params[name].help == InferOptions.__dataclass_fields__[name].metadata[KEY].help


def test_bench_keeps_its_own_generation_default():
    assert default_of(BenchOptions, "generation") == GenerationSettings(max_new_tokens=128)
    assert _params("bench")["max_new_tokens"].default == 128
    assert _params("infer")["max_new_tokens"].default == default_of(GenerationSettings, "max_new_tokens")


def test_choices_in_help_come_from_the_registries():
    """--scorer's help names every scorer of the scoring registry; make-checkpoint --family's every family."""
    from vlmfast.checkpoints.families import BY_KEY
    from vlmfast.evaluation.scoring import SCORER_FUNCTIONS, SCORERS

    scorer_help = _params("infer")["scorer"].help
    assert set(SCORER_FUNCTIONS) < set(SCORERS) and all(name in scorer_help for name in SCORERS)
    family_help = _params("make-checkpoint")["family"].help
    assert all(key in family_help for key in BY_KEY)


def test_every_engine_derives_its_draws_from_one_key():
    """One seed rule: a run's seed (given, or drawn once) and the (seed, request id, sample) key."""
    from vlmfast.engines.rows import draw_key, run_seed

    assert run_seed(7) == 7 and run_seed(None) != run_seed(None)  # none given: each run draws its own
    assert draw_key(7, "q1", 0) == draw_key(7, "q1", 0) != draw_key(7, "q1", 1) != draw_key(8, "q1", 1)
