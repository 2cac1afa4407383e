"""The built-in tensor-parallel layout of Hugging Face Llama-family models (``--hf CONFIG
--tp T`` without a model file): :func:`parallelize_hf_llama` (docs/distributed.md,
"Tensor parallelism: --tp").

Design notes
------------
* **torchtitan's Llama layout** on Hugging Face's module names: the embedding row-wise
  (its output sharded over the sequence: Shard(1)), every RMSNorm sequence-parallel, the
  attention's and the MLP's input all-gathered to the whole sequence (``PrepareModuleInput``),
  ``q/k/v_proj`` and ``gate/up_proj`` column-wise, ``o_proj`` and ``down_proj`` row-wise
  back to sequence shards (a reduce-scatter), the final norm sequence-parallel and
  ``lm_head`` column-wise from the gathered sequence, its logits replicated (the model's own
  loss then runs on whole logits: no loss parallelism, which needs the training loop's
  ``loss_parallel()`` context).
* **DTensors between the blocks.** Hugging Face reads the sequence length off the embedding's
  output (``position_ids``, the causal mask, the rotary tables); a rank's local shard would
  give it 1/T of it. So the embedding, ``o_proj`` and ``down_proj`` return DTensors
  (``use_local_output=False``), whose shape is the global one, and the residual additions
  run on DTensors; inside the attention and the MLP the tensors are local, as in torchtitan.
* **What it refuses**: a model whose modules are not Llama's (``model.embed_tokens``,
  ``model.layers[*].self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``, the two
  layer norms, ``model.norm``, ``lm_head``: Llama, Mistral and Qwen2 have them, and no
  other parameter: Qwen3's per-head ``q_norm``/``k_norm`` would see 1/T of the heads on each
  rank, their gradients differing across the TP group with nothing to reduce them), tied
  embeddings (the embedding and ``lm_head`` would be sharded as two parameters), and head
  counts the TP degree does not divide: each a :class:`ModelFileError` naming the fix.
* **Then FSDP2**: where the mesh has data-parallel dimensions, ``fully_shard`` on each
  decoder layer and then the root over them, as without TP.
"""

from __future__ import annotations

from typing import Any

import torch

from planner.core.errors import ModelFileError

__all__ = ["parallelize_hf_llama"]

_LAYER_MODULES = (
    "input_layernorm",
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "post_attention_layernorm",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


def _check_llama(model: torch.nn.Module, tp: int) -> list[torch.nn.Module]:
    """The decoder layers of a Llama-family ``model`` the layout can split ``tp`` ways;
    else a :class:`ModelFileError` (see the module's design notes)."""
    name = type(model).__name__
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    missing = [
        path for path in ("model.embed_tokens", "model.norm", "lm_head") if not _has(model, path)
    ]
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        missing.append("model.layers")
    else:
        missing += [
            f"model.layers.0.{path}" for path in _LAYER_MODULES if not _has(layers[0], path)
        ]
    if missing:
        raise ModelFileError(
            f"{name} is not laid out like Llama ({', '.join(missing[:3])} missing), and the "
            "built-in tensor-parallel plan is for Llama-family models: write a model file "
            "with parallelize(model, mesh) for it"
        )
    laid_out = ("model.embed_tokens.", "model.norm.", "lm_head.")
    layer_modules = tuple(f"{path}." for path in _LAYER_MODULES)
    others = [
        parameter
        for parameter, _ in model.named_parameters()
        if not parameter.startswith(laid_out)
        and not (
            parameter.startswith("model.layers.")
            and parameter.split(".", 3)[-1].startswith(layer_modules)
        )
    ]
    if others:
        raise ModelFileError(
            f"{name} has parameters the built-in tensor-parallel plan does not lay out "
            f"({', '.join(others[:2])}{', ...' if len(others) > 2 else ''}): their gradients "
            "would differ across the TP ranks; write a model file with parallelize(model, "
            "mesh) for it"
        )
    config = getattr(model, "config", None)
    if getattr(config, "tie_word_embeddings", False):
        raise ModelFileError(
            f"{name} ties its embedding and lm_head, which the built-in tensor-parallel plan "
            "shards differently: write a model file with parallelize(model, mesh), or plan "
            "without --tp"
        )
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    for what, count in (("attention heads", heads), ("key/value heads", kv_heads)):
        if isinstance(count, int) and count % tp:
            raise ModelFileError(
                f"{name} has {count} {what}, which tensor parallelism of degree {tp} does "
                "not divide: plan with a --tp that divides it"
            )
    assert isinstance(layers, torch.nn.ModuleList)
    return list(layers)


def _has(module: torch.nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True


def parallelize_hf_llama(model: torch.nn.Module, mesh: Any) -> torch.nn.Module:
    """Lay a Hugging Face Llama-family causal LM out on ``mesh`` (its ``"tp"`` dimension
    for tensor parallelism, its others for FSDP2; see the module's design notes), as
    ``ckpt-plan profile --hf CONFIG --tp T`` plans it. Call it after ``apply_plan``, as a
    model file's ``parallelize`` is called; build the optimizer after it."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    names = tuple(mesh.mesh_dim_names or ())
    if "tp" in names:
        tp_mesh = mesh["tp"]
        layers = _check_llama(model, tp_mesh.size())
        parallelize_module(
            model,
            tp_mesh,
            {
                "model.embed_tokens": RowwiseParallel(
                    input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False
                ),
                "model.norm": SequenceParallel(),
                "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
            },
        )
        for layer in layers:
            parallelize_module(
                layer,
                tp_mesh,
                {
                    "input_layernorm": SequenceParallel(),
                    "self_attn": PrepareModuleInput(
                        input_kwarg_layouts={"hidden_states": Shard(1)},
                        desired_input_kwarg_layouts={"hidden_states": Replicate()},
                    ),
                    "self_attn.q_proj": ColwiseParallel(),
                    "self_attn.k_proj": ColwiseParallel(),
                    "self_attn.v_proj": ColwiseParallel(),
                    "self_attn.o_proj": RowwiseParallel(
                        output_layouts=Shard(1), use_local_output=False
                    ),
                    "post_attention_layernorm": SequenceParallel(),
                    "mlp": PrepareModuleInput(
                        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                    ),
                    "mlp.gate_proj": ColwiseParallel(),
                    "mlp.up_proj": ColwiseParallel(),
                    "mlp.down_proj": RowwiseParallel(
                        output_layouts=Shard(1), use_local_output=False
                    ),
                },
            )
    data = tuple(name for name in names if name != "tp")
    if data:
        from torch.distributed.fsdp import fully_shard

        from planner.measure.candidates import find_blocks

        data_mesh = mesh[data] if len(data) > 1 else mesh[data[0]]
        for name in find_blocks(model):
            fully_shard(model.get_submodule(name), mesh=data_mesh)
        fully_shard(model, mesh=data_mesh)
    return model
