"""One benchmark measurement in a fresh process (started by run.py; not meant to be run by hand).

Usage: ``python tools/bench/_child.py '<json spec>' <result.json>``. The spec names the backend (``qnnx``,
``openvino`` or ``inductor``), the phase (``cold``: empty caches; ``warm``: caches left by an earlier cold process),
the model, the batch and the cache directory. The result JSON holds what this one process saw: import times, the
first call of the compiled model, its peak memory, its accuracy against eager PyTorch and, when asked, steady-state
latencies. Nothing is printed on stdout: the QNN simulator and OpenVINO write there on their own.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

_T_START = time.perf_counter()

# --- memory and time marks ------------------------------------------------------------------------------------


def _rss_hwm_kib() -> tuple[int | None, int | None]:
    """Current resident memory and its high-water mark (VmRSS, VmHWM) in KiB, from /proc/self/status."""
    rss = hwm = None
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1])
    except OSError:
        pass
    return rss, hwm


def _reset_peak_rss() -> bool:
    """Reset the kernel's RSS high-water mark (Linux >= 4.0: ``echo 5 > /proc/self/clear_refs``).

    Without it the peak would still be that of ``import torch``, which can be higher than the compile's. The reset
    only lowers VmHWM to the current RSS (no page-table walk): it costs microseconds.
    """
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


# (name, seconds, rss KiB, peak RSS KiB since the previous event). While tracking, each event reads the peak of the
# segment that ends at it and resets the high-water mark, so the peak of any span of the first call is the max over
# the segments inside it, and the peak of the whole call the max over all of them.
_EVENTS: list[tuple[str, float, int | None, int | None]] = []
_TRACKING = [False]
_SEEN: set[str] = set()
_RETURNED: dict[str, Any] = {}  # label -> what the first wrapped call returned
_MISSING_HOOKS: list[str] = []


# Garbage collections during the first call: (start, end) perf_counter seconds. A full collection of a heap that
# holds torch takes 0.1-0.2 s and lands wherever an allocation crosses the collector's threshold, so a stage's
# figure can include one by chance: the report shows them apart.
_GC_PAUSES: list[tuple[float, float]] = []
_GC_STARTED: list[tuple[float, float]] = []
# The same pauses in CPU seconds of the collecting thread, with the generation collected: (start, end, generation).
_GC_PAUSES_CPU: list[tuple[float, float, int]] = []
# CPU seconds of the calling thread at each event of _EVENTS (same order). On 2 cores shared with other jobs,
# wall-clock spans of single-threaded host work grow with the load, its CPU time much less; the thread's (not the
# process's) because the QNN simulator's threads keep spinning after each session and run.
_EVENTS_CPU: list[float] = []


def _gc_callback(phase: str, info: dict[str, Any]) -> None:
    if not _TRACKING[0]:
        return
    if phase == "start":
        _GC_STARTED.append((time.perf_counter(), time.thread_time()))
    elif _GC_STARTED:
        (wall, cpu), now = _GC_STARTED.pop(), time.thread_time()
        _GC_PAUSES.append((wall, time.perf_counter()))
        _GC_PAUSES_CPU.append((cpu, now, int(info.get("generation", -1))))


def _event(name: str) -> None:
    t, cpu = time.perf_counter(), time.thread_time()
    rss = hwm = None
    if _TRACKING[0]:
        rss, hwm = _rss_hwm_kib()
        _reset_peak_rss()
    _EVENTS.append((name, t, rss, hwm))
    _EVENTS_CPU.append(cpu)
    if "importtime" in sys._xoptions:  # marks in -X importtime's stream, so that coldstart.py can place each import
        print(f"@@event {name}", file=sys.stderr, flush=True)


def _wrap(owner: Any, attr: str, label: str) -> None:
    """Replace ``owner.attr`` by a wrapper that records events around its first call (later calls pass through).

    The wrappers add well under a microsecond per call, so the measured path is the real one. They answer what
    CompileReport.timings does not: Dynamo's time before and after the backend is called, the device probe and lazy
    imports that no stage covers, and the memory peak of each stage.
    """
    inner = getattr(owner, attr, None)
    if inner is None:  # the backend changed shape: lose this part of the breakdown, keep the measurement
        _MISSING_HOOKS.append(f"{getattr(owner, '__name__', owner)}.{attr}")
        return

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if label in _SEEN:
            return inner(*args, **kwargs)
        _SEEN.add(label)
        _event(label + "_enter")
        try:
            _RETURNED[label] = result = inner(*args, **kwargs)
            return result
        finally:
            _event(label + "_exit")

    setattr(owner, attr, wrapper)


class _PatchOnImport:
    """A ``sys.meta_path`` finder that applies a patch to a module right after its first import.

    The qnnx packages the compile needs are imported lazily during the first call; importing them earlier to wrap
    their functions would move that import cost out of the figure being measured.
    """

    def __init__(self, patches: dict[str, Any]) -> None:
        self.patches = patches

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in self.patches:
            return None
        import importlib.util

        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        patch = self.patches.pop(name)
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def _install_qnnx_hooks() -> None:
    import qnnx_backend._backend

    # torch resolves the `qnn` entry point to `qnnx_backend._registry:qnn_backend` when torch.compile first looks
    # it up, which is after this patch; that module takes the function from `qnnx_backend._backend` when torch
    # imports it. The other functions are looked up on their module at each call.
    _wrap(qnnx_backend._backend, "qnn_backend", "backend")

    def detection(mod: Any) -> None:
        _wrap(mod, "probe", "probe")
        _wrap(mod, "create_session", "session")

    def export(mod: Any) -> None:
        _wrap(mod, "fingerprint", "fingerprint")
        _wrap(mod, "export", "export")

    patches = {
        "qnnx_backend._compiled": lambda mod: _wrap(getattr(mod, "QnnGraph", None), "_compile", "compile"),
        "qnnx_detection": detection,
        "qnnx_export": export,
        "qnnx_opcheck": lambda mod: _wrap(mod, "check_model", "opcheck"),
    }
    for name in list(patches):
        if name in sys.modules:  # already imported by `import qnnx_backend`: patch now
            patches.pop(name)(sys.modules[name])
    sys.meta_path.insert(0, _PatchOnImport(patches))


class _OpenVinoFallbacks:
    """Collects the messages OpenVINO's torch.compile backend logs (at DEBUG only) when it silently gives up.

    openvino 2026.4 swallows a failed conversion and compiles the graph with Inductor instead, and a failed
    execution switches that partition to eager PyTorch for good; neither raises nor warns. A figure measured after
    such a fallback is not OpenVINO's, so the report marks it.
    """

    def __init__(self) -> None:
        import logging

        self.messages: list[str] = []
        self.partitions: list[dict[str, int]] = []
        collector = self

        class Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                msg = record.getMessage()
                if msg.startswith("Graph module after partitioning"):
                    # The printed forward() of the partitioned graph: each OpenVINO partition is a call of
                    # self.fused_N; an aten op still called directly runs in PyTorch.
                    code = msg.split("def forward", 1)[-1]
                    collector.partitions.append(
                        {"openvino_partitions": code.count("self.fused_"), "pytorch_ops": code.count("torch.ops.")}
                    )
                elif "Failed in OpenVINO" in msg:
                    collector.messages.append("inductor: " + msg[:300])
                elif "Falling back" in msg:
                    collector.messages.append("eager: " + msg[:300])

        log = logging.getLogger("openvino.frontend.pytorch.torchdynamo")
        log.setLevel(logging.DEBUG)
        log.addHandler(Handler(logging.DEBUG))
        log.propagate = False


# --- helpers -----------------------------------------------------------------------------------------------------


def _leaves(out: Any) -> list[Any]:
    import torch

    if hasattr(out, "to_tuple"):  # transformers ModelOutput
        out = out.to_tuple()
    return [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def _accuracy(got: Any, ref: Any) -> dict[str, Any]:
    """max |got - ref| / max |ref| and cosine similarity over all float outputs (worst output counts)."""
    g_leaves, r_leaves = _leaves(got), _leaves(ref)
    if len(g_leaves) != len(r_leaves):
        return {"error": f"{len(g_leaves)} outputs, eager has {len(r_leaves)}"}
    rel_worst, cos_worst = 0.0, 1.0
    for g, r in zip(g_leaves, r_leaves):
        if tuple(g.shape) != tuple(r.shape):
            return {"error": f"output shape {tuple(g.shape)}, eager {tuple(r.shape)}"}
        g64, r64 = g.detach().double().flatten(), r.detach().double().flatten()
        if r64.numel() == 0:
            continue
        scale = r64.abs().max().item()
        err = (g64 - r64).abs().max().item()
        rel = err / scale if scale > 0 else err
        denom = (g64.norm() * r64.norm()).item()
        cos = (g64 @ r64).item() / denom if denom > 0 else (1.0 if err == 0 else 0.0)
        rel_worst, cos_worst = max(rel_worst, rel), min(cos_worst, cos)
    return {"max_rel_err": rel_worst, "cosine": cos_worst}


def _steady(fns: dict[str, Any], budget_s: float, min_iters: int, max_iters: int) -> dict[str, Any]:
    """Per-call latency of each function, measured in blocks: 3 rounds, each a block per function, rotating order.

    Not call-by-call interleaving: right after a QNN simulator run, its 11 threads keep spinning and an eager
    PyTorch call on the 2 cores takes 100x longer (0.5 ms -> 128 ms measured for the CNN), and PyTorch's and
    OpenVINO's thread pools spin after their calls too. So each block starts after a 0.2 s pause and one untimed
    call; rounds with rotating order still spread slow drifts of the machine over all functions.
    """
    warmup: dict[str, float] = {}
    for name, fn in fns.items():
        t = time.perf_counter()
        fn()
        warmup[name] = time.perf_counter() - t
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    rounds = 3
    per_block = budget_s / (rounds * len(fns))
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn = fns[name]
            time.sleep(0.2)
            fn()
            start = time.perf_counter()
            n = 0
            while n < max(1, max_iters // rounds) and (
                n < max(1, -(-min_iters // rounds)) or time.perf_counter() - start < per_block
            ):
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
                n += 1
    return {
        name: {
            "median_ms": statistics.median(v) * 1e3,
            "min_ms": min(v) * 1e3,
            "iters": len(v),
            "second_call_ms": warmup[name] * 1e3,
        }
        for name, v in times.items()
    }


def _host_overhead(call: Any, budget_s: float) -> dict[str, Any] | None:
    """Per-call time the compiled model spends outside ``InferenceSession.run``: Dynamo's guards, qnnx's wrapper,
    the torch <-> numpy conversions.

    Measured call by call as (whole call) - (the session's run inside it), so the simulator's slow and noisy run
    cancels out; on a Snapdragon, where a run takes about a millisecond, this overhead is what decides the
    compiled/raw ratio.
    """
    variant = _RETURNED.get("compile")
    program = getattr(getattr(variant, "inner", variant), "_program", None)
    if program is None:
        return None
    session = program.session
    inner = session.run
    runs: list[float] = []
    _last_feed: list[Any] = []

    def timed_run(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        if not _last_feed:
            _last_feed.append(args[1] if len(args) > 1 else kwargs.get("input_feed"))
        try:
            return inner(*args, **kwargs)
        finally:
            runs.append(time.perf_counter() - t)

    session.run = timed_run
    in_situ: list[float] = []
    stubbed: list[float] = []
    try:
        start = time.perf_counter()
        while len(in_situ) < 200 and (len(in_situ) < 5 or time.perf_counter() - start < budget_s / 2):
            t = time.perf_counter()
            call()
            total = time.perf_counter() - t
            in_situ.append(total - runs[-1])
        # The same with run() answered instantly from its last outputs: the host-side cost alone, without the
        # simulator's threads competing with Python for the 2 cores right after each run.
        last = inner(None, _last_feed[0]) if _last_feed else None
        if last is not None:
            session.run = lambda *args, **kwargs: last
            time.sleep(0.5)  # let the simulator's threads go idle: this figure is Python's alone
            for _ in range(20):
                call()
            start = time.perf_counter()
            while len(stubbed) < 5000 and (len(stubbed) < 50 or time.perf_counter() - start < budget_s / 2):
                t = time.perf_counter()
                call()
                stubbed.append(time.perf_counter() - t)
    finally:
        del session.run  # back to the class's method

    def stats(v: list[float]) -> dict[str, Any] | None:
        return {"median_us": statistics.median(v) * 1e6, "min_us": min(v) * 1e6, "calls": len(v)} if v else None

    return {"in_situ": stats(in_situ), "run_stubbed": stats(stubbed)}


def _ctx_models(cache_dir: Path) -> list[Path]:
    """The published ``model_ctx.onnx`` files of a qnnx context cache (staging, quarantine and trash excluded)."""
    return sorted(p for p in cache_dir.rglob("model_ctx.onnx") if "entries" in p.parts)


def _raw_session_fn(cache_dir: Path, inputs: tuple[Any, ...], soc_model: int) -> tuple[Any, dict[str, Any]]:
    """A callable running ``InferenceSession.run`` on the cached compiled context with pre-built numpy inputs."""
    import numpy as np

    import qnnx_detection

    ctx = _ctx_models(cache_dir)
    if len(ctx) != 1:
        return None, {"raw_ort": f"n/a: {len(ctx)} compiled contexts in the cache (one per Dynamo graph)"}
    session = qnnx_detection.create_session(str(ctx[0]), "npu", soc_model=soc_model)
    types = {
        "tensor(float)": np.float32,
        "tensor(float16)": np.float16,
        "tensor(int64)": np.int64,
        "tensor(int32)": np.int32,
    }
    sess_inputs = session.get_inputs()
    tensors = [t for t in inputs if hasattr(t, "numpy")]
    if len(sess_inputs) != len(tensors):
        return None, {"raw_ort": f"n/a: the context has {len(sess_inputs)} inputs, the model {len(tensors)}"}
    feed = {}
    for meta, tensor in zip(sess_inputs, tensors):
        array = tensor.numpy()
        want = types.get(meta.type)
        feed[meta.name] = array.astype(want) if want is not None and array.dtype != want else array
    names = [o.name for o in session.get_outputs()]

    def run() -> Any:
        return session.run(names, feed)

    return run, {"raw_ort_context": str(ctx[0].relative_to(cache_dir)), "raw_ort_inputs": list(feed)}


def _ort_qnn_alone(model: Any, inputs: tuple[Any, ...], folder: Path) -> Any:
    """ONNX Runtime and QNN alone on the ONNX model qnnx exports for ``model``: the floor of any backend built on them.

    The model is traced and exported (with the weights in ``model.onnx.data``, as the backend writes them) *before*
    the measured call; the measured call is what is left: loading the QNN libraries, creating the QNN session (graph
    finalization, writing the compiled context, as a cache miss does) and its first run.
    """
    import numpy as np
    import torch

    import qnnx_detection
    import qnnx_export

    graphs: list[Any] = []

    def record(gm: Any, example_inputs: list[Any]) -> Any:
        graphs.append(qnnx_export.export(gm, example_inputs))
        return gm.forward

    with torch.no_grad():
        torch.compile(model, backend=record)(*inputs)
    if len(graphs) != 1:
        raise RuntimeError(f"{len(graphs)} Dynamo graphs; the ORT-alone measurement needs one")
    exported = graphs[0]
    folder.mkdir(parents=True, exist_ok=True)
    path = exported.save(folder / "model.onnx", external_data=True)
    # Registers the EP (imports onnxruntime) but initializes no QNN backend: loading the QNN libraries is part of
    # the measured call, as in a cold qnnx call (it is most of the fixed memory cost).
    qnnx_detection.probe(initialize=False)
    feed = {}
    user = [t for t in inputs if hasattr(t, "numpy")]  # the model's inputs, in order: the graph's user inputs
    for spec, tensor in zip(exported.signature.inputs, user, strict=True):
        feed[spec.name] = tensor.numpy().astype(np.dtype(spec.onnx_dtype))
    ctx = {
        "ep.context_enable": "1",
        "ep.context_file_path": str(folder / "model_ctx.onnx"),
        "ep.context_embed_mode": "0",
    }

    def first_call(*_: Any) -> Any:
        session = qnnx_detection.create_session(str(path), "npu", soc_model=60, session_config=ctx)
        outs = session.run(None, feed)
        return [torch.from_numpy(o) for o in outs]

    return first_call


def _aot_save(res: dict[str, Any], model: Any, inputs: tuple[Any, ...], ref: Any, folder: Path) -> dict[str, Any]:
    """The saving process of the AOT warm start: ``aot_compile`` of the model's forward, its first call (the QNN
    compile), ``save_compiled_function``; its outputs are kept for the loading process to compare with."""
    import _models
    import torch

    options: dict[str, Any] = {"device": "npu", "strict": True, "soc_model": 60, "cache": False}
    folder.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():  # the saved guards check the grad mode: the loading process calls under no_grad too
        t0 = time.perf_counter()
        try:
            compiled = torch.compile(_models.call, backend="qnn", fullgraph=True, options=dict(options)).aot_compile(
                ((model, *inputs), {})
            )
        except torch._dynamo.exc.PackageError as exc:
            # torch 2.13 keeps guards whose derived checks it cannot save (transformers' BERT: the code object of a
            # decorator's wrapper, the GELU builtin) and then refuses to save them. A user passes a guard filter
            # that drops them, as here; the loaded function then does not check that code (see the report).
            res["aot_dropped_guards"] = f"{exc}"
            options["guard_filter_fn"] = _serializable_guards
            t0 = time.perf_counter()
            compiled = torch.compile(_models.call, backend="qnn", fullgraph=True, options=options).aot_compile(
                ((model, *inputs), {})
            )
        t1 = time.perf_counter()
        out = compiled(model, *inputs)
        t2 = time.perf_counter()
        compiled.save_compiled_function(str(folder / "model.qnnx"))
        t3 = time.perf_counter()
    torch.save(_leaves(out), folder / "outputs.pt")
    res.update(
        aot_compile_s=t1 - t0,
        first_call_s=t2 - t1,
        save_s=t3 - t2,
        aot_file_bytes=(folder / "model.qnnx").stat().st_size,
        accuracy=_accuracy(out, ref),
        process_s=time.perf_counter() - _T_START,
    )
    return res


def _serializable_guards(entries: Any) -> list[bool]:
    """A ``guard_filter_fn`` that keeps every guard torch can save: not global, and neither it nor a check it
    derives is of a type ``aot_compile`` cannot serialize (torch 2.13's own filter looks at the first only)."""
    from torch._dynamo.guards import CheckFunctionManager

    bad = set(CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES)
    return [not (e.is_global or e.guard_type in bad or bad.intersection(e.derived_guard_types or ())) for e in entries]


def _aot_loader(model: Any, path: Path) -> tuple[Any, list[Any]]:
    """The measured call of the AOT warm start: ``torch.compiler.load_compiled_function`` and the first call of what it
    returns (the loaded function, for later calls, is appended to the list)."""
    import torch

    loaded: list[Any] = []

    def load_and_call(*inputs: Any) -> Any:
        with open(path, "rb") as fh:
            fn = torch.compiler.load_compiled_function(fh)
        _event("aot_loaded")
        loaded.append(lambda *args: fn(model, *args))
        return fn(model, *inputs)

    return load_and_call, loaded


def _same_outputs(got: Any, saved: list[Any]) -> dict[str, Any]:
    """Whether the loaded function's outputs are bit-identical to those of the process that compiled and saved it."""
    leaves = _leaves(got)
    if len(leaves) != len(saved):
        return {"identical": False, "error": f"{len(leaves)} outputs, the saving process had {len(saved)}"}
    diff = max(((a.double() - b.double()).abs().max().item() for a, b in zip(leaves, saved) if a.numel()), default=0.0)
    same = all(a.shape == b.shape and a.dtype == b.dtype and bool((a == b).all()) for a, b in zip(leaves, saved))
    return {"identical": same, "max_abs_diff": diff}


# --- the measurement -----------------------------------------------------------------------------------------------


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    res: dict[str, Any] = {"spec": spec, "loadavg": os.getloadavg()}
    kind = spec["backend"]
    imports: dict[str, float] = {}
    res["imports_s"] = imports

    t = time.perf_counter()
    import torch

    imports["torch"] = time.perf_counter() - t
    t = time.perf_counter()
    import torch._dynamo  # torch.compile and load_compiled_function import it before any call: not in a figure

    imports["torch._dynamo"] = time.perf_counter() - t
    if kind == "qnnx":
        t = time.perf_counter()
        import qnnx_backend

        imports["qnnx_backend"] = time.perf_counter() - t
        _install_qnnx_hooks()
    elif kind == "openvino":
        t = time.perf_counter()
        import openvino.torch  # noqa: F401  (registers backend="openvino")

        imports["openvino.torch"] = time.perf_counter() - t
        ov_fallbacks = _OpenVinoFallbacks()

    sys.path.insert(0, str(Path(__file__).parent))
    import _models

    model, inputs = _models.build(spec["model"], spec["batch"])
    res["weight_bytes"] = _models.weight_bytes(model)
    with torch.no_grad():
        ref = model(*inputs)

    aot = spec["variant"] == "qnnx-aot"
    if aot and spec["phase"] == "save":
        return _aot_save(res, model, inputs, ref, Path(spec["cache_dir"]))
    if aot:
        compiled, loaded = _aot_loader(model, Path(spec["cache_dir"]) / "model.qnnx")
    elif kind == "qnnx":
        options = {"device": "npu", "strict": True, "cache": True, "cache_dir": spec["cache_dir"], "soc_model": 60}
        compiled = torch.compile(model, backend="qnn", options=options)
    elif kind == "openvino":
        options = {"device": "CPU"}
        if spec["variant"] == "openvino-aot":  # run.py's retry after the default options failed
            options["aot_autograd"] = True
        if spec.get("cache_dir"):
            options.update({"model_caching": True, "cache_dir": spec["cache_dir"]})
        compiled = torch.compile(model, backend="openvino", options=options)
    elif kind == "inductor":
        compiled = torch.compile(model)  # cache location: TORCHINDUCTOR_CACHE_DIR, set by run.py
    elif kind == "ortqnn":
        compiled = _ort_qnn_alone(model, inputs, Path(spec["cache_dir"]))
    else:
        raise ValueError(f"backend {kind!r} is not one of qnnx, openvino, inductor, ortqnn")

    _TRACKING[0] = _reset_peak_rss()
    res["peak_reset"] = _TRACKING[0]
    res["maxrss_before_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    import gc

    profiler = None
    if spec.get(
        "profile"
    ):  # coldstart.py --profile: cProfile of the first call (its figures then include cProfile's cost)
        import cProfile

        profiler = cProfile.Profile()
    gc.callbacks.append(_gc_callback)
    with torch.no_grad():
        _event("call_start")
        if profiler is not None:
            profiler.enable()
        out = compiled(*inputs)
        if profiler is not None:
            profiler.disable()
        _event("call_end")
    _TRACKING[0] = False
    if profiler is not None:
        profiler.dump_stats(spec["profile"])
    gc.callbacks.remove(_gc_callback)
    t0 = _EVENTS[0][1]
    res["first_call_s"] = _EVENTS[-1][1] - t0
    res["events"] = [(name, t - t0, rss, hwm) for name, t, rss, hwm in _EVENTS]
    res["gc_pauses"] = [(a - t0, b - t0) for a, b in _GC_PAUSES]
    c0 = _EVENTS_CPU[0]
    res["events_cpu"] = [(name, c - c0) for (name, *_), c in zip(_EVENTS, _EVENTS_CPU, strict=True)]
    res["gc_pauses_cpu"] = [(a - c0, b - c0, gen) for a, b, gen in _GC_PAUSES_CPU]
    res["maxrss_after_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    base = _EVENTS[0][2]
    if res["peak_reset"] and base is not None:
        res["rss_baseline_kib"] = base
        res["peak_kib"] = max(hwm for _, _, _, hwm in _EVENTS[1:] if hwm is not None)
    else:  # no /proc/self/clear_refs: ru_maxrss, which may still hold an earlier (import) peak
        res["rss_baseline_kib"] = res["maxrss_before_kib"]
        res["peak_kib"] = res["maxrss_after_kib"]
    res["peak_delta_bytes"] = (res["peak_kib"] - res["rss_baseline_kib"]) * 1024
    gc.collect()
    res["rss_after_gc_kib"] = _rss_hwm_kib()[0]
    res["accuracy"] = _accuracy(out, ref)
    if aot:
        res["aot_file_bytes"] = (Path(spec["cache_dir"]) / "model.qnnx").stat().st_size
        res["aot_vs_saver"] = _same_outputs(out, torch.load(Path(spec["cache_dir"]) / "outputs.pt"))
        compiled = loaded[0]

    if kind == "qnnx":
        reports = qnnx_backend.compile_reports()
        res["graphs"] = [
            {
                "device": r.device,
                "cache": r.cache,
                "onnx_nodes": r.onnx_nodes,
                "timings": dict(r.timings),
                "reason": r.reason,
                "attempts": [a.reason for a in r.attempts if not a.ok],
            }
            for r in reports
        ]
        import qnnx_detection

        v = qnnx_detection.probe(initialize=False).versions
        res["missing_hooks"] = list(_MISSING_HOOKS)
        res["qnn_versions"] = {"onnxruntime-qnn": str(v.onnxruntime_qnn), "qairt": str(v.qairt)}
    elif kind == "openvino":
        res["fallback"] = list(ov_fallbacks.messages)
        res["ov_partitions"] = list(ov_fallbacks.partitions)
    elif kind == "inductor":
        import torch._inductor.metrics

        # 0 on a cold compile means Inductor generated no code: the graph is only calls of external kernels.
        res["inductor_kernels"] = int(torch._inductor.metrics.generated_kernel_count)
    res["dynamo_graphs"] = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])

    if spec.get("steady"):
        with torch.no_grad():
            fns: dict[str, Any] = {"compiled": lambda: compiled(*inputs), "eager": lambda: model(*inputs)}
            if kind == "qnnx":
                raw, info = _raw_session_fn(Path(spec["cache_dir"]), inputs, 60)
                res.update(info)
                if raw is not None:
                    fns["raw_ort"] = raw
                    raw_out = [torch.from_numpy(o) for o in raw()]
                    res["raw_vs_compiled"] = _accuracy(raw_out, _leaves(compiled(*inputs)))
            res["steady"] = _steady(fns, spec["steady_budget_s"], spec["steady_min_iters"], spec["steady_max_iters"])
            if kind == "qnnx":
                res["host_overhead"] = _host_overhead(lambda: compiled(*inputs), spec["steady_budget_s"])
        if kind == "openvino":
            res["fallback"] = list(ov_fallbacks.messages)
    res["process_s"] = time.perf_counter() - _T_START
    return res


def main() -> int:
    spec = json.loads(sys.argv[1])
    result_path = Path(sys.argv[2])
    try:
        res = measure(spec)
        res["ok"] = True
    except BaseException as exc:  # the parent records any failure as a result
        res = {
            "spec": spec,
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}"[:2000],
            "trace": traceback.format_exc(),
        }
    result_path.write_text(json.dumps(res, indent=1, default=str))
    # os._exit: skip interpreter teardown, which with the QNN simulator's threads can take seconds or hang; the
    # result is already on disk.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
