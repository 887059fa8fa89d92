"""
Assignment 1 (attention masks), checks beyond the hand-written matrices of test_model.py and
test_training.py: block_id floors (a position before the first block start is in block -1, not 0),
and every mask is a pure function of (query slot, key slot): evaluated one scalar pair at a time it
gives the dense matrix, which is what flex_attention relies on (it calls the function per tile,
never with the whole matrix).
"""

import torch

import model as model_lib
import sbd
from model import dense_mask


def test_block_id_floors_below_the_phase():
    i = torch.arange(-6, 10)
    got = sbd.block_id(i, 4, 1)  # blocks start at ..., -3, 1, 5, 9, ...
    # worked by hand: the block starting at 1 is 0, the one starting at -3 is -1, and so on
    assert got.tolist() == [-2, -2, -2, -1, -1, -1, -1, 0, 0, 0, 0, 1, 1, 1, 1, 2]


def assert_pure(mask_fn, n_queries, n_keys, query_offset=0):
    dense = dense_mask(mask_fn, n_queries, n_keys, query_offset)  # (n_queries, n_keys)
    assert dense.dtype == torch.bool and dense.shape == (n_queries, n_keys)
    for qi in range(n_queries):
        for ki in range(n_keys):
            # 0-d tensors, one pair at a time
            one = mask_fn(torch.tensor(query_offset + qi), torch.tensor(ki))
            assert bool(one) == bool(dense[qi, ki]), f"query {query_offset + qi}, key {ki}"


def test_masks_are_pure_functions_of_query_and_key():
    assert_pure(model_lib.causal_mask, 5, 8, query_offset=3)
    assert_pure(lambda q, k: sbd.hybrid_mask(q, k, 4), 6, 9, query_offset=3)
    for phase in (0, 3):
        assert_pure(lambda q, k: sbd.sbd_training_mask(q, k, 6, 4, phase), 12, 12)
