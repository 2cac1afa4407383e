"""Run a model file's training step on fake tensors: every size and lifetime, no storage.

A fake tensor (``torch._subclasses.fake_tensor.FakeTensorMode``) has a shape, a dtype, a
device and a storage identity, but no data: ops compute only their outputs' metadata. The
profiler's recorder sees the same storages made and freed, the same module calls and the
same saved tensors as in a real step, so the memory timeline it records is the real one
(docs/results.md, "Predictions against measurement" compares both), while the process holds
no activation, parameter or optimizer-state memory at all. That is what lets a model be
planned on a machine that could never run its unplanned step.

Design notes
------------
* **Building.** ``build_model()`` runs with ``torch.device("meta")`` as the default device:
  no memory, and the common ``build in fp32, then .to(torch.bfloat16)`` works (under
  ``FakeTensorMode`` itself that ``.to`` fails: "_apply(): Couldn't swap"). Every
  parameter, buffer and tensor attribute is then replaced by a fake tensor of the same
  shape, stride and dtype on the planned device; tensors that shared a storage (tied
  weights, views) still share one. A model file that names a device explicitly (``.to
  ("cpu")`` inside ``build_model``) cannot build on meta; it is built under
  ``FakeTensorMode`` instead. The batch and the optimizer are made under the fake mode.
* **Small tensors keep their values.** Training code tests small tensors (is any token
  padded? are these position ids packed sequences? is this all-ones mask all ones?). The
  batch is made for real and every tensor of it of at most ``SHADOW_NUMEL_LIMIT`` elements
  keeps a real copy (its shadow); an op whose inputs all have shadows (or none: ``ones``)
  and whose outputs are that small computes its shadows too (``arange``, comparisons,
  ``all``), so ``.item()`` or ``bool()`` of such a tensor answers as the real step would.
  Big tensors (activations, weights) have no values: an op whose output depends on them
  (``.item()`` of a loss, ``nonzero`` of activations) cannot run, and
  :class:`FakeExecutionError` names it and where the model file called it. The caller may
  then fall back to a real step, only where one fits.
* **Routing is assumed.** A mixture-of-experts router's top-k pick over fake scores gets
  the values of an assumed routing (:func:`planner.model_switches.assumed_routing`:
  balanced, or a busiest expert at ``expert_load`` times its share), so experts that run
  on the tokens routed to them (``nonzero``/``where`` per expert) run with known sizes.
  Values derived from it are marked: only where one decides a shape or a value is the
  routing an assumption of the plan (``FakeSession.expert_load_used``); grouped experts
  (``grouped_mm`` over all tokens) need none.
* **Libraries that look for fake tensors.** Hugging Face ``transformers`` takes a fake
  tensor as a sign of tracing (``torch.compile``, export) and then builds another step (a
  materialized causal mask instead of SDPA's ``is_causal``); inside a session its test
  answers "not fake", so the eager step is the one planned.
* **Planning for a device this torch cannot run.** Autograd on fake CUDA tensors needs
  torch's CUDA runtime (a CPU-only build aborts the process), so where CUDA is not
  available a CUDA step is *emulated* on fake CPU tensors: storages are charged as CUDA's
  allocator charges them (whole 512-byte blocks), and the kernels whose saved tensors differ
  by device are replaced by the ones CUDA runs: scaled-dot-product attention uses the flash
  kernel for fp16/bf16 without a mask and the memory-efficient kernel otherwise (CPU's
  flash kernel saves a different log-sum-exp), dropout uses the fused kernel that keeps a
  1-byte mask (CPU keeps a mask of the input's dtype), and ``autocast("cuda")`` regions
  run as CPU autocast with CUDA's dtype. Each replacement made is listed in
  :attr:`FakeSession.assumptions`, which the profile records.
* **Optimizers as on the device.** On CUDA, ``torch.optim`` defaults to its ``foreach``
  implementation, which allocates whole-model temporaries during the step; it decides by
  the parameters' class, which a fake tensor is not, so the fake optimizer is told
  ``foreach=True`` explicitly where the real one would choose it.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch._subclasses import fake_tensor
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from planner.core.errors import ProfilingError
from planner.core.loop import PLAIN_LOOP, LoopShape
from planner.measure.model_file import ModelFile, _error_location, _user_code, checked_model
from planner.measure.tracking import writes_in_place, written_arguments
from planner.measure.workload import (
    Workload,
    build_optimizer,
    map_tensors,
    switch_off_own_checkpointing,
)
from planner.model_switches import (
    is_routing_choice,
    routing_for_choice,
    switch_off_caches,
)

__all__ = [
    "SHADOW_NUMEL_LIMIT",
    "FakeExecutionError",
    "FakeSession",
    "build_fake_workload",
    "fake_tensor_device",
    "is_fake",
]

logger = logging.getLogger(__name__)


class FakeExecutionError(ProfilingError):
    """An op of the training step cannot run on fake tensors (its output depends on values,
    or it has no fake kernel). ``op`` names it (``aten.nonzero.default``)."""

    def __init__(self, message: str, *, op: str) -> None:
        super().__init__(message)
        self.op = op


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


def fake_tensor_device(device_type: str) -> str:
    """The device fake tensors carry for a step planned on ``device_type``: the device
    itself where torch can run autograd on it here, else ``cpu`` (emulation; see notes)."""
    if device_type == "cuda" and not torch.cuda.is_available():
        return "cpu"
    return device_type


# -- the fake mode and its emulation of CUDA kernels on CPU fakes --------------------------
def _sdpa_as_on_cuda(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> tuple[torch.Tensor, str]:
    """CUDA's choice of attention kernel, run on fake tensors: flash for fp16/bf16 without
    a mask and head size <= 256, memory-efficient otherwise. Returns the output and the
    kernel's name."""
    aten = torch.ops.aten
    if (
        attn_mask is None
        and query.dtype in (torch.float16, torch.bfloat16)
        and query.shape[-1] <= 256
    ):
        # The flash kernel reads grouped key/value heads as they are.
        output = aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, False, scale=scale
        )[0]
        return output, "flash"
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        repeats = query.shape[-3] // key.shape[-3]
        key = key.repeat_interleave(repeats, dim=-3)
        value = value.repeat_interleave(repeats, dim=-3)
    bias = attn_mask
    if bias is not None and bias.dtype == torch.bool:
        bias = torch.zeros_like(bias, dtype=query.dtype).masked_fill(~bias, float("-inf"))
    output = aten._scaled_dot_product_efficient_attention(
        query, key, value, bias, True, dropout_p, is_causal, scale=scale
    )[0]
    return output, "memory-efficient"


