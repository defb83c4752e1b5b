"""Train, evaluate, decode and score transformers, driven by gin.

`run` is the whole program behind `python -m mesh_tensorflow.transformer.main`:
it builds the mesh from gin parameters (`mesh_shape`, `layout`), the model
(`model_type` "lm" for a decoder-only `Unitransformer`, "bitransformer" for an
encoder-decoder `Bitransformer`), the data (`dataset.dataset_fn`), and then,
by `mode`:

* "train": trains to `train_steps` with `mtf.training.Trainer` (checkpoints
  and TensorBoard events in `model_dir`; a rerun resumes), evaluates held-out
  loss and perplexity, and prints a few generated samples;
* "eval": held-out loss, perplexity and token accuracy of the checkpoint;
* "infer": decodes every line of `input_file` into `output_file`;
* "score": writes the log-likelihood of every line of `input_file` (a text
  for "lm", "input<TAB>target" for "bitransformer") to `output_file`.

    >>> from mesh_tensorflow.transformer import gin_config
    >>> gin_config.parse(["models/tiny_lm.gin", "layouts/2x4.gin"], ["run.train_steps = 10"])
    >>> run(model_dir="/tmp/lm", mode="train")["eval_loss"]
    4.9
"""

from __future__ import annotations

import math
import os
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import gin
import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import dataset as dataset_lib
from mesh_tensorflow.transformer import inference
from mesh_tensorflow.transformer import learning_rate_schedules
from mesh_tensorflow.transformer import modeling
from mesh_tensorflow.transformer import vocabulary as vocabulary_lib
from mesh_tensorflow.transformer.inference import log
from mesh_tensorflow.transformer.modeling import MODEL_TYPES

MODES = ("train", "eval", "infer", "score")

# The optimizers, configurable from gin as @optimize.AdafactorOptimizer etc.
for _cls in (mtf.optimize.AdafactorOptimizer, mtf.optimize.AdamWeightDecayOptimizer,
             mtf.optimize.SgdOptimizer, mtf.optimize.MomentumOptimizer):
  gin.external_configurable(_cls, module="optimize")
gin.external_configurable(mtf.mixed_precision.DynamicLossScale, module="mixed_precision")
gin.external_configurable(vocabulary_lib.get_vocabulary, module="vocabulary")


# ------------------------------------------------------------------ the mesh
def configure_cpu_devices(num_devices: int = 8) -> List[str]:
  """Splits the host CPU into `num_devices` logical devices and names them.

  Must run before TensorFlow initializes its devices (main.py does it first);
  if they are already initialized, the existing logical CPUs are returned
  (make_mesh_impl says so if there are too few).

  Example:
    >>> configure_cpu_devices(8)[:2]
    ['/device:CPU:0', '/device:CPU:1']
  """
  cpus = tf.config.list_physical_devices("CPU")
  try:
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(num_devices)])
  except RuntimeError:
    pass  # Already initialized (e.g. by a test's conftest): use what exists.
  return [d.name for d in tf.config.list_logical_devices("CPU")]


def make_mesh_impl(mesh_shape: str, layout_rules: str,
                   devices: Optional[Sequence[str]] = None,
                   lowering: str = "placement") -> mtf.MeshImpl:
  """The mesh implementation of `mesh_shape` on this machine.

  Uses the accelerators if there are enough of them, else logical CPUs.
  `lowering` is "placement" (PlacementMeshImpl) or "simd" (SimdMeshImpl: one
  program traced once for every processor).

  Raises:
    ValueError: if the mesh needs more devices than there are.

  Example:
    >>> impl = make_mesh_impl("rows:2;cols:4", "batch:rows;d_ff:cols")
  """
  shape = mtf.convert_to_shape(mesh_shape)
  if devices is None:
    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
    devices = gpus if len(gpus) >= shape.size else cpus
  if len(devices) < shape.size:
    raise ValueError(
        f"mesh_shape {mesh_shape!r} needs {shape.size} devices, but this machine has "
        f"{len(devices)} ({', '.join(devices)}). Pick a layout gin file whose mesh fits "
        "(layouts/single.gin, layouts/2x4.gin, ...) or set mesh_shape.")
  if lowering == "simd":
    return mtf.simd_mesh_impl.SimdMeshImpl(shape, layout_rules, list(devices)[:shape.size])
  if lowering != "placement":
    raise ValueError(f"run.lowering = {lowering!r}: use 'placement' or 'simd'.")
  return mtf.placement_mesh_impl.PlacementMeshImpl(shape, layout_rules,
                                                   list(devices)[:shape.size])


