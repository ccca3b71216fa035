"""The report of :func:`cle.equalize_model` and its presentation."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from cle._transforms.stepwise import ClsSetInfo
from cle._transforms.scaling import BiasAbsorption

__all__ = ["EqualizationReport", "group_reasons"]


def group_reasons(items, layer_names=()) -> list[tuple[str, str, int, str]]:
    """``(what, name, reason)`` items grouped by reason, names of layers masked as ``'…'``.

    Returns:
        ``(what, reason, count, example)`` sorted by what and falling count; ``example`` is the
        first name with that reason.
    """
    names = set(layer_names) | {name for _, name, _ in items}

    def mask(reason):
        return re.sub(r"'([^']*)'",
                      lambda m: "'…'" if m.group(1) in names else m.group(0), reason)

    groups: dict[tuple[str, str], list[str]] = {}
    for what, name, reason in items:
        groups.setdefault((what, mask(reason)), []).append(name)
    rows = [(what, reason, len(who), who[0]) for (what, reason), who in groups.items()]
    return sorted(rows, key=lambda r: (r[0], -r[2], r[1]))


@dataclasses.dataclass
class EqualizationReport:
    """What :func:`equalize_model` did.

    Attributes:
        folded: :class:`cle.FoldedPair` list (layers of the new model, BNs of the input).
        fold_skipped: BNs left in place, with reasons.
        relu6: the ReLU6 mode.
        relu6_changed: names of the ReLU6 activations replaced or bounded.
        sets: :class:`ClsSetInfo` of every scaled set (layers of the new model).
        set_ends: ``(layer name, reason)`` for every scalable layer where no set starts.
        bias_absorptions: :class:`BiasAbsorption` records of high-bias folding.
        bias_corrections: per-layer records of bias correction.
        scaling: one ``ScalingDecision`` per set found: scaled or left as it is (with the
            reason), and for ``objective="quantized"`` the modelled INT8 noise and the
            activation range before and after.
        objective: how the scales were chosen ("quantized" or "weights").
        stable_changed: names of the layers put in a form 8-bit tensors can hold
            (:class:`cle.layers.StableActivation`, :class:`cle.layers.ChannelAffine`,
            :class:`cle.layers.OneHot`; :func:`cle.quantize` only).
    """

    folded: list
    fold_skipped: list
    relu6: str
    relu6_changed: list[str]
    sets: list[ClsSetInfo]
    set_ends: list[tuple[str, str]]
    bias_absorptions: list[BiasAbsorption]
    bias_corrections: list = dataclasses.field(default_factory=list)
    scaling: list = dataclasses.field(default_factory=list)
    objective: str = "weights"
    stable_changed: list = dataclasses.field(default_factory=list)
    # Names of the input model's layers, operations and sub-models, to group reasons in
    # summary().
    layer_names: frozenset = dataclasses.field(default_factory=frozenset, repr=False)

    def reasons(self) -> list[tuple[str, str, int, str]]:
        """Set ends and fold skips grouped by reason, layer names masked as ``'…'``.

        Returns:
            ``(what, reason, count, example)`` sorted by what ("bn skip" / "set end" /
            "set kept": a set found but left unscaled by ``objective="quantized"``) and
            falling count; ``example`` is the first layer (or BN) with that reason.
        """
        items = [("set end", name, reason) for name, reason in self.set_ends]
        items += [("bn skip", s.bn.name, s.reason) for s in self.fold_skipped]
        items += [("set kept", d.layers[0], d.reason) for d in self.scaling if not d.scaled]
        return group_reasons(items, self.layer_names)

    def summary(self) -> str:
        """Counts, and one line per distinct reason (not per layer) for what was left out."""
        n_pairs = sum(len(s.cls_pair_info_list) == 1 for s in self.sets)
        lines = [
            f"batch norms folded: {len(self.folded)}, skipped: {len(self.fold_skipped)}",
            f"scaled sets: {len(self.sets)} ({n_pairs} pairs, {len(self.sets) - n_pairs} "
            "triplets)",
        ]
        if self.stable_changed:
            lines.append(f"layers rewritten exactly in a form 8-bit tensors can hold "
                         f"(cle.layers.StableActivation, ChannelAffine, OneHot): "
                         f"{', '.join(self.stable_changed)}")
        for what, reason, count, example in self.reasons():
            lines.append(f"  {what} ×{count}: {reason} (e.g. '{example}')")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        def rng(a):
            a = np.asarray(a)
            return [float(a.min()), float(a.max())] if a.size else [1.0, 1.0]

        return {
            "folded": [
                {"layer": p.layer.name, "bn": p.bn.name, "bn_after": p.bn_after}
                for p in self.folded
            ],
            "fold_skipped": [{"bn": s.bn.name, "reason": s.reason} for s in self.fold_skipped],
            "relu6": self.relu6,
            "relu6_changed": list(self.relu6_changed),
            "sets": [
                [
                    {"layer1": p.layer1.name, "layer2": p.layer2.name,
                     "scale_range": rng(p.scale_factor),
                     "relu_between": p.relu_activation_between_layers}
                    for p in info.cls_pair_info_list
                ]
                for info in self.sets
            ],
            "set_ends": [{"layer": n, "reason": r} for n, r in self.set_ends],
            "bias_absorptions": [dataclasses.asdict(r) for r in self.bias_absorptions],
            "bias_corrections": [dataclasses.asdict(r) for r in self.bias_corrections],
            "objective": self.objective,
            "stable_changed": list(self.stable_changed),
            "scaling": [d.to_dict() for d in self.scaling],
        }

    def __str__(self):
        n_pairs = sum(len(s.cls_pair_info_list) == 1 for s in self.sets)
        n_trip = len(self.sets) - n_pairs
        absorbed = [r for r in self.bias_absorptions if r.absorbed]
        lines = [
            f"batch norms folded: {len(self.folded)}, skipped: {len(self.fold_skipped)}",
            f"ReLU6 ({self.relu6}): {len(self.relu6_changed)} changed",
            f"scaled sets: {len(self.sets)} ({n_pairs} pairs, {n_trip} triplets; "
            f"objective {self.objective!r}"
            + (f", {sum(not d.scaled for d in self.scaling)} left as they are)"
               if any(not d.scaled for d in self.scaling) else ")"),
            f"high-bias folding: {len(absorbed)} absorbed, "
            f"{len(self.bias_absorptions) - len(absorbed)} skipped",
        ]
        if self.bias_corrections:
            done = [r for r in self.bias_corrections if r.corrected]
            lines.append(f"bias correction: {len(done)} layers corrected, "
                         f"{len(self.bias_corrections) - len(done)} skipped")
        for info in self.sets:
            parts = [
                f"{p.layer1.name} -> {p.layer2.name} "
                f"[{np.min(p.scale_factor):.3g}, {np.max(p.scale_factor):.3g}]"
                for p in info.cls_pair_info_list
            ]
            lines.append("  set  " + " ; ".join(parts))
        for d in self.scaling:
            if d.scaled and d.noise_before is not None:
                lines.append(f"  cls  {d}")
            elif not d.scaled:
                lines.append(f"  keep {d}")
        for name, reason in self.set_ends:
            lines.append(f"  end  {name}: {reason}")
        for s in self.fold_skipped:
            lines.append(f"  bn   {s.bn.name}: {s.reason}")
        for r in self.bias_corrections:
            lines.append(f"  bc   {r}")
        for r in self.bias_absorptions:
            if r.absorbed:
                lines.append(f"  hbf  {r.layer1} -> {r.layer2}: {r.channels} channels, "
                             f"max shift {r.max_shift:.3g}")
            else:
                lines.append(f"  hbf  {r.layer1} -> {r.layer2}: skipped, {r.reason}")
        return "\n".join(lines)
