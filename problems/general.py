"""Small general (non-reasoning) tasks for stages 5-6: mixed SFT data and preference pairs.

DeepSeek-R1 adds writing, factual QA and the like to its mixed SFT (stage 5) and scores such
prompts with a preference reward model in its last RL stage (stage 6). The tiny world's stand-in
is a handful of short tasks whose good response is easy to state: correct, concise, in the
prompt's script, and in the house format `<think> one sentence </think> <answer> ... </answer>`.

A preference pair puts that good response against one bad one of a named kind (wrong answer,
verbose, wrong or mixed script, missing tags, repetition loop), so a reward model has to learn
several things at once and its held-out accuracy can be read per kind. Tasks are split train /
held-out by a hash of their `key` (the task without wording or script), so no underlying task is
on both sides, whatever the seed's draw order.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from configs.data import GENERAL_KINDS, GENERAL_REJECTIONS, GeneralConfig
from contracts.answer_format import ANSWER_CLOSE, ANSWER_OPEN, formatted
from problems.corpus import other_script
from problems.general_words import FILLER, GREETINGS, NAMES, OPPOSITES, THINGS, WORDS
from problems.scripts import to_script
from problems.types import Problem

Side = Literal["train", "heldout"]
Rng = random.Random

KINDS = GENERAL_KINDS
REJECTIONS = GENERAL_REJECTIONS


@dataclass(frozen=True)
class GeneralTask:
    """One task instance; `prompt`, `answer` and `thought` are already in `language`'s script."""

    id: str
    key: str
    kind: str
    language: str
    prompt: str
    answer: str
    thought: str

    def response(self) -> str:
        return house_format(self.thought, self.answer)


@dataclass(frozen=True)
class PreferencePair:
    id: str
    key: str
    kind: str
    language: str
    prompt: str
    chosen: str
    rejected: str
    rejection: str


def house_format(thought: str, answer: str) -> str:
    return formatted(thought, answer)


# ---- tasks: (key, prompt, answer, thought, wrong answers) in Latin script ----------------------

Spec = tuple[str, str, str, str, list[str]]


def _capitals(rng: Rng) -> Spec:
    w = rng.choice(WORDS)
    prompt = rng.choice(["Write the word {w} in capital letters.", "Spell {w} in upper case."])
    other = rng.choice([x for x in WORDS if x != w]).upper()
    thought = "I write every letter of the word as a capital."
    return f"capitals:{w}", prompt.format(w=w), w.upper(), thought, [w, w.capitalize(), other]


def _word_list(rng: Rng) -> list[str]:
    return rng.sample(WORDS, rng.randint(3, 4))


def _reverse(rng: Rng) -> Spec:
    items = _word_list(rng)
    prompt = rng.choice(["Reverse the list: {l}.", "Write this list backwards: {l}."])
    rotated = items[1:] + items[:1]
    wrong = [", ".join(items), ", ".join(rotated)]
    thought = "I read the list from the last item to the first."
    answer = ", ".join(reversed(items))
    return f"reverse:{','.join(items)}", prompt.format(l=", ".join(items)), answer, thought, wrong


def _sort(rng: Rng) -> Spec:
    items = _word_list(rng)
    prompt = rng.choice(["Sort these words alphabetically: {l}.", "Put in A to Z order: {l}."])
    answer = sorted(items)
    wrong = [items if items != answer else answer[::-1], answer[::-1], answer[1:] + answer[:1]]
    thought = "I put the words in alphabetical order."
    key = f"sort:{','.join(answer)}"  # the same words in another order are the same task
    return (
        key,
        prompt.format(l=", ".join(items)),
        ", ".join(answer),
        thought,
        [", ".join(x) for x in wrong],
    )


