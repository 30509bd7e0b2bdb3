"""Provider option names are read from the installed onnxruntime-qnn, so new options need no qnnx update."""

from __future__ import annotations

import qnnx_detection


def test_known_provider_options_come_from_the_installed_ep() -> None:
    """The installed EP library's option names are found (2.4-2.7 have these), and no symbol noise gets in."""
    names = qnnx_detection.known_provider_options()
    assert {"htp_performance_mode", "htp_arch", "profiling_level"} <= names
    assert all(n.isascii() and n == n.lower() and " " not in n for n in names)
    assert len(names) < 200
