"""Every Hugging Face architecture of a task, from its config's defaults with only the sizes
made small, as ckpt-plan model files (for benchmarks/hf_sweep.py).

The zoo (benchmarks/zoo_models.py) writes 24 configs by hand. This module builds the rest of a
``transformers`` task mapping (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` and its siblings) without
writing each: ``AutoConfig.for_model(type)`` gives the config as users ship it (``use_cache``,
tying, attention and expert implementations, dropout, layer patterns), and only the fields
that set sizes are replaced where the config has them (:data:`SIZES`, the zoo's sizes: 2
layers, width 64, FFN 128, 4 heads with 2 for keys and values, head width 16, 4 experts with
2 active, a vocabulary of 1000, 128 positions). Beyond that:

* a per-layer list (``layer_types``, ``block_types``) is cut to 2 entries holding two kinds
  where the default has several, so that 2 layers still show every kind of layer the model
  mixes (sliding and full attention, linear attention, state space);
* a default token id the small vocabulary cannot hold (pad 32000) is moved into it;
* sub-configs are shrunk too: text ones (``text_config``, ``decoder``) with every size field,
  vision and audio towers with their widths, depths and heads only;
* multi-head latent attention (DeepSeek) gets as many key/value heads as query heads, as the
  zoo's DeepSeek-V3;
* the few types whose defaults do not validate, or need a field the rules above miss, get it
  from :data:`EXTRA`, each with why.

Nothing here imports ``planner``: :func:`write_model_file` writes the two-function model file
every ckpt-plan stage loads, importing this module by its absolute path.

    from benchmarks.hf_sweep_models import TASKS, model_types, write_model_file
    for model_type in model_types("masked-lm"):
        path = write_model_file("masked-lm", model_type, folder)
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any, NamedTuple

from benchmarks.zoo_models import (
    BATCH_SIZE,
    EXPERT_SIZE,
    EXPERTS_PER_TOKEN,
    HEAD_DIM,
    HIDDEN_SIZE,
    IMAGE_SIZE,
    INTERMEDIATE_SIZE,
    MAX_POSITIONS,
    NUM_CLASSES,
    NUM_EXPERTS,
    NUM_HEADS,
    NUM_KV_HEADS,
    NUM_LAYERS,
    SEQ_LEN,
    VOCAB_SIZE,
    ZOO,
)
from benchmarks.zoo_models import sample_batch as zoo_sample_batch

__all__ = [
    "TASKS",
    "Task",
    "build_model",
    "make_config",
    "model_types",
    "sample_batch",
    "write_hf_config",
    "write_model_file",
]


class Task(NamedTuple):
    mapping: str  # in transformers.models.auto.modeling_auto: model type -> class name
    auto_class: str  # the class that builds a model of the task from any config
    via_hf: bool = False  # planned through `--hf CONFIG` (its batch), not a model file


TASKS = {
    "causal-lm": Task("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "AutoModelForCausalLM"),
    "masked-lm": Task("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "AutoModelForMaskedLM"),
    "seq2seq": Task("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "AutoModelForSeq2SeqLM"),
    "image": Task(
        "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
        "AutoModelForImageClassification",
        via_hf=True,
    ),
    "semantic-segmentation": Task(
        "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES",
        "AutoModelForSemanticSegmentation",
        via_hf=True,
    ),
    "ctc": Task("MODEL_FOR_CTC_MAPPING_NAMES", "AutoModelForCTC", via_hf=True),
    "audio-classification": Task(
        "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",
        "AutoModelForAudioClassification",
        via_hf=True,
    ),
    "sequence-classification": Task(
        "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
        "AutoModelForSequenceClassification",
        via_hf=True,
    ),
    "token-classification": Task(
        "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
        "AutoModelForTokenClassification",
        via_hf=True,
    ),
    "multiple-choice": Task(
        "MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES", "AutoModelForMultipleChoice", via_hf=True
    ),
    "question-answering": Task(
        "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES", "AutoModelForQuestionAnswering", via_hf=True
    ),
    "speech-seq2seq": Task(
        "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", "AutoModelForSpeechSeq2Seq", via_hf=True
    ),
    "image-text-to-text": Task(
        "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", "AutoModelForImageTextToText", via_hf=True
    ),
    "video-classification": Task(
        "MODEL_FOR_VIDEO_CLASSIFICATION_MAPPING_NAMES",
        "AutoModelForVideoClassification",
        via_hf=True,
    ),
    "masked-image-modeling": Task(
        "MODEL_FOR_MASKED_IMAGE_MODELING_MAPPING_NAMES",
        "AutoModelForMaskedImageModeling",
        via_hf=True,
    ),
    "contrastive": Task(
        "MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES",
        "AutoModelForZeroShotImageClassification",
        via_hf=True,
    ),
    "audio-text-to-text": Task(
        "the speech language models of MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES and "
        "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
        "AutoModelForSpeechSeq2Seq",
        via_hf=True,
    ),
}
"""The tasks, each named as the batch kind it trains on: the zoo's language models
(:func:`benchmarks.zoo_models.sample_batch`), and image classifiers, semantic
segmentation, speech recognition with a CTC head, audio classifiers and the heads
fine-tuning puts on a text model, planned as a user plans them: ``--hf`` on the config
(:func:`write_hf_config`), whose batch is ckpt-plan's own (``planner/measure/hf.py``).
Those include the zoo's types (ViT and ConvNeXt among the image classifiers; the zoo has
none of the other heads)."""

VISION_PATCHES = 4
"""A vision-language model's image side in patches (:func:`make_config`)."""

