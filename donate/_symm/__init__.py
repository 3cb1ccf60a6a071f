"""Symmetric memory, inside: what the annotations record and what XLA:GPU does with them.

One module per step, from the jaxpr to the compiled GPU program:

* ``prim``: the ``symmetric`` identity primitive that marks a value, its rules and lowering, the
  argument checks and the ``symmetric_memory`` context's named scope;
* ``registry``: which collective primitives ``requires_symmetric`` registered, and the wrapper it
  returns for user collectives;
* ``rewrite``: ``mark_required``, registered collectives and contexts made explicit marks;
* ``trace``: ``comm_buffers``, each mark traced back to the op that materialises the buffer;
* ``xla``: the target platform and the XLA:GPU options (per compile) and flags (per process) that
  place the annotated collectives in collective memory;
* ``report``: where each annotated value landed in the compiled program;
* ``size``: collective memory from the planner's pools and from XLA's buffer assignment;
* ``check``: all of it for one program with plain ``jax.jit`` (``donate.symm.check_placement``).

The user API is ``donate.symm``. This package's ``__init__`` is the interface the rest of the
library imports (``donate.jit``'s staging, the compiled stage, the planner); nothing here imports
the user-facing modules.

>>> from donate import _symm
>>> _symm.mark_required.__module__
'donate._symm.rewrite'
"""

from __future__ import annotations

from donate._symm.report import placement_report as placement_report
from donate._symm.rewrite import mark_required as mark_required
from donate._symm.size import collective_memory_bytes as collective_memory_bytes
from donate._symm.trace import comm_buffer_report as comm_buffer_report
from donate._symm.trace import comm_buffers as comm_buffers
from donate._symm.trace import nothing_to_mark as nothing_to_mark
from donate._symm.xla import placement_policy as placement_policy
from donate._symm.xla import target_platform as target_platform
