"""What a plan is and what it costs: the memory model that replays a profile under a set of
checkpointed units, the plan record and its JSON file, profile files, device targets.

Pure Python over ``planner.core``; no torch, so planning from a saved
profile never imports it. Import a submodule by name (``planner.plan.plan_file``): this
package imports nothing itself.
"""
