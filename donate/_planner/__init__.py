"""The memory planner behind `donate.planner`: liveness, pools, and offsets within a pool.

Layers, each importing only the ones below it:

- `liveness`: walks a jaxpr (and its sub-jaxprs) into values with live ranges;
- `memplan`: the planning passes that turn them into pools of buffers with offsets;
- `offsets`: `assign_offsets`, the offset engine under every pool, on top of `sweep` (time in
  sections), `greedy` (fast packings) and `search` (a MiniMalloc-style search).

The user API is `donate.planner`; nothing here is public.
"""
