"""The transformer library's less common model pieces: a reversible layer
stack, distillation from a teacher (`StudentTeacher`), ensemble logit
reductions and annealed dropout.

Import them from `transformer`, which re-exports them:

    >>> stack = transformer.ReversibleLayerStack(
    ...     [SelfAttention(), DenseReluDense()], recompute_grads=True)
    >>> logits = transformer.reduce_ensemble_logits(logits, ensemble_dim, vocab_dim)

The step. `sublayer_annealed_dropout` and `StudentTeacher` depend on the
training step; they read the graph's step counter
`mtf.optimize.step_counter(mesh)` (the number of updates applied so far,
checkpointed with the model), which `Optimizer.apply_grads` advances once per
training step.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer.layer_stack import Context, LayerStack


def _step(mesh: mtf.Mesh) -> mtf.Tensor:
  """The number of updates applied so far, a float32 scalar."""
  return mtf.cast(mtf.optimize.step_counter(mesh), tf.float32)


# ------------------------------------------------------------ annealed dropout
def sublayer_annealed_dropout(x: mtf.Tensor, layer_stack, context,
                              init_dropout_rate: float = 0.0,
                              start_step: Optional[int] = None,
                              end_step: Optional[int] = None) -> mtf.Tensor:
  """Dropout whose rate falls linearly from `init_dropout_rate` at
  `start_step` to 0 at `end_step` (training only; one mask per example and
  d_model channel, as `sublayer_dropout`). Before start_step the rate is
  init_dropout_rate, after end_step 0.

  Args:
    x: the activations.
    layer_stack: the calling LayerStack (unused).
    context: the Context.
    init_dropout_rate: the rate at start_step.
    start_step: the step the annealing starts at (required).
    end_step: the step the rate reaches 0 (required, > start_step).

  Example:
    >>> y = sublayer_annealed_dropout(x, stack, context, init_dropout_rate=0.1,
    ...                               start_step=0, end_step=10000)
  """
  del layer_stack
  if start_step is None or end_step is None:
    raise ValueError("sublayer_annealed_dropout: start_step and end_step are required "
                     "(gin: `transformer.sublayer_annealed_dropout.start_step = 0`, "
                     "`.end_step = 10000`).")
  if end_step <= start_step:
    raise ValueError(f"sublayer_annealed_dropout: end_step ({end_step}) must be greater "
                     f"than start_step ({start_step}).")
  if not context.train or not init_dropout_rate:
    return x
  fraction = (_step(context.mesh) - float(start_step)) / float(end_step - start_step)
  fraction = mtf.minimum(mtf.maximum(fraction, 0.0), 1.0)
  keep = (1.0 - init_dropout_rate) + fraction * init_dropout_rate
  noise_shape = mtf.Shape(list(context.batch_dims) + [context.model.model_dim])
  u = mtf.random_uniform(context.mesh, noise_shape, dtype=tf.float32,
                         name="annealed_dropout")
  mask = mtf.cast(mtf.less(u, keep), tf.float32) / keep
  return x * mtf.cast(mask, x.dtype)


# --------------------------------------------------------- reversible stack
class ReversibleLayerStack(LayerStack):
  """A LayerStack whose layers are reversible residual blocks (RevNet, as in
  Reformer): the stack input x starts both halves, x1 = x2 = x; each layer
  maps (x1, x2) to (x2, x1 + f(x2)), f being the layer's residual branch;
  the output is the final sublayers (or norm) of x1 + x2.

  f is, with sublayer lists, the per-layer sublayers (leave
  `sublayer_residual` out of them: the block adds the residual), else
  dropout(layer(norm(x))). With `recompute_grads=True` (or
  recompute="layer") the backward pass rebuilds each block's inputs from
  its outputs instead of keeping them (mtf.layers.reversible_half_residual_and_swap);
  gradients are the same. Pipelining and recompute="selective" are not
  supported.

  Args: as LayerStack.

  Example:
    >>> stack = ReversibleLayerStack(
    ...     [SelfAttention(), DenseReluDense()], recompute_grads=True,
    ...     sublayers_per_layer=[sublayer_rms_norm, sublayer_call_layer, sublayer_dropout])
  """

  def __init__(self, layers, *args, **kwargs):
    super().__init__(layers, *args, **kwargs)
    if self.pipelined:
      raise ValueError("ReversibleLayerStack: num_stages must be 1 (pipelining is not "
                       "supported); use LayerStack to pipeline.")
    if self.recompute in ("selective", "projections"):
      raise ValueError("ReversibleLayerStack: recompute must be 'none' or 'layer' "
                       f"(the reversible recomputation), not {self.recompute!r}.")

  def _branch(self, context: Context, layer, scope: str, label: str) -> Callable:
    """f: the residual branch of `layer` (no residual)."""
    mask = context.nonpadding

    def f(x):
      if self._sublayers is not None:
        y = self._per_layer_sublayers(context, x, layer, scope)
      else:
        with mtf.name_scope(context.mesh, scope):
          norm_x = self._norm(context, x if mask is None else x * mask,
                              self._norm_names()[0])
          with mtf.name_scope(context.mesh, getattr(layer, "scope_name",
                                                    type(layer).__name__)):
            y = self._dropout(context, layer.call(context, norm_x))
      if y.shape != x.shape:
        raise ValueError(f"ReversibleLayerStack: {label} ({type(layer).__name__}) returned "
                         f"shape {y.shape} for an input of shape {x.shape}.")
      return y
    return f

  def call(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    x = self._begin(context, x)
    reversible = context.train and self.recompute != "none"
    if reversible:
      self._check_recompute(context, self._layers)
    x1, x1_back, x2, x2_back = x, None, x, None
    for lnum, layer in enumerate(self._layers):
      f = self._branch(context, layer, "layer_%03d" % lnum, f"layer {lnum}")
      x1, x1_back, x2, x2_back = mtf.layers.reversible_half_residual_and_swap(
          x1, x1_back, x2, x2_back, f, recompute_grads=reversible)
      if context.layer_outputs is not None and lnum != len(self._layers) - 1:
        context.layer_outputs.append(x1 + x2)
      context.layer_index += 1
    return self.finish(context, x1 + x2)


# ------------------------------------------------------------ distillation
def _is_unitransformer(model) -> bool:
  return hasattr(model, "sample_autoregressive")


class StudentTeacher:
  """A student model trained on a mix of the true targets and a frozen
  teacher's softened predictions (knowledge distillation).

  Training loss: (1 - f) * hard + temperature**2 * f * soft, where hard is
  the student's own loss, soft the cross entropy of the student's logits /
  temperature against softmax(teacher logits / temperature) averaged over the
  non-padding target tokens, and f = fraction_soft once more than
  `distill_start_step` updates have been applied (0 before). The student's
  variables live under "student/", the teacher's under "teacher/" (not
  trainable); `initialize` fills the teacher (and optionally the student)
  from `teacher_checkpoint`. With fraction_soft == 0 the teacher is not built.

  Args:
    student: a Unitransformer or Bitransformer.
    teacher: a model of the same kind and output vocabulary.
    temperature: the softmax temperature (required for training).
    fraction_soft: the weight f of the soft loss, in [0, 1] (required for
      training).
    distill_start_step: updates before the soft loss starts counting.
    teacher_checkpoint: a checkpoint (of this library's CheckpointManager) of
      the teacher, its variables named as in a model trained alone.
    initialize_student_weights: also copy the checkpoint's variables into
      the student variables of the same names.

  Example:
    >>> model = StudentTeacher(small_lm, big_lm, temperature=2.0, fraction_soft=0.5,
    ...                        teacher_checkpoint="/models/big/ckpt-10000")
    >>> logits, loss = model.call_simple(inputs, targets, compute_loss=True)
  """

  def __init__(self, student, teacher, temperature: Optional[float] = None,
               fraction_soft: Optional[float] = None, distill_start_step: int = 0,
               teacher_checkpoint: Optional[str] = None,
               initialize_student_weights: bool = False):
    if fraction_soft is not None and not 0.0 <= fraction_soft <= 1.0:
      raise ValueError(f"StudentTeacher: fraction_soft must be in [0, 1], got "
                       f"{fraction_soft}.")
    if temperature is not None and temperature <= 0:
      raise ValueError(f"StudentTeacher: temperature must be > 0, got {temperature}.")
    self.student = student
    self.teacher = teacher
    self.temperature = temperature
    self.fraction_soft = fraction_soft
    self.distill_start_step = distill_start_step
    self.teacher_checkpoint = teacher_checkpoint
    self.initialize_student_weights = initialize_student_weights

  def __getattr__(self, name: str) -> Any:
    # The student's attributes (output_vocab_dim, z_loss, ...) for code that
    # treats the pair as one model.
    if name == "student":
      raise AttributeError(name)
    return getattr(self.student, name)

  def call_simple(self, inputs: mtf.Tensor, targets: mtf.Tensor, compute_loss: bool,
                  variable_dtype: Optional[mtf.VariableDType] = None,
                  num_microbatches: int = 1, **kargs):
    """The student's logits and the distillation loss.

    Args:
      inputs: as the student's call_simple.
      targets: as the student's call_simple.
      compute_loss: whether to compute the loss.
      variable_dtype: an mtf.VariableDType.
      num_microbatches: as the student's call_simple.
      **kargs: passed to both models' call_simple (e.g. mode, sequence ids).

    Returns:
      (student logits, loss or None).

    Example:
      >>> logits, loss = model.call_simple(inputs, targets, True)
    """
    mesh = inputs.mesh
    with mtf.name_scope(mesh, "student"):
      logits, hard_loss = self.student.call_simple(
          inputs, targets, compute_loss=True, variable_dtype=variable_dtype,
          num_microbatches=num_microbatches, **kargs)
    if not compute_loss:
      return logits, None
    if self.fraction_soft is None or self.temperature is None:
      raise ValueError("StudentTeacher: temperature and fraction_soft are required to "
                       "compute the training loss (gin: `StudentTeacher.temperature = 2.0`, "
                       "`StudentTeacher.fraction_soft = 0.5`).")
    if self.fraction_soft == 0.0:
      return logits, hard_loss
    vocab_dim = self.student.output_vocab_dim
    if vocab_dim != self.teacher.output_vocab_dim:
      raise ValueError(f"StudentTeacher: the student's output vocabulary {vocab_dim} and the "
                       f"teacher's {self.teacher.output_vocab_dim} must be the same.")
    before = {v.name for v in mesh.graph.all_variables}
    with mtf.name_scope(mesh, "teacher"):
      teacher_logits, _ = self.teacher.call_simple(
          inputs, targets, compute_loss=True, variable_dtype=variable_dtype,
          num_microbatches=num_microbatches, **kargs)
    for v in mesh.graph.all_variables:
      if v.name not in before:
        v._trainable = False  # pylint: disable=protected-access
    t = float(self.temperature)
    soft_targets = mtf.stop_gradient(mtf.softmax(mtf.to_float(teacher_logits) / t, vocab_dim))
    soft = mtf.layers.softmax_cross_entropy_with_logits(
        mtf.to_float(logits) / t, soft_targets, vocab_dim)
    weights = mtf.to_float(mtf.greater(targets, 0))
    denominator = getattr(self.student, "loss_denominator", None)
    total = mtf.reduce_sum(soft * weights)
    if isinstance(denominator, (int, float)):
      soft_loss = total * (1.0 / float(denominator))
    else:
      soft_loss = total / mtf.maximum(mtf.reduce_sum(weights), 1.0)
    soft_loss = soft_loss * (1.0 / num_microbatches)
    started = mtf.to_float(mtf.greater(_step(mesh), float(self.distill_start_step)))
    fraction = started * self.fraction_soft
    loss = (1.0 - fraction) * mtf.to_float(hard_loss) + (t * t) * fraction * soft_loss
    return logits, loss

  def decode(self, *args, **kargs):
    """Decodes with the student (Unitransformer.sample_autoregressive or
    Bitransformer.decode), in the "student" scope.

    Example:
      >>> ids = model.decode(inputs)
    """
    mesh = args[0].mesh if args else next(iter(kargs.values())).mesh
    with mtf.name_scope(mesh, "student"):
      if _is_unitransformer(self.student):
        return self.student.sample_autoregressive(*args, **kargs)
      return self.student.decode(*args, **kargs)

  def initialize(self, mesh_impl=None) -> None:
    """Copies the teacher checkpoint's variables into the "teacher/" variables
    (and, with initialize_student_weights, into the "student/" ones of the
    same names) of a lowered model (its `mesh_impl`), after the model's
    variables exist (e.g. after a Trainer's first step was built).

    Example:
      >>> model.initialize(trainer_mesh_impl)
    """
    if self.fraction_soft == 0.0:
      return
    if not self.teacher_checkpoint:
      raise ValueError("StudentTeacher.initialize: teacher_checkpoint is not set (gin: "
                       "`StudentTeacher.teacher_checkpoint = '/path/ckpt-1000'`).")
    if mesh_impl is None:
      raise ValueError("StudentTeacher.initialize: give the mesh implementation the model "
                       "was lowered with (its variables are filled from the checkpoint).")
    from mesh_tensorflow.lowering import slice_variables  # pylint: disable=g-import-not-at-top
    prefix = self.teacher_checkpoint
    saved = {key: dtype for key, dtype in
             ((k, tf.train.load_checkpoint(prefix).get_variable_to_dtype_map().get(k))
              for k, _ in tf.train.list_variables(prefix))}
    scopes = ["teacher/"] + (["student/"] if self.initialize_student_weights else [])
    loaded = 0
    for name, var in slice_variables.variable_store(mesh_impl).items():
      for scope in scopes:
        if name.startswith(scope):
          key = slice_variables.checkpoint_key(name[len(scope):])
          if key in saved:
            var.restore_from(prefix, key, saved[key])
            loaded += 1
          elif scope == "teacher/":
            raise ValueError(f"StudentTeacher.initialize: the teacher checkpoint {prefix!r} "
                             f"has no variable {name[len(scope):]!r}; train the teacher "
                             f"with the same configuration.")
    if not loaded:
      raise ValueError(f"StudentTeacher.initialize: no variable of {prefix!r} matches the "
                       f"model's teacher variables; build the model (one step) first.")


# --------------------------------------------------------- ensemble logits
def reduce_ensemble_logits_select(logits: mtf.Tensor, ensemble_dim: mtf.Dimension,
                                  vocab_dim: mtf.Dimension, model_id: int = 0) -> mtf.Tensor:
  """The logits of model `model_id` (modulo the ensemble size).

  Example:
    >>> y = reduce_ensemble_logits_select(logits, ensemble_dim, vocab_dim, model_id=1)
  """
  del vocab_dim
  return mtf.gather(logits, model_id % ensemble_dim.size, ensemble_dim)


def reduce_ensemble_logits_mean_prob(logits: mtf.Tensor, ensemble_dim: mtf.Dimension,
                                     vocab_dim: mtf.Dimension) -> mtf.Tensor:
  """Log of the models' mean probabilities (floored at 1e-20).

  Example:
    >>> y = reduce_ensemble_logits_mean_prob(logits, ensemble_dim, vocab_dim)
  """
  probs = mtf.reduce_mean(mtf.softmax(logits, vocab_dim), reduced_dim=ensemble_dim)
  return mtf.log(mtf.maximum(probs, 1e-20))


def reduce_ensemble_logits_mean_logit(logits: mtf.Tensor, ensemble_dim: mtf.Dimension,
                                      vocab_dim: mtf.Dimension) -> mtf.Tensor:
  """The models' mean logits (probabilities proportional to the geometric
  mean of theirs).

  Example:
    >>> y = reduce_ensemble_logits_mean_logit(logits, ensemble_dim, vocab_dim)
  """
  del vocab_dim
  return mtf.reduce_mean(logits, reduced_dim=ensemble_dim)


def reduce_ensemble_logits(logits: mtf.Tensor, ensemble_dim: mtf.Dimension,
                           vocab_dim: mtf.Dimension,
                           reduce_fn: Callable = reduce_ensemble_logits_mean_prob) -> mtf.Tensor:
  """Logits without `ensemble_dim`: reduce_fn(logits, ensemble_dim, vocab_dim)
  (gin: `reduce_ensemble_logits.reduce_fn = @transformer.reduce_ensemble_logits_select`).

  Example:
    >>> y = reduce_ensemble_logits(logits, ensemble_dim, vocab_dim)
  """
  out = reduce_fn(logits, ensemble_dim, vocab_dim)
  if ensemble_dim in out.shape.dims:
    raise ValueError(f"reduce_ensemble_logits: reduce_fn {getattr(reduce_fn, '__name__', '')} "
                     f"kept {ensemble_dim} in its result {out.shape}.")
  return out
