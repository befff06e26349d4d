"""The event model: every rank's spans and collectives, step by step, vectorised over ranks.

Ranks form the grid (dp, pp, ep, tp) of the reference trainers (diag.contract.names.GRID_AXES). Each
pipeline stage runs its schedule's actions in order (diag/contract/schedules.py); one action (a
forward or backward of one micro-batch on one model chunk) is computed for all ranks of the stage at
once, as arrays of shape (dp, ep, tp):

- a receive waits for the previous (forward) or next (backward) model stage's send of that
  micro-batch: the transfer starts when both sides are there and takes the p2p time;
- a layer computes attention, then its TP all-reduce (`tp.attn.fwd`), then the MLP or the MoE
  layer (dispatch all-to-all, the experts on the tokens received, combine all-to-all), then its
  TP all-reduce (`tp.mlp.fwd`); backward runs the same in reverse at twice the FLOPs;
- a collective completes when its last member arrives plus its duration (a max over the
  group's axis), so a late rank makes every member wait;
- after the stage's last backward, the gradient buckets (DDP) all-reduce over the dp group as
  they become ready during that backward; the wait for the last one is a `comm_wait` span; then
  the optimizer step ends the rank's step, and its next step starts (later under a
  `loader-stall`: the gap before it is in no span).

Output: per step, `Batch`es of records (one record per rank of a stage, same fields but times).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from diag.contract import ledger
from diag.contract.names import DP, EP, EP_COMBINE, EP_DISPATCH, PP, TP, backward_tag, tp_tag
from diag.contract.schedules import Action, model_stage, schedule_order, split_layers
from simulator.config import SimConfig, stage_params
from simulator.costs import Costs
from simulator.injections import Faults
from simulator.memory import StageMemory, stage_memory
from simulator.moe import PREFERENCE_CONCENTRATION, Routing, aux_loss, expert_capacity, route
from simulator.records import DTYPE_NAMES, Batch, head

MAX_BUCKETS = 4
"""DDP buckets simulated per step at most (larger buckets when the gradients need more)."""
EPOCH_STEPS = 4
"""Steps per epoch of the synthetic data (as the reference trainers): an `epoch` event each."""


class Grid:
    """The rank grid and where its groups sit."""

    def __init__(self, config: SimConfig) -> None:
        self.shape = (config.dp, config.pp, config.ep, config.tp)
        self.world = config.world_size
        self.rank = np.arange(self.world).reshape(self.shape)
        self.host = self.rank // config.gpus_per_node

    def spans_hosts(self, axis: int) -> np.ndarray:
        """Per group of `axis` (kept as a size-1 axis): does it hold ranks of several hosts?"""
        return self.host.max(axis=axis, keepdims=True) != self.host.min(axis=axis, keepdims=True)


class Engine:
    """Simulates the run; `steps()` yields each step's record batches."""

    def __init__(self, config: SimConfig, faults: Faults) -> None:
        self.cfg, self.faults = config, faults
        self.model = model = config.model
        self.grid = Grid(config)
        self.dp, self.pp, self.ep, self.tp = self.grid.shape
        self.m, self.v = config.microbatches, config.chunks
        self.costs = Costs(model, config.hardware, self.tp)
        self.rng = np.random.default_rng(config.seed)
        self.dtype = DTYPE_NAMES.get(model.dtype_bytes, model.dtype)
        db = model.dtype_bytes
        self.layers_of = split_layers(model.layers, self.pp, self.v)  # model stage -> blocks
        self.last_k = self.pp * self.v - 1
        self.orders = [
            schedule_order(config.schedule, s, self.pp, self.m, self.v) for s in range(self.pp)
        ]
        # bytes of each message kind (per rank payload, the ledger's expectation)
        self.tp_bytes = int(ledger.tp_allreduce_bytes(model.micro_batch, model.seq_len,
                                                      model.hidden, db))  # fmt: skip
        self.pp_bytes = int(ledger.pp_boundary_bytes(model.micro_batch, model.seq_len,
                                                     model.hidden, db))  # fmt: skip
        self.ep_expected = int(ledger.ep_alltoall_bytes(model.tokens, model.topk,
                                                        model.hidden, db))  # fmt: skip
        self.row_bytes = model.hidden * db
        # durations that depend only on placement: arrays broadcasting over (dp, ep, tp)
        tp_cross = self.grid.spans_hosts(3)  # (dp, pp, ep, 1)
        self.tp_ns = [
            self.costs.collective_ns("all_reduce", self.tp_bytes, self.tp, tp_cross[:, s])
            + faults.comm_delay_ns(TP)
            for s in range(self.pp)
        ]
        self.ep_cross = self.grid.spans_hosts(2)  # (dp, pp, 1, tp)
        self.dp_cross = self.grid.spans_hosts(0)  # (1, pp, ep, tp)
        self.p2p_ns: dict[tuple[int, int], np.ndarray] = {}
        for a in range(self.pp):
            for b in ((a + 1) % self.pp, (a - 1) % self.pp):
                cross = self.grid.host[:, a] != self.grid.host[:, b]
                self.p2p_ns[(a, b)] = self.costs.collective_ns(
                    "send", self.pp_bytes, 2, cross
                ) + faults.comm_delay_ns(PP)
        # MoE: one router preference per layer, fixed for the run
        self.capacity = 0
        self.preference: list[np.ndarray] = []
        if model.experts:
            self.capacity = expert_capacity(
                model.tokens, model.topk, model.experts, model.capacity_factor
            )
            concentration = np.full(model.experts, PREFERENCE_CONCENTRATION)
            self.preference = [self.rng.dirichlet(concentration) for _ in range(model.layers)]
        self._plan_stages()
        self.loss_noise = self.rng.normal(0.0, 0.02, config.steps)

    # ------------------------------------------------------------------ static per stage
    def _plan_stages(self) -> None:
        cfg, model = self.cfg, self.model
        db, dp, zero = model.dtype_bytes, self.dp, cfg.zero_stage
        self.stage_ranks = [self.grid.rank[:, s] for s in range(self.pp)]  # (dp, ep, tp)
        self.grad_buckets: list[list[int]] = []
        self.dense_grad_bytes: list[int] = []
        self.opt_ns: list[float] = []
        self.memory: list[StageMemory] = []
        for s in range(self.pp):
            params = stage_params(cfg, s)
            payload = params.total * db
            buckets = max(1, math.ceil(payload / (cfg.bucket_mb * 2**20)))
            count = min(buckets, MAX_BUCKETS)
            sizes = [payload // count] * count
            sizes[-1] += payload - sum(sizes)
            self.grad_buckets.append(sizes if dp > 1 else [])
            self.dense_grad_bytes.append(params.dense * db if self.ep > 1 else 0)
            opt_params = params.total / dp if zero >= 1 else params.total
            self.opt_ns.append(
                cfg.opt_ms * 1e6 if cfg.opt_ms is not None else self.costs.optimizer_ns(opt_params)
            )
            self.memory.append(
                stage_memory(cfg, params.total, self.orders[s], self._holds_head(s), self.pp_bytes,
                             self.ep_expected)
            )  # fmt: skip

    def _holds_head(self, stage: int) -> bool:
        return self.last_k in {model_stage(stage, c, self.pp) for c in range(self.v)}

    def memory_of(self, stage: int, step: int) -> dict[str, int]:
        """The six categories (+ device_peak) of a rank of `stage` at the end of `step`."""
        return self.memory[stage].at_step(
            step, self.faults.leak_bytes_per_step, self.cfg.fragmentation
        )

    # ------------------------------------------------------------------ the run
    def steps(self) -> Iterator[tuple[int, list[Batch]]]:
        clock = np.zeros(self.grid.shape)
        for step in range(self.cfg.steps):
            out: list[Batch] = []
            clock = self._step(step, clock, out)
            yield step, out

    def _step(self, step: int, clock: np.ndarray, out: list[Batch]) -> np.ndarray:
        self.step = step
        self._heads: dict[Any, bytes] = {}
        stall = self.faults.loader_stall_ms
        if stall is not None and stall.any():  # loader-stall: the data fetch before the step
            clock = clock + (stall * 1e6).reshape(self.grid.shape)
        start = clock.copy()
        delay = self.faults.compute_delay_ns(step).reshape(self.grid.shape)
        jitter = self.faults.jitter_ns(step)
        first_delay = delay if jitter is None else delay + jitter.reshape(self.grid.shape)
        skew = self.faults.skew_at(step, self.model.experts) if self.model.experts else None
        self.skew = skew
        self.routing: dict[tuple[int, int], Routing] = {}
        self.routed_sum: dict[int, np.ndarray] = {}
        self.dropped_sum: dict[int, np.ndarray] = {}
        self.sent: dict[tuple[str, int, int], np.ndarray] = {}  # (kind, model stage, mb) -> t
        self.last_bwd: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        stage_clock = [clock[:, s].copy() for s in range(self.pp)]
        nxt = [0] * self.pp
        remaining = sum(len(o) for o in self.orders)
        while remaining:
            progressed = False
            for s in range(self.pp):
                order = self.orders[s]
                while nxt[s] < len(order):
                    action = order[nxt[s]]
                    d = first_delay[:, s] if nxt[s] == 0 else delay[:, s]  # jitter: once
                    t = self._action(s, action, stage_clock[s], d, out)
                    if t is None:
                        break
                    stage_clock[s] = t
                    nxt[s] += 1
                    remaining -= 1
                    progressed = True
            if not progressed:
                raise RuntimeError(f"the schedule deadlocks at actions {nxt}")
        end = np.empty_like(clock)
        for s in range(self.pp):
            end[:, s] = self._finish_stage(s, start[:, s], stage_clock[s], out)
        return end

    # ------------------------------------------------------------------ one action
    def _action(
        self, s: int, action: Action, t: np.ndarray, delay: np.ndarray, out: list[Batch]
    ) -> np.ndarray | None:
        """Run `action` on stage `s` from its ranks' clocks `t`; their new clocks, or None when
        the message it needs has not been sent yet."""
        k = model_stage(s, action.chunk, self.pp)
        fwd = action.kind == "fwd"
        src = k - 1 if fwd else k + 1
        if (fwd and k > 0) or (not fwd and k < self.last_k):
            key = (action.kind, src, action.mb)
            if key not in self.sent:
                return None
            t = self._receive(s, src % self.pp, self.sent.pop(key), t, fwd, out)
        t0 = t
        factor = self._jitter()
        layers = self.layers_of[k]
        c = self.costs
        if fwd:
            t = t + delay
            for layer in layers:
                t = t + (c.attn_fwd_ns + c.router_fwd_ns) * factor
                t = self._tp_allreduce(s, t, tp_tag("attn", "fwd"), layer, out)
                t = self._mlp(s, t, layer, action.mb, True, factor, out)
                t = self._tp_allreduce(s, t, tp_tag("mlp", "fwd"), layer, out)
            if k == self.last_k:
                t = t + c.head_fwd_ns * factor
        else:
            if k == self.last_k:
                t = t + 2 * c.head_fwd_ns * factor
            for layer in reversed(layers):
                t = self._mlp(s, t, layer, action.mb, False, factor, out)
                t = self._tp_allreduce(s, t, tp_tag("mlp", "bwd"), layer, out)
                t = t + 2 * (c.attn_fwd_ns + c.router_fwd_ns) * factor
                t = self._tp_allreduce(s, t, tp_tag("attn", "bwd"), layer, out)
            self.last_bwd[s] = (t0, t)
        stage = s if self.pp > 1 else None
        chunk = action.chunk if self.pp > 1 else None
        span = self._head(("span", action.kind, action.mb, stage, chunk), {
            "kind": "span", "step": self.step, "phase": action.kind, "mb": action.mb,
            "stage": stage, "chunk": chunk,
        })  # fmt: skip
        out.append(Batch(span, self.stage_ranks[s], t0, t))
        if (fwd and k < self.last_k) or (not fwd and k > 0):
            self.sent[(action.kind, k, action.mb)] = t
        return t

    def _jitter(self) -> np.ndarray | float:
        sigma = self.cfg.jitter
        if sigma <= 0:
            return 1.0
        return self.rng.lognormal(0.0, sigma, (self.dp, self.ep, self.tp))

    def _receive(
        self, s: int, src: int, sent: np.ndarray, t: np.ndarray, fwd: bool, out: list[Batch]
    ) -> np.ndarray:
        """The blocking receive on stage `s` of what stage `src` sent at `sent`, and that send
        (async, from its launch to the receive's completion)."""
        arrived = np.maximum(t, sent) + self.p2p_ns[(src, s)]
        tag = "act" if fwd else "grad"
        fields = {"kind": "comm", "step": self.step, "group": PP, "group_size": self.pp,
                  "bytes": self.pp_bytes, "dtype": self.dtype,
                  "expected_bytes": self.pp_bytes, "tag": tag}  # fmt: skip
        recv = self._head(("recv", tag), {**fields, "op": "recv", "async": False,
                                          "blocking": True})  # fmt: skip
        send = self._head(("send", tag), {**fields, "op": "send", "async": True,
                                          "blocking": False})  # fmt: skip
        out.append(Batch(recv, self.stage_ranks[s], t, arrived))
        out.append(Batch(send, self.stage_ranks[src], sent, arrived))
        return arrived

    def _tp_allreduce(
        self, s: int, t: np.ndarray, tag: str, layer: int, out: list[Batch]
    ) -> np.ndarray:
        if self.tp == 1:
            return t
        done = np.broadcast_to(t.max(axis=2, keepdims=True) + self.tp_ns[s], t.shape)
        record = self._head(("tp", tag, layer), {
            "kind": "comm", "step": self.step, "op": "all_reduce", "group": TP,
            "group_size": self.tp, "bytes": self.tp_bytes, "dtype": self.dtype,
            "expected_bytes": self.tp_bytes, "tag": tag, "async": False, "blocking": True,
            "layer": layer,
        })  # fmt: skip
        out.append(Batch(record, self.stage_ranks[s], t, done))
        return np.array(done)

    # ------------------------------------------------------------------ MLP / MoE
    def _mlp(
        self, s: int, t: np.ndarray, layer: int, mb: int, fwd: bool, factor: Any, out: list[Batch]
    ) -> np.ndarray:
        c = self.costs
        scale = 1 if fwd else 2
        if not self.model.experts:
            return t + scale * c.mlp_fwd_ns * factor
        routing = self._routing(layer, mb) if fwd else self.routing.pop((layer, mb))
        send, recv = routing.send_rows(), routing.recv_rows(self.ep)  # (dp, ep)
        # payloads: the dispatch sends the rank's kept rows and the combine returns what its
        # experts computed; backward, combine.bwd carries the gradients of the returned rows
        # and dispatch.bwd those of the received ones
        if fwd:
            first, second = EP_DISPATCH, EP_COMBINE
        else:
            first, second = backward_tag(EP_COMBINE), backward_tag(EP_DISPATCH)
        t = self._alltoall(s, t, first, layer, send, send, recv, out)
        t = t + scale * c.expert_row_fwd_ns * recv[:, :, None] * factor
        return self._alltoall(s, t, second, layer, recv, send, recv, out)

    def _routing(self, layer: int, mb: int) -> Routing:
        model = self.model
        routing = route(
            self.rng, (self.dp, self.ep), model.tokens, model.topk, self.preference[layer],
            self.capacity, self.skew,
        )  # fmt: skip
        self.routing[(layer, mb)] = routing
        total = routing.routed.sum(axis=1)  # (dp, E): summed over the EP group
        self.routed_sum[layer] = self.routed_sum.get(layer, 0) + total
        dropped = (routing.routed - routing.kept).sum(axis=(1, 2))  # (dp,)
        self.dropped_sum[layer] = self.dropped_sum.get(layer, 0) + dropped
        return routing

    def _alltoall(
        self, s: int, t: np.ndarray, tag: str, layer: int, payload_rows: np.ndarray,
        send: np.ndarray, recv: np.ndarray, out: list[Batch],
    ) -> np.ndarray:  # fmt: skip
        """An all-to-all of the EP group: each rank's payload is `payload_rows` rows; it lasts
        as long as the busiest member's larger direction needs."""
        if self.ep == 1:
            return t
        busiest = np.maximum(send, recv).max(axis=1)[:, None, None]  # (dp, 1, 1)
        duration = self.costs.collective_ns(
            "all_to_all", busiest * self.row_bytes, self.ep, self.ep_cross[:, s]
        ) + self.faults.comm_delay_ns(EP)
        done = np.broadcast_to(t.max(axis=1, keepdims=True) + duration, t.shape)
        record = self._head(("a2a", tag, layer), {
            "kind": "comm", "step": self.step, "op": "all_to_all", "group": EP,
            "group_size": self.ep, "dtype": self.dtype, "expected_bytes": self.ep_expected,
            "tag": tag, "async": False, "blocking": True, "layer": layer,
        })  # fmt: skip
        payload = np.broadcast_to((payload_rows * self.row_bytes)[:, :, None], t.shape)
        out.append(Batch(record, self.stage_ranks[s], t, done, ("bytes", payload)))
        return np.array(done)

    # ------------------------------------------------------------------ end of a step
    def _finish_stage(
        self, s: int, start: np.ndarray, t: np.ndarray, out: list[Batch]
    ) -> np.ndarray:
        """Gradient all-reduces, optimizer, memory and step records of stage `s`; its ranks'
        step ends."""
        ranks = self.stage_ranks[s]
        b0, b1 = self.last_bwd[s]
        buckets = self.grad_buckets[s]
        if buckets:
            dp_ns = self.faults.comm_delay_ns(DP)
            previous = None
            for i, size in enumerate(buckets):
                ready = b0 + (b1 - b0) * ((i + 1) / len(buckets))
                begin = ready.max(axis=0, keepdims=True)
                if previous is not None:
                    begin = np.maximum(begin, previous)
                cost = self.costs.collective_ns("all_reduce", size, self.dp, self.dp_cross[:, s])
                previous = begin + cost + dp_ns
                record = self._head(("grad", size), {
                    "kind": "comm", "step": self.step, "op": "all_reduce", "group": DP,
                    "group_size": self.dp, "bytes": size, "dtype": self.dtype,
                    "expected_bytes": size, "tag": "grad", "async": True, "blocking": False,
                })  # fmt: skip
                out.append(Batch(record, ranks, ready, np.broadcast_to(previous, t.shape)))
            assert previous is not None
            done = np.broadcast_to(previous, t.shape)
            waiting = done > t
            if waiting.any():
                wait = self._head(("comm_wait",), {
                    "kind": "span", "step": self.step, "phase": "comm_wait", "mb": None,
                    "stage": None, "chunk": None, "source": "ddp_hook",
                })  # fmt: skip
                out.append(Batch(wait, ranks[waiting], t[waiting], done[waiting]))
            t = np.maximum(t, done)
        dense = self.dense_grad_bytes[s]
        if dense:  # dense weights are replicated over ep too: their sum over the EP group
            cost = self.costs.collective_ns("all_reduce", dense, self.ep, self.ep_cross[:, s])
            done = np.broadcast_to(
                t.max(axis=1, keepdims=True) + cost + self.faults.comm_delay_ns(EP), t.shape
            )
            record = self._head(("dense_grad",), {
                "kind": "comm", "step": self.step, "op": "all_reduce", "group": EP,
                "group_size": self.ep, "bytes": dense, "dtype": self.dtype,
                "expected_bytes": dense, "tag": "grad", "async": False, "blocking": True,
            })  # fmt: skip
            out.append(Batch(record, ranks, t, done))
            t = np.array(done)
        stage = s if self.pp > 1 else None
        if self.opt_ns[s] > 0:
            opt = self._head(("opt",), {"kind": "span", "step": self.step, "phase": "opt",
                                        "mb": None, "stage": stage, "chunk": None})  # fmt: skip
            out.append(Batch(opt, ranks, t, t + self.opt_ns[s]))
            t = t + self.opt_ns[s]
        self._experts(s, out)
        self._memory(s, out)
        self._epoch(s, out)
        last = self._holds_head(s)
        record = self._head(("step", last), {
            "kind": "step", "step": self.step, "tokens": self.model.tokens * self.m,
            "loss": self._loss() if last else None,
        })  # fmt: skip
        out.append(Batch(record, ranks, start, t))
        return t

    def _loss(self) -> float:
        floor = 3.0
        first = math.log(self.model.vocab)
        noise = float(self.loss_noise[self.step])
        return floor + (first - floor) * math.exp(-self.step / 60) + noise

    def _experts(self, s: int, out: list[Batch]) -> None:
        """One `experts` record per MoE layer of the stage and EP group, by its first rank."""
        if not self.model.experts:
            return
        writers = self.grid.rank[:, s, 0, 0]  # (dp,)
        layers = [layer for c in range(self.v) for layer in self.layers_of[c * self.pp + s]]
        for layer in layers:
            routed = self.routed_sum.get(layer)
            if routed is None:
                continue
            dropped = self.dropped_sum[layer]
            for d in range(self.dp):
                record = head({
                    "kind": "experts", "step": self.step, "layer": layer,
                    "tokens": routed[d].tolist(), "dropped": int(dropped[d]),
                    "capacity": self.capacity, "aux_loss": aux_loss(routed[d]),
                })  # fmt: skip
                out.append(Batch(record, writers[d : d + 1]))

    def _memory(self, s: int, out: list[Batch]) -> None:
        memory = self.memory_of(s, self.step)
        record = head({"kind": "mem", "step": self.step, **memory, "host_rss": None,
                       "source": "simulated"})  # fmt: skip
        ranks = self.stage_ranks[s]
        out.append(Batch(record, ranks))
        budget = self.cfg.hardware.device_memory_bytes
        total = sum(v for k, v in memory.items() if k != "device_peak")
        if total > budget:
            event = head({"kind": "event", "step": self.step, "name": "oom_risk",
                          "budget_bytes": budget, "total_bytes": total, **memory,
                          "host_rss": None, "source": "simulated"})  # fmt: skip
            out.append(Batch(event, ranks))

    def _epoch(self, s: int, out: list[Batch]) -> None:
        """An `epoch` event every EPOCH_STEPS steps: the hash of the sample order a data rank
        reads (the same every epoch under `no-set-epoch`)."""
        if self.step % EPOCH_STEPS:
            return
        epoch = self.step // EPOCH_STEPS
        seen = epoch if self.faults.set_epoch else 0
        ranks = self.stage_ranks[s]
        data_rank = np.broadcast_to(
            (np.arange(self.dp)[:, None] * self.ep + np.arange(self.ep)[None, :])[:, :, None],
            ranks.shape,
        )
        digest = (data_rank * 1_000_003 + seen * 7_919 + self.cfg.seed) % (2**31 - 1)
        record = head({"kind": "event", "step": self.step, "name": "epoch", "epoch": epoch,
                       "samples": self.model.micro_batch * self.m * EPOCH_STEPS})  # fmt: skip
        out.append(Batch(record, ranks, vary=("order_hash", digest)))

    def _head(self, key: Any, fields: dict[str, Any]) -> bytes:
        cached = self._heads.get(key)
        if cached is None:
            cached = self._heads[key] = head(fields)
        return cached
