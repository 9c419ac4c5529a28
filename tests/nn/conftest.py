from .helpers import MAX_ERR


def pytest_terminal_summary(terminalreporter):
    """Print the largest error each comparison in tests/nn saw (for reports)."""
    if MAX_ERR:
        terminalreporter.section("tests/nn: largest |err| per comparison")
        for (what, dtype), err in sorted(MAX_ERR.items()):
            terminalreporter.write_line(f"{what:<32} {dtype:<8} {err:.3g}")
