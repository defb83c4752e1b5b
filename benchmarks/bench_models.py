"""The models measured by the benchmarks, written twice: in mtf, and as plain
single-device TensorFlow with the same math (the baseline of every ratio)."""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf

MLP = dict(batch=256, pixels=784, hidden=1024, classes=10)
TRANSFORMER = dict(batch=16, length=128, d_model=256, heads=8, d_ff=1024, vocab=512, layers=2)
LR = 0.01


def mlp_data(seed=0):
  rng = np.random.RandomState(seed)
  images = rng.rand(MLP["batch"], MLP["pixels"]).astype(np.float32)
  labels = rng.randint(0, MLP["classes"], MLP["batch"]).astype(np.int32)
  return images, labels


def transformer_data(seed=0):
  rng = np.random.RandomState(seed)
  shape = (TRANSFORMER["batch"], TRANSFORMER["length"])
  return (rng.randint(0, TRANSFORMER["vocab"], shape).astype(np.int32),
          rng.randint(0, TRANSFORMER["vocab"], shape).astype(np.int32))


def _init(shape, seed):
  fan_in = int(np.prod(shape[:-1]))
  return (np.random.RandomState(seed).randn(*shape) / math.sqrt(fan_in)).astype(np.float32)


# ----------------------------------------------------------------------------- mtf
def build_mtf_mlp(images, labels):
  """Returns (graph, mesh, loss, update_ops) for one SGD step."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  batch = mtf.Dimension("batch", MLP["batch"])
  pixels = mtf.Dimension("pixels", MLP["pixels"])
  hidden = mtf.Dimension("hidden", MLP["hidden"])
  classes = mtf.Dimension("classes", MLP["classes"])
  x = mtf.import_tf_tensor(mesh, images, [batch, pixels])
  y = mtf.import_tf_tensor(mesh, labels, [batch])
  w1 = mtf.get_variable(mesh, "w1", [pixels, hidden],
                        initializer=tf.constant_initializer(_init([MLP["pixels"], MLP["hidden"]], 1)))
  w2 = mtf.get_variable(mesh, "w2", [hidden, classes],
                        initializer=tf.constant_initializer(_init([MLP["hidden"], MLP["classes"]], 2)))
  h = mtf.relu(mtf.einsum([x, w1], output_shape=[batch, hidden]))
  logits = mtf.einsum([h, w2], output_shape=[batch, classes])
  loss = _xent(logits, y, classes) * (1.0 / MLP["batch"])
  return graph, mesh, loss, _sgd(graph, loss)


def _xent(logits, labels, vocab_dim):
  return mtf.reduce_sum(mtf.layers.softmax_cross_entropy_with_logits(logits, labels, vocab_dim))


def _sgd(graph, loss):
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  return [mtf.assign_sub(v, g * LR) for v, g in zip(variables, grads)]


def build_mtf_transformer(ids, targets):
  """Two pre-norm-free transformer blocks (attention + ReLU FFN) with an
  embedding and a softmax output; one SGD step."""
  c = TRANSFORMER
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  batch = mtf.Dimension("batch", c["batch"])
  length = mtf.Dimension("length", c["length"])
  memory = mtf.Dimension("memory", c["length"])
  d_model = mtf.Dimension("d_model", c["d_model"])
  heads = mtf.Dimension("heads", c["heads"])
  d_kv = mtf.Dimension("d_kv", c["d_model"] // c["heads"])
  d_ff = mtf.Dimension("d_ff", c["d_ff"])
  vocab = mtf.Dimension("vocab", c["vocab"])
  x_ids = mtf.import_tf_tensor(mesh, ids, [batch, length])
  y_ids = mtf.import_tf_tensor(mesh, targets, [batch, length])
  seed = iter(range(100, 1000))
  var = lambda name, dims: mtf.get_variable(
      mesh, name, dims, initializer=tf.constant_initializer(_init([d.size for d in dims], next(seed))))
  emb = var("embedding", [vocab, d_model])
  x = mtf.gather(emb, x_ids, vocab)
  for layer in range(c["layers"]):
    wq = var(f"l{layer}/q", [d_model, heads, d_kv])
    wk = var(f"l{layer}/k", [d_model, heads, d_kv])
    wv = var(f"l{layer}/v", [d_model, heads, d_kv])
    wo = var(f"l{layer}/o", [heads, d_kv, d_model])
    q = mtf.einsum([x, wq], output_shape=[batch, length, heads, d_kv])
    mem = mtf.rename_dimension(x, "length", "memory")
    k = mtf.einsum([mem, wk], output_shape=[batch, memory, heads, d_kv])
    v = mtf.einsum([mem, wv], output_shape=[batch, memory, heads, d_kv])
    logits = mtf.einsum([q, k], output_shape=[batch, heads, length, memory]) * (d_kv.size ** -0.5)
    weights = mtf.softmax(logits, memory)
    att = mtf.einsum([weights, v], output_shape=[batch, length, heads, d_kv])
    x = x + mtf.einsum([att, wo], output_shape=[batch, length, d_model])
    w_in = var(f"l{layer}/wi", [d_model, d_ff])
    w_out = var(f"l{layer}/wo", [d_ff, d_model])
    h = mtf.relu(mtf.einsum([x, w_in], output_shape=[batch, length, d_ff]))
    x = x + mtf.einsum([h, w_out], output_shape=[batch, length, d_model])
  w_logits = var("logits", [d_model, vocab])
  logits = mtf.einsum([x, w_logits], output_shape=[batch, length, vocab])
  loss = _xent(logits, y_ids, vocab) * (1.0 / (c["batch"] * c["length"]))
  return graph, mesh, loss, _sgd(graph, loss)


def mtf_step_fn(builder, data, mesh_shape, layout, devices):
  """A compiled train step (tf.function) of an mtf model under a layout."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout, devices)
  data = [tf.constant(d) for d in data]

  @tf.function
  def step():
    graph, mesh, loss, updates = builder(*data)
    lowering = mtf.Lowering(graph, {mesh: impl})
    tf_loss = lowering.export_to_tf_tensor(loss)
    with tf.control_dependencies([lowering.lowered_operation(u) for u in updates]):
      return tf.identity(tf_loss)
  return step


