"""The memory planner behind `donate.planner`: liveness, pools, and offsets within a pool.

Layers, each importing only the ones below it:

- `liveness`: walks a jaxpr (and its sub-jaxprs) into values with live ranges;
- `passes`: the planning passes that turn them into pools of buffers with offsets, as
  `records` (`LiveRange`, `Buffer`, `Allocation`, `Pool`, `Copy`) in a `memory_plan.MemoryPlan`,
  which also holds the plan's views (listing, HTML, plot);
- `offsets`: `assign_offsets`, the offset engine under every pool: `packing` drives it over
  `sweep` (time in sections), `greedy` (fast packings) and `search` (MiniMalloc-style: parts
  and preorders run round robin), whose depth-first descent is `dfs`;
- `text`: how sizes and counts are written, for all of them.

The user API is `donate.planner`; nothing here is public.
"""
