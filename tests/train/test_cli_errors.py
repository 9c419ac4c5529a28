"""The second round of hostile-user probes: settings that once failed only at the first forward or
after an epoch, checkpoints that are damaged or do not fit, decoding limits, lines that must stay
aligned, and Ctrl-C before training starts. Each is one line on stderr, exit 2 (130 for an
interrupt), naming the flag or the file; nothing is written for a refused setting."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from sparseattn.train import checkpoint as ckpt_io
from sparseattn.train import cli
from sparseattn.train.metrics import read_metrics

from .cli_helpers import CLI_TINY, assert_one_line_error, child, run_cli, sparseattn, sparseattn_child, wait_until

BAD_SETTINGS = [
    ("--seed=-1", "--seed=-1: must be an int in [0, 2**63)"),
    ("--data_seed=-5", "--data_seed=-5: must be an int in [0, 2**63)"),
    ("--seq_mean=1e7", "--seq_mean=10000000.0: must be in [1, 10000]"),
    ("--seq_mean=inf", "--seq_mean=inf: must be in [1, 10000]"),
    ("--max_len_a=inf", "--max_len_a=inf: must be in [0, 16]"),
    ("--max_len_b=100000", "--max_len_b=100000: must be in [0, 4096]"),
    ("--beam=1000000", "--beam=1000000: must be in [1, 1024]"),
    ("--device=meta", "--device='meta': must be cpu, cuda, cuda:N or auto"),
    ("--clamp=100,200", "--clamp=100,200: bounds must lie in [-65, 65]"),
    ("--d_model=2147483648", "--d_model=2147483648: must be in [1, 65536]"),
    ("--d_ff=2147483648", "--d_ff=2147483648: must be in [1, 65536]"),
    ("--num_layers=100000", "--num_layers=100000: must be in [1, 1024]"),
    ("--epoch=3", "unknown config key 'epoch'"),
]
if not torch.cuda.is_available():
    BAD_SETTINGS.append(("--backend=triton", "--backend=triton does not run on cpu"))


@pytest.mark.parametrize("flag, fragment", BAD_SETTINGS, ids=[f for f, _ in BAD_SETTINGS])
def test_settings_that_would_fail_later_are_refused_before_anything_is_written(tmp_path, capsys, flag, fragment):
    """--clamp=100,200, --backend=triton on a CPU and huge widths once failed at the first forward
    (after config.json was written, so the corrected command needed --overwrite), --max_len_a=inf
    after a whole epoch, --seq_mean=1e7 ran out of memory generating data."""
    out = tmp_path / "run"
    code, _, err = run_cli(["train", "--task=copy", f"--out={out}", *CLI_TINY, flag], capsys)
    assert_one_line_error(code, err, fragment)
    assert not out.exists()


def test_a_typo_is_answered_with_the_key_meant(tmp_path, capsys):
    code, _, err = run_cli(["train", "--task=copy", f"--out={tmp_path / 'r'}", *CLI_TINY, "--epoch=3"], capsys)
    assert_one_line_error(code, err, "did you mean --epochs?")
    assert "batch_size" not in err  # not the ~50 valid keys


def test_help_for_an_unknown_task_is_one_line(capsys):
    code, _, err = run_cli(["train", "--help", "--task", "nonexistent"], capsys)
    assert_one_line_error(code, err, "unknown task 'nonexistent'")


def test_a_dangling_symlink_as_out_is_named(tmp_path, capsys):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "missing" / "dir")
    code, _, err = run_cli(["train", "--task=copy", f"--out={link}", *CLI_TINY], capsys)
    assert_one_line_error(code, err, f"--out {link} is a symbolic link to", "which does not exist")


def test_translate_with_a_checkpoint_of_a_task_that_does_not_translate(copy_run, capsys):
    code, _, err = run_cli(["translate", "--checkpoint", copy_run / "best.pt", "hello"], capsys)
    assert_one_line_error(code, err, "best.pt is a 'copy' checkpoint: that task does not translate text")


# ---- checkpoints that are damaged or do not fit -----------------------------------------------------
def _rewrite(src, dst, edit, keep_checksum=False):
    """Load a checkpoint, edit it and save it again as another tool would: without a checksum (so
    that the entry's own checks are what is tested), or with the stale one (keep_checksum)."""
    state = torch.load(src, weights_only=False)
    if not keep_checksum:
        state.pop("checksum", None)
    edit(state)
    torch.save(state, dst)
    return dst


def _first_weight(state):
    return next(iter(state["model"]))


CHECKPOINT_EDITS = {
    "wrong shape": (lambda s: s["model"].__setitem__(_first_weight(s), torch.zeros(3, 3)), "size mismatch"),
    "missing key": (lambda s: s["model"].pop(_first_weight(s)), "Missing key(s)"),
    "NaN weights": (lambda s: [t.fill_(float("nan")) for t in s["model"].values()], "NaN"),
    "no config entry": (lambda s: s["config"].pop("model"), "holds no valid config"),
}


@pytest.mark.parametrize("command", ["evaluate", "plot", "resume"])
@pytest.mark.parametrize("name", CHECKPOINT_EDITS)
def test_checkpoints_that_do_not_fit_the_model_are_one_line(copy_run, tmp_path, capsys, command, name):
    edit, fragment = CHECKPOINT_EDITS[name]
    run_dir = tmp_path / "run"
    shutil.copytree(copy_run, run_dir)
    path = _rewrite(copy_run / "checkpoint.pt", run_dir / "checkpoint.pt", edit)
    argv = ["train", f"--out={run_dir}", "--resume"] if command == "resume" else [command, "--checkpoint", path]
    if command == "plot":
        argv += ["--out", tmp_path / "plots"]
    code, _, err = run_cli(argv, capsys)
    assert_one_line_error(code, err, "checkpoint.pt", fragment)


@pytest.mark.parametrize(
    "entry, value, fragment",
    [
        ("position", {"epoch": "x"}, "its position entry must hold non-negative ints"),
        ("position", {"epoch": -1, "batch": 0, "step": 0}, "its position entry"),
        ("rng", {"torch": 3}, "its rng entry is not a saved RNG state"),
        ("optimizer", {"state": {}, "param_groups": []}, "its optimizer entry does not fit"),
        ("history", "many", "its history entry is not a list"),
    ],
)
def test_resume_with_a_bad_entry_is_one_line(copy_run, tmp_path, capsys, entry, value, fragment):
    run_dir = tmp_path / "run"
    shutil.copytree(copy_run, run_dir)
    _rewrite(copy_run / "checkpoint.pt", run_dir / "checkpoint.pt", lambda s: s.__setitem__(entry, value))
    code, _, err = run_cli(["train", f"--out={run_dir}", "--resume", "--epochs=2"], capsys)
    assert_one_line_error(code, err, "checkpoint.pt cannot be resumed", fragment)


def _flip_tensor_bytes(path, tensor):
    """Flip 64 bytes of `tensor`'s stored data inside the checkpoint file at `path`."""
    data, needle = bytearray(path.read_bytes()), tensor.contiguous().view(torch.uint8).numpy().tobytes()[:64]
    at = bytes(data).find(needle)
    assert at >= 0, "the tensor's bytes are not stored as they are in memory"
    data[at : at + 64] = bytes(b ^ 0xFF for b in data[at : at + 64])
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("command", ["evaluate", "plot", "translate", "resume"])
def test_flipped_bytes_are_caught_by_the_checksum(copy_run, tmp_path, capsys, command):
    """64 flipped bytes inside a weight once loaded without complaint and evaluated garbage."""
    run_dir = tmp_path / "run"
    shutil.copytree(copy_run, run_dir)
    path = run_dir / "checkpoint.pt"
    state = ckpt_io.load(path)
    weight = max(state["model"].values(), key=lambda t: t.numel())
    _flip_tensor_bytes(path, weight)
    argv = {
        "resume": ["train", f"--out={run_dir}", "--resume"],
        "translate": ["translate", "--checkpoint", path, "hello"],
        "plot": ["plot", "--checkpoint", path, "--out", tmp_path / "plots"],
        "evaluate": ["evaluate", "--checkpoint", path],
    }[command]
    code, _, err = run_cli(argv, capsys)
    assert_one_line_error(code, err, "checkpoint.pt is corrupted: its tensors do not match the checksum")


def test_the_checksum_covers_every_tensor_and_older_files_still_load(tmp_path):
    state = {"config": {"a": 1}, "model": {"w": torch.arange(6.0).view(2, 3)}, "rng": {"t": torch.ones(2)}}
    ckpt_io.save_atomic(state, tmp_path / "c.pt")
    raw = torch.load(tmp_path / "c.pt", weights_only=True)
    assert raw["checksum"] == ckpt_io.tensor_checksum(state)
    loaded = ckpt_io.load(tmp_path / "c.pt")
    assert "checksum" not in loaded and torch.equal(loaded["model"]["w"], state["model"]["w"])
    for edit in (lambda s: s["rng"]["t"].add_(1), lambda s: s["model"].__setitem__("w", s["model"]["w"].t())):
        tampered = torch.load(tmp_path / "c.pt", weights_only=True)
        edit(tampered)
        torch.save(tampered, tmp_path / "t.pt")
        with pytest.raises(ValueError, match="t.pt is corrupted"):
            ckpt_io.load(tmp_path / "t.pt")
    torch.save(state, tmp_path / "old.pt")  # written before checksums existed
    assert torch.equal(ckpt_io.load(tmp_path / "old.pt")["model"]["w"], state["model"]["w"])


# ---- lines that stay aligned, files that stay -----------------------------------------------------------
def test_translate_keeps_one_output_line_per_input_line(m30k_run):
    proc = sparseattn("translate", "--checkpoint", m30k_run / "best.pt", stdin=b"A dog.\n\nTwo men.\n   \nA cat.\n")
    assert proc.returncode == 0, proc.stderr.decode()
    lines = proc.stdout.decode().split("\n")[:-1]
    assert len(lines) == 5 and lines[1] == "" and lines[3] == ""
    assert all(lines[i] for i in (0, 2, 4))  # the model emits something for real sentences


def test_overwrite_deletes_the_runs_files_and_not_the_users(copy_run, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(copy_run, out)
    (out / "notes.tmp").write_text("mine")
    (out / "hyp.txt").write_text("mine too")
    (out / "checkpoint.pt.x1y2.tmp").write_bytes(b"half a checkpoint")
    code, _, err = run_cli(["train", "--task=copy", f"--out={out}", *CLI_TINY, "--overwrite"], capsys)
    assert code == 0, err
    assert (out / "notes.tmp").read_text() == "mine" and (out / "hyp.txt").read_text() == "mine too"
    assert not (out / "checkpoint.pt.x1y2.tmp").exists()


def test_a_metrics_line_that_is_not_utf8_names_the_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"kind": "train", "step": 1}\n{"kind": "tr\xff\xfe"}\n{"kind": "valid", "step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2 is not a JSON record \(not UTF-8 text"):
        read_metrics(path)


# ---- interrupts and memory --------------------------------------------------------------------------------
def test_ctrl_c_during_start_up_is_one_line(tmp_path, capsys, monkeypatch):
    """Ctrl-C while the task builds its data or the model is built (before training's own handler
    that saves a checkpoint is installed) once printed a KeyboardInterrupt traceback."""

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "Trainer", interrupted)
    code, _, err = run_cli(["train", "--task=copy", f"--out={tmp_path / 'r'}", *CLI_TINY], capsys)
    assert code == 130 and err.strip() == "sparseattn train: interrupted"