# ----------------------------------------------------------------- helpers
def unigram_entropy(ds: tf.data.Dataset, num_batches: int = 100,
                    key: str = "targets") -> float:
  """Entropy (nats per token) of the token frequencies in the first
  `num_batches` batches, padding excluded: the loss of the best model that
  ignores context.

  Example:
    >>> unigram_entropy(train_dataset)
    3.14
  """
  counts = None
  for batch in ds.take(num_batches):
    ids = batch[key].numpy().ravel()
    ids = ids[ids != 0]
    c = np.bincount(ids)
    if counts is None:
      counts = c
    else:
      size = max(len(counts), len(c))
      counts = np.pad(counts, (0, size - len(counts))) + np.pad(c, (0, size - len(c)))
  if counts is None or counts.sum() == 0:
    return float("nan")
  p = counts[counts > 0] / counts.sum()
  return float(-(p * np.log(p)).sum())


def make_optimizer(optimizer, learning_rate_schedule):
  """The optimizer: calls the factory (a gin reference such as
  @optimize.AdafactorOptimizer; default Adafactor) with the schedule as its
  learning rate ("lr" for SGD and momentum); an Optimizer is used as it is.

  Example:
    >>> make_optimizer(mtf.optimize.AdafactorOptimizer,
    ...                functools.partial(lrs.cosine_with_warmup, peak=0.05))
  """
  if optimizer is None:
    optimizer = mtf.optimize.AdafactorOptimizer
  if isinstance(optimizer, mtf.optimize.Optimizer):
    return optimizer  # Already an optimizer.
  if learning_rate_schedule is None:
    return optimizer()
  uses_lr = isinstance(optimizer, type) and issubclass(
      optimizer, (mtf.optimize.SgdOptimizer, mtf.optimize.MomentumOptimizer))
  name = "lr" if uses_lr else "learning_rate"
  return optimizer(**{name: learning_rate_schedule})


def clean_decodes(ids, eos_id: int = 1, pad_id: int = 0, length_axis: int = -1) -> tf.Tensor:
  """Replaces every id after the first `eos_id` (kept) with `pad_id`.

  Example:
    >>> clean_decodes([[5, 1, 7, 7]]).numpy().tolist()
    [[5, 1, 0, 0]]
  """
  ids = tf.convert_to_tensor(ids)
  is_eos = tf.cast(tf.equal(ids, tf.cast(eos_id, ids.dtype)), tf.int32)
  after_eos = tf.cumsum(is_eos, axis=length_axis, exclusive=True) > 0
  return tf.where(after_eos, tf.cast(pad_id, ids.dtype), ids)


def _maybe_decode_python(ids_or_strs, vocabulary) -> list:
  """Each element as text: id sequences decoded with `vocabulary`, bytes as
  UTF-8, strings as they are."""
  out = []
  for item in ids_or_strs:
    values = list(np.asarray(item).tolist()) if isinstance(item, np.ndarray) else list(item)
    if values and all(isinstance(v, (int, np.integer)) for v in values):
      out.append(vocabulary.decode([int(v) for v in values]))
    else:
      out.append([v.decode("utf-8") if isinstance(v, bytes) else v for v in values])
  return out