def _thing_fact(rng: Rng, kind: str) -> Spec:
    thing = rng.choice(sorted(THINGS))
    index = 0 if kind == "colour" else 1
    answer = THINGS[thing][index]
    others = sorted({v[index] for v in THINGS.values()} - {answer})
    if kind == "colour":
        prompt = rng.choice(["What colour is a {t}?", "Name the colour of a {t}."])
        thought = "I recall the usual colour of this thing."
    else:
        prompt = rng.choice(
            ["What kind of thing is a {t}?", "Is a {t} a fruit, vegetable, animal or drink?"]
        )
        thought = "I recall which group this thing belongs to."
    return f"{kind}:{thing}", prompt.format(t=thing), answer, thought, others


def _repeat(rng: Rng) -> Spec:
    w, n = rng.choice(WORDS), rng.randint(2, 4)
    prompt = rng.choice(["Repeat the word {w} {n} times.", "Write {w} exactly {n} times."])
    other = rng.choice([x for x in WORDS if x != w])
    wrong = [" ".join([w] * (n - 1)), " ".join([w] * (n + 1)), " ".join([other] * n)]
    thought = f"I write the word {n} times."
    return f"repeat:{w}:{n}", prompt.format(w=w, n=n), " ".join([w] * n), thought, wrong


def _greeting(rng: Rng) -> Spec:
    said, name = rng.choice(sorted(GREETINGS)), rng.choice(NAMES)
    other = rng.choice([x for x in NAMES if x != name])
    reply = GREETINGS[said]
    wrong = [reply.format(name=other), "Go away.", f"The answer is {rng.randint(2, 40)}."]
    thought = "The user greets me, so I answer politely and briefly."
    key = f"greeting:{said}:{name}"
    return key, said.format(name=name), reply.format(name=name), thought, wrong


def _one_word(rng: Rng) -> Spec:
    w = rng.choice(sorted(OPPOSITES))
    prompt = rng.choice(
        [
            "Answer in exactly one word: what is the opposite of {w}?",
            "In one word, the opposite of {w}?",
        ]
    )
    others = [w] + rng.sample(sorted(set(OPPOSITES) - {w, OPPOSITES[w]}), 2)
    thought = "I need the opposite, in one word."
    return f"one_word:{w}", prompt.format(w=w), OPPOSITES[w], thought, others


_MAKERS: dict[str, Callable[[Rng], Spec]] = {
    "capitals": _capitals,
    "reverse": _reverse,
    "colour": lambda rng: _thing_fact(rng, "colour"),
    "category": lambda rng: _thing_fact(rng, "category"),
    "repeat": _repeat,
    "sort": _sort,
    "greeting": _greeting,
    "one_word": _one_word,
}


