"""Helpers for tests of millm and its plugins: a real server process and tiny models."""

from .server import ServerProcess, free_port, shared_cache_dir

__all__ = ["ServerProcess", "free_port", "shared_cache_dir"]