def concat_inputs_and_targets(mtf_features: Mapping[str, "mtf.Tensor"]) -> Dict[str, "mtf.Tensor"]:
  """Turns (packed) input/target pairs into language-model sequences.

  Each example's inputs are followed by its targets in one sequence twice as
  long, for training a decoder-only model on sequence-to-sequence data (the
  original's "delimited_lm"). Packed features ("inputs_segmentation",
  "inputs_position" and the same for "targets") keep their packing: example s
  becomes inputs_s then targets_s, examples in segment order, positions
  counting on from the inputs into the targets, padding (segment 0) at the
  end. Without segmentation, the nonzero ids are one example.

  Args:
    mtf_features: "inputs" and "targets", int tensors [..., length] (the same
      shape), with or without their "_segmentation" and "_position" features.

  Returns:
    {"targets", "targets_segmentation", "targets_position"} over the
    batch dimensions and a "length" dimension of twice the size (only
    "targets" when the input had no segmentation).

  Example:
    >>> out = concat_inputs_and_targets({"inputs": x, "targets": y})
    >>> out["targets"].shape   # [batch, length * 2]
  """
  inputs, targets = mtf_features["inputs"], mtf_features["targets"]
  if inputs.shape != targets.shape:
    raise ValueError(
        f"concat_inputs_and_targets: 'inputs' has shape {inputs.shape} and 'targets' "
        f"{targets.shape}; they need the same shape (pad to one length).")
  mesh, length = inputs.mesh, inputs.shape.dims[-1]
  packed = "inputs_segmentation" in mtf_features
  if packed:
    seg_in, seg_tg = mtf_features["inputs_segmentation"], mtf_features["targets_segmentation"]
    pos_in, pos_tg = mtf_features["inputs_position"], mtf_features["targets_position"]
  else:
    seg_in = mtf.cast(mtf.not_equal(inputs, 0), tf.int32)
    seg_tg = mtf.cast(mtf.not_equal(targets, 0), tf.int32)
    pos_in = pos_tg = mtf.broadcast(mtf.range(mesh, length, tf.int32), inputs.shape)
  # At most `length` examples per row; segment 0 is padding.
  segment = mtf.Dimension("segment", length.size + 1)
  real = mtf.cast(mtf.not_equal(mtf.range(mesh, segment, tf.int32), 0), tf.int32)

  def tokens_per_segment(seg):
    return real * mtf.reduce_sum(mtf.one_hot(seg, segment, dtype=tf.int32), reduced_dim=length)
  n_in, n_tg = tokens_per_segment(seg_in), tokens_per_segment(seg_tg)
  new_length = mtf.Dimension("new_length", 2 * length.size)
  # Where each segment starts in the new row; padding goes past its end.
  start = (mtf.cumsum(n_in + n_tg, segment, exclusive=True)
           + (1 - real) * new_length.size)

  def at_segment(values, seg):
    return mtf.gather(values, seg, segment)
  dest_in = at_segment(start, seg_in) + pos_in
  pos_tg_new = at_segment(n_in, seg_tg) + pos_tg
  dest_tg = at_segment(start, seg_tg) + pos_tg_new
  slots = mtf.range(mesh, new_length, tf.int32)
  to_in = mtf.cast(mtf.equal(dest_in, slots), tf.int32)
  to_tg = mtf.cast(mtf.equal(dest_tg, slots), tf.int32)
  out_shape = inputs.shape.dims[:-1] + [new_length]

  def scatter(from_inputs, from_targets):
    merged = (mtf.einsum([from_inputs, to_in], output_shape=out_shape)
              + mtf.einsum([from_targets, to_tg], output_shape=out_shape))
    return mtf.rename_dimension(merged, "new_length", length.name)
  out = {"targets": scatter(mtf.cast(inputs, tf.int32), mtf.cast(targets, tf.int32))}
  if packed:
    out["targets_segmentation"] = scatter(seg_in, seg_tg)
    out["targets_position"] = scatter(pos_in, pos_tg_new)
  return out


