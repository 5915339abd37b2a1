"""The CPU backend: batches of prompts through our own decode loop (sampling/decode.py).

Prompts are sorted by token length before batching, so a batch pads (and its KV cache holds)
little beyond its prompts, and each batch holds all n samples of its prompts, so every prompt is
prefilled once. Results come back in prompt order.

Measured and left out: refilling a batch with new prompts as rows finish. On the tiny world's
evaluation (completions of 44-106 tokens, batch 128, one thread) the steps after the first row
finished took 1.9 s of 4.9 s of decoding; at the full batch's cost per row they would take 1.4 s,
so refilling could save at most 8% of the sampler's time, before paying for extra small prefills
and for re-aligning caches of different lengths. Batches of 256 and 512 were within noise of 128
on one thread: attention reads each row's whole cache every step, whatever the batch.

On the CPU, where a call has rows enough, the loop decodes in lanes: Python threads (torch
releases the GIL inside each op), each decoding its own batches with one torch thread, as many as
the process has torch threads and each with LANE_ROWS rows or more. A decode step is dozens of
small ops, each an OpenMP parallel region whose threads wait for each other; a lane of one thread
waits for nobody, so lanes beside other work do not depend on how threads wait: 512 rows in two
lanes of 256 decoded at 13,600 tokens/s, against 12,900 for one batch on two spinning threads and
7,900 on two passive ones. Smaller calls (a GRPO step's 64-128 rows) decode as one batch on the
process's torch threads: two lanes of 32-64 rows were no faster than one (each lane's Python work
holds the GIL), while two threads that spin decoded 128 rows at 10,400 tokens/s where one thread
did 7,300 (host/waiting.py keeps threads spinning while the CPUs are the process's own). Every row
draws from its own stream, so the lanes' samples are those of one batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from host.terminal import progress_bar
from models.chat import generation_eos, stop_token_ids
from sampling.decode import Decoded, LockStep, decode
from sampling.interface import Completion, SamplingParams
from sampling.streams import row_keys

LANE_ROWS = 256  # the fewest rows a lane decodes at once: below, its Python work outweighs a core
# (rows, context, prompt tokens) -> a whole model for the call, or None to use the sampler's own
Materialize = Callable[[int, int, int], AbstractContextManager[PreTrainedModel | None]]


class HFSampler:
    """`generate(prompts, n, params)` with a transformers model in this process.

    `batch_size` counts rows (prompt x sample) decoded together. Each row draws from its own
    stream, keyed by (params.seed, params.prompt_offset + prompt index, sample index), so a
    prompt's samples do not depend on the batch size, the other prompts or their order, and the
    global torch RNG is left alone.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int = 64,
        show_progress: bool = True,
        plain_step: bool = True,
        lockstep: LockStep | None = None,
        materialize: Materialize | None = None,
        static: bool | None = None,
        compile_step: bool = False,
    ):
        """`lockstep`: this rank decodes a ZeRO-3 model in step with the others
        (sampling/decode.py). `materialize`: for each generate call, a whole model to decode
        with instead (a ZeRO-3 model gathered once, training/whole_copy.py), or None when
        `model` itself must be used. `static`: decode over a static cache (CUDA graphs on a
        GPU; by default there, sampling/static_decode.py), its step compiled by Inductor with
        `compile_step`."""
        self.model = model.eval()
        self.lockstep = lockstep
        self.materialize = materialize
        self.plain_step = plain_step  # decode steps in plain tensor ops (sampling/decode_step.py)
        self.static, self.compile_step = static, compile_step
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.show_progress = show_progress
        # as the model's own generate and vLLM stop: generation_config's eos ids too
        self.stop_ids = stop_token_ids(tokenizer, generation_eos(model))

    def generate(
        self, prompts: Sequence[str], n: int, params: SamplingParams
    ) -> list[list[Completion]]:
        """n completions for each prompt, in prompt order."""
        if not prompts:
            return []
        encoded = self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
        order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))
        rows = [(p, j) for p in order for j in range(n)]
        out: list[list[Completion | None]] = [[None] * n for _ in prompts]
        longest = max(len(x) for x in encoded)
        call = (min(len(rows), self.batch_size), longest + params.max_new_tokens, longest)
        with self._model(*call) as (model, lockstep):
            lanes = cpu_lanes(model, lockstep, min(len(rows), self.batch_size))
            size = -(-self.batch_size // lanes) if lanes else self.batch_size
            batches = [rows[s : s + size] for s in range(0, len(rows), size)]
            progress = progress_bar(
                self.show_progress,
                total=len(batches),
                desc="sample",
                unit="batch",
                leave=False,
            )

            def one(batch: list[tuple[int, int]]) -> list[Decoded]:
                decoded = self._decode(model, lockstep, encoded, batch, params)
                progress.update()
                return decoded

            with progress, one_thread_each(lanes) as run:
                for batch, decoded in zip(batches, run(one, batches), strict=True):
                    for (p, j), done in zip(batch, decoded, strict=True):
                        out[p][j] = self._completion(done)
        return [[c for c in group if c is not None] for group in out]

    @contextmanager
    def _model(
        self, rows: int, context: int, prompt: int
    ) -> Iterator[tuple[PreTrainedModel, LockStep | None]]:
        """The model a call decodes with, and whether its ranks go in step."""
        if self.materialize is None:
            yield self.model, self.lockstep
            return
        with self.materialize(rows, context, prompt) as whole:
            yield (self.model, self.lockstep) if whole is None else (whole, None)

    def _decode(
        self,
        model: PreTrainedModel,
        lockstep: LockStep | None,
        encoded: list[list[int]],
        batch: list[tuple[int, int]],
        params: SamplingParams,
    ) -> list[Decoded]:
        distinct = list(dict.fromkeys(p for p, _ in batch))
        slot = {p: i for i, p in enumerate(distinct)}
        keys = row_keys(
            params.seed,
            torch.tensor([params.prompt_offset + p for p, _ in batch]),
            torch.tensor([j for _, j in batch]),
        )
        return decode(
            model,
            [encoded[p] for p in distinct],
            [slot[p] for p, _ in batch],
            temperature=params.temperature,
            top_p=params.top_p,
            max_new_tokens=params.max_new_tokens,
            stop_ids=self.stop_ids,
            pad_id=self.tokenizer.pad_token_id,
            keys=keys,
            plain_step=self.plain_step,
            lockstep=lockstep,
            static=self.static,
            compile_step=self.compile_step,
        )

    def _completion(self, done: Decoded) -> Completion:
        ids = done.token_ids
        text_ids = ids[:-1] if done.finish_reason == "stop" else ids
        text = self.tokenizer.decode(text_ids, skip_special_tokens=True).strip()
        return Completion(text, ids, done.logprobs, done.finish_reason)

    def close(self) -> None:
        """Let go of the model (the caller's, or the one the sampler was opened on) and return
        its cached device memory; safe to call twice."""
        self.model = None  # type: ignore[assignment]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()

    def __enter__(self) -> HFSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def cpu_lanes(model: PreTrainedModel, lockstep: LockStep | None, rows: int) -> int:
    """How many lanes decode a call's batches side by side: one per torch thread of this process,
    as far as each gets LANE_ROWS rows of the `rows` a batch holds; 0 where fewer than two would
    (or off the CPU, or in step with other ranks): one batch at a time on torch's own threads
    (or the device)."""
    if lockstep is not None or model.device.type != "cpu":
        return 0
    lanes = min(torch.get_num_threads(), rows // LANE_ROWS)
    return lanes if lanes >= 2 else 0


@contextmanager
def one_thread_each(lanes: int) -> Iterator[Callable[..., Iterator]]:
    """`run(fn, items)`: `fn` over `items` in order. With two lanes or more, each lane is a
    Python thread taking the next item, torch running one thread per lane within the block (the
    count it had restored after); else `map` on this thread, with torch's threads."""
    if lanes < 2:
        yield map
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(lanes, thread_name_prefix="decode-lane") as pool:
            yield pool.map
    finally:
        torch.set_num_threads(threads)