class _CudaKernels(TorchFunctionMode):
    """Replaces, on CPU fake tensors, the functions whose CUDA kernels save other tensors
    than their CPU kernels (see the module's design notes). Records what it replaced."""

    def __init__(self, used: set[str]) -> None:
        super().__init__()
        self.used = used

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            output, kernel = _sdpa_as_on_cuda(*args, **kwargs)
            self.used.add(
                f"scaled_dot_product_attention: CUDA's {kernel} kernel (its saved tensors)"
            )
            return output
        if func in (F.dropout, torch.dropout, torch.nn.functional.dropout):
            tensor = args[0]
            p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
            training = args[2] if len(args) > 2 else kwargs.get("training", kwargs.get("train"))
            inplace = args[3] if len(args) > 3 else kwargs.get("inplace", False)
            if training is None:
                training = True
            if training and 0 < p < 1 and not inplace and tensor.numel() > 0:
                self.used.add("dropout: CUDA's fused kernel (a 1-byte mask per element)")
                return torch.native_dropout(tensor, p, True)[0]
        return func(*args, **kwargs)


@dataclass
class FakeSession:
    """A fake mode for one model, and what emulating the planned device assumed.

    ``device_type`` is the device the step is planned for; ``tensor_device`` the device
    the fake tensors carry (the same, or ``cpu`` when emulating CUDA).
    """

    mode: FakeTensorMode
    device_type: str
    tensor_device: str
    model_file: ModelFile
    shadows: _ValueShadows = field(default_factory=_ValueShadows)
    _replaced: set[str] = field(default_factory=set)
    _notes: list[str] = field(default_factory=list)

    @property
    def emulated(self) -> bool:
        return self.device_type != self.tensor_device

    @property
    def expert_load_used(self) -> float | None:
        """The routing assumed (busiest expert's load over the balanced share) where a shape
        or value of the step depended on it; None where none did."""
        return self.shadows.expert_load if self.shadows.routing_decided else None

    @property
    def assumptions(self) -> tuple[str, ...]:
        """How the fake step models the planned device, one line each."""
        lines = list(self._notes)
        if self.shadows.routing_seen and not self.shadows.routing_decided:
            lines.append(
                "mixture-of-experts routing: no shape of the step depends on it (grouped "
                "experts), so no routing was assumed"
            )
        if self.emulated:
            lines.append(
                f"{self.device_type} emulated on fake CPU tensors (this torch cannot run "
                f"autograd on {self.device_type}): storages charged in 512-byte blocks"
            )
        lines += sorted(self._replaced)
        return tuple(lines)

    def host_tensors(self, optimizer: torch.optim.Optimizer) -> tuple[torch.Tensor, ...]:
        """Tensors that live on the host on the planned device but are CPU fakes here like
        everything else: torch.optim's step counters (on CPU unless capturable or fused)."""
        if not self.emulated:
            return ()
        found = []
        for group in optimizer.param_groups:
            if group.get("capturable") or group.get("fused"):
                continue
            for parameter in group["params"]:
                step = optimizer.state.get(parameter, {}).get("step")
                if isinstance(step, torch.Tensor) and step.dim() == 0:
                    found.append(step)
        if found:
            self.note("optimizer step counters on the host, as torch.optim keeps them")
        return tuple(found)

    def release(self) -> None:
        """Drop the real values kept for small fake tensors (the batch's labels, ...): once
        the memory is recorded, nothing of the fake pass should hold real memory while
        real passes run under the budget (a fake workload can outlive its use in cycles)."""
        self.shadows.release()

    def note(self, line: str) -> None:
        if line not in self._notes:
            self._notes.append(line)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Run code on fake tensors (with the device emulation, if any); an op that fake
        tensors cannot run becomes a :class:`FakeExecutionError`."""
        with contextlib.ExitStack() as stack:
            # Fake tensors log every op that fails as an error; the failure is raised (and
            # reported, or expected: a recomputation probe) anyway.
            stack.enter_context(_quiet("torch._subclasses.fake_tensor"))
            stack.enter_context(_libraries_see_eager_tensors(self))
            stack.enter_context(self.mode)
            stack.enter_context(self.shadows)
            stack.enter_context(_device_kernel_dtypes(self._replaced))
            if self.emulated:
                stack.enter_context(_CudaKernels(self._replaced))
                stack.enter_context(_autocast_emulated(self.device_type, self._replaced))
            try:
                yield
            except FakeExecutionError:
                raise
            except Exception as error:
                translated = _fake_limitation(error, self.model_file)
                if translated is None:
                    raise
                raise translated from error


def _fake_limitation(error: BaseException, model_file: ModelFile) -> FakeExecutionError | None:
    """A :class:`FakeExecutionError` if ``error`` (or its cause) is fake tensors' own
    limitation rather than a bug in the model file."""
    limits = (
        *_VALUE_ERRORS,
        fake_tensor.UnsupportedOperatorException,
        fake_tensor.UnsupportedFakeTensorException,
    )
    seen: BaseException | None = error
    while seen is not None and not isinstance(seen, limits):
        seen = seen.__cause__ or seen.__context__
    if seen is None:
        return None
    func = getattr(seen, "func", None)
    op = str(func) if func is not None else type(seen).__name__
    why = {
        "DataDependentOutputException": "its result depends on tensor values",
        "DynamicOutputShapeException": "its output's shape depends on tensor values",
    }.get(type(seen).__name__, "it has no fake-tensor kernel")
    where = _error_location(seen, model_file.path)
    return FakeExecutionError(
        f"the training step cannot run on fake tensors at {op} ({where}): {why}", op=op
    )


# The dtypes grouped_mm's real kernels run: torch 2.13's fake (meta) kernel checks for bf16
# only, the CUDA fast path's dtype, while the CPU kernel and CUDA's fallback run fp32 and
# fp16 too; Hugging Face mixture-of-experts layers call it in the model's dtype.
_GROUPED_MM_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _grouped_mm_output(fake_mode: FakeTensorMode, func: Any, *args: Any, **kwargs: Any) -> Any:
    """``aten._grouped_mm``'s output on fake tensors for the dtypes its real kernels run
    (``NotImplemented``, so torch's own fake kernel runs and reports, for anything else).
    The output's shape rule is torch's own (``_create_grouped_mm_output_tensor``)."""
    from torch._meta_registrations import _create_grouped_mm_output_tensor
    from torch._subclasses.fake_tensor import in_kernel_invocation_manager

    mat_a, mat_b = args[0], args[1]
    offs = args[2] if len(args) > 2 else kwargs.get("offs")
    out_dtype = args[4] if len(args) > 4 else kwargs.get("out_dtype")
    bias = args[3] if len(args) > 3 else kwargs.get("bias")
    if (
        mat_a.dtype == torch.bfloat16
        or mat_a.dtype != mat_b.dtype
        or mat_a.dtype not in _GROUPED_MM_DTYPES
        or out_dtype not in (None, mat_a.dtype)
        or bias is not None
    ):
        return NotImplemented
    device = mat_a.device
    with in_kernel_invocation_manager(fake_mode):
        output = _create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype)
    return fake_mode.fake_tensor_converter.from_meta_and_device(fake_mode, output, device)


@contextlib.contextmanager
def _device_kernel_dtypes(replaced: set[str]) -> Iterator[None]:
    """Inside the session, ``grouped_mm`` runs on fake tensors in every dtype its real
    kernels run (:data:`_GROUPED_MM_DTYPES`), so the fake step runs what the real step runs (without
    patching the library that calls them). Scoped: outside it, torch's rules are back."""
    from torch._subclasses import fake_impls

    grouped_mm = torch.ops.aten._grouped_mm.default

    def is_grouped_mm(func: Any) -> bool:
        return func is grouped_mm

    def output(fake_mode: FakeTensorMode, func: Any, *args: Any, **kwargs: Any) -> Any:
        result = _grouped_mm_output(fake_mode, func, *args, **kwargs)
        if result is not NotImplemented:
            replaced.add(
                f"grouped_mm in {args[0].dtype}: run as the device's kernel runs it "
                "(torch's fake kernel accepts bf16 only)"
            )
        return result

    entry = (is_grouped_mm, output)
    fake_impls.op_implementations_checks.insert(0, entry)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            fake_impls.op_implementations_checks.remove(entry)


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    quieted = logging.getLogger(logger_name)
    level = quieted.level
    quieted.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        quieted.setLevel(level)


@contextlib.contextmanager
def _libraries_see_eager_tensors(session: FakeSession) -> Iterator[None]:
    """Hugging Face ``transformers`` takes a fake tensor as a sign of tracing (``torch.compile``
    or export) and then builds a different step (a materialized causal mask instead of
    SDPA's ``is_causal``, repeated key/value heads). The step planned is the eager one, so
    inside the session its check answers "not fake"."""
    import sys

    module = sys.modules.get("transformers.utils.import_utils")
    original = getattr(module, "is_fake_tensor", None)
    if module is None or original is None:
        yield
        return
    setattr(module, "is_fake_tensor", lambda tensor: False)  # noqa: B010
    try:
        yield
    finally:
        setattr(module, "is_fake_tensor", original)  # noqa: B010


@contextlib.contextmanager
def _autocast_emulated(device_type: str, replaced: set[str]) -> Iterator[None]:
    """Inside the emulation, ``torch.autocast("cuda", ...)`` becomes CPU autocast with the
    same dtype (the fake tensors are CPU tensors, which CUDA autocast would not touch)."""
    original_init = torch.amp.autocast_mode.autocast.__init__

    def init(self: Any, device_type_: str, *args: Any, **kwargs: Any) -> None:
        if device_type_ == device_type:
            replaced.add(
                f'autocast("{device_type}"): emulated by CPU autocast with the same dtype '
                "(CPU's lists of ops it casts)"
            )
            device_type_ = "cpu"
        original_init(self, device_type_, *args, **kwargs)

    autocast = torch.amp.autocast_mode.autocast
    setattr(autocast, "__init__", init)  # noqa: B010
    try:
        yield
    finally:
        setattr(autocast, "__init__", original_init)  # noqa: B010


# -- building the workload on fake tensors -----------------------------------------------
class _FakeCopier:
    """Fake copies of real or meta tensors, one fake storage per original storage."""

    def __init__(self, mode: FakeTensorMode, device: str) -> None:
        self.mode = mode
        self.device = device
        self._by_tensor: dict[int, torch.Tensor] = {}
        self._by_storage: dict[int, torch.Tensor] = {}
        self._keep: list[torch.Tensor] = []  # originals, so their ids stay unique

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        if is_fake(tensor):
            return tensor
        known = self._by_tensor.get(id(tensor))
        if known is not None:
            return known
        storage = tensor.untyped_storage()
        base = self._by_storage.get(id(storage))
        with self.mode, torch.no_grad():
            if base is not None and base.dtype == tensor.dtype:
                fake = base.as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())
            else:
                itemsize = tensor.element_size()
                numel = max(storage.nbytes() // itemsize, 1) if storage.nbytes() else 0
                base = torch.empty(numel, dtype=tensor.dtype, device=self.device)
                self._by_storage.setdefault(id(storage), base)
                fake = base.as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())
        self._by_tensor[id(tensor)] = fake
        self._keep.extend((tensor, storage))  # type: ignore[arg-type]
        return fake

    def parameter(self, parameter: torch.nn.Parameter) -> torch.nn.Parameter:
        known = self._by_tensor.get(id(parameter))
        if known is not None:
            return known  # type: ignore[return-value]
        fake = torch.nn.Parameter(
            self.copy(parameter.detach()), requires_grad=parameter.requires_grad
        )
        self._by_tensor[id(parameter)] = fake
        self._keep.append(parameter)
        return fake


