"""What the two demo-model training scripts (train_demo.py, train_marian_demo.py) share: the
learning-rate schedule, one optimiser step, the loss log, and the command line that made a
checkpoint. Loaded by path (scripts/ is not a package): `load_script("training")`."""

from __future__ import annotations

import argparse
import importlib.util
import math
import time
from pathlib import Path

import torch

SCRIPTS = Path(__file__).resolve().parent


def load_script(name: str, folder: Path = SCRIPTS):
    """`folder`/`name`.py as a module."""
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cosine_lr(step: int, lr: float, warmup: int, steps: int) -> float:
    """Linear warm-up, then a cosine down to 2 % of `lr`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * t)))


class Trainer:
    """AdamW steps with gradients clipped at 1.0, the learning rate set each step, the mean
    loss printed every 100 steps."""

    def __init__(self, model, opt, args) -> None:
        self.model, self.opt, self.args = model, opt, args
        self.t0, self.loss_sum, self.loss_n = time.time(), 0.0, 0

    def lr(self, step: int) -> float:
        a = self.args
        return cosine_lr(step, a.lr, a.warmup, a.steps)

    def before(self, step: int) -> None:
        for group in self.opt.param_groups:
            group["lr"] = self.lr(step)

    def after(self, step: int, loss: torch.Tensor) -> None:
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.loss_sum, self.loss_n = self.loss_sum + loss.item(), self.loss_n + 1
        if (step + 1) % 100 == 0:
            print(f"step {step + 1:6d}  loss {self.loss_sum / self.loss_n:.4f}  "
                  f"lr {self.lr(step):.2e}  {time.time() - self.t0:7.1f}s", flush=True)
            self.loss_sum, self.loss_n = 0.0, 0

    @property
    def seconds(self) -> float:
        return time.time() - self.t0


def command_args(parser: argparse.ArgumentParser, args, default_out: Path) -> str:
    """The options given that differ from the defaults, as a command line's tail."""
    defaults = vars(parser.parse_args([]))
    given = [(k, v) for k, v in vars(args).items() if v != defaults[k] and k != "out"]
    text = "".join(f" --{k.replace('_', '-')} {v}" for k, v in given)
    if args.out.resolve() != default_out:
        text += f" --out {args.out}"
    return text
