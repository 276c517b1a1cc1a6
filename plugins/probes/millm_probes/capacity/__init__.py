"""Probe capacity: the cost model and per-model budget, measuring a model, its limits, their table and routes."""
