"""Switches in a live model that change a training step's memory, set the way a plan
assumes (:mod:`planner.core.switches`): Hugging Face's key/value cache, the model's own
checkpointing, a mixture of experts' routing. In the lowest torch layer with
:mod:`planner.apply`: training scripts import it through :func:`planner.apply_plan`, and the
profiler uses the same functions so that the step it records is the step ``apply_plan``
leaves.
"""

from __future__ import annotations

import contextlib
import math
import sys
from typing import Any

import torch

from planner.dispatch import DispatchWatcher

__all__ = [
    "OWN_CHECKPOINTING_FLAGS",
    "RoutingAsPlanned",
    "RoutingWatcher",
    "TopkRoutedAsPlanned",
    "assumed_routing",
    "busiest_expert_load",
    "cache_owners",
    "flag_names",
    "is_routing_choice",
    "own_checkpointing_flags",
    "routing_as_planned",
    "routing_for_choice",
    "switch_off_caches",
    "switch_off_layerdrop",
]


def _is_hugging_face_model(module: torch.nn.Module) -> bool:
    modeling = sys.modules.get("transformers.modeling_utils")
    base = getattr(modeling, "PreTrainedModel", None)
    return base is not None and isinstance(module, base)


def cache_owners(model: torch.nn.Module) -> list[tuple[str, Any]]:
    """(qualified name, config) of each Hugging Face model in ``model`` whose config has
    ``use_cache`` on, one per config object (a causal LM and its inner model share one)."""
    found: dict[int, tuple[str, Any]] = {}
    for name, module in model.named_modules():
        config = getattr(module, "config", None)
        if (
            config is not None
            and getattr(config, "use_cache", None) is True
            and _is_hugging_face_model(module)
        ):
            found.setdefault(id(config), (name, config))
    return list(found.values())


def switch_off_caches(model: torch.nn.Module) -> tuple[str, ...]:
    """Turn ``config.use_cache`` off in every Hugging Face model inside ``model``, as Hugging
    Face's gradient checkpointing does in training: a key/value cache is for generation, and
    in a training step it keeps every layer's keys and values alive until the output is
    dropped (so no layer could be checkpointed). Returns the names of the models switched
    (``""`` for ``model`` itself). ``generate()`` passes its own ``use_cache``, so inference
    still uses a cache."""
    owners = cache_owners(model)
    for _, config in owners:
        config.use_cache = False
    return tuple(name for name, _ in owners)


# -- LayerDrop ------------------------------------------------------------------------------
# In training, LayerDrop skips each layer with some probability, drawn in the forward of the
# module that loops over the layers (`if self.training and self.layerdrop > 0.0: ...` in
# Hugging Face's M2M-100, NLLB-MoE, SeamlessM4T; `config.layerdrop` read in the forward in
# wav2vec 2.0). A step's memory then depends on what was drawn; the most is with no layer
# skipped. Set to 0, the step draws nothing there, and fake tensors can run it.
LAYERDROP_FIELDS = ("layerdrop", "encoder_layerdrop", "decoder_layerdrop")
"""The usual fields; any other a config names ``..._layerdrop`` (SeamlessM4T's
``speech_encoder_layerdrop``) is switched off too."""


def _layerdrop_fields(config: Any) -> list[str]:
    named = vars(config) if hasattr(config, "__dict__") else {}
    more = sorted(name for name in named if name.endswith("_layerdrop"))
    return [*LAYERDROP_FIELDS, *(name for name in more if name not in LAYERDROP_FIELDS)]


def _positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def switch_off_layerdrop(model: torch.nn.Module) -> tuple[str, ...]:
    """Set every LayerDrop probability in ``model`` to 0 (a module's ``layerdrop``
    attribute, and the ``layerdrop`` fields of each module's config, one per config
    object); returns what was set (``encoder.layerdrop``, ``config.encoder_layerdrop``)."""
    switched = []
    configs: set[int] = set()
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        if _positive_number(vars(module).get("layerdrop")):
            module.layerdrop = 0.0
            switched.append(f"{prefix}layerdrop")
        config = vars(module).get("config")
        if config is None or id(config) in configs:
            continue
        configs.add(id(config))
        for field in _layerdrop_fields(config):
            if _positive_number(getattr(config, field, None)):
                setattr(config, field, 0.0)
                switched.append(f"{prefix}config.{field}")
    return tuple(switched)


