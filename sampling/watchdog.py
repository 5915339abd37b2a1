"""Time limits on a sampler engine's blocking calls, so a stuck engine fails with a clear error.

vLLM can hang instead of failing: tensor-parallel workers waiting on each other in NCCL, an
engine that cannot get the GPU memory it was promised, a dead worker in the middle of a
generate call. Other projects' issue trackers are full of such runs that sat silent for hours.
Here every engine call (start, generate, weight sync) runs on one daemon thread and the caller
waits at most its limit, then raises SamplerTimeoutError naming the operation, the limit, the
config key that sets it and the usual causes.

Signals (SIGALRM) cannot do this: they only reach the main thread, and Prefect runs tasks in
worker threads. A call that timed out cannot be killed either; its thread is left running (a
daemon, so it does not hold the process open), and the engine refuses further calls, since it
is still inside the old one.

One thread serves all of an engine's calls, rather than a fresh thread per call, so that the
engine's thread-local state (CUDA's current device and stream, vLLM's forward context) is the
same at every call as when the engine was built.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

# What most often makes each vLLM operation hang, for the error message.
COMMON_CAUSES = {
    "start_timeout_s": (
        "tensor-parallel workers waiting on each other in NCCL (check that every GPU in "
        "CUDA_VISIBLE_DEVICES is free and that the GPUs can reach each other; NCCL_DEBUG=INFO "
        "shows where it stops, NCCL_P2P_DISABLE=1 works around broken peer-to-peer links), too "
        "little free GPU memory for gpu_memory_utilization (another process, or the trainer's "
        "own model, holds it), a model folder on slow storage, or the first torch.compile and "
        "CUDA-graph capture of a large model"
    ),
    "generate_timeout_s": (
        "a tensor-parallel worker that died or waits in a collective, a KV cache too small for "
        "the batch (lower max_model_len or raise gpu_memory_utilization), or simply many long "
        "completions in one call"
    ),
    "sync_timeout_s": (
        "a tensor-parallel worker that died or waits in a collective, a trainer whose gathered "
        "ZeRO-3 weights do not fit next to the engine, or a very large model on slow host-to-GPU "
        "copies"
    ),
}


class SamplerTimeoutError(TimeoutError):
    """An engine call ran past its limit. The engine is left inside that call: restart the
    process before sampling again."""

    def __init__(self, operation: str, limit_s: float, config_key: str):
        self.operation, self.limit_s, self.config_key = operation, limit_s, config_key
        causes = COMMON_CAUSES.get(config_key, "see the engine's log")
        super().__init__(
            f"vLLM {operation} did not finish within {limit_s:g} s (the sampler's "
            f"`{config_key}`). Common causes: {causes}. If it is only slow, raise "
            f"`sampler.{config_key}` in the stage's config (for example "
            f"--set reasoning_rl.sampler.{config_key}={max(2 * limit_s, 1):g}; run again with it "
            "raised, the stage resumes from its last checkpoint). The engine is "
            "still inside the unfinished call: restart the process before sampling again."
        )


class EngineStuckError(RuntimeError):
    """A call to an engine whose earlier call timed out and never returned."""


@dataclass
class _Job:
    fn: Callable[[], Any] | None
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


class EngineThread:
    """Runs an engine's calls one at a time on a daemon thread; `call` waits at most a limit."""

    def __init__(self, name: str = "sampler-engine"):
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._stuck_in: str | None = None
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                assert job.fn is not None
                job.result = job.fn()
            except BaseException as error:  # handed to the caller, unchanged
                job.error = error
            finally:
                job.done.set()
            # the finished job (and whatever it returned: the engine itself, for a start) must
            # not stay referenced from this frame while the thread waits for the next one
            del job

    def call(
        self,
        fn: Callable[[], T],
        limit_s: float,
        operation: str,
        config_key: str,
        wait_s: float | None = None,
    ) -> T:
        """`fn()` on the engine thread; its result, or its exception re-raised as it was, or
        SamplerTimeoutError when it has not returned after `limit_s` seconds (`wait_s`, when
        given: what is left of a limit that earlier calls shared, see Deadline)."""
        if self._stuck_in is not None:
            raise EngineStuckError(
                f"the vLLM engine is still inside an earlier {self._stuck_in} that timed out; "
                "restart the process to get a working engine"
            )
        job = _Job(fn)
        self._jobs.put(job)
        if not job.done.wait(limit_s if wait_s is None else wait_s):
            self._stuck_in = operation
            raise SamplerTimeoutError(operation, limit_s, config_key)
        result, error = job.result, job.error
        job.result = job.error = job.fn = None  # nothing of the call outlives it here
        if error is not None:
            raise error
        return result

    def close(self) -> None:
        """Let the thread end after the call in hand (if any)."""
        self._jobs.put(None)


@dataclass
class Deadline:
    """One limit shared by several calls (a weight sync is many load calls)."""

    limit_s: float
    operation: str
    config_key: str
    began: float = field(default_factory=time.perf_counter)

    def remaining(self) -> float:
        """Seconds left; SamplerTimeoutError when none are."""
        left = self.limit_s - (time.perf_counter() - self.began)
        if left <= 0:
            raise SamplerTimeoutError(self.operation, self.limit_s, self.config_key)
        return left

    def call(self, thread: EngineThread, fn: Callable[[], T]) -> T:
        """`fn()` on `thread`, waiting at most what is left of this limit."""
        return thread.call(fn, self.limit_s, self.operation, self.config_key, self.remaining())
