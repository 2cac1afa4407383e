"""Running the training step with torch: loading the model file and building workloads,
tracking storages, the fake-tensor step, the instrumented step (the profiler), module times,
and measuring a real step.

Owns everything that executes the user's model to learn its memory and time. May import the
layers below it (errors, units, records, the memory model, plans, targets) and torch; never
``planner.check``, ``planner.pipeline`` or the cli. Import a submodule by name
(``planner.measure.profiler``): this package imports nothing itself.
"""
