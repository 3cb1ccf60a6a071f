"""The donation plan: what each leaf's buffer becomes.

`dataflow` (facts of a jaxpr: origins, in-place sources, annotations, liveness), `pairing`
(`make_plan`: requests, pairing, donors, layout), `donation_plan` (the plan's data model, text
and HTML) and `decision_types` (its typed vocabulary: Action, Kind, Request, Cause). Imports only
`donate._xla` and `donate._base` below it.
"""
