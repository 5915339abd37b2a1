"""The guard of one GRPO stage: which rules can read what the stage logs, each step's check, and
what the trips ask for (the most severe action among them; a rollback beyond the allowed number
is a stop). No I/O here: the stage acts on the verdict (stages/guarded.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from configs.guard import GuardConfig
from configs.reinforcement import RewardTerm
from contracts.reward_names import HOLED_REWARDS
from guard import rules
from guard.history import History
from guard.skill import SkillPair, reward_without_skill
from guard.trip import Trip
from problems.types import FAMILY_REWARDS

SEVERITY = {"warn": 1, "rollback": 2, "stop": 3}
VERIFIERS = frozenset(FAMILY_REWARDS.values()) | frozenset(HOLED_REWARDS)
# Terms that shape how a completion looks rather than say whether it is right: the ones a policy
# can farm. Verifiers, graders and the reward model's score are what accuracy is.
SHAPING = frozenset(("format", "tag_count", "language", "overlong", "repetition"))


def is_verifier(name: str) -> bool:
    """Whether a reward term is a family's correctness verifier (honest or holed)."""
    return name in VERIFIERS


def skill_pairs(terms: Sequence[RewardTerm]) -> list[SkillPair]:
    """Each verifier term's training pass rate and the held-out pass@1 it should move with: of
    its one family, or of every problem for a term on every family, read as the term reads
    (strict unless its params say `strict: false`)."""
    pairs = []
    for term in terms:
        if not is_verifier(term.name) or (term.families and len(term.families) != 1):
            continue
        reading = "pass_at_1" if term.params.get("strict", True) else "pass_at_1_lenient"
        family = term.families[0] if term.families else None
        probe = f"heldout/{family}/{reading}" if family else f"heldout/{reading}"
        pairs.append(SkillPair(family or "all", f"reward/{term.name}/mean", probe))
    return pairs


def paired_readings(guard: GuardConfig, terms: Sequence[RewardTerm]) -> tuple[set[str], list[str]]:
    """What the held-out probe keeps per problem for `reward_without_skill` (guard/paired.py):
    the held-out readings (`heldout/...` keys) of the stage's verifier pairs (the fall reading
    and the gap's sampling allowance read them), and the training verifier terms that are not
    the grader's own, whose pay on the probe's completions the `overpay` reading sets beside
    them. Nothing where the rule is off."""
    rule = guard.reward_without_skill
    if not guard.enabled or rule.action == "off":
        return set(), []
    unvetted = [] if rule.overpay is None else unvetted_verifiers(terms)
    return {pair.probe_key for pair in skill_pairs(terms)}, unvetted


def unvetted_verifiers(terms: Sequence[RewardTerm]) -> list[str]:
    """The verifier terms that are not a family's own grader (a holed one, say)."""
    graders = set(FAMILY_REWARDS.values())
    return [t.name for t in terms if is_verifier(t.name) and t.name not in graders]


@dataclass(frozen=True)
class Verdict:
    """What this step's trips ask for: `action` is warn, rollback or stop. `trips` holds every
    rule that tripped at the step, the most severe first, and `actions` what each one asked for:
    several rules can trip at one step (which one a check reaches first is no measure of which
    matters), so a stop or a warning names them all."""

    action: str
    trips: list[Trip]
    actions: list[str]

    @property
    def trip(self) -> Trip:
        """The primary trip: the first of the most severe (its rule is the one a single name
        stands for: a rollback's adjustment, a stop's first rule)."""
        return self.trips[0]

    @property
    def deciding(self) -> list[Trip]:
        """The trips that asked for the verdict's own action (every stopping rule of a stop)."""
        return [t for t, a in zip(self.trips, self.actions, strict=True) if a == self.action]

    @property
    def since(self) -> int:
        """The first step of the earliest window among the deciding trips: a checkpoint kept
        from before it predates every window that decided."""
        return min(t.since for t in self.deciding)

    def records(self) -> list[dict]:
        """Each trip as the guard's record holds it: its dict with the action it asked for."""
        return [t.to_dict() | {"action": a} for t, a in zip(self.trips, self.actions, strict=True)]


