"""Reports: the data behind each chart (pandas), the charts (matplotlib), and the files.

Owns what a profile and its plans look like to a reader; imports ``planner.core``,
``planner.plan`` and ``planner.solve`` (no torch), pandas and matplotlib.

Each chart comes in two parts: a ``*_frame`` function that returns the numbers as a
``DataFrame`` (sizes in ``*_bytes``, times in ``*_ms``, shares in ``*_percent``), and a
``*_figure`` function that draws them into a new ``Figure`` with the object API (no pyplot
state). The caller decides where to save a figure; :func:`write_report` is the caller that
writes a whole report folder, atomically.

What the charts show
--------------------
* **Trade-off** (:func:`tradeoff_figure`): predicted recompute overhead against predicted
  peak memory. The frontier is the cheapest plan the solver finds at evenly spaced budgets
  (``planning.frontier``), reduced to the plans no other plan beats on both peak and
  overhead, and drawn as a staircase: at any budget on the x axis, the line's height is the
  overhead of the cheapest plan that fits it. The chosen plan, the usual manual choices
  (``planning.baseline_plans``), the budget, and measured peaks (where a plan was run) are
  drawn over it.
* **Modules** (:func:`module_figure`): what each checkpoint candidate would free and what
  its recomputation costs. Candidates whose names differ only by numeric indices
  (``blocks.0.mlp`` ... ``blocks.47.mlp``) and share a type are one row, ``blocks.*.mlp``,
  with the mean per module, the range over the group and how many of them the plan chose.
* **Memory timeline** (:func:`memory_timeline_figure`): live memory over one step, measured
  without checkpointing and predicted with the plan, with its recompute spikes.

The overhead is a prediction: the profiled forward time of the recomputed modules as a
share of one unplanned step, not a measured slowdown.
"""

from planner.report.common import CHOSEN, REPORT_FORMATS
from planner.report.figures import memory_timeline_figure, module_figure, tradeoff_figure
from planner.report.files import write_report
from planner.report.frames import module_frame, timeline_frame, tradeoff_frame
from planner.report.inputs import load_report_inputs
from planner.report.stages import stage_frame, stage_peaks_figure, write_stages_report
from planner.report.summary import (
    cost_source_text,
    memory_source_text,
    summary_markdown,
    unplanned_source,
)

__all__ = [
    "CHOSEN",
    "REPORT_FORMATS",
    "cost_source_text",
    "load_report_inputs",
    "memory_source_text",
    "memory_timeline_figure",
    "module_figure",
    "module_frame",
    "stage_frame",
    "stage_peaks_figure",
    "summary_markdown",
    "timeline_frame",
    "tradeoff_figure",
    "tradeoff_frame",
    "unplanned_source",
    "write_report",
    "write_stages_report",
]
