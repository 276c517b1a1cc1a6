"""The live feed: the WebSocket of results, and the tail that brings every process's stored results to it."""
