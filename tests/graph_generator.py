"""Random mtf graphs with independent references, for layout-invariance tests.

`generate_case(seed)` returns a `Case`: a short random program of mtf ops over
small named dimensions, whose values and gradients are known from a reference
written with the NumPy API:

* values come from running the program's reference with NumPy (float64);
* gradients come from running the same reference code with
  `tf.experimental.numpy` under a `tf.GradientTape` (so TensorFlow's own
  gradient rules, not mtf's, are the oracle).

`Case.build(mesh)` builds the program in an mtf graph (with a loss and
`mtf.gradients`) and returns the mtf tensors to compare; `Case.reference()`
returns the expected values under the same keys. Random ops (dropout,
random_uniform, random_normal) have no reference: they are compared across
layouts (`key.startswith("random/")`).

Values are inspected while the program is generated, so ops whose result or
gradient is discontinuous near the actual data (relu at 0, ties under
reduce_max/argmax/top_k, casts near integers, where near its threshold) are
only applied with a safe margin: float32 rounding differences between layouts
can never flip them.

The module is used both by the pytest suite and by oss_scripts/stress_layouts.py.
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
import tensorflow.experimental.numpy as tnp

import mesh_tensorflow as mtf

MESH_SHAPES = ("all:8", "rows:2;cols:4", "a:2;b:2;c:2")

Dims = Tuple[Tuple[str, int], ...]

_MAX_ELEMENTS = 512
_MAX_NDIMS = 4
_VALUE_LIMIT = 200.0
_MARGIN = 2e-3
# Sizes of the named dimensions a case starts with (small, mostly even).
_BASE_SIZES = (2, 2, 4, 4, 4, 8, 8, 6, 3, 12, 1)


# ---------------------------------------------------------------- backends
class _NumpyBackend:
  """Runs a reference with NumPy (values only)."""

  xp = np
  _erf = np.vectorize(math.erf, otypes=[np.float64])

  @staticmethod
  def stop_gradient(x):
    return x

  @classmethod
  def erf(cls, x):
    return cls._erf(x)

  @staticmethod
  def to_numpy(x):
    return np.asarray(x)


class _TapeBackend:
  """Runs the same reference with tf.experimental.numpy (differentiable)."""

  xp = tnp

  @staticmethod
  def stop_gradient(x):
    return tf.stop_gradient(x)

  @staticmethod
  def erf(x):
    return tf.math.erf(x)

  @staticmethod
  def to_numpy(x):
    return x.numpy()


NP = _NumpyBackend()
TAPE = _TapeBackend()


def align(b, arr, dims_from: Dims, dims_to: Dims):
  """Transposes `arr` (axes named by dims_from) into the order of dims_to,
  inserting size-1 axes for names it lacks (NumPy broadcasting by name)."""
  names_from = [n for n, _ in dims_from]
  names_to = [n for n, _ in dims_to]
  perm = sorted(range(len(names_from)), key=lambda i: names_to.index(names_from[i]))
  if perm != list(range(len(perm))):
    arr = b.xp.transpose(arr, perm)
  if len(names_from) != len(names_to):
    arr = b.xp.reshape(arr, [s if n in names_from else 1 for n, s in dims_to])
  return arr


def broadcast_full(b, arr, dims_from: Dims, dims_to: Dims):
  return b.xp.broadcast_to(align(b, arr, dims_from, dims_to), [s for _, s in dims_to])


def to_shape(dims: Dims) -> mtf.Shape:
  return mtf.Shape([mtf.Dimension(n, s) for n, s in dims])


def _take(b, x, axis, begin, size):
  return b.xp.take(x, b.xp.arange(begin, begin + size), axis=axis)


def _scale(v) -> float:
  v = np.asarray(v, np.float64)
  return 1.0 + (float(np.max(np.abs(v))) if v.size else 0.0)


def _min_abs(v) -> float:
  v = np.asarray(v, np.float64)
  return float(np.min(np.abs(v))) if v.size else np.inf


def _top_gap(v, axes) -> float:
  """Smallest gap between the largest and second largest value along axes
  (inf when only one value is reduced)."""
  v = np.asarray(v, np.float64)
  axes = list(axes)
  if not axes:
    return np.inf
  moved = np.moveaxis(v, axes, list(range(-len(axes), 0)))
  flat = moved.reshape(moved.shape[:moved.ndim - len(axes)] + (-1,))
  if flat.shape[-1] < 2 or flat.size == 0:
    return np.inf
  srt = np.sort(flat, axis=-1)
  return float(np.min(srt[..., -1] - srt[..., -2]))


def _sorted_gap(v, axis, k) -> float:
  """Smallest gap among the k+1 largest values along axis (ties there would
  make top_k ambiguous)."""
  v = np.asarray(v, np.float64)
  srt = -np.sort(-np.moveaxis(v, axis, -1), axis=-1)
  m = min(k + 1, srt.shape[-1])
  if m < 2 or srt.size == 0:
    return np.inf
  return float(np.min(srt[..., :m - 1] - srt[..., 1:m]))


# ---------------------------------------------------------------- program
@dataclasses.dataclass
class Node:
  """One tensor of the program."""
  id: int
  dims: Dims
  kind: str            # "f" (float32), "i" (int32) or "b" (bool)
  value: Optional[np.ndarray]  # NumPy reference (None for random tensors)
  random: bool = False
  consumers: int = 0


@dataclasses.dataclass
class Step:
  """One op of the program: how to build it in mtf and in the reference."""
  name: str
  inputs: List[int]
  outputs: List[int]
  mtf_fn: Callable  # (mesh, [mtf.Tensor]) -> [mtf.Tensor]
  ref_fn: Optional[Callable]  # (backend, [array]) -> [array]; None for inputs


@dataclasses.dataclass
class BuiltCase:
  """A case built in an mtf graph: the tensors to export, by key."""
  tensors: Dict[str, mtf.Tensor]
  loss: mtf.Tensor


_TF_DTYPE = {"f": tf.float32, "i": tf.int32, "b": tf.bool}


class Case:
  """A random program with its reference (see module docstring)."""

  def __init__(self, seed, prefix: str, nodes: List[Node], steps: List[Step],
               input_how: Dict[int, str], loss_ids: List[int], loss_weights,
               compare_ids: List[int], dropout_pairs: List[Tuple[int, int, float]]):
    self.seed = seed
    self.prefix = prefix
    self.nodes = nodes
    self.steps = steps
    self.input_how = input_how
    self.loss_ids = loss_ids
    self.loss_weights = loss_weights
    self.compare_ids = compare_ids
    self.dropout_pairs = dropout_pairs
    self._reference = None

  @property
  def grad_input_ids(self) -> List[int]:
    return [i for i in self.input_how if self.nodes[i].kind == "f"]

  @property
  def random_ids(self) -> List[int]:
    return [n.id for n in self.nodes if n.random]

  @property
  def has_random(self) -> bool:
    return any(n.random for n in self.nodes)

  def describe(self) -> str:
    lines = [f"case seed={self.seed!r} prefix={self.prefix!r}"]
    for s in self.steps:
      outs = ", ".join(f"n{o}{[f'{n}:{z}' for n, z in self.nodes[o].dims]}"
                       f"{self.nodes[o].kind}" for o in s.outputs)
      lines.append(f"  {outs} = {s.name}({', '.join(f'n{i}' for i in s.inputs)})")
    lines.append(f"  loss over {['n%d' % i for i in self.loss_ids]}")
    return "\n".join(lines)

  # -------------------------------------------------------------- mtf side
  def build(self, mesh: mtf.Mesh) -> BuiltCase:
    """Builds the program, its loss and gradients on `mesh`."""
    env: Dict[int, mtf.Tensor] = {}
    for step in self.steps:
      outs = step.mtf_fn(mesh, [env[i] for i in step.inputs])
      if len(outs) != len(step.outputs):
        raise AssertionError(f"{step.name}: {len(outs)} outputs, expected "
                             f"{len(step.outputs)}")
      for nid, t in zip(step.outputs, outs):
        node = self.nodes[nid]
        expected = to_shape(node.dims)
        if t.shape != expected:
          raise AssertionError(
              f"{step.name} (case {self.seed}): mtf output shape {t.shape}, the "
              f"reference expects {expected}")
        if t.dtype != _TF_DTYPE[node.kind]:
          raise AssertionError(
              f"{step.name} (case {self.seed}): mtf dtype {t.dtype.name}, the "
              f"reference expects {_TF_DTYPE[node.kind].name}")
        env[nid] = t
    terms = []
    for nid, w in zip(self.loss_ids, self.loss_weights):
      wt = mtf.import_tf_tensor(mesh, tf.constant(w.astype(np.float32)),
                                to_shape(self.nodes[nid].dims),
                                name=f"{self.prefix}loss_weight")
      terms.append(mtf.reduce_sum(env[nid] * wt))
    loss = mtf.add_n(terms)
    xs = [env[i] for i in self.grad_input_ids]
    grads = mtf.gradients([loss], xs)
    tensors = {"loss": loss}
    for i in self.compare_ids:
      tensors[f"value/{i}"] = env[i]
    for i, g in zip(self.grad_input_ids, grads):
      if g is not None:
        tensors[f"grad/{i}"] = g
    for i in self.random_ids:
      tensors[f"random/{i}"] = env[i]
    return BuiltCase(tensors, loss)

  # -------------------------------------------------------------- reference
  def reference(self) -> Dict[str, np.ndarray]:
    """Expected values: 'loss', 'value/<id>', 'grad/<id>' (zeros where the
    loss does not depend on the input)."""
    if self._reference is None:
      self._reference = self._compute_reference()
    return self._reference

  def _compute_reference(self):
    out = {}
    for i in self.compare_ids:
      out[f"value/{i}"] = self.nodes[i].value
    np_loss = sum(float(np.sum(self.nodes[i].value * w))
                  for i, w in zip(self.loss_ids, self.loss_weights))
    with tf.GradientTape() as tape:
      env = {}
      for nid, how in self.input_how.items():
        node = self.nodes[nid]
        t = tf.constant(node.value)
        if node.kind == "f":
          tape.watch(t)
        env[nid] = t
      leaves = dict(env)
      for step in self.steps:
        if step.ref_fn is None or any(self.nodes[o].random for o in step.outputs):
          continue
        vals = step.ref_fn(TAPE, [env[i] for i in step.inputs])
        for nid, v in zip(step.outputs, vals):
          env[nid] = v
      loss = tf.add_n([tf.reduce_sum(env[i] * tf.constant(w))
                       for i, w in zip(self.loss_ids, self.loss_weights)])
    # The two reference backends must agree (a check of the reference itself).
    for nid, v in env.items():
      ref = self.nodes[nid].value
      got = v.numpy() if isinstance(v, tf.Tensor) else np.asarray(v)
      if not np.allclose(got, ref, rtol=1e-6, atol=1e-6 * _scale(ref)):
        raise AssertionError(f"case {self.seed}: reference backends disagree on n{nid}")
    if not math.isclose(float(loss.numpy()), np_loss, rel_tol=1e-6,
                        abs_tol=1e-6 * (1 + abs(np_loss))):
      raise AssertionError(f"case {self.seed}: reference backends disagree on loss")
    ids = self.grad_input_ids
    grads = tape.gradient(loss, [leaves[i] for i in ids])
    out["loss"] = np.asarray(np_loss)
    for i, g in zip(ids, grads):
      out[f"grad/{i}"] = (np.zeros_like(self.nodes[i].value) if g is None
                          else tf.convert_to_tensor(g).numpy())
    return out


# ---------------------------------------------------------------- generator
class _Generator:
  """Builds a random Case, op by op, checking the data as it goes."""

  def __init__(self, rnd: random.Random, prefix: str, allow_random: bool):
    self.r = rnd
    self.prefix = prefix
    self.allow_random = allow_random
    self.nodes: List[Node] = []
    self.steps: List[Step] = []
    self.input_how: Dict[int, str] = {}
    self.registry: Dict[str, int] = {}
    self.dropout_pairs: List[Tuple[int, int, float]] = []
    self._fresh = 0
    for i in range(self.r.randint(3, 5)):
      self.registry[f"{prefix}d{i}"] = self.r.choice(_BASE_SIZES)

  # ---- helpers ------------------------------------------------------------
  def fresh_name(self, tag="n") -> str:
    self._fresh += 1
    return f"{self.prefix}{tag}{self._fresh}"

  def pick(self, kind="f", pred=None) -> Optional[Node]:
    cands = [n for n in self.nodes if n.kind == kind and not n.random
             and (pred is None or pred(n))]
    if not cands:
      return None
    # Prefer recent nodes, so programs get deep rather than wide.
    weights = [1.0 + 2.0 * (n.consumers == 0) + 0.1 * n.id for n in cands]
    return self.r.choices(cands, weights)[0]

  def random_dims(self, lo=1, hi=3, exclude=(), base: Dims = ()) -> Dims:
    """Some dimensions of `base` plus some registry dimensions."""
    names_taken = set(exclude)
    dims = list(base)
    self.r.shuffle(dims)
    dims = [d for d in dims if d[0] not in names_taken]
    k = self.r.randint(0, len(dims))
    dims = dims[:k]
    taken = names_taken | {n for n, _ in base}
    others = [(n, s) for n, s in self.registry.items() if n not in taken]
    self.r.shuffle(others)
    want = self.r.randint(lo, hi)
    while len(dims) < want and others:
      dims.append(others.pop())
    self.r.shuffle(dims)
    return tuple(dims)

  def new_input(self, dims: Dims, kind="f", lo=0, hi=4, how=None) -> Node:
    dims = tuple(dims)
    shape = [s for _, s in dims]
    if kind == "f":
      value = self.r_normal(shape).astype(np.float32).astype(np.float64)
      how = how or self.r.choice(["variable", "import", "import"])
    elif kind == "i":
      value = np.asarray(self.np_rng().integers(lo, hi, size=shape), np.int64)
      how = "import"
    else:
      value = self.np_rng().random(size=shape) < 0.5
      how = "import"
    node = self._new_node(dims, kind, value)
    self.input_how[node.id] = how
    name = f"{self.prefix}v{node.id}"

    def mtf_fn(mesh, ins, value=value, dims=dims, kind=kind, how=how, name=name):
      del ins
      if how == "variable":
        v32 = value.astype(np.float32)
        return [mtf.get_variable(
            mesh, name, to_shape(dims),
            initializer=lambda shape, dtype=None: tf.constant(v32))]
      tf_value = tf.constant(value.astype({"f": np.float32, "i": np.int32,
                                           "b": np.bool_}[kind]))
      return [mtf.import_tf_tensor(mesh, tf_value, to_shape(dims), name=name)]
    self.steps.append(Step(f"input[{how}]", [], [node.id], mtf_fn, None))
    return node

  def np_rng(self):
    return np.random.default_rng(self.r.getrandbits(32))

  def r_normal(self, shape):
    return self.np_rng().normal(size=shape)

  def _new_node(self, dims, kind, value, random_=False) -> Node:
    node = Node(len(self.nodes), tuple(dims), kind, value, random_)
    self.nodes.append(node)
    return node

  def add(self, name: str, inputs: Sequence[Node], out_specs, mtf_fn, ref_fn) -> Optional[List[Node]]:
    """Adds a step if its reference values are well behaved; returns its
    output nodes (None if rejected)."""
    for dims, _ in out_specs:
      size = int(np.prod([s for _, s in dims])) if dims else 1
      names = [n for n, _ in dims]
      if len(dims) > _MAX_NDIMS or size > _MAX_ELEMENTS or len(set(names)) != len(names):
        return None
    with np.errstate(all="ignore"):
      vals = ref_fn(NP, [n.value for n in inputs])
    for (dims, kind), v in zip(out_specs, vals):
      v = np.asarray(v)
      if list(v.shape) != [s for _, s in dims]:
        raise AssertionError(f"generator: {name} produced shape {v.shape} for {dims}")
      if kind == "f" and (not np.all(np.isfinite(v)) or _scale(v) > _VALUE_LIMIT):
        return None
    outs = []
    for (dims, kind), v in zip(out_specs, vals):
      v = np.asarray(v)
      v = v.astype(np.float64 if kind == "f" else np.int64 if kind == "i" else np.bool_)
      outs.append(self._new_node(dims, kind, v))
    for n in inputs:
      n.consumers += 1
    self.steps.append(Step(name, [n.id for n in inputs], [o.id for o in outs],
                           mtf_fn, ref_fn))
    return outs

  def compatible(self, a: Dims, b: Dims) -> bool:
    da = dict(a)
    return all(da.get(n, s) == s for n, s in b)

  def partner(self, x: Node, fresh_ok=True, max_union=_MAX_NDIMS) -> Optional[Node]:
    """An existing float node compatible with x, or a fresh input."""
    if self.r.random() < 0.5:
      y = self.pick("f", lambda n: n.id != x.id and self.compatible(x.dims, n.dims)
                    and len(set(x.dims) | set(n.dims)) <= max_union)
      if y is not None:
        return y
    if not fresh_ok:
      return None
    return self.new_input(self.random_dims(0, 2, base=x.dims))

  # ---- ops ------------------------------------------------------------------
  UNARY = {
      # name: (reference, precondition on the input values)
      "tanh": (lambda b, x: b.xp.tanh(x), None),
      "sigmoid": (lambda b, x: 1.0 / (1.0 + b.xp.exp(-x)), None),
      "sin": (lambda b, x: b.xp.sin(x), None),
      "cos": (lambda b, x: b.xp.cos(x), None),
      "negative": (lambda b, x: -x, None),
      "identity": (lambda b, x: x * 1.0, None),
      "square": (lambda b, x: x * x, lambda v: _scale(v) < 10),
      "exp": (lambda b, x: b.xp.exp(x), lambda v: _scale(v) < 4),
      "expm1": (lambda b, x: b.xp.expm1(x), lambda v: _scale(v) < 4),
      "softplus": (lambda b, x: b.xp.logaddexp(0.0, x), None),
      "relu": (lambda b, x: b.xp.maximum(x, 0.0), lambda v: _min_abs(v) > _MARGIN * _scale(v)),
      "abs": (lambda b, x: b.xp.abs(x), lambda v: _min_abs(v) > _MARGIN * _scale(v)),
      "sign": (lambda b, x: b.xp.sign(x), lambda v: _min_abs(v) > _MARGIN * _scale(v)),
      "gelu": (lambda b, x: 0.5 * x * (1.0 + b.xp.tanh(
          math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x))), lambda v: _scale(v) < 20),
      "swish": (lambda b, x: x / (1.0 + b.xp.exp(-x)), None),
      "erf": (lambda b, x: b.erf(x), None),
      "log": (lambda b, x: b.xp.log(x), lambda v: v.size and np.min(v) > 0.05),
      "sqrt": (lambda b, x: b.xp.sqrt(x), lambda v: v.size and np.min(v) > 0.05),
      "rsqrt": (lambda b, x: 1.0 / b.xp.sqrt(x), lambda v: v.size and np.min(v) > 0.1),
      "reciprocal": (lambda b, x: 1.0 / x, lambda v: _min_abs(v) > 0.1),
      "log1p": (lambda b, x: b.xp.log1p(x), lambda v: v.size and np.min(v) > -0.9),
      "elu": (lambda b, x: b.xp.where(x > 0, x, b.xp.expm1(b.xp.minimum(x, 0.0))),
              lambda v: _min_abs(v) > _MARGIN * _scale(v)),
      "selu": (lambda b, x: 1.0507009873554805 * b.xp.where(
          x > 0, x, 1.6732632423543772 * b.xp.expm1(b.xp.minimum(x, 0.0))),
               lambda v: _min_abs(v) > _MARGIN * _scale(v)),
      "leaky_relu": (lambda b, x: b.xp.where(x > 0, x, x * 0.2),
                     lambda v: _min_abs(v) > _MARGIN * _scale(v)),
      "floor": (lambda b, x: b.xp.floor(x),
                lambda v: _min_abs(v - np.round(v)) > _MARGIN * _scale(v)),
  }

  def op_unary(self):
    name = self.r.choice(sorted(self.UNARY))
    ref, pre = self.UNARY[name]
    x = self.pick("f", lambda n: pre is None or pre(n.value))
    if x is None:
      return None
    return self.add(name, [x], [(x.dims, "f")],
                    lambda mesh, ins: [getattr(mtf, name)(ins[0])],
                    lambda b, ins: [ref(b, ins[0])])

  BINARY = ("add", "sub", "multiply", "divide", "maximum", "minimum",
            "squared_difference", "pow", "add_operator", "mul_operator",
            "sub_operator", "div_operator")

  def op_binary(self):
    name = self.r.choice(self.BINARY)
    x = self.pick("f")
    if x is None:
      return None
    if self.r.random() < 0.2:
      return self._binary_scalar(name, x)
    y = self.partner(x)
    out = tuple(x.dims) + tuple(d for d in y.dims if d not in x.dims)
    xv = broadcast_full(NP, x.value, x.dims, out)
    yv = broadcast_full(NP, y.value, y.dims, out)
    if name in ("divide", "div_operator") and _min_abs(yv) < 0.2:
      return None
    if name in ("maximum", "minimum") and _min_abs(xv - yv) < _MARGIN * (_scale(xv) + _scale(yv)):
      return None
    if name == "pow" and (xv.size == 0 or np.min(xv) < 0.2 or _scale(yv) > 3):
      return None
    fns = {
        "add": (mtf.add, lambda a, c: a + c),
        "sub": (mtf.sub, lambda a, c: a - c),
        "multiply": (mtf.multiply, lambda a, c: a * c),
        "divide": (mtf.divide, lambda a, c: a / c),
        "squared_difference": (mtf.squared_difference, lambda a, c: (a - c) * (a - c)),
        "add_operator": (lambda a, c: a + c, lambda a, c: a + c),
        "sub_operator": (lambda a, c: a - c, lambda a, c: a - c),
        "mul_operator": (lambda a, c: a * c, lambda a, c: a * c),
        "div_operator": (lambda a, c: a / c, lambda a, c: a / c),
    }
    if name in fns:
      mfn, rfn = fns[name]
      ref = lambda b, ins: [rfn(align(b, ins[0], x.dims, out), align(b, ins[1], y.dims, out))]
    else:
      mfn = getattr(mtf, name)
      xpfn = {"maximum": "maximum", "minimum": "minimum", "pow": "power"}[name]
      ref = lambda b, ins: [broadcast_full(b, getattr(b.xp, xpfn)(
          align(b, ins[0], x.dims, out), align(b, ins[1], y.dims, out)), out, out)]
    return self.add(name, [x, y], [(out, "f")],
                    lambda mesh, ins: [mfn(ins[0], ins[1])], ref)

  def _binary_scalar(self, name, x):
    c = self.r.choice([0.5, -1.5, 2.0, 3.0])
    left = self.r.random() < 0.5
    if name in ("divide", "div_operator") and left and _min_abs(x.value) < 0.2:
      return None
    ops = {"add": lambda a, c: a + c, "sub": lambda a, c: a - c,
           "multiply": lambda a, c: a * c, "divide": lambda a, c: a / c}
    base = {"add_operator": "add", "sub_operator": "sub", "mul_operator": "multiply",
            "div_operator": "divide"}.get(name, name)
    if base not in ops:
      return None
    f = ops[base]
    if left:
      return self.add(f"{base}(scalar, x)", [x], [(x.dims, "f")],
                      lambda mesh, ins: [f(c, ins[0])],
                      lambda b, ins: [f(c, ins[0]) * 1.0])
    return self.add(f"{base}(x, scalar)", [x], [(x.dims, "f")],
                    lambda mesh, ins: [f(ins[0], c)],
                    lambda b, ins: [f(ins[0], c) * 1.0])

  def op_add_n(self):
    x = self.pick("f")
    if x is None:
      return None
    others = [self.partner(x) for _ in range(self.r.randint(1, 3))]
    xs = [x] + others
    out = tuple(x.dims)
    for o in others:
      if not self.compatible(out, o.dims):
        return None
      out += tuple(d for d in o.dims if d not in out)
    if len(out) > _MAX_NDIMS:
      return None

    def ref(b, ins):
      total = broadcast_full(b, ins[0], xs[0].dims, out)
      for v, n in zip(ins[1:], xs[1:]):
        total = total + align(b, v, n.dims, out)
      return [total]
    return self.add("add_n", xs, [(out, "f")], lambda mesh, ins: [mtf.add_n(ins)], ref)

  def op_compare(self):
    name = self.r.choice(["greater", "less", "greater_equal", "less_equal"])
    x = self.pick("f")
    if x is None:
      return None
    if self.r.random() < 0.3:
      c = self.r.choice([0.0, 0.5, -0.3])
      if _min_abs(x.value - c) < _MARGIN * _scale(x.value):
        return None
      return self.add(f"{name}(x, {c})", [x], [(x.dims, "b")],
                      lambda mesh, ins: [getattr(mtf, name)(ins[0], c)],
                      lambda b, ins: [getattr(b.xp, name)(ins[0], c)])
    y = self.partner(x)
    out = tuple(x.dims) + tuple(d for d in y.dims if d not in x.dims)
    xv = broadcast_full(NP, x.value, x.dims, out)
    yv = broadcast_full(NP, y.value, y.dims, out)
    if _min_abs(xv - yv) < _MARGIN * (_scale(xv) + _scale(yv)):
      return None
    return self.add(name, [x, y], [(out, "b")],
                    lambda mesh, ins: [getattr(mtf, name)(ins[0], ins[1])],
                    lambda b, ins: [broadcast_full(b, getattr(b.xp, name)(
                        align(b, ins[0], x.dims, out), align(b, ins[1], y.dims, out)),
                                                   out, out)])

  def op_logical(self):
    x = self.pick("b")
    if x is None:
      return None
    name = self.r.choice(["logical_and", "logical_or", "logical_xor", "logical_not",
                          "reduce_any", "reduce_all"])
    if name == "logical_not":
      return self.add(name, [x], [(x.dims, "b")],
                      lambda mesh, ins: [mtf.logical_not(ins[0])],
                      lambda b, ins: [b.xp.logical_not(ins[0])])
    if name in ("reduce_any", "reduce_all"):
      if not x.dims:
        return None
      keep = [d for d in x.dims if self.r.random() < 0.5]
      axes = tuple(i for i, d in enumerate(x.dims) if d not in keep)
      out = tuple(keep)
      xpname = {"reduce_any": "any", "reduce_all": "all"}[name]
      return self.add(name, [x], [(out, "b")],
                      lambda mesh, ins: [getattr(mtf, name)(ins[0], output_shape=to_shape(out))],
                      lambda b, ins: [getattr(b.xp, xpname)(ins[0], axis=axes)])
    y = self.pick("b", lambda n: self.compatible(x.dims, n.dims))
    if y is None:
      y = self.new_input(self.random_dims(0, 2, base=x.dims), "b")
    out = tuple(x.dims) + tuple(d for d in y.dims if d not in x.dims)
    return self.add(name, [x, y], [(out, "b")],
                    lambda mesh, ins: [getattr(mtf, name)(ins[0], ins[1])],
                    lambda b, ins: [broadcast_full(b, getattr(b.xp, name)(
                        align(b, ins[0], x.dims, out), align(b, ins[1], y.dims, out)),
                                                   out, out)])

  def op_where(self):
    cond = self.pick("b")
    if cond is None:
      made = self.op_compare()
      if made is None:
        return None
      cond = made[0]
    x = self.pick("f", lambda n: self.compatible(cond.dims, n.dims))
    if x is None:
      x = self.new_input(self.random_dims(0, 2, base=cond.dims))
    scalar_y = self.r.random() < 0.3
    if scalar_y:
      out = tuple(cond.dims) + tuple(d for d in x.dims if d not in cond.dims)
      return self.add("where(c, x, 0.0)", [cond, x], [(out, "f")],
                      lambda mesh, ins: [mtf.where(ins[0], ins[1], 0.0)],
                      lambda b, ins: [broadcast_full(b, b.xp.where(
                          align(b, ins[0], cond.dims, out), align(b, ins[1], x.dims, out),
                          0.0), out, out)])
    y = self.pick("f", lambda n: self.compatible(cond.dims, n.dims)
                  and self.compatible(x.dims, n.dims))
    if y is None:
      y = self.new_input(self.random_dims(0, 1, base=x.dims))
      if not self.compatible(cond.dims, y.dims):
        return None
    out = tuple(cond.dims)
    for n in (x, y):
      out += tuple(d for d in n.dims if d not in out)
    if len(out) > _MAX_NDIMS:
      return None
    return self.add("where", [cond, x, y], [(out, "f")],
                    lambda mesh, ins: [mtf.where(ins[0], ins[1], ins[2])],
                    lambda b, ins: [broadcast_full(b, b.xp.where(
                        align(b, ins[0], cond.dims, out), align(b, ins[1], x.dims, out),
                        align(b, ins[2], y.dims, out)), out, out)])

  def op_cast(self):
    choice = self.r.choice(["f2i", "i2f", "b2f", "b2i"])
    if choice == "f2i":
      x = self.pick("f", lambda n: _min_abs(n.value - np.round(n.value)) > _MARGIN * _scale(n.value)
                    and _min_abs(n.value) > _MARGIN)
      if x is None:
        return None
      x2 = x
      return self.add("cast(float->int32)", [x2], [(x2.dims, "i")],
                      lambda mesh, ins: [mtf.cast(ins[0], tf.int32)],
                      lambda b, ins: [_cast(b, b.stop_gradient(ins[0]), "i")])
    kind = "i" if choice == "i2f" else "b"
    x = self.pick(kind)
    if x is None:
      return None
    if choice == "b2i":
      return self.add("cast(bool->int32)", [x], [(x.dims, "i")],
                      lambda mesh, ins: [mtf.cast(ins[0], tf.int32)],
                      lambda b, ins: [_cast(b, ins[0], "i")])
    return self.add(f"cast({kind}->float32)", [x], [(x.dims, "f")],
                    lambda mesh, ins: [mtf.cast(ins[0], tf.float32)],
                    lambda b, ins: [_cast(b, ins[0], "f")])

  def op_int_arith(self):
    x = self.pick("i")
    if x is None:
      return None
    name = self.r.choice(["add", "multiply", "mod", "floordiv"])
    k = self.r.randint(1, 3)
    f = {"add": lambda a: a + k, "multiply": lambda a: a * k,
         "mod": lambda a: a % k, "floordiv": lambda a: a // k}[name]
    return self.add(f"{name}(int, {k})", [x], [(x.dims, "i")],
                    lambda mesh, ins: [f(ins[0])], lambda b, ins: [f(ins[0])])

  def op_einsum(self):
    x = self.pick("f")
    if x is None:
      return None
    n_inputs = self.r.choice([1, 2, 2, 2, 3])
    xs = [x]
    for _ in range(n_inputs - 1):
      y = self.partner(x, max_union=5)
      if not all(self.compatible(y.dims, z.dims) for z in xs):
        return None
      xs.append(y)
    union = []
    for n in xs:
      union += [d for d in n.dims if d not in union]
    form = self.r.choice(["list", "args", "matmul"]) if n_inputs == 2 else "list"
    if form == "matmul":
      counts = {}
      for n in xs:
        for d in n.dims:
          counts[d] = counts.get(d, 0) + 1
      out = tuple(d for d in union if counts[d] == 1)
    else:
      out = [d for d in union if self.r.random() < 0.6]
      self.r.shuffle(out)
      out = tuple(out)
    letters = {d[0]: chr(ord("a") + i) for i, d in enumerate(union)}
    eq = ",".join("".join(letters[nm] for nm, _ in n.dims) for n in xs)
    eq += "->" + "".join(letters[nm] for nm, _ in out)
    shape = to_shape(out)

    def mtf_fn(mesh, ins):
      if form == "matmul":
        return [mtf.matmul(ins[0], ins[1])]
      if form == "args":
        return [mtf.einsum(*ins, output_shape=shape)]
      return [mtf.einsum(ins, output_shape=shape)]
    return self.add(f"einsum[{form}] {eq}", xs, [(out, "f")], mtf_fn,
                    lambda b, ins: [b.xp.einsum(eq, *ins)])

  def op_reduce(self):
    name = self.r.choice(["reduce_sum", "reduce_sum", "reduce_mean", "reduce_max",
                          "reduce_min", "reduce_logsumexp"])
    x = self.pick("f", lambda n: len(n.dims) >= 1)
    if x is None:
      return None
    if name == "reduce_logsumexp":
      d = self.r.choice(x.dims)
      axis = x.dims.index(d)
      out = tuple(e for e in x.dims if e != d)

      def ref(b, ins):
        m = b.stop_gradient(b.xp.max(ins[0], axis=axis, keepdims=True))
        return [b.xp.log(b.xp.sum(b.xp.exp(ins[0] - m), axis=axis)) + b.xp.squeeze(m, axis)]
      return self.add(name, [x], [(out, "f")],
                      lambda mesh, ins: [mtf.reduce_logsumexp(ins[0], to_shape((d,))[0])],
                      ref)
    reduced = [d for d in x.dims if self.r.random() < 0.5] or [self.r.choice(x.dims)]
    axes = tuple(x.dims.index(d) for d in reduced)
    kept = [d for d in x.dims if d not in reduced]
    form = self.r.choice(["output_shape", "reduced_dim"])
    if form == "output_shape":
      self.r.shuffle(kept)
    out = tuple(kept)
    if name in ("reduce_max", "reduce_min"):
      v = x.value if name == "reduce_max" else -x.value
      if _top_gap(v, axes) < _MARGIN * _scale(v):
        return None
    xpname = {"reduce_sum": "sum", "reduce_mean": "mean", "reduce_max": "max",
              "reduce_min": "min"}[name]
    natural = tuple(d for d in x.dims if d not in reduced)

    def mtf_fn(mesh, ins):
      fn = getattr(mtf, name)
      if form == "output_shape":
        return [fn(ins[0], output_shape=to_shape(out))]
      dims = list(to_shape(tuple(reduced)).dims)
      return [fn(ins[0], reduced_dim=dims if len(dims) > 1 else dims[0])]
    return self.add(f"{name}[{form}]", [x], [(out, "f")], mtf_fn,
                    lambda b, ins: [align(b, getattr(b.xp, xpname)(ins[0], axis=axes),
                                          natural, out)])

  def op_softmax(self):
    name = self.r.choice(["softmax", "log_softmax"])
    x = self.pick("f", lambda n: len(n.dims) >= 1)
    if x is None:
      return None
    d = self.r.choice(x.dims)
    axis = x.dims.index(d)

    def ref(b, ins):
      z = ins[0] - b.xp.max(ins[0], axis=axis, keepdims=True)
      ls = z - b.xp.log(b.xp.sum(b.xp.exp(z), axis=axis, keepdims=True))
      return [b.xp.exp(ls) if name == "softmax" else ls]
    return self.add(name, [x], [(x.dims, "f")],
                    lambda mesh, ins: [getattr(mtf, name)(ins[0], to_shape((d,))[0])], ref)

  def op_reshape(self):
    x = self.pick(self.r.choice("ffffib"), lambda n: len(n.dims) >= 1)
    if x is None:
      return None
    dims = list(x.dims)
    how = self.r.choice(["merge", "split", "permute_names", "rename", "replace"])
    if how == "merge":
      if len(dims) < 2:
        return None
      i = self.r.randrange(len(dims) - 1)
      new = (self.fresh_name("m"), dims[i][1] * dims[i + 1][1])
      out = tuple(dims[:i] + [new] + dims[i + 2:])
    elif how in ("split", "replace"):
      i = self.r.randrange(len(dims))
      s = dims[i][1]
      facs = [f for f in range(2, s) if s % f == 0]
      if not facs:
        return None
      f = self.r.choice(facs)
      new = [(self.fresh_name("s"), f), (self.fresh_name("s"), s // f)]
      out = tuple(dims[:i] + new + dims[i + 1:])
    elif how == "permute_names":
      perm = list(dims)
      self.r.shuffle(perm)
      out = tuple(perm)
      if out == x.dims:
        return None
    else:
      i = self.r.randrange(len(dims))
      new = (self.fresh_name("r"), dims[i][1])
      out = tuple(dims[:i] + [new] + dims[i + 1:])
    for nm, s in out:
      self.registry.setdefault(nm, s)
    sizes = [s for _, s in out]
    shape = to_shape(out)

    def mtf_fn(mesh, ins):
      if how == "rename":
        return [mtf.rename_dimension(ins[0], dims[i][0], out[i][0])]
      if how == "replace":
        return [mtf.replace_dimensions(ins[0], to_shape((dims[i],))[0],
                                       list(to_shape(tuple(new)).dims))]
      return [mtf.reshape(ins[0], shape)]
    return self.add(f"reshape[{how}]", [x], [(out, x.kind)], mtf_fn,
                    lambda b, ins: [b.xp.reshape(ins[0], sizes)])

  def op_transpose(self):
    x = self.pick(self.r.choice("ffi"), lambda n: len(n.dims) >= 2)
    if x is None:
      return None
    perm = list(range(len(x.dims)))
    self.r.shuffle(perm)
    out = tuple(x.dims[p] for p in perm)
    return self.add("transpose", [x], [(out, x.kind)],
                    lambda mesh, ins: [mtf.transpose(ins[0], to_shape(out))],
                    lambda b, ins: [b.xp.transpose(ins[0], perm)])

  def op_broadcast(self):
    x = self.pick("f", lambda n: len(n.dims) < _MAX_NDIMS)
    if x is None:
      return None
    names = {n for n, _ in x.dims}
    cands = [(n, s) for n, s in self.registry.items() if n not in names]
    if not cands:
      return None
    d = self.r.choice(cands)
    out = list(x.dims)
    out.insert(self.r.randint(0, len(out)), d)
    out = tuple(out)
    return self.add("broadcast", [x], [(out, "f")],
                    lambda mesh, ins: [mtf.broadcast(ins[0], to_shape(out))],
                    lambda b, ins: [broadcast_full(b, ins[0], x.dims, out)])

  def _pick_dim(self, kind="f", min_size=1):
    x = self.pick(kind, lambda n: any(s >= min_size for _, s in n.dims))
    if x is None:
      return None, None
    d = self.r.choice([d for d in x.dims if d[1] >= min_size])
    return x, d

  def op_slice(self):
    x, d = self._pick_dim(self.r.choice("ffi"), 2)
    if x is None:
      return None
    axis = x.dims.index(d)
    begin = self.r.randrange(d[1])
    size = self.r.randint(1, d[1] - begin)
    evens = [z for z in (2, 4, 6, 8) if z <= d[1] - begin]
    if evens and self.r.random() < 0.6:
      size = self.r.choice(evens)  # splittable sizes keep more layouts legal
    out = tuple((n, size) if n == d[0] else (n, s) for n, s in x.dims)
    fn = self.r.choice([mtf.slice, mtf.mtf_slice])
    return self.add(f"slice[{begin}:{begin + size}]", [x], [(out, x.kind)],
                    lambda mesh, ins: [fn(ins[0], begin, size, d[0])],
                    lambda b, ins: [_take(b, ins[0], axis, begin, size)])

  def op_pad(self):
    x, d = self._pick_dim()
    if x is None:
      return None
    axis = x.dims.index(d)
    before, after = self.r.randint(0, 3), self.r.randint(0, 3)
    if (before + after) % 2 and self.r.random() < 0.7:
      after += 1  # keep even sizes even, so that they can still be split
    out = tuple((n, s + before + after) if n == d[0] else (n, s) for n, s in x.dims)
    pads = [[0, 0]] * len(x.dims)
    pads[axis] = [before, after]
    return self.add(f"pad[{before},{after}]", [x], [(out, "f")],
                    lambda mesh, ins: [mtf.pad(ins[0], [before, after], d[0])],
                    lambda b, ins: [b.xp.pad(ins[0], pads, mode="constant")])

  def op_concat(self):
    x, d = self._pick_dim()
    if x is None:
      return None
    axis = x.dims.index(d)
    parts = [x]
    for _ in range(self.r.randint(1, 2)):
      size = self.r.choice([d[1], d[1], 1, 2, 4])
      dims = tuple((n, size) if n == d[0] else (n, s) for n, s in x.dims)
      same = self.pick("f", lambda n: n.dims == dims)
      parts.append(same if same is not None and self.r.random() < 0.5
                   else self.new_input(dims))
    total = sum(p.dims[axis][1] for p in parts)
    out = tuple((n, total) if n == d[0] else (n, s) for n, s in x.dims)
    return self.add("concat", parts, [(out, "f")],
                    lambda mesh, ins: [mtf.concat(ins, d[0])],
                    lambda b, ins: [b.xp.concatenate(ins, axis=axis)])

  def op_split(self):
    x, d = self._pick_dim(min_size=2)
    if x is None:
      return None
    axis = x.dims.index(d)
    s = d[1]
    if self.r.random() < 0.5 and s % 2 == 0:
      arg, sizes = 2, [s // 2, s // 2]
    else:
      cut = self.r.randint(1, s - 1)
      arg = sizes = [cut, s - cut]
    outs = [(tuple((n, z) if n == d[0] else (n, q) for n, q in x.dims), "f") for z in sizes]
    begins = [0, sizes[0]]
    return self.add(f"split{sizes}", [x], outs,
                    lambda mesh, ins: mtf.split(ins[0], to_shape((d,))[0], arg),
                    lambda b, ins: [_take(b, ins[0], axis, bg, z)
                                    for bg, z in zip(begins, sizes)])

  def op_stack(self):
    x = self.pick("f", lambda n: len(n.dims) < _MAX_NDIMS)
    if x is None:
      return None
    n_parts = self.r.randint(2, 3)
    parts = [x]
    for _ in range(n_parts - 1):
      same = self.pick("f", lambda n: n.dims == x.dims and n.id != x.id)
      parts.append(same if same is not None and self.r.random() < 0.5
                   else self.new_input(x.dims))
    name = self.fresh_name("k")
    self.registry[name] = n_parts
    axis = self.r.randint(0, len(x.dims))
    out = list(x.dims)
    out.insert(axis, (name, n_parts))
    return self.add(f"stack(axis={axis})", parts, [(tuple(out), "f")],
                    lambda mesh, ins: [mtf.stack(ins, name, axis)],
                    lambda b, ins: [b.xp.stack(ins, axis=axis)])

  def op_unstack(self):
    x = self.pick("f", lambda n: any(1 <= s <= 4 for _, s in n.dims))
    if x is None:
      return None
    d = self.r.choice([d for d in x.dims if 1 <= d[1] <= 4])
    axis = x.dims.index(d)
    out = tuple(e for e in x.dims if e != d)
    return self.add("unstack", [x], [(out, "f")] * d[1],
                    lambda mesh, ins: mtf.unstack(ins[0], to_shape((d,))[0]),
                    lambda b, ins: [b.xp.moveaxis(ins[0], axis, 0)[i] for i in range(d[1])])

  def op_shift(self):
    x, d = self._pick_dim(self.r.choice("ffi"))
    if x is None:
      return None
    axis = x.dims.index(d)
    s = d[1]
    offset = self.r.randint(-s - 1, s + 1)
    wrap = self.r.random() < 0.5

    def ref(b, ins):
      t = ins[0]
      if wrap:
        return [b.xp.roll(t, offset, axis)]
      k = min(abs(offset), s)
      zshape = [q for _, q in x.dims]
      zshape[axis] = k
      zeros = b.xp.zeros(zshape, dtype=t.dtype)
      if offset >= 0:
        return [b.xp.concatenate([zeros, _take(b, t, axis, 0, s - k)], axis=axis)]
      return [b.xp.concatenate([_take(b, t, axis, k, s - k), zeros], axis=axis)]
    # Derived, not drawn: the generator's random stream stays as it was.
    split = (s + offset) % 2 == 0
    return self.add(f"shift({offset}, wrap={wrap}, split_replicas={split})", [x],
                    [(x.dims, x.kind)],
                    lambda mesh, ins: [mtf.shift(ins[0], offset, to_shape((d,))[0], wrap,
                                                 split_replicas=split)],
                    ref)

  def op_one_hot(self):
    depth = self.r.choice([2, 3, 4, 8])
    idx = self.pick("i", lambda n: len(n.dims) < _MAX_NDIMS)
    if idx is None or self.r.random() < 0.4:
      idx = self.new_input(self.random_dims(1, 2), "i", -1, depth + 1)
    name = self.fresh_name("h")
    self.registry[name] = depth
    out = tuple(idx.dims) + ((name, depth),)
    on, off = self.r.choice([(1.0, 0.0), (2.5, -1.0)])

    def ref(b, ins):
      eq = b.xp.expand_dims(ins[0], -1) == b.xp.arange(depth)
      return [b.xp.where(eq, on, off)]
    return self.add("one_hot", [idx], [(out, "f")],
                    lambda mesh, ins: [mtf.one_hot(ins[0], to_shape(out[-1:])[0],
                                                   on_value=on, off_value=off)],
                    ref)

  def op_range(self):
    d = self.r.choice(sorted(self.registry.items()))
    kind = self.r.choice("if")
    dtype = _TF_DTYPE[kind]
    return self.add(f"range({d[0]})", [], [((d,), kind)],
                    lambda mesh, ins: [mtf.range(mesh, to_shape((d,))[0], dtype)],
                    lambda b, ins: [_cast(b, b.xp.arange(d[1]), kind)])

  def op_gather(self):
    w, d = self._pick_dim()
    if w is None:
      return None
    axis = w.dims.index(d)
    others = tuple(e for e in w.dims if e != d)
    taken = {n for n, _ in w.dims}
    idx_dims = self.random_dims(0, 2, exclude=taken)
    if not idx_dims:
      return None
    idx = self.new_input(idx_dims, "i", 0, d[1])
    out = list(idx_dims) + list(others)
    natural = tuple(w.dims[:axis]) + tuple(idx_dims) + tuple(w.dims[axis + 1:])
    permute = self.r.random() < 0.3
    if permute:
      self.r.shuffle(out)
    out = tuple(out)

    def mtf_fn(mesh, ins):
      if permute:
        return [mtf.gather(ins[0], ins[1], to_shape((d,))[0], output_shape=to_shape(out))]
      return [mtf.gather(ins[0], ins[1], to_shape((d,))[0])]
    return self.add("gather", [w, idx], [(out, "f")], mtf_fn,
                    lambda b, ins: [align(b, b.xp.take(ins[0], ins[1], axis=axis),
                                          natural, out)])

  def op_cumsum(self):
    x, d = self._pick_dim(self.r.choice("ffi"))
    if x is None:
      return None
    axis = x.dims.index(d)
    exclusive = self.r.random() < 0.5

    def ref(b, ins):
      c = b.xp.cumsum(ins[0], axis=axis)
      return [c - ins[0] if exclusive else c]
    return self.add(f"cumsum(exclusive={exclusive})", [x], [(x.dims, x.kind)],
                    lambda mesh, ins: [mtf.cumsum(ins[0], to_shape((d,))[0],
                                                  exclusive=exclusive)], ref)

  def op_top_k(self):
    x, d = self._pick_dim(min_size=2)
    if x is None:
      return None
    axis = x.dims.index(d)
    k = self.r.randint(1, min(d[1], 4))
    if _sorted_gap(x.value, axis, k) < _MARGIN * _scale(x.value):
      return None
    name = self.fresh_name("t")
    self.registry[name] = k
    # reduced dimension removed, k last (the original's order)
    out = tuple(e for e in x.dims if e != d) + ((name, k),)

    def ref(b, ins):
      order = np.argsort(-b.to_numpy(ins[0]), axis=axis, kind="stable")
      idx = np.take(order, np.arange(k), axis=axis)
      values = b.xp.take_along_axis(ins[0], b.xp.asarray(idx), axis)
      return [b.xp.moveaxis(values, axis, -1), np.moveaxis(idx, axis, -1)]
    return self.add(f"top_k(k={k})", [x], [(out, "f"), (out, "i")],
                    lambda mesh, ins: list(mtf.top_k(ins[0], to_shape((d,))[0],
                                                     k_dim=to_shape(out)[-1])),
                    ref)

  def op_argmax(self):
    x, d = self._pick_dim(min_size=2)
    if x is None:
      return None
    axis = x.dims.index(d)
    if _top_gap(x.value, [axis]) < _MARGIN * _scale(x.value):
      return None
    out = tuple(e for e in x.dims if e != d)
    return self.add("argmax", [x], [(out, "i")],
                    lambda mesh, ins: [mtf.argmax(ins[0], to_shape((d,))[0])],
                    lambda b, ins: [np.argmax(b.to_numpy(ins[0]), axis=axis)])

  def op_stop_gradient(self):
    x = self.pick("f")
    if x is None:
      return None
    return self.add("stop_gradient", [x], [(x.dims, "f")],
                    lambda mesh, ins: [mtf.stop_gradient(ins[0])],
                    lambda b, ins: [b.stop_gradient(ins[0])])

  def _captured_for(self, x: Node) -> Optional[Node]:
    """A float node whose dims are a subset of x's (or None)."""
    return self.pick("f", lambda n: n.id != x.id and set(n.dims) <= set(x.dims))

  def op_while_loop(self):
    x = self.pick("f")
    if x is None:
      return None
    c = self._captured_for(x) if self.r.random() < 0.6 else None
    n_iter = self.r.randint(0, 3)
    a = self.r.choice([0.5, 0.9])
    inputs = [x] + ([c] if c is not None else [])
    # A mean over one dimension inside the body: an allreduce in the loop when
    # the layout splits that dimension.
    mean_dim = self.r.choice(x.dims) if x.dims and self.r.random() < 0.5 else None
    mean_axis = x.dims.index(mean_dim) if mean_dim is not None else None

    def mtf_fn(mesh, ins):
      i0 = mtf.constant(mesh, 0, dtype=tf.int32)
      cap = ins[1] if len(ins) > 1 else None

      def body(i, v):
        nv = v * a + mtf.tanh(v)
        if mean_dim is not None:
          nv = nv - mtf.reduce_mean(v, reduced_dim=to_shape((mean_dim,))[0]) * 0.5
        if cap is not None:
          nv = nv + cap * 0.1
        return [i + 1, nv]
      _, out = mtf.while_loop(lambda i, v: mtf.less(i, n_iter), body,
                              [i0, mtf.stop_gradient(ins[0])])
      return [out]

    def ref(b, ins):
      v = b.stop_gradient(ins[0])
      for _ in range(n_iter):
        nv = v * a + b.xp.tanh(v)
        if mean_axis is not None:
          nv = nv - b.xp.mean(v, axis=mean_axis, keepdims=True) * 0.5
        v = nv
        if c is not None:
          v = v + align(b, b.stop_gradient(ins[1]), c.dims, x.dims) * 0.1
      return [v]
    label = f"while_loop(n={n_iter}" + (f", mean over {mean_dim})" if mean_dim else ")")
    return self.add(label, inputs, [(x.dims, "f")], mtf_fn, ref)

  def op_custom_gradient(self):
    x = self.pick("f")
    if x is None:
      return None
    c = self._captured_for(x) if self.r.random() < 0.5 else None
    k = self.r.choice([2.0, -1.0, 0.5])
    inputs = [x] + ([c] if c is not None else [])

    def mtf_fn(mesh, ins):
      cap = ins[1] if len(ins) > 1 else None

      def fn(t):
        y = mtf.tanh(t)
        return y * (cap * 0.1 + 1.0) if cap is not None else y
      return [mtf.custom_gradient(fn, lambda xs, captured, ys, gs: [gs[0] * k], [ins[0]])]

    def ref(b, ins):
      y = b.xp.tanh(ins[0])
      if c is not None:
        y = y * (align(b, ins[1], c.dims, x.dims) * 0.1 + 1.0)
      return [b.stop_gradient(y - k * ins[0]) + k * ins[0]]
    return self.add(f"custom_gradient(k={k})", inputs, [(x.dims, "f")], mtf_fn, ref)

  def op_recompute_grad(self):
    x = self.pick("f")
    if x is None:
      return None
    c = self._captured_for(x)
    inputs = [x] + ([c] if c is not None else [])

    def mtf_fn(mesh, ins):
      cap = ins[1] if len(ins) > 1 else None

      def fn(t):
        y = mtf.tanh(t) * t
        return y * cap + t * 0.5 if cap is not None else y + t * 0.5
      return [mtf.recompute_grad(fn, [ins[0]])]

    def ref(b, ins):
      y = b.xp.tanh(ins[0]) * ins[0]
      if c is not None:
        return [y * align(b, ins[1], c.dims, x.dims) + ins[0] * 0.5]
      return [y + ins[0] * 0.5]
    return self.add("recompute_grad", inputs, [(x.dims, "f")], mtf_fn, ref)

  def op_random(self):
    if not self.allow_random:
      return None
    which = self.r.choice(["dropout", "random_uniform", "random_normal"])
    if which == "dropout":
      x = self.pick("f", lambda n: len(n.dims) >= 1)
      if x is None:
        return None
      rate = self.r.choice([0.25, 0.5])
      node = self._new_node(x.dims, "f", None, random_=True)
      self.steps.append(Step(f"dropout(rate={rate})", [x.id], [node.id],
                             lambda mesh, ins: [mtf.dropout(ins[0], rate=rate)], None))
      self.dropout_pairs.append((x.id, node.id, rate))
      return [node]
    dims = self.random_dims(1, 3)
    node = self._new_node(dims, "f", None, random_=True)
    fn = getattr(mtf, which)
    self.steps.append(Step(which, [], [node.id],
                           lambda mesh, ins: [fn(mesh, to_shape(dims))], None))
    return [node]

  OPS = {
      "unary": 8, "binary": 6, "add_n": 1, "compare": 2, "logical": 1, "where": 3,
      "cast": 2, "int_arith": 1, "einsum": 6, "reduce": 4, "softmax": 2, "reshape": 4,
      "transpose": 2, "broadcast": 2, "slice": 2, "pad": 2, "concat": 2, "split": 1,
      "stack": 1, "unstack": 1, "shift": 4, "one_hot": 1, "range": 1, "gather": 2,
      "cumsum": 2, "top_k": 1, "argmax": 1, "stop_gradient": 1, "while_loop": 1,
      "custom_gradient": 1, "recompute_grad": 1, "random": 1,
  }

  def generate(self, num_ops: int) -> Case:
    for _ in range(self.r.randint(1, 2)):
      self.new_input(self.random_dims(1, 3))
    names = sorted(self.OPS)
    weights = [self.OPS[n] for n in names]
    done = 0
    attempts = 0
    while done < num_ops and attempts < num_ops * 20:
      attempts += 1
      op = self.r.choices(names, weights)[0]
      if getattr(self, f"op_{op}")() is not None:
        done += 1
    floats = [n for n in self.nodes if n.kind == "f" and not n.random]
    loss_ids = [n.id for n in floats if n.consumers == 0 or self.r.random() < 0.3]
    if not loss_ids:
      loss_ids = [floats[-1].id]
    weights_ = [self.r_normal([s for _, s in self.nodes[i].dims]).astype(np.float32)
                .astype(np.float64) for i in loss_ids]
    compare_ids = [n.id for n in self.nodes if not n.random and n.id not in self.input_how
                   and (n.consumers == 0 or self.r.random() < 0.4)]
    return Case(None, self.prefix, self.nodes, self.steps, self.input_how, loss_ids,
                weights_, compare_ids, self.dropout_pairs)


