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

    >>> import gin
    >>> gin.parse_config_files_and_bindings(["models/tiny_lm.gin"], ["run.train_steps=10"])
    >>> run(model_dir="/tmp/lm", mode="train")
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import gin
import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import dataset as dataset_lib
from mesh_tensorflow.transformer import gin_config
from mesh_tensorflow.transformer import inference
from mesh_tensorflow.transformer import learning_rate_schedules  # noqa: F401 (gin)
from mesh_tensorflow.transformer import vocabulary as vocabulary_lib

MODES = ("train", "eval", "infer", "score")
MODEL_TYPES = ("lm", "bitransformer")

# The optimizers, configurable from gin as @optimize.AdafactorOptimizer etc.
for _cls in (mtf.optimize.AdafactorOptimizer, mtf.optimize.AdamWeightDecayOptimizer,
             mtf.optimize.SgdOptimizer, mtf.optimize.MomentumOptimizer):
  gin.external_configurable(_cls, module="optimize")
gin.external_configurable(vocabulary_lib.get_vocabulary, module="vocabulary")


def log(line: str) -> None:
  """Prints a progress line (flushed, so it shows when piped)."""
  print(line, flush=True)


# ------------------------------------------------------------------ the mesh
def configure_cpu_devices(num_devices: int = 8) -> List[str]:
  """Splits the host CPU into `num_devices` logical devices and names them.

  Must run before TensorFlow initializes its devices (main.py does it first);
  devices already initialized with enough CPUs are fine too.

  Example:
    >>> configure_cpu_devices(8)[:2]
    ['/device:CPU:0', '/device:CPU:1']
  """
  cpus = tf.config.list_physical_devices("CPU")
  try:
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(num_devices)])
  except RuntimeError:
    pass  # Already initialized: checked below.
  return [d.name for d in tf.config.list_logical_devices("CPU")]