def test_running_out_of_memory_is_one_line_naming_the_size_flags(tmp_path, capsys, monkeypatch):
    def no_memory(*args, **kwargs):
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you "
            "tried to allocate 249108103168 bytes.\nmore lines"
        )

    monkeypatch.setattr(cli, "Trainer", no_memory)
    code, _, err = run_cli(["train", "--task=copy", f"--out={tmp_path / 'r'}", *CLI_TINY], capsys)
    assert_one_line_error(code, err, "out of memory", "can't allocate memory", "--batch_size", "--d_model")


def test_other_runtime_errors_keep_their_traceback(tmp_path, monkeypatch):
    def bug(*args, **kwargs):
        raise RuntimeError("a bug, not a user error")

    monkeypatch.setattr(cli, "Trainer", bug)
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["train", "--task=copy", f"--out={tmp_path / 'r'}", *CLI_TINY])


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process")
def test_ctrl_c_while_a_subprocess_builds_its_data(tmp_path):
    """The same through a real signal: a letter task of long sequences takes seconds to generate.
    Started from a shell in the background, pytest once gave the child SIGINT ignored: it trained
    25,000 steps and outlived pytest (`child` gives it the default and kills it in the end)."""
    out = tmp_path / "r"
    argv = ["train", "--task=copy", f"--out={out}", *CLI_TINY, "--num_train=400000", "--seq_mean=60"]
    with sparseattn_child(*argv, stderr=subprocess.PIPE) as proc:
        wait_until(proc, (out / ".lock").exists, "lock on --out (past imports and checks: setting up)")
        time.sleep(0.3)  # into the data (seconds of it): the one line below says the set-up was interrupted
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert err.decode().strip().splitlines() == ["sparseattn train: interrupted"]


