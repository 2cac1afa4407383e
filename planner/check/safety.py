"""Find checkpoint candidates whose recomputation would differ from their forward.

``torch.utils.checkpoint`` re-runs a wrapped module's forward during backward and expects it
to save the same tensors (same count, shapes, dtypes and devices) as the original forward;
when it does not, backward raises ``CheckpointError`` (or whatever the re-run raises), and
when only the values differ, training silently changes. Real modules do this: a Hugging Face
decoder layer given a key/value cache appends to the cache in its forward, so when it is
recomputed it finds the cache filled, reads keys/values back (cross-attention: fewer tensors
saved, ``CheckpointError``) or attends over twice the keys (self-attention: a shape error).
:func:`find_recompute_mismatches` finds such candidates by trying it, so the profiler can
exclude them with the reason; :func:`exclude_modules` records those reasons in a profile.

Design notes
------------
* **One probe step, not one per module.** A forward and backward (no optimizer step) with a
  *probe* on every candidate call at once: the probe remembers the call's inputs, the RNG
  state at its start, and the tensors saved for backward while it runs. When backward first
  reads one of those tensors (the moment ``checkpoint`` would recompute), the probe re-runs
  the module's forward from the same inputs and RNG state and compares what it saves with
  what the forward saved. Nested candidates are probed in the same step: a saved tensor
  belongs to every candidate call open when it was saved. The cost is one step plus one
  extra forward of each candidate, i.e. about (nesting depth + 1) forwards.
* **Faithful to the real recomputation.** The re-run happens inside backward, with the
  state the rest of the step left behind (caches, counters), as ``checkpoint`` would see it.
  It restores the RNG state (as ``preserve_rng_state=True`` does), stops once it has saved
  as many tensors as the forward did (as ``checkpoint``'s early stop does), and then puts
  back the module's buffers it changed (as a plan's ``restore_buffers`` does), any other
  tensor it changed in place, the tensors its modules' names held, and the step's RNG
  state, so probes do not disturb each other or the step. Modules' own hooks are not
  re-run, as under :func:`planner.apply.apply_plan`, which wraps ``forward``.
* **What counts as a mismatch**, first found first:
  1. a positional input changed in place since the call (by the module or later code):
     ``checkpoint`` saves those inputs, and autograd refuses to give them back;
  2. the re-run raises;
  3. the re-run changes in place a tensor it did not make, other than the module's own
     buffers: a side effect (a counter, a cache) that would happen twice; or it *rebinds*
     a buffer or tensor attribute of the module or a submodule (``self.x_min = self.x_min
     + x``: I-BERT's activation ranges; RecurrentGemma's recurrent state): the re-run saw
     the state the forward left and replaces it again, which a plan cannot put back (it
     restores buffers' values in place, not which tensor a name holds);
  4. it saves fewer tensors, or a saved tensor's shape, dtype or device differs (each makes
     ``checkpoint`` raise ``CheckpointError``, as its default ``determinism_check`` does);
  5. a saved tensor's values differ: ``checkpoint`` would not notice, and the gradients
     would change (the plan check demands bit-identical gradients, so values are compared
     exactly).
  Saving *more* tensors is not one: ``checkpoint`` stops the re-run once it has what it needs.
* **Conservative.** A re-run that changes Python state (a cache object) can make a later
  probe differ too; that excludes a module that might have been safe, never the reverse.
  The saved-tensor hooks of the probe step turn off autograd's in-place checks on saved
  tensors, which is why writes are watched (3) instead. If backward itself fails after a
  probe (a re-run changed state backward depends on, such as a gradient hook's), the probe
  that ran last is excluded and the step is run again without it, at most
  ``max_probe_steps`` steps in all.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from planner.apply.autocast import AutocastState
from planner.apply.tensors import iter_tensors
from planner.core.errors import ProfilingError
from planner.core.records import Profile
from planner.dispatch import DispatchWatcher
from planner.measure.fake import FakeSession
from planner.measure.rng import RngState
from planner.measure.shadows import is_fake
from planner.measure.tracking import written_arguments
from planner.measure.workload import Workload, compute_loss, user_code_errors

__all__ = ["exclude_modules", "find_recompute_mismatches"]

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class _ProbedCall:
    """One forward call of a candidate module, remembered until it has been re-run."""

    module_name: str
    module: torch.nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    rng: RngState  # at the call's start
    autocast: AutocastState  # the regions the call ran in (checkpoint enters them again)
    # Version counters of the positional tensor inputs, which checkpoint saves (and checks).
    input_versions: tuple[tuple[torch.Tensor, int], ...] = ()
    saved: list[torch.Tensor] = field(default_factory=list)
    probed: bool = False


def _describe(tensor: torch.Tensor) -> str:
    dtype = str(tensor.dtype).removeprefix("torch.")
    return f"{list(tensor.shape)} {dtype} on {tensor.device}"


def _compare_saved(original: list[torch.Tensor], recomputed: list[torch.Tensor]) -> str:
    """Why re-running saved something else than the forward did, or '' if it did not."""
    if len(recomputed) < len(original):
        return (
            f"recomputing it saves {len(recomputed)} tensors for backward where its forward "
            f"saved {len(original)}, which makes torch.utils.checkpoint raise CheckpointError"
        )
    # Recomputation may save more (checkpoint stops it early): compare the forward's count.
    pairs = list(zip(original, recomputed, strict=False))
    for index, (first, second) in enumerate(pairs):
        if (first.shape, first.dtype, first.device) != (second.shape, second.dtype, second.device):
            return (
                f"recomputing it saves a {_describe(second)} tensor where its forward saved "
                f"{_describe(first)} (saved tensor {index}), which makes "
                "torch.utils.checkpoint raise CheckpointError"
            )
    for index, (first, second) in enumerate(pairs):
        if first.device.type == "meta" or is_fake(first):
            continue  # no values to compare: the plan's check compares them when it runs
        if not torch.equal(first, second):
            return (
                f"recomputing it gives different values (saved tensor {index}, "
                f"{_describe(first)}), which would change the gradients"
            )
    return ""


def _tensor_bindings(module: torch.nn.Module) -> dict[tuple[str, str], torch.Tensor]:
    """``(submodule name, attribute) -> tensor`` for the buffers and the plain tensor
    attributes of ``module`` and its submodules (``""``: the module itself)."""
    bindings = {}
    for name, submodule in module.named_modules(remove_duplicate=False):
        for attribute, value in submodule._buffers.items():
            if value is not None:
                bindings[(name, attribute)] = value
        for attribute, value in vars(submodule).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                bindings[(name, attribute)] = value
    return bindings


def _rebind(module: torch.nn.Module, before: Mapping[tuple[str, str], torch.Tensor]) -> list[str]:
    """Put back the tensors ``module``'s names held before (:func:`_tensor_bindings`) and
    drop those bound since; returns the names that had changed (``"norm.x_min"``)."""
    after = _tensor_bindings(module)
    changed = sorted(
        key for key in before.keys() | after.keys() if before.get(key) is not after.get(key)
    )
    for name, attribute in changed:
        submodule = module.get_submodule(name)
        if (name, attribute) in before:
            value = before[(name, attribute)]
            if attribute in submodule._buffers:
                submodule._buffers[attribute] = value
            else:
                object.__setattr__(submodule, attribute, value)
        elif attribute in submodule._buffers:
            submodule._buffers[attribute] = None
        else:
            object.__delattr__(submodule, attribute)
    return [f"{name}.{attribute}" if name else attribute for name, attribute in changed]


def _storage_key(tensor: torch.Tensor) -> tuple[str, int] | None:
    try:
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse, nested, wrapper subclasses
        return None
    if is_fake(tensor):  # no data pointer; the storage object lives as long as the storage
        return ("fake", id(storage))
    pointer = storage.data_ptr()
    return (str(tensor.device), pointer) if pointer else None


class _ForeignWrites(DispatchWatcher):
    """Records the tensors a re-run changes in place that it did not make itself, with a
    copy of each from before its first change, so :meth:`undo` can put them back.

    A tensor is the re-run's own if an op made its storage during the re-run (not a view of
    an input). Writes are read from the op's schema (``Tensor(a!)``); a higher-order
    operator (FlexAttention) has none and writes nothing.
    """

    def __init__(self) -> None:
        super().__init__()
        self.made: set[tuple[str, int]] = set()
        self.written: list[torch.Tensor] = []
        self._originals: list[tuple[torch.Tensor, torch.Tensor]] = []

    def undo(self) -> None:
        with torch.no_grad():
            for tensor, original in reversed(self._originals):
                if tensor.shape != original.shape:
                    tensor.resize_(original.shape)
                tensor.copy_(original)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        for tensor in written_arguments(func, args, kwargs):
            if _storage_key(tensor) not in self.made:
                if all(tensor is not other for other in self.written):
                    self._originals.append((tensor, tensor.detach().clone()))
                self.written.append(tensor)
        out = func(*args, **kwargs)
        inputs = {_storage_key(t) for t in iter_tensors((args, kwargs))}
        for tensor in iter_tensors(out):
            key = _storage_key(tensor)
            if key is not None and key not in inputs:
                self.made.add(key)
        return out


class _StopRecomputation(Exception):
    """Raised from the re-run's pack hook once it has saved what the forward saved."""