def _cast(b, x, kind):
  dtype = {"f": np.float64, "i": np.int64, "b": np.bool_}[kind]
  if b is NP:
    return np.asarray(x).astype(dtype)
  return tf.cast(x, tf.as_dtype(dtype))


def generate_case(seed, prefix: str = "", num_ops: Optional[int] = None,
                  allow_random: bool = True) -> Case:
  """A random Case, fully determined by `seed` (an int or a random.Random).

  Args:
    seed: int seed, or a random.Random to draw from.
    prefix: prefix of every dimension and variable name (to put several cases
      into one mtf graph).
    num_ops: number of ops (default: random in [3, 10]).
    allow_random: whether dropout/random_uniform/random_normal may appear.
  """
  rnd = seed if isinstance(seed, random.Random) else random.Random(seed)
  if num_ops is None:
    num_ops = rnd.randint(3, 10)
  case = _Generator(rnd, prefix, allow_random).generate(num_ops)
  case.seed = seed if not isinstance(seed, random.Random) else "random.Random"
  return case


# ---------------------------------------------------------------- layouts
def tensor_shapes(graph: mtf.Graph, prefix: str = "") -> List[mtf.Shape]:
  """The distinct shapes of the graph's tensors that have a dimension whose
  name starts with prefix."""
  seen = {}
  for op in graph.operations:
    for t in op.inputs + op.outputs:
      if t.shape not in seen and any(d.name.startswith(prefix) for d in t.shape.dims):
        seen[t.shape] = None
  return list(seen)


