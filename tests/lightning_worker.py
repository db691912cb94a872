"""One training run for test_lightning.py: Lightning, Fabric or a plain loop over ShardLoader, written as JSON.

Every run trains the same tiny linear model (seeded, deterministic
algorithms, CPU) and records, per training step, the epoch, the loss and the
labels of the batch, so that runs can be compared step by step. With several
processes each rank writes ``<out>.rank<r>.json``.
"""

from __future__ import annotations

import argparse
import atexit
import faulthandler
import json
import multiprocessing
import os
import signal
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

import fastload
from fastload import ShardLoader

BATCH, SEED = 10, 7
STACKS_EVERY_S = 30.0  # a process still running after this long writes its threads' stacks (again this often)


def keep_evidence() -> None:
    """Have this process (any rank, however launched) write faulthandler's reports to ``<out>.faults-<pid>``.

    Module level, so that every process running this file does it: the main one, the ranks Lightning's
    ``ddp`` starts as scripts, ``ddp_spawn``'s children (which import this file) and torchrun's. A rank
    that dies of a fatal signal (SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL) leaves the stacks of all its
    threads there; one still running after ``STACKS_EVERY_S`` writes them too, and again every
    ``STACKS_EVERY_S``: where a slow or stuck rank waits. A SIGKILL (the OOM killer, Lightning's child
    observer) leaves nothing: the process's exit status names it. The tests show these files on failure.
    """
    if len(sys.argv) < 4 or sys.argv[1] not in ("lightning", "plain", "fabric"):
        return
    try:
        report = open(f"{sys.argv[3]}.faults-{os.getpid()}", "w", encoding="utf-8")  # open until the process ends
    except OSError:
        return
    report.write(f"pid {os.getpid()} (parent {os.getppid()}), LOCAL_RANK={os.environ.get('LOCAL_RANK', '-')} "
                 f"RANK={os.environ.get('RANK', '-')}, {multiprocessing.current_process().name}\n")
    report.flush()
    faulthandler.enable(file=report, all_threads=True)
    faulthandler.dump_traceback_later(STACKS_EVERY_S, repeat=True, file=report)


keep_evidence()


def make_loader(path: str, shuffle: bool = True, backend: str = "auto") -> ShardLoader:
    return ShardLoader(path, batch_size=BATCH, shuffle=shuffle, seed=SEED, num_threads=2, backend=backend,
                       num_workers=0)


def loss_of(layer: torch.nn.Module, batch: dict) -> torch.Tensor:
    x = batch["image"].float().flatten(1) / 255
    return torch.nn.functional.cross_entropy(layer(x), batch["label"] % 10)


def step_record(epoch: int, loss: torch.Tensor, batch: dict) -> dict:
    return {"epoch": epoch, "loss": loss.item(), "labels": batch["label"].tolist()}


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3 * 8 * 8, 10)
        self.steps: list[dict] = []
        self.val_passes: list[list[int]] = []

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = loss_of(self.layer, batch)
        self.steps.append(step_record(self.current_epoch, loss, batch))
        return loss

    def on_validation_epoch_start(self) -> None:
        self.val_passes.append([])

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.val_passes[-1] += batch["label"].tolist()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.5, momentum=0.9)


class UserDataModule(L.LightningDataModule):
    """What a user writes: the loader built in ``__init__`` (before ``fit``) and returned by ``train_dataloader``."""

    def __init__(self, path: str, backend: str) -> None:
        super().__init__()
        self.loader = make_loader(path, backend=backend)

    def train_dataloader(self) -> ShardLoader:
        return self.loader


class Recorder(Callback):
    """Records the loader state in each checkpoint; writes each rank's results where that rank trained.

    (With ``ddp_spawn`` the training happens in spawned processes, so the
    results are written there, at the end of ``fit``.)
    """

    def __init__(self, out: str) -> None:
        self.out = out
        self.saved: list[dict] = []

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self.saved.append({"step": trainer.global_step,
                           "loader": checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]})

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        assert isinstance(pl_module, Net)
        write(self.out, pl_module.steps, {"rank": trainer.global_rank, "world_size": trainer.world_size,
                                          "val_passes": pl_module.val_passes, "saved": self.saved,
                                          "num_training_batches": trainer.num_training_batches})
        if multiprocessing.parent_process() is not None and trainer.world_size > 1:
            # A ddp_spawn child: once fit has ended and multiprocessing has handed its results over (the
            # queue's feeder is joined before the interpreter finalizes), leave before the teardown in which
            # gloo's threads may abort ("terminate called without an active exception", as in __main__ below).
            atexit.register(os._exit, 0)


