"""torchrun DDP: two gloo processes take the same steps as one process with the global batch."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sparseattn.train import checkpoint as ckpt_io
from sparseattn.train.config import make_config
from sparseattn.train.distributed import global_batches, shard_batches
from sparseattn.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
TINY = dict(
    task="copy",
    device="cpu",  # gloo, and the single-process run it is compared with
    num_train=64,
    num_valid=8,
    num_test=8,
    seq_mean=6.0,
    seq_std=1.0,
    batch_size=8,
    d_model=32,
    d_ff=32,
    num_heads=2,
    dropout=0.0,
    epochs=1,
    max_steps=3,
    warmup=5,
    progress=False,
    plots=False,
    eval_decode=False,
    log_every=1,
    adam_eps=1e-4,
)
# adam_eps: the key-projection bias has a zero gradient in exact arithmetic (softmax ignores a shift
# shared by all keys of a query), so its gradient is rounding noise that Adam with eps 1e-9 would
# scale up to +-lr, differently for a different summation order; eps 1e-4 keeps such noise at ~1e-6


def test_shards_are_disjoint_and_unite_to_the_global_batches():
    batches = [[i, i + 100] for i in range(7)]
    shards = [shard_batches(batches, r, 3) for r in range(3)]
    assert [len(s) for s in shards] == [2, 2, 2]  # the incomplete last group is dropped
    assert global_batches(batches, 3) == [[s[k][j] for s in shards for j in range(2)] for k in range(2)]


class GlobalBatchTrainer(Trainer):
    """One process whose batches are the union of what 2 ranks take per step."""

    def epoch_batches(self, epoch):
        return global_batches(super().epoch_batches(epoch), 2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(*args: str) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={_free_port()}",
        "-m",
        "sparseattn",
        "train",
        *args,
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _check_equals_single_process(tmp_path):
    ddp = ckpt_io.load(tmp_path / "ddp" / "checkpoint.pt")
    assert ddp["position"]["step"] == 3

    single = GlobalBatchTrainer(make_config({**TINY, "out": str(tmp_path / "single")}))
    assert single.fit() == "max_steps"
    ref = single.model.state_dict()
    assert ddp["model"].keys() == ref.keys()
    for k, v in ref.items():
        torch.testing.assert_close(ddp["model"][k], v, rtol=1e-5, atol=1e-5, msg=k)
    start = ckpt_io.load(tmp_path / "single" / "checkpoint.pt")["model"]
    assert any(
        not torch.equal(
            start[k],
            Trainer(make_config({**TINY, "out": str(tmp_path / "init"), "max_steps": 0})).model.state_dict()[k],
        )
        for k in start
    )  # the steps changed the weights


def test_two_gloo_processes_equal_one_process_with_the_global_batch(tmp_path):
    _torchrun(*[f"--{k}={v}" for k, v in TINY.items()], f"--out={tmp_path / 'ddp'}")
    _check_equals_single_process(tmp_path)


@pytest.mark.slow
def test_resume_under_torchrun(tmp_path):
    """2 steps, a checkpoint, then --resume for the third: as one process with the global batch."""
    args = [f"--{k}={v}" for k, v in TINY.items()] + [f"--out={tmp_path / 'ddp'}"]
    _torchrun(*args, "--max_steps=2")
    assert ckpt_io.load(tmp_path / "ddp" / "checkpoint.pt")["position"]["step"] == 2
    _torchrun(*args, "--resume")
    _check_equals_single_process(tmp_path)


def _agree_worker(rank: int, port: int, results) -> None:
    from types import SimpleNamespace

    import torch.distributed as dist

    from sparseattn.train.distributed import DistributedTrainer

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        me = SimpleNamespace(device=torch.device("cpu"))
        # rank 0's clock ran out, rank 1's did not: both must stop (else rank 0 waits forever)
        results[rank] = (DistributedTrainer.agree(me, rank == 0), DistributedTrainer.agree(me, False))
    finally:
        dist.destroy_process_group()


def test_ranks_agree_on_stopping_for_the_time_budget():
    ctx = torch.multiprocessing.get_context("spawn")
    results = ctx.Manager().dict()
    port = _free_port()
    procs = [ctx.Process(target=_agree_worker, args=(r, port, results)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert dict(results) == {0: (True, False), 1: (True, False)}


def test_process_device_gives_each_local_process_its_own_gpu_or_the_cpu():
    from sparseattn.train.distributed import process_device

    assert process_device("auto", 1, 2, 2) == "cuda:1"
    assert process_device("auto", 1, 2, 1) == "cpu"  # too few GPUs for one each: all on CPU, gloo
    assert process_device("auto", 0, 1, 0) == "cpu"
    assert process_device("cuda", 0, 2, 2) == "cuda:0"
    assert process_device("cpu", 1, 2, 4) == "cpu"
    with pytest.raises(ValueError, match=r"--device=cuda: 2 processes on this node but 1 GPU"):
        process_device("cuda", 1, 2, 1)


def _release_worker(rank: int, port: int, out: str, results) -> None:
    import gc
    import weakref

    import torch.distributed as dist

    from sparseattn.train.distributed import DistributedTrainer, cleanup

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    trainer = DistributedTrainer(make_config({**TINY, "max_steps": 1, "out": out}))
    try:
        assert trainer.fit() == "max_steps"  # a backward: its all-reduce ran on gloo's worker threads
        ddp = weakref.ref(trainer.ddp)
        held_by_ddp_alone = sys.getrefcount(trainer.ddp.reducer) == 2  # the attribute and this call's argument
        gc.disable()  # freed by reference counting, as at the end of a run
        cleanup(trainer)
        results[rank] = (held_by_ddp_alone, ddp() is None, trainer.ddp, dist.is_initialized())
    finally:
        gc.enable()
        if dist.is_initialized():
            dist.destroy_process_group()


def test_cleanup_frees_the_ddp_reducer_before_it_destroys_the_process_group(tmp_path):
    """The reducer must not be the process group's last holder (see DistributedTrainer.release):
    when cleanup returns, the DDP wrapper, the reducer's only holder, is gone, and so is the group."""
    ctx = torch.multiprocessing.get_context("spawn")
    results = ctx.Manager().dict()
    port = _free_port()
    procs = [ctx.Process(target=_release_worker, args=(r, port, str(tmp_path / "run"), results)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert dict(results) == {0: (True, True, None, False), 1: (True, True, None, False)}