# -- the model's own checkpointing --------------------------------------------------------
# Checkpointing a model does itself, switched by a flag on its modules: Hugging Face's
# `gradient_checkpointing` (set by `gradient_checkpointing_enable()`) and timm's
# `grad_checkpointing` (set by `set_grad_checkpointing()`). Checkpointing in the model's own
# code with no flag is seen in the recorded step instead (planner.measure.profiler).
OWN_CHECKPOINTING_FLAGS = ("gradient_checkpointing", "grad_checkpointing")


def own_checkpointing_flags(model: torch.nn.Module) -> list[tuple[str, str]]:
    """(module name, flag) for each own-checkpointing flag that is on (``True``)."""
    return [
        (name, flag)
        for name, module in model.named_modules()
        for flag in OWN_CHECKPOINTING_FLAGS
        if vars(module).get(flag) is True
    ]


def flag_names(flags: list[tuple[str, str]]) -> str:
    """``flags`` (:func:`own_checkpointing_flags`) as a message lists them:
    ``layers.0.gradient_checkpointing, ...``, four and how many more."""
    names = [f"{name}.{flag}" if name else flag for name, flag in flags]
    shown = ", ".join(names[:4])
    return shown + (f" and {len(names) - 4} more" if len(names) > 4 else "")


# -- mixture-of-experts routing ------------------------------------------------------------
# A router picks, for each token, its top-k experts: ``torch.topk(scores, k)`` over the last
# dimension of a float tensor of scores. Where an experts layer runs each expert on the tokens
# routed to it (Hugging Face's eager experts: ``nonzero``/``where`` per expert), activation
# sizes follow the routing, which a fake step cannot know: it plans for an assumed routing.


def assumed_routing(
    lead_shape: tuple[int, ...], choices: int, k: int, expert_load: float = 1.0
) -> torch.Tensor:
    """Expert indices (int64, ``lead_shape + (k,)``) for ``prod(lead_shape)`` tokens each
    picking ``k`` distinct of ``choices`` experts, such that expert 0, the busiest, gets
    ``expert_load`` times the balanced share (tokens x k / choices; at most every token) and
    the others share the rest evenly. ``expert_load=1.0``: balanced."""
    tokens = 1
    for size in lead_shape:
        tokens *= size
    rows = torch.arange(tokens).unsqueeze(1)
    columns = torch.arange(k).unsqueeze(0)
    balanced = tokens * k / choices if choices else 0.0
    busiest = min(tokens, math.ceil(expert_load * balanced - 1e-9))
    if expert_load <= 1.0 or k >= choices or busiest <= balanced:
        indices = (rows * k + columns) % max(choices, 1)
    else:
        # The first `busiest` tokens pick expert 0 and k-1 of the others in turn; the rest
        # pick k of the others in turn (distinct in a row: k <= choices - 1 consecutive).
        others = choices - 1
        first = rows < busiest
        before = torch.where(first, rows * (k - 1), busiest * (k - 1) + (rows - busiest) * k)
        offset = torch.where(first, columns - 1, columns)
        indices = 1 + (before + offset) % others
        indices = torch.where(first & (columns == 0), torch.zeros_like(indices), indices)
    return indices.reshape(*lead_shape, k)


def busiest_expert_load(indices: torch.Tensor, choices: int) -> float:
    """The most tokens any expert got in routing ``indices`` (``(..., k)``), as a multiple
    of the balanced share."""
    k = indices.shape[-1]
    tokens = indices.numel() // max(k, 1)
    if tokens == 0 or choices == 0:
        return 0.0
    counts = torch.bincount(indices.reshape(-1).to(torch.int64).cpu(), minlength=choices)
    return float(counts.max()) / (tokens * k / choices)


