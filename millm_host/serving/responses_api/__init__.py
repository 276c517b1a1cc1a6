"""``POST /v1/responses``: OpenAI's Responses API, served as a chat completion.

A Responses body is translated into the chat completion it asks for
(``translate``), served by the chat pipeline (``ServingResponses``, a
``ServingChat``: the same plugins, steering, probes, structured output, tools,
admission and errors), and its answer rendered back as a response object
(``render``) or as the Responses stream events (``events``).
"""

from .serving import ServingResponses

__all__ = ["ServingResponses"]