def layout_is_legal(shapes: Sequence[mtf.Shape], rules, mesh_shape) -> bool:
  """Whether every shape has a legal layout under rules (asks the library)."""
  rules = mtf.convert_to_layout_rules(rules)
  mesh_shape = mtf.convert_to_shape(mesh_shape)
  try:
    for shape in shapes:
      rules.tensor_layout(shape, mesh_shape)
  except ValueError:
    return False
  return True


def random_layout(rnd: random.Random, shapes: Sequence[mtf.Shape], mesh_shape,
                  smart: bool = True, split_prob: float = 0.8) -> List[Tuple[str, str]]:
  """Random layout rules for the dimensions of `shapes`.

  smart=True: dimensions are visited in random order and each is split (with
  probability split_prob) over a random mesh dimension that keeps the layout
  legal: the mesh dimension divides every size the name has, and no tensor
  has another dimension already split over it. smart=False: any assignment,
  legal or not.
  """
  mesh_dims = mtf.convert_to_shape(mesh_shape).dims
  sizes: Dict[str, set] = {}
  for shape in shapes:
    for d in shape.dims:
      sizes.setdefault(d.name, set()).add(d.size)
  names = sorted(sizes)
  rnd.shuffle(names)
  rules: Dict[str, str] = {}
  for n in names:
    if rnd.random() >= split_prob:
      continue
    cands = [m for m in mesh_dims]
    rnd.shuffle(cands)
    for m in cands:
      if smart:
        if any(s % m.size for s in sizes[n]):
          continue
        if any(d.name != n and rules.get(d.name) == m.name
               for shape in shapes if n in shape.dimension_names for d in shape.dims):
          continue
      rules[n] = m.name
      break
  return sorted(rules.items())


