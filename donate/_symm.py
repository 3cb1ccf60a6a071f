"""Symmetric-memory internals: the interface the planner and ``donate.jit`` import.

* ``symmetric_p``: the identity primitive that marks a value (``donate._symm_prim``).
* ``comm_buffers(closed_jaxpr)`` / ``CommBuffer``: producer trace-back (``donate._symm_trace``).
* ``mark_required(closed_jaxpr)``: registered collectives and contexts made explicit
  (``donate._symm_rewrite``).
* ``gpu_compile_options``, ``collective_memory_bytes``, ``collective_memory_mb``,
  ``collective_memory_env``: XLA settings (``donate._symm_xla``).
* ``target_platform``, ``placement_policy``, ``compile_options_for``: which per-compile options
  place the annotated collectives on the target (``donate._symm_place``).
* ``placement_report``: where each annotated value landed in the compiled program
  (``donate._symm_report``); ``xla_dump_options``, ``collective_allocation``: XLA's collective
  allocation from its buffer-assignment dump (``donate._symm_size``).

>>> from donate import _symm
>>> _symm.symmetric_p.name
'symmetric'
"""

from __future__ import annotations

from donate._symm_prim import COLLECTIVE_MEMORY_SPACE as COLLECTIVE_MEMORY_SPACE
from donate._symm_prim import mark as mark
from donate._symm_prim import symmetric_p as symmetric_p
from donate._symm_registry import COLLECTIVE_PRIMITIVES as COLLECTIVE_PRIMITIVES
from donate._symm_rewrite import mark_required as mark_required
from donate._symm_trace import CommBuffer as CommBuffer
from donate._symm_trace import SymmetricMemoryWarning as SymmetricMemoryWarning
from donate._symm_trace import comm_buffer_report as comm_buffer_report
from donate._symm_trace import comm_buffers as comm_buffers
from donate._symm_xla import collective_memory_bytes as collective_memory_bytes
from donate._symm_xla import collective_memory_env as collective_memory_env
from donate._symm_xla import collective_memory_mb as collective_memory_mb
from donate._symm_xla import gpu_compile_options as gpu_compile_options
from donate._symm_place import compile_options_for as compile_options_for
from donate._symm_place import placement_policy as placement_policy
from donate._symm_place import target_platform as target_platform
from donate._symm_report import placement_report as placement_report
from donate._symm_size import collective_allocation as collective_allocation
from donate._symm_size import xla_dump_options as xla_dump_options
