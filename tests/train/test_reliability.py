"""Faults a user or a machine injects: bad flags, existing runs, killed and interrupted processes,
corrupt or crafted checkpoints, torn logs, full disks, long or non-UTF-8 input. Each is a one-line
error, a refusal, or a run that survives; nothing runs code from a checkpoint.

Most commands run in-process through `cli.main` (the `sparseattn` entry point); the ones that need
a process of their own (signals, kill -9, stdin) run as subprocesses."""

import json
import os
import pickle
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from sparseattn.train import checkpoint as ckpt_io
from sparseattn.train.config import make_config
from sparseattn.train.metrics import read_metrics
from sparseattn.train.trainer import NonFiniteLoss, Trainer

from .cli_helpers import CLI_TINY, FIXTURES, assert_one_line_error, run_cli, sparseattn, sparseattn_child, wait_until


# ---- bad settings ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "flag, fragment",
    [
        ("--d_model=0", "--d_model=0: must be in [1, 65536]"),
        ("--batch_size=0", "--batch_size=0: must be >= 1"),
        ("--threads=-3", "--threads=-3: must be >= 0"),
        ("--epochs=-1", "--epochs=-1"),
        ("--num_train=0", "--num_train=0"),
        ("--max_steps=-5", "--max_steps=-5"),
        ("--lr_factor=nan", "--lr_factor must be a number"),
        ("--clamp=nan", "--clamp"),
        ("--device=cuda:7" if not torch.cuda.is_available() else "--device=nodevice", "--device"),
    ],
)
def test_bad_settings_are_one_line_errors(tmp_path, capsys, flag, fragment):
    code, _, err = run_cli(["train", "--task=copy", f"--out={tmp_path / 'run'}", *CLI_TINY, flag], capsys)
    assert_one_line_error(code, err, fragment)
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_out_is_required_and_must_be_a_folder(tmp_path, capsys):
    code, _, err = run_cli(["train", "--task=copy", *CLI_TINY], capsys)
    assert_one_line_error(code, err, "--out RUN_DIR is required")
    (tmp_path / "file").write_text("x")
    code, _, err = run_cli(["train", f"--out={tmp_path / 'file'}", *CLI_TINY], capsys)
    assert_one_line_error(code, err, "is a file")


