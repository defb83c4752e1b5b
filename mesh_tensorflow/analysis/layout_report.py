"""A readable report of what a layout does to an mtf graph.

For a graph, a mesh shape and a layout, the report lists each tensor's split
over the mesh (biggest first), per-operation compute and communication (most
expensive first), communication per mesh dimension and memory per processor,
all from the cost model. `to_png` draws the mesh with how the biggest tensors
are split and where communication happens (needs matplotlib: `pip install
"mesh-tensorflow[report]"`).

    >>> report = mtf.layout_report(graph, "rows:2;cols:4", "batch:rows;hidden:cols")
    >>> print(report)
    >>> report.to_png("/tmp/layout.png")
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

from mesh_tensorflow.analysis import cost_model
from mesh_tensorflow.core.layout import convert_to_layout_rules
from mesh_tensorflow.core.shapes import Shape, convert_to_shape

_fmt_bytes = cost_model.format_bytes


def _preset_note(params) -> str:
  """" (the a100-80gb preset)" where parameters named after a kind ("gpu",
  "tpu") come from a hardware preset; "" otherwise."""
  preset = params.hardware
  if not preset or preset == params.name or preset.lstrip().startswith("{"):
    return ""
  return f" (the {preset} preset)"


@dataclasses.dataclass
class TensorSplit:
  """How one tensor is laid out.

  Attributes:
    name: the tensor's name (variables: the variable name).
    shape: its mtf Shape.
    dtype_size: bytes per element.
    layout: for each dimension, the mesh dimension name that splits it or None.
    slice_shape: the shape of each processor's slice.
    is_variable: whether it is a variable's value.
  """
  name: str
  shape: Shape
  dtype_size: int
  layout: Tuple[Optional[str], ...]
  slice_shape: Tuple[int, ...]
  is_variable: bool

  @property
  def full_bytes(self) -> int:
    return self.shape.size * self.dtype_size

  @property
  def slice_bytes(self) -> int:
    n = self.dtype_size
    for s in self.slice_shape:
      n *= s
    return n

  def split_text(self) -> str:
    parts = [f"{d.name}->{m}" for d, m in zip(self.shape.dims, self.layout) if m]
    return ", ".join(parts) if parts else "replicated"


class LayoutReport:
  """What `layout_report` returns: printable (str()), with the data behind it.

  Attributes:
    estimate: the cost_model.CostEstimate.
    tensors: TensorSplit of every distinct tensor, biggest first.
    mesh_shape, layout: as given (converted).
  """

  def __init__(self, graph, mesh_shape, layout, estimate: cost_model.CostEstimate,
               top_tensors: int = 15, top_ops: int = 20):
    self.mesh_shape = convert_to_shape(mesh_shape)
    self.layout = convert_to_layout_rules(layout)
    self.estimate = estimate
    self.top_tensors = top_tensors
    self.top_ops = top_ops
    names = self.mesh_shape.dimension_names
    sizes = self.mesh_shape.to_integer_list()
    seen = {}
    for op in graph.operations:
      for t in op.outputs:
        lay = self.layout.tensor_layout(t.shape, self.mesh_shape, t.name)
        key = t.name
        if key in seen:
          continue
        seen[key] = TensorSplit(
            name=t.name, shape=t.shape, dtype_size=t.dtype.size,
            layout=tuple(names[a] if a is not None else None for a in lay),
            slice_shape=tuple(d.size // sizes[a] if a is not None else d.size
                              for d, a in zip(t.shape.dims, lay)),
            is_variable=bool(getattr(op, "is_variable", False)))
    self.tensors: List[TensorSplit] = sorted(seen.values(), key=lambda s: -s.full_bytes)

  # ---- derived tables --------------------------------------------------------
  def comm_by_mesh_dim(self) -> Dict[str, Dict[str, int]]:
    """{mesh dimension name: {collective kind: bytes per processor}}; a
    collective over several mesh dimensions counts for each."""
    names = self.mesh_shape.dimension_names
    out = {n: {} for n in names}
    for c in self.estimate.collectives:
      for a in c.mesh_axes:
        d = out[names[a]]
        d[c.kind] = d.get(c.kind, 0) + c.bytes_per_processor
    return out

  def ops_by_time(self) -> List[cost_model.OpCost]:
    return sorted(self.estimate.ops, key=lambda o: -o.time_s)

  # ---- text --------------------------------------------------------------------
  def __str__(self) -> str:
    est = self.estimate
    m = est.memory
    lines = [
        f"Layout report: mesh '{self.mesh_shape.to_string()}' ({self.mesh_shape.size} "
        f"processors), layout '{self.layout.to_string() or '(replicated)'}'",
        f"estimated step time {est.step_time_s * 1e3:.3f} ms with '{est.params.name}' "
        f"parameters{_preset_note(est.params)}"
        f"{' (collectives from a real lowering)' if est.exact else ''}; "
        f"{est.flops:,} FLOPs per processor; "
        f"{_fmt_bytes(est.comm_bytes)} sent per processor in {len(est.collectives)} collectives",
        "",
        "Memory per processor: "
        f"variables {_fmt_bytes(m.variables)}, optimizer slots {_fmt_bytes(m.slots)}, "
        f"activations (peak live) {_fmt_bytes(m.activations)}, total {_fmt_bytes(m.peak_bytes)}",
        "",
        f"Tensors (the {min(self.top_tensors, len(self.tensors))} biggest of "
        f"{len(self.tensors)}):",
        f"  {'tensor':<36} {'shape':<34} {'split':<28} {'slice':<18} {'bytes/proc':>10}",
    ]
    for s in self.tensors[:self.top_tensors]:
      shape = ", ".join(f"{d.name}:{d.size}" for d in s.shape.dims)
      name = _tail(("[var] " if s.is_variable else "") + s.name, 36)
      lines.append(f"  {name:<36} {shape[:34]:<34} {s.split_text()[:28]:<28} "
                   f"{str(list(s.slice_shape))[:18]:<18} {_fmt_bytes(s.slice_bytes):>10}")
    lines += ["", f"Operations (the {min(self.top_ops, len(est.ops))} most expensive of "
              f"{len(est.ops)}):",
              f"  {'operation':<34} {'type':<22} {'est ms':>8} {'FLOPs/proc':>14}  communication"]
    for o in self.ops_by_time()[:self.top_ops]:
      comm = ", ".join(f"{c.kind}[{','.join(self.mesh_shape.dimension_names[a] for a in c.mesh_axes)}]"
                       f" {_fmt_bytes(c.bytes_per_processor)}" for c in o.collectives) or "-"
      lines.append(f"  {_tail(o.name, 34):<34} {o.type[:22]:<22} {o.time_s * 1e3:>8.3f} "
                   f"{o.flops:>14,}  {comm}")
    lines += ["", "Communication per mesh dimension (bytes per processor):"]
    for name, kinds in self.comm_by_mesh_dim().items():
      text = ", ".join(f"{k} {_fmt_bytes(b)}" for k, b in sorted(kinds.items())) or "none"
      lines.append(f"  {name}: {text}")
    return "\n".join(lines)

  __repr__ = __str__

  # ---- picture -----------------------------------------------------------------
  def to_png(self, path: str, num_tensors: int = 4, dpi: int = 100) -> str:
    """Draws the mesh with the splits of the `num_tensors` biggest tensors and
    where communication happens, and writes a PNG to `path`.

    Raises:
      ImportError: matplotlib is missing (pip install "mesh-tensorflow[report]").

    Example:
      >>> report.to_png("/tmp/layout.png")
      '/tmp/layout.png'
    """
    from mesh_tensorflow import _environment  # pylint: disable=g-import-not-at-top
    matplotlib = _environment.require_optional("matplotlib", "LayoutReport.to_png", "report")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
    tensors = self._picture_tensors(max(1, num_tensors))
    rows, cols = _grid(self.mesh_shape)
    n = len(tensors)
    fig = plt.figure(figsize=(4.0 * max(n, 2), 8.0), dpi=dpi)
    grid = fig.add_gridspec(2, max(n, 2), height_ratios=[1.0, 1.0])
    for i, s in enumerate(tensors):
      ax = fig.add_subplot(grid[0, i])
      self._draw_tensor(ax, s, rows, cols)
    ax = fig.add_subplot(grid[1, : max(n, 2) // 2])
    self._draw_mesh_comm(ax, rows, cols)
    ax = fig.add_subplot(grid[1, max(n, 2) // 2:])
    self._draw_op_comm(ax)
    fig.suptitle(f"mesh '{self.mesh_shape.to_string()}'  layout "
                 f"'{self.layout.to_string() or '(replicated)'}'  est. step "
                 f"{self.estimate.step_time_s * 1e3:.2f} ms, "
                 f"{_fmt_bytes(self.estimate.memory.peak_bytes)}/processor")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path)
    plt.close(fig)
    return path

  def _picture_tensors(self, n: int) -> List[TensorSplit]:
    """The biggest variable, then the biggest tensors with other splits."""
    out, seen = [], set()
    variables = [s for s in self.tensors if s.is_variable]
    for s in variables[:1] + self.tensors:
      key = (tuple(d.name for d in s.shape.dims), s.layout)
      if key in seen:
        continue
      seen.add(key)
      out.append(s)
      if len(out) == n:
        break
    return out

  def _coords(self, pnum: int) -> List[int]:
    from mesh_tensorflow.core.layout import pnum_to_processor_coordinates  # pylint: disable=g-import-not-at-top
    return pnum_to_processor_coordinates(self.mesh_shape, pnum)

  def _draw_tensor(self, ax, s: TensorSplit, rows: int, cols: int):
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
    names = self.mesh_shape.dimension_names
    split_axes = [names.index(m) for m in s.layout if m]
    keys = {}
    cmap = plt.get_cmap("tab20")
    for p in range(self.mesh_shape.size):
      c = self._coords(p)
      key = tuple(c[a] for a in split_axes)
      idx = keys.setdefault(key, len(keys))
      r, q = divmod(p, cols)
      ax.add_patch(plt.Rectangle((q, rows - 1 - r), 0.95, 0.95, color=cmap(idx % 20)))
      label = "\n".join(f"{d.name[:6]}{c[names.index(m)]}" for d, m in zip(s.shape.dims, s.layout)
                        if m) or "all"
      ax.text(q + 0.47, rows - 1 - r + 0.47, f"p{p}\n{label}", ha="center", va="center",
              fontsize=7)
    ax.set_xlim(0, cols)
    ax.set_ylim(0, rows)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(f"{s.name[:28]}\n{s.split_text()[:40]}\n{len(keys)} distinct slices, "
                 f"{_fmt_bytes(s.slice_bytes)}/proc", fontsize=8)

  def _draw_mesh_comm(self, ax, rows: int, cols: int):
    """The mesh grid; lines between neighbours along each mesh dimension, as
    thick as the bytes sent along it."""
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
    per_dim = {n: sum(k.values()) for n, k in self.comm_by_mesh_dim().items()}
    biggest = max(per_dim.values()) if per_dim and max(per_dim.values()) else 1
    names = self.mesh_shape.dimension_names
    colors = plt.get_cmap("Set1")
    for p in range(self.mesh_shape.size):
      r, q = divmod(p, cols)
      ax.add_patch(plt.Rectangle((q + 0.3, rows - 1 - r + 0.3), 0.4, 0.4, color="0.8"))
      ax.text(q + 0.5, rows - 1 - r + 0.5, f"p{p}", ha="center", va="center", fontsize=7)
    for a, name in enumerate(names):
      width = 0.5 + 8.0 * per_dim[name] / biggest
      if not per_dim[name]:
        continue
      for p in range(self.mesh_shape.size):
        c = self._coords(p)
        if c[a] + 1 >= self.mesh_shape.dims[a].size:
          continue
        c2 = list(c)
        c2[a] += 1
        from mesh_tensorflow.core.layout import processor_coordinates_to_pnum  # pylint: disable=g-import-not-at-top
        p2 = processor_coordinates_to_pnum(self.mesh_shape, c2)
        r1, q1 = divmod(p, cols)
        r2, q2 = divmod(p2, cols)
        ax.plot([q1 + 0.5, q2 + 0.5], [rows - 1 - r1 + 0.5, rows - 1 - r2 + 0.5],
                color=colors(a % 9), linewidth=width, alpha=0.6, zorder=0,
                label=name if p == 0 else None)
    ax.set_xlim(0, cols)
    ax.set_ylim(0, rows)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    text = "; ".join(f"{n}: {_fmt_bytes(b)}" for n, b in per_dim.items())
    ax.set_title(f"communication per mesh dimension (bytes/proc)\n{text}", fontsize=8)
    if any(per_dim.values()):
      ax.legend(fontsize=7, loc="upper right")

  def _draw_op_comm(self, ax):
    """Bars: bytes per processor sent by the operations that communicate most."""
    ops = sorted((o for o in self.estimate.ops if o.collectives), key=lambda o: -o.comm_bytes)[:10]
    if not ops:
      ax.text(0.5, 0.5, "no communication", ha="center", va="center")
      ax.set_axis_off()
      return
    kinds = sorted({c.kind for o in ops for c in o.collectives})
    left = [0.0] * len(ops)
    for k in kinds:
      values = [sum(c.bytes_per_processor for c in o.collectives if c.kind == k) / 1024.0
                for o in ops]
      ax.barh(range(len(ops)), values, left=left, label=k)
      left = [x + v for x, v in zip(left, values)]
    ax.set_yticks(range(len(ops)))
    ax.set_yticklabels([o.name[:24] for o in ops], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("KiB per processor")
    ax.set_title("where communication happens (top operations)", fontsize=8)
    ax.legend(fontsize=7)


def _tail(text: str, width: int) -> str:
  """text, or its end behind '..' when longer than width."""
  return text if len(text) <= width else ".." + text[-(width - 2):]


def _grid(mesh_shape: Shape) -> Tuple[int, int]:
  """(rows, cols) to draw the mesh: the last dimension across, the others
  (flattened) down."""
  sizes = mesh_shape.to_integer_list()
  cols = sizes[-1] if sizes else 1
  rows = max(1, mesh_shape.size // max(cols, 1))
  return rows, cols


def layout_report(graph, mesh_shape, layout, params=None, exact: bool = False,
                  top_tensors: int = 15, top_ops: int = 20) -> LayoutReport:
  """A printable report of `layout` on `mesh_shape` for `graph`.

  Args:
    graph: an mtf.Graph (e.g. a training step).
    mesh_shape: e.g. "rows:2;cols:4".
    layout: layout rules, e.g. "batch:rows;hidden:cols".
    params: cost_model DeviceParams or "cpu"/"gpu"/"tpu".
    exact: take communication from a real lowering (every op type).
    top_tensors, top_ops: rows shown in the text.

  Raises:
    ValueError: the layout is illegal for a tensor of the graph (names the
      tensor, dimension and rule).

  Example:
    >>> print(mtf.layout_report(graph, "all:8", "batch:all"))
  """
  est = cost_model.estimate(graph, mesh_shape, layout, params=params, exact=exact)
  return LayoutReport(graph, mesh_shape, layout, est, top_tensors=top_tensors, top_ops=top_ops)


# `mtf.layout_report` is this function (the package imports it over the
# module's name); its classes stay reachable from it.
layout_report.LayoutReport = LayoutReport
layout_report.TensorSplit = TensorSplit
