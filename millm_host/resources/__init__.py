"""Thin Falcon resources: parse, call serving code, render."""
