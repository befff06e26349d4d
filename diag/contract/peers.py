"""Who a rank exchanges with, from the layout's groups alone (no records): its neighbours in
its pipeline, and which traced rank stands for one that left no trace. Both the reading of
traces (a batched kernel's ops split by their peers', diag/read/kineto/batches.py) and the
replay's matching (diag/whatif/matching.py, lockstep.py) read them."""

from __future__ import annotations

from collections.abc import Collection

from diag.contract import schema
from diag.contract.names import PP, TP


def pipeline_peers(manifest: schema.Manifest) -> dict[int, tuple[int, int]]:
    """Each rank's (previous, next) rank in its pipeline group, as a ring; empty without one.
    Without virtual stages the first and last stage exchange nothing: each is the other's
    neighbour only in an interleaved schedule (its chunks wrap around), so the first stage's
    only neighbour is the next (given as both) and the last stage's the previous."""
    wraps = (manifest.layout.virtual_stages or 1) > 1
    peers: dict[int, tuple[int, int]] = {}
    for members in manifest.groups.get(PP, []):
        size = len(members)
        for i, rank in enumerate(members):
            if size < 2:
                continue
            previous, following = int(members[(i - 1) % size]), int(members[(i + 1) % size])
            if not wraps and i == 0:
                previous = following
            elif not wraps and i == size - 1:
                following = previous
            peers[int(rank)] = (previous, following)
    return peers


def tp_stand_ins(manifest: schema.Manifest, traced: Collection[int]) -> dict[int, int]:
    """Each untraced rank whose tensor-parallel group has a traced member: that member (the
    lowest). The members of a TP group meet in a collective at every layer, so they run in
    lockstep: the traced one's messages are the untraced one's, in time."""
    out: dict[int, int] = {}
    for members in manifest.groups.get(TP, []):
        seen = sorted(set(traced).intersection(int(m) for m in members))
        for member in members:
            if seen and int(member) not in traced:
                out[int(member)] = seen[0]
    return out


def stand_in_links(
    manifest: schema.Manifest, traced: Collection[int]
) -> dict[tuple[int, int], tuple[int, int]]:
    """(untraced rank x, its pipeline neighbour b) -> (x's stand-in y, y's neighbour on b's
    side): the link whose messages stand for those between x and b (x sent and received
    when its lockstep partner y did, to and from the same stage)."""
    neighbours = pipeline_peers(manifest)
    out: dict[tuple[int, int], tuple[int, int]] = {}
    for x, y in tp_stand_ins(manifest, traced).items():
        if x not in neighbours or y not in neighbours:
            continue
        for side in (0, 1):
            out.setdefault((x, neighbours[x][side]), (y, neighbours[y][side]))
    return out
