"""The CPU allocation record the memory model is measured against (benchmarks/memory_model.py)."""

import threading

import torch

from benchmarks.memory_model import AllocationRecord, peak_bytes

MiB = 2**20


def mib(n: float) -> torch.Tensor:
    return torch.zeros(int(n * MiB) // 4)


def test_the_peak_counts_what_was_made_before_the_step_and_the_most_the_step_held_at_once():
    def step() -> None:
        first = mib(2)
        second = mib(3)  # 4 + 2 + 3 live at once
        del first, second
        mib(1)

    with AllocationRecord() as record:
        kept = mib(4)
        record.measure(step)
    assert record.peak == 9 * MiB
    del kept


def test_a_block_freed_in_a_thread_the_profiler_does_not_see_is_not_counted():
    """A collective's worker thread can hold the last reference to a bucket (gloo): the profiler
    records no free there, and the block would stay counted through every later step."""
    with AllocationRecord() as record:
        kept = mib(4)
        gone = [mib(8)]
        worker = threading.Thread(target=gone.clear)
        worker.start()
        worker.join()
        record.measure(lambda: mib(1))
    assert record.peak == 5 * MiB
    del kept


def test_the_peak_of_a_worked_record():
    """(time, address, bytes): 10 made before the step at address 1, 5 at 2 freed unseen, 20
    from before the record (address 3) freed; in the step (times 10 to 20): 7 at 4, then
    address 4 handed out again for 3 (its 7 freed unseen), 6 at 5, freed."""
    record = [(1, 1, 10), (2, 2, 5), (3, 3, -20), (11, 4, 7), (12, 4, 3), (13, 5, 6), (14, 5, -6)]
    assert peak_bytes(record, 10, 20, held={1}) == 10 + 3 + 6  # 26 with the 7 and the 5 kept
    assert peak_bytes(record[:3], 10, 20, held={1}) == 10  # nothing in the step
    assert peak_bytes(record, 10, 20, held={1, 2}) == 10 + 5 + 3 + 6  # address 2 still held
    late = [(1, 1, 10), (11, 2, 8), (12, 3, 4), (13, 2, -8), (14, 4, 2)]
    assert peak_bytes(late, 10, 20, held={1}) == 22
    assert peak_bytes(late, 10, 12, held={1}) == 22  # the window ends at 12
    assert peak_bytes(late, 10, 11, held={1}) == 18


def test_the_census_reads_no_fake_tensor_a_compiler_left_behind():
    """torch.compile leaves fake tensors in memory; reading their storage's address warns (and
    is to become an error), and they hold no block."""
    import warnings

    from torch._subclasses.fake_tensor import FakeTensorMode

    from benchmarks.memory_model import tensor_storages

    with FakeTensorMode():
        fake = torch.empty(1024)
    real = mib(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        held = tensor_storages()
    assert real.untyped_storage().data_ptr() in held
    del fake
