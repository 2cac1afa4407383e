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
* **Lengths and masks as values.** CTC's loss takes its input and target lengths as tensors
  and sizes its outputs by the longest target: with the lengths' shadows known it runs with
  them as lists, as the real kernels convert them. Indexing by a boolean mask (``x[mask]``,
  SpecAugment's masked frames, in a forward and in its backward) selects as many elements
  as the mask holds: with the mask's shadow known, it is given as the integer indices it
  selects, as the real kernel expands it (speech recognition: wav2vec 2.0 and its family).
* **Aliases share values.** A tensor made where no mode sees it (the recorder holds saved
  tensors detached) finds the values of a tensor of the same storage laid out alike.
* **A constant is small at any size.** A tensor filled with one value (``ones_like``,
  ``full``) keeps it whatever its size, as one element expanded to its shape (no memory):
  wav2vec 2.0's CTC loss counts each clip's frames as ``ones_like(input_values).sum(-1)``,
  and 8 clips of 10 s are 1.28 million samples, past the limit. Ops read such a shadow as
  any other (its views too: they take no memory), but none writes into it: an op writing
  in place into one marks its storage's values unknown instead. A small one made from known
  values (``ones(shape)``) keeps a dense copy, as before, which writes keep known.
* **A draw's range is known.** A uniform draw's values are not (the fake step draws none),
  but they lie in [0, 1): compared with a bound outside that range (``torch.rand([]) <
  layerdrop`` with LayerDrop switched off, as OmniASR's encoder draws before looking at the
  probability) the answer is the same for every draw, and is known.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch._subclasses import fake_tensor
from torch.utils._pytree import tree_flatten, tree_unflatten

from planner.dispatch import DispatchWatcher, is_higher_order
from planner.measure.tracking import returns_view, writes_in_place, written_arguments
from planner.model_switches import is_routing_choice, routing_for_choice

__all__ = ["SHADOW_NUMEL_LIMIT", "is_fake"]

_aten = torch.ops.aten


def _ctc_loss(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: list[int],
    target_lengths: list[int],
    *rest: Any,
    **kwargs: Any,
) -> Any:
    """CTC's loss on fake tensors, given its lengths: its outputs as both kernels (CPU and
    CUDA) allocate them, the loss per example and ``log_alpha`` (batch x time x twice the
    longest target + 1). Torch's fake kernel calls the op's output shape dynamic."""
    batch, steps = log_probs.shape[1], log_probs.shape[0]
    width = 2 * max(target_lengths, default=0) + 1
    return log_probs.new_empty((batch,)), log_probs.new_empty((batch, steps, width))


_MASK_INDEXING = {
    _aten.index.Tensor,
    _aten.index_put.default,
    _aten.index_put_.default,
    _aten._unsafe_index.Tensor,
}
"""Indexing ops whose output's shape (or the values they write) follows a boolean mask among
their indices: with the mask's shadow known, it is given as the integer indices it selects,
which fake kernels size (``x[mask]`` in a backward, SpecAugment's masked frames)."""

_LENGTHS_AS_LISTS: dict[Any, tuple[Any, tuple[int, int]]] = {
    _aten._ctc_loss.Tensor: (_ctc_loss, (2, 3)),
    _aten._ctc_loss_backward.Tensor: (_aten._ctc_loss_backward.default, (3, 4)),
}
"""Ops taking lengths as tensors, whose output's shape depends on the lengths' values (CTC's
``log_alpha`` is as wide as the longest target): with the lengths' shadows known, they run
with the lengths as lists (as the real kernels convert them): the overload taking lists, or
where torch's fake kernel will not size it either, the outputs made here. Op -> (what runs,
the lengths' positions)."""


_CONSTANT_FILLS: dict[Any, int | None] = {
    _aten.ones.default: None,
    _aten.ones_like.default: None,
    _aten.new_ones.default: None,
    _aten.zeros.default: None,
    _aten.zeros_like.default: None,
    _aten.new_zeros.default: None,
    _aten.full.default: 1,
    _aten.full_like.default: 1,
    _aten.new_full.default: 2,
}
"""Ops that fill their output with one value (see the design notes): op -> the position of
the fill value, None for ones and zeros (their names say it)."""


def _fill_value(func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    position = _CONSTANT_FILLS[func]
    if position is None:
        return 1 if "ones" in func.__name__ else 0
    return args[position] if position < len(args) else kwargs["fill_value"]


def _overlaps(values: torch.Tensor) -> bool:
    """Whether elements of ``values`` share memory (an expanded constant): not writable."""
    return any(
        stride == 0 and size > 1 for stride, size in zip(values.stride(), values.shape, strict=True)
    )


SHADOW_NUMEL_LIMIT = 1 << 23
"""Tensors of at most this many elements keep real values on fake runs (see the design
notes). 8 Mi elements (1 Mi before): Gemma 4's vision pooler selects its tokens by a mask
made from float weights of 2520 x 280 per image (705,600), one-hot of the patches'
positions, so batches of up to 11 images keep the mask's values."""


def is_fake(tensor: torch.Tensor) -> bool:
    return isinstance(tensor, fake_tensor.FakeTensor)


_VALUE_ERRORS = (
    fake_tensor.DataDependentOutputException,
    fake_tensor.DynamicOutputShapeException,
)


def _geometry(tensor: torch.Tensor) -> tuple[Any, ...]:
    return (
        id(tensor.untyped_storage()),
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.storage_offset(),
        tensor.dtype,
    )


_UNIT_DRAWS = frozenset({_aten.rand.default, _aten.rand_like.default})
"""The ops drawing uniformly from [0, 1)."""
_BOUND_COMPARISONS = frozenset({_aten.lt.Scalar, _aten.le.Scalar, _aten.gt.Scalar, _aten.ge.Scalar})


class _ValueShadows(DispatchWatcher):
    """Real values (shadows) of small fake tensors, kept through the ops that make them
    (see the module's design notes). Sits above the fake mode: each op runs fake first;
    its shadows are computed, on CPU, when all its tensor inputs have one."""

    def __init__(self, limit: int = SHADOW_NUMEL_LIMIT, expert_load: float = 1.0) -> None:
        super().__init__()
        self.limit = limit
        # id(fake tensor) -> (weak reference to it, its real CPU values, whether the values
        # come from the routing assumption rather than from the batch)
        self._shadows: dict[int, tuple[weakref.ref[torch.Tensor], torch.Tensor, bool]] = {}
        # id(storage) -> a weak reference to it: storages written without known values (an
        # id alone could name a later storage once the first is freed)
        self._stale_storages: dict[int, weakref.ref[torch.UntypedStorage]] = {}
        # (id(storage), shape, strides, offset, dtype) -> (a weak reference to the storage,
        # the values, assumed): the same values for an alias made where no mode saw it (the
        # recorder holds saved tensors detached)
        self._aliases: dict[tuple[Any, ...], tuple[weakref.ref[Any], torch.Tensor, bool]] = {}
        self.expert_load = expert_load
        # id(uniform draw in [0, 1): rand, rand_like) -> a weak reference to it: its
        # comparisons with a bound outside that range are known (a WeakSet would compare
        # tensors by value)
        self._unit_draws: dict[int, weakref.ref[torch.Tensor]] = {}
        self.routing_seen = False  # a router's top-k pick got assumed values
        self.routing_decided = False  # ... and a shape or a value of the step depended on them

    def attach(self, fake: torch.Tensor, real: torch.Tensor, *, assumed: bool = False) -> None:
        if real.is_complex() or real.untyped_storage().nbytes() > self.limit * real.itemsize:
            return  # a real copy this big is not kept (an expanded constant takes none)
        key = id(fake)

        def forget(reference: weakref.ref[torch.Tensor]) -> None:
            entry = self._shadows.get(key)
            if entry is not None and entry[0] is reference:
                del self._shadows[key]

        with torch._C._DisableTorchDispatch():
            value = real.detach().to("cpu")
        self._shadows[key] = (weakref.ref(fake, forget), value, assumed)
        storage = fake.untyped_storage()
        self._stale_storages.pop(id(storage), None)
        alias = _geometry(fake)

        def forget_alias(reference: weakref.ref[Any]) -> None:
            entry = self._aliases.get(alias)
            if entry is not None and entry[0] is reference:
                del self._aliases[alias]

        self._aliases[alias] = (weakref.ref(storage, forget_alias), value, assumed)

    def release(self) -> None:
        self._shadows.clear()
        self._stale_storages.clear()
        self._aliases.clear()

    def _entry(self, tensor: torch.Tensor) -> tuple[torch.Tensor, bool] | None:
        """The values of ``tensor``, or of an alias of it laid out alike, and whether they
        are assumed; None where none is known."""
        entry = self._shadows.get(id(tensor))
        if entry is not None and entry[0]() is tensor:
            return entry[1], entry[2]
        if tensor.numel() > self.limit:
            return None  # none attached (and the lookup runs for every big input of the step)
        alias = self._aliases.get(_geometry(tensor))
        if alias is not None and alias[0]() is tensor.untyped_storage():
            return alias[1], alias[2]
        return None

    def shadow(self, tensor: torch.Tensor) -> torch.Tensor | None:
        entry = self._entry(tensor)
        if entry is None:
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
        storage = tensor.untyped_storage()
        stale = self._stale_storages.get(id(storage))
        if stale is not None and stale() is storage:
            return None
        return entry[0]

    def _mark_stale(self, written: torch.Tensor) -> None:
        storage = written.untyped_storage()
        self._stale_storages[id(storage)] = weakref.ref(storage)

    def _assumed(self, flat: list[Any]) -> bool:
        """Whether a tensor among ``flat`` has values from the routing assumption."""
        for value in flat:
            if isinstance(value, torch.Tensor):
                entry = self._entry(value)
                if entry is not None and entry[1]:
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

    def _lengths_as_lists(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """``func`` run as its overload taking lengths as lists (:data:`_LENGTHS_AS_LISTS`),
        or ``NotImplemented`` where a length tensor has no shadow."""
        overload, positions = _LENGTHS_AS_LISTS[func]
        values = list(args)
        for position in positions:
            if position >= len(values):
                return NotImplemented
            lengths = self.shadow(values[position])
            if lengths is None:
                return NotImplemented
            with torch._C._DisableTorchDispatch():  # real values, read outside the fake mode
                values[position] = [int(length) for length in lengths.tolist()]
        return overload(*values, **kwargs)

    def _masks_as_indices(self, args: Any) -> tuple[Any, ...] | None:
        """``args`` of an indexing op with each boolean mask among its indices that has a
        shadow replaced by the integer indices it selects (``mask.nonzero()``, one per
        dimension, as the real kernel expands it), or None where there is none."""
        indices: list[Any] = []
        changed = False
        for index in args[1]:
            masked = isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)
            mask = self.shadow(index) if masked else None
            if mask is None:
                indices.append(index)
                continue
            with torch._C._DisableTorchDispatch():  # real values, outside the fake mode
                indices.extend(mask.bool().nonzero().unbind(1))
            changed = True
        return (args[0], indices, *args[2:]) if changed else None

    def _sized_by_values(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """``func`` on inputs not all known, its lengths and boolean masks given as the values
        their shadows hold where it takes them (:data:`_LENGTHS_AS_LISTS`,
        :data:`_MASK_INDEXING`): what sizes its output. (With every input known, the known
        path computes such an output, shadows included.)"""
        if func in _LENGTHS_AS_LISTS:
            out = self._lengths_as_lists(func, args, kwargs)
            if out is not NotImplemented:
                return out
        if func in _MASK_INDEXING and len(args) > 1:
            args = self._masks_as_indices(args) or args
        return func(*args, **kwargs)

    def _constant(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """A fill op's output, its shadow one value expanded to its shape (design notes),
        but where a small one's inputs are all known (``ones(shape)``, ``zeros_like`` of a
        known tensor): that one gets a dense copy laid out as the output, as any small
        tensor's values are, so that written in place it stays known. (A dense copy of
        every small fill would hold real memory for each optimizer state's zeros.)"""
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and not out.is_complex():
            known = self._all_known(args) and self._all_known(kwargs.values())
            with torch._C._DisableTorchDispatch():  # real values, made outside the fake mode
                value = _fill_value(func, args, kwargs)
                if known and out.numel() <= self.limit:
                    dense = torch.empty_strided(out.shape, out.stride(), dtype=out.dtype)
                    self.attach(out, dense.fill_(value))
                else:
                    self.attach(out, torch.full((), value, dtype=out.dtype).expand(out.shape))
        return out

    def _constant_among(self, flat: list[Any]) -> bool:
        """Whether a tensor among ``flat`` has an expanded constant as its shadow."""
        for value in flat:
            if isinstance(value, torch.Tensor):
                values = self.shadow(value)
                if values is not None and _overlaps(values):
                    return True
        return False

    def _writes_a_constant(self, func: Any, args: Any, kwargs: dict[str, Any]) -> bool:
        """Whether ``func`` writes in place into a tensor whose shadow is an expanded
        constant (or a view of one), which cannot be written."""
        return writes_in_place(func) and self._constant_among(written_arguments(func, args, kwargs))

    def _compared_draw(self, func: Any, args: Any) -> bool | None:
        """The one answer of comparing a uniform draw with a bound outside [0, 1) (module
        docstring), or None where the answer depends on the draw."""
        if func not in _BOUND_COMPARISONS or len(args) < 2:
            return None
        drawn = self._unit_draws.get(id(args[0]))
        if drawn is None or drawn() is not args[0]:
            return None
        bound = args[1]
        if not isinstance(bound, int | float) or isinstance(bound, bool) or 0 < bound < 1:
            return None
        below = func in (_aten.lt.Scalar, _aten.le.Scalar)  # draw < bound, draw <= bound
        if bound >= 1:  # every draw is below it
            return below
        if bound == 0 and func in (_aten.le.Scalar, _aten.gt.Scalar):
            return None  # a draw of exactly 0 answers otherwise
        return not below  # bound <= 0: no draw is below it

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if is_higher_order(func):
            return func(*args, **kwargs)  # its outputs' values are not computed here
        if func in _UNIT_DRAWS and (kwargs.get("dtype") or torch.float32).is_floating_point:
            out = func(*args, **kwargs)
            key = id(out)

            def forget(reference: weakref.ref[torch.Tensor]) -> None:
                if self._unit_draws.get(key) is reference:
                    del self._unit_draws[key]

            self._unit_draws[key] = weakref.ref(out, forget)
            return out
        answer = self._compared_draw(func, args)
        if answer is not None:
            out = func(*args, **kwargs)
            with torch._C._DisableTorchDispatch():  # real values, made outside the fake mode
                self.attach(out, torch.full((), answer).expand(out.shape))
            return out
        if is_routing_choice(func, args, kwargs) and self.shadow(args[0]) is None:
            return self._routing_choice(func, args, kwargs)
        if func in _CONSTANT_FILLS:
            return self._constant(func, args, kwargs)
        known = (
            torch.Tag.nondeterministic_seeded not in func.tags
            and self._all_known(args)
            and self._all_known(kwargs.values())
        )
        if known and self._writes_a_constant(func, args, kwargs):
            known = False  # its values become unknown, below
        if not known:
            out = self._sized_by_values(func, args, kwargs)
            if writes_in_place(func):
                # Written without known values: the storage's shadows (its views') are stale.
                for written in written_arguments(func, args, kwargs):
                    self._mark_stale(written)
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
        small = all(t.numel() <= self.limit for t in outputs)
        if outputs and (small or returns_view(func)) and not any(t.is_complex() for t in outputs):
            try:
                real = self._on_shadows(flat, spec, func)
            except RuntimeError:
                if not self._constant_among(flat):
                    raise
                # An op laying its output out over a dense input (as_strided, view) cannot
                # run on one value expanded: that output has no known values.
                return out
            real_outputs = [t for t in tree_flatten(real)[0] if isinstance(t, torch.Tensor)]
            assumed = self._assumed(flat)
            for fake, value in zip(outputs, real_outputs, strict=False):
                self.attach(fake, value, assumed=assumed)
        elif writes_in_place(func):
            for written in written_arguments(func, args, kwargs):
                self._mark_stale(written)
        return out