class _BackwardBroken(Exception):
    """The probe step's own backward failed after a probe ran (see the design notes):
    ``culprit`` is the module re-run last, ``found`` the mismatches found before."""

    def __init__(self, culprit: str, error: Exception, found: dict[str, str]) -> None:
        super().__init__(culprit)
        self.culprit = culprit
        self.error = error
        self.found = found


class _RecomputeProbe:
    """Hooks for one probe step over the candidate modules ``names`` (see design notes)."""

    def __init__(self, workload: Workload, names: Collection[str]) -> None:
        self.workload = workload
        self.targets = {
            name: module for name, module in workload.model.named_modules() if name in names
        }
        self.open_calls: list[_ProbedCall] = []
        self.recomputing = 0
        self.last_probed: str | None = None
        self.mismatches: dict[str, str] = {}

    # -- forward: remember each candidate call and what it saves ---------------------------
    def _before(self, module: torch.nn.Module, args: Any, kwargs: Any, name: str) -> None:
        if self.recomputing or not torch.is_grad_enabled():
            return
        call = _ProbedCall(
            module_name=name,
            module=module,
            args=args,
            kwargs=kwargs,
            rng=RngState.now(self.workload.device),
            autocast=AutocastState.now(),
            input_versions=tuple((a, a._version) for a in args if isinstance(a, torch.Tensor)),
        )
        self.open_calls.append(call)

    def _after(self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if self.recomputing or not self.open_calls or self.open_calls[-1].module is not module:
            return
        self.open_calls.pop()

    def _pack(self, tensor: torch.Tensor) -> tuple[tuple[_ProbedCall, ...], torch.Tensor]:
        owners = tuple(self.open_calls)
        for call in owners:
            call.saved.append(tensor)
        return owners, tensor

    def _unpack(self, packed: tuple[tuple[_ProbedCall, ...], torch.Tensor]) -> torch.Tensor:
        owners, tensor = packed
        for call in owners:
            if not call.probed:
                self._probe(call)
        return tensor

    # -- backward: re-run a call the first time backward needs what it saved ---------------
    def _probe(self, call: _ProbedCall) -> None:
        call.probed = True
        self.last_probed = call.module_name
        recomputed: list[torch.Tensor] = []

        def record(tensor: torch.Tensor) -> torch.Tensor:
            recomputed.append(tensor.detach())
            if len(recomputed) == len(call.saved):
                raise _StopRecomputation  # checkpoint stops here too (its "early stop")
            return tensor

        buffers = [(b, b.detach().clone(), b._version) for b in call.module.buffers()]
        bindings = _tensor_bindings(call.module)
        writes = _ForeignWrites()
        changed_inputs = [t for t, version in call.input_versions if t._version != version]
        raised = ""
        self.recomputing += 1
        try:
            with RngState.forked(self.workload.device):
                call.rng.restore()
                with (
                    torch.enable_grad(),
                    call.autocast.entered(),
                    torch.autograd.graph.saved_tensors_hooks(record, lambda tensor: tensor),
                    writes,
                ):
                    call.module.forward(*call.args, **call.kwargs)
        except _StopRecomputation:
            pass
        except Exception as error:
            raised = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"
        finally:
            self.recomputing -= 1
            writes.undo()  # the step goes on as if the re-run had not happened
            rebound = _rebind(call.module, bindings)
            with torch.no_grad():
                for buffer, before, version in buffers:
                    # Only those that changed: writing bumps the version counter, and a
                    # buffer saved for backward must keep the version autograd recorded.
                    # (A fake buffer has no values: its version tells whether it was written.)
                    changed = (
                        buffer._version != version
                        if is_fake(buffer)
                        else not torch.equal(buffer, before)
                    )
                    if changed:
                        buffer.copy_(before)
        own_buffers = {_storage_key(buffer) for buffer, _, _ in buffers}
        foreign = [t for t in writes.written if _storage_key(t) not in own_buffers]
        if changed_inputs:
            reason = (
                f"its input ({_describe(changed_inputs[0])}) is changed in place after the "
                "module reads it, so torch.utils.checkpoint cannot recompute it (autograd "
                "raises 'modified by an inplace operation')"
            )
        elif raised:
            reason = f"recomputing it raises {raised}"
        elif rebound:
            reason = (
                f"recomputing it replaces the tensor {call.module_name}.{rebound[0]} holds "
                "(its forward replaced it too): the recomputation sees the state the forward "
                "left and changes it again"
            )
        elif foreign:
            reason = (
                f"recomputing it changes in place a tensor it did not make "
                f"({_describe(foreign[0])}): a side effect that would happen twice"
            )
        else:
            reason = _compare_saved(call.saved, recomputed)
        call.saved, call.args, call.kwargs = [], (), {}
        if reason and call.module_name not in self.mismatches:
            logger.info("excluding %s: %s", call.module_name, reason)
            self.mismatches[call.module_name] = reason

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        handles = []
        for name, module in self.targets.items():

            def before(module: torch.nn.Module, args: Any, kwargs: Any, name: str = name) -> None:
                self._before(module, args, kwargs, name)

            handles.append(module.register_forward_pre_hook(before, with_kwargs=True))
            handles.append(
                module.register_forward_hook(self._after, with_kwargs=True, always_call=True)
            )
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                yield
        finally:
            for handle in handles:
                handle.remove()
            self.open_calls.clear()


def _probe_step(workload: Workload, names: Collection[str], seed: int) -> dict[str, str]:
    """One probe step over ``names``: the mismatches found. Raises :class:`_BackwardBroken`
    if backward fails after a probe ran."""
    probe = _RecomputeProbe(workload, names)
    workload.optimizer.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    try:
        with probe.installed():
            with user_code_errors(workload):
                loss = compute_loss(workload.model_file, workload.model, workload.batch)
            try:
                loss.backward()
            except Exception as error:
                if probe.last_probed is None:
                    raise
                raise _BackwardBroken(probe.last_probed, error, dict(probe.mismatches)) from error
    finally:
        workload.optimizer.zero_grad(set_to_none=True)
    return probe.mismatches


def find_recompute_mismatches(
    workload: Workload,
    candidate_names: Collection[str],
    *,
    seed: int = 0,
    max_probe_steps: int = 3,
    session: FakeSession | None = None,
) -> dict[str, str]:
    """The candidates (by qualified name) whose recomputation would differ from their
    forward, each with the reason: ``{"decoder.block.0": "recomputing it raises ..."}``.

    Runs one forward and backward of ``workload`` (no optimizer step; gradients are cleared
    after, weights are unchanged, buffers change as in one forward) with every call of every
    module in ``candidate_names`` re-run when backward first needs it (see the module's
    design notes). Modules not in ``candidate_names`` are not tried. ``seed`` seeds the
    step's random ops. If backward itself fails because of a re-run, the step is repeated
    without the module re-run last, up to ``max_probe_steps`` steps in all; a failure with
    no probe to blame (the model's own step raising) is a :class:`ProfilingError`.

    With ``session`` (a fake workload's) the probe step runs on fake tensors: it needs no
    memory, and finds every mismatch but different values (case 5 of the design notes),
    which the plan's check finds when it runs the plan.
    """
    mismatches: dict[str, str] = {}
    remaining = set(candidate_names)
    running = session.running if session is not None else contextlib.nullcontext
    for _ in range(max_probe_steps):
        try:
            with running():
                found = _probe_step(workload, remaining, seed)
        except _BackwardBroken as broken:
            error = broken.error
            broken.found.setdefault(
                broken.culprit,
                f"recomputing it makes the rest of backward fail with {type(error).__name__}: "
                + (str(error).strip().splitlines() or [""])[0],
            )
            mismatches.update(broken.found)
            remaining -= broken.found.keys()
            continue
        except ProfilingError:
            raise
        except Exception as error:  # backward failed with no probe run: the step itself
            raise ProfilingError(
                f"the training step's backward raised {type(error).__name__}: {error}"
            ) from error
        mismatches.update(found)
        return mismatches
    for name in remaining:
        mismatches[name] = (
            f"not checked: recomputation probes broke the backward pass {max_probe_steps} times"
        )
    return mismatches


def exclude_modules(profile: Profile, reasons: Mapping[str, str]) -> Profile:
    """``profile`` with the modules named in ``reasons`` excluded from the candidates, each
    with its reason (a module already excluded keeps its first reason)."""
    if not reasons:
        return profile
    modules = tuple(
        replace(record, excluded_reason=reasons[record.module_name])
        if record.module_name in reasons and record.is_candidate
        else record
        for record in profile.modules
    )
    return replace(profile, modules=modules)
