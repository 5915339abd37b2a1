"""Stage 0: the policy's base model.

In the tiny world, a tokenizer and a small Qwen2/Llama base model from scratch: the base is
pretrained on a synthetic corpus (problems.corpus) whose style mix makes it what R1 starts from,
in miniature: sometimes right, sometimes mixing languages, rarely using the think/answer format.
With real checkpoints (`bootstrap.path`), R1's starting point exists already: the folder is
checked (models.checkpoint) and used where it lies, and nothing trains.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from configs.schema import StudentConfig
from configs.supervised import (
    BootstrapConfig,
    CorpusConfig,
    ModelConfig,
    TeacherConfig,
    TrainConfig,
)
from curation.teacher import write_traces
from models.chat import render_completions, render_prompt
from models.checkpoint import check_checkpoint
from models.loading import build_model, cut_layers, load_model, load_tokenizer, parameter_count
from models.saved import ModelRef, save_model
from models.tokenizer import train_tokenizer
from problems.corpus import Document, build_corpus
from problems.loader import load_problems
from problems.solutions import solution_trace, traceable
from problems.types import ProblemSet
from stages.fingerprint import fingerprint
from stages.tracker import Tracker
from training.examples import Examples, lm_examples
from training.supervised import train

log = logging.getLogger(__name__)


def tokenizer_texts(docs: list, train_problems: list, seed: int) -> list[str]:
    """The corpus plus clean teacher traces (a real data set's problems: their own solutions
    as traces).

    A real tokenizer is trained on far broader text than a base model's answers; without the
    reasoning vocabulary, every later long trace would fall apart into byte-level pieces (two per
    Greek letter). The traces shape only the vocabulary, not the base model.
    """
    tiny = [p for p in train_problems if traceable(p)]
    traces = [t.completion for t in write_traces(tiny, TeacherConfig.faultless(seed))]
    traces += [solution_trace(p) or "" for p in train_problems if not traceable(p)]
    return [d.question for d in docs] + [d.response for d in docs] + traces


def run(
    config: BootstrapConfig, problems: ProblemSet, out_dir: Path, tracker: Tracker, seed: int = 0
) -> ModelRef:
    if config.path is not None:
        return from_checkpoint(config.path, tracker)
    train_problems = load_problems(problems.train_path)
    docs = build_corpus(train_problems, config.corpus, seed=seed)
    styles = Counter(d.style for d in docs)
    tracker.log_metrics({f"corpus/{style}": float(n) for style, n in styles.items()})
    texts = tokenizer_texts(docs, train_problems, seed)
    log.info(
        "bootstrap: %s problems, %s corpus documents; training a %d-token tokenizer on %s texts "
        "(%.0f MB)", f"{len(train_problems):,}", f"{len(docs):,}", config.vocab_size,
        f"{len(texts):,}", sum(map(len, texts)) / 1e6,
    )  # fmt: skip
    tokenizer = train_tokenizer(texts, config.vocab_size)
    del texts
    return pretrain(
        config.model,
        config.train,
        tokenizer,
        docs,
        out_dir,
        tracker,
        fingerprint(config, problems.train_path, seed),
        seed,
        desc="bootstrap",
    )


def from_checkpoint(path: Path, tracker: Tracker) -> ModelRef:
    """A pretrained checkpoint as the base (or a student's base): checked, not copied, and
    referred to by its absolute path, so a later run from another folder finds it too."""
    checked = check_checkpoint(path)
    log.info(
        "checkpoint %s: %s, %d parameters, %d tokens, turns end with %s",
        path,
        checked.model_type,
        checked.parameters,
        checked.tokens,
        checked.end_of_turn,
    )
    tracker.log_metrics(
        {
            "model/parameters": float(checked.parameters),
            "model/tokenizer_tokens": float(checked.tokens),
            "model/embedding_rows": float(checked.embedding_rows),
        }
    )
    return ModelRef(path=path.resolve(), parameters=checked.parameters)


def pretrain_student(
    student: StudentConfig,
    corpus: CorpusConfig,
    base: ModelRef,
    problems: ProblemSet,
    out_dir: Path,
    tracker: Tracker,
    seed: int = 0,
) -> ModelRef:
    """A distillation student's base: a smaller model, the same tokenizer and corpus as the base.

    Real students (Qwen2.5, Llama 3) come pretrained; the tiny world makes its own, as it makes
    the teacher's base: cut from the base's layers, pretrained, or cut and then pretrained.
    """
    if student.model is None:
        raise ValueError(f"student {student.name!r} has a path; only the tiny world pretrains")
    tokenizer = load_tokenizer(base.path)
    init = None
    if student.base_layers is not None:
        init, left_out = cut_layers(
            load_model(base.path),
            student.model,
            student.base_layers,
            tokenizer.pad_token_id,
            tokenizer.eos_token_id,
        )
        log.info(
            "student %s: layers %s of the base; %d base weights have no place in it",
            student.name,
            student.base_layers,
            len(left_out),
        )
    if student.pretrain is None:
        assert init is not None  # StudentConfig: unpretrained only when cut from the base
        tracker.log_metrics({"model/parameters": float(parameter_count(init))})
        return save_model(init, tokenizer, out_dir)
    docs = build_corpus(load_problems(problems.train_path), corpus, seed=seed)
    return pretrain(
        student.model,
        student.pretrain,
        tokenizer,
        docs,
        out_dir,
        tracker,
        fingerprint(student, corpus, base.path, problems.train_path, seed),
        seed,
        desc=f"pretrain {student.name}",
        init=init,
    )


def corpus_examples(
    tokenizer: PreTrainedTokenizerBase, docs: list[Document], max_length: int
) -> Examples:
    """The corpus documents as causal-LM examples, each a chat turn: question, then response."""
    completions = render_completions(tokenizer, [d.response for d in docs])
    texts = [
        render_prompt(tokenizer, d.question) + c for d, c in zip(docs, completions, strict=True)
    ]
    return lm_examples(tokenizer, texts, max_length)


def pretrain(
    model_config: ModelConfig,
    train_config: TrainConfig,
    tokenizer: PreTrainedTokenizerBase,
    docs: list[Document],
    out_dir: Path,
    tracker: Tracker,
    fp: str,
    seed: int,
    desc: str,
    init: PreTrainedModel | None = None,
) -> ModelRef:
    """A decoder trained as a causal LM on the corpus documents: fresh, or from `init`."""
    log.info("%s: tokenising %s corpus documents", desc, f"{len(docs):,}")
    examples = corpus_examples(tokenizer, docs, train_config.max_length)
    examples.cuts.report(tracker.log_metrics, desc)
    model = init
    if model is None:
        model = build_model(
            model_config, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, seed
        )
    n_params = parameter_count(model)
    log.info("%s: %d documents, vocab %d, %d parameters", desc, len(docs), len(tokenizer), n_params)
    tracker.log_metrics({"corpus/documents": float(len(docs)), "model/parameters": float(n_params)})
    report = train(
        model,
        examples,
        train_config,
        out_dir / "checkpoints",
        fp,
        tracker.log_metrics,
        pad_id=tokenizer.pad_token_id,
        desc=desc,
    )
    tracker.log_metrics(
        {"train/tokens_per_second": report.tokens_per_second, "train/steps": report.steps}
    )
    return save_model(model, tokenizer, out_dir)
