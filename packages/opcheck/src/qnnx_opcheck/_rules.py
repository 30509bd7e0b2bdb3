"""The checker: one verdict per node from the table entry, the node's dtypes/ranks/attributes and the
multi-node patterns the table lists.

The order of the table-wide rules is here (:meth:`Checker._decide`); the checker delegates to collaborators
grouped by theme: QDQ (``_qdq``), the table's patterns (``_patterns``, whose matchers register themselves in
``PATTERN_RULES``, on the value analysis of ``_values``), measured conditions (``_conditions``), all reading the
graph through one ``GraphView`` (``_view``).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from qnnx_opcheck._conditions import Conditions
from qnnx_opcheck._control import CONTROL_FLOW_MEASURED, branch_model, outer_reads
from qnnx_opcheck._model import GraphFacts, NodeView, read_facts
from qnnx_opcheck._outcomes import KIND_STATUS, Decision, cell_decision
from qnnx_opcheck._patterns import PATTERN_RULES, Patterns
from qnnx_opcheck._qdq import QdqRules
from qnnx_opcheck._report import NodeVerdict
from qnnx_opcheck._shapes import fix_flags
from qnnx_opcheck._tables import OpTable
from qnnx_opcheck._values import ValueAnalysis
from qnnx_opcheck._view import FLOATS, QDQ_DOMAINS, GraphView

__all__ = ["Checker"]

_log = logging.getLogger("qnnx_opcheck._check")  # the checker's warnings keep the name they always had


class Checker:
    """The verdicts of one graph's nodes against one table, with the rules of each theme in a collaborator."""

    def __init__(self, table: OpTable, facts: GraphFacts, *, outputs_range_checked: bool = False) -> None:
        self.view = GraphView(table, facts)
        self.t = table
        self.f = facts
        self.patterns = Patterns(self.view, ValueAnalysis(self.view), outputs_range_checked)
        self.conditions = Conditions(self.view)
        self.qdq = QdqRules(self.view)
        self._table_dtypes: frozenset[str] | None = None  # every dtype some cell of the table holds, on first use
        self._sources: dict[str, frozenset[str]] | None = None  # graph inputs reaching each value, on first use

    def verdicts(self) -> list[NodeVerdict]:
        out = []
        for i, node in enumerate(self.f.nodes):
            try:
                verdict = self._verdict(i, node)
                out.append(verdict)
                self.view.kinds[i] = verdict.kind
            except Exception as exc:  # never let one odd node break the whole check
                _log.warning("could not check node %s (%s): %s", node.name, node.op_type, exc)
                out.append(
                    NodeVerdict(
                        node_name=node.name or f"n{i}",
                        op_type=node.op_type,
                        domain=node.domain,
                        status="hazard",
                        kind="unknown_dtype",
                        reason=f"opcheck could not evaluate this node ({type(exc).__name__}: {exc})",
                    )
                )
        return self.qdq.with_node_units(out)

    def _verdict(self, index: int, node: NodeView) -> NodeVerdict:
        name = node.name or f"n{index}"
        domain = node.domain
        kind, reason, evidence, dtype = self._decide(index, node, domain)
        return NodeVerdict(
            node_name=name,
            op_type=node.op_type,
            domain=domain,
            status=KIND_STATUS.get(kind, "unsupported"),  # type: ignore[arg-type]
            reason=reason,
            evidence=evidence,
            dtype=dtype,
            kind=kind,
        )

    def _decide(self, index: int, node: NodeView, domain: str) -> Decision:
        p = self.view.pattern("constant_folded")
        # Constant nodes become initializers when onnxruntime loads the graph, wherever their output goes.
        if (
            p is not None
            and domain == ""
            and (node.op_type == "Constant" or (node.output and all(o in self.f.constants for o in node.output if o)))
        ):
            return "constant_folded", p["reason"], p.get("evidence"), None
        p = self.view.pattern("dropout_removed")
        if p is not None and node.op_type == "Dropout" and domain == "":
            mask = node.output[1] if len(node.output) > 1 else ""
            if (not mask or (mask not in self.f.consumers and mask not in self.f.graph_outputs)) and self._removable(
                node
            ):
                return "removed", p["reason"], p.get("evidence"), None

        p = self.view.pattern("qdq_constant_dequantize")
        if (
            p is not None
            and node.op_type == "DequantizeLinear"
            and domain in QDQ_DOMAINS
            and self.view.is_const(node.input[0])
        ):
            short = self.view.pattern("partial_weight_block")
            if short is not None and self.patterns.is_partial_weight_block(index, node):
                return short["kind"], short["reason"], short.get("evidence"), self.view.dtype(node.input[0])
            return "fused", p["reason"], p.get("evidence"), self.view.dtype(node.input[0])

        if domain == "" and node.op_type in ("If", "Loop", "Scan") and self._control_flow_measured():
            return self._control_flow(node)
        kind, reason, evidence, dtype = self._op_decision(node, domain)

        if node.op_type == "Erf" and kind != "supported":
            gelu = self.patterns.gelu_structure(node)
            p = self.view.pattern("erf_gelu_fusion")
            if p is not None and gelu is True:
                return "fused", p["reason"], p.get("evidence"), dtype
            wrong = self.view.pattern("erf_gelu_wrong_constants")
            if wrong is not None and gelu is False:
                return wrong["kind"], wrong["reason"], wrong.get("evidence"), dtype
        if KIND_STATUS.get(kind) == "unsupported":
            return kind, reason, evidence, dtype
        p = self.view.pattern("dynamic_shape")
        if p is not None and not self.f.symbolic_inputs and self.patterns.dynamic_value(node) is not None:
            # Every graph input is static, yet shape inference (with constant folding) left a dim unknown here:
            # onnxruntime's own inference may resolve it, so this is not a refusal, but opcheck cannot vouch for it.
            # A refusal that holds whatever the shapes (a runtime parameter the EP declines: CenterCropPad's Pad by
            # pads computed from a graph input) still decides.
            refusal = self._shape_free_refusal(index, node, dtype)
            if refusal is not None:
                return refusal
            name, shape = self.patterns.dynamic_value(node) or ("", ())
            return (
                "unknown_shape",
                f"opcheck could not infer a static shape for '{name}' ({list(shape)}) although every graph input is "
                f"static; QNN needs static shapes, so this node is unverified (check it with the live EP)",
                p.get("evidence"),
                dtype,
            )
        if p is not None and self.f.symbolic_inputs:
            dyn = self.patterns.dynamic_value(node)
            if dyn is not None:
                fix = self._shape_fix(dyn[1], node)
                text = f"{p['reason']} (value '{dyn[0]}' has shape {list(dyn[1])})"
                return p["kind"], text + (f"; fix: {fix}" if fix else ""), p.get("evidence"), dtype
        p = self.view.pattern("rank_limit")
        if p is not None:
            big = self.patterns.over_rank(node, int(p["max_rank"]))
            if big is not None:
                return p["kind"], f"{p['reason']} ('{big[0]}' has rank {big[1]})", p.get("evidence"), dtype
        p = self.view.pattern("empty_tensor")
        if p is not None and self.patterns.touches_empty(node):
            return p["kind"], p["reason"], p.get("evidence"), dtype
        measured = self.conditions.measured(node)
        if measured is not None:
            return measured[0], measured[1], measured[2], dtype
        for rule in PATTERN_RULES:
            p = self.view.pattern(rule.pattern)
            if p is not None and node.op_type in p.get("ops", ()) and rule.matcher(self.patterns, index, node):
                return p["kind"], p["reason"] + (f" Fix: {p['fix']}" if p.get("fix") else ""), p.get("evidence"), dtype
        condition = self.patterns.node_condition(node)
        if condition is not None:
            return condition[0], condition[1], condition[2], dtype
        if kind == "supported":
            p = self.view.pattern("int64_saturation")
            ops = p.get("ops", ()) if p is not None else ()
            if p is not None and dtype == "int64" and ("*" in ops or node.op_type in ops):
                return "caveat", p["reason"], p.get("evidence"), dtype
        return kind, reason, evidence, dtype

    def _shape_free_refusal(self, index: int, node: NodeView, dtype: str | None) -> Decision | None:
        """The refusals that hold although an output shape is unknown: runtime parameters the EP takes only as
        constants (the ``runtime_parameters`` pattern and the node conditions on runtime or given inputs), and a
        condition class measured wrong, refused or crashing."""
        for rule in PATTERN_RULES:
            p = self.view.pattern(rule.pattern) if rule.pattern == "runtime_parameters" else None
            if p is not None and node.op_type in p.get("ops", ()) and rule.matcher(self.patterns, index, node):
                return p["kind"], p["reason"], p.get("evidence"), dtype
        condition = self.patterns.node_condition(node, shape_free=True)
        if condition is not None and KIND_STATUS.get(condition[0]) == "unsupported":
            return condition[0], condition[1], condition[2], dtype
        measured = self.conditions.measured(node)  # a class measured not right (ArrayFeatureExtractor by scalar
        # indices: the output's last dim is unknown to ONNX's inference, and the EP refuses it)
        if measured is not None and measured[0] != "unknown_op" and KIND_STATUS.get(measured[0]) == "unsupported":
            return measured[0], measured[1], measured[2], dtype
        return None

    def _removable(self, node: NodeView) -> bool:
        """Whether onnxruntime can take the Dropout out of the graph: not in training mode (a training_mode input
        that is not a constant false), and not between a graph input (or initializer) and a graph output, which it
        cannot join. Such a Dropout stays, and the QNN EP declines it (node tests: test_dropout_default,
        test_training_dropout)."""
        import numpy as np

        if len(node.input) > 2 and node.input[2]:
            value = self.view.const_value(node.input[2])
            if value is None or bool(np.asarray(value).any()):
                return False
        data = node.input[0] if node.input else ""
        return not (node.output[0] in self.f.graph_outputs and data not in self.f.producers)

    def _shape_fix(self, shape: tuple[Any, ...], node: NodeView) -> str:
        """The opcheck flags that would make this node's shapes static: the input dims its symbolic shape names,
        else every symbolic dim of the graph inputs it depends on."""
        dims_by_input = self.f.symbolic_inputs
        known = {d for dims in dims_by_input.values() for d in dims if d != "?"}
        words = [set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", d)) if isinstance(d, str) else set() for d in shape]
        named = {w for ws in words for w in ws} & known
        explained = all(isinstance(d, int) or (ws & known) for d, ws in zip(shape, words, strict=True))
        if named and explained:
            return fix_flags({"": tuple(sorted(named))})
        # A dim shape inference named itself ('unk__0') or left unnamed: every symbolic dim upstream may be the cause.
        sources = self._symbolic_sources(node)
        upstream = {k: v for k, v in dims_by_input.items() if k in sources}
        return fix_flags(upstream) if upstream else fix_flags({"": tuple(sorted(named))})

    def _symbolic_sources(self, node: NodeView) -> frozenset[str]:
        """The graph inputs with symbolic dims that reach the node (one forward pass over the graph, cached)."""
        cache = self._sources
        if cache is None:
            cache = {name: frozenset([name]) for name in self.f.symbolic_inputs}
            for n in self.f.nodes:
                reach = frozenset().union(*(cache.get(i, frozenset()) for i in n.input if i))
                if reach:
                    for o in n.output:
                        cache[o] = reach
            self._sources = cache
        return frozenset().union(*(cache.get(i, frozenset()) for i in node.input if i))

    def _control_flow_measured(self) -> bool:
        return self.t.backend == "htp" and self.t.onnxruntime_qnn in CONTROL_FLOW_MEASURED

    def _control_flow(self, node: NodeView) -> Decision:
        """If: as good as its branches (the QNN EP runs it when every branch node is supported). Loop, Scan: the CPU
        EP runs them (measured, see ``_control``)."""
        where = f"onnxruntime-qnn {self.t.onnxruntime_qnn}, measured on the HTP simulator"
        if node.op_type != "If":
            return (
                "rejected",
                f"the QNN EP does not take {node.op_type}: ONNX Runtime runs it and its body on the CPU EP, and a "
                f"session with session.disable_cpu_ep_fallback=1 fails ({where}). Fix: unroll it at export "
                f"(a static trip count) if the model must run whole on QNN",
                None,
                None,
            )
        outer = {vi.name: vi for vi in [*self.f.model.graph.input, *self.f.model.graph.value_info]}
        outer.update({vi.name: vi for vi in self.f.model.graph.output})
        inits = {t.name: t for t in self.f.model.graph.initializer}
        bad: list[str] = []
        caveats: list[str] = []
        for attr in node.attribute:
            if attr.name not in ("then_branch", "else_branch"):
                continue
            outer_constants = sorted(outer_reads(attr.g) & self.f.constants)
            if outer_constants:
                names = ", ".join(outer_constants[:3]) + (", ..." if len(outer_constants) > 3 else "")
                return (
                    "rejected",
                    f"its {attr.name} reads initializers of the enclosing graph ({names}): the QNN EP then declines "
                    f"the If, and ONNX Runtime runs it and both branches on the CPU EP; a session with CPU fallback "
                    f"disabled fails ({where}). Fix: re-export with each branch's weights inside the branch, or "
                    f"without the If",
                    None,
                    None,
                )
            sub = branch_model(self.f.model, attr.g, outer, inits)
            report = Checker(self.t, read_facts(sub, (), f"the {attr.name}")).verdicts()
            bad += [f"{attr.name} {v.op_type} '{v.node_name}': {v.reason}" for v in report if v.status == "unsupported"]
            caveats += [f"{attr.name} {v.op_type} '{v.node_name}'" for v in report if v.status == "hazard"]
        if bad:
            return (
                "rejected",
                f"a branch node is unsupported ({'; '.join(bad[:3])}{'; ...' if len(bad) > 3 else ''}): ONNX Runtime "
                f"then runs this If and both branches on the CPU EP, and a session with CPU fallback disabled fails "
                f"({where})",
                None,
                None,
            )
        if caveats:
            return "caveat", f"the QNN EP runs this If; branch nodes with a caveat: {', '.join(caveats)}", None, None
        return (
            "supported",
            f"the QNN EP runs this If, and every node of both branches is supported ({where})",
            None,
            None,
        )

    def _op_decision(self, node: NodeView, domain: str) -> Decision:
        entry = self.t.entry(domain, node.op_type)
        where = f"QNN {self.t.backend} table (onnxruntime-qnn {self.t.onnxruntime_qnn})"
        if entry is None:
            op = node.op_type if not domain else f"{domain}::{node.op_type}"
            why = (
                "it was not probed, so opcheck cannot vouch for it"
                if not domain
                else f"the QNN EP takes only the {domain} ops the table lists"
            )
            return "unknown_op", f"{op} is not in the {where}: {why}", None, None
        lo, hi = entry.get("opset", [1, None])
        opset = self.f.opsets.get(domain)
        if opset is not None and (opset < lo or (hi is not None and opset > hi)):
            return (
                "unknown_op",
                f"{node.op_type} at opset {opset} is outside the opsets the {where} covers ({lo}..{hi or 'latest'})",
                entry.get("evidence"),
                None,
            )
        dtype, qdq = self._dtype_keys(node, entry)
        foreign = self._foreign_dtype(node)
        if foreign is not None:
            return (
                "unlisted_dtype",
                f"{node.op_type} has a {foreign[1]} value ('{foreign[0]}'): no QNN {self.t.backend} table cell holds "
                f"that type, and the QNN EP cannot map it to a QNN data type",
                entry.get("evidence"),
                dtype,
            )
        variants = [v for v in entry["variants"] if self._matches(v.get("when", {}), node)]
        if not variants:
            return "unknown_op", f"no {where} entry matches this {node.op_type} node", entry.get("evidence"), dtype
        if dtype is None:
            return self._unknown_dtype(node, variants[0], entry)
        if qdq is not None:
            decided = self.qdq.decision(node, variants, qdq, entry)
            if decided is not None:
                return decided
        for v in variants:
            cell = v["dtypes"].get(dtype)
            if cell is not None:
                return cell_decision(node, v, dtype, cell, entry)
        allowed = sorted(k for k, c in variants[0]["dtypes"].items() if c["status"] == "supported")
        return (
            "unlisted_dtype",
            f"{node.op_type} on {dtype} is not in the {where}; supported dtypes: {', '.join(allowed) or 'none'}",
            entry.get("evidence"),
            dtype,
        )

    def _foreign_dtype(self, node: NodeView) -> tuple[str, str] | None:
        """(value, dtype) of an input or output whose known type no cell of the table holds (float8, int2...)."""
        if self._table_dtypes is None:
            keys: set[str] = set()
            for e in self.t.ops.values():
                for v in e["variants"]:
                    for k in v["dtypes"]:
                        keys.update(part.removeprefix("qdq_").removeprefix("w=") for part in k.split("/"))
            self._table_dtypes = frozenset(keys)
        for name in (*node.input, *node.output):
            dtype = self.view.dtype(name) if name else None
            if dtype is not None and dtype not in self._table_dtypes:
                return name, dtype
        return None

    def _unknown_dtype(self, node: NodeView, variant: dict[str, Any], entry: dict[str, Any]) -> Decision:
        cells = {k: c["status"] for k, c in variant["dtypes"].items() if not k.startswith("qdq_")}
        ok = sorted(k for k, s in cells.items() if s == "supported")
        evidence = variant.get("evidence") or entry.get("evidence")
        if cells and len(ok) == len(cells):
            return "supported", None, evidence, None
        if not ok:
            return (
                "rejected",
                f"{node.op_type} is not supported by QNN {self.t.backend} for any dtype in the table "
                f"(input dtype unknown)",
                evidence,
                None,
            )
        return (
            "unknown_dtype",
            f"input dtype unknown (shape inference could not type it); QNN {self.t.backend} takes "
            f"{node.op_type} only for {', '.join(ok)}",
            evidence,
            None,
        )

    def _matches(self, when: dict[str, Any], node: NodeView) -> bool:
        for key, arg in when.items():
            if key == "rank" or key == "output_rank":
                shape = self.view.shape(node.input[0] if key == "rank" else node.output[0])
                if shape is None or not (arg[0] <= len(shape) <= arg[1]):
                    return False
            elif key == "attr":
                for name, allowed in arg.items():
                    if self.view.attr(node, name) not in allowed:
                        return False
            elif key == "const_inputs":
                if not all(i < len(node.input) and self.view.is_static(node.input[i]) for i in arg):
                    return False
            elif key == "dynamic_inputs":
                if not all(
                    i < len(node.input) and node.input[i] and not self.view.is_static(node.input[i]) for i in arg
                ):
                    return False
            elif key == "input_dtype":
                idx, allowed = arg
                if idx >= len(node.input) or self.view.dtype(node.input[idx]) not in allowed:
                    return False
            elif key == "const_input_not_all":
                idx, value = arg
                val = self.view.const_value(node.input[idx]) if idx < len(node.input) else None
                if val is None or bool((val == value).all()):
                    return False
            elif key == "opset":
                opset = self.f.opsets.get(node.domain)
                if opset is None or not (arg[0] <= opset <= arg[1]):
                    return False
            else:  # a condition this version does not know: do not apply the variant
                return False
        return True

    def _dtype_keys(self, node: NodeView, entry: dict[str, Any]) -> tuple[str | None, str | None]:
        where, _, idx_s = entry.get("type_from", "input:0").partition(":")
        idx = int(idx_s or 0)
        names = node.input if where == "input" else node.output
        name = names[idx] if idx < len(names) else ""
        dtype = self.view.dtype(name)
        qdq = None
        if dtype in FLOATS and where == "input":
            producer = self.f.producers.get(name)
            if producer is not None and self.f.nodes[producer].op_type == "DequantizeLinear":
                qtype = self.view.dtype(self.f.nodes[producer].input[0])
                if qtype is not None:
                    qdq = f"qdq_{qtype}"
        return dtype, qdq
