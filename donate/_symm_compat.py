"""Moved to ``donate._compat``; kept only until the symmetric-memory modules import from there."""

from donate._compat import bound_axis_names as bound_axis_names
from donate._compat import short_source_line as source_line