class Guard:
    """The rules of `config` over a stage whose reward is `terms`; `probed`: the stage runs the
    held-out probe; `kl`: it keeps a reference (beta > 0)."""

    def __init__(
        self, config: GuardConfig, terms: Sequence[RewardTerm], probed: bool, kl: bool
    ) -> None:
        self.config = config
        self.pairs = skill_pairs(terms) if probed else []
        self.shaping = {t.name: t.weight for t in terms if t.name in SHAPING}
        self.verifiers = [t.name for t in terms if is_verifier(t.name)]
        strict = all(t.params.get("strict", True) for t in terms if is_verifier(t.name))
        self.probe_key = (
            None if not probed else "heldout/pass_at_1" if strict else "heldout/pass_at_1_lenient"
        )
        self.kl = kl
        self.warned: set[str] = set()  # rules that warned on this branch: once each

    def idle(self) -> dict[str, str]:
        """The enabled rules that have nothing to read in this stage, and why."""
        why = {}
        if not self.pairs:
            why["reward_without_skill"] = "no held-out probe (probe.every 0) or no family verifier"
        if not self.kl:
            why["drift"] = "no reference model (beta 0): no KL is measured"
        if not self.shaping:
            why["gamed_term"] = "no shaping term (format, tags, language, length, repetition)"
        return {name: text for name, text in why.items() if self.active(name)}

    def active(self, name: str) -> bool:
        return self.config.enabled and self.config.rules()[name].action != "off"

    def check(self, history: History) -> list[Trip]:
        """The rules that trip on `history` now (a rule that has warned stays quiet)."""
        if not self.config.enabled or not history:
            return []
        c = self.config
        found = {
            "reward_without_skill": lambda: reward_without_skill(
                history, c.reward_without_skill, self.pairs
            ),
            "length_runaway": lambda: rules.length_runaway(history, c.length_runaway),
            "collapse": lambda: rules.collapse(history, c.collapse),
            "drift": lambda: rules.drift(history, c.drift),
            "gamed_term": lambda: rules.gamed_term(
                history, c.gamed_term, self.shaping, self.probe_key, self.verifier_keys
            ),
            "judge_trouble": lambda: rules.judge_trouble(history, c.judge_trouble, self.verifiers),
            "repetition": lambda: rules.repetition(history, c.repetition),
            "language_mixing": lambda: rules.language_mixing(history, c.language_mixing),
        }
        trips = []
        for name, rule in found.items():
            if not self.active(name) or name in self.warned:
                continue
            trip = rule()
            if trip is not None:
                trips.append(trip)
        return trips

    def signal_keys(self, trip: Trip) -> list[str]:
        """The metrics `trip`'s rule read, for the curves around it."""
        fixed = {
            "length_runaway": ["completion/mean_tokens", "completion/truncated_fraction"],
            "collapse": ["entropy", "groups/zero_spread_fraction"],
            "drift": ["kl"],
            "repetition": ["completion/repetition_rate"],
            "language_mixing": ["completion/language_consistency_rate"],
            "judge_trouble": ["reward/unscorable_fraction"],
        }
        if trip.rule == "reward_without_skill":
            pair = next((p for p in self.pairs if p.label == trip.subject), None)
            return [pair.reward_key, pair.probe_key] if pair else []
        if trip.rule == "judge_trouble" and trip.subject:
            own = f"reward/{trip.subject}/unscorable_fraction"
            return [own, "reward/unscorable_fraction"]
        if trip.rule == "gamed_term":
            accuracy = [self.probe_key] if self.probe_key else self.verifier_keys
            return [f"reward/{trip.subject}/share", f"reward/{trip.subject}/mean", *accuracy]
        return fixed.get(trip.rule, [])

    @property
    def verifier_keys(self) -> list[str]:
        return [f"reward/{name}/mean" for name in self.verifiers]

    def verdict(self, trips: Sequence[Trip], rollbacks_done: int) -> Verdict | None:
        """The action the trips ask for, every trip kept with its own action, most severe first
        (a stable sort: rules of equal severity stay in the order they were checked); a
        rollback past `rollback.max_times` is a stop. Warned rules are remembered."""
        if not trips:
            return None

        def action(trip: Trip) -> str:
            return self.action_of(trip, rollbacks_done)

        ordered = sorted(trips, key=lambda t: -SEVERITY[action(t)])
        actions = [action(t) for t in ordered]
        self.warned |= {t.rule for t, a in zip(ordered, actions, strict=True) if a == "warn"}
        return Verdict(actions[0], ordered, actions)

    def action_of(self, trip: Trip, rollbacks_done: int = 0) -> str:
        """What `trip`'s rule does: its action, a rollback past `rollback.max_times` a stop."""
        wanted = self.config.rules()[trip.rule].action
        if wanted == "rollback" and rollbacks_done >= self.config.rollback.max_times:
            return "stop"
        return wanted

    def forget(self) -> None:
        """A rollback starts a new branch: the rules may warn again."""
        self.warned.clear()
