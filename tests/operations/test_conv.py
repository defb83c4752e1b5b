"""Convolutions, pooling and halo exchange: values and gradients under layouts
equal a single-device TensorFlow computation.

Each layout test builds one mtf graph holding several ops (to trace few
functions), differentiates a weighted sum of their outputs with
mtf.gradients, and compares every output and gradient with tf.nn ops and
tf.GradientTape on one device.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.layers import convolution as conv_layers
import mtf_test_utils as U

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _dims(spec: str):
  return [mtf.Dimension(n, int(s)) for n, s in (p.split(":") for p in spec.split(";"))]


def _normal(rng, shape):
  return rng.normal(size=shape).astype(np.float32)


def _run_and_compare(builder, reference, mesh_shape, layout, rtol=1e-4, atol=1e-4):
  """Runs builder under the layout; compares with reference (dict of arrays)."""
  out, lowering = U.lower_and_run(builder, mesh_shape, layout, return_lowering=True)
  assert sorted(out) == sorted(reference)
  for k in reference:
    U.assert_allclose(out[k], reference[k], rtol=rtol, atol=atol,
                      msg=f"{k} under '{layout}' on '{mesh_shape}'")
  return lowering


def _loss_and_grads(outputs, weights, wrt):
  """sum_k <outputs[k], weights[k]> and its gradients (mtf)."""
  loss = mtf.add_n([mtf.reduce_sum(outputs[k] * weights[k]) for k in outputs])
  return loss, mtf.gradients([loss], wrt)


def _tf_loss_and_grads(fn, wrt_values, weights):
  """Reference: outputs of fn(*wrt), then gradients of the weighted sum."""
  wrt = [tf.constant(v) for v in wrt_values]
  with tf.GradientTape() as tape:
    tape.watch(wrt)
    outs = fn(*wrt)
    loss = tf.add_n([tf.reduce_sum(outs[k] * weights[k]) for k in outs])
  grads = tape.gradient(loss, wrt)
  return {k: v.numpy() for k, v in outs.items()}, [g.numpy() for g in grads]


# ---- 2D ----------------------------------------------------------------------------
X2 = _dims("batch:8;h:8;w:8;in:8")
K33 = _dims("fh:3;fw:3;in:8;out:8")
K31 = _dims("kh:3;kw:1;in:8;out:8")
K22 = _dims("th:2;tw:2;out:8;in:8")   # transposed filter [.., out, in]
RNG = np.random.default_rng(0)
X2_NP = _normal(RNG, [8, 8, 8, 8])
K33_NP = _normal(RNG, [3, 3, 8, 8]) * 0.3
K31_NP = _normal(RNG, [3, 1, 8, 8]) * 0.3
K22_NP = _normal(RNG, [2, 2, 8, 8]) * 0.3
OUT2_SHAPES = {"same": [8, 8, 8, 8], "strided": [8, 4, 4, 8], "valid": [8, 6, 8, 8],
               "transpose": [8, 16, 16, 8], "max_pool": [8, 4, 4, 8],
               "avg_pool": [8, 4, 4, 8]}
W2_NP = {k: _normal(RNG, s) for k, s in OUT2_SHAPES.items()}


def _tf_2d(x, k33, k31, k22):
  return {
      "same": tf.nn.conv2d(x, k33, 1, "SAME"),
      "strided": tf.nn.conv2d(x, k33, 2, "SAME"),
      "valid": tf.nn.conv2d(x, k31, 1, "VALID"),
      "transpose": tf.nn.conv2d_transpose(x, k22, [8, 16, 16, 8], 2, "SAME"),
      "max_pool": tf.nn.max_pool2d(x, 2, 2, "VALID"),
      "avg_pool": tf.nn.avg_pool2d(x, 3, 2, "SAME"),
  }


def _mtf_2d_builder(mesh):
  x = mtf.import_tf_tensor(mesh, tf.constant(X2_NP), X2)
  k33 = mtf.import_tf_tensor(mesh, tf.constant(K33_NP), K33)
  k31 = mtf.import_tf_tensor(mesh, tf.constant(K31_NP), K31)
  k22 = mtf.import_tf_tensor(mesh, tf.constant(K22_NP), K22)
  outs = {
      "same": mtf.conv2d(x, k33, (1, 1), "SAME"),
      "strided": mtf.conv2d(x, k33, [1, 2, 2, 1], "SAME"),
      "valid": mtf.conv2d(x, k31, 1, "VALID"),
      "transpose": mtf.conv2d_transpose(x, k22, (2, 2), "SAME"),
      "max_pool": mtf.max_pool2d(x, (2, 2)),
      "avg_pool": mtf.avg_pool2d(x, 3, 2, "SAME"),
  }
  weights = {k: mtf.import_tf_tensor(mesh, tf.constant(W2_NP[k]), outs[k].shape)
             for k in outs}
  _, grads = _loss_and_grads(outs, weights, [x, k33, k31, k22])
  result = dict(outs)
  result.update({f"d_{n}": g for n, g in zip(["x", "k33", "k31", "k22"], grads)})
  return result


def _reference_2d():
  outs, grads = _tf_loss_and_grads(_tf_2d, [X2_NP, K33_NP, K31_NP, K22_NP], W2_NP)
  outs.update({f"d_{n}": g for n, g in zip(["x", "k33", "k31", "k22"], grads)})
  return outs


LAYOUTS_2D = [
    ("all:1", ""),                                   # single device
    ("all:8", "batch:all"),                          # batch split
    ("rows:2;cols:4", "batch:rows;out:cols"),        # batch and out_channels split
    ("all:8", "in:all"),                             # in_channels split: allreduce
    ("a:2;b:2;c:2", "batch:a;in:b;out:c"),           # all three
    ("rows:2;cols:4", "h:rows;w:cols"),              # plain spatial split: gathered
    ("rows:2;cols:4", "batch:rows;th:rows;out:cols"),  # filter-spatial split
]


@pytest.mark.parametrize("mesh_shape,layout", LAYOUTS_2D)
def test_conv2d_family_matches_tf(mesh_shape, layout):
  lowering = _run_and_compare(_mtf_2d_builder, _reference_2d(), mesh_shape, layout)
  counts = lowering.collective_counts()
  if layout in ("", "batch:all"):
    assert "allgather" not in counts, counts
  if layout == "in:all":
    # Forward convs reduce in_channels; no spatial gathering anywhere.
    assert counts.get("allreduce", (0, 0))[0] >= 1 and "allgather" not in counts, counts


# ---- second order, explicit backprop ops, dimension orders ---------------------------
U_NP = {"dx": _normal(RNG, [8, 8, 8, 8]), "dk": _normal(RNG, [3, 3, 8, 8]),
        "dxp": _normal(RNG, [8, 8, 8, 8])}
RT_NP = _normal(RNG, [8, 16, 16, 8])   # a gradient of the transposed conv's output


def _second_order_builder(mesh):
  x = mtf.import_tf_tensor(mesh, tf.constant(X2_NP), X2)
  k = mtf.import_tf_tensor(mesh, tf.constant(K33_NP), K33)
  kt = mtf.import_tf_tensor(mesh, tf.constant(K22_NP), K22)
  r = mtf.import_tf_tensor(mesh, tf.constant(W2_NP["same"]), x.shape.rename_dimension("in", "out"))
  rp = mtf.import_tf_tensor(mesh, tf.constant(W2_NP["max_pool"]), _dims("batch:8;h:4;w:4;in:8"))
  ra = mtf.import_tf_tensor(mesh, tf.constant(W2_NP["max_pool"] * 0.5), rp.shape)
  rt = mtf.import_tf_tensor(mesh, tf.constant(RT_NP), _dims("batch:8;h:16;w:16;out:8"))
  u = {n: mtf.import_tf_tensor(mesh, tf.constant(v), s)
       for (n, v), s in zip(U_NP.items(), [X2, K33, X2])}
  loss1 = mtf.reduce_sum(mtf.conv2d(x, k, 1, "SAME") * r)
  dx, dk = mtf.gradients([loss1], [x, k])
  loss_p = (mtf.reduce_sum(mtf.max_pool2d(x, 2) * rp)
            + mtf.reduce_sum(mtf.avg_pool2d(x, 2) * ra))
  [dxp] = mtf.gradients([loss_p], [x])
  loss2 = (mtf.reduce_sum(dx * u["dx"]) + mtf.reduce_sum(dk * u["dk"])
           + mtf.reduce_sum(dxp * u["dxp"]))
  grads = mtf.gradients([loss2], [x, k, r, rp, ra])
  out = {f"dd_{n}": g for n, g in zip(["x", "k", "r", "rp", "ra"], grads)}
  out.update({
      "dx": dx, "dk": dk, "dxp": dxp,
      "explicit_in": mtf.conv2d_backprop_input(x.shape, k, r, (1, 1), "SAME"),
      "explicit_filter": mtf.conv2d_backprop_filter(x, k.shape, r, (1, 1), "SAME"),
      "explicit_t_in": mtf.conv2d_transpose_backprop_input(x.shape, kt, rt, 2, "SAME"),
      "explicit_t_filter": mtf.conv2d_transpose_backprop_filter(x, kt.shape, rt, 2, "SAME"),
  })
  return out


def _second_order_reference():
  x, k, kt, r, rp, ra = [tf.constant(v) for v in (
      X2_NP, K33_NP, K22_NP, W2_NP["same"], W2_NP["max_pool"], W2_NP["max_pool"] * 0.5)]
  rt = tf.constant(RT_NP)
  with tf.GradientTape(persistent=True) as outer:
    outer.watch([x, k, r, rp, ra])
    with tf.GradientTape(persistent=True) as inner:
      inner.watch([x, k, kt])
      loss1 = tf.reduce_sum(tf.nn.conv2d(x, k, 1, "SAME") * r)
      loss_p = (tf.reduce_sum(tf.nn.max_pool2d(x, 2, 2, "VALID") * rp)
                + tf.reduce_sum(tf.nn.avg_pool2d(x, 2, 2, "VALID") * ra))
      loss_t = tf.reduce_sum(tf.nn.conv2d_transpose(x, kt, [8, 16, 16, 8], 2, "SAME") * rt)
    dx, dk = inner.gradient(loss1, [x, k])
    dxp = inner.gradient(loss_p, x)
    loss2 = (tf.reduce_sum(dx * U_NP["dx"]) + tf.reduce_sum(dk * U_NP["dk"])
             + tf.reduce_sum(dxp * U_NP["dxp"]))
  wrt = [x, k, r, rp, ra]
  grads = outer.gradient(loss2, wrt)
  out = {f"dd_{n}": (g if g is not None else tf.zeros_like(v)).numpy()
         for n, g, v in zip(["x", "k", "r", "rp", "ra"], grads, wrt)}
  t_in, t_filter = inner.gradient(loss_t, [x, kt])
  out.update({"dx": dx.numpy(), "dk": dk.numpy(), "dxp": dxp.numpy(),
              "explicit_in": dx.numpy(), "explicit_filter": dk.numpy(),
              "explicit_t_in": t_in.numpy(), "explicit_t_filter": t_filter.numpy()})
  return out


@pytest.mark.parametrize("mesh_shape,layout", [
    ("all:1", ""), ("rows:2;cols:4", "batch:rows;out:cols"), ("all:8", "in:all")])
def test_second_order_gradients_and_explicit_backprops(mesh_shape, layout):
  _run_and_compare(_second_order_builder, _second_order_reference(), mesh_shape, layout)


def test_channels_first_and_other_dimension_orders():
  """Channels first: the spatial dims are the last two besides the channels."""
  dims = _dims("in:8;batch:8;h:8;w:8")
  x_np = X2_NP.transpose(3, 0, 1, 2)

  def builder(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(x_np), dims)
    k = mtf.import_tf_tensor(mesh, tf.constant(K33_NP), K33)
    y = mtf.conv2d(x, k, 1, "SAME")          # [out, batch, h, w]
    [dk] = mtf.gradients([mtf.reduce_sum(y * y)], [k])
    return {"y": y, "dk": dk}
  xt, kt = tf.constant(X2_NP), tf.constant(K33_NP)
  with tf.GradientTape() as tape:
    tape.watch(kt)
    y = tf.nn.conv2d(xt, kt, 1, "SAME")
    loss = tf.reduce_sum(y * y)
  reference = {"y": y.numpy().transpose(3, 0, 1, 2), "dk": tape.gradient(loss, kt).numpy()}
  _run_and_compare(builder, reference, "rows:2;cols:4", "batch:rows;out:cols",
                   rtol=2e-4, atol=2e-3)


# ---- 3D ----------------------------------------------------------------------------
X3 = _dims("batch:4;d:4;h:4;w:4;in:4")
K3 = _dims("fd:3;fh:3;fw:3;in:4;out:4")
K3T = _dims("td:2;th:2;tw:2;out:4;in:4")
X3_NP = _normal(RNG, [4, 4, 4, 4, 4])
K3_NP = _normal(RNG, [3, 3, 3, 4, 4]) * 0.3
K3T_NP = _normal(RNG, [2, 2, 2, 4, 4]) * 0.3
OUT3_SHAPES = {"conv": [4, 4, 4, 4, 4], "transpose": [4, 8, 8, 8, 4],
               "max_pool": [4, 2, 2, 2, 4], "avg_pool": [4, 2, 2, 2, 4]}
W3_NP = {k: _normal(RNG, s) for k, s in OUT3_SHAPES.items()}


def _tf_3d(x, k, kt):
  return {
      "conv": tf.nn.conv3d(x, k, [1, 1, 1, 1, 1], "SAME"),
      "transpose": tf.nn.conv3d_transpose(x, kt, [4, 8, 8, 8, 4], [1, 2, 2, 2, 1], "SAME"),
      "max_pool": tf.nn.max_pool3d(x, 2, 2, "VALID"),
      "avg_pool": tf.nn.avg_pool3d(x, 2, 2, "VALID"),
  }


def _mtf_3d_builder(mesh):
  x = mtf.import_tf_tensor(mesh, tf.constant(X3_NP), X3)
  k = mtf.import_tf_tensor(mesh, tf.constant(K3_NP), K3)
  kt = mtf.import_tf_tensor(mesh, tf.constant(K3T_NP), K3T)
  outs = {
      "conv": mtf.conv3d(x, k, (1, 1, 1), "SAME"),
      "transpose": mtf.conv3d_transpose(x, kt, (2, 2, 2), "SAME"),
      "max_pool": mtf.max_pool3d(x, (2, 2, 2)),
      "avg_pool": mtf.avg_pool3d(x, (2, 2, 2)),
  }
  weights = {n: mtf.import_tf_tensor(mesh, tf.constant(W3_NP[n]), outs[n].shape)
             for n in outs}
  _, grads = _loss_and_grads(outs, weights, [x, k, kt])
  outs.update({f"d_{n}": g for n, g in zip(["x", "k", "kt"], grads)})
  return outs


def _reference_3d():
  outs, grads = _tf_loss_and_grads(_tf_3d, [X3_NP, K3_NP, K3T_NP], W3_NP)
  outs.update({f"d_{n}": g for n, g in zip(["x", "k", "kt"], grads)})
  return outs


@pytest.mark.parametrize("mesh_shape,layout", [
    ("all:1", ""),
    ("rows:2;cols:2", "batch:rows;out:cols"),
    ("rows:2;cols:2", "in:rows;d:cols"),
])
def test_conv3d_family_matches_tf(mesh_shape, layout):
  _run_and_compare(_mtf_3d_builder, _reference_3d(), mesh_shape, layout)


# ---- halo exchange -----------------------------------------------------------------
def _numpy_halo(x, halo, wrap):
  """x: [batch, blocks, size, c] -> [batch, blocks, size + 2 * halo, c]."""
  b, nb, size, c = x.shape
  flat = x.reshape(b, nb * size, c)
  mode = "wrap" if wrap else "constant"
  padded = np.pad(flat, [(0, 0), (halo, halo), (0, 0)], mode=mode)
  return np.stack([padded[:, i * size:i * size + size + 2 * halo] for i in range(nb)],
                  axis=1)


@pytest.mark.parametrize("mesh_shape,layout", [
    ("all:1", ""), ("all:4", "blocks:all"), ("rows:2;cols:2", "batch:rows;blocks:cols")])
def test_halo_exchange(mesh_shape, layout):
  dims = _dims("batch:2;blocks:4;size:2;c:3")
  x_np = _normal(np.random.default_rng(1), [2, 4, 2, 3])
  cases = [(1, False), (1, True), (3, False), (4, True)]   # halos of 3, 4 span blocks

  def builder(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(x_np), dims)
    return {f"{h}_{w}": mtf.halo_exchange(x, "blocks", dims[2], h, wrap=w)
            for h, w in cases}
  reference = {f"{h}_{w}": _numpy_halo(x_np, h, w) for h, w in cases}
  lowering = _run_and_compare(builder, reference, mesh_shape, layout, rtol=0, atol=0)
  counts = lowering.collective_counts()
  if "blocks" in layout:
    assert counts.get("permute", (0, 0))[0] > 0 and "allgather" not in counts, counts


# ---- spatial partitioning: conv over blocks -----------------------------------------
def _blocked(image, h_blocks, w_blocks):
  """[b, H, W, c] -> [b, h_blocks, H/h_blocks, w_blocks, W/w_blocks, c]."""
  b, hh, ww, c = image.shape
  return image.reshape(b, h_blocks, hh // h_blocks, w_blocks, ww // w_blocks, c)


IMG_NP = _normal(RNG, [2, 16, 8, 4])
KB = {"k3": _normal(RNG, [3, 3, 4, 4]) * 0.3,    # halo 1
      "k5": _normal(RNG, [5, 5, 4, 4]) * 0.3,    # halo 2 = a whole block on h
      "k2": _normal(RNG, [2, 2, 4, 4]) * 0.3}    # even: halo only after
BLOCK_OUT = {"k3": [2, 16, 8, 4], "k5": [2, 16, 8, 4], "k2": [2, 16, 8, 4],
             "k3_s2": [2, 8, 4, 4], "pool": [2, 8, 4, 4]}
WB_NP = {k: _normal(RNG, s) for k, s in BLOCK_OUT.items()}


def _tf_blocks(img, k3, k5, k2):
  y3 = tf.nn.conv2d(img, k3, 1, "SAME")
  return {"k3": y3, "k5": tf.nn.conv2d(img, k5, 1, "SAME"),
          "k2": tf.nn.conv2d(img, k2, 1, "SAME"), "k3_s2": tf.nn.conv2d(img, k3, 2, "SAME"),
          "pool": tf.nn.max_pool2d(y3, 2, 2, "VALID")}


def _reference_blocks(h_blocks, w_blocks):
  outs, grads = _tf_loss_and_grads(
      _tf_blocks, [IMG_NP, KB["k3"], KB["k5"], KB["k2"]], WB_NP)
  result = {k: _blocked(v, h_blocks, w_blocks) for k, v in outs.items()}
  result["d_x"] = _blocked(grads[0], h_blocks, w_blocks)
  result.update({f"d_{n}": g for n, g in zip(["k3", "k5", "k2"], grads[1:])})
  return result


def _blocks_builder(h_blocks, w_blocks):
  def builder(mesh):
    hb, wb = mtf.Dimension("h_blocks", h_blocks), mtf.Dimension("w_blocks", w_blocks)
    dims = [mtf.Dimension("batch", 2), hb, mtf.Dimension("h", 16 // h_blocks), wb,
            mtf.Dimension("w", 8 // w_blocks), mtf.Dimension("in", 4)]
    x = mtf.import_tf_tensor(mesh, tf.constant(_blocked(IMG_NP, h_blocks, w_blocks)), dims)
    ks = {}
    for n, v in KB.items():
      f = v.shape[0]
      ks[n] = mtf.import_tf_tensor(
          mesh, tf.constant(v), _dims(f"f{n}h:{f};f{n}w:{f};in:4;out:4"))
    y3 = mtf.conv2d(x, ks["k3"], (1, 1), "SAME", h_blocks_dim=hb, w_blocks_dim=wb)
    outs = {"k3": y3,
            "k5": mtf.conv2d(x, ks["k5"], 1, "SAME", h_blocks_dim=hb, w_blocks_dim=wb),
            "k2": mtf.conv2d(x, ks["k2"], 1, "SAME", h_blocks_dim=hb, w_blocks_dim=wb),
            "k3_s2": mtf.conv2d(x, ks["k3"], 2, "SAME", h_blocks_dim=hb, w_blocks_dim=wb),
            "pool": mtf.max_pool2d(y3, (2, 2), h_blocks_dim=hb, w_blocks_dim=wb)}
    weights = {k: mtf.import_tf_tensor(
        mesh, tf.constant(_blocked(WB_NP[k], h_blocks, w_blocks)), outs[k].shape)
               for k in outs}
    _, grads = _loss_and_grads(outs, weights, [x, ks["k3"], ks["k5"], ks["k2"]])
    outs.update({f"d_{n}": g for n, g in zip(["x", "k3", "k5", "k2"], grads)})
    return outs
  return builder


@pytest.mark.parametrize("h_blocks,w_blocks,mesh_shape,layout", [
    (4, 2, "all:1", ""),
    (8, 1, "all:8", "h_blocks:all"),                        # block of 2 rows, halo up to 2
    (4, 2, "rows:4;cols:2", "h_blocks:rows;w_blocks:cols"),
    (4, 2, "a:2;b:2;c:2", "batch:a;h_blocks:b;out:c"),
])
def test_conv2d_over_blocks_matches_whole_image(h_blocks, w_blocks, mesh_shape, layout):
  lowering = _run_and_compare(_blocks_builder(h_blocks, w_blocks),
                              _reference_blocks(h_blocks, w_blocks), mesh_shape, layout)
  counts = lowering.collective_counts()
  if layout:
    # The image is never gathered: halos move by permutes between neighbours.
    assert "allgather" not in counts and counts["permute"][0] > 0, counts


def test_blocks_in_original_dimension_order():
  """[batch, h_blocks, w_blocks, h, w, c] works as well as interleaved order."""
  img = IMG_NP[..., :4]
  blocked = _blocked(img, 4, 2).transpose(0, 1, 3, 2, 4, 5)
  dims = _dims("batch:2;h_blocks:4;w_blocks:2;h:4;w:4;in:4")

  def builder(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(blocked), dims)
    k = mtf.import_tf_tensor(mesh, tf.constant(KB["k3"]), _dims("fh:3;fw:3;in:4;out:4"))
    return {"y": mtf.conv2d_with_blocks(x, k, (1, 1), "SAME", dims[1], dims[2])}
  expected = _blocked(tf.nn.conv2d(img, KB["k3"], 1, "SAME").numpy(), 4, 2)
  _run_and_compare(builder, {"y": expected.transpose(0, 1, 3, 2, 4, 5)}, "rows:4;cols:2",
                   "h_blocks:rows;w_blocks:cols")


def test_invalid_arguments_raise():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, _dims("batch:2;hb:2;h:4;w:4;c:3"))
  k = mtf.zeros(mesh, _dims("fh:3;fw:3;c:3;out:2"))
  with pytest.raises(ValueError, match="SAME"):
    mtf.conv2d(x, k, 1, "VALID", h_blocks_dim="hb")
  with pytest.raises(ValueError, match="channel"):
    mtf.conv2d(x, mtf.zeros(mesh, _dims("fh:3;fw:3;other:3;out:2")), 1, "SAME")
  with pytest.raises(ValueError, match="padding"):
    mtf.conv2d(x, k, 1, "FULL")
  with pytest.raises(ValueError, match="inside a block"):
    mtf.max_pool2d(x, 3, 2, h_blocks_dim="hb")


# ---- layers --------------------------------------------------------------------------
def test_conv_layers_shapes_and_layout_invariance():
  """Layers build their kernels by name, so blocked and plain conv2d layers
  (and any layout) give the same values."""
  img = _normal(np.random.default_rng(2), [2, 8, 8, 3])
  filters = mtf.Dimension("filters", 4)

  def plain(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(img), _dims("batch:2;h:8;w:8;c:3"))
    y = conv_layers.conv2d(x, filters, name="conv")
    seq = mtf.reshape(x, _dims("batch:2;length:64;c:3"))
    return {"conv": y,
            "conv1d": conv_layers.conv1d(seq, filters, filter_size=3),
            "up": conv_layers.conv2d_transpose(y, mtf.Dimension("up", 2)),
            "pool": conv_layers.avg_pool2d(conv_layers.max_pool2d(y), ksize=2),
            "vol": conv_layers.conv3d(mtf.reshape(x, _dims("batch:2;d:2;h:4;w:8;c:3")),
                                      filters, filter_size=2),
            "vol_up": conv_layers.conv3d_transpose(
                mtf.reshape(x, _dims("batch:2;d:2;h:4;w:8;c:3")), filters)}

  def blocked(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(img.reshape(2, 4, 2, 8, 3)),
                             _dims("batch:2;hb:4;h:2;w:8;c:3"))
    y = conv_layers.conv2d_with_blocks(x, filters, h_blocks_dim="hb", name="conv")
    return {"conv": mtf.reshape(y, _dims("batch:2;h:8;w:8;filters:4"))}
  a = U.lower_and_run(plain, "all:1", "")
  assert a["conv"].shape == (2, 8, 8, 4) and a["conv1d"].shape == (2, 64, 4)
  assert a["up"].shape == (2, 16, 16, 2) and a["pool"].shape == (2, 2, 2, 4)
  assert a["vol"].shape == (2, 2, 4, 8, 4) and a["vol_up"].shape == (2, 4, 8, 16, 4)
  b = U.lower_and_run(plain, "rows:2;cols:2", "batch:rows;filters:cols")
  c = U.lower_and_run(blocked, "all:4", "hb:all")
  for k in a:
    U.assert_allclose(b[k], a[k], msg=k)
  U.assert_allclose(c["conv"], a["conv"])


def test_unnamed_layers_get_their_own_kernels():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, _dims("batch:2;h:4;w:4;c:3"))
  y = conv_layers.conv2d(x, mtf.Dimension("f1", 4))
  conv_layers.conv2d(y, mtf.Dimension("f2", 4), filter_size=1)
  conv_layers.conv2d_transpose(y, mtf.Dimension("f3", 2), name="up")
  shapes = {v.name: v.shape.to_string() for v in graph.all_variables}
  assert shapes == {"conv2d/kernel": "fh:3;fw:3;c:3;f1:4",
                    "conv2d_1/kernel": "fh:1;fw:1;f1:4;f2:4",
                    "up/kernel": "fh:2;fw:2;f3:2;f1:4"}


# ---- the example ---------------------------------------------------------------------
def test_conv_spatial_example_layouts_agree():
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
  proc = subprocess.run(
      [sys.executable, os.path.join(REPO, "examples", "conv_spatial.py"),
       "--train_steps=6", "--log_every=2", "--layouts=spatial,single"],
      capture_output=True, text=True, timeout=900, env=env, cwd=REPO)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  finals = re.findall(r"^final: .*losses=\[([^\]]*)\]", proc.stdout, re.M)
  assert len(finals) == 2, proc.stdout
  curves = [np.array([float(v) for v in f.split(",")]) for f in finals]
  assert len(curves[0]) == 6
  np.testing.assert_allclose(curves[0], curves[1], rtol=1e-4)
  assert "loss curves agree" in proc.stdout