# ---------------------------------------------------------------- running
def lower_and_export(graph: mtf.Graph, mesh: mtf.Mesh, tensors: Dict[str, mtf.Tensor],
                     mesh_shape, rules, devices: Sequence[str],
                     mode: str = "eager") -> Dict[str, np.ndarray]:
  """Lowers `graph` with a fresh PlacementMeshImpl and exports `tensors`.

  mode: "eager" (lowering runs ops immediately), "function" (inside a
  tf.function) or "simd" (a SimdMeshImpl program, run on every device).
  """
  size = mtf.convert_to_shape(mesh_shape).size
  if mode == "simd":
    impl = mtf.simd_mesh_impl.SimdMeshImpl(mesh_shape, rules, list(devices)[:size])
  else:
    impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, rules, list(devices)[:size])
  keys = sorted(tensors)

  def run():
    lowering = mtf.Lowering(graph, {mesh: impl})
    return [lowering.export_to_tf_tensor(tensors[k]) for k in keys]
  if mode == "simd":
    values = impl.run(run)
  elif mode == "function":
    values = tf.function(run)()
  else:
    values = run()
  return {k: v.numpy() for k, v in zip(keys, values)}


def compare(case: Case, got: Dict[str, np.ndarray], rtol=2e-3, atol=2e-3,
            key_prefix: str = "") -> List[str]:
  """Mismatches between exported values and the case's reference."""
  problems = []
  ref = case.reference()
  for key, expected in ref.items():
    full_key = key_prefix + key
    if key.startswith("grad/") and full_key not in got:
      # mtf.gradients gave None: the loss does not depend on that input.
      if np.any(expected != 0):
        problems.append(f"{key}: mtf gives no gradient, reference is nonzero")
      continue
    if full_key not in got:
      problems.append(f"{key}: missing from the mtf results")
      continue
    value = np.asarray(got[full_key])
    expected = np.asarray(expected)
    if value.shape != expected.shape:
      problems.append(f"{key}: shape {value.shape}, expected {expected.shape}")
      continue
    if expected.dtype == np.bool_ or np.issubdtype(expected.dtype, np.integer):
      if not np.array_equal(value.astype(expected.dtype), expected):
        problems.append(f"{key}: {value.tolist()} != {expected.tolist()}")
      continue
    tol = atol * _scale(expected)
    if not np.allclose(value, expected, rtol=rtol, atol=tol):
      err = float(np.max(np.abs(value - expected)))
      problems.append(f"{key}: max abs error {err:.3g} (scale {_scale(expected):.3g})")
  for xid, did, rate in case.dropout_pairs:
    dkey = f"{key_prefix}random/{did}"
    if dkey not in got:
      continue
    x = case.nodes[xid].value
    d = np.asarray(got[dkey], np.float64)
    kept = np.abs(d - x / (1.0 - rate)) <= 1e-3 * _scale(x / (1.0 - rate))
    dropped = d == 0
    if not np.all(kept | dropped):
      problems.append(f"random/{did}: dropout output is neither 0 nor x/(1-rate)")
  return problems


