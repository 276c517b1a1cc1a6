"""millm: an OpenAI-compatible inference server whose every feature is a plugin."""

from .hookspecs import hookimpl

__all__ = ["hookimpl"]
