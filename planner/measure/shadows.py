"""Real values of small fake tensors, kept through the ops of a fake step (their shadows),
and the assumed routing of a mixture-of-experts router's top-k pick over fake scores: what
lets training code that tests a small tensor's values run on fake tensors
(:mod:`planner.measure.fake`).

Design notes
------------
* **Small tensors keep their values.** Training code tests small tensors (is any token
  padded? are these position ids packed sequences? is this all-ones mask all ones?). The
  batch is made for real and every tensor of it of at most ``SHADOW_NUMEL_LIMIT`` elements
  keeps a real copy (its shadow); an op whose inputs all have shadows (or none: ``ones``)
  and whose outputs are that small computes its shadows too (``arange``, comparisons,
  ``all``), so ``.item()`` or ``bool()`` of such a tensor answers as the real step would.
  Big tensors (activations, weights) have no values: an op whose output depends on them
  (``.item()`` of a loss, ``nonzero`` of activations) cannot run, and
  :class:`~planner.measure.fake.FakeExecutionError` names it and where the model file called
  it. The caller may then fall back to a real step, only where one fits.
* **Routing is assumed.** A mixture-of-experts router's top-k pick over fake scores gets
  the values of an assumed routing (:func:`planner.model_switches.assumed_routing`:
  balanced, or a busiest expert at ``expert_load`` times its share), so experts that run
  on the tokens routed to them (``nonzero``/``where`` per expert) run with known sizes.
  Values derived from it are marked: only where one decides a shape or a value is the
  routing an assumption of the plan
  (:attr:`~planner.measure.fake.FakeSession.expert_load_used`); grouped experts
  (``grouped_mm`` over all tokens) need none.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch._subclasses import fake_tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from planner.measure.tracking import writes_in_place, written_arguments
from planner.model_switches import is_routing_choice, routing_for_choice

__all__ = ["SHADOW_NUMEL_LIMIT", "is_fake"]


SHADOW_NUMEL_LIMIT = 1 << 20
"""Integer and boolean tensors of at most this many elements keep real values on fake runs
(see the design notes)."""


def is_fake(tensor: torch.Tensor) -> bool:
    return isinstance(tensor, fake_tensor.FakeTensor)


_VALUE_ERRORS = (
    fake_tensor.DataDependentOutputException,
    fake_tensor.DynamicOutputShapeException,
)


class _ValueShadows(TorchDispatchMode):
    """Real values (shadows) of small fake tensors, kept through the ops that make them
    (see the module's design notes). Sits above the fake mode: each op runs fake first;
    its shadows are computed, on CPU, when all its tensor inputs have one."""

    def __init__(self, limit: int = SHADOW_NUMEL_LIMIT, expert_load: float = 1.0) -> None:
        super().__init__()
        self.limit = limit
        # id(fake tensor) -> (weak reference to it, its real CPU values, whether the values
        # come from the routing assumption rather than from the batch)
        self._shadows: dict[int, tuple[weakref.ref[torch.Tensor], torch.Tensor, bool]] = {}
        self._stale_storages: set[int] = set()
        self.expert_load = expert_load
        self.routing_seen = False  # a router's top-k pick got assumed values
        self.routing_decided = False  # ... and a shape or a value of the step depended on them

    def attach(self, fake: torch.Tensor, real: torch.Tensor, *, assumed: bool = False) -> None:
        if real.numel() > self.limit or real.is_complex():
            return
        key = id(fake)

        def forget(reference: weakref.ref[torch.Tensor]) -> None:
            entry = self._shadows.get(key)
            if entry is not None and entry[0] is reference:
                del self._shadows[key]

        with torch._C._DisableTorchDispatch():
            value = real.detach().to("cpu")
        self._shadows[key] = (weakref.ref(fake, forget), value, assumed)
        self._stale_storages.discard(id(fake.untyped_storage()))

    def release(self) -> None:
        self._shadows.clear()
        self._stale_storages.clear()

    def shadow(self, tensor: torch.Tensor) -> torch.Tensor | None:
        entry = self._shadows.get(id(tensor))
        if entry is None or entry[0]() is not tensor:
            # A real tensor is its own value: ``x[:, [-1, 0]]`` makes its index tensor from
            # Python data and lifts it into the fake mode (``lift_fresh``). Only a plain
            # tensor: a wrapper subclass (DTensor) holds no values of its own.
            if (
                type(tensor) in (torch.Tensor, torch.nn.Parameter)
                and not is_fake(tensor)
                and tensor.device.type == "cpu"
                and tensor.numel() <= self.limit
                and not tensor.is_complex()
            ):
                return tensor
            return None
        if id(tensor.untyped_storage()) in self._stale_storages:
            return None
        return entry[1]

    def _assumed(self, flat: list[Any]) -> bool:
        """Whether a tensor among ``flat`` has values from the routing assumption."""
        for value in flat:
            if isinstance(value, torch.Tensor):
                entry = self._shadows.get(id(value))
                if entry is not None and entry[2] and entry[0]() is value:
                    return True
        return False

    def _routing_choice(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """A router's top-k pick over fake scores: the fake op, with the indices given the
        assumed routing's values (planner.model_switches.assumed_routing)."""
        values, indices = func(*args, **kwargs)
        with torch._C._DisableTorchDispatch():  # real values, made outside the fake mode
            routing = routing_for_choice(args, kwargs, self.expert_load)
        self.attach(indices, routing, assumed=True)
        self.routing_seen = True
        return values, indices

    def _on_shadows(self, flat: list[Any], spec: Any, func: Any) -> Any:
        cpu = torch.device("cpu")
        real_flat = [
            self.shadow(x)
            if isinstance(x, torch.Tensor)
            else cpu
            if isinstance(x, torch.device)
            else x
            for x in flat
        ]
        real_args, real_kwargs = tree_unflatten(real_flat, spec)
        with torch._C._DisableTorchDispatch():
            return func(*real_args, **real_kwargs)

    def _all_known(self, values: Any) -> bool:
        """Whether every tensor among ``values`` (one level of lists) has a shadow. Most ops
        touch a big tensor first, so this usually answers at the first argument."""
        for value in values:
            if isinstance(value, torch.Tensor):
                if self.shadow(value) is None:
                    return False
            elif isinstance(value, (list, tuple)) and not self._all_known(value):
                return False
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if is_routing_choice(func, args, kwargs) and self.shadow(args[0]) is None:
            return self._routing_choice(func, args, kwargs)
        known = (
            torch.Tag.nondeterministic_seeded not in func.tags
            and self._all_known(args)
            and self._all_known(kwargs.values())
        )
        if not known:
            out = func(*args, **kwargs)
            if writes_in_place(func):
                # Written without known values: the storage's shadows (its views') are stale.
                for written in written_arguments(func, args, kwargs):
                    self._stale_storages.add(id(written.untyped_storage()))
            return out
        flat, spec = tree_flatten((args, kwargs))
        tensors = [x for x in flat if isinstance(x, torch.Tensor)]
        try:
            out = func(*args, **kwargs)
        except _VALUE_ERRORS:
            if not tensors:
                raise
            # The output depends on values we have: compute it, and fake its tensors.
            assumed = self._assumed(flat)
            self.routing_decided |= assumed
            real = self._on_shadows(flat, spec, func)
            real_flat, real_spec = tree_flatten(real)
            faked = []
            for value in real_flat:
                if isinstance(value, torch.Tensor):
                    fake = torch.empty_strided(
                        value.shape, value.stride(), dtype=value.dtype, device=tensors[0].device
                    )
                    self.attach(fake, value, assumed=assumed)
                    value = fake
                faked.append(value)
            return tree_unflatten(faked, real_spec)
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if outputs and all(t.numel() <= self.limit and not t.is_complex() for t in outputs):
            real = self._on_shadows(flat, spec, func)
            real_outputs = [t for t in tree_flatten(real)[0] if isinstance(t, torch.Tensor)]
            assumed = self._assumed(flat)
            for fake, value in zip(outputs, real_outputs, strict=False):
                self.attach(fake, value, assumed=assumed)
        elif writes_in_place(func):
            for written in written_arguments(func, args, kwargs):
                self._stale_storages.add(id(written.untyped_storage()))
        return out
