"""Two small models written twice, in mtf and as plain single-device
TensorFlow with the same math: an MLP and a transformer (attention and a ReLU
feed-forward per layer, an embedding and a softmax output), trained with SGD.

They are the workloads of `python -m mesh_tensorflow.check_devices` and of the
benchmarks: the plain version is the baseline every mtf measurement is
compared with. Sizes are dicts (`MLP`, `TRANSFORMER` are the defaults);
`activation_dtype=tf.bfloat16` computes the activations in bfloat16 from
float32 variables (the loss and its softmax stay float32).

Example:
    >>> ids, targets = transformer_data(TRANSFORMER)
    >>> graph, mesh, loss = build_mtf_transformer(ids, targets, TRANSFORMER)
    >>> updates = sgd_updates(graph, loss)
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from mesh_tensorflow.layers import losses as layers_losses
from mesh_tensorflow.operations.gradients import gradients
from mesh_tensorflow.core.graph import Graph, Mesh
from mesh_tensorflow.operations import constant_ops as const_ops
from mesh_tensorflow.operations import einsum_ops
from mesh_tensorflow.operations import elementwise as ew
from mesh_tensorflow.operations import indexing
from mesh_tensorflow.operations import reduction
from mesh_tensorflow.operations import shape_ops
from mesh_tensorflow.operations import variables as var_ops
from mesh_tensorflow.core.shapes import Dimension

MLP = dict(batch=256, pixels=784, hidden=1024, classes=10)
TRANSFORMER = dict(batch=16, length=128, d_model=256, heads=8, d_ff=1024, vocab=512, layers=2)
LR = 0.01

Config = Dict[str, int]


def mlp_data(config: Config = MLP, seed: int = 0):
  """(images float32 [batch, pixels], labels int32 [batch]) as NumPy arrays."""
  rng = np.random.RandomState(seed)
  images = rng.rand(config["batch"], config["pixels"]).astype(np.float32)
  labels = rng.randint(0, config["classes"], config["batch"]).astype(np.int32)
  return images, labels


def transformer_data(config: Config = TRANSFORMER, seed: int = 0):
  """(input ids, target ids), int32 [batch, length] NumPy arrays."""
  rng = np.random.RandomState(seed)
  shape = (config["batch"], config["length"])
  return (rng.randint(0, config["vocab"], shape).astype(np.int32),
          rng.randint(0, config["vocab"], shape).astype(np.int32))


def initial_value(shape: Sequence[int], seed: int) -> np.ndarray:
  """The deterministic initial value of a weight: normal / sqrt(fan-in)."""
  fan_in = int(np.prod(shape[:-1]))
  return (np.random.RandomState(seed).randn(*shape) / math.sqrt(fan_in)).astype(np.float32)


def transformer_flops(config: Config = TRANSFORMER) -> int:
  """Analytic FLOPs of one training step (forward and backward, matmuls only:
  3 x 2 x multiply-adds), for cross-checking the lowering's counters."""
  c = config
  tokens = c["batch"] * c["length"]
  per_layer = 4 * c["d_model"] * c["d_model"] + 2 * c["d_model"] * c["d_ff"]
  attention = 2 * c["length"] * c["d_model"]
  matmul = tokens * (c["layers"] * (per_layer + attention) + c["d_model"] * c["vocab"])
  return 6 * matmul


# ----------------------------------------------------------------------------- mtf
def _cast(x, dtype):
  return x if x.dtype == dtype else ew.cast(x, dtype)


def _xent(logits, labels, vocab_dim):
  return reduction.reduce_sum(
      layers_losses.softmax_cross_entropy_with_logits(logits, labels, vocab_dim))


def build_mtf_mlp(images, labels, config: Config = MLP,
                  activation_dtype: tf.DType = tf.float32) -> Tuple[Graph, Mesh, object]:
  """(graph, mesh, loss) of the MLP on a mesh named "mesh"."""
  c = config
  graph = Graph()
  mesh = Mesh(graph, "mesh")
  batch = Dimension("batch", c["batch"])
  pixels = Dimension("pixels", c["pixels"])
  hidden = Dimension("hidden", c["hidden"])
  classes = Dimension("classes", c["classes"])
  x = const_ops.import_tf_tensor(mesh, images, [batch, pixels])
  y = const_ops.import_tf_tensor(mesh, labels, [batch])
  w1 = var_ops.get_variable(mesh, "w1", [pixels, hidden], initializer=tf.constant_initializer(
      initial_value([c["pixels"], c["hidden"]], 1)))
  w2 = var_ops.get_variable(mesh, "w2", [hidden, classes], initializer=tf.constant_initializer(
      initial_value([c["hidden"], c["classes"]], 2)))
  a = activation_dtype
  h = ew.relu(einsum_ops.einsum([_cast(x, a), _cast(w1, a)], output_shape=[batch, hidden]))
  logits = einsum_ops.einsum([h, _cast(w2, a)], output_shape=[batch, classes])
  loss = _xent(_cast(logits, tf.float32), y, classes) * (1.0 / c["batch"])
  return graph, mesh, loss


