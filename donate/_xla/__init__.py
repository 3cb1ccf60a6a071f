"""Readers of what XLA produced, and facts of XLA's GPU targets.

`hlo` (the one structural reader of compiled HLO text), `hlo_dump` (XLA's dump files: buffer
assignment, live ranges), `copies` (the copies XLA inserted; `copies_why`: their reasons and
fixes) and `gpu_targets` (H100/B200 specifications). Imports only `donate._base` below it.
"""
