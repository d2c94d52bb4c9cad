"""Data parallel on vLLM: each launched process's engine takes its own run of GPUs (tensor × pipeline parallel
of them), a launch that needs more GPUs than the node has is refused before any engine starts, and vLLM starts
without the launcher's variables, which come back afterwards."""

import pytest

from vlmfast.engines.vllm.replicas import LAUNCHER_VARIABLES, Replica, replica_env, replica_for
from vlmfast.engines.vllm.support import VllmSettings
from vlmfast.errors import UsageError

GPUS = [str(i) for i in range(8)]


def test_one_process_has_no_replica():
    assert replica_for(0, 1, VllmSettings(), cuda=True, visible=GPUS, environ={}) is None


@pytest.mark.parametrize("local_rank, tensor, devices", [(0, 1, ("0",)), (3, 1, ("3",)), (0, 2, ("0", "1")),
                                                         (3, 2, ("6", "7"))])
def test_each_process_takes_its_own_run_of_gpus(local_rank, tensor, devices):
    environ = {"LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(8 // tensor)}
    replica = replica_for(local_rank, 8 // tensor, VllmSettings(tensor_parallel_size=tensor), cuda=True, visible=GPUS,
                          environ=environ)
    assert replica == Replica(local_rank, 8 // tensor, devices)


def test_the_devices_are_counted_per_node_and_named_as_the_launch_names_them():
    """Two nodes of two processes: the second node's first process (rank 2) takes its node's first GPUs, as
    CUDA_VISIBLE_DEVICES lists them."""
    replica = replica_for(2, 4, VllmSettings(tensor_parallel_size=2), cuda=True, visible=["4", "5", "6", "7"],
                          environ={"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"})
    assert replica.devices == ("4", "5")


def test_more_gpus_than_the_node_has_is_refused_with_the_count_that_fits():
    with pytest.raises(UsageError) as exc:
        replica_for(0, 8, VllmSettings(tensor_parallel_size=2), cuda=True, visible=GPUS,
                    environ={"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8"})
    assert "need 16 GPUs; this node has 8" in exc.value.message
    assert "--num_processes 4" in exc.value.hint


def test_ray_is_refused_under_a_launch():
    with pytest.raises(UsageError, match="ray"):
        replica_for(0, 2, VllmSettings(distributed_executor_backend="ray"), cuda=True, visible=GPUS, environ={})


def test_a_cpu_replica_takes_no_devices():
    assert replica_for(1, 2, VllmSettings(), cuda=False, environ={}) == Replica(1, 2, None)


def test_vllm_starts_without_the_launchers_variables_on_its_own_devices_and_they_come_back():
    environ = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
               "CUDA_VISIBLE_DEVICES": "0,1,2,3", "PATH": "/bin"}
    before = dict(environ)
    with replica_env(Replica(1, 2, ("2", "3")), environ):
        assert not set(LAUNCHER_VARIABLES) & set(environ)
        assert environ["CUDA_VISIBLE_DEVICES"] == "2,3" and environ["PATH"] == "/bin"
        # spawned, not forked: a forked engine core inherits the launch's torch.distributed group (and a CUDA
        # driver this process may have started), which vLLM's init_distributed_environment then takes as its own
        assert environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert environ == before


def test_a_fork_asked_for_is_overridden_while_vllm_starts_and_comes_back():
    environ = {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}
    with replica_env(Replica(0, 2, ("0",)), environ):
        assert environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert environ == {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}


def test_an_engine_inside_the_launched_process_is_refused():
    """VLLM_ENABLE_V1_MULTIPROCESSING=0 runs vLLM's engine in this process, which already holds the launch's
    process group: vLLM would take it for its own world."""
    with pytest.raises(UsageError, match="VLLM_ENABLE_V1_MULTIPROCESSING=0"):
        replica_for(0, 2, VllmSettings(), cuda=True, visible=GPUS,
                    environ={"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"})


def test_one_process_leaves_the_environment_alone():
    environ = {"RANK": "0", "CUDA_VISIBLE_DEVICES": "0"}
    with replica_env(None, environ):
        assert environ == {"RANK": "0", "CUDA_VISIBLE_DEVICES": "0"}


@pytest.mark.parametrize("world", [2, 3, 5])
def test_a_replica_has_a_share_exactly_when_the_launchs_split_gives_it_requests(world):
    from types import SimpleNamespace

    from accelerate.state import PartialState

    for n in range(8):
        for rank in range(world):
            launch = SimpleNamespace(num_processes=world, process_index=rank, device="cpu")
            with PartialState.split_between_processes(launch, list(range(n))) as mine:
                assert Replica(rank, world, None).has_share(n) == bool(list(mine)), (rank, world, n)


def test_a_launched_process_without_a_share_starts_no_engine():
    """Fewer requests than processes: the processes past the last request have nothing to run, and a vLLM engine
    would cost them its whole start-up (minutes on a GPU) and its memory."""
    from types import SimpleNamespace

    from vlmfast.engines.vllm.backend import VllmBackend

    started = []
    for rank in (0, 1):
        backend = SimpleNamespace(replica=Replica(rank, 2, None), start=lambda reqs, rank=rank: started.append(rank),
                                  reload=SimpleNamespace(canary_due=False), device="cpu", settings=SimpleNamespace(n=1))
        assert VllmBackend.ready(backend, ["only request"], {}, 4) == (4, None)
    assert started == [0]


def test_external_launcher_outside_a_launch_is_refused_before_vllm_starts(monkeypatch):
    """vLLM's external_launcher executor reads RANK and WORLD_SIZE: without a launcher it failed with a KeyError
    traceback from vLLM's executor after the checkpoint was read."""
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(UsageError, match="external_launcher: vLLM then runs in processes a launcher started"):
        VllmSettings(distributed_executor_backend="external_launcher")
    monkeypatch.setenv("RANK", "0")
    assert VllmSettings(distributed_executor_backend="external_launcher").distributed_executor_backend == "external_launcher"


def test_settings_vllms_own_checks_refuse_are_a_usage_error_naming_its_reason():
    """What vLLM's config validation raises while its engine is built (pydantic's ValidationError is a ValueError)
    is a UsageError with vLLM's reason, not a traceback; other failures pass through as they are."""
    from vlmfast.engines.vllm.support import start_llm

    class Refusing:
        def __init__(self, **args):
            raise ValueError(f"Total number of attention heads (4) must be divisible by tensor parallel size "
                             f"({args['tensor_parallel_size']}).")

    with pytest.raises(UsageError, match=r"vLLM refused the engine settings: .*divisible by tensor parallel size \(3\)"):
        start_llm(Refusing, {"tensor_parallel_size": 3})

    class Broken:
        def __init__(self, **args):
            raise RuntimeError("engine core died")

    with pytest.raises(RuntimeError, match="engine core died"):
        start_llm(Broken, {})
