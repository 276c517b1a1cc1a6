"""Sessions: which conversation and turn a monitored request is, the turns' kept text, timelines, their routes and
settings, and the retention pass."""
