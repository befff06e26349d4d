"""`diag plan`: the click shell over diag.plan (which layout, why, and what it costs).

Exit codes as every command: 0 success, 2 unusable input or arguments with one line.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import click

from diag.cli.options import EXIT_INPUT, fail, parse_layout
from diag.contract.devices import DEVICES, device_by_key
from diag.errors import InputError
from diag.plan import (
    FRAMEWORKS,
    Job,
    Layout,
    PlanError,
    cluster_from_device,
    framework_space,
    make_plan,
)
from diag.plan.frameworks import framework_by_key
from diag.plan.job import ModelSpec, Training
from diag.plan.models import PRESETS, TRAINING, preset
from diag.plan.render import plan_json, plan_text
from diag.plan.search import MAX_LAYOUTS

_LAYOUT_KEYS = {"dp", "tp", "pp", "cp", "ep", "zero", "m", "v", "recompute"}


def parse_layout_spec(text: str, gpus: int) -> Layout:
    """`dp=8,tp=8,pp=35,m=240,recompute=full` -> Layout; dp defaults to what remains. Only
    the spelling is checked here (PlanError): the values are diag.plan.inputs's."""
    fields: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep or key not in _LAYOUT_KEYS:
            raise PlanError(
                "--layout",
                f"{part!r} in {text!r}: expected KEY=VALUE, KEY one of "
                f"{', '.join(sorted(_LAYOUT_KEYS))}",
            )
        fields[key] = value
    recompute = fields.pop("recompute", "none")
    try:
        ints = {k: int(v) for k, v in fields.items()}
    except ValueError:
        raise PlanError("--layout", f"{text!r}: sizes must be whole numbers") from None
    tp, pp, cp = ints.get("tp", 1), ints.get("pp", 1), ints.get("cp", 1)
    rest = tp * pp * cp
    return Layout(
        dp=ints.get("dp", max(gpus // rest, 1) if rest > 0 else 1),
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ints.get("ep", 1),
        zero=ints.get("zero", 0),
        microbatches=ints.get("m", 1),
        v=ints.get("v", 1),
        recompute=recompute,
    )


def block_shape(
    mlp: str | None, tie_embeddings: bool | None, positions: str | None
) -> dict[str, bool | None]:
    """The block's shape flags as ModelSpec fields (None: the preset's, or the GPT default)."""
    return {
        "gated_mlp": None if mlp is None else mlp == "swiglu",
        "tied_embeddings": tie_embeddings,
        "learned_positions": None if positions is None else positions == "learned",
    }


def _model(name: str | None, overrides: dict[str, int | bool | None]) -> ModelSpec:
    if name is None and overrides.get("layers") is None:
        raise PlanError("--model", "give a preset or the model's shape (--layers --hidden ...)")
    base = preset(name) if name else ModelSpec(layers=1)
    given = {k: v for k, v in overrides.items() if v is not None}
    return replace(base, **given)  # type: ignore[arg-type]


def _training(name: str | None, flash: bool | None, dropout: bool | None) -> Training:
    """The preset's (or Korthikanti's GPT defaults), with the command line's overrides."""
    base = TRAINING[name.lower()] if name else Training()
    given = {"flash_attention": flash, "dropout": dropout}
    return replace(base, **{k: v for k, v in given.items() if v is not None})


def _ints(text: str | None, name: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(t) for t in text.split(","))
    except ValueError:
        raise PlanError(name, f"a comma-separated list of whole numbers, got {text!r}") from None


def planned_from_run(
    path: str,
    run_layout: str | None,
    layouts: tuple[str, ...],
    top: int,
    model: ModelSpec | None = None,
) -> tuple[dict[str, Any], str]:
    """(JSON document, text) of the plan calibrated on the run at `path`: its own layout
    first, then `layouts` (each with its own micro-batch count: the global batch follows)."""
    from diag.api import load_any  # pandas and the loaders: 0.6 s only --from needs
    from diag.plan.calibrate import calibrate

    run = load_any(path, parse_layout(run_layout) if run_layout else None)
    cal = calibrate(run, path, model)
    cluster = cal.cluster
    wanted = [cal.layout] + [parse_layout_spec(t, cluster.gpus) for t in layouts]
    docs, texts = [], []
    for layout in wanted:
        batch = layout.dp * cal.job.micro_batch * layout.microbatches
        job = replace(cal.job, global_batch=batch)
        plan = make_plan(job, cluster, [layout])
        docs.append(plan_json(plan, top)["layouts"][0])
        texts.append(plan_text(plan, top))
    calibration = cal.as_dict()
    head = (
        "calibrated on "
        + path
        + ": "
        + ", ".join(
            f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
            for k, v in calibration.items()
            if k != "path"
        )
    )
    doc = {"schema": "diag.plan/1", "calibration": calibration, "layouts": docs}
    return doc, head + "\n\n" + "\n".join(texts)


class _OneLineErrors(click.Command):
    """click's own refusals (a value that is not a number, an unknown option) said as every
    other input error of the plan: `diag: error: --gpus: 'x' is not a valid integer.`, one
    line and exit 2, not the usage text."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as err:
            param = getattr(err, "param", None)
            opts = getattr(param, "opts", None)
            where = f"{opts[0]}: " if opts else ""
            click.echo(f"diag: error: {where}{' '.join(err.message.split())}", err=True)
            raise SystemExit(EXIT_INPUT) from None


# The values are checked in one place, diag.plan.inputs (the rules `diag simulate` shares,
# diag/contract/input_rules.py), not by click's ranges: one line naming the option for every
# refusal.
@click.command(cls=_OneLineErrors)
@click.option("--model", "model_name", type=click.Choice(sorted(PRESETS)), help="A preset.")
@click.option("--layers", type=int, help="Transformer blocks.")
@click.option("--hidden", type=int, help="Model width (a multiple of --heads).")
@click.option("--heads", type=int, help="Attention heads.")
@click.option("--kv-heads", type=int, help="Key/value heads (grouped-query; divides --heads).")
@click.option("--ffn-hidden", type=int, help="MLP width [default: 4 x hidden].")
@click.option("--vocab", type=int, help="Vocabulary size.")
@click.option("--seq", "seq_len", type=int, help="Sequence length.")
@click.option("--experts", type=int, help="MoE experts (0: dense, else >= 2).")
@click.option("--topk", type=int, help="Experts per token (1..experts).")
@click.option(
    "--mlp", type=click.Choice(["gelu", "swiglu"]), default=None,
    help="The MLP: gelu (two h x ffn matrices) or swiglu (three, as Llama) [default: the "
    "preset's; gelu for a shape].",
)  # fmt: skip
@click.option(
    "--tie-embeddings/--no-tie-embeddings", "tie_embeddings", default=None,
    help="The LM head shares the token embedding [default: the preset's; tied for a shape].",
)  # fmt: skip
@click.option(
    "--positions", type=click.Choice(["learned", "rotary", "alibi"]), default=None,
    help="Position encoding: a learned seq x hidden table, or rotary / ALiBi (no parameters) "
    "[default: the preset's; learned for a shape].",
)  # fmt: skip
@click.option("--params", type=float, help="Parameter count to use (e.g. the seed's 70e9).")
@click.option(
    "--flash-attention/--no-flash-attention",
    "flash",
    default=None,
    help="Fused attention: no scores stored [default: the preset's; off for a shape].",
)
@click.option(
    "--dropout/--no-dropout",
    default=None,
    help="Dropout masks stored [default: the preset's; on for a shape].",
)
@click.option("--gpus", type=int, help="GPUs in the cluster.")
@click.option("--gpus-per-node", type=int, help="[default: the device's node]")
@click.option("--device", type=click.Choice(sorted(DEVICES)), default="h100", show_default=True)
@click.option("--memory-gb", type=float, help="Device memory override (GB).")
@click.option("--peak-tflops", type=float, help="Peak dense bf16 TFLOP/s override.")
@click.option("--intra-node-GBps", "intra", type=float, help="Scale-up link override (GB/s).")
@click.option("--inter-node-GBps", "inter", type=float, help="Scale-out link override (GB/s).")
@click.option(
    "--compute-efficiency",
    type=float,
    help="Share of the peak a step's compute reaches, in (0, 1] [default: the device's, "
    "by generation: v100 0.30, a100 0.55, h100 0.50; docs/plan.md].",
)
@click.option(
    "--global-batch",
    type=int,
    help="Sequences per step. Required for a search; with --layout it defaults to the first "
    "layout's dp x micro-batch x m.",
)
@click.option("--micro-batch", type=int, default=1, show_default=True)
@click.option(
    "--layout",
    "layouts",
    multiple=True,
    metavar="dp=N,tp=N,pp=N,m=N,...",
    help="Evaluate these layouts instead of searching (repeatable).",
)
@click.option("--zero", "zero_text", metavar="0,1,2,3", help="ZeRO stages the search may use.")
@click.option(
    "--recompute",
    "recompute_text",
    metavar="none,selective,full",
    help="Recomputation the search may use.",
)
@click.option(
    "--sequence-parallel",
    "sequence_parallel",
    type=click.Choice(["on", "off", "auto"]),
    default="auto",
    show_default=True,
    help="Sequence parallelism with TP (Korthikanti 2022); auto: on for tp > 1 where the "
    "framework has it, off: the activations and pipeline messages of frameworks before 2022.",
)
@click.option(
    "--framework",
    "framework_key",
    type=click.Choice(sorted(FRAMEWORKS)),
    default=None,
    help="The framework that runs the job: what it allows (ZeRO stages, with a pipeline, "
    "interleaving, CP, SP) and what it keeps (fp32 gradient buffers, a runtime reserve) "
    "[default: none named: the ZeRO paper's 16 B/param, every layout allowed; docs/plan.md].",
)
@click.option("--max-v", type=int, help="[default: 8, or the framework's]")
@click.option("--max-cp", type=int, help="[default: 8, or the framework's]")
@click.option(
    "--max-layouts",
    type=int,
    default=MAX_LAYOUTS,
    show_default=True,
    help="Layouts one search enumerates at most; the output says when it cuts the search.",
)
@click.option("--from", "from_run", metavar="RUN", help="Calibrate on a measured run.")
@click.option("--run-layout", metavar="dp=N,tp=N,...", help="A trace folder's layout (--from).")
@click.option("--top", type=click.IntRange(1), default=5, show_default=True)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
def plan(
    model_name: str | None,
    layers: int | None,
    hidden: int | None,
    heads: int | None,
    kv_heads: int | None,
    ffn_hidden: int | None,
    vocab: int | None,
    seq_len: int | None,
    experts: int | None,
    topk: int | None,
    mlp: str | None,
    tie_embeddings: bool | None,
    positions: str | None,
    params: float | None,
    flash: bool | None,
    dropout: bool | None,
    gpus: int | None,
    gpus_per_node: int | None,
    device: str,
    memory_gb: float | None,
    peak_tflops: float | None,
    intra: float | None,
    inter: float | None,
    compute_efficiency: float | None,
    global_batch: int | None,
    micro_batch: int,
    layouts: tuple[str, ...],
    zero_text: str | None,
    recompute_text: str | None,
    sequence_parallel: str,
    framework_key: str | None,
    max_v: int | None,
    max_cp: int | None,
    max_layouts: int,
    from_run: str | None,
    run_layout: str | None,
    top: int,
    fmt: str,
) -> None:
    """Lay a model out on a cluster: rank the layouts by predicted throughput, with memory per
    GPU in six categories, communication by dimension, the bubble, step time and MFU, the
    reasoning for the first choice and why the near misses lose (docs/plan.md)."""
    try:
        shape = {
            "layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv_heads,
            "ffn_hidden": ffn_hidden, "vocab": vocab, "seq_len": seq_len, "experts": experts,
            "topk": topk, **block_shape(mlp, tie_embeddings, positions),
        }  # fmt: skip
        if from_run is not None:  # a trace folder's model comes from the command line
            given_model = None
            if model_name is not None or layers is not None:
                given_model = replace(_model(model_name, shape), micro_batch=micro_batch)
            doc, text = planned_from_run(from_run, run_layout, layouts, top, given_model)
            click.echo(json.dumps(doc, indent=2) if fmt == "json" else text, nl=fmt == "json")
            return
        model = _model(model_name, shape)
        if gpus is None:
            raise PlanError("--gpus", "the GPUs in the cluster are needed (or --from RUN)")
        overrides = {
            "device_memory_gb": memory_gb,
            "device_tflops": peak_tflops,
            "intra_node_GBps": intra,
            "inter_node_GBps": inter,
            "mfu": compute_efficiency,
        }
        cluster = cluster_from_device(
            device_by_key(device),
            gpus,
            gpus_per_node,
            **{k: v for k, v in overrides.items() if v is not None},
        )
        framework = framework_by_key(framework_key)
        # auto: the framework's (it only splits anything at tp > 1); on: checked against it
        sp = {"on": True, "off": False}.get(sequence_parallel, framework.sequence_parallel)
        given = [replace(parse_layout_spec(t, gpus), sequence_parallel=sp) for t in layouts]
        batch = global_batch
        if batch is None and given:
            batch = given[0].dp * micro_batch * given[0].microbatches
        if batch is None:
            raise PlanError(
                "--global-batch",
                "is required for a search (sequences per step), or give --layout to evaluate "
                "layouts",
            )
        training = _training(model_name, flash, dropout)
        job = Job(model, batch, micro_batch, params, training, framework)
        limits = {
            "zero_stages": _ints(zero_text, "--zero"),
            "recompute": tuple(recompute_text.split(",")) if recompute_text else None,
            "max_v": max_v,
            "max_cp": max_cp,
        }
        space = framework_space(
            framework,
            max_layouts=max_layouts,
            sequence_parallel=sp,
            **{k: v for k, v in limits.items() if v is not None},
        )
        result = make_plan(job, cluster, given or None, space)
    except InputError as error:  # PlanError among them: one line naming the option
        fail(error)
    except click.BadParameter as err:  # --run-layout's spelling (diag.cli.options.parse_layout)
        fail(InputError("--run-layout", err.message))
    except (ValueError, KeyError) as err:  # a run's calibration that cannot be made
        fail(InputError(from_run or "diag plan", str(err).strip("'\"")))
    if fmt == "json":
        click.echo(json.dumps(plan_json(result, top), indent=2, allow_nan=False))
    else:
        click.echo(plan_text(result, top), nl=False)
