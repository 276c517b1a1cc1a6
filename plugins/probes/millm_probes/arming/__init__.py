"""Importing probes and arming them: the gates, parity, behaviour sets, recalibration, replicas converging."""
