"""The service client's batcher: rows per source are counted when handed out, not when they arrive."""

import itertools

import numpy as np

from reader.core.order import seeded_generator
from reader.core.plan import all_blocks
from reader.service import splits
from reader.service.delivery import DeliveryBatcher


def block(start, stop):
    return {"id": np.arange(start, stop), "x": np.arange(start, stop) * 10}


def test_batches_span_sources_and_count_delivered_rows_per_source_in_order():
    batcher = DeliveryBatcher(4, drop_remainder=False)
    batcher.add("a", block(0, 3))
    assert list(batcher.full_batches()) == [] and batcher.buffered == 3
    batcher.add("b", block(3, 9))
    cut = list(batcher.full_batches())
    assert [batch["id"].tolist() for batch, _ in cut] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [delivered for _, delivered in cut] == [[("a", 3), ("b", 1)], [("b", 4)]]
    assert cut[0][0]["x"].tolist() == [0, 10, 20, 30]
    batch, delivered = batcher.remainder()
    assert batch["id"].tolist() == [8] and delivered == [("b", 1)] and batcher.buffered == 0
    assert batcher.remainder() == (None, [])


def test_a_dropped_remainder_still_counts_as_delivered_and_empty_blocks_are_ignored():
    batcher = DeliveryBatcher(5, drop_remainder=True)
    batcher.add("a", block(0, 0))
    batcher.add("a", block(0, 7))
    ((batch, delivered),) = list(batcher.full_batches())
    assert batch["id"].tolist() == [0, 1, 2, 3, 4] and delivered == [("a", 5)]
    assert batcher.remainder() == (None, [("a", 2)])


def test_blocks_with_an_order_are_gathered_in_that_order_straight_into_the_batch():
    batcher = DeliveryBatcher(4, drop_remainder=False)
    batcher.add("a", block(0, 3), np.array([2, 0, 1]))
    batcher.add("b", block(10, 13), np.array([1, 2, 0]))
    ((batch, delivered),) = list(batcher.full_batches())
    assert batch["id"].tolist() == [2, 0, 1, 11] and batch["x"].tolist() == [20, 0, 10, 110]
    assert delivered == [("a", 3), ("b", 1)]
    rest, delivered = batcher.remainder()
    assert rest["id"].tolist() == [12, 10] and delivered == [("b", 2)]


def test_a_head_cuts_the_first_batch_short_so_the_following_ones_fall_where_the_consumer_cuts():
    batcher = DeliveryBatcher(4, drop_remainder=False, head=3)
    batcher.add("a", block(0, 9))
    cut = [batch["id"].tolist() for batch, _ in batcher.full_batches()]
    assert cut == [[0, 1, 2], [3, 4, 5, 6]]
    rest, _ = batcher.remainder()
    assert rest["id"].tolist() == [7, 8]
    batcher.add("b", block(0, 5))
    assert [batch["id"].tolist() for batch, _ in batcher.full_batches()] == [[0, 1, 2, 3]], "head is used once"


def test_a_batch_that_is_one_stretch_of_one_block_is_handed_out_as_a_view():
    batcher = DeliveryBatcher(4, drop_remainder=False)
    arrived = block(0, 4)
    batcher.add("a", arrived)
    ((batch, _),) = list(batcher.full_batches())
    assert np.shares_memory(batch["id"], arrived["id"])


def test_a_cut_carried_past_the_rows_received_keeps_the_consumers_batch_boundaries():
    from reader.service.client.worker_clients import Cut

    cut = Cut(1024, head=300)
    assert cut.after(300) == Cut(1024, 0) and cut.after(300 + 1024) == Cut(1024, 0)
    assert cut.after(100) == Cut(1024, 200) and Cut(1024).after(1000) == Cut(1024, 24)


def test_split_parts_give_the_rows_of_a_resumed_split_still_needed_in_delivery_order():
    from reader.core.plan import Piece
    from reader.service import splits

    blocks = [Piece(0, b, 0, 10) for b in range(2 * splits.BLOCKS_PER_SPLIT)]
    split = 1
    fresh = list(splits.remaining_parts(blocks, 3, 0, split, 0))
    assert [part.piece for part in fresh] == blocks[splits.BLOCKS_PER_SPLIT :]
    assert all(sorted(part.order.tolist()) == list(range(10)) for part in fresh)
    orders = [part.order for part in fresh]
    assert orders[0].tolist() != orders[1].tolist(), "each block has its own seeded order"
    resumed = list(
        splits.remaining_parts(blocks, 3, 0, split, 14)
    )  # the first block and 4 rows of the second delivered
    assert [part.piece for part in resumed] == blocks[splits.BLOCKS_PER_SPLIT + 1 :]
    assert resumed[0].order.tolist() == orders[1][4:].tolist()
    assert resumed[1].order.tolist() == orders[2].tolist()
    assert splits.split_rows(blocks, split) == 10 * splits.BLOCKS_PER_SPLIT


def test_a_job_order_of_a_million_blocks_is_the_seeded_permutation_looked_up_as_needed():
    blocks = all_blocks([[10] * 1000] * 1000)
    order = splits.job_blocks(blocks, 7, 2)
    # The order earlier versions listed (11: the block order's stream), which saved states count rows by.
    permutation = seeded_generator(7, 2, 11).permutation(len(blocks))
    assert len(order) == len(blocks) == 1_000_000
    assert order[0] == blocks[permutation[0]] and order[-1] == blocks[permutation[-1]]
    split = 12_345
    first = split * splits.BLOCKS_PER_SPLIT
    in_split = [blocks[i] for i in permutation[first : first + splits.BLOCKS_PER_SPLIT]]
    assert splits.split_blocks(order, split) == in_split
    assert splits.split_rows(order, split) == 10 * splits.BLOCKS_PER_SPLIT
    assert splits.split_count(order) == 31_250
    assert list(itertools.islice(order, 3)) == [blocks[i] for i in permutation[:3]]
    assert splits.job_blocks(blocks, 7, 3)[:5] != order[:5], "each epoch has its own order"
