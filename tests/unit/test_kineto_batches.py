"""A batched point-to-point kernel's ops, each given its own end from its peer's op
(diag/read/kineto/batches.py), where the peer left no trace: read from its lockstep stand-in
(its tensor-parallel partner, to and from the same stage), or a typical transfer after the
ops whose peers are known met them."""

from __future__ import annotations

from typing import Any

from diag.contract.peers import stand_in_links
from diag.contract.schema import Layout, Manifest
from diag.read.kineto.batches import KERNEL_KEY, RESUME_KEY, split_batches

# tp2 x pp2: stage 0 holds ranks 0 and 1, stage 1 ranks 2 and 3 (rank = stage * 2 + tp)
GROUPS = {"tp": [[0, 1], [2, 3]], "pp": [[0, 2], [1, 3]], "dp": [[0], [1], [2], [3]]}


def _manifest() -> Manifest:
    return Manifest(run_id="r", created="", world_size=4, layout=Layout(tp=2, pp=2),
                    groups=GROUPS)  # fmt: skip


def _op(rank: int, op: str, peer: int, t0: int, t1: int, kernel: int | None = None,
        size: int = 1024) -> dict[str, Any]:  # fmt: skip
    return {"rank": rank, "step": 1, "group": "pp", "op": op, "peer": peer, "t0": t0, "t1": t1,
            "bytes": size, "async": False, "blocking": True, KERNEL_KEY: kernel,
            RESUME_KEY: None}  # fmt: skip


def test_the_stand_in_links_are_the_tp_partners_to_the_same_stage() -> None:
    # rank 2 lost: rank 3 (its TP partner) stands for it; its neighbour on rank 0's side is 1
    assert stand_in_links(_manifest(), {0, 1, 3}) == {(2, 0): (3, 1)}
    assert stand_in_links(_manifest(), {0, 1, 2, 3}) == {}
    assert stand_in_links(_manifest(), {0, 1}) == {}  # a whole TP group lost: nobody stands


def _lost_peer_batch() -> list[dict[str, Any]]:
    """Rank 0's batch (kernel 0: 100 -> 500) sends to and receives from rank 2, which left no
    trace; rank 3, its lockstep partner, received from rank 1 at 120 and sent to it at 400."""
    return [
        _op(0, "send", 2, 100, 500, kernel=0), _op(0, "recv", 2, 100, 500, kernel=0),
        _op(1, "send", 3, 100, 500, kernel=0), _op(1, "recv", 3, 100, 500, kernel=0),
        _op(3, "recv", 1, 120, 500), _op(3, "send", 1, 400, 500),
    ]  # fmt: skip


def test_a_batch_whose_peer_left_no_trace_is_split_by_its_stand_ins_ops() -> None:
    whole = _lost_peer_batch()
    assert split_batches(whole, stand_in_links(_manifest(), {0, 1, 3})) == 2
    send, recv = whole[0], whole[1]
    # the send met its receiver at 120 (rank 3's receive), the receive its sender at 400:
    # 100 ns of transfer after the last, each op that long after its own meeting
    assert (send["t1"], recv["t1"]) == (220, 500)
    assert send["async"] and not send["blocking"]  # it ended long before the receive
    assert (whole[2]["t1"], whole[3]["t1"]) == (220, 500)  # rank 1, read from rank 3 itself


def test_without_a_stand_in_the_batch_keeps_the_kernels_interval() -> None:
    rows = _lost_peer_batch()
    assert split_batches(rows) == 1  # rank 1's batch only: rank 0's peers are unknown
    assert (rows[0]["t1"], rows[1]["t1"]) == (500, 500)


def test_ops_whose_peers_are_known_end_a_typical_transfer_after_they_met() -> None:
    """Rank 4's batch sends to rank 5 (traced, its receive started at 200) and receives from
    rank 6 (lost, no stand-in): the send ends the median transfer of the batches whose every
    peer is known (30 ns, rank 7's and rank 8's, for its size) after it met its receiver, and
    the receive keeps the kernel's end."""
    rows = [
        _op(4, "send", 5, 100, 900, kernel=0), _op(4, "recv", 6, 100, 900, kernel=0),
        _op(5, "recv", 4, 200, 900),
        # two fully known batches: transfers of 20 and 40 ns after their last meeting
        _op(7, "send", 8, 0, 70, kernel=1), _op(7, "recv", 8, 0, 70, kernel=1),
        _op(8, "recv", 7, 50, 70, kernel=2), _op(8, "send", 7, 50, 70, kernel=2),
        _op(7, "send", 8, 1000, 1090, kernel=3), _op(7, "recv", 8, 1000, 1090, kernel=3),
        _op(8, "recv", 7, 1050, 1090, kernel=4), _op(8, "send", 7, 1050, 1090, kernel=4),
    ]  # fmt: skip
    split_batches(rows)
    assert (rows[0]["t1"], rows[1]["t1"]) == (230, 900)
    assert rows[0]["async"]
    # another size has no typical transfer: the batch is kept whole
    other = [dict(row, bytes=4096) if row["rank"] == 4 else dict(row) for row in rows]
    for row in other:
        row["t1"] = 900 if row["rank"] == 4 else row["t1"]
    split_batches(other)
    assert (other[0]["t1"], other[1]["t1"]) == (900, 900)


def test_a_batch_of_unknown_peers_is_read_from_when_its_rank_computed() -> None:
    """A lost node's peer (nobody stands for it): the batch keeps the kernel's interval, its
    send is covered by the receive's wait (launched, as a split batch's send that ends with
    its receive), and where the rank computed again before the kernel's end (at 300) the
    receive was over by then: held to the end, it held the rank past its computing."""
    rows = [_op(0, "send", 2, 100, 500, kernel=0), _op(0, "recv", 2, 100, 500, kernel=0)]
    for row in rows:
        row[RESUME_KEY] = 300
    assert split_batches(rows) == 1
    assert rows[0]["async"] and not rows[0]["blocking"]
    assert (rows[0]["t1"], rows[1]["t1"]) == (500, 300)
    # computed only after the kernel: the receive keeps its end
    later = [_op(0, "send", 2, 100, 500, kernel=0), _op(0, "recv", 2, 100, 500, kernel=0)]
    for row in later:
        row[RESUME_KEY] = 600
    assert split_batches(later) == 0
    assert later[1]["t1"] == 500 and later[0]["async"]


def test_a_receive_is_cut_by_the_kernels_end_not_by_a_split_op() -> None:
    """A batch whose first op is split (its peer known) and whose other op's peer is unknown:
    the rank computed at 400, before the kernel's end (900), so the receive ends there; read
    against the first op's new end (230), the resumption fell after it and was ignored."""
    rows = [
        _op(4, "send", 5, 100, 900, kernel=0), _op(4, "recv", 6, 100, 900, kernel=0),
        _op(5, "recv", 4, 200, 900),
        _op(7, "send", 8, 0, 70, kernel=1), _op(7, "recv", 8, 0, 70, kernel=1),
        _op(8, "recv", 7, 40, 70, kernel=2), _op(8, "send", 7, 40, 70, kernel=2),
    ]  # fmt: skip
    rows[0][RESUME_KEY] = rows[1][RESUME_KEY] = 400
    split_batches(rows)
    assert (rows[0]["t1"], rows[1]["t1"]) == (230, 400)