def _to_fake(model: torch.nn.Module, copier: _FakeCopier) -> None:
    """Replace every parameter, buffer and tensor attribute of ``model`` by a fake copy."""
    for module in model.modules():
        for name, parameter in list(module._parameters.items()):
            if parameter is not None:
                module._parameters[name] = copier.parameter(parameter)
        for name, buffer in list(module._buffers.items()):
            if buffer is not None:
                module._buffers[name] = copier.copy(buffer)
        for name, value in list(vars(module).items()):
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                setattr(module, name, copier.copy(value))


def _build_model(model_file: ModelFile, session: FakeSession, seed: int) -> torch.nn.Module:
    copier = _FakeCopier(session.mode, session.tensor_device)
    torch.manual_seed(seed)
    try:
        with torch.device("meta"):
            model = model_file.build_model()
    except Exception as meta_error:
        # A model file that names a device (or reads values) cannot build on meta.
        logger.info("build_model() on the meta device failed (%s); building fake", meta_error)
        with _user_code("build_model()", model_file.path), session.running():
            torch.manual_seed(seed)
            model = model_file.build_model()
    model = checked_model(model_file, model)
    _to_fake(model, copier)
    model.train()
    return model


def _fake_batch(model_file: ModelFile, session: FakeSession, seed: int) -> Any:
    """The batch as fake tensors on the planned device. It is made for real (the same
    seeded call as in a real run), so its small tensors keep their values as shadows."""
    device = torch.device(session.tensor_device)
    with _user_code("sample_batch()", model_file.path):
        torch.manual_seed(seed + 1)
        real = model_file.sample_batch()
    copier = _FakeCopier(session.mode, session.tensor_device)

    def fake(tensor: torch.Tensor) -> torch.Tensor:
        copy = copier.copy(tensor)
        session.shadows.attach(copy, tensor)
        with session.running():
            return copy.to(device)

    return map_tensors(real, fake)


