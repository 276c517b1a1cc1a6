"""``RoomyCache``: the batch's KV cache grows in place, and holds what a ``DynamicCache`` holds."""

from __future__ import annotations

import torch
import transformers

from millm_engine_transformers.kvcache import RoomyCache


def test_steps_write_into_room_and_hold_what_a_dynamic_cache_holds():
    roomy, dynamic = RoomyCache(), transformers.DynamicCache()
    torch.manual_seed(0)
    chunks = [torch.randn(3, 2, n, 4) for n in (5, 1, 1, 2, 1)]
    storage = []
    for chunk in chunks:
        for cache in (roomy, dynamic):
            keys, values = cache.update(chunk, -chunk, 0)
        storage.append(roomy.layers[0].keys.untyped_storage().data_ptr())
        assert torch.equal(keys, roomy.layers[0].keys) and torch.equal(roomy.layers[0].keys, dynamic.layers[0].keys)
        assert torch.equal(roomy.layers[0].values, dynamic.layers[0].values)
        assert roomy.get_seq_length() == dynamic.get_seq_length()
    assert len(set(storage)) == 1  # one buffer: no step copied the cache


def test_keys_the_batch_replaces_are_moved_into_a_new_buffer():
    roomy = RoomyCache()
    first = torch.randn(4, 2, 6, 4)
    roomy.update(first, first, 0)
    layer = roomy.layers[0]
    keep = torch.tensor([0, 2])
    layer.keys, layer.values = layer.keys.index_select(0, keep)[:, :, 1:], layer.values.index_select(0, keep)[:, :, 1:]
    step = torch.randn(2, 2, 1, 4)
    keys, _ = roomy.update(step, step, 0)
    assert torch.equal(keys, torch.cat([first[[0, 2], :, 1:], step], dim=-2))
    before = keys.untyped_storage().data_ptr()
    keys, _ = roomy.update(step, step, 0)
    assert keys.shape[-2] == 7 and keys.untyped_storage().data_ptr() == before
