"""Hostile request bodies: read, validated, answered and freed without holding the event loop.

A body of several MiB (a chat of 150,000 messages, 2M token ids, a million empty
arrays) must not freeze the loop for the other requests. Each C call here sees a
bounded slice, and the interpreter hands the GIL to the loop between slices:

- ``read``: bytes to a JSON object (UTF-8, finite numbers, bounded nesting and
  containers, no lone surrogate), with ``parse``, the sliced JSON parser;
- ``validate``: a body against its request model, long lists a slice at a time;
- ``encode``: a large response body to JSON in pieces (the app's JSON handler);
- ``collector``: Python's cyclic collector held off while objects are made by the million;
- ``release``: large objects freed a slice at a time on a thread of their own;
- ``timeout``: a body that stops arriving is dropped (``408``).
"""
