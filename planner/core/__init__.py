"""The records every layer shares: typed errors, byte units and budgets, the profile's
immutable records (plan units and notes among them), atomic file writes, and text for
messages.

Owns plain data and helpers; imports nothing from the rest of ``planner`` and no torch.
Import a submodule by name (``planner.core.records``): this package imports nothing itself.
"""