# ----------------------------------------------------------------------------- plain TF
# The plain math is written once, over variables that a `make(value, names)`
# callback creates: tf.Variable here, DTensor variables in bench_dtensor.py
# (`names` are the mtf dimension names, from which a layout is derived).
def mlp_variables(make):
  return [make(_init([MLP["pixels"], MLP["hidden"]], 1), ("pixels", "hidden")),
          make(_init([MLP["hidden"], MLP["classes"]], 2), ("hidden", "classes"))]


def mlp_loss(variables, x, y):
  w1, w2 = variables
  logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2)
  return tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits)) / MLP["batch"]


MLP_INPUT_NAMES = (("batch", "pixels"), ("batch",))


def transformer_variables(make):
  """[embedding, then per layer q, k, v, o, wi, wo, then the logits weight]."""
  c = TRANSFORMER
  seed = iter(range(100, 1000))
  dk = c["d_model"] // c["heads"]
  var = lambda shape, names: make(_init(shape, next(seed)), names)
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


def transformer_loss(variables, x_ids, y_ids, lookup=tf.gather):
  """lookup(table, ids): the embedding lookup (tf.gather on the variable)."""
  c = TRANSFORMER
  dk = c["d_model"] // c["heads"]
  emb, w_logits = variables[0], variables[-1]
  x = lookup(emb, x_ids)
  for i in range(c["layers"]):
    wq, wk, wv, wo, wi, wf = variables[1 + 6 * i: 7 + 6 * i]
    q = tf.einsum("bld,dhk->blhk", x, wq)
    k = tf.einsum("bmd,dhk->bmhk", x, wk)
    v = tf.einsum("bmd,dhk->bmhk", x, wv)
    w = tf.nn.softmax(tf.einsum("blhk,bmhk->bhlm", q, k) * dk ** -0.5, axis=-1)
    att = tf.einsum("bhlm,bmhk->blhk", w, v)
    x = x + tf.einsum("blhk,hkd->bld", att, wo)
    x = x + tf.einsum("blf,fd->bld", tf.nn.relu(tf.einsum("bld,df->blf", x, wi)), wf)
  logits = tf.einsum("bld,dv->blv", x, w_logits)
  loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(y_ids, logits))
  return loss / (c["batch"] * c["length"])


TRANSFORMER_INPUT_NAMES = (("batch", "length"), ("batch", "length"))


def sgd_step_fn(loss_fn, variables, inputs, sparse_updates=True):
  """A compiled SGD step (tf.function) of loss_fn(variables, *inputs).

  sparse_updates: apply an embedding's IndexedSlices gradient with
  scatter_sub (else densify it first).
  """
  @tf.function
  def step():
    with tf.GradientTape() as tape:
      loss = loss_fn(variables, *inputs)
    for v, g in zip(variables, tape.gradient(loss, variables)):
      if isinstance(g, tf.IndexedSlices) and sparse_updates:
        v.scatter_sub(tf.IndexedSlices(g.values * LR, g.indices, g.dense_shape))
      else:
        v.assign_sub(tf.convert_to_tensor(g) * LR)
    return loss
  return step


def _plain_variable(value, names):
  del names
  return tf.Variable(value)


def plain_mlp_step_fn(images, labels):
  return sgd_step_fn(mlp_loss, mlp_variables(_plain_variable),
                     [tf.constant(images), tf.constant(labels)])


def plain_transformer_step_fn(ids, targets):
  return sgd_step_fn(transformer_loss, transformer_variables(_plain_variable),
                     [tf.constant(ids), tf.constant(targets)])