def test_an_existing_run_is_refused_without_resume_or_overwrite(copy_run, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(copy_run, out)
    before = (out / "metrics.jsonl").read_text()
    code, _, err = run_cli(["train", "--task=copy", f"--out={out}", *CLI_TINY], capsys)
    assert_one_line_error(code, err, "already holds a run", "--resume", "--overwrite")
    assert (out / "metrics.jsonl").read_text() == before  # nothing touched
    code, _, _ = run_cli(["train", "--task=copy", f"--out={out}", *CLI_TINY, "--seed=3", "--overwrite"], capsys)
    assert code == 0 and json.loads((out / "config.json").read_text())["run"]["seed"] == 3


def test_resume_refuses_changed_task_or_model_keys(copy_run, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(copy_run, out)
    code, _, err = run_cli(["train", f"--out={out}", "--resume", "--d_model=32"], capsys)
    assert_one_line_error(code, err, "--d_model (16 -> 32)")
    code, _, err = run_cli(["train", f"--out={out}", "--resume", "--num_train=50", "--clamp=none"], capsys)
    assert_one_line_error(code, err, "--num_train (48 -> 50)", "--clamp")
    code, _, err = run_cli(["train", f"--out={out}", "--resume", "--epochs=2"], capsys)  # run keys may change
    assert code == 0, err


def test_resume_accepts_the_original_command_and_refuses_another_task_or_model(copy_run, tmp_path, capsys):
    """`sparseattn train --task=copy --out=RUN ...` with --resume appended continues the run; --task or
    --model naming something else is refused before anything is touched."""
    out = tmp_path / "run"
    shutil.copytree(copy_run, out)
    before = (out / "metrics.jsonl").read_text()
    code, _, err = run_cli(["train", "--task=sort", f"--out={out}", "--resume"], capsys)
    assert_one_line_error(code, err, "--task", "'copy' -> 'sort'")
    code, _, err = run_cli(["train", "--task=copy", "--model=ut", f"--out={out}", "--resume"], capsys)
    assert_one_line_error(code, err, "--model", "'transformer' -> 'ut'")
    assert (out / "metrics.jsonl").read_text() == before
    code, _, err = run_cli(
        ["train", "--task=copy", "--model=transformer", f"--out={out}", "--resume", "--epochs=2"], capsys
    )
    assert code == 0, err


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    cfg = make_config(
        {
            **dict(a[2:].split("=") for a in CLI_TINY),
            "task": "copy",
            "out": str(tmp_path / "run"),
            "checkpoint_every": "1",
            "epochs": "2",
        }
    )
    trainer = Trainer(cfg)
    real_loss = trainer.task.loss
    calls = {"n": 0}

    def loss(model, batch, cfg):
        value, stats = real_loss(model, batch, cfg)
        calls["n"] += 1
        return (value * float("nan") if calls["n"] == 3 else value), stats

    monkeypatch.setattr(trainer.task, "loss", loss)
    with pytest.raises(NonFiniteLoss, match="became nan at step 3"):
        trainer.fit()
    state = ckpt_io.load(trainer.ckpt_path)
    assert state["position"]["step"] == 2 and not ckpt_io.non_finite([state["model"], state["optimizer"]])


def test_resume_refuses_a_checkpoint_with_nan_optimizer_state(copy_run, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(copy_run, out)
    state = ckpt_io.load(out / "checkpoint.pt")
    first = next(iter(state["optimizer"]["state"].values()))
    first["exp_avg"].fill_(float("nan"))
    ckpt_io.save_atomic(state, out / "checkpoint.pt")
    code, _, err = run_cli(["train", f"--out={out}", "--resume", "--epochs=2"], capsys)
    assert_one_line_error(code, err, "NaN or infinite", "refusing to resume")


# ---- checkpoints that are not what they claim ----------------------------------------------------
class Payload:
    def __reduce__(self):
        return (print, ("PAYLOAD RAN",))


def _bad_checkpoints(tmp_path, good: Path):
    data = good.read_bytes()
    files = {
        "truncated": data[: len(data) // 2],
        "empty": b"",
        "garbage": os.urandom(300),
        "json": json.dumps({"config": {}, "model": {}}).encode(),
    }
    for name, content in files.items():
        (tmp_path / f"{name}.pt").write_bytes(content)
    torch.save({"weights": torch.zeros(2)}, tmp_path / "wrongdict.pt")
    with open(tmp_path / "crafted.pt", "wb") as f:
        pickle.dump({"config": Payload(), "model": {}}, f)
    torch.save({"config": Payload(), "model": {}}, tmp_path / "crafted_zip.pt")
    return sorted(tmp_path.glob("*.pt"))


@pytest.mark.parametrize("command", ["evaluate", "plot", "translate", "resume"])
def test_corrupt_and_crafted_checkpoints_fail_in_one_line_and_run_nothing(copy_run, tmp_path, capsys, command):
    for path in _bad_checkpoints(tmp_path, copy_run / "best.pt"):
        if command == "resume":
            run_dir = tmp_path / f"resume_{path.stem}"
            run_dir.mkdir()
            shutil.copy(path, run_dir / "checkpoint.pt")
            argv = ["train", f"--out={run_dir}", "--resume"]
            named = run_dir.name
        else:
            argv = [command, "--checkpoint", path, *(["hello"] if command == "translate" else [])]
            named = path.name
        code, out, err = run_cli(argv, capsys)
        assert "PAYLOAD RAN" not in out + err, path.name
        assert_one_line_error(code, err, named)


def test_a_crafted_checkpoint_runs_nothing_in_a_subprocess(tmp_path):
    with open(tmp_path / "crafted.pt", "wb") as f:
        pickle.dump({"config": Payload(), "model": {}}, f)
    proc = sparseattn("evaluate", "--checkpoint", tmp_path / "crafted.pt")
    assert proc.returncode == 2 and b"PAYLOAD RAN" not in proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and b"crafted.pt" in proc.stderr


def test_best_pt_cannot_be_resumed(copy_run, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    shutil.copy(copy_run / "best.pt", out / "checkpoint.pt")
    code, _, err = run_cli(["train", f"--out={out}", "--resume"], capsys)
    assert_one_line_error(code, err, "cannot be resumed", "optimizer")


def test_a_full_disk_during_a_save_names_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    ckpt_io.save_atomic({"config": {}, "model": {"w": torch.ones(3)}}, path)

    def no_space(obj, f, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", no_space)
    with pytest.raises(OSError, match=r"could not write .*checkpoint.pt \(No space left on device\); the previous"):
        ckpt_io.save_atomic({"config": {}, "model": {"w": torch.zeros(3)}}, path)
    monkeypatch.undo()
    assert torch.equal(ckpt_io.load(path)["model"]["w"], torch.ones(3))
    assert list(tmp_path.glob("*.tmp")) == []


def test_stale_temp_files_are_removed_at_start(copy_run, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(copy_run, out)
    (out / "checkpoint.pt.abc123.tmp").write_bytes(b"half a checkpoint")
    code, _, err = run_cli(["train", f"--out={out}", "--resume", "--epochs=2"], capsys)
    assert code == 0, err
    assert list(out.glob("*.tmp")) == []


# ---- logs ------------------------------------------------------------------------------------------
def test_a_torn_last_metrics_line_is_skipped_with_a_warning(copy_run, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(copy_run, out)
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "step": 99, "lo')
    code, _, err = run_cli(["compare", "--run", f"A={out}", "--metric", "loss", "--output", tmp_path / "c.png"], capsys)
    assert code == 0 and "torn last line" in err and "metrics.jsonl" in err
    code, _, err = run_cli(["train", f"--out={out}", "--resume", "--epochs=2"], capsys)
    assert code == 0, err
    assert all(r["step"] != 99 for r in read_metrics(out / "metrics.jsonl"))
    (tmp_path / "bad.jsonl").write_text('{"a": 1\n{"b": 2}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        read_metrics(tmp_path / "bad.jsonl")


def test_an_epoch_resumed_in_the_middle_says_so(tmp_path):
    kw = {**dict(a[2:].split("=") for a in CLI_TINY), "task": "copy", "out": str(tmp_path / "run")}
    assert Trainer(make_config({**kw, "max_steps": "2"})).fit() == "max_steps"
    resumed = Trainer(make_config(kw), resume=True)
    assert resumed.fit() == "finished"
    epoch = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "valid"][0]
    assert epoch["train"]["from_batch"] == 2


# ---- commands --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["evaluate", "--split", "nosuch"], "--split 'nosuch'"),
        (["evaluate", "--beam", "0"], "--beam=0: must be in [1, 1024]"),
        (["evaluate", "--beam", "1000000"], "--beam=1000000: must be in [1, 1024]"),
        (["evaluate", "--max_len_a", "inf"], "--max_len_a=inf: must be in [0, 16]"),
        (["evaluate", "--max_len_b", "100000"], "--max_len_b=100000: must be in [0, 4096]"),
    ],
)
def test_evaluate_arguments(copy_run, capsys, argv, fragment):
    code, _, err = run_cli([argv[0], "--checkpoint", copy_run / "best.pt", *argv[1:]], capsys)
    assert_one_line_error(code, err, fragment)


def test_demo_rejects_zero_sequences(capsys):
    code, _, err = run_cli(["demo", "--sequences", "0"], capsys)
    assert_one_line_error(code, err, "--sequences must be >= 1")


def test_translate_decodes_long_lines_and_keeps_the_others(m30k_run, capsys):
    long_line = " ".join(["xylophone quartz"] * 80)  # 1280 subwords: more than the 1024-row position table
    code, out, err = run_cli(
        [
            "translate",
            "--checkpoint",
            m30k_run / "best.pt",
            "--max_len_a=0",
            "--max_len_b=4",
            "--max-source-len=2000",  # the whole line, not the longest training source
            "A dog runs.",
            long_line,
            "Two men.",
        ],
        capsys,
    )
    assert code == 0, err
    assert len(out.splitlines()) == 3


def test_translate_needs_only_the_checkpoint(m30k_run, tmp_path):
    alone = tmp_path / "elsewhere"
    alone.mkdir()
    shutil.copy(m30k_run / "best.pt", alone / "model.pt")
    proc = sparseattn("translate", "--checkpoint", "model.pt", cwd=alone, stdin="A dog runs.\nTwo men.\n".encode())
    assert proc.returncode == 0, proc.stderr.decode()
    assert len(proc.stdout.decode().splitlines()) == 2
    proc = sparseattn("translate", "--checkpoint", "model.pt", cwd=alone, stdin=b"caf\xe9 au lait\n")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert b"not UTF-8" in proc.stderr


def test_conll_files_that_are_not_utf8_or_empty(tmp_path, capsys):
    data = tmp_path / "data" / "conll2000"
    data.mkdir(parents=True)
    shutil.copy(FIXTURES / "conll_sample.txt", data / "train.txt")
    (data / "test.txt").write_bytes(b"Caf\xe9 NN B-NP\n")
    argv = [
        "train",
        "--task=chunking",
        "--model=bilstm",
        f"--data-dir={tmp_path / 'data'}",
        f"--out={tmp_path / 'r'}",
        "--progress=false",
    ]
    code, _, err = run_cli(argv, capsys)
    assert_one_line_error(code, err, "test.txt is not UTF-8")
    (data / "test.txt").write_text("")
    code, _, err = run_cli(argv, capsys)
    assert_one_line_error(code, err, "test.txt holds no sentences")


# ---- processes that are stopped --------------------------------------------------------------------
KILL_RUN = [
    "train",
    "--task=copy",
    "--num_train=96",
    "--num_valid=8",
    "--num_test=8",
    "--seq_mean=5",
    "--seq_std=1",
    "--batch_size=8",
    "--d_model=128",
    "--d_ff=1024",
    "--num_layers=2",
    "--num_heads=2",
    "--epochs=1",
    "--progress=false",
    "--plots=false",
    "--eval_decode=false",
    "--checkpoint_every=1",
    "--threads=1",
]


def _weights(run_dir):
    return ckpt_io.load(Path(run_dir) / "checkpoint.pt")["model"]


def _assert_same(a, b):
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The final weights of KILL_RUN run without interruption."""
    out = tmp_path_factory.mktemp("full") / "run"
    proc = sparseattn(*KILL_RUN, f"--out={out}")
    assert proc.returncode == 0, proc.stderr.decode()
    return _weights(out)


def test_kill_9_inside_the_save_window_then_resume_equals_an_uninterrupted_run(tmp_path, uninterrupted):
    out = tmp_path / "killed"
    caught = False
    with sparseattn_child(*KILL_RUN, f"--out={out}", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            names = os.listdir(out) if out.is_dir() else []
            if "checkpoint.pt" in names and any(name.endswith(".tmp") for name in names):
                proc.kill()  # a checkpoint exists and the next one is being written: kill inside that window
                caught = True
                break
            time.sleep(0.0005)
    assert caught, "the run ended (or 60 s passed) before a save window was caught"
    state = ckpt_io.load(out / "checkpoint.pt")  # the last complete checkpoint is intact
    assert state["position"]["step"] >= 1
    resumed = sparseattn("train", f"--out={out}", "--resume")
    assert resumed.returncode == 0, resumed.stderr.decode()
    assert list(out.glob("*.tmp")) == []
    _assert_same(_weights(out), uninterrupted)


def test_sigterm_saves_and_resume_finishes_exactly(tmp_path, uninterrupted):
    out = tmp_path / "term"
    argv = [*KILL_RUN, "--checkpoint_every=0", "--log_every=1", f"--out={out}"]
    with sparseattn_child(*argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
        wait_until(proc, (out / "metrics.jsonl").exists, "metrics.jsonl (the first step done)")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert b"SIGTERM" in err and b"checkpoint saved" in err
    assert ckpt_io.load(out / "checkpoint.pt")["position"]["step"] >= 1
    resumed = sparseattn("train", f"--out={out}", "--resume")
    assert resumed.returncode == 0, resumed.stderr.decode()
    _assert_same(_weights(out), uninterrupted)


def test_resume_reads_a_config_file_as_flags(copy_run, tmp_path, capsys):
    """--config with --resume is not ignored: run keys in it apply, changed model keys are refused."""
    out = tmp_path / "run"
    shutil.copytree(copy_run, out)
    changed = tmp_path / "changed.toml"
    changed.write_text('[task]\nname = "copy"\n[model]\nname = "transformer"\nd_model = 32\n')
    code, _, err = run_cli(["train", f"--out={out}", "--resume", f"--config={changed}"], capsys)
    assert_one_line_error(code, err, "--d_model (16 -> 32)")
    longer = tmp_path / "longer.toml"
    longer.write_text('[run]\nepochs = 2\n[task]\nname = "copy"\n')
    code, _, err = run_cli(["train", f"--out={out}", "--resume", "--config", str(longer)], capsys)
    assert code == 0, err
    assert json.loads((out / "config.json").read_text())["run"]["epochs"] == 2
