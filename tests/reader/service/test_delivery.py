"""The service client's batcher: rows per source are counted when handed out, not when they arrive."""

import numpy as np

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


def test_split_parts_put_what_a_worker_sends_for_a_resumed_split_in_delivery_order():
    from reader.plan import Piece
    from reader.service import splits

    blocks = [Piece(0, b, 0, 10) for b in range(2 * splits.BLOCKS_PER_SPLIT)]
    split = 1
    fresh = list(splits.remaining_parts(blocks, 3, 0, split, 0))
    assert [part.piece for part in fresh] == blocks[splits.BLOCKS_PER_SPLIT :] and all(p.whole for p in fresh)
    orders = [part.order for part in fresh]
    assert orders[0].tolist() != orders[1].tolist(), "each block has its own seeded order"
    resumed = list(
        splits.remaining_parts(blocks, 3, 0, split, 14)
    )  # the first block and 4 rows of the second delivered
    assert [part.piece for part in resumed] == blocks[splits.BLOCKS_PER_SPLIT + 1 :]
    first = resumed[0]
    assert not first.whole and first.order.tolist() == orders[1][4:].tolist()
    sent = first.sent_rows()  # a worker sends the rows still needed in stored order
    assert sent.tolist() == sorted(orders[1][4:].tolist())
    assert sent[first.positions()].tolist() == orders[1][4:].tolist()
    assert resumed[1].whole and resumed[1].positions().tolist() == orders[2].tolist()