def build_mtf_transformer(ids, targets, config: Config = TRANSFORMER,
                          activation_dtype: tf.DType = tf.float32):
  """(graph, mesh, loss) of the transformer on a mesh named "mesh".

  Dimensions: batch, length, memory, d_model, heads, d_kv, d_ff, vocab (lay
  them out with rules such as "batch:rows;heads:cols;d_ff:cols").
  """
  c = config
  graph = Graph()
  mesh = Mesh(graph, "mesh")
  batch = Dimension("batch", c["batch"])
  length = Dimension("length", c["length"])
  memory = Dimension("memory", c["length"])
  d_model = Dimension("d_model", c["d_model"])
  heads = Dimension("heads", c["heads"])
  d_kv = Dimension("d_kv", c["d_model"] // c["heads"])
  d_ff = Dimension("d_ff", c["d_ff"])
  vocab = Dimension("vocab", c["vocab"])
  a = activation_dtype
  x_ids = const_ops.import_tf_tensor(mesh, ids, [batch, length])
  y_ids = const_ops.import_tf_tensor(mesh, targets, [batch, length])
  seed = iter(range(100, 1000))

  def var(name, dims):
    w = var_ops.get_variable(mesh, name, dims, initializer=tf.constant_initializer(
        initial_value([d.size for d in dims], next(seed))))
    return _cast(w, a)
  emb = var("embedding", [vocab, d_model])
  x = indexing.gather(emb, x_ids, vocab)
  for layer in range(c["layers"]):
    wq = var(f"l{layer}/q", [d_model, heads, d_kv])
    wk = var(f"l{layer}/k", [d_model, heads, d_kv])
    wv = var(f"l{layer}/v", [d_model, heads, d_kv])
    wo = var(f"l{layer}/o", [heads, d_kv, d_model])
    q = einsum_ops.einsum([x, wq], output_shape=[batch, length, heads, d_kv])
    mem = shape_ops.rename_dimension(x, "length", "memory")
    k = einsum_ops.einsum([mem, wk], output_shape=[batch, memory, heads, d_kv])
    v = einsum_ops.einsum([mem, wv], output_shape=[batch, memory, heads, d_kv])
    logits = einsum_ops.einsum([q, k], output_shape=[batch, heads, length, memory]) * (
        d_kv.size ** -0.5)
    weights = reduction.softmax(logits, memory)
    att = einsum_ops.einsum([weights, v], output_shape=[batch, length, heads, d_kv])
    x = x + einsum_ops.einsum([att, wo], output_shape=[batch, length, d_model])
    w_in = var(f"l{layer}/wi", [d_model, d_ff])
    w_out = var(f"l{layer}/wo", [d_ff, d_model])
    h = ew.relu(einsum_ops.einsum([x, w_in], output_shape=[batch, length, d_ff]))
    x = x + einsum_ops.einsum([h, w_out], output_shape=[batch, length, d_model])
  w_logits = var("logits", [d_model, vocab])
  logits = einsum_ops.einsum([x, w_logits], output_shape=[batch, length, vocab])
  loss = _xent(_cast(logits, tf.float32), y_ids, vocab) * (1.0 / (c["batch"] * c["length"]))
  return graph, mesh, loss


def sgd_updates(graph: Graph, loss, lr: float = LR) -> list:
  """The assign ops of one SGD step on every trainable variable."""
  variables = graph.trainable_variables
  grads = gradients([loss], [v.outputs[0] for v in variables])
  return [var_ops.assign_sub(v, g * lr) for v, g in zip(variables, grads)]


def variable_gradients(graph: Graph, loss) -> List[Tuple[str, object]]:
  """[(variable name, gradient mtf Tensor)] for every trainable variable."""
  variables = graph.trainable_variables
  grads = gradients([loss], [v.outputs[0] for v in variables])
  return [(v.name, g) for v, g in zip(variables, grads)]


# ----------------------------------------------------------------------------- plain TF
# The plain math is written once, over variables that a `make(value, names)`
# callback creates (tf.Variable, or e.g. DTensor variables; `names` are the mtf
# dimension names, from which a layout can be derived).
def mlp_variables(make: Callable, config: Config = MLP) -> list:
  c = config
  return [make(initial_value([c["pixels"], c["hidden"]], 1), ("pixels", "hidden")),
          make(initial_value([c["hidden"], c["classes"]], 2), ("hidden", "classes"))]


def mlp_loss(variables, x, y, config: Config = MLP, activation_dtype: tf.DType = tf.float32):
  a = activation_dtype
  w1, w2 = (tf.cast(w, a) for w in variables)
  logits = tf.matmul(tf.nn.relu(tf.matmul(tf.cast(x, a), w1)), w2)
  xent = tf.nn.sparse_softmax_cross_entropy_with_logits(y, tf.cast(logits, tf.float32))
  return tf.reduce_sum(xent) / config["batch"]


MLP_INPUT_NAMES = (("batch", "pixels"), ("batch",))


def transformer_variables(make: Callable, config: Config = TRANSFORMER) -> list:
  """[embedding, then per layer q, k, v, o, wi, wo, then the logits weight]."""
  c = config
  seed = iter(range(100, 1000))
  dk = c["d_model"] // c["heads"]
  var = lambda shape, names: make(initial_value(shape, next(seed)), names)
  variables = [var([c["vocab"], c["d_model"]], ("vocab", "d_model"))]
  for _ in range(c["layers"]):
    variables += [
        var([c["d_model"], c["heads"], dk], ("d_model", "heads", "d_kv")),
        var([c["d_model"], c["heads"], dk], ("d_model", "heads", "d_kv")),
        var([c["d_model"], c["heads"], dk], ("d_model", "heads", "d_kv")),
        var([c["heads"], dk, c["d_model"]], ("heads", "d_kv", "d_model")),
        var([c["d_model"], c["d_ff"]], ("d_model", "d_ff")),
        var([c["d_ff"], c["d_model"]], ("d_ff", "d_model"))]
  return variables + [var([c["d_model"], c["vocab"]], ("d_model", "vocab"))]


def transformer_loss(variables, x_ids, y_ids, lookup=tf.gather, config: Config = TRANSFORMER,
                     activation_dtype: tf.DType = tf.float32):
  """lookup(table, ids): the embedding lookup (tf.gather on the variable)."""
  c = config
  a = activation_dtype
  dk = c["d_model"] // c["heads"]
  emb, w_logits = variables[0], variables[-1]
  x = tf.cast(lookup(emb, x_ids), a)
  for i in range(c["layers"]):
    wq, wk, wv, wo, wi, wf = (tf.cast(w, a) for w in variables[1 + 6 * i: 7 + 6 * i])
    q = tf.einsum("bld,dhk->blhk", x, wq)
    k = tf.einsum("bmd,dhk->bmhk", x, wk)
    v = tf.einsum("bmd,dhk->bmhk", x, wv)
    w = tf.nn.softmax(tf.einsum("blhk,bmhk->bhlm", q, k) * tf.cast(dk ** -0.5, a), axis=-1)
    att = tf.einsum("bhlm,bmhk->blhk", w, v)
    x = x + tf.einsum("blhk,hkd->bld", att, wo)
    x = x + tf.einsum("blf,fd->bld", tf.nn.relu(tf.einsum("bld,df->blf", x, wi)), wf)
  logits = tf.cast(tf.einsum("bld,dv->blv", x, tf.cast(w_logits, a)), tf.float32)
  loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(y_ids, logits))
  return loss / (c["batch"] * c["length"])


TRANSFORMER_INPUT_NAMES = (("batch", "length"), ("batch", "length"))


def sgd_step_fn(loss_fn: Callable, variables, inputs, sparse_updates: bool = True,
                lr: float = LR, jit_compile: Optional[bool] = None):
  """A compiled SGD step (tf.function) of loss_fn(variables, *inputs).

  sparse_updates: apply an embedding's IndexedSlices gradient with
  scatter_sub (else densify it first).
  """
  def step():
    with tf.GradientTape() as tape:
      loss = loss_fn(variables, *inputs)
    for v, g in zip(variables, tape.gradient(loss, variables)):
      if isinstance(g, tf.IndexedSlices) and sparse_updates:
        v.scatter_sub(tf.IndexedSlices(g.values * lr, g.indices, g.dense_shape))
      else:
        v.assign_sub(tf.convert_to_tensor(g) * lr)
    return loss
  return tf.function(step, jit_compile=jit_compile)


def plain_variable(value, names):
  del names
  return tf.Variable(value)
