"""Whether a profile's real training data can feed the stages it asks for, checked up front.

The tiny world's problems carry worked steps the programmatic teacher traces; a real data set's
carry, at most, a person's worked solution. Some combinations of data and settings therefore
cannot run (the teacher cannot trace GSM8K; curation from solutions needs solutions), and would
otherwise stop minutes in, at the stage that meets them. This reads the first rows of the
training file and names each such combination with its fix.
"""

from __future__ import annotations

from configs.schema import PipelineConfig
from problems.loader import ProblemFileError, read_problems
from problems.solutions import traceable

SAMPLE_ROWS = 200  # enough to tell a data set's kind; the file may hold millions
CURATING_FLOWS = ("r1_pipeline",)  # the flows that curate a cold-start set
BOOTSTRAPPING_FLOWS = ("r1_pipeline", "r1_zero")


class DataFitError(ValueError):
    """The profile's data cannot feed a stage it asks for; the message names each fix."""


def data_fit_problems(config: PipelineConfig, flow: str = "r1_pipeline") -> list[str]:
    """Each reason the training data cannot feed the flow's stages, with its fix; [] when it can
    (always for the tiny world)."""
    files = config.data.files
    if config.data.source != "files" or files is None or not files.train_path.is_file():
        return []
    try:
        sample, _ = read_problems(
            files.train_path,
            files.question_field,
            files.answer_field,
            limit=SAMPLE_ROWS,
            bad_rows="skip",
            max_row_chars=files.max_row_chars,
            tests_field=files.tests_field,
        )
    except ProblemFileError:  # the problems stage refuses the file, naming what is wrong
        return []
    untraceable = [p for p in sample if not traceable(p)]
    with_solution = [p for p in sample if p.solution]
    where = f"the first {len(sample)} training problems of {files.train_path}"
    found = []
    if flow in CURATING_FLOWS and config.curation.source == "teacher" and untraceable:
        found.append(
            f"curation.source 'teacher': the programmatic teacher traces only the tiny world's "
            f"problems, and {len(untraceable)} of {where} have no worked steps (e.g. "
            f"{untraceable[0].id}); set curation.source=solutions to curate from the data's own "
            "worked solutions"
        )
    if flow in CURATING_FLOWS and config.curation.source == "solutions" and not with_solution:
        found.append(
            f"curation.source 'solutions': none of {where} has a worked solution (GSM8K's "
            "reasoning before '#### 42', a MATH solution ending in \\boxed{}): give data with "
            "solutions in its answer field"
        )
    if (
        flow in BOOTSTRAPPING_FLOWS
        and config.bootstrap.path is None
        and untraceable
        and not with_solution
    ):
        found.append(
            f"bootstrap from scratch: {where} have neither worked steps nor worked "
            "solutions to build a corpus from; give a pretrained checkpoint (bootstrap.path) or "
            "data with solutions"
        )
    return found


def check_data_fit(config: PipelineConfig, flow: str = "r1_pipeline") -> None:
    """Raise DataFitError naming every combination of data and settings that cannot run."""
    found = data_fit_problems(config, flow)
    if found:
        lines = [f"profile {config.name}: the data cannot feed {len(found)} stage(s):"]
        raise DataFitError("\n".join(lines + [f"  {reason}" for reason in found]))