def write(out: str, steps: list[dict], extra: dict) -> None:
    Path(f"{out}.rank{extra['rank']}.json").write_text(json.dumps({"steps": steps, **extra}))


class KillAt(Callback):
    """SIGKILLs every rank once training reaches ``step``: a job killed mid-epoch (after an earlier checkpoint)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step >= self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def run_lightning(args: argparse.Namespace) -> None:
    if args.datamodule == "fastload":
        remote = json.loads(Path(args.remote).read_text()) if args.remote else {}  # storage arguments, a window
        datamodule = fastload.ShardDataModule(args.data, batch_size=BATCH, shuffle=True, seed=SEED, num_threads=2,
                                              backend=args.backend, num_workers=0, **remote)
    else:
        datamodule = UserDataModule(args.data, args.backend)
    callbacks: list[Callback] = [Recorder(args.out)]
    if args.kill_at_step:
        callbacks.append(KillAt(args.kill_at_step))
    for k in args.ckpt_every:
        callbacks.append(ModelCheckpoint(dirpath=Path(args.ckpt_dir) / f"every{k}", every_n_train_steps=k,
                                         save_top_k=-1, filename="{step}"))
    trainer = L.Trainer(max_epochs=args.epochs, accelerator="cpu", devices=args.devices, strategy=args.strategy,
                        deterministic=True, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=bool(args.ckpt_every), callbacks=callbacks,
                        limit_train_batches=args.limit or 1.0, num_sanity_val_steps=2)
    L.seed_everything(0, verbose=False)
    model = Net()
    trainer.fit(model, datamodule=datamodule, ckpt_path=args.resume)


def run_plain(args: argparse.Namespace) -> None:
    torch.use_deterministic_algorithms(True)
    L.seed_everything(0, verbose=False)
    layer = Net().layer
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.5, momentum=0.9)
    loader = make_loader(args.data, backend=args.backend)
    steps = []
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            optimizer.zero_grad()
            loss = loss_of(layer, batch)
            loss.backward()
            optimizer.step()
            steps.append(step_record(epoch, loss, batch))
    write(args.out, steps, {"rank": 0, "world_size": 1})


def run_fabric(args: argparse.Namespace) -> None:
    """The supported way with Fabric: iterate the ShardLoader itself, move batches with ``fabric.to_device``."""
    loader = make_loader(args.data, backend=args.backend)  # before launch: the split is read when a pass starts
    fabric = L.Fabric(accelerator="cpu", devices=args.devices, strategy=args.strategy or "auto")
    fabric.launch()
    fabric.seed_everything(0, verbose=False)
    layer = torch.nn.Linear(3 * 8 * 8, 10)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.5, momentum=0.9)
    layer, optimizer = fabric.setup(layer, optimizer)
    steps = []
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            batch = fabric.to_device(batch)
            optimizer.zero_grad()
            loss = loss_of(layer, batch)
            fabric.backward(loss)
            optimizer.step()
            steps.append(step_record(epoch, loss, batch))
    write(args.out, steps, {"rank": fabric.global_rank, "world_size": fabric.world_size, "loader_len": len(loader)})


def main() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["lightning", "plain", "fabric"])
    parser.add_argument("data")
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--ckpt-every", type=int, nargs="*", default=[])
    parser.add_argument("--ckpt-dir", default="")
    parser.add_argument("--resume", default=None)
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--datamodule", choices=["user", "fastload"], default="user")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--remote", default="", help="a JSON file of ShardDataModule storage arguments")
    parser.add_argument("--kill-at-step", type=int, default=0)
    args = parser.parse_args()
    {"lightning": run_lightning, "plain": run_plain, "fabric": run_fabric}[args.mode](args)
    return args


if __name__ == "__main__":
    ran = main()
    if ran.devices > 1:
        # Everything checked is written. DDP over gloo keeps gloo's threads past destroy_process_group, and
        # one may drop autograd's stashed Python context during interpreter teardown and abort ("terminate
        # called without an active exception"): torch's race, described under the README's torchrun snippet.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
