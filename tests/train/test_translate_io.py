"""`sparseattn translate`: one output line per input line, whatever characters a line holds; sources
cut to --max-source-len with a warning naming the line; sentences that are not UTF-8 are one line;
the run folder given first, without --checkpoint."""

import io
import os
import sys

import pytest

from sparseattn.train.tasks.multi30k import Multi30kTask
from sparseattn.train.translate_io import DEFAULT_MAX_SOURCE_LEN, source_bound, split_lines

from .cli_helpers import assert_one_line_error, run_cli, sparseattn

# inside a line: a lone CR, a form feed, a vertical tab, U+0085, U+2028, U+2029, U+001E
ODD = ["A dog\rruns.", "Two\x0cmen.", "A\x0bcat.", "A\x85bird.", "A\u2028man.", "A\u2029girl.", "A\x1eboy."]


def test_split_lines_splits_on_newlines_only():
    assert split_lines("".join(line + "\n" for line in ODD)) == ODD
    assert split_lines("a\r\nb\n\nc") == ["a", "b", "", "c"]  # \r\n as one break; no final newline
    assert split_lines("") == [] and split_lines("\n") == [""]


def translate(argv, stdin: bytes, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    return run_cli(["translate", *argv], capsys)


def test_odd_characters_inside_lines_keep_the_outputs_aligned(m30k_run, capsys, monkeypatch):
    lines = [part for line in ODD for part in (line, "")]  # a blank line after each: blank outputs must stay there
    code, out, err = translate([m30k_run], "".join(f"{line}\n" for line in lines).encode(), capsys, monkeypatch)
    assert code == 0, err
    printed = out.split("\n")[:-1]
    assert len(printed) == len(lines)
    assert [bool(line) for line in printed] == [bool(line) for line in lines]  # translations where sentences are
    code, alone, _ = run_cli(["translate", m30k_run, *ODD], capsys)  # the same sentences as arguments
    assert alone.split("\n")[:-1] == printed[::2]


def test_a_long_source_is_cut_with_a_warning_naming_its_line(m30k_run, capsys, monkeypatch):
    seen = []
    decode = Multi30kTask.decode
    monkeypatch.setattr(
        Multi30kTask,
        "decode",
        lambda self, model, sources, *a: seen.extend(map(len, sources)) or decode(self, model, sources, *a),
    )
    long_line = " ".join(["A dog runs on the beach."] * 50)
    stdin = f"A dog.\n{long_line}\nTwo men.\n".encode()
    code, out, err = translate([m30k_run, "--max-source-len=8"], stdin, capsys, monkeypatch)
    assert code == 0 and len(out.split("\n")[:-1]) == 3
    warnings = [line for line in err.splitlines() if "subword tokens" in line]
    assert len(warnings) == 1 and warnings[0].startswith("sparseattn translate: line 2 has ")
    assert "translated its first 8 (--max-source-len=8)" in warnings[0]
    assert max(seen) == 8 + 1  # 8 subword tokens and </s>

    seen.clear()  # without the flag: the longest source the run trained on
    code, out, err = translate([m30k_run], stdin, capsys, monkeypatch)
    assert code == 0 and "line 2 has" in err and "the longest source this run trained on" in err
    assert 1 < max(seen) < 40


def test_the_bound_comes_from_the_flag_the_checkpoint_or_the_default():
    assert source_bound(5, 30) == (5, "--max-source-len=5")
    assert source_bound(None, 30)[0] == 30 and source_bound(None, None)[0] == DEFAULT_MAX_SOURCE_LEN


def test_a_bad_max_source_len_is_one_line(m30k_run, capsys):
    code, _, err = run_cli(["translate", m30k_run, "--max-source-len=0", "A dog."], capsys)
    assert_one_line_error(code, err, "--max-source-len=0: must be >= 1")


def test_a_sentence_argument_that_is_not_utf8_is_one_line(m30k_run):
    # Python holds an argument's undecodable bytes as lone surrogates, and passes them on as the bytes
    proc = sparseattn("translate", m30k_run, "A dog.", os.fsdecode(b"caf\xe9 au lait"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr.decode(), proc.stderr.decode()
    assert proc.stderr.decode().strip() == (
        "sparseattn translate: sentence argument 2 is not UTF-8 text (byte 0xe9 at offset 3)"
    )


@pytest.mark.parametrize("command", ["evaluate", "plot", "translate"])
def test_the_run_folder_may_come_first_without_checkpoint(command, copy_run, m30k_run, tmp_path, capsys):
    run = m30k_run if command == "translate" else copy_run
    extra = {"evaluate": ["--json"], "plot": ["--out", tmp_path / "p"], "translate": ["A dog runs."]}[command]
    code, by_position, err = run_cli([command, run, *extra], capsys)
    assert code == 0 and err.startswith(f"{run}: using best.pt"), err
    code, by_flag, _ = run_cli([command, "--checkpoint", run, *extra], capsys)
    assert code == 0 and by_position == by_flag
    code, _, err = run_cli([command, run, "--checkpoint", run, *extra], capsys)
    if command == "translate":  # with --checkpoint every positional argument is a sentence
        assert code == 0
    else:
        assert_one_line_error(code, err, f"give the checkpoint once, as RUN_DIR ({run}) or --checkpoint")
    code, _, err = run_cli([command], capsys)
    assert_one_line_error(code, err, f"no checkpoint given: sparseattn {command} RUN_DIR (or --checkpoint PATH)")