def compare_random(case: Case, got: Dict[str, np.ndarray], baseline: Dict[str, np.ndarray],
                   key_prefix: str = "") -> List[str]:
  """Random tensors must equal those of the baseline (another layout)."""
  problems = []
  for i in case.random_ids:
    key = f"{key_prefix}random/{i}"
    if not np.allclose(got[key], baseline[key], rtol=1e-6, atol=1e-6):
      problems.append(f"random/{i}: differs from the baseline layout")
  return problems


@dataclasses.dataclass
class CheckResult:
  """What `check_case` did and found."""
  problems: List[str]
  lowerings: int = 0
  illegal_layouts: int = 0
  layouts: List[Tuple[str, List[Tuple[str, str]]]] = dataclasses.field(default_factory=list)


def check_case(case: Case, rnd: random.Random, devices: Sequence[str],
               mesh_shapes: Sequence[str] = MESH_SHAPES, layouts_per_mesh: int = 1,
               unconstrained_layouts: int = 0, mode: str = "eager") -> CheckResult:
  """Builds `case` once and lowers it under random layouts of each mesh.

  Every lowering is compared with the reference; random tensors are compared
  with a single-device, layout-free lowering. Unconstrained layouts may be
  illegal: then lowering must raise a ValueError naming a mesh dimension
  (anything else is a problem), and nothing is compared.
  """
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  built = case.build(mesh)
  shapes = tensor_shapes(graph)
  result = CheckResult([])
  baseline = None
  if case.has_random:
    baseline = lower_and_export(graph, mesh, built.tensors, "single:1", [], devices, mode)
    result.lowerings += 1
    result.problems += [f"[single:1] {p}" for p in compare(case, baseline)]
  for mesh_shape in mesh_shapes:
    layouts = [random_layout(rnd, shapes, mesh_shape) for _ in range(layouts_per_mesh)]
    layouts += [random_layout(rnd, shapes, mesh_shape, smart=False)
                for _ in range(unconstrained_layouts)]
    for rules in layouts:
      where = f"[{mesh_shape} | {';'.join(f'{a}:{b}' for a, b in rules)}]"
      result.layouts.append((mesh_shape, rules))
      if not layout_is_legal(shapes, rules, mesh_shape):
        result.illegal_layouts += 1
        try:
          lower_and_export(graph, mesh, built.tensors, mesh_shape, rules, devices, mode)
        except ValueError as e:
          if "mesh dimension" not in str(e).lower():
            result.problems.append(f"{where} illegal layout, unclear error: {e}")
        else:
          result.problems.append(f"{where} illegal layout lowered without a ValueError")
        continue
      got = lower_and_export(graph, mesh, built.tensors, mesh_shape, rules, devices, mode)
      result.lowerings += 1
      problems = compare(case, got)
      if baseline is not None:
        problems += compare_random(case, got, baseline)
      result.problems += [f"{where} {p}" for p in problems]
  return result
