"""Run-ahead: a burst's decode steps run on a thread of their own, one step ahead of the engine.

ONNX Runtime releases the GIL while a session runs, so the engine thread's Python (its requests'
tokens, text, stops and events) can go on while the model computes the step after. The worker runs a
burst's steps back to back, each fed the tokens the one before picked, and hands each step's tokens
over; before it runs step n + 2 it waits for the engine's answer on step n (go on, or the burst ends),
so it is never more than one step ahead, and where the engine keeps up it never waits at all: no
hand-off lies between two steps. Where the engine says the burst ends at step n, step n + 1 has run:
it is handed over too and counted (seam.SlotRunner's one-step lag). Knows nothing of requests: calls
in, token arrays out.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

import numpy as np
import onnxruntime as ort

from ..engine.seam import Enough
from .arena import Device
from .model_sessions import usable_cores

Step = Callable[[np.ndarray], np.ndarray]  # fed the last step's tokens (never writing them): the next step's
DONE = object()  # the worker's last word on a burst


def spare_core(session: ort.InferenceSession) -> bool:
    """Whether the engine's thread has a core to itself while the model runs on the CPU: ONNX Runtime's
    intra-op threads leave two of this process's cores free, one for the front end (its process, or its
    event loop) and one for the engine's thread. With every core computing the step, the engine's work
    only takes turns with it (GPT-2 124M int8 on 2 cores served: 0.99-1.01x); with the one core the
    default leaves to the front end, the front end and the client take it (a 1M-parameter model served
    on 2 cores: 0.99-1.05x), where the engine alone with a core to itself gains 1.12-1.13x at interval 1
    (docs/reports/run-ahead.md)."""
    threads = session.get_session_options().intra_op_num_threads
    return 0 < threads <= usable_cores() - 2


def may_run_ahead(mode: str, session: ort.InferenceSession, device: Device) -> bool:
    """Whether a runner runs ahead when the engine asks (--run-ahead): on; off; auto on the CPU where a core
    is spare, and not on a GPU, where it gained nothing served (an H200, GPT-2 124M float16: 0.97, 0.77,
    1.14 and 1.05x at 1, 16, 64 and 256 streams; the 1M-parameter model 0.93, 1.02 and 0.94x at 1, 16 and
    64: docs/reports/gpu-ladder.md)."""
    return mode == "on" or (mode == "auto" and device.kind == "cpu" and spare_core(session))


class RunAhead:
    """One worker thread that runs its owner's bursts (a daemon: it lives as long as its process)."""

    def __init__(self, name: str = "attnserve-run-ahead"):
        self._bursts: queue.SimpleQueue = queue.SimpleQueue()  # (first, step, steps, tokens, answers), or None
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def decode_steps(
        self, keys: list[int], first: Callable[[], np.ndarray], step: Step, steps: int, enough: Enough
    ) -> int:
        """Up to `steps` steps (the first `first()`, each next `step(tokens)`) on the worker, each one's
        tokens handed to `enough` here as they come, until it says the burst ends (then the step already
        run is handed over too, its answer not asked); the steps run. A step's error is raised here."""
        tokens: queue.SimpleQueue = queue.SimpleQueue()  # each step's tokens, an error, then DONE
        answers: queue.SimpleQueue = queue.SimpleQueue()  # per step: the burst goes on (True) or ends
        self._bursts.put((first, step, steps, tokens, answers))
        ran, ending = 0, False
        try:
            while (got := tokens.get()) is not DONE:
                if isinstance(got, BaseException):
                    raise got
                ran += 1
                if ending:  # the step run ahead of the end
                    enough(keys, got)
                    continue
                ending = enough(keys, got) or ran == steps
                answers.put(not ending)
            return ran
        finally:  # the worker is ours again before anything else runs the model: never left running
            answers.put(False)
            while got is not DONE:
                got = tokens.get()

    def close(self) -> None:
        """Stop the worker (between bursts)."""
        self._bursts.put(None)
        self._thread.join()

    def _serve(self) -> None:
        while (burst := self._bursts.get()) is not None:
            first, step, steps, tokens, answers = burst
            try:
                last = first()
                tokens.put(last)
                for ran in range(1, steps):
                    if ran >= 2 and not answers.get():  # the engine's answer on step ran - 1
                        break
                    last = step(last)
                    tokens.put(last)
            except BaseException as error:  # noqa: BLE001 -- handed to the owner, raised in its thread
                tokens.put(error)
            tokens.put(DONE)