def make_mesh_impl(mesh_shape: str, layout_rules: str,
                   devices: Optional[Sequence[str]] = None) -> mtf.MeshImpl:
  """The placement mesh implementation of `mesh_shape` on this machine.

  Uses the accelerators if there are enough of them, else logical CPUs.

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
  return mtf.placement_mesh_impl.PlacementMeshImpl(shape, layout_rules,
                                                   list(devices)[:shape.size])


def batch_split(mesh_impl) -> int:
  """Into how many pieces the layout splits the "batch" dimension.

  Example:
    >>> batch_split(make_mesh_impl("rows:2;cols:4", "batch:rows"))
    2
  """
  axis = mesh_impl.tensor_dimension_to_mesh_axis(mtf.Dimension("batch", mesh_impl.size))
  return 1 if axis is None else mesh_impl.shape.dims[axis].size


# ----------------------------------------------------------------- the model
def round_up(n: int, multiple: int) -> int:
  """n rounded up to a multiple of `multiple`.

  Example:
    >>> round_up(259, 8)
    264
  """
  return -(-n // multiple) * multiple


@gin.configurable
def build_model(model_type: str, input_vocab_size: int, output_vocab_size: int,
                max_length: int, vocab_divisor: int = 8, layout: Optional[str] = None,
                mesh_shape: Optional[str] = None):
  """The transformer of `model_type`; its sizes and layers come from gin
  (see gin/defaults.gin and gin/models/*.gin).

  A language model is a `Unitransformer` named "decoder"; an encoder-decoder
  is a `Bitransformer` of an "encoder" and a "decoder", built in the gin
  scopes "encoder" and "decoder" (so `decoder/make_layer_stack.layers = ...`
  configures one side only).

  Args:
    model_type: "lm" (decoder-only) or "bitransformer".
    input_vocab_size: ids of inputs.
    output_vocab_size: ids of outputs.
    max_length: the longest sequence (size of learned position tables).
    vocab_divisor: vocabulary sizes are rounded up to a multiple of this.
    layout: the layout rules, for layers that adapt to them (mixture of
      experts groups tokens by how the batch is split).
    mesh_shape: the mesh shape, likewise.

  Example:
    >>> model = build_model("lm", 259, 259, 128)
  """
  unitransformer = gin_config.configurable("Unitransformer")
  make_layer_stack = gin_config.configurable("make_layer_stack")

  def side(name: str, input_size: int, output_size: Optional[int], autoregressive: bool):
    return unitransformer(
        layer_stack=make_layer_stack(), input_vocab_size=input_size,
        output_vocab_size=output_size, autoregressive=autoregressive,
        max_length=max_length, name=name, vocab_divisor=vocab_divisor, layout=layout,
        mesh_shape=mesh_shape)

  if model_type == "lm":
    return side("decoder", input_vocab_size, output_vocab_size, True)
  if model_type == "bitransformer":
    with gin.config_scope("encoder"):
      encoder = side("encoder", input_vocab_size, None, False)
    with gin.config_scope("decoder"):
      decoder = side("decoder", output_vocab_size, output_vocab_size, True)
    return gin_config.configurable("Bitransformer")(encoder, decoder)
  raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}.")


def autoregressive_inputs(targets: mtf.Tensor,
                          segmentation: Optional[mtf.Tensor] = None) -> mtf.Tensor:
  """The decoder's inputs: targets shifted right by one (0 first), restarting
  at every packed example (segmentation change).

  Example:
    >>> # targets [5, 6, 1, 7, 1], segmentation [1, 1, 1, 2, 2] -> [0, 5, 6, 0, 7]
    >>> inputs = autoregressive_inputs(targets, segmentation)
  """
  length_dim = targets.shape.dims[-1]
  shifted = mtf.shift(targets, 1, length_dim, wrap=False)
  if segmentation is not None:
    same = mtf.equal(segmentation, mtf.shift(segmentation, 1, length_dim, wrap=False))
    shifted = shifted * mtf.cast(same, shifted.dtype)
  return shifted


@dataclasses.dataclass
class Setup:
  """What every mode needs: the vocabulary, mesh, shapes and model builder."""
  model_type: str
  vocabulary: vocabulary_lib.Vocabulary
  mesh_impl: mtf.MeshImpl
  sequence_length: Dict[str, int]
  batch_size: int
  vocab_size: int
  vocab_divisor: int
  variable_dtype: mtf.VariableDType

  def new_model(self):
    length = max(self.sequence_length.values())
    return build_model(self.model_type, self.vocab_size, self.vocab_size, length,
                       vocab_divisor=self.vocab_divisor,
                       layout=self.mesh_impl.layout_rules.to_string(),
                       mesh_shape=self.mesh_impl.shape.to_string())

  @property
  def feature_keys(self) -> List[str]:
    return ["targets"] if self.model_type == "lm" else ["inputs", "targets"]

  def feature_shapes(self, batch_size: Optional[int] = None) -> Dict[str, str]:
    batch_size = batch_size or self.batch_size
    shapes = {}
    for key in self.feature_keys:
      for suffix in ("", "_segmentation", "_position"):
        shapes[key + suffix] = f"batch:{batch_size};length:{self.sequence_length[key]}"
    return shapes


def call_model(setup: Setup, model, features: Mapping[str, mtf.Tensor], mode: str,
               compute_loss: bool = True):
  """(logits, loss) of the model on a batch of packed features."""
  targets = features["targets"]
  if setup.model_type == "lm":
    return model.call_simple(
        inputs=autoregressive_inputs(targets, features.get("targets_segmentation")),
        targets=targets, compute_loss=compute_loss, mode=mode,
        variable_dtype=setup.variable_dtype,
        sequence_id=features.get("targets_segmentation"),
        position=features.get("targets_position"))
  return inference.call_with_supported(
      model.call_simple, inputs=features["inputs"], targets=targets,
      compute_loss=compute_loss, mode=mode, variable_dtype=setup.variable_dtype,
      encoder_sequence_id=features.get("inputs_segmentation"),
      decoder_sequence_id=features.get("targets_segmentation"),
      encoder_position=features.get("inputs_position"),
      decoder_position=features.get("targets_position"))


def make_model_fn(setup: Setup) -> Callable:
  """The Trainer's model_fn: the model's loss, with cross-entropy (nats per
  target token, without z-loss or label smoothing) and token accuracy as
  metrics.

  Example:
    >>> trainer = mtf.training.Trainer(make_model_fn(setup), ...)
  """
  def model_fn(mesh, features, mode):
    del mesh
    logits, loss = call_model(setup, setup.new_model(), features, mode)
    xent, accuracy = inference.token_cross_entropy(logits, features["targets"])
    return loss, {"cross_entropy": xent, "token_accuracy": accuracy}
  return model_fn


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
  """Calls the optimizer factory (a gin reference such as
  @optimize.AdafactorOptimizer) with the schedule as its learning rate."""
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


def _clear_model_dir(model_dir: str) -> None:
  for pattern in ("checkpoint", "ckpt-*", "events.out.tfevents.*"):
    for path in tf.io.gfile.glob(os.path.join(model_dir, pattern)):
      if tf.io.gfile.isdir(path):
        tf.io.gfile.rmtree(path)
      else:
        tf.io.gfile.remove(path)


def _write_scalars(model_dir: Optional[str], step: int, values: Dict[str, float]) -> None:
  if not model_dir:
    return
  writer = tf.summary.create_file_writer(os.path.join(model_dir, "eval"))
  with writer.as_default(step=step):
    for name, value in values.items():
      tf.summary.scalar(name, value)
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
        optimizer=None,
        learning_rate_schedule: Optional[Callable] = None,
        checkpoint_every: int = 500,
        keep_checkpoints: int = 3,
        log_every: int = 50,
        grad_accum_steps: int = 1,
        seed: int = 1,
        vocab_divisor: int = 8,
        activation_dtype: str = "float32",
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
    optimizer: an optimizer factory (gin: @optimize.AdafactorOptimizer),
      called with learning_rate=learning_rate_schedule.
    learning_rate_schedule: a function of the step (gin:
      @learning_rate_schedules.cosine_with_warmup), or None for the
      optimizer's default.
    checkpoint_every: save every this many steps (and at the end).
    keep_checkpoints: checkpoints kept in model_dir.
    log_every: print progress every this many steps.
    grad_accum_steps: micro-batches per update.
    seed: data order (weights are initialized from their names).
    vocab_divisor: the model's vocabulary is the vocabulary's size rounded up
      to a multiple of this, so layouts can split it.
    activation_dtype: "float32" or "bfloat16".
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
    The final metrics (e.g. {"step", "loss", "eval_loss", "perplexity"}).
  """
  if mode not in MODES:
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}.")
  if model_type not in MODEL_TYPES:
    raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}.")
  vocabulary = vocabulary or vocabulary_lib.ByteVocabulary()
  sequence_length = dict(sequence_length or {"inputs": 128, "targets": 128})
  mesh_impl = make_mesh_impl(mesh_shape, layout_rules)
  split = batch_split(mesh_impl)
  if batch_size % (split * grad_accum_steps):
    raise ValueError(
        f"batch_size {batch_size} must be a multiple of the batch split {split} (layout "
        f"{layout_rules!r} on mesh {mesh_shape!r}) times grad_accum_steps "
        f"{grad_accum_steps}.")
  setup = Setup(model_type=model_type, vocabulary=vocabulary, mesh_impl=mesh_impl,
                sequence_length=sequence_length, batch_size=batch_size // grad_accum_steps,
                vocab_size=vocabulary.vocab_size, vocab_divisor=vocab_divisor,
                variable_dtype=mtf.VariableDType(tf.float32, tf.float32, activation_dtype))
  log(f"mode {mode}, model {model_type}, mesh '{mesh_shape}', layout '{layout_rules}', "
      f"batch {batch_size}, sequence length {sequence_length}, vocabulary "
      f"{type(vocabulary).__name__} ({vocabulary.vocab_size} ids, model "
      f"{round_up(vocabulary.vocab_size, vocab_divisor)}),"
      f" model_dir {model_dir or '(none)'}")

  def data(split_name: str, repeat: bool, data_seed: Optional[int]):
    return dataset_fn(split_name, vocabulary, sequence_length, setup.batch_size, data_seed,
                      repeat, model_type=model_type)

  if mode in ("infer", "score"):
    if not model_dir:
      raise ValueError(f"mode {mode!r} needs a model_dir with a checkpoint.")
    _restore(mesh_impl, model_dir)
    if mode == "infer":
      return _infer(setup, input_file, output_file, decode_length, temperature, top_k,
                    beam_size, alpha)
    return _score(setup, input_file, output_file)

  if model_dir and fresh and mode == "train":
    _clear_model_dir(model_dir)
  trainer = mtf.training.Trainer(
      make_model_fn(setup), setup.feature_shapes(), mesh_impl,
      make_optimizer(optimizer, learning_rate_schedule), model_dir=model_dir or None,
      grad_accum_steps=grad_accum_steps, checkpoint_every=checkpoint_every,
      keep_checkpoints=keep_checkpoints, log_every=log_every, log_fn=log)
  eval_data = data(dataset_lib.VALIDATION, False, 0)

  def evaluate() -> Dict[str, float]:
    metrics = trainer.evaluate(eval_data, steps=eval_steps)
    metrics["perplexity"] = math.exp(min(metrics["cross_entropy"], 50.0))
    _write_scalars(model_dir, trainer.global_step, {"perplexity": metrics["perplexity"]})
    log(f"eval at step {trainer.global_step}: loss={metrics['loss']:.4f} "
        f"cross_entropy={metrics['cross_entropy']:.4f} nats/token "
        f"perplexity={metrics['perplexity']:.3f} "
        f"token_accuracy={metrics['token_accuracy']:.4f} ({eval_steps} held-out batches)")
    return metrics

  start = time.perf_counter()
  result = {"step": trainer.global_step}
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
    metrics = evaluate()
    if num_samples and model_type == "lm":
      prompts = list(sample_prompts)[:num_samples]
      outputs = _lm_decode(setup, prompts, decode_length, temperature, top_k)
      for prompt, text in zip(prompts, outputs):
        log(f"--- sample (prompt {prompt!r}):\n{prompt}{text}")
    elif num_samples:
      pairs = dataset_lib.stdlib_docstring_pairs(dataset_lib.VALIDATION, max_pairs=num_samples)
      outputs = _bi_decode(setup, [p[0] for p in pairs], temperature, top_k, beam_size,
                           alpha)
      for (source, target), text in zip(pairs, outputs):
        log(f"--- {source}\n    reference: {target}\n    model:     {text}")
  result.update({"step": trainer.global_step, "eval_loss": metrics["loss"],
                 "eval_cross_entropy": metrics["cross_entropy"],
                 "perplexity": metrics["perplexity"],
                 "token_accuracy": metrics["token_accuracy"],
                 "seconds": time.perf_counter() - start})
  log("final: " + " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in result.items()))
  return result


# --------------------------------------------------------- infer and score
def _restore(mesh_impl, model_dir: str) -> None:
  manager = mtf.checkpoint.CheckpointManager(mesh_impl, model_dir)
  restored = manager.restore_or_initialize()
  if not restored:
    raise ValueError(f"No checkpoint in {model_dir!r}: train first (--mode=train).")
  log(f"restored {restored}")


def _batches(items: Sequence, size: int):
  for i in range(0, len(items), size):
    yield items[i:i + size]


def _decode_batch_size(setup: Setup) -> int:
  return inference.padded_batch_size(setup.batch_size, batch_split(setup.mesh_impl))


def _lm_decode(setup: Setup, prompts: Sequence[str], decode_length: int,
               temperature: float, top_k: int) -> List[str]:
  """Continuations of `prompts` by the language model."""
  length = setup.sequence_length["targets"]
  batch = inference.padded_batch_size(min(len(prompts), setup.batch_size),
                                      batch_split(setup.mesh_impl))
  cache = {}
  outputs = []
  for chunk in _batches(list(prompts), batch):
    ids, lengths = inference.encode_batch(setup.vocabulary, chunk, length, batch,
                                          append_eos=False)
    lengths += [0] * (batch - len(chunk))

    def build(mesh, features):
      model = setup.new_model()
      out = inference.call_with_supported(
          model.sample_autoregressive, features["ids"], temperature=temperature,
          top_k=top_k if top_k and top_k > 0 else None,
          variable_dtype=setup.variable_dtype,
          max_steps=min(decode_length, length), stop_at_token=setup.vocabulary.eos_id)
      return {"ids": out}

    out = inference.run_mtf(setup.mesh_impl, {"ids": ids},
                            {"ids": f"batch:{batch};length:{length}"}, build, cache, "lm")
    for row, n in zip(out["ids"][:len(chunk)], lengths):
      outputs.append(setup.vocabulary.decode(row[n:]))
  return outputs


def _bi_decode(setup: Setup, sources: Sequence[str], temperature: float, top_k: int,
               beam_size: int, alpha: float) -> List[str]:
  """Decodes `sources` with the encoder-decoder."""
  in_length = setup.sequence_length["inputs"]
  batch = inference.padded_batch_size(min(len(sources), setup.batch_size),
                                      batch_split(setup.mesh_impl))
  cache = {}
  outputs = []
  for chunk in _batches(list(sources), batch):
    ids, _ = inference.encode_batch(setup.vocabulary, chunk, in_length, batch,
                                    append_eos=True)

    def build(mesh, features):
      model = setup.new_model()
      out = inference.call_with_supported(
          model.decode, features["inputs"], variable_dtype=setup.variable_dtype,
          beam_size=beam_size, temperature=temperature if beam_size == 1 else 0.0,
          alpha=alpha,
          top_k=top_k if top_k and top_k > 0 else None,
          max_decode_length=setup.sequence_length["targets"])
      return {"ids": out}

    out = inference.run_mtf(setup.mesh_impl, {"inputs": ids},
                            {"inputs": f"batch:{batch};length:{in_length}"}, build, cache,
                            "bi")
    outputs.extend(setup.vocabulary.decode(row) for row in out["ids"][:len(chunk)])
  return outputs


def _infer(setup: Setup, input_file: Optional[str], output_file: Optional[str],
           decode_length: int, temperature: float, top_k: int, beam_size: int,
           alpha: float) -> Dict[str, float]:
  if not input_file:
    raise ValueError("mode 'infer' needs input_file (one input per line).")
  output_file = output_file or input_file + ".outputs"
  lines = inference.read_lines(input_file)
  start = time.perf_counter()
  if setup.model_type == "lm":
    outputs = _lm_decode(setup, lines, decode_length, temperature, top_k)
  else:
    outputs = _bi_decode(setup, lines, temperature, top_k, beam_size, alpha)
  inference.write_lines(output_file, outputs)
  for line, out in list(zip(lines, outputs))[:3]:
    log(f"{line!r} -> {out!r}")
  log(f"decoded {len(lines)} inputs to {output_file} in {time.perf_counter() - start:.1f} s")
  return {"examples": float(len(lines))}


def _score(setup: Setup, input_file: Optional[str],
           output_file: Optional[str]) -> Dict[str, float]:
  if not input_file:
    raise ValueError("mode 'score' needs input_file (one text, or input<TAB>target, per "
                     "line).")
  output_file = output_file or input_file + ".scores"
  lines = inference.read_lines(input_file)
  batch = _decode_batch_size(setup)
  shapes = setup.feature_shapes(batch)
  cache, scores = {}, []
  for chunk in _batches(lines, batch):
    features = {}
    for key in setup.feature_keys:
      if setup.model_type == "lm":
        texts = chunk
      else:
        parts = [line.split("\t", 1) + [""] for line in chunk]
        texts = [p[0] if key == "inputs" else p[1] for p in parts]
      ids, _ = inference.encode_batch(setup.vocabulary, texts, setup.sequence_length[key],
                                      batch, append_eos=True)
      features[key] = ids
      features[key + "_segmentation"] = (ids != 0).astype(np.int32)
      positions = np.broadcast_to(np.arange(ids.shape[1], dtype=np.int32), ids.shape)
      features[key + "_position"] = np.where(ids != 0, positions, 0).astype(np.int32)

    def build(mesh, mtf_features):
      logits, _ = call_model(setup, setup.new_model(), mtf_features, "eval",
                             compute_loss=False)
      return {"score": inference.log_likelihoods(logits, mtf_features["targets"])}

    out = inference.run_mtf(setup.mesh_impl, features, shapes, build, cache, "score")
    scores.extend(float(s) for s in out["score"][:len(chunk)])
  with tf.io.gfile.GFile(output_file, "w") as f:
    for s in scores:
      f.write(f"{s:.6f}\n")
  log(f"scored {len(lines)} examples to {output_file} (log-likelihood in nats; mean "
      f"{np.mean(scores) if scores else float('nan'):.4f})")
  return {"examples": float(len(lines)), "mean_score": float(np.mean(scores)) if scores
          else float("nan")}
