"""CUDA's autocast on the fake CPU tensors that emulate CUDA
(:mod:`planner.measure.cuda_emulation`).

``torch.autocast("cuda")`` casts the ops of CUDA's lists; on the CPU tensors of the emulation
CPU autocast runs instead, with CPU's lists, which are not CUDA's: CUDA runs ``layer_norm``,
``rms_norm``, ``group_norm``, ``pow``, ``exp``, ``log``, ``rsqrt``, ``softplus``, ``logsumexp``
and the upsampling ops in float32, makes ``softmax``, ``log_softmax``, ``sum``, ``cumsum`` and
``prod`` of a 16-bit input return float32, casts ``einsum``, ``mv`` and the RNN cells down,
promotes ``addcmul`` and ``index_put`` to their widest input, and refuses
``binary_cross_entropy``; CPU does none of that, and casts to float32 ops that CUDA leaves
alone (``cross_entropy_loss``, ``stft``, the FFTs, ``cat`` promoted). A bf16 activation
that CUDA would make float32 (GPT-2's ``gelu_new`` under autocast: ``pow`` of a bf16 input,
then every op after it in float32) is half the size on CPU's lists, and every tensor saved
from it.

:class:`CudaAutocastLists` makes CPU autocast cast as CUDA's does while it is open: a Python
kernel at the ``AutocastCPU`` dispatch key for each op of CUDA's lists, with CUDA's cast
policy (:data:`CUDA_LISTS`, torch 2.13's ``ATen/autocast_mode.h``; ``tests/test_cuda_autocast.py``
checks them against the ops torch registers for ``AutocastCUDA``), and a fallthrough for each
op CPU autocast casts that CUDA's lists do not name. The lower-precision ops both devices cast
keep CPU's own kernel, which keeps casts of the weights in autocast's cache as CUDA's does; of
the lower-precision ops only CUDA casts (``einsum``, ``mv``, ``addmv``, ``addr``,
``chain_matmul``, ``linalg_multi_dot``, ``convolution`` called directly, the RNN cells), a
weight's cast is made each call (CUDA's cache would keep one until the region ends). One
kernel difference is left: CUDA's ``softmax``/``log_softmax`` of a float16 input to float32
reads the input as it is (``half_to_float``), CPU's converts it first, so the emulation
holds a float32 copy of the input for the moment the op runs (bf16 is converted on both).
Closing it removes the kernels: CPU autocast is CPU's again.

Each policy is autocast_mode.cpp's, for a tensor on the autocast device that is floating
point and not float64 ("eligible"): ``lower`` casts every eligible tensor argument to the
region's dtype; ``fp32`` to float32; ``fp32_set_opt_dtype`` passes ``dtype=float32`` where the
first argument is eligible and no dtype is given (no copy of the input: the output is
float32); ``fp32_append_dtype`` calls the overload that takes a dtype, with float32; ``promote``
casts every eligible tensor to the widest dtype among them and the region's; ``banned`` raises
CUDA's error.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from planner.measure.kernel_layouts import positional_arguments

__all__ = ["CUDA_LISTS", "CudaAutocastLists"]

CUDA_LISTS: dict[str, tuple[str, ...]] = {
    "lower": (
        "_convolution.deprecated",
        "_convolution",
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_tbc",
        "conv_transpose1d",
        "conv_transpose2d.input",
        "conv_transpose3d.input",
        "convolution",
        "cudnn_convolution",
        "cudnn_convolution_transpose",
        "prelu",
        "addmm",
        "addmv",
        "addr",
        "matmul",
        "einsum",
        "mm",
        "mv",
        "linalg_vecdot",
        "linear",
        "addbmm",
        "baddbmm",
        "bmm",
        "chain_matmul",
        "linalg_multi_dot",
        "_thnn_fused_lstm_cell",
        "_thnn_fused_gru_cell",
        "lstm_cell",
        "gru_cell",
        "rnn_tanh_cell",
        "rnn_relu_cell",
        "_scaled_dot_product_flash_attention",
        "scaled_dot_product_attention",
    ),
    "fp32": (
        "acos",
        "asin",
        "cosh",
        "erfinv",
        "exp",
        "expm1",
        "log",
        "log10",
        "log2",
        "log1p",
        "reciprocal",
        "rsqrt",
        "sinh",
        "tan",
        "pow.Tensor_Scalar",
        "pow.Tensor_Tensor",
        "pow.Scalar",
        "softplus",
        "layer_norm",
        "native_layer_norm",
        "rms_norm",
        "group_norm",
        "frobenius_norm.dim",
        "nuclear_norm",
        "nuclear_norm.dim",
        "cosine_similarity",
        "poisson_nll_loss",
        "cosine_embedding_loss",
        "nll_loss",
        "nll_loss2d",
        "hinge_embedding_loss",
        "kl_div",
        "l1_loss",
        "smooth_l1_loss",
        "huber_loss",
        "mse_loss",
        "margin_ranking_loss",
        "multilabel_margin_loss",
        "soft_margin_loss",
        "triplet_margin_loss",
        "multi_margin_loss",
        "binary_cross_entropy_with_logits",
        "dist",
        "pdist",
        "cdist",
        "renorm",
        "logsumexp",
        "upsample_nearest1d",
        "_upsample_nearest_exact1d",
        "upsample_nearest2d",
        "_upsample_nearest_exact2d",
        "upsample_nearest3d",
        "_upsample_nearest_exact3d",
        "upsample_linear1d",
        "upsample_bilinear2d",
        "_upsample_bilinear2d_aa",
        "upsample_trilinear3d",
        "upsample_bicubic2d",
        "_upsample_bicubic2d_aa",
    ),
    "fp32_set_opt_dtype": (
        "prod",
        "prod.dim_int",
        "softmax.int",
        "log_softmax.int",
        "cumprod",
        "cumsum",
        "linalg_vector_norm",
        "linalg_matrix_norm",
        "linalg_matrix_norm.str_ord",
        "sum",
        "sum.dim_IntList",
    ),
    "fp32_append_dtype": ("norm.Scalar", "norm.ScalarOpt_dim"),
    "promote": (
        "addcdiv",
        "addcmul",
        "atan2",
        "bilinear",
        "cross",
        "dot",
        "vdot",
        "grid_sampler",
        "index_put",
        "tensordot",
        "scatter_add",
    ),
    "banned": ("binary_cross_entropy",),
}
"""CUDA's autocast policy for each op it casts (torch 2.13: ``ATen/autocast_mode.h``'s
lists, and ``autocast_mode.cpp``'s cuDNN convolutions and banned op)."""