def _fake_optimizer(
    model_file: ModelFile, model: torch.nn.Module, session: FakeSession
) -> torch.optim.Optimizer:
    with session.running():
        optimizer = build_optimizer(model_file, model)
    if session.device_type == "cuda":
        # torch.optim picks foreach on CUDA by the parameters' class, which fakes are not.
        for group in optimizer.param_groups:
            if "foreach" in group and group["foreach"] is None and not group.get("fused"):
                group["foreach"] = True
                session.note(
                    f"{type(optimizer).__name__} with foreach=True (torch's default on CUDA)"
                )
    return optimizer


def build_fake_workload(
    model_file: ModelFile,
    device_type: str = "cpu",
    seed: int = 0,
    *,
    emulate: bool = False,
    loop: LoopShape = PLAIN_LOOP,
    expert_load: float = 1.0,
) -> tuple[Workload, FakeSession]:
    """The model file's model, batch and optimizer on fake tensors for ``device_type``, and
    the session to run its steps in (``with session.running(): ...``), in the training
    loop's shape ``loop``, planning mixture-of-experts layers whose memory depends on routing
    for ``expert_load`` (:func:`planner.model_switches.assumed_routing`). ``emulate`` forces
    the CPU emulation of a CUDA step even where CUDA is available (to test it there)."""
    tensor_device = "cpu" if emulate else fake_tensor_device(device_type)
    session = FakeSession(
        mode=FakeTensorMode(allow_non_fake_inputs=True),
        device_type=device_type,
        tensor_device=tensor_device,
        model_file=model_file,
        shadows=_ValueShadows(expert_load=expert_load),
    )
    model = _build_model(model_file, session, seed)
    with _user_code("switching off the model's own checkpointing", model_file.path):
        notes = (*model_file.assumptions, *switch_off_own_checkpointing(model))
    caches_off = switch_off_caches(model)
    batch = _fake_batch(model_file, session, seed)
    optimizer = _fake_optimizer(model_file, model, session)
    workload = Workload(
        model_file, model, batch, optimizer, torch.device(tensor_device), notes, loop, caches_off
    )
    return workload, session
