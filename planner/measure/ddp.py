"""DDP on one rank of a ``torchrun`` job: the gradient buckets a rank holds
(:func:`ddp_bucket_bytes`, :func:`gradients_into_buckets`), the options the model file's
``parallelize`` builds DDP with, read without building it (:func:`ddp_options`), and DDP's
all-reduce on a fake process group, or with its buckets kept for a measurement
(:func:`keep_bucket_buffers`). The rank itself, simulated or real, is
:mod:`planner.measure.distributed`'s.

Design notes
------------
* **DDP** allocates its gradient buckets (one flat buffer per bucket; together as large as
  the trainable parameters' gradients) when it is built, in C++, and copies each gradient
  into them in backward, in place. Nothing about the forward or backward changes, so a DDP
  rank's step is the single-process step plus those buckets, alive throughout:
  :func:`ddp_bucket_bytes`. DDP cannot be built on fake tensors (its Reducer needs their
  data), so a simulated DDP rank is the single-process step with the buckets added. A real
  rank's measurement sees the buckets as tensors through :func:`keep_bucket_buffers`.
* **The model file's DDP.** Where the model file's ``parallelize(model, mesh)`` builds the
  ``DistributedDataParallel`` itself, the simulation reads the options it passes
  (:func:`ddp_options`: its constructor is intercepted, so nothing is built) and real ranks
  run it as written. ``gradient_as_bucket_view=True`` changes the timeline, not just its
  total: the gradients *are* views of the buckets, so each gradient the backward makes is
  copied into its bucket and dropped at once (DDP's Reducer: "let grad point to
  bucket_view"). :func:`gradients_into_buckets` does the same on the simulated step, with a
  post-accumulate-grad hook per parameter and buckets of the step's own (fake) tensors.
  Under ``no_sync()`` the Reducer leaves gradients where autograd made them, outside the
  buckets, until the micro-batch that syncs copies them in: the hook does nothing there.
  Options that do not change what a rank holds (``bucket_cap_mb``, ``static_graph``,
  ``find_unused_parameters``, ``broadcast_buffers``) are read and need nothing more; a
  communication hook the model file registers after building DDP is not simulated (its
  buffers, e.g. a compressed copy of a bucket, are not in the plan; the real-rank check
  measures them).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from planner.core.errors import ModelFileError
from planner.measure.workload import ModelFile, gradients_syncing

__all__ = [
    "DdpOptions",
    "ddp_bucket_bytes",
    "ddp_options",
    "gradients_into_buckets",
    "keep_bucket_buffers",
]


def _no_communication_hook(state, bucket):  # type: ignore[no-untyped-def]
    """DDP's all-reduce on a fake process group: the default hook's in-place division of the
    bucket, with no communication (the fake group's all-reduce returns no tensor). DDP
    refuses a hook whose ``bucket`` is annotated with anything but ``GradBucket``."""
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(bucket.buffer().div_(dist.get_world_size()))
    return future


def keep_bucket_buffers(model: torch.nn.Module) -> list[torch.Tensor] | None:
    """Give a DDP ``model`` the all-reduce its default hook does (divide the bucket by the
    world size, all-reduce it in place: the same values), as a Python hook that also keeps
    each bucket's buffer in the returned list (by bucket index, the latest), so that a
    measurement can count the Reducer's buckets as the tensors they are. None where the
    model is not DDP or already has a hook of its own."""
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return None
    buffers: list[torch.Tensor] = []

    def all_reduce(state, bucket):  # type: ignore[no-untyped-def]
        buffer = bucket.buffer()
        del buffers[bucket.index() :]
        buffers.append(buffer)
        buffer.div_(dist.get_world_size())
        work = dist.all_reduce(buffer, async_op=True)
        assert work is not None
        return work.get_future().then(lambda future: future.value()[0])

    try:
        model.register_comm_hook(None, all_reduce)
    except RuntimeError:  # the model file's parallelize registered its own
        return None
    return buffers


def _call_parallelize(model_file: ModelFile, model: torch.nn.Module, mesh: Any) -> Any:
    assert model_file.parallelize is not None
    try:
        return model_file.parallelize(model, mesh)
    except Exception as error:
        raise ModelFileError(
            f"parallelize() in {model_file.path} raised {type(error).__name__}: {error}"
        ) from error


def _check_ddp_of_the_model(
    model_file: ModelFile, result: torch.nn.Module, model: torch.nn.Module
) -> None:
    """With --parallel ddp, the model file's ``parallelize`` must wrap the whole model in
    ``DistributedDataParallel`` (what a DDP rank holds is planned for that)."""
    if isinstance(result, torch.nn.parallel.DistributedDataParallel) and result.module is model:
        return
    raise ModelFileError(
        f"parallelize() in {model_file.path} does not return the model wrapped in "
        "DistributedDataParallel, but the plan is for --parallel ddp: return "
        "DistributedDataParallel(model, ...) from it, or plan with --parallel fsdp2 if it "
        "shards the model"
    )


@dataclasses.dataclass(frozen=True)
class DdpOptions:
    """What a rank's ``DistributedDataParallel`` is built with, as far as its memory goes
    (see the module's design notes)."""

    gradient_as_bucket_view: bool = False
    from_model_file: bool = False
    """Read from the model file's ``parallelize`` (else DDP's defaults)."""

    def describe(self) -> str:
        view = ", gradients as views of the buckets" if self.gradient_as_bucket_view else ""
        if self.from_model_file:
            return f"the model file's parallelize(model, mesh): DistributedDataParallel{view}"
        return f"DistributedDataParallel with its default buckets{view}"


class _DdpCaptured(BaseException):
    """Raised by the intercepted ``DistributedDataParallel`` constructor (see
    :func:`ddp_options`) to stop the model file's ``parallelize`` there (not an
    ``Exception``: a model file's ``except Exception`` must not swallow it)."""

    def __init__(self, module: Any, arguments: dict[str, Any]) -> None:
        super().__init__("DistributedDataParallel intercepted")
        self.module = module
        self.arguments = arguments


@contextlib.contextmanager
def _ddp_intercepted() -> Iterator[None]:
    """Within the block, building a ``DistributedDataParallel`` raises :class:`_DdpCaptured`
    with the arguments it was given (bound to its signature, defaults filled in)."""
    import inspect

    ddp = torch.nn.parallel.DistributedDataParallel
    original = ddp.__init__
    signature = inspect.signature(original)

    def intercepted(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        raise _DdpCaptured(bound.arguments.get("module"), dict(bound.arguments))

    ddp.__init__ = intercepted  # type: ignore[method-assign]
    try:
        yield
    finally:
        ddp.__init__ = original  # type: ignore[method-assign]


_UNMODELLED_DDP_OPTIONS = ("mixed_precision", "delay_all_reduce_named_params")


def ddp_options(model_file: ModelFile, model: torch.nn.Module, mesh: Any) -> DdpOptions:
    """The options the model file's ``parallelize(model, mesh)`` builds DDP with (DDP's
    defaults where it defines none), read without building it: its constructor is
    intercepted and stops ``parallelize`` there (DDP cannot be built on fake tensors; see
    the module's design notes). A ``parallelize`` that builds no DDP, or wraps less than the
    whole model, or passes an option whose memory is not modelled, is a
    :class:`ModelFileError` that says what to do."""
    if model_file.parallelize is None:
        return DdpOptions()
    try:
        with _ddp_intercepted():
            result = _call_parallelize(model_file, model, mesh)
    except _DdpCaptured as captured:
        if captured.module is not model:
            part = any(captured.module is module for module in model.modules())
            raise ModelFileError(
                f"parallelize() in {model_file.path} "
                + (
                    "wraps a part of the model in DistributedDataParallel"
                    if part
                    else "builds DistributedDataParallel on something other than the model "
                    "(torch.distributed's replicate() does, on a list of its parameters)"
                )
                + ", but --parallel ddp plans DDP of the whole model: return "
                "DistributedDataParallel(model, ...) from it"
            ) from None
        unmodelled = [
            name for name in _UNMODELLED_DDP_OPTIONS if captured.arguments.get(name) is not None
        ]
        if unmodelled:
            raise ModelFileError(
                f"parallelize() in {model_file.path} builds DistributedDataParallel with "
                f"{', '.join(unmodelled)}, whose memory ckpt-plan does not model: plan "
                "without it"
            ) from None
        return DdpOptions(
            gradient_as_bucket_view=bool(captured.arguments.get("gradient_as_bucket_view")),
            from_model_file=True,
        )
    del result
    raise ModelFileError(
        f"parallelize() in {model_file.path} builds no DistributedDataParallel, but the plan "
        "is for --parallel ddp: return DistributedDataParallel(model, ...) from it "
        "(torch.distributed's replicate() is not planned), or plan with --parallel fsdp2 if "
        "it shards the model"
    )


def _ddp_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters DDP puts in its buckets: trainable, not ignored
    (``DistributedDataParallel._set_params_and_buffers_to_ignore_for_model``)."""
    inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    ignored = set(getattr(model, "parameters_to_ignore", ())) | set(
        getattr(inner, "_ddp_params_and_buffers_to_ignore", ())
    )
    return [
        parameter
        for name, parameter in inner.named_parameters()
        if parameter.requires_grad and name not in ignored
    ]


def ddp_bucket_bytes(model: torch.nn.Module) -> int:
    """The bytes of DDP's gradient buckets for ``model`` (a ``DistributedDataParallel`` or the
    module it wraps): every trainable parameter's gradient, in flat buffers allocated when DDP
    is built (see the module's design notes). With ``gradient_as_bucket_view`` the gradients
    live in them (:func:`gradients_into_buckets`)."""
    return sum(p.numel() * p.element_size() for p in _ddp_parameters(model))


@contextlib.contextmanager
def gradients_into_buckets(model: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """Within the block, each gradient ``model``'s backward makes for a parameter DDP
    buckets is copied into a bucket of its own and replaced by its view there, as DDP's
    Reducer does with ``gradient_as_bucket_view=True`` (see the module's design notes).
    Yields the buckets (one flat tensor per dtype, made here on the parameters' device, fake
    under a fake session): a recording must count them from the start and not again."""
    parameters = _ddp_parameters(model)
    by_dtype: dict[torch.dtype, list[torch.nn.Parameter]] = {}
    for parameter in parameters:
        by_dtype.setdefault(parameter.dtype, []).append(parameter)
    buckets: list[torch.Tensor] = []
    views: dict[int, torch.Tensor] = {}
    for dtype, group in by_dtype.items():
        bucket = torch.zeros(sum(p.numel() for p in group), dtype=dtype, device=group[0].device)
        buckets.append(bucket)
        offset = 0
        for parameter in group:
            views[id(parameter)] = bucket[offset : offset + parameter.numel()].view_as(parameter)
            offset += parameter.numel()

    def into_bucket(parameter: torch.Tensor) -> None:
        if not gradients_syncing():  # DDP's no_sync(): the Reducer leaves .grad alone
            return
        view = views[id(parameter)]
        grad = parameter.grad
        if grad is not None and grad is not view:  # else accumulated in place, in the bucket
            with torch.no_grad():
                view.copy_(grad)
            parameter.grad = view

    handles = [p.register_post_accumulate_grad_hook(into_bucket) for p in parameters]
    try:
        yield buckets
    finally:
        for handle in handles:
            handle.remove()
