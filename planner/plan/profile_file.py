"""Save and load profiles: a JSON file with everything (re-solvable without re-profiling)
and a CSV table of the modules (pandas) for people and spreadsheets."""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import pandas as pd

from planner.core.errors import LoopShapeError, ParallelLayoutError, ProfileFileError
from planner.core.fileio import atomic_path, atomic_write_text
from planner.core.loop import loop_from_dict, loop_to_dict
from planner.core.parallel import parallel_from_dict, parallel_to_dict
from planner.core.records import (
    PROFILE_SCHEMA_VERSION,
    CostSource,
    MemorySource,
    MemoryTimeline,
    ModuleCall,
    ModuleProfile,
    OpCost,
    OptionCost,
    Phase,
    Profile,
    SavedTensor,
    StorageKind,
    StorageLifetime,
    note_from_line,
)
from planner.core.switches import switches_from_dict, switches_to_dict

__all__ = ["load_profile", "module_table", "save_profile", "save_profile_table"]

_STORAGE_COLUMNS = [f.name for f in fields(StorageLifetime)]
_SAVED_COLUMNS = [f.name for f in fields(SavedTensor)]
_OP_COLUMNS = [f.name for f in fields(OpCost)]


def module_table(profile: Profile) -> pd.DataFrame:
    """One row per module: what checkpointing it would save and cost."""
    frame = pd.DataFrame([asdict(record) for record in profile.modules])
    frame["is_candidate"] = frame["excluded_reason"] == ""
    return frame


def _profile_to_dict(profile: Profile) -> dict[str, Any]:
    data = {f.name: getattr(profile, f.name) for f in fields(Profile)}
    data["modules"] = [asdict(record) for record in profile.modules]
    timeline = profile.timeline
    data["timeline"] = {
        "event_count": timeline.event_count,
        "phase_end_events": timeline.phase_end_events,
        "storage_columns": _STORAGE_COLUMNS,
        "storages": [[getattr(s, c) for c in _STORAGE_COLUMNS] for s in timeline.storages],
        "calls": [asdict(call) for call in timeline.calls],
        "saved_tensor_columns": _SAVED_COLUMNS,
        "saved_tensors": [[getattr(t, c) for c in _SAVED_COLUMNS] for t in timeline.saved_tensors],
        "op_cost_columns": _OP_COLUMNS,
        "op_costs": [[getattr(o, c) for c in _OP_COLUMNS] for o in timeline.op_costs],
        "autocast_cache_clears": list(timeline.autocast_cache_clears),
        "forward_autocast": timeline.forward_autocast,
    }
    data["block_names"] = list(profile.block_names)
    if profile.block_stacks:
        data["block_stacks"] = list(profile.block_stacks)
    data["assumptions"] = [str(note) for note in profile.assumptions]
    data["memory_source"] = profile.memory_source.value
    data["cost_source"] = profile.cost_source.value
    data["loop"] = loop_to_dict(profile.loop)
    data["parallel"] = parallel_to_dict(profile.parallel)
    data["switches"] = switches_to_dict(profile.switches)
    return data


def save_profile(profile: Profile, path: str | Path) -> Path:
    """Write the whole profile (with its timeline) as JSON, atomically."""
    target = Path(path)
    atomic_write_text(target, json.dumps(_profile_to_dict(profile), separators=(",", ":")))
    return target


def save_profile_table(profile: Profile, path: str | Path) -> Path:
    """Write the per-module table as CSV, atomically."""
    target = Path(path)
    with atomic_path(target) as temp_path:
        module_table(profile).to_csv(temp_path, index=False)
    return target


def _storage(values: dict[str, Any]) -> StorageLifetime:
    return StorageLifetime(**{**values, "kind": StorageKind(values["kind"])})


def _tuple_if_list(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _module(values: dict[str, Any]) -> ModuleProfile:
    fields_ = {k: _tuple_if_list(v) for k, v in values.items()}
    fields_["options"] = tuple(
        OptionCost(**{k: _tuple_if_list(v) for k, v in option.items()})
        for option in values.get("options", ())
    )
    return ModuleProfile(**fields_)


def load_profile(path: str | Path) -> Profile:
    """Read a profile JSON written by :func:`save_profile`."""
    source = Path(path)
    if not source.is_file():
        raise ProfileFileError(
            f"profile {source} does not exist; create it with `ckpt-plan profile`"
        )
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ProfileFileError(
            f"profile {source} is not valid JSON ({error}); re-profile"
        ) from error
    if not isinstance(data, dict) or not isinstance(data.get("schema_version"), int):
        raise ProfileFileError(f"{source} is not a ckpt-plan profile")
    if data["schema_version"] > PROFILE_SCHEMA_VERSION:
        raise ProfileFileError(
            f"profile {source} uses schema {data['schema_version']}, newer than this ckpt-plan "
            f"reads ({PROFILE_SCHEMA_VERSION}); upgrade ckpt-plan or re-profile"
        )
    try:
        raw = data["timeline"]
        columns = raw["storage_columns"]
        timeline = MemoryTimeline(
            event_count=int(raw["event_count"]),
            storages=tuple(
                _storage(dict(zip(columns, row, strict=True))) for row in raw["storages"]
            ),
            calls=tuple(
                ModuleCall(**{k: _tuple_if_list(v) for k, v in call.items()})
                for call in raw["calls"]
            ),
            saved_tensors=tuple(
                SavedTensor(**dict(zip(raw["saved_tensor_columns"], row, strict=True)))
                for row in raw.get("saved_tensors", ())
            ),
            phase_end_events={Phase(k): int(v) for k, v in raw["phase_end_events"].items()},
            op_costs=tuple(
                OpCost(**dict(zip(raw["op_cost_columns"], row, strict=True)))
                for row in raw.get("op_costs", ())
            ),
            autocast_cache_clears=tuple(int(e) for e in raw.get("autocast_cache_clears", ())),
            forward_autocast=raw.get("forward_autocast"),
        )
        values = {f.name: data[f.name] for f in fields(Profile) if f.name in data}
        values["modules"] = tuple(_module(record) for record in data["modules"])
        values["timeline"] = timeline
        values["block_names"] = tuple(data.get("block_names", ()))
        values["block_stacks"] = tuple(int(n) for n in data.get("block_stacks", ()))
        values["assumptions"] = tuple(
            note_from_line(str(line)) for line in data.get("assumptions", ())
        )
        values["memory_source"] = MemorySource(data.get("memory_source", "real"))
        values["cost_source"] = CostSource(data.get("cost_source", "measured"))
        values["loop"] = loop_from_dict(data.get("loop"))  # absent: the plain loop
        values["parallel"] = parallel_from_dict(data.get("parallel"))  # absent: one process
        values["switches"] = switches_from_dict(data.get("switches"))  # absent: none
        return Profile(**values)
    except (KeyError, TypeError, ValueError, LoopShapeError, ParallelLayoutError) as error:
        raise ProfileFileError(f"profile {source} is malformed ({error}); re-profile") from error