_dynamic_text2self = concat_inputs_and_targets  # the original's name


def _clear_model_dir(model_dir: str) -> None:
  for pattern in ("checkpoint", "ckpt-*", "events.out.tfevents.*"):
    for path in tf.io.gfile.glob(os.path.join(model_dir, pattern)):
      if tf.io.gfile.isdir(path):
        tf.io.gfile.rmtree(path)
      else:
        tf.io.gfile.remove(path)


_EVAL_WRITERS: Dict[str, tf.summary.SummaryWriter] = {}


def _write_scalars(model_dir: Optional[str], step: int, values: Dict[str, float]) -> None:
  """TensorBoard scalars of evaluations ("eval/perplexity") in model_dir,
  next to the Trainer's "eval/loss" (TensorBoard reads every events file of
  the directory)."""
  if not model_dir:
    return
  path = model_dir
  if path not in _EVAL_WRITERS:
    _EVAL_WRITERS[path] = tf.summary.create_file_writer(path)
  writer = _EVAL_WRITERS[path]
  with writer.as_default(step=step):
    for name, value in values.items():
      tf.summary.scalar(f"eval/{name}", value)
  writer.flush()


# ------------------------------------------------------------------ run
@gin.configurable
def run(model_dir: Optional[str],
        mode: str = "train",
        model_type: str = "lm",
        vocabulary: Optional[vocabulary_lib.Vocabulary] = None,
        dataset_fn: Callable = dataset_lib.dataset_fn,
        sequence_length: Optional[Mapping[str, int]] = None,
        batch_size: int = 32,
        train_steps: int = 1000,
        eval_steps: int = 20,
        eval_every: int = 0,
        mesh_shape: str = "rows:2;cols:4",
        layout_rules: str = "batch:rows;d_ff:cols;heads:cols;experts:rows",
        lowering: str = "placement",
        optimizer=None,
        learning_rate_schedule: Optional[Callable] = None,
        checkpoint_every: int = 500,
        keep_checkpoints: int = 3,
        log_every: int = 50,
        grad_accum_steps: int = 1,
        seed: int = 1,
        vocab_divisor: int = 8,
        activation_dtype: str = "float32",
        zero_stage: int = 0,
        loss_scale=None,
        fresh: bool = False,
        input_file: Optional[str] = None,
        output_file: Optional[str] = None,
        num_samples: int = 4,
        sample_prompts: Sequence[str] = ("def ", "class ", "import ", "    return "),
        decode_length: int = 96,
        temperature: float = 0.6,
        top_k: int = 40,
        beam_size: int = 1,
        alpha: float = 0.6) -> Dict[str, float]:
  """Trains, evaluates, decodes or scores a transformer (see module docstring).

  Args:
    model_dir: checkpoints and TensorBoard events (None: neither; only train
      and eval work then).
    mode: "train", "eval", "infer" or "score".
    model_type: "lm" or "bitransformer".
    vocabulary: a Vocabulary (default ByteVocabulary()).
    dataset_fn: dataset_fn(split, vocabulary, sequence_length, batch_size,
      seed, repeat, model_type=...) -> tf.data.Dataset of packed features.
    sequence_length: {"inputs": n, "targets": m}.
    batch_size: rows per training batch; the mesh dimension splitting
      "batch" must divide it.
    train_steps: the global step to train to (a resumed run continues to it).
    eval_steps: held-out batches per evaluation.
    eval_every: also evaluate every this many steps (0: at the end only).
    mesh_shape: e.g. "rows:2;cols:4".
    layout_rules: e.g. "batch:rows;d_ff:cols;heads:cols;experts:rows".
    lowering: "placement" (one op per device) or "simd" (one program traced
      once for every processor; see mtf.simd_mesh_impl).
    optimizer: an optimizer factory (gin: @optimize.AdafactorOptimizer),
      called with learning_rate=learning_rate_schedule.
    learning_rate_schedule: a function of the step (gin:
      @learning_rate_schedules.cosine_with_warmup), or None for the
      optimizer's default. One with a `total_train_steps` argument (the
      original's schedules, e.g. @learning_rate_schedules.product_learning_rate)
      gets train_steps for it.
    checkpoint_every: save every this many steps (and at the end).
    keep_checkpoints: checkpoints kept in model_dir.
    log_every: print progress every this many steps.
    grad_accum_steps: micro-batches per update.
    seed: data order (weights are initialized from their names).
    vocab_divisor: the model's vocabulary is the vocabulary's size rounded up
      to a multiple of this, so layouts can split it.
    activation_dtype: "float32", "bfloat16" or "float16" (float32 master
      weights either way; use float16 with loss_scale).
    zero_stage: ZeRO stage 0-3 over the mesh dimension splitting "batch"
      (mtf.zero): shard optimizer slots, gradients, variables.
    loss_scale: dynamic loss scaling for float16 (gin:
      @mixed_precision.DynamicLossScale()), or None.
    fresh: delete model_dir's checkpoints and events first (train only).
    input_file: infer/score: one text per line (escaped, see inference.escape).
    output_file: infer/score: where results go (default: input_file +
      ".outputs" or ".scores").
    num_samples: train: samples printed at the end (0: none).
    sample_prompts: the prompts of those samples ("lm").
    decode_length: tokens to generate ("lm"); the output length is at most
      the targets sequence length.
    temperature: 0 for greedy decoding, else sampling temperature.
    top_k: sample from the k most likely tokens (0 or -1: all).
    beam_size: beam search width ("bitransformer"; 1: greedy or sampling).
    alpha: beam search length penalty.

  Returns:
    The final metrics (e.g. {"step", "loss", "eval_loss", "perplexity"});
    after training also "losses" (of the steps run now) and "samples".
  """
  if mode not in MODES:
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}.")
  if model_type not in MODEL_TYPES:
    raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}.")
  vocabulary = vocabulary or vocabulary_lib.ByteVocabulary()
  sequence_length = dict(sequence_length or {"inputs": 128, "targets": 128})
  mesh_impl = make_mesh_impl(mesh_shape, layout_rules, lowering=lowering)
  split = modeling.batch_split(mesh_impl)
  if batch_size % (split * grad_accum_steps):
    raise ValueError(
        f"batch_size {batch_size} must be a multiple of the batch split {split} (layout "
        f"{layout_rules!r} on mesh {mesh_shape!r}) times grad_accum_steps "
        f"{grad_accum_steps}.")
  setup = modeling.Setup(
      model_type=model_type, vocabulary=vocabulary, mesh_impl=mesh_impl,
      sequence_length=sequence_length, batch_size=batch_size // grad_accum_steps,
      vocab_size=vocabulary.vocab_size, vocab_divisor=vocab_divisor,
      variable_dtype=mtf.VariableDType(tf.float32, tf.float32, activation_dtype))
  log(f"mode {mode}, model {model_type}, mesh '{mesh_shape}', layout '{layout_rules}', "
      f"batch {batch_size}, sequence length {sequence_length}, vocabulary "
      f"{type(vocabulary).__name__} ({vocabulary.vocab_size} ids, model "
      f"{modeling.round_up(vocabulary.vocab_size, vocab_divisor)}),"
      f" model_dir {model_dir or '(none)'}")

  def data(split_name: str, repeat: bool, data_seed: Optional[int]):
    return dataset_fn(split_name, vocabulary, sequence_length, setup.batch_size, data_seed,
                      repeat, model_type=model_type)

  if mode in ("infer", "score"):
    if not model_dir:
      raise ValueError(f"mode {mode!r} needs a model_dir with a checkpoint.")
    inference.restore(mesh_impl, model_dir)
    if mode == "infer":
      return inference.infer(setup, input_file, output_file, decode_length, temperature,
                             top_k, beam_size, alpha)
    return inference.score(setup, input_file, output_file)

  if model_dir and fresh and mode == "train":
    _clear_model_dir(model_dir)
  trainer = mtf.training.Trainer(
      modeling.make_model_fn(setup), setup.feature_shapes(), mesh_impl,
      make_optimizer(optimizer, learning_rate_schedules.bind_total_train_steps(
          learning_rate_schedule, train_steps)), model_dir=model_dir or None,
      grad_accum_steps=grad_accum_steps, checkpoint_every=checkpoint_every,
      keep_checkpoints=keep_checkpoints, log_every=log_every, log_fn=log,
      zero_stage=zero_stage, loss_scale=loss_scale)
  eval_data = data(dataset_lib.VALIDATION, False, 0)

  def evaluate() -> Dict[str, float]:
    try:
      metrics = trainer.evaluate(eval_data, steps=eval_steps)
    except ValueError as e:
      if "empty" not in str(e):
        raise
      raise ValueError(
          f"The validation data yields no full batch of {setup.batch_size} rows: lower "
          "run.batch_size, or give more held-out data (dataset_fn.eval_files, or a larger "
          "dataset_fn.corpus_bytes).") from e
    metrics["perplexity"] = math.exp(min(metrics["cross_entropy"], 50.0))
    _write_scalars(model_dir, trainer.global_step, {"perplexity": metrics["perplexity"]})
    log(f"eval at step {trainer.global_step}: loss={metrics['loss']:.4f} "
        f"cross_entropy={metrics['cross_entropy']:.4f} nats/token "
        f"perplexity={metrics['perplexity']:.3f} "
        f"token_accuracy={metrics['token_accuracy']:.4f} ({eval_steps} held-out batches)")
    return metrics

  start = time.perf_counter()
  result = {"step": trainer.global_step}
  samples: List[str] = []
  if mode == "eval":
    if model_dir and trainer.global_step == 0:
      log(f"warning: {model_dir} has no checkpoint; evaluating an untrained model")
    metrics = evaluate()
  else:
    train_data = data(dataset_lib.TRAIN, True, seed)
    entropy = unigram_entropy(train_data)
    result["unigram_entropy"] = entropy
    log(f"unigram entropy of the training tokens: {entropy:.4f} nats/token "
        f"({entropy / math.log(2):.3f} bits): the loss of a model that ignores context")

    def periodic_eval(step: int, _) -> None:
      if eval_every and step % eval_every == 0 and step != train_steps:
        evaluate()

    history = trainer.train(train_data, steps=train_steps, hooks=[periodic_eval])
    if history["loss"]:
      result["loss"] = history["loss"][-1]
      result["cross_entropy"] = history["cross_entropy"][-1]
    losses = history["loss"]
    metrics = evaluate()
    if num_samples and model_type == "lm":
      prompts = list(sample_prompts)[:num_samples]
      samples = inference.lm_decode(setup, prompts, decode_length, temperature, top_k)
      for prompt, text in zip(prompts, samples):
        log(f"--- sample (prompt {prompt!r}):\n{prompt}{text}")
    elif num_samples:
      pairs = dataset_lib.stdlib_docstring_pairs(dataset_lib.VALIDATION, max_pairs=num_samples)
      samples = inference.bi_decode(setup, [p[0] for p in pairs], temperature, top_k, beam_size,
                          alpha)
      for (source, target), text in zip(pairs, samples):
        log(f"--- {source}\n    reference: {target}\n    model:     {text}")
  result.update({"step": trainer.global_step, "eval_loss": metrics["loss"],
                 "eval_cross_entropy": metrics["cross_entropy"],
                 "perplexity": metrics["perplexity"],
                 "token_accuracy": metrics["token_accuracy"],
                 "seconds": time.perf_counter() - start})
  log("final: " + " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in result.items()))
  if mode == "train":
    result.update(losses=losses, samples=samples)
  return result




from mesh_tensorflow.transformer.estimator_compat import *  # noqa: E402,F401,F403 (the original's helpers)
