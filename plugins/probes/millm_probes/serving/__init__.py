"""Probes on served requests: live monitoring (the request-path hooks, the verdicts header, the trace) and stateless
scoring (``POST /api/probes/score`` and its Batch API lines)."""