def _inside_import_torch(line: bytes) -> bool:
    """A line of PYTHONPROFILEIMPORTTIME: a torch submodule has been imported, torch not yet."""
    return line.startswith(b"import time:") and line.rsplit(b"|", 1)[-1].strip().startswith(b"torch.")


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process")
@pytest.mark.parametrize("how", ["command", "python -m"])
def test_ctrl_c_while_the_command_imports_torch(tmp_path, how):
    """Ctrl-C in the second or two the `sparseattn` command (or `python -m sparseattn`) spends
    importing sparseattn and torch: one line and exit 130, not a traceback from inside the import
    (the command's entry point, sparseattn_launcher, catches it before the package is imported;
    under `python -m`, sparseattn/_start.py, the package's first import). `python -m sparseattn`
    once printed 19-42 lines (KeyboardInterrupt, RecursionError) and exited 1 or -2."""
    argv = ["train", "--task=copy", f"--out={tmp_path / 'r'}", *CLI_TINY]
    env = dict(os.environ, PYTHONPROFILEIMPORTTIME="1")  # a line on stderr per module imported
    if how == "command":
        command = shutil.which("sparseattn", path=os.path.dirname(sys.executable))
        if command is None:
            pytest.skip("the sparseattn command is not installed beside this python (pip install -e .)")
        started = child([command, *argv], env=env, stderr=subprocess.PIPE, bufsize=0)
    else:
        started = sparseattn_child(*argv, env=env, stderr=subprocess.PIPE, bufsize=0)
    with started as proc:
        while not _inside_import_torch(line := proc.stderr.readline()):
            assert line, "the child's stderr ended before it imported torch"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    lines = [line for line in err.decode().splitlines() if line.strip() and not line.startswith("import time:")]
    assert proc.returncode == 130, err.decode()[-3000:]
    assert lines in (["sparseattn: interrupted"], ["sparseattn train: interrupted"]), lines
    assert not (tmp_path / "r").exists()
