"""What `sparseattn translate` reads and prints: one output line per input line.

Input lines are split as files are written, on "\\n" only (the "\\r" of a "\\r\\n" dropped):
str.splitlines() also breaks at a lone "\\r", form feeds, U+0085, U+2028 and others, which adds
lines and shifts every later translation against its input. A sentence, from stdin or the command
line, must be UTF-8 text. A source longer than --max-source-len subword tokens is cut to its first
--max-source-len (decoding's memory grows about quadratically with the length) with a warning naming
its line on stderr.
"""

from __future__ import annotations

import sys
from typing import BinaryIO, List, Optional, Sequence, Tuple

# the bound for checkpoints saved before they recorded their longest training source
DEFAULT_MAX_SOURCE_LEN = 256


def split_lines(text: str) -> List[str]:
    """The lines of `text` as a file holds them: split on "\\n" (a "\\r" before it dropped), with no
    empty last line after a final newline."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_lines(stream: BinaryIO) -> List[str]:
    """The lines of a byte stream (stdin); ValueError naming the first byte that is not UTF-8."""
    data = stream.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"standard input is not UTF-8 text (byte {e.object[e.start]:#x} at offset {e.start})"
        ) from None
    return split_lines(text)


def check_arguments(sentences: Sequence[str]) -> None:
    """ValueError naming the first sentence argument that is not UTF-8. Python keeps an argument's
    undecodable bytes as lone surrogates (U+DC80-U+DCFF for bytes 0x80-0xff), which the tokenizer
    rejects with a traceback."""
    for n, sentence in enumerate(sentences, 1):
        try:
            sentence.encode("utf-8")
        except UnicodeEncodeError as e:
            bad = ord(sentence[e.start])
            offset = len(sentence[: e.start].encode("utf-8", "surrogateescape"))
            what = f"byte {bad - 0xDC00:#x}" if 0xDC80 <= bad <= 0xDCFF else f"code point U+{bad:04X}"
            raise ValueError(f"sentence argument {n} is not UTF-8 text ({what} at offset {offset})") from None


def check_max_source_len(given: Optional[int]) -> None:
    """ValueError naming --max-source-len when it is given and below 1."""
    if given is not None and given < 1:
        raise ValueError(f"--max-source-len={given}: must be >= 1")


def source_bound(given: Optional[int], trained: Optional[int]) -> Tuple[int, str]:
    """(bound, where it comes from) of a source's length in subword tokens: --max-source-len when
    given, else the longest source the run trained on (its checkpoint records it), else
    DEFAULT_MAX_SOURCE_LEN."""
    if given is not None:
        return given, f"--max-source-len={given}"
    if trained:
        return trained, f"--max-source-len={trained}, the longest source this run trained on"
    return DEFAULT_MAX_SOURCE_LEN, f"--max-source-len={DEFAULT_MAX_SOURCE_LEN}, the default"


def warn_long(lengths: Sequence[int], bound: int, origin: str, what: str) -> None:
    """One line on stderr per source longer than `bound` subword tokens; `what` names the input:
    "line" (stdin) or "sentence" (arguments), counted from 1."""
    for n, length in enumerate(lengths, 1):
        if length > bound:
            print(
                f"sparseattn translate: {what} {n} has {length} subword tokens; translated its first {bound} "
                f"({origin})",
                file=sys.stderr,
            )


def one_line(text: str) -> str:
    """`text` as one output line: a line break the decoder produced would shift the lines after it."""
    return text.replace("\r", " ").replace("\n", " ")


__all__ = [
    "DEFAULT_MAX_SOURCE_LEN",
    "check_arguments",
    "check_max_source_len",
    "one_line",
    "read_lines",
    "source_bound",
    "split_lines",
    "warn_long",
]
