"""Hashes of a planned step's recomputations, compared with the forward each repeats: the
``recomputation`` reference of :mod:`planner.check.compare`.

Each op's output is hashed (:func:`_digest`: shape, dtype, an xor hash and a float64 sum)
when a checkpointed function first runs and again when backward recomputes it; a
recomputation whose ops or hashes differ from its forward's is named with the module it
belongs to. Buffers and the RNG state are hashed when backward starts and compared once it
is done: a recomputation must not update BatchNorm statistics twice, or draw random numbers
the next step would have drawn. The RNG state's change is the plan's only where a
recomputation that does not put the step's RNG state back (``preserve_rng_state`` off)
drew random numbers: that recomputation is named. Otherwise the model's own backward moved
it (Reformer's reversible layers reseed as they recompute), as it does without a plan. Ops
whose outputs are uninitialized memory (``empty``) are not compared.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.check.result import Difference, DifferenceKind

if TYPE_CHECKING:
    from planner.apply import Region

__all__ = ["RecomputeComparison", "RecomputeVerdict"]


@dataclass(frozen=True)
class RecomputeVerdict:
    """What :meth:`RecomputeComparison.compare` found: how many recomputed ops it compared,
    the modules whose recomputation differs from their forward (in the order found) with,
    for each, where it first differed, and the buffers or RNG state backward changed."""

    compared_ops: int
    mismatches: tuple[str, ...]
    reasons: tuple[Difference, ...]
    state_differences: tuple[Difference, ...]

    @property
    def recomputation_equal(self) -> bool:
        return not self.mismatches

    @property
    def state_equal(self) -> bool:
        return not self.state_differences


class RecomputeComparison:
    """Hashes every op output of each checkpointed function's runs (see the module
    docstring). Installed as a dispatch mode *below* the memory tracker, so the tracker
    neither sees nor counts the hashing, and as :mod:`planner.apply`'s recomputation
    observer, which tells it which function (region) and which run is executing."""

    def __init__(self, model: Any) -> None:
        from planner.dispatch import DispatchWatcher

        comparison = self

        class Mode(DispatchWatcher):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                out = func(*args, **(kwargs or {}))
                if comparison._open:
                    comparison._record(func, out)
                return out

        self.mode = Mode()
        self.model = model
        self._buffer_storages = {b.untyped_storage().data_ptr() for b in model.buffers()}
        # (region, ops a selective policy may hand back, [ops of each run])
        self.regions: list[
            tuple[Region, frozenset[str], list[list[tuple[str, tuple[Any, ...]]]]]
        ] = []
        self._open: list[list[tuple[str, tuple[Any, ...]]]] = []
        self._drawing_runs: set[int] = set()  # id() of the runs that ran a seeded op
        self._state_after_forward: tuple[Any, ...] | None = None

    # -- what the planned step shows us ---------------------------------------------------
    def region(
        self, region: Region, function: Any, cached_ops: frozenset[str] = frozenset()
    ) -> Any:
        runs: list[list[tuple[str, tuple[Any, ...]]]] = []
        self.regions.append((region, cached_ops, runs))

        def run(*args: Any, **kwargs: Any) -> Any:
            runs.append([])
            self._open.append(runs[-1])
            try:
                return function(*args, **kwargs)
            finally:
                self._open.pop()

        return run

    def _record(self, func: Any, out: Any) -> None:
        import torch

        from planner.apply.tensors import iter_tensors
        from planner.measure.tracking import returns_view

        schema = getattr(func, "_schema", None)  # none for a higher-order operator
        name = schema.name.removeprefix("aten::") if schema is not None else str(func)
        tags = getattr(func, "tags", ())
        if (
            name in _UNINITIALIZED
            or torch.Tag.nondeterministic_bitwise in tags
            or returns_view(func)
        ):
            # Uninitialized memory (empty, empty_like) means nothing; a view (detach, which
            # recomputation adds) computes nothing.
            return
        # A buffer's new value is not compared here: a recomputation starts from the buffer
        # the forward updated (BatchNorm's counter), and the plan restores it afterwards,
        # which the buffer check at the end of backward verifies.
        # A seeded op's integer outputs (SDPA's philox seed and offset) are RNG bookkeeping,
        # left uninitialized by some kernels when no dropout is drawn; its floating outputs
        # show any difference in what it drew.
        seeded = torch.Tag.nondeterministic_seeded in tags
        if seeded:
            self._drawing_runs.add(id(self._open[-1]))
        digests = tuple(
            _digest(tensor)
            for tensor in iter_tensors(out)
            if tensor.untyped_storage().data_ptr() not in self._buffer_storages
            and not (seeded and not tensor.is_floating_point())
        )
        self._open[-1].append((str(func), digests))

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Observe checkpointed functions, hash their ops, and note the buffers and RNG
        state when backward starts (``torch.autograd.backward``, which ``loss.backward()``
        calls: the forward is done, no recomputation has run)."""
        import torch

        from planner.apply import observing_recomputation

        original = torch.autograd.backward

        def backward(*args: Any, **kwargs: Any) -> Any:
            if self._state_after_forward is None:
                self._state_after_forward = self._state()
            return original(*args, **kwargs)

        torch.autograd.backward = backward
        try:
            with observing_recomputation(self), self.mode:
                yield
        finally:
            torch.autograd.backward = original

    def _state(self) -> tuple[Any, ...]:
        import torch

        with torch._C._DisableTorchDispatch():
            buffers = tuple(_digest(buffer) for buffer in self.model.buffers())
            rng = _digest(torch.get_rng_state())
            cuda_rng = _digest(torch.cuda.get_rng_state()) if torch.cuda.is_available() else None
        return buffers, rng, cuda_rng

    # -- the verdict ------------------------------------------------------------------
    def compare(self) -> RecomputeVerdict:
        """Every recomputation against its forward, and the state after backward against
        the state before it."""
        from planner.apply import is_cached_op

        compared = 0
        mismatched: list[str] = []
        reasons: list[Difference] = []
        for region, cached_ops, runs in self.regions:
            if not runs:  # an enclosing recomputation stopped before it ran
                continue
            forward, *recomputations = runs
            for recomputed in recomputations:
                # A selective policy's cached outputs are handed back, not computed again:
                # the recomputation skips those ops of the forward.
                forward_ops = (
                    [entry for entry in forward if not is_cached_op(entry[0], cached_ops)]
                    if cached_ops
                    else forward
                )
                recomputed = (
                    [entry for entry in recomputed if not is_cached_op(entry[0], cached_ops)]
                    if cached_ops
                    else recomputed
                )
                for index, (op, digests) in enumerate(recomputed):
                    compared += 1
                    if index >= len(forward_ops) or forward_ops[index] != (op, digests):
                        original = forward_ops[index][0] if index < len(forward_ops) else "nothing"
                        module = region.module
                        if module not in mismatched:
                            mismatched.append(module)
                            reasons.append(
                                Difference(
                                    DifferenceKind.RECOMPUTATION,
                                    str(region),
                                    f"differs from its forward at op {index} ({op}; the "
                                    f"forward ran {original})",
                                )
                            )
                        break
        state: list[Difference] = []
        if self._state_after_forward is not None:
            buffers_before, rng_before, cuda_before = self._state_after_forward
            buffers_after, rng_after, cuda_after = self._state()
            names = [name for name, _ in self.model.named_buffers()]
            for name, before, after in zip(names, buffers_before, buffers_after, strict=True):
                if before != after:
                    state.append(
                        Difference(
                            DifferenceKind.BUFFER,
                            name,
                            "changed during backward (recomputed twice)",
                        )
                    )
            if (rng_before, cuda_before) != (rng_after, cuda_after):
                # Only a recomputation that leaves the RNG where it drew moves it (module
                # docstring); with none, backward itself did, as in the unplanned step.
                for region, _, runs in self.regions:
                    drew = any(id(run) in self._drawing_runs for run in runs[1:])
                    if not drew or region.preserves_rng:
                        continue
                    state.append(
                        Difference(
                            DifferenceKind.RNG_STATE,
                            detail=f"the recomputation of {region} drew random numbers",
                        )
                    )
                    if region.module not in mismatched:
                        mismatched.append(region.module)
                        reasons.append(
                            Difference(
                                DifferenceKind.RECOMPUTATION,
                                str(region),
                                "draws random numbers without the forward's RNG state "
                                "(preserve_rng_state off): it moves the step's RNG",
                            )
                        )
        return RecomputeVerdict(compared, tuple(mismatched), tuple(reasons), tuple(state))


# Ops whose outputs are uninitialized memory (their values mean nothing until written).
_UNINITIALIZED = frozenset(
    {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted"}
)


def _digest(tensor: Any) -> tuple[Any, ...]:
    """A fingerprint of a tensor's values: shape, dtype, an xor hash and a float64 sum of
    its elements (bit-exact: equal tensors give equal digests)."""
    import torch

    shape = (tuple(tensor.shape), str(tensor.dtype))
    if tensor.numel() == 0 or tensor.layout != torch.strided:
        return shape
    values = tensor.detach()
    if values.device.type != "cpu":
        # Hash a host copy: hashing on the device would allocate device memory beside the
        # step, and the peak being checked is the device's.
        values = values.to("cpu")
    if values.is_complex():
        values = torch.view_as_real(values)
    if values.dtype == torch.bool:
        values = values.to(torch.uint8)
    hashed = (
        int(torch.hash_tensor(values).view(torch.int64)) if hasattr(torch, "hash_tensor") else 0
    )
    total = float(values.sum(dtype=torch.float64))
    return (*shape, hashed, total.hex())