def is_routing_choice(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether an op is a router's top-k pick: ``aten.topk`` of floats over the last
    dimension (a router's scores per expert)."""
    if func is not torch.ops.aten.topk.default or not args:
        return False
    scores = args[0]
    dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
    return (
        isinstance(scores, torch.Tensor)
        and scores.is_floating_point()
        and scores.dim() >= 1
        and dim in (-1, scores.dim() - 1)
    )


def routing_for_choice(
    args: tuple[Any, ...], kwargs: dict[str, Any], expert_load: float
) -> torch.Tensor:
    """The assumed routing (:func:`assumed_routing`, on CPU) for a router's top-k pick
    called with ``args``/``kwargs`` (:func:`is_routing_choice`): its scores' leading
    dimensions are the tokens, its last the experts."""
    scores = args[0]
    k = int(args[1] if len(args) > 1 else kwargs["k"])
    return assumed_routing(tuple(scores.shape[:-1]), scores.shape[-1], k, expert_load)


class RoutingAsPlanned(DispatchWatcher):
    """Inside it, every router's top-k pick (:func:`is_routing_choice`) routes as a plan
    assumed (:func:`assumed_routing`), on real tensors: its indices are overwritten with the
    assumed ones and its values with the scores at those indices (so autograd's backward of
    ``topk``, which scatters by the indices, stays consistent). For checking a plan's
    prediction under the routing it was made for (``ckpt-plan``'s plan check); in training
    the first-forward guard watches the real routing instead."""

    def __init__(self, expert_load: float) -> None:
        super().__init__()
        self.expert_load = expert_load
        self.routed = 0  # router picks routed so far

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if is_routing_choice(func, args, kwargs):
            self.routed += 1
            values, indices = out
            # In place: the step keeps the storages it would have had. Out of sight of a
            # mode entered before this one (a memory tracker, where TopkRoutedAsPlanned
            # enters it around a topk): what it makes to route is not the step's.
            with torch._C._DisableTorchDispatch():
                routing = routing_for_choice(args, kwargs, self.expert_load).to(indices.device)
                indices.copy_(routing)
                torch.gather(args[0], -1, routing, out=values)
        return out


def routing_as_planned(expert_load: float | None) -> contextlib.AbstractContextManager[Any]:
    """:class:`RoutingAsPlanned` for a plan that assumed a routing, else nothing."""
    return RoutingAsPlanned(expert_load) if expert_load is not None else contextlib.nullcontext()


class TopkRoutedAsPlanned:
    """:class:`RoutingAsPlanned` for steps that are timed: entered only around each call of
    ``torch.topk`` and ``Tensor.topk`` (how every router calls it: Mixtral, Qwen3-MoE,
    OLMoE, gpt-oss, DeepSeek-V3), which are replaced while inside, so every other op runs
    as in training. A dispatch mode over the whole step runs each op through Python: a tiny
    eager Mixtral's CPU step (10 x 32 tokens) took 32.7 ms under it, 16.7 ms without.
    ``routed``: the router picks it routed. Where ``expert_load`` is None, nothing."""

    def __init__(self, expert_load: float | None) -> None:
        self.expert_load = expert_load
        self.routed = 0
        self._method_was_own = False
        self._originals: tuple[Any, Any] | None = None

    def _routed(self, original: Any) -> Any:
        assert self.expert_load is not None
        expert_load = self.expert_load

        def topk(*args: Any, **kwargs: Any) -> Any:
            mode = RoutingAsPlanned(expert_load)
            with mode:
                out = original(*args, **kwargs)
            self.routed += mode.routed
            return out

        return topk

    def __enter__(self) -> TopkRoutedAsPlanned:
        if self.expert_load is not None:
            self._originals = (torch.topk, torch.Tensor.topk)
            self._method_was_own = "topk" in torch.Tensor.__dict__
            torch.topk = self._routed(torch.topk)  # type: ignore[assignment]
            torch.Tensor.topk = self._routed(torch.Tensor.topk)  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        if self._originals is None:
            return
        function, method = self._originals
        torch.topk = function  # type: ignore[assignment]
        if self._method_was_own:
            torch.Tensor.topk = method  # type: ignore[method-assign]
        else:
            del torch.Tensor.topk  # the method of torch._C.TensorBase again
        self._originals = None


class RoutingWatcher(DispatchWatcher):
    """Records, while it is entered, the busiest expert's load (over the balanced share) in
    every router's top-k pick (:func:`is_routing_choice`): the real routing, against a
    plan's assumed ``expert_load``. Costs a ``bincount`` per pick; the first-forward guard
    enters it for one forward only."""

    def __init__(self) -> None:
        super().__init__()
        self.busiest_load = 0.0
        self.picks = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if is_routing_choice(func, args, kwargs):
            load = busiest_expert_load(out[1].detach(), args[0].shape[-1])
            self.busiest_load = max(self.busiest_load, load)
            self.picks += 1
        return out
