"""Steering on llama.cpp: additive ``LayerHook``s as control vectors, one per layer, around one generation.

llama.cpp adds a layer's control vector to that layer's output (``l_out``, after the
feed-forward residual add): the residual stream after block ``il``, SAELens'
``blocks.{il}.hook_resid_post``. It has a vector for layers 1 to ``n_layer - 1`` only
(none for layer 0). The input of block ``il`` is the output of block ``il - 1``, so
``blocks.{il}.hook_resid_pre`` is served for blocks 2 to ``n_layer - 1``. Every other
point is refused by name.

The server side (``layer_vectors``) sums each layer's hooks into float32 bytes, which
cross the wire with GENERATE; the child (``ControlVectors``) sets them before the
generation and clears them after it, also when it fails.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from millm_host.api import FieldNotHonoured, HookPoint, LayerHook

#: llama.cpp layer index -> its control vector (float32 bytes, d_model values).
LayerVectors = dict[int, bytes]


def steering_points(n_layers: int | None) -> tuple[HookPoint, ...]:
    """The residual points a control vector reaches on a model of ``n_layers`` blocks."""
    if not n_layers:
        return ()
    post = [HookPoint(layer, "resid_post") for layer in range(1, n_layers)]
    pre = [HookPoint(layer, "resid_pre") for layer in range(2, n_layers)]
    return tuple(post + pre)


def served_text(n_layers: int | None) -> str:
    """What ``steering_points`` serves, for refusals."""
    if not n_layers or n_layers < 2:
        return "no point: the model has too few layers"
    last = n_layers - 1
    pre = f" and blocks.2..{last}.hook_resid_pre" if last >= 2 else ""
    return f"blocks.1..{last}.hook_resid_post{pre} (the output of layers 1 to {last})"


def hook_name(layer: int, point: str) -> str:
    return f"blocks.{layer}.hook_{point}"


def refusal(layer: int, point: str, n_layers: int | None) -> str:
    return (
        f"{hook_name(layer, point)} cannot be steered on the gguf engine: llama.cpp's control vectors add to "
        f"{served_text(n_layers)}"
    )


def layer_vectors(hooks: Sequence[LayerHook], n_layers: int | None, d_model: int | None) -> LayerVectors:
    """Each hook's vector, summed per llama.cpp layer (a ``resid_pre`` on the layer before).

    Refuses (400) a hook that is not an additive write, or one at a point no control vector reaches.
    """
    served = set(steering_points(n_layers))
    sums: dict[int, np.ndarray] = {}
    for hook in hooks:
        if hook.vector is None:
            raise FieldNotHonoured(
                "the gguf engine has no hookable layers: it applies additive steering vectors only", param=None
            )
        if HookPoint(hook.layer, hook.point) not in served:
            raise FieldNotHonoured(refusal(hook.layer, hook.point, n_layers), param=None)
        vector = hook.vector()
        if vector is None:
            continue
        values = _float32(vector)
        if values.shape != (d_model,):
            raise ValueError(f"a steering vector has {values.size} values; the model's hidden size is {d_model}")
        layer = hook.layer if hook.point == "resid_post" else hook.layer - 1
        sums[layer] = sums[layer] + values if layer in sums else values
    return {layer: values.tobytes() for layer, values in sorted(sums.items())}


def _float32(vector: Any) -> np.ndarray:
    if hasattr(vector, "detach"):  # a torch tensor (the steering plugin's), on any device, in any dtype
        vector = vector.detach().float().cpu().numpy()
    return np.array(vector, dtype=np.float32).reshape(-1)


class ControlVectors:
    """The control vector of one llama.cpp context (child side)."""

    def __init__(self, ctx: Any, n_embd: int, n_layer: int) -> None:
        self._ctx, self._n_embd, self._n_layer = ctx, n_embd, n_layer
        self.applied = False

    def apply(self, vectors: Mapping[int, bytes]) -> None:
        """Set ``vectors`` (layers 1..n_layer-1); the layers between hold zeros. Nothing: clear."""
        if not vectors:
            self.clear()
            return
        import llama_cpp

        n_embd = self._n_embd
        # llama.cpp's buffer starts at layer 1 and covers every layer: a layer left out keeps its old values
        data = np.zeros(n_embd * (self._n_layer - 1), dtype=np.float32)
        for layer, values in vectors.items():
            data[n_embd * (layer - 1) : n_embd * layer] = np.frombuffer(values, dtype=np.float32)
        pointer = data.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        self.applied = True  # from here a failure still clears
        code = llama_cpp.llama_set_adapter_cvec(self._ctx, pointer, data.size, n_embd, min(vectors), max(vectors))
        if code != 0:
            raise RuntimeError(f"llama.cpp refused the control vector (llama_set_adapter_cvec returned {code})")

    def clear(self) -> None:
        import llama_cpp

        llama_cpp.llama_set_adapter_cvec(self._ctx, None, 0, self._n_embd, -1, -1)
        self.applied = False
