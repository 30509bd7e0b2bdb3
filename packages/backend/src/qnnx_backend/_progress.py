"""Show that a graph is compiling, and how far it got, while the compile takes long (private).

On a Snapdragon a QNN compile takes seconds to minutes; without a word the user stares at a frozen prompt. Every
compile logs one INFO line when it starts. One that takes longer than a few seconds also reports its stage and the
elapsed time: on a one-line status on stderr when stderr is a terminal (cleared when the compile ends), as INFO log
lines otherwise. ``QNNX_PROGRESS=0`` turns the terminal status off.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator, Mapping

logger = logging.getLogger("qnnx_backend")

FIRST_REPORT_SECONDS = 3.0
EVERY_SECONDS = 5.0
# Stages in compile order, keyed by the timing that ends each one (see _session.py): the stage running is the one
# after the last timing recorded.
_STAGES = (
    ("analyze", "exporting to ONNX"),
    ("export", "checking operators"),
    ("opcheck", "building the QNN session"),
    ("session", "finishing"),
)


def stage(timings: Mapping[str, float]) -> str:
    """What the compile is doing now, read from the timings recorded so far."""
    current = "analyzing the graph"
    for done, following in _STAGES:
        if any(key == done or key.startswith(done + "_") for key in timings):
            current = following
    if "building_part" in timings and "parts" in timings:  # a graph too large for one context
        current = f"building the QNN session, part {int(timings['building_part'])} of {int(timings['parts'])}"
    if "narrow_trial" in timings:  # QNN failed to finalize the graph: finding the part that fails
        current = f"narrowing a QNN graph finalize failure, trial {int(timings['narrow_trial'])}"
    return current


@contextlib.contextmanager
def compile_progress(graph_id: int, timings: Mapping[str, float], shapes: object) -> Iterator[None]:
    """Log the start of graph ``graph_id``'s compile and report its progress until the block ends."""
    logger.info("qnn backend: graph %d: compiling (inputs %s)", graph_id, shapes)
    start = time.perf_counter()
    done = threading.Event()
    terminal = os.environ.get("QNNX_PROGRESS", "1") != "0" and _stderr_is_terminal()
    drawn = False

    def report() -> None:
        nonlocal drawn
        wait = FIRST_REPORT_SECONDS
        while not done.wait(wait):
            wait = EVERY_SECONDS
            text = f"qnn backend: graph {graph_id}: {stage(timings)}, {time.perf_counter() - start:.0f} s"
            if terminal:
                sys.stderr.write("\r" + text.ljust(79))
                sys.stderr.flush()
                drawn = True
            else:
                logger.info("%s", text)

    thread = threading.Thread(target=report, name=f"qnnx-progress-{graph_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        if drawn:
            sys.stderr.write("\r" + " " * 79 + "\r")
            sys.stderr.flush()


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
