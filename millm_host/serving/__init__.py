"""Serving: request handling with no HTTP in it."""
