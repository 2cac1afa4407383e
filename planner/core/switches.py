"""What a plan assumes about switches in the model that change a step's memory, and that
``apply_plan`` sets (or the first-forward guard watches) at training time.

Pure data, no torch. Kept apart from the free-text ``assumptions`` so that code reads a
field, never a sentence:

* ``caches_off``: Hugging Face models whose ``config.use_cache`` was on. A cache is for
  generation; in training it holds every layer's keys and values until the step's output is
  dropped, so no layer could be checkpointed. The step is planned with the cache off, as
  Hugging Face's own gradient checkpointing does, and ``apply_plan`` turns it off.
* ``layerdrop_off``: LayerDrop settings that were on (``encoder.layerdrop``,
  ``config.encoder_layerdrop``): a step that skips each layer at random holds the most
  memory when it skips none, so the step is planned with none skipped (LayerDrop off while
  profiling and checking), and every checkpointed module replays the forward's RNG state
  when recomputed, so it skips the layers its forward skipped. ``apply_plan`` leaves
  LayerDrop on: training drops layers as before.
* ``expert_load``: the routing a mixture-of-experts step was planned for, where its memory
  depends on routing (experts run on the tokens routed to them, one at a time): the most
  tokens any expert gets, as a multiple of the balanced share (tokens x top-k / experts).
  1.0 is balanced routing. None: no shape in the step depended on routing (grouped experts,
  or no experts), so no assumption was needed.
* ``autocast``: the dtype the model's forward ran under ``torch.autocast`` in (``bfloat16``,
  ``float16``), or ``off`` where it ran without, as the step's first call of a submodule
  saw it (``Trainer(bf16=True)`` enters autocast inside the model's own ``forward``, after
  the model's hooks). Autocast sets every activation's dtype: the first training forward
  warns where it runs otherwise. None: not recorded (files written before it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["AUTOCAST_OFF", "NO_SWITCHES", "StepSwitches", "switches_from_dict", "switches_to_dict"]


@dataclass(frozen=True)
class StepSwitches:
    caches_off: tuple[str, ...] = ()
    expert_load: float | None = None
    layerdrop_off: tuple[str, ...] = ()
    autocast: str | None = None

    def describe(self) -> tuple[str, ...]:
        """One line per switch, for assumption lists and summaries."""
        lines = []
        if self.caches_off:
            lines.append(
                f"Hugging Face cache off in training (config.use_cache was on in "
                f"{', '.join(name or 'the model' for name in self.caches_off)}): apply_plan "
                "turns it off, as gradient_checkpointing_enable() does"
            )
        if self.layerdrop_off:
            lines.append(
                f"LayerDrop planned as if no layer were skipped ({', '.join(self.layerdrop_off)} "
                "set to 0 while profiling; a step that skips layers holds less): training "
                "keeps it, and recomputations replay the forward's RNG to skip the same layers"
            )
        if self.expert_load is not None:
            share = (
                "balanced routing (each expert gets tokens x top-k / experts)"
                if self.expert_load == 1.0
                else f"routing where the busiest expert gets {self.expert_load:g}x its balanced "
                "share"
            )
            lines.append(
                f"mixture-of-experts memory depends on routing: planned for {share}; the "
                "first training forward warns when an expert gets more"
            )
        if self.autocast not in (None, AUTOCAST_OFF):
            lines.append(
                f"the forward runs under torch.autocast({self.autocast}): the first training "
                "forward warns where it does not"
            )
        return tuple(lines)


AUTOCAST_OFF = "off"
""":attr:`StepSwitches.autocast` of a forward that ran without autocast."""

NO_SWITCHES = StepSwitches()


def switches_to_dict(switches: StepSwitches) -> dict[str, Any]:
    return {
        "caches_off": list(switches.caches_off),
        "expert_load": switches.expert_load,
        "layerdrop_off": list(switches.layerdrop_off),
        "autocast": switches.autocast,
    }


def switches_from_dict(data: Any) -> StepSwitches:
    """The record from its JSON form; absent (files written before it): no switches."""
    if data is None:
        return NO_SWITCHES
    if not isinstance(data, dict):
        raise TypeError(f"switches should be an object, not {type(data).__name__}")
    load, autocast = data.get("expert_load"), data.get("autocast")
    return StepSwitches(
        caches_off=tuple(str(name) for name in data.get("caches_off", ())),
        expert_load=None if load is None else float(load),
        layerdrop_off=tuple(str(name) for name in data.get("layerdrop_off", ())),
        autocast=None if autocast is None else str(autocast),
    )
