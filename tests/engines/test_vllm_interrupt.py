"""A Ctrl-C while vLLM starts ends the start (vlmfast.engines.vllm.support.interrupt_stops_start): vLLM's start-up
swallows a KeyboardInterrupt during its handshake and then waits in a long poll, and its engine processes die of
the same Ctrl-C, which vLLM reports as a RuntimeError. Each is played here by the code inside the context."""

import os
import select
import signal
import socket
import threading

import pytest

from vlmfast.engines.vllm.support import interrupt_stops_start


def _ctrl_c_swallowed(signum=signal.SIGINT):
    """A Ctrl-C whose KeyboardInterrupt the code catches and drops, as vLLM's ZeroMQ socket context does."""
    try:
        os.kill(os.getpid(), signum)
        for _ in range(1000):  # the handler runs between bytecodes: soon
            pass
    except KeyboardInterrupt:
        pass


def _watchers_ended() -> bool:
    """Every start's watcher thread has ended (joined): none is left to send a signal into later code."""
    watchers = [t for t in threading.enumerate() if t.name == "vlmfast-interrupt"]
    for watcher in watchers:
        watcher.join(timeout=30)
    return not [t for t in watchers if t.is_alive()]


def test_a_swallowed_ctrl_c_still_interrupts_the_wait_that_follows():
    waiting, _ = socket.socketpair()
    try:
        with pytest.raises(KeyboardInterrupt):
            with interrupt_stops_start():
                _ctrl_c_swallowed()
                select.select([waiting], [], [], 120)  # nothing comes: only the signal sent again ends this wait
    finally:
        waiting.close()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_engine_dead_of_the_same_ctrl_c_is_an_interrupt_and_other_failures_stay_themselves():
    with pytest.raises(KeyboardInterrupt):
        with interrupt_stops_start():
            _ctrl_c_swallowed()
            raise RuntimeError("Engine core initialization failed. See root cause above.")
    with pytest.raises(RuntimeError, match="no Ctrl-C"):
        with interrupt_stops_start():
            raise RuntimeError("no Ctrl-C")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.set_wakeup_fd(-1) == -1  # the wakeup file is given back too
    assert _watchers_ended()  # each start's watcher ended with it


def test_an_ignored_ctrl_c_stays_ignored_and_other_threads_are_left_alone():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job's
    try:
        with interrupt_stops_start():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
    seen = []

    def in_a_thread():
        with interrupt_stops_start():
            seen.append(signal.getsignal(signal.SIGINT))
    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    assert seen == [signal.default_int_handler]


def test_a_start_that_completes_after_a_swallowed_ctrl_c_is_still_an_interrupt():
    with pytest.raises(KeyboardInterrupt):
        with interrupt_stops_start():
            _ctrl_c_swallowed()  # the handshake swallows it, then the start completes before any re-send
    assert _watchers_ended() and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_sigterm_mapped_to_an_interrupt_is_sent_again_too():
    from vlmfast.cli.common import terminate_as_interrupt

    waiting, _ = socket.socketpair()
    try:
        with terminate_as_interrupt(), pytest.raises(KeyboardInterrupt):
            with interrupt_stops_start():
                _ctrl_c_swallowed(signal.SIGTERM)
                select.select([waiting], [], [], 120)
    finally:
        waiting.close()
