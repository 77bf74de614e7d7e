"""The shared run-until-SIGTERM/SIGINT helper, in this process (signals sent to itself)."""

from __future__ import annotations

import signal
import threading

import pytest

from sixlab.linux.signals import StopOnSignal


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_is_recorded_and_handlers_restored(sig: signal.Signals) -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    calls: list[str] = []
    with StopOnSignal(lambda: calls.append("stop")) as stop:
        assert not stop.stopped
        signal.raise_signal(sig)  # the handler runs before raise_signal returns
        assert stop.stopped
        assert calls == ["stop"]
        stop.wait()  # returns at once: the stop is already recorded
    assert {s: signal.getsignal(s) for s in before} == before


def test_handlers_restored_when_the_block_raises() -> None:
    before = signal.getsignal(signal.SIGTERM)
    inside: list[object] = []

    def fail() -> None:
        with StopOnSignal():
            inside.append(signal.getsignal(signal.SIGTERM))
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail()
    assert inside != [before]
    assert signal.getsignal(signal.SIGTERM) == before


def test_wait_ends_when_alive_turns_false() -> None:
    with StopOnSignal() as stop:
        stop.wait(alive=lambda: False)  # after one slice, with no signal at all
        assert not stop.stopped


def test_only_the_named_signals() -> None:
    before = signal.getsignal(signal.SIGINT)
    with StopOnSignal(signals=(signal.SIGTERM,)):
        assert signal.getsignal(signal.SIGINT) == before


def test_outside_the_main_thread_is_refused_unchanged() -> None:
    before = signal.getsignal(signal.SIGTERM)
    errors: list[BaseException] = []

    def enter() -> None:
        try:
            with StopOnSignal():
                pass
        except ValueError as exc:
            errors.append(exc)

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    assert len(errors) == 1
    assert signal.getsignal(signal.SIGTERM) == before
