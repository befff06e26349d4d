"""Model FLOPs per token and model FLOPs utilisation (MFU), the number torchtitan and Megatron
users compare first (standard library only: `diag plan` and the simulator may import it).

FLOPs per token of a GPT-style decoder, training (forward + backward), as PaLM's appendix B
(Chowdhery et al. 2022, arXiv 2204.02311) and Megatron (Narayanan et al. 2021, arXiv 2104.04473)
count them:

    6·N + 12·L·h·s

- N is the parameter count the matrix multiplies touch per token: per layer the attention's
  four h x h projections (4h², h x kv for grouped keys and values) and the MLP's two h x f
  matrices (three when gated), plus the LM head h x V. Embedding lookups cost no FLOPs and
  biases and norms are left out, as in both papers. A mixture of experts counts the `topk`
  experts each token is routed to, not all of them (the active parameters), plus the router.
- 12·L·h·s is attention's score and value products (QKᵀ and AV, 2·2·s·h FLOPs a token and layer
  forward, three times that with the backward), which no parameter accounts for; causal masking
  is not subtracted (both papers count the full square).
- The 6 is 2 FLOPs a multiply-add, times 3 for the forward and the two backward matrix products.

MFU = achieved model FLOP/s per device / the device's peak (dense bf16, diag/contract/devices.py).
The achieved rate is the run's tokens/s (docs/metrics.md) times FLOPs per token, over the devices;
activation recomputation is not counted (that would be hardware FLOPs utilisation, HFU).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from diag.contract import devices, schema

FORMULA = "6·N + 12·L·h·s (PaLM appendix B; N: active parameters in matrix multiplies)"
SUMMARY_FIELDS = (
    "model_flops_per_token", "active_params", "model_tflops_per_gpu", "peak_tflops_per_gpu",
    "mfu", "mfu_note",
)  # fmt: skip
"""The fields MFU adds to the report's summary (null when unknown, with `mfu_note` saying why)."""


@dataclass(frozen=True)
class FlopsPerToken:
    """One token's training FLOPs and the active parameter count behind them."""

    flops: float
    active_params: int


MAX_SIZE = 2**40
"""A model size (layers, width, vocabulary, batch) beyond this is taken as unknown: a manifest
is someone else's input."""


def _size(value: object) -> int:
    """A positive whole size from a manifest's model, or 0 (unknown, or not a usable number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    if not 0 < value < MAX_SIZE or value != int(value):
        return 0
    return int(value)


def active_params(model: schema.ModelInfo, gated_mlp: bool = False) -> int | None:
    """Parameters in the matrix multiplies one token passes through (None: the model lacks
    layers, hidden or vocab)."""
    layers, hidden, vocab = _size(model.layers), _size(model.hidden), _size(model.vocab)
    if not (layers and hidden and vocab):
        return None
    ffn = _size(model.ffn_hidden) or 4 * hidden
    attention = 4 * hidden * hidden
    mlp = (3 if gated_mlp else 2) * hidden * ffn
    experts = _size(model.experts)
    if experts > 1:  # every block's MLP is a mixture of experts (the ep trainer, the simulator)
        routed = min(_size(model.topk) or 1, experts)
        mlp = routed * mlp + hidden * experts  # the experts a token visits, and the router
    return layers * (attention + mlp) + hidden * vocab


def flops_per_token(model: schema.ModelInfo, gated_mlp: bool = False) -> FlopsPerToken | None:
    """`6·N + 12·L·h·s` of the model, or None when a needed size is unknown (seq_len too)."""
    params = active_params(model, gated_mlp)
    if params is None or not _size(model.seq_len):
        return None
    attention = 12 * _size(model.layers) * _size(model.hidden) * _size(model.seq_len)
    return FlopsPerToken(float(6 * params + attention), params)


def device_peak_tflops(ranks: list[schema.RankInfo]) -> tuple[float | None, str | None]:
    """The dense bf16 peak of the run's devices (diag/contract/devices.py), or None and why: no
    device named, a CPU, an unknown part, or several kinds of device in one run."""
    names = {r.device_name for r in ranks if r.device_name}
    if not names:
        return None, "the run names no device; give --peak-tflops"
    specs = {devices.device_for_name(name) for name in names}
    if None in specs:
        unknown = sorted(n for n in names if devices.device_for_name(n) is None)
        return None, f"no peak known for device {unknown[0]!r} (CPU or unknown); give --peak-tflops"
    if len(specs) > 1:
        return None, "the run mixes devices of different peaks; give --peak-tflops"
    spec = specs.pop()
    return (spec.peak_tflops_bf16, None) if spec is not None else (None, None)


def mfu_summary(
    model: schema.ModelInfo,
    tokens_per_s: float | None,
    devices_count: int,
    peak_tflops: float | None,
    peak_note: str | None = None,
) -> dict[str, Any]:
    """The summary's MFU fields (SUMMARY_FIELDS): `tokens_per_s` is the whole job's over
    `devices_count` devices, `peak_tflops` one device's peak (None: unknown, `peak_note` why)."""
    out: dict[str, Any] = dict.fromkeys(SUMMARY_FIELDS)
    out["peak_tflops_per_gpu"] = peak_tflops
    per_token = flops_per_token(model)
    if per_token is None:
        out["mfu_note"] = "model unknown (layers, hidden, seq_len and vocab are needed)"
        return out
    out["model_flops_per_token"] = per_token.flops
    out["active_params"] = per_token.active_params
    if tokens_per_s is None or devices_count <= 0:
        out["mfu_note"] = "tokens per second unknown (a trace folder: give batch= in --model)"
        return out
    achieved_tflops = tokens_per_s * per_token.flops / devices_count / 1e12
    out["model_tflops_per_gpu"] = achieved_tflops
    if peak_tflops is None or peak_tflops <= 0:
        out["mfu_note"] = peak_note or "no device peak known; give --peak-tflops"
        return out
    out["mfu"] = achieved_tflops / peak_tflops
    return out