VIDEO_FRAMES = 8
"""A video model's frames a video (four tubelets of two frames: VideoMAE's, ViViT's)."""

AUDIO_SAMPLES, AUDIO_FRAMES = 16_000, 64
"""An audio batch's length (``--seq-len``): one second of 16 kHz audio per example (wav2vec
2.0's feature encoder makes 49 frames of it), or 64 frames for models that take features
(``--hf`` gives a CTC head's transcripts 8 labels for either)."""

ZOO_TYPES = {
    "gpt2", "gpt_neox", "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text",
    "phi3", "olmo2", "mixtral", "qwen3_moe", "olmoe", "gpt_oss", "deepseek_v3", "mamba", "jamba",
    "bert", "modernbert", "t5", "bart", "vit", "convnext",
}  # fmt: skip
"""The zoo's model types (benchmarks/zoo_models.py), left out: the zoo checks them at two
budgets with configs written by hand."""
assert len(ZOO_TYPES) == len(ZOO)

_POSITIONS = (
    "max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "context_length",
    "max_target_positions", "model_max_length", "original_max_position_embeddings",
)  # fmt: skip

SIZES: dict[str, Any] = {
    # widths
    **dict.fromkeys(
        ("hidden_size", "n_embd", "d_model", "emb_dim", "embedding_dim", "embedding_size",
         "word_embed_proj_dim", "input_embedding_size", "output_embedding_size", "lru_width",
         "attention_hidden_size", "backbone_hidden_size"),
        HIDDEN_SIZE,
    ),
    "router_hidden_size": 32, "pronunciation_embed_dim": 32, "shape_embed_dim": 32,
    "laurel_rank": 16, "hidden_size_per_layer_input": 16, "prompt_mid_dim": 32,
    "o_lora_rank": 32, "hc_lowrank": 16, "ple_embed_dim": 32, "loop_gate_rank": 16,
    "gated_norm_rank": 16, "adapter_rank": 16, "time_step_rank": 8, "mamba_dt_rank": 8,
    "num_centroids": 16,
    # feed-forward
    **dict.fromkeys(
        ("intermediate_size", "ffn_hidden_size", "ffn_dim", "d_inner", "dff", "dim_ff",
         "feed_forward_size", "decoder_ffn_dim", "encoder_ffn_dim", "intermediate_size_mlp",
         "dense_intermediate_size"),
        INTERMEDIATE_SIZE,
    ),
    # layers
    **dict.fromkeys(
        ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers",
         "encoder_layers", "num_decoder_layers", "num_encoder_layers", "num_blocks",
         "num_layers_per_stack"),
        NUM_LAYERS,
    ),
    # heads
    **dict.fromkeys(
        ("num_attention_heads", "n_head", "n_heads", "num_heads", "attention_heads",
         "decoder_attention_heads", "encoder_attention_heads", "num_decoder_attention_heads",
         "num_encoder_attention_heads", "swa_num_attention_heads", "index_n_heads",
         "linear_num_heads", "linear_num_value_heads"),
        NUM_HEADS,
    ),
    **dict.fromkeys(
        ("num_key_value_heads", "num_kv_heads", "swa_num_key_value_heads",
         "linear_num_key_heads"),
        NUM_KV_HEADS,
    ),
    **dict.fromkeys(
        ("head_dim", "dim_head", "d_head", "attention_head_size", "kv_channels",
         "attention_head_dim", "d_kv", "swa_head_dim", "index_head_dim", "linear_head_dim",
         "linear_key_head_dim", "linear_value_head_dim"),
        HEAD_DIM,
    ),
    # multi-head latent attention (as the zoo's DeepSeek-V3)
    "kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
    "v_head_dim": 16, "qk_head_dim": 24,
    # experts
    **dict.fromkeys(
        ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts"), NUM_EXPERTS
    ),
    **dict.fromkeys(
        ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_k"), EXPERTS_PER_TOKEN
    ),
    "n_group": 1, "topk_group": 1, "num_expert_group": 1,
    **dict.fromkeys(
        ("moe_intermediate_size", "expert_ffn_hidden_size", "shared_expert_intermediate_size",
         "shared_experts_intermediate_size", "moe_shared_expert_intermediate_size"),
        EXPERT_SIZE,
    ),
    "first_k_dense_replace": 1, "num_dense_layers": 1, "zero_expert_num": 2,
    # state space
    "mamba_d_state": 16, "mamba_n_heads": 4, "mamba_d_head": 32, "mamba_d_ssm": 128,
    "ssm_state_size": 16, "mamba_num_heads": 4, "mamba_head_dim": 32, "mamba_headdim": 32,
    "state_size": 16,
    # positions and vocabularies
    **dict.fromkeys(_POSITIONS, MAX_POSITIONS),
    **dict.fromkeys(
        ("vocab_size", "decoder_vocab_size", "unpadded_vocab_size", "vocab_size_per_layer_input",
         "encoder_hash_byte_group_vocab"),
        VOCAB_SIZE,
    ),
    # partial rotary widths given in dims (GPT-J, CodeGen: 64 of 256)
    "rotary_dim": 4,
}  # fmt: skip
"""Size field -> its small value, set where a config (or its ``attribute_map``) has the field."""

