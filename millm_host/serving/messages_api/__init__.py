"""``POST /v1/messages`` and ``/v1/messages/count_tokens``: Anthropic's Messages API, served as a chat completion.

A Messages body is translated into the chat completion it asks for
(``translate``), served by the chat pipeline (``ServingMessages``, a
``ServingChat``: the same plugins, steering, probes, structured output, tools,
admission and errors), and its answer written back as a message (``render``)
or as Anthropic's stream events (``events``); refusals in Anthropic's shape
(``errors``).
"""

from .serving import ServingCountTokens, ServingMessages

__all__ = ["ServingCountTokens", "ServingMessages"]
