"""The GPU check's printed lines (benchmarks/gpu_check.py): each phase's and each peer's
throughput, MFU, memory and profile, and per shape our SFT beside the plain loop, case by case.

SFT's headline counts the positions that carry loss (a prompt's and padding's carry none): loss
tokens/s, and MFU over the FLOPs counted with the LM head only at those positions
(benchmarks/throughput.py); the figures over all content positions follow in brackets.
"""

from __future__ import annotations

from benchmarks.gpu_peers import LoopRow
from benchmarks.gpu_phases import Phase
from benchmarks.gpu_profile import profile_text
from training.memory import GiB

INDENT = " " * 42


def mfu_text(flops: float, seconds: float, peak: float | None) -> str:
    if peak is None or not seconds:
        return "-"
    return f"{flops / seconds / 1e12 / peak:.1%}"


def rate(tokens: float, seconds: float) -> float:
    return tokens / seconds if seconds else 0.0


def throughput_text(row: Phase | LoopRow, peak: float | None) -> str:
    """`N loss tok/s  MFU x% (all positions: N tok/s, x%)`, or the all-position figures alone
    where no loss positions were counted."""
    mfu = mfu_text(row.flops, row.seconds, peak)
    whole = f"{rate(row.tokens, row.seconds):10,.0f} tok/s  MFU {mfu:>6}"
    if not row.loss_tokens:
        return whole
    loss_mfu = mfu_text(row.loss_flops, row.seconds, peak)
    return (
        f"{rate(row.loss_tokens, row.seconds):10,.0f} loss tok/s  MFU {loss_mfu:>6}  "
        f"(all positions: {rate(row.tokens, row.seconds):,.0f} tok/s, {mfu})"
    )


def _profile_line(row: Phase | LoopRow) -> str:
    step = row.seconds / row.steps if row.steps else 0.0
    text = profile_text(row.profile, step)
    return f"\n{INDENT}{text}" if text else ""


def phase_line(phase: Phase, peak: float | None) -> str:
    memory = "-"
    if phase.peak_bytes is not None:
        memory = f"{phase.peak_bytes / GiB:.2f} GiB"
        if phase.predicted_bytes:
            ratio = phase.peak_bytes / phase.predicted_bytes
            memory += f" (model {phase.predicted_bytes / GiB:.2f}, {ratio:.3f}x)"
    status = "ok" if phase.ok else "FAILED"
    line = (
        f"{phase.name:34} {status:6} {throughput_text(phase, peak)}"
        f"\n{INDENT}{phase.flops / max(phase.tokens, 1) / 1e9:.2f} GFLOP/tok  peak {memory}"
        f"  held before {phase.held_before / GiB:.2f} GiB"
    )
    if "update_seconds" in phase.parts:
        parts = phase.parts
        update_rate = parts["update_tokens"] / max(parts["update_seconds"], 1e-9)
        update_mfu = mfu_text(parts["update_flops"], parts["update_seconds"], peak)
        line += (
            f"\n{INDENT}update: {update_rate:,.0f} tok/s, MFU {update_mfu} "
            f"({parts['update_seconds']:.2f} s of {phase.seconds:.2f} s; sampling "
            f"{parts['sample_seconds']:.2f} s; the guard's text signals "
            f"{parts.get('signals_seconds', 0.0):.3f} s)"
        )
    line += _profile_line(phase)
    return line + (f"\n{INDENT}{phase.note}" if phase.note else "")


def peer_line(row: LoopRow, peak: float | None) -> str:
    memory = f"{row.peak_bytes / GiB:.2f} GiB" if row.peak_bytes else "-"
    state = "ok" if row.ok else "FAILED " + row.error.strip().splitlines()[-1]
    line = f"{row.name:34} {state:6} {throughput_text(row, peak)}\n{INDENT}peak {memory}"
    line += _profile_line(row)
    return line + (f"\n{INDENT}{row.note}" if row.note else "")


def comparison_lines(
    shape: str, cases: list[str], phases: list[Phase], peers: list[LoopRow], peak: float | None
) -> list[str]:  # fmt: skip
    """Per case, each of our SFT phases beside the plain loop: loss tokens/s, MFU over the loss
    positions' FLOPs, and ours / the peer's loss tokens/s."""
    lines = [
        f"{shape}: our SFT beside the plain loop (loss tokens/s, MFU over loss positions' FLOPs)",
        f"  {'case':8} {'ours':28} {'loss tok/s':>12} {'MFU':>6}   {'peer':>12} {'MFU':>6}"
        f"  {'ours/peer':>9}",
    ]
    by_case = {row.name.removeprefix("plain loop "): row for row in peers}
    for case in cases:
        peer = by_case.get(case)
        ours = [p for p in phases if p.name.startswith(f"sft {case} (")]
        peer_rate = rate(peer.loss_tokens, peer.seconds) if peer and peer.ok else 0.0
        peer_mfu = mfu_text(peer.loss_flops, peer.seconds, peak) if peer and peer.ok else "-"
        for phase in ours or [None]:
            mine = rate(phase.loss_tokens, phase.seconds) if phase and phase.ok else 0.0
            mfu = mfu_text(phase.loss_flops, phase.seconds, peak) if phase and phase.ok else "-"
            ratio = f"{mine / peer_rate:.2f}x" if mine and peer_rate else "-"
            label = phase.name.split("(", 1)[1].rstrip(")") if phase else "-"
            lines.append(
                f"  {case:8} {label:28} {mine:12,.0f} {mfu:>6}   {peer_rate:12,.0f} "
                f"{peer_mfu:>6}  {ratio:>9}"
            )
    return lines
