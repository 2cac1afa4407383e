"""Run the planned device's kernels on fake tensors: the device fake tensors carry
(:func:`fake_tensor_device`), a CUDA step emulated on fake CPU tensors where this torch
cannot run CUDA (:class:`_CudaKernels`, :func:`_autocast_emulated`,
:func:`_flex_attention_trains`), and ``grouped_mm`` in every dtype its real kernels accept
(:func:`_device_kernel_dtypes`). The fake session (:class:`planner.measure.fake.FakeSession`)
enters them; each replacement made is added to the set it is given, which the session lists
among its assumptions.

Design notes
------------
* **Planning for a device this torch cannot run.** Autograd on fake CUDA tensors needs
  torch's CUDA runtime (a CPU-only build aborts the process), so where CUDA is not
  available a CUDA step is *emulated* on fake CPU tensors: storages are charged as CUDA's
  allocator charges them (whole 512-byte blocks), and the kernels whose saved tensors differ
  by device are replaced by the ones CUDA runs: scaled-dot-product attention uses the flash
  kernel for fp16/bf16 without a mask and the memory-efficient kernel otherwise (CPU's
  flash kernel saves a different log-sum-exp), dropout uses the fused kernel that keeps a
  1-byte mask (CPU keeps a mask of the input's dtype), and ``autocast("cuda")`` regions
  run as CPU autocast with CUDA's dtype, casting as CUDA's lists cast
  (:mod:`planner.measure.cuda_autocast`). Each replacement made is listed in
  :attr:`~planner.measure.fake.FakeSession.assumptions`, which the profile records.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode, is_fake

from planner.apply.wrap import RecomputedUnder
from planner.measure.cuda_autocast import CudaAutocastLists

__all__ = ["fake_tensor_device"]


def fake_tensor_device(device_type: str) -> str:
    """The device fake tensors carry for a step planned on ``device_type``: the device
    itself where torch can run autograd on it here, else ``cpu`` (emulation; see notes)."""
    if device_type == "cuda" and not torch.cuda.is_available():
        return "cpu"
    return device_type


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
    a mask, query, key and value heads of one size, at most 256 (``check_head_dim_size_flash``:
    DeepSeek-V2's multi-head latent attention, queries and keys of 96 and values of 64, runs
    the memory-efficient kernel), memory-efficient otherwise. Returns the output and the
    kernel's name."""
    aten = torch.ops.aten
    if (
        attn_mask is None
        and query.dtype in (torch.float16, torch.bfloat16)
        and query.shape[-1] == key.shape[-1] == value.shape[-1] <= 256
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


class _CudaKernels(RecomputedUnder):
    """Replaces, on CPU fake tensors, the functions whose CUDA kernels save other tensors
    than their CPU kernels (see the module's design notes). Records what it replaced. A
    planned module's checkpoint recomputes under it too (:class:`RecomputedUnder`: the
    autograd engine runs the recomputation without the forward's torch-function modes)."""

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


@contextlib.contextmanager
def _flex_attention_trains(replaced: set[str]) -> Iterator[None]:
    """FlexAttention trains on fake tensors standing for CUDA ones: torch refuses its
    backward on CPU tensors (``_validate_device``, a check of the device the tensors are
    on), which on an emulated step are CUDA's. Fake tensors only; a real tensor is checked
    as before. Its operator's fake kernels allocate what CUDA's fused kernels do: the
    output, the log-sum-exp and the row maxima (all three saved, with the query, key,
    value and block mask, by its autograd function), and the gradients of query, key and
    value. Scoped: outside it, torch's check is back."""
    try:
        flex = importlib.import_module("torch.nn.attention.flex_attention")
    except ImportError:
        yield
        return
    original = getattr(flex, "_validate_device", None)
    if original is None:
        yield
        return

    def validate_device(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        if is_fake(query):
            replaced.add(
                "flex_attention: trained as on CUDA (torch refuses its backward on CPU "
                "tensors), its fused kernels' outputs and saved tensors"
            )
            return
        original(query, key, value)

    setattr(flex, "_validate_device", validate_device)  # noqa: B010
    try:
        yield
    finally:
        setattr(flex, "_validate_device", original)  # noqa: B010


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
def _autocast_emulated(device_type: str, replaced: set[str]) -> Iterator[None]:
    """Inside the emulation, ``torch.autocast("cuda", ...)`` becomes CPU autocast with the
    same dtype (the fake tensors are CPU tensors, which CUDA autocast would not touch), and
    CPU autocast casts as CUDA's does (:class:`CudaAutocastLists`). A step that autocasts on
    the device its tensors are on (``--hf --autocast``) opens a CPU region here: the same."""
    original_init = torch.amp.autocast_mode.autocast.__init__

    def init(self: Any, device_type_: str | None = None, *args: Any, **kwargs: Any) -> None:
        if device_type_ is None:  # by keyword, as torch.utils.checkpoint's recomputation does
            device_type_ = kwargs.pop("device_type")
        enabled = kwargs.get("enabled", args[1] if len(args) > 1 else True)  # after dtype
        if device_type_ in (device_type, "cpu") and enabled:
            replaced.add(
                f'autocast("{device_type}"): emulated by CPU autocast with the same dtype, '
                "casting as CUDA's lists cast (torch's autocast_mode.h)"
            )
        if device_type_ == device_type:  # a disabled region too: it turns the CPU one off
            device_type_ = "cpu"
        original_init(self, device_type_, *args, **kwargs)

    autocast = torch.amp.autocast_mode.autocast
    setattr(autocast, "__init__", init)  # noqa: B010
    try:
        with CudaAutocastLists():
            yield
    finally:
        setattr(autocast, "__init__", original_init)  # noqa: B010
