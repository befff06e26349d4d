"""A tiny GPT-2 trained by `transformers.Trainer` on 2 CPU ranks, recorded by
DiagTrainerCallback and traced with `torch.profiler` in a callback (the README's route).

    torchrun --standalone --nproc-per-node 2 tests/distributed/hf_job.py OUT

Writes the run directory OUT/run and the profiler traces OUT/traces (tensorboard_trace_handler,
one `*.pt.trace.json` per rank; the callback given by `add_callback` with the trainer); then
OUT/construction, the callback given the conventional way (`Trainer(callbacks=[...])`, no
trainer), with a slow forward pre-hook on rank 1's model (input processing users put there);
then an `accelerate` loop of the same model under `collectors.hf.recording` into
OUT/accelerate. The model is built from a config: nothing is downloaded.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from collectors.hf import DiagTrainerCallback, recording

STEPS = 5
SEQ = 32
PRE_HOOK_S = 0.04
"""Rank 1's forward pre-hook sleeps this long in the OUT/construction run."""


class Tokens(Dataset[dict[str, torch.Tensor]]):
    """Random token sequences, their own labels (causal LM)."""

    def __init__(self, count: int) -> None:
        self.ids = torch.randint(0, 128, (count, SEQ), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class ProfilerCallback(TrainerCallback):
    """torch.profiler over steps 1-2, one trace per rank (the README's HF snippet)."""

    def __init__(self, folder: Path) -> None:
        self.prof = torch.profiler.profile(
            schedule=torch.profiler.schedule(wait=1, warmup=0, active=2, repeat=1),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(str(folder)),
        )

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.prof.start()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.prof.step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.prof.stop()


def main() -> None:
    torch.set_num_threads(1)
    out = Path(sys.argv[1])
    config = GPT2Config(vocab_size=128, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2)
    args = TrainingArguments(
        output_dir=str(out / "hf"), max_steps=STEPS, per_device_train_batch_size=4,
        use_cpu=True, ddp_backend="gloo", report_to=[], save_strategy="no",
        logging_strategy="no", dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip
    trainer = Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=Tokens(64))
    trainer.add_callback(DiagTrainerCallback(out / "run", trainer))
    trainer.add_callback(ProfilerCallback(out / "traces"))
    trainer.train()
    model = GPT2LMHeadModel(config)
    if torch.distributed.get_rank() == 1:
        model.register_forward_pre_hook(lambda module, inputs: time.sleep(PRE_HOOK_S))
    Trainer(model=model, args=args, train_dataset=Tokens(64),
            callbacks=[DiagTrainerCallback(out / "construction")]).train()  # fmt: skip
    accelerate_loop(out / "accelerate", config)


def accelerate_loop(run_dir: Path, config: GPT2Config) -> None:
    """An accelerate user's loop: prepare, then the recorder around the loop."""
    accelerator = Accelerator(cpu=True)
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(Tokens(32), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    with recording(run_dir, model, optimizer) as rec:
        for batch in rec.iterate(loader):
            with rec.step(tokens=batch["input_ids"].numel()) as step:
                with rec.span("fwd"):
                    loss = model(**batch).loss
                with rec.span("bwd"):
                    accelerator.backward(loss)
                with rec.span("opt"):
                    optimizer.step()
                    optimizer.zero_grad()
                step.loss = loss.detach()


if __name__ == "__main__":
    main()
