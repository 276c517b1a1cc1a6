"""A KV cache that grows in place: each step writes its keys and values into spare room.

``DynamicLayer.update`` concatenates (``torch.cat``) the cached keys and values with
each step's: a copy of the whole cache per generated token, per layer, which a batch
of rows pays in full at every step. ``RoomyLayer`` keeps a buffer with spare columns
and hands out a view of its filled part; a step copies only its own columns. When the
room runs out, or the batch replaced ``keys``/``values`` (rows joining or leaving cut
and pad the batch dimension), it moves into a new buffer with room again: one copy
per such event instead of one per token.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers
from transformers.cache_utils import Cache, DynamicLayer

#: Spare columns a buffer keeps past what it holds (at least; half as many again as it holds).
ROOM = 64


class RoomyLayer(DynamicLayer):
    """A ``DynamicLayer`` whose ``keys``/``values`` are views of buffers with spare columns."""

    keys: torch.Tensor  # DynamicLayer's, declared for the type checker (transformers is not analysed)
    values: torch.Tensor

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        self._views: tuple[torch.Tensor, torch.Tensor] | None = None  # what update last handed out

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        keys, values = self.keys, self.values
        length = keys.shape[-2] if keys.numel() else 0
        end = length + key_states.shape[-2]
        buffers, views = self._buffers, self._views
        ours = buffers is not None and views is not None and keys is views[0] and values is views[1]
        if buffers is None or not ours or end > buffers[0].shape[-2]:
            buffers = self._move(keys, values, key_states, value_states, length, end)
        key_buffer, value_buffer = buffers
        key_buffer[..., length:end, :].copy_(key_states)
        value_buffer[..., length:end, :].copy_(value_states)
        self.keys, self.values = key_buffer[..., :end, :], value_buffer[..., :end, :]
        self._views = (self.keys, self.values)
        return self.keys, self.values

    def _move(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        length: int,
        end: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """New buffers with room past ``end``, holding the ``length`` columns cached so far."""
        capacity = end + max(ROOM, end // 2)
        key_shape = (*key_states.shape[:-2], capacity, key_states.shape[-1])
        value_shape = (*value_states.shape[:-2], capacity, value_states.shape[-1])
        key_buffer = key_states.new_empty(key_shape)
        value_buffer = value_states.new_empty(value_shape)
        if length:
            key_buffer[..., :length, :].copy_(keys)
            value_buffer[..., :length, :].copy_(values)
        self._buffers = (key_buffer, value_buffer)
        return self._buffers

    def reset(self) -> None:
        self._buffers = self._views = None
        super().reset()


class RoomyCache(transformers.DynamicCache):
    """A ``DynamicCache`` of ``RoomyLayer``s (a plain key/value cache, grown in place)."""

    def __init__(self) -> None:
        Cache.__init__(self, layer_class_to_replicate=RoomyLayer)