_TOWER_FIELDS = (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_layers", "num_attention_heads",
    "num_heads", "num_key_value_heads", "head_dim", "d_model", "encoder_layers", "encoder_ffn_dim",
    "encoder_attention_heads", "n_layer", "n_head", "n_embd", "vocab_size",
)  # fmt: skip
TOWER_SIZES = {
    **{field: SIZES[field] for field in _TOWER_FIELDS},
    **dict.fromkeys(("out_hidden_size", "projection_dim", "embed_dim", "output_dim"), HIDDEN_SIZE),
    "depth": NUM_LAYERS,
}
"""The size fields of a vision or audio tower inside a composite config."""
IMAGE_SIZES = {"image_size": IMAGE_SIZE}
IMAGE_TASKS = ("image", "semantic-segmentation", "video-classification", "masked-image-modeling")
"""The tasks whose models take images alone (videos: frames of images), of these sizes."""
VIDEO_SIZES = {"image_size": 2 * IMAGE_SIZE, "crop_size": 2 * IMAGE_SIZE}
"""A video's frames, and a masked image model's images: 64 x 64 pixels (4 x 4 patches of 16;
V-JEPA 2 names it crop_size), so that their tokens (64 a video of :data:`VIDEO_FRAMES`, 16
an image, of which a mask hides some) outweigh the head."""
"""For image classifiers only (the zoo's 32 x 32 pixels), in the model and its towers: a text
model's vision tower is never run on a text batch, and its patch size may not divide 32."""

TEXT_SUBCONFIGS = {
    "text_config", "decoder", "decoder_config", "global_config", "encoder_config",
    "depth_decoder_config", "text_encoder", "patcher_config", "attn_config", "ffn_config",
}  # fmt: skip
"""Sub-configs shrunk with every size field (the others are towers: :data:`TOWER_SIZES`)."""
_DICT_SUBCONFIGS = {"attn_config", "ffn_config", "per_layer_config"}  # plain dicts, not configs
_DICT_FIELDS = {"per_layer_config", "rope_parameters"}  # dicts EXTRA sets (rope: merged)

