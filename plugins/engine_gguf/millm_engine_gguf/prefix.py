"""What of a prompt a KV cache can give back without changing the output, and how to decode the rest.

A prompt's tokens decoded in one chunk give exactly the KV cells and logits they give
decoded in several, as long as no chunk holds a single token: ggml computes a
one-token batch with other kernels (matrix times vector), whose sums round apart, and
on a quantized model the difference grows through the layers (measured on SmolLM2
Q4_1: 0.87 in the logits after decoding a prompt a token at a time). So both engines
split prompts by ``chunk`` and reuse only cells that a prompt decode wrote: never a
generated token's, which was decoded alone (``reusable``).
"""

from __future__ import annotations


def common_prefix(cached: list[int], prompt: list[int]) -> int:
    """How many leading tokens ``cached`` and ``prompt`` share (list comparisons run in C: bisect on them)."""
    n = min(len(cached), len(prompt))
    if cached[:n] == prompt[:n]:
        return n
    low, high = 0, n  # cached[:low] == prompt[:low], cached[:high] != prompt[:high]
    while high - low > 1:
        middle = (low + high) // 2
        if cached[:middle] == prompt[:middle]:
            low = middle
        else:
            high = middle
    return low


def reusable(cached: list[int], exact: int, prompt: list[int]) -> int:
    """How many of ``prompt``'s tokens to take from a cache holding ``cached`` (the first ``exact`` of them
    written by prompt decodes): their common prefix, leaving two tokens at least to decode (the last one's
    logits are sampled from, and one alone would be a one-token chunk)."""
    return max(0, min(common_prefix(cached[:exact], prompt), len(prompt) - 2))


def chunk(remaining: int, budget: int, n_batch: int) -> int:
    """How many of ``remaining`` prompt tokens to decode now, ``budget`` at most: never a single one while
    more remain, nor leaving a single one behind (0: wait for a larger budget). A one-token prompt is one
    chunk of one, as it is uncached too; ``n_batch`` under 3 cannot keep the rule."""
    take = min(remaining, budget)
    if n_batch < 3 or take == remaining:
        return take
    if remaining - take == 1:
        take -= 1
    return take if take >= 2 else 0