def tokens_per_step(model: schema.ModelInfo, layout: schema.Layout) -> int | None:
    """The job's tokens per step from its batch: micro-batch x sequence x micro-batches (or
    gradient accumulation) x DP x EP replicas; None without a micro-batch and a sequence."""
    per_replica = _size(model.micro_batch) * _size(model.seq_len)
    if not per_replica:
        return None
    chunks = max(_size(layout.microbatches), _size(layout.grad_accum), 1)
    return per_replica * chunks * (_size(layout.dp) or 1) * (_size(layout.ep) or 1)


def with_overrides(
    report: dict[str, Any], model_spec: str | None = None, peak_tflops: float | None = None
) -> dict[str, Any]:
    """The report with its MFU fields computed again for `--model` (over the run's model) and
    `--peak-tflops` (over the device table's peak). A run without tokens (profiler traces)
    takes its tokens per step from the model's batch (`batch=`). ValueError on a bad spec."""
    if model_spec is None and peak_tflops is None:
        return report
    run, summary = dict(report["run"]), dict(report["summary"])
    known = {f.name for f in dataclasses.fields(schema.ModelInfo)}
    base = schema.ModelInfo(**{k: v for k, v in (run.get("model") or {}).items() if k in known})
    model = parse_model(model_spec, base) if model_spec is not None else base
    tokens_per_s = summary.get("tokens_per_s")
    layout_fields = {f.name for f in dataclasses.fields(schema.Layout)}
    stated = run.get("layout") or {}
    layout = schema.Layout(
        **{k: v for k, v in stated.items() if k in layout_fields and v is not None}
    )
    # the report's null is a size diag could not read: the job's tokens are unknown then
    unknown = any(stated.get(k, 0) is None for k in ("dp", "ep", "microbatches"))
    step_s = summary.get("step_time_s")
    if (
        tokens_per_s is None
        and step_s
        and not unknown
        and (per_step := tokens_per_step(model, layout))
    ):
        tokens_per_s = per_step / step_s
    peak = peak_tflops if peak_tflops is not None else summary.get("peak_tflops_per_gpu")
    world = int(summary.get("world_size") or run.get("world_size") or 0)
    summary.update(mfu_summary(model, tokens_per_s, world, peak))
    if unknown and tokens_per_s is None and summary.get("model_flops_per_token"):
        summary["mfu_note"] = "tokens per second unknown: the layout (dp, micro-batches) is unknown"
    run["model"] = dataclasses.asdict(model)
    return {**report, "run": run, "summary": summary}


MODEL_KEYS = {
    "layers": "layers", "hidden": "hidden", "heads": "heads", "seq": "seq_len",
    "vocab": "vocab", "ffn": "ffn_hidden", "experts": "experts", "topk": "topk",
    "batch": "micro_batch",
}  # fmt: skip
"""`--model` keys and the ModelInfo fields they set."""


def parse_model(text: str, base: schema.ModelInfo | None = None) -> schema.ModelInfo:
    """`layers=32,hidden=4096,seq=2048,vocab=50304[,heads=..,ffn=..,experts=..,topk=..,
    batch=..]` over `base`; ValueError naming a bad key or value."""
    values: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, equals, value = item.partition("=")
        field = MODEL_KEYS.get(key.strip())
        if not equals or field is None:
            raise ValueError(f"{item!r}: expected one of {', '.join(MODEL_KEYS)} as key=N")
        try:
            number = int(value)
        except ValueError:
            raise ValueError(f"{item!r}: {key} must be a whole number") from None
        if not 0 < number < MAX_SIZE:
            raise ValueError(f"{item!r}: {key} must be positive")
        values[field] = number
    return dataclasses.replace(base or schema.ModelInfo(), **values)  # type: ignore[arg-type]