def is_heldout(key: str, seed: int, share: float) -> bool:
    """The task's side, from a stable hash of its key: independent of draw order and process."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()
    return int(digest[:8], 16) / 16**8 < share


def draw_tasks(
    cfg: GeneralConfig, side: Side, stream: str
) -> Iterator[tuple[GeneralTask, list[str]]]:
    """Endless seeded task instances on one side, each with its wrong answers (in script).

    `stream` names the consumer ("sft", "pairs", ...), so each file has its own reproducible draw.
    """
    rng = random.Random(f"{cfg.seed}:{side}:{stream}")
    count = 0
    while True:
        kind = rng.choice(cfg.kinds)
        key, prompt, answer, thought, wrong = _MAKERS[kind](rng)
        if is_heldout(key, cfg.seed, cfg.heldout_share) != (side == "heldout"):
            continue
        count += 1
        script = "greek" if rng.random() < cfg.second_script_share else "latin"
        task = GeneralTask(
            id=f"general-{side}-{stream}-{count:06d}",
            key=key,
            kind=kind,
            language=script,
            prompt=to_script(prompt, script),
            answer=to_script(answer, script),
            thought=to_script(thought, script),
        )
        yield task, [to_script(w, script) for w in wrong]


# ---- rejected responses ------------------------------------------------------------------------


def rejected_response(task: GeneralTask, wrong: list[str], rejection: str, rng: Rng) -> str:
    """A plausible bad response of kind `rejection`; never equal to the good one."""
    script, thought, answer = task.language, task.thought, task.answer
    if rejection == "wrong":
        return house_format(thought, rng.choice(wrong))
    if rejection == "verbose":
        pad = [to_script(s, script) for s in rng.sample(FILLER, 4)]
        stop = "" if answer[-1] in ".!?" else "."
        return house_format(" ".join([thought, *pad[:2]]), " ".join([answer + stop, *pad[2:]]))
    if rejection == "script":
        other = other_script(script)
        if rng.random() < 0.5:
            return house_format(in_script(thought, other), in_script(answer, other))
        return house_format(in_script(thought, other), answer)  # mixed: reasons in the other one
    if rejection == "no_tags":
        bare = f"{ANSWER_OPEN} {answer} {ANSWER_CLOSE}"
        return f"{thought} {answer}" if rng.random() < 0.5 else bare
    if rejection == "repetition":
        times = rng.randint(3, 5)
        return house_format(" ".join([thought] * times), " ".join([answer] * rng.randint(2, 3)))
    raise ValueError(f"unknown rejection {rejection!r}; known: {REJECTIONS}")


_LATIN = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_FROM_GREEK = str.maketrans(to_script(_LATIN, "greek"), _LATIN)


def in_script(text: str, script: str) -> str:
    """`text` (tiny-world English in either script) rewritten in `script`."""
    return to_script(text.translate(_FROM_GREEK), script)


def preference_pairs(cfg: GeneralConfig, side: Side, n: int) -> list[PreferencePair]:
    """`n` pairs on `side`, the rejection kinds in equal shares (the tasks are drawn at random)."""
    rng = random.Random(f"{cfg.seed}:{side}:rejections")
    tasks = draw_tasks(cfg, side, "pairs")
    pairs = []
    for i in range(n):
        task, wrong = next(tasks)
        rejection = cfg.rejections[i % len(cfg.rejections)]  # an even mix, every kind present
        pairs.append(
            PreferencePair(
                id=task.id,
                key=task.key,
                kind=task.kind,
                language=task.language,
                prompt=task.prompt,
                chosen=task.response(),
                rejected=rejected_response(task, wrong, rejection, rng),
                rejection=rejection,
            )
        )
    return pairs


# ---- the sets a pipeline writes ----------------------------------------------------------------


def sft_rows(cfg: GeneralConfig) -> list[dict[str, str]]:
    """Mixed-SFT rows (prompt, good response) from training-side tasks, distinct prompts."""
    return [
        {
            "id": t.id,
            "key": t.key,
            "kind": t.kind,
            "language": t.language,
            "prompt": t.prompt,
            "response": t.response(),
        }
        for t in _distinct(draw_tasks(cfg, "train", "sft"), cfg.n_sft)
    ]


def general_problems(cfg: GeneralConfig, side: Side, n: int) -> list[Problem]:
    """Distinct general prompts as `Problem`s (the answer block's content as the gold answer), so
    RL and evaluation load them with the same loader as the arithmetic problems."""
    stream = "eval" if side == "heldout" else "rl"
    return [
        Problem(
            id=t.id,
            question=t.prompt,
            answer=t.answer,
            language=t.language,
            source=f"general/{t.kind}",
            key=t.key,
            kind="general",
        )
        for t in _distinct(draw_tasks(cfg, side, stream), n)
    ]


def _distinct(tasks: Iterator[tuple[GeneralTask, list[str]]], n: int) -> list[GeneralTask]:
    seen: dict[str, GeneralTask] = {}
    misses = 0
    while len(seen) < n:
        task, _ = next(tasks)
        if task.prompt in seen:
            misses += 1
            if misses > 10_000:
                raise ValueError(f"only {len(seen)} distinct general prompts here; ask for fewer")
            continue
        seen[task.prompt], misses = task, 0
    return list(seen.values())