_GEMMA4_TOWER = (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim",
)  # fmt: skip
EXTRA: dict[str, dict[str, Any]] = {
    # GPT-Neo's pattern is [[kinds, repeats]]: one of each kind
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    # its default shares K/V from layer 15 of 35: with 2 layers none would compute its own
    "gemma3n_text": {"num_kv_shared_layers": 0},
    "gemma4_assistant": {"hidden_size_per_layer_input": 0},  # its default does not validate
    "mamba2": {"num_heads": 4, "head_dim": 32, "n_groups": 1},  # heads x head_dim = 2 x width
    "zaya": {"num_experts_per_tok": 1},  # "supports num_experts_per_tok=1 only"
    # the axial positions multiply to the sequence (64 = 8 x 8) and add up to the width
    "reformer": {"is_decoder": True, "axial_pos_shape": [8, 8], "axial_pos_embds_dim": [16, 48]},
    "nemotron_h": {"n_groups": 1},
    "longcat_flash": {"head_dim": 8},  # its head_dim is the rotary part (qk_rope_head_dim)
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},  # default: 2 of 3 recurrent
    "dots3_note_text": {"head_dim": 24},  # sliding-window head_dim = nope + rope parts
    "dots3_note": {"text_config": {"head_dim": 24}},
    # the default attention layers sit past layer 2: one of the 2 layers holds one
    "bamba": {"attn_layer_indices": [1]},
    "granitemoehybrid": {"layer_types": ["linear_attention", "attention"]},
    # image classifiers: windows of 7 need the last of 4 stages (1/32 of the image) at 7 x 7;
    # at that size, a third of the default width (96) and heads to match keep it quick
    "swin": {"image_size": 224, "embed_dim": 32, "num_heads": [1, 2, 4, 8]},
    "donut-swin": {"image_size": 224, "embed_dim": 32, "num_heads": [1, 2, 4, 8]},
    "mobilevitv2": {"image_size": 64},  # at 32 its last stage is 1 x 1, too small to unfold
    # its width, depth and latent count are fields of its own: 1280 wide, 26 layers deep
    "perceiver": {
        "d_latents": HIDDEN_SIZE,
        "num_self_attends_per_block": NUM_LAYERS,
        "num_latents": 32,
    },
    # its drop-path rates index each stage's list (one per layer) by the stage's number
    "cvt": {"depth": [1, 2, 3]},
    # vision-language models: Gemma 3 pools the 4 x 4 patches to 2 x 2 tokens (its default
    # 64 x 64 to 16 x 16); PaliGemma's projector is as wide as the text model
    "gemma3": {"mm_tokens_per_image": 4},
    "shieldgemma2": {"mm_tokens_per_image": 4},
    "paligemma": {"projection_dim": HIDDEN_SIZE},
    # multimodal rotary sections (time, height, width) add up to half a head's rotary part:
    # 8 (GLM-4V's MoE and HY-V4: 4)
    **{
        model_type: {"text_config": {"rope_parameters": {"mrope_section": [2, 3, 3]}}}
        for model_type in (
            "qwen2_vl",
            "qwen2_5_vl",
            "glm4v",
            "glm46v",
            "glm_ocr",
            "glmga",
            "paddleocr_vl",
        )
    },
    "glm4v_moe": {"text_config": {"rope_parameters": {"mrope_section": [1, 1, 2]}}},
    "cosmos3_edge": {"text_config": {"rope_parameters": {"mrope_section": [2, 3, 3]}}},
    "hy_v4_vl": {"text_config": {"rope_parameters": {"mrope_section": [1, 1, 2]}}},
    # its projector concatenates 5 layers' features: 5 of the 2 layers' 3 hidden states
    "vipllava": {"vision_feature_layers": [-2, -1, 0, 1, 2]},
    # as from_encoder_decoder_pretrained and a tokenizer make one (TrOCR's): its decoder a
    # decoder reading the image, its start and pad tokens named
    "vision-encoder-decoder": {
        "decoder_start_token_id": 2,
        "pad_token_id": 0,
        "decoder": {"is_decoder": True, "add_cross_attention": True},
    },
    # its default tower's 224-pixel images make 14 x 14 patches, not the 16 x 16 its pooling
    # takes to its 256 tokens (checkpoints: 896 pixels, patches of 14); image begin/end ids
    # the small vocabulary holds
    "t5gemma2": {
        "eoi_token_index": 5,
        "encoder": {
            "boi_token_index": 4,
            "eoi_token_index": 5,
            "vision_config": {"image_size": 256},
        },
    },
    # its defaults leave the vision tower out (a text model): its own, sized as towers are
    "gemma4": {"vision_config": {field: TOWER_SIZES[field] for field in _GEMMA4_TOWER}},
    # its vision tower concatenates the features of 5 of its 32 layers (and the last) and
    # ends in 8 global layers; its language model cross-attends every fifth layer from 3
    "mllama": {
        "vision_config": {
            "intermediate_layers_indices": [0, 1],
            "num_global_layers": NUM_LAYERS,
            "vision_output_dim": 3 * HIDDEN_SIZE,
        },
        "text_config": {"cross_attention_layers": [1]},
    },
    # its encoder's convolutions have channels of their own (480): a size, made small
    "qwen3_asr": {"audio_config": {"downsample_hidden_size": HIDDEN_SIZE}},
    # its feature encoder's convolutions have channels of their own (512 each): sizes, made
    # small (a 30 s clip is 480000 samples through them)
    "omniasr": {"audio_config": {"conv_dim": [HIDDEN_SIZE] * 7}},
    # its two audio tokenizers' convolutions: 32 channels first, doubling each of 6 stages
    # (a 30 s clip is 480000 samples through them): sizes, made small
    "vibevoice_asr": {
        f"{kind}_tokenizer_encoder_config": {"num_filters": 4} for kind in ("acoustic", "semantic")
    },
    # its adaptor's width is tied to the language model's (a quarter of it)
    "fun_asr_nano": {"adaptor_config": {"intermediate_size": HIDDEN_SIZE // 4}},
    # their thinkers' defaults name no vision start token, which their rotary positions
    # look for before an image (a checkpoint's thinker_config does: 151652)
    "qwen3_omni_moe_thinker": {"vision_start_token_id": 8},
    "qwen2_5_omni_thinker": {
        "vision_start_token_id": 8,
        "text_config": {"rope_parameters": {"mrope_section": [2, 3, 3]}},
    },
    # their defaults name no audio token (Voxtral-Mini-3B's config: 24)
    **{t: {"audio_token_id": 24} for t in ("voxtral", "voxtral_realtime")},
    # its Q-Former projector reads the encoder's features: as wide as the encoder's
    **{
        t: {"projector_config": {"encoder_hidden_size": HIDDEN_SIZE}}
        for t in ("granite_speech", "granite_speech_plus")
    },
    # their defaults name no image token (a checkpoint's config does)
    **{t: {"image_token_id": 3} for t in ("minicpmv4_6", "minicpmv4_7", "minicpm_ocr")},
    # its pixel shuffle (ratio 0.5) makes features 4 x the tower's width, which its adapter
    # takes as intermediate_size (the defaults, 768 wide, do not match: Scout's are 1408 and
    # 5632); its projector's widths are fields of their own
    "llama4": {
        "vision_config": {
            "intermediate_size": 4 * HIDDEN_SIZE,
            **dict.fromkeys(
                ("projector_input_dim", "projector_output_dim", "vision_output_dim"), HIDDEN_SIZE
            ),
        }
    },
}
"""Per-type fields set last, each found by building the type (why, beside each)."""
TASK_EXTRA: dict[tuple[str, str], dict[str, Any]] = {
    # EfficientNet-B7's widths and depths (62M parameters at 32 pixels): a quarter and a
    # third of them, its image embedding (a quarter of 320 channels) the projection's width
    ("contrastive", "align"): {
        "projection_dim": 80,
        "vision_config": {"width_coefficient": 0.25, "depth_coefficient": 0.3},
    },
    ("masked-lm", "reformer"): {"is_decoder": False},  # bidirectional: its masked-LM head asks
    ("masked-lm", "esmc"): {"num_key_value_heads": NUM_HEADS},  # "does not support GQA"
    # their segmentation head takes 4 layers' features ("out_indices ... a list of 4")
    ("semantic-segmentation", "beit"): {"num_hidden_layers": 4, "out_indices": [1, 2, 3, 4]},
    ("semantic-segmentation", "data2vec-vision"): {
        "num_hidden_layers": 4,
        "out_indices": [1, 2, 3, 4],
    },
}
"""Fields for one task's model of a type, set after :data:`EXTRA`."""

_STAGE_DEPTHS = {"depths", "depth"}
"""Layers per stage of a vision model (Swin's [2, 2, 6, 2]): at most 2 each; the stages'
widths and heads stay as the config has them."""

_TOKEN_PRIORITY = ("pad", "bos", "eos", "decoder_start", "unk", "sep", "cls", "mask")
_FIRST_IDS = {"pad": 0, "bos": 1, "eos": 2}


_AUDIO_TEXT_MAPPINGS = (
    "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
)
"""The mappings naming speech language models (the audio-text-to-text task's): token ids
with a clip besides (``planner/measure/hf_audio.py``); the speech-seq2seq task leaves them
to it (the seq2seq task, whose batch is the zoo's text, keeps its own)."""


def _speech_language_model(class_name: str) -> bool:
    from planner.measure.hf_audio import takes_audio
    from planner.measure.hf_images import takes_images

    model_class = getattr(importlib.import_module("transformers"), class_name, None)
    return model_class is not None and takes_audio(model_class) and not takes_images(model_class)


def _mapping(task: str) -> dict[str, str]:
    modeling_auto = importlib.import_module("transformers.models.auto.modeling_auto")
    if task == "audio-text-to-text":
        merged: dict[str, str] = {}
        for name in _AUDIO_TEXT_MAPPINGS:
            for model_type, class_name in getattr(modeling_auto, name).items():
                if isinstance(class_name, str) and _speech_language_model(class_name):
                    merged.setdefault(model_type, class_name)
        return merged
    mapping = dict(getattr(modeling_auto, TASKS[task].mapping))
    if task == "speech-seq2seq":  # its speech language models take clips and token ids
        speech = _mapping("audio-text-to-text")
        mapping = {key: value for key, value in mapping.items() if key not in speech}
    return mapping


def model_types(task: str, via_hf: bool = False) -> list[str]:
    """The model types of ``task``'s mapping, in its order, less the zoo's where the task is
    planned by model file (the zoo checks those; the ``--hf`` tasks keep them, as does
    ``via_hf``: a sweep through ``--hf`` of a task that is not, ``--lora``'s)."""
    keep_zoo = TASKS[task].via_hf or via_hf
    return [model_type for model_type in _mapping(task) if keep_zoo or model_type not in ZOO_TYPES]


def _own(config: Any, name: str, default: Any = None) -> Any:
    """A field as the config stores it (no ``attribute_map`` or property in the way)."""
    return object.__getattribute__(config, "__dict__").get(name, default)


def _fields(config: Any) -> set[str]:
    if dataclasses.is_dataclass(config):
        return {field.name for field in dataclasses.fields(config)}
    return set(vars(config))


def _is_config(value: Any) -> bool:
    configured = hasattr(value, "to_dict") and hasattr(value, "model_type")
    return configured or (dataclasses.is_dataclass(value) and not isinstance(value, type))


def _layer_count(config: Any) -> int | None:
    for name in ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers"):
        value = _own(config, name)
        if isinstance(value, int):
            return value
    return None


def _token_ids(config: Any, overrides: dict[str, Any]) -> None:
    """Move the token ids the small vocabulary cannot hold into it (pad, bos and eos to 0, 1
    and 2 where free, the others from 3), the same id to the same new one."""
    names = sorted(
        (
            name
            for name in _fields(config)
            if name.endswith(("_token_id", "_token_index", "_token_ids"))
        ),
        key=lambda name: next(
            (i for i, prefix in enumerate(_TOKEN_PRIORITY) if name.startswith(prefix)), 99
        ),
    )
    moved: dict[int, int] = {}
    next_id = 3
    for name in names:
        value = _own(config, name)
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            continue
        new = []
        for old in values:
            if old >= VOCAB_SIZE and old not in moved:
                first = _FIRST_IDS.get(name.split("_")[0])
                if first is not None and first not in moved.values():
                    moved[old] = first
                else:
                    moved[old] = next_id
                    next_id += 1
            new.append(moved.get(old, old))
        if new != values:
            overrides[name] = new if isinstance(value, list) else new[0]


def _shrunk(
    config: Any, sizes: dict[str, Any], tower: bool, extra_sizes: dict[str, Any]
) -> dict[str, Any]:
    """Field -> small value for one config (``sizes`` and ``extra_sizes``); its sub-configs
    as nested dicts."""
    sizes = {**sizes, **extra_sizes}
    fields = _fields(config)
    aliases = getattr(config, "attribute_map", None) or {}
    overrides: dict[str, Any] = {}
    for key, value in sizes.items():
        target = key if key in fields else aliases.get(key)
        if target not in fields or target in overrides or target == "num_stages":
            continue  # (a vision model's stages: one per entry of its per-stage lists)
        old = _own(config, target)
        if isinstance(old, (bool, list, tuple)):
            continue  # a list: one value per stage of a vision model, left as it is
        if key in _POSITIONS and isinstance(old, int) and old < MAX_POSITIONS:
            continue  # already small
        dense_layers = key in ("first_k_dense_replace", "num_dense_layers")
        if dense_layers and isinstance(old, int) and old < 1:
            continue  # no dense layers by default: keep none
        if old is None and key not in ("head_dim", "num_key_value_heads", "num_experts_per_tok"):
            continue  # a field the default leaves unset stays unset (but these derive from it)
        overrides[target] = value
    for name in _STAGE_DEPTHS & fields:
        depths = _own(config, name)
        if isinstance(depths, (list, tuple)):
            overrides[name] = [min(depth, NUM_LAYERS) for depth in depths]
    if not tower:
        _token_ids(config, overrides)
    if "kv_lora_rank" in overrides and "num_key_value_heads" in overrides:
        overrides["num_key_value_heads"] = NUM_HEADS
    for name in fields:
        value = _own(config, name)
        if _is_config(value):
            text = name in TEXT_SUBCONFIGS
            overrides[name] = _shrunk(
                value, SIZES if text else TOWER_SIZES, tower=not text, extra_sizes=extra_sizes
            )
    return overrides


def _two_of_each(value: list[Any]) -> list[int]:
    """The indices of 2 entries of a per-layer list: the first and the first of another kind."""
    other = next((i for i, entry in enumerate(value) if entry != value[0]), None)
    return [0, other] if other is not None and isinstance(value[0], str) else [0, 1]


def _overrides(config: Any, extra: dict[str, Any], extra_sizes: dict[str, Any]) -> dict[str, Any]:
    overrides = _shrunk(config, SIZES, tower=False, extra_sizes=extra_sizes)
    for name in TEXT_SUBCONFIGS:
        sub = _own(config, name)
        if isinstance(overrides.get(name), dict) and sub is not None and hasattr(sub, "to_dict"):
            overrides[name] = _overrides(sub, extra.get(name, {}), extra_sizes)
    layers = _layer_count(config)
    if layers and layers > NUM_LAYERS:
        # Per-layer lists, layer_types first: its kinds choose which 2 layers stay.
        per_layer = {
            name: _own(config, name)
            for name in sorted(_fields(config), key=lambda name: (name != "layer_types", name))
            if isinstance(_own(config, name), list)
            and len(_own(config, name)) == layers
            and name not in extra
        }
        kept = next(
            (
                _two_of_each(value)
                for value in per_layer.values()
                if isinstance(value[0], str) and len(set(value)) > 1
            ),
            [0, 1],
        )
        for name, value in per_layer.items():
            overrides[name] = [value[i] for i in kept]
        per_layer_config = config.to_dict().get("per_layer_config")
        if per_layer_config and "per_layer_config" not in extra:
            # One entry per kept layer, its sizes scaled as the config's were.
            new = {}
            for position, index in enumerate(kept):
                entry = per_layer_config.get(f"{index:02d}")
                if entry:
                    new[f"{position:02d}"] = {
                        key: max(1, round(value * overrides.get(key, value) / _own(config, key)))
                        if isinstance(value, int) and isinstance(_own(config, key), int)
                        else value
                        for key, value in entry.items()
                    }
            overrides["per_layer_config"] = new
    overrides.update(
        {k: v for k, v in extra.items() if not isinstance(v, dict) or k in _DICT_FIELDS}
    )
    if isinstance(extra.get("rope_parameters"), dict):  # the default's, with these fields
        default_rope = _own(config, "rope_parameters")
        if isinstance(default_rope, dict):
            overrides["rope_parameters"] = {**default_rope, **extra["rope_parameters"]}
    return overrides


def _merged(sizes: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``sizes`` with ``extra``'s fields, a sub-config's merged field by field (T5Gemma 2's
    encoder's vision tower keeps its small sizes beside its image size)."""
    merged = dict(sizes)
    for name, value in extra.items():
        within = merged.get(name)
        if isinstance(value, dict) and isinstance(within, dict):
            merged[name] = _merged(within, value)
        else:
            merged[name] = value
    return merged


def make_config(task: str, model_type: str) -> Any:
    """``model_type``'s default config with the sizes above (module docstring)."""
    auto_config = importlib.import_module("transformers").AutoConfig
    default = auto_config.for_model(model_type)
    image = task in IMAGE_TASKS
    extra = {**EXTRA.get(model_type, {}), **TASK_EXTRA.get((task, model_type), {})}
    larger = task in ("video-classification", "masked-image-modeling")  # 16 patches, not 4
    sizes = VIDEO_SIZES if larger else IMAGE_SIZES if image else {}
    overrides = _overrides(default, extra, sizes)
    for name, value in extra.items():  # a tower's fields (text sub-configs took theirs)
        if isinstance(value, dict) and name not in TEXT_SUBCONFIGS | _DICT_FIELDS:
            overrides[name] = _merged(overrides.get(name, {}), value)
    if image:
        overrides["num_labels"] = NUM_CLASSES
    for field in ("num_frames", "frames_per_clip"):  # a video model's: 4 frames a video
        if task == "video-classification" and isinstance(_own(default, field), int):
            overrides[field] = VIDEO_FRAMES
    if task == "ctc" and default.vocab_size is None:
        overrides["vocab_size"] = VOCAB_SIZE  # its head's width: users set it from a tokenizer
    arguments = {}
    for name, value in overrides.items():
        if isinstance(value, dict) and not isinstance(_own(default, name), dict):
            if name in _DICT_SUBCONFIGS:
                arguments[name] = dict(value)
            else:  # the sub-config's own class: its defaults and these sizes
                kind = type(_own(default, name))
                if _own(default, name) is None:  # a tower the defaults leave out (Gemma 4's)
                    kind = type(default).sub_configs[name]
                arguments[name] = kind(**value)
        else:
            arguments[name] = value
    config = type(default)(**arguments)
    vision = getattr(config, "vision_config", None)
    patch = getattr(vision, "patch_size", None)
    patch = patch[0] if isinstance(patch, list | tuple) and patch else patch
    if task == "contrastive" and vision is not None and not isinstance(patch, int):
        vision.image_size = IMAGE_SIZE  # a convolutional tower (ALIGN's EfficientNet)
    if task == "contrastive" and isinstance(getattr(vision, "num_patches", None), int):
        vision.num_patches = VISION_PATCHES**2  # NaFlex's patches an image (SigLIP 2)
    if task in ("image-text-to-text", "contrastive") and isinstance(patch, int) and patch > 0:
        # a vision-language model's images: 4 x 4 patches (written in for a model of dynamic
        # resolution, whose config names no size), so their tokens fit the zoo's sequence
        side = VISION_PATCHES * patch
        sized = isinstance(getattr(vision, "image_size", None), list | tuple)
        vision.image_size = [side, side] if sized else side
        pinpoints = getattr(config, "image_grid_pinpoints", None)
        if pinpoints:  # LLaVA-NeXT's tile grids, in multiples of the tile: now the image
            tile = min(min(pinpoint) for pinpoint in pinpoints)
            scaled = [[h * side // tile, w * side // tile] for h, w in pinpoints]
            config.image_grid_pinpoints = scaled
    return config


def build_model(task: str, model_type: str) -> Any:
    """The model ``task``'s mapping names for ``model_type``, random weights from torch's
    global RNG (the caller seeds it)."""
    transformers = importlib.import_module("transformers")
    config = make_config(task, model_type)
    class_name = _mapping(task)[model_type]
    if isinstance(class_name, tuple):  # DeiT: the plain head first, then "WithTeacher"
        class_name = class_name[0]
    model_class = getattr(transformers, class_name)
    if type(config) is not getattr(model_class, "config_class", None):
        # A text config whose model class is named for the composite (the mapping's class
        # takes another config): the auto class picks the one for this config.
        return getattr(transformers, TASKS[task].auto_class).from_config(config)
    return model_class(config)


def sample_batch(task: str, model_type: str) -> dict[str, Any]:
    """The zoo's batch for ``task``, a language model's. (The ``--hf`` tasks' batches are
    ckpt-plan's own.)"""
    if TASKS[task].via_hf:
        raise ValueError(f"{task}: planned through --hf, whose batch is ckpt-plan's own")
    return zoo_sample_batch(task)


_MODEL_FILE = '''"""ckpt-plan Hugging Face sweep: {model_type} ({task}), written by
benchmarks/hf_sweep_models.py; the config is that file's."""
import sys

sys.path.insert(0, {root!r})
from benchmarks import hf_sweep_models  # noqa: E402


def build_model():
    return hf_sweep_models.build_model({task!r}, {model_type!r})


def sample_batch():
    return hf_sweep_models.sample_batch({task!r}, {model_type!r})
'''


def write_model_file(task: str, model_type: str, folder: Path) -> Path:
    """Write ``folder/hf_TASK_TYPE.py``, a model file building ``model_type`` for ``task``
    and the zoo's batch for the task."""
    root = str(Path(__file__).resolve().parent.parent)
    safe = f"{task}_{model_type}".replace("-", "_")
    path = Path(folder) / f"hf_{safe}.py"
    source = _MODEL_FILE.format(task=task, model_type=model_type, root=root)
    path.write_text(source, encoding="utf-8")
    return path


def write_hf_config(task: str, model_type: str, folder: Path) -> str:
    """Write ``model_type``'s small config (:func:`make_config`) naming ``task``'s class in
    ``architectures`` as ``folder/TYPE/config.json``: the ``--hf`` source that plans it, as a
    string (the zoo's batch size and sequence length, float32; no sequence length for a
    class taking images, whose size is the config's ``image_size``: the zoo's 32 x 32
    pixels, written in where the config names no size, as ResNet's; for audio, the length
    of :data:`AUDIO_SAMPLES` or :data:`AUDIO_FRAMES`)."""
    from planner.core.errors import ModelFileError
    from planner.measure.hf import min_seq_len, whisper_frames
    from planner.measure.source import WorkloadSource

    config = make_config(task, model_type)
    class_name = _mapping(task)[model_type]
    if isinstance(class_name, tuple):  # DeiT: the plain head first, then "WithTeacher"
        class_name = class_name[0]
    config.architectures = [class_name]
    model_class = getattr(importlib.import_module("transformers"), class_name, None)
    main_input = getattr(model_class, "main_input_name", "input_ids")
    tokens = main_input == "input_ids"
    if task in IMAGE_TASKS and not tokens:
        towers = (config, getattr(config, "vision_config", None))
        sized = ("image_size", "crop_size")
        if all(getattr(tower, name, None) is None for tower in towers for name in sized):
            config.image_size = IMAGE_SIZE
    path = Path(folder) / model_type / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    config.to_json_file(str(path), use_diff=False)
    lengths = {"input_ids": SEQ_LEN, "input_values": AUDIO_SAMPLES, "input_features": AUDIO_FRAMES}
    if task == "image-text-to-text":  # an image encoder's text (VisionEncoderDecoderModel)
        lengths["pixel_values"] = SEQ_LEN
    seq_len = f"&seq_len={lengths[main_input]}" if main_input in lengths else ""
    window = whisper_frames(config)  # Whisper takes one window of frames, no other length
    if window is not None:
        seq_len = f"&seq_len={window}"
    source = f"hf:{path.resolve()}?batch_size={BATCH_SIZE}{seq_len}&dtype=float32"
    if tokens:  # the zoo's text after the media (a vision or speech language model's)
        parsed = WorkloadSource.parse(source)
        try:
            media = min_seq_len(parsed) - 1
        except ModelFileError:
            media = 0  # refused: the sweep's step says why
        source = str(parsed.with_seq_len(SEQ_LEN + media))
    return source


def _main() -> None:  # a quick look: python -m benchmarks.hf_sweep_models TASK [TYPE]
    import sys

    task = sys.argv[1]
    for model_type in sys.argv[2:] or model_types(task):
        print(model_type, make_config(task, model_type))


if __name__ == "__main__":
    _main()