# fp32_append_dtype: the overload called instead, with dtype=float32 last.
_WITH_DTYPE = {
    "norm.Scalar": "norm.ScalarOpt_dtype",
    "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
}

_BANNED_MESSAGE = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using "
    "torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast."
)

_NO_AUTOCAST = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)


def _op(name: str) -> Any:
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def _eligible(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and value.dtype != torch.float64
    )


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if _eligible(value) and value.dtype != dtype:
        return value.to(dtype)
    if isinstance(value, (list, tuple)) and any(isinstance(item, torch.Tensor) for item in value):
        return type(value)(_cast(item, dtype) for item in value)
    return value


def _tensors(values: Any) -> Iterator[torch.Tensor]:
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (item for item in value if isinstance(item, torch.Tensor))


def _kernel(name: str, policy: str) -> Callable[..., Any]:
    op = _op(name)
    schema = op._schema
    dtype_position = next(
        (index for index, argument in enumerate(schema.arguments) if argument.name == "dtype"),
        None,
    )

    def run(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(_NO_AUTOCAST):
            if policy == "banned":
                raise RuntimeError(_BANNED_MESSAGE)
            lower = torch.get_autocast_dtype("cpu")
            if policy in ("lower", "fp32"):
                to = lower if policy == "lower" else torch.float32
                args = tuple(_cast(value, to) for value in args)
                kwargs = {key: _cast(value, to) for key, value in kwargs.items()}
                return op(*args, **kwargs)
            first = next(iter((*args, *kwargs.values())), None)
            if policy == "fp32_set_opt_dtype":
                given = (
                    args[dtype_position]
                    if dtype_position is not None and len(args) > dtype_position
                    else kwargs.get("dtype")
                )
                if _eligible(first) and given is None:
                    if dtype_position is not None and len(args) > dtype_position:
                        args = (*args[:dtype_position], torch.float32, *args[dtype_position + 1 :])
                    else:
                        kwargs = {**kwargs, "dtype": torch.float32}
                return op(*args, **kwargs)
            if policy == "fp32_append_dtype":
                if not _eligible(first):
                    return op(*args, **kwargs)
                with_dtype = _op(_WITH_DTYPE[name])
                return with_dtype(*positional_arguments(op, args, kwargs), dtype=torch.float32)
            assert policy == "promote", policy
            widest = lower
            for tensor in _tensors((*args, *kwargs.values())):
                if _eligible(tensor):
                    widest = torch.promote_types(widest, tensor.dtype)
            args = tuple(_cast(value, widest) for value in args)
            kwargs = {key: _cast(value, widest) for key, value in kwargs.items()}
            return op(*args, **kwargs)

    return run


def _registered_for_cpu() -> set[str]:
    return {
        name.removeprefix("aten::")
        for name in torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCPU")
        if name.startswith("aten::")
    }


class CudaAutocastLists(contextlib.AbstractContextManager["CudaAutocastLists"]):
    """While open, CPU autocast casts as CUDA's autocast does (module docstring)."""

    def __init__(self) -> None:
        self._library: torch.library.Library | None = None

    def __enter__(self) -> CudaAutocastLists:
        cpu = _registered_for_cpu()
        kept = set(CUDA_LISTS["lower"]) & cpu  # CPU's own kernel: the same cast, cached
        covered = {name for names in CUDA_LISTS.values() for name in names}
        library = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
            for policy, names in CUDA_LISTS.items():
                for name in names:
                    if name not in kept and _has_op(name):
                        library.impl(name, _kernel(name, policy), "AutocastCPU")
            for name in sorted(cpu - covered):
                library.impl(name, torch.library.fallthrough_kernel, "AutocastCPU")
        self._library = library
        return self

    def __exit__(self, *exc: object) -> None:
        if self._library is not None:
            self._library._destroy()
            self._library = None


def _has_op(name: str) -> bool:
    try:
        _op(name)
    except (AttributeError, RuntimeError):
        return False
    return True
