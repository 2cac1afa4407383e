"""The records every layer shares: typed errors, byte units and budgets, the profile's
immutable records, and atomic file writes.

Owns plain data and helpers; imports nothing from the rest of ``planner`` and no torch.
Import a submodule by name (``planner.core.records``): this package imports nothing itself.
"""
