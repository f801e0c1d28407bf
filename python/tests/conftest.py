"""Shared pytest setup: say which flashattn is under test, and count the skips loudly."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # the oracle module `reference`

import flashattn  # noqa: E402


def _torch_status():
    try:
        import torch
    except ImportError:
        return None, "absent (torch tests skip)"
    cuda = torch.cuda.is_available()
    return torch, f"{torch.__version__}, CUDA device {'present' if cuda else 'absent'}"


def pytest_report_header(config):
    _, torch_line = _torch_status()
    return [
        f"flashattn {flashattn.__version__} from {os.path.dirname(flashattn.__file__)}",
        f"flashattn CUDA backend usable: {flashattn.cuda_available()}",
        f"torch: {torch_line}",
    ]


def pytest_configure(config):
    # Under CTest the package must come from the build tree, never a stale install.
    expected = os.environ.get("FLASHATTN_EXPECT_BUILD_DIR")
    if expected:
        actual = os.path.dirname(os.path.abspath(flashattn.__file__))
        if os.path.realpath(actual) != os.path.realpath(expected):
            raise pytest.UsageError(f"flashattn imported from {actual}, expected the build tree's {expected}")


def pytest_terminal_summary(terminalreporter):
    skipped = terminalreporter.stats.get("skipped", [])
    if skipped:
        terminalreporter.write_line(
            f"flashattn: {len(skipped)} test(s) SKIPPED (see the reasons above: no torch and/or no GPU here)",
            yellow=True,
        )
