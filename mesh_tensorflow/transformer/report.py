r"""The layout report of a transformer configured by gin files, the program
behind `python -m mesh_tensorflow.report`.

Builds one training step (model, loss, gradients, optimizer updates) of the
transformer that `python -m mesh_tensorflow.transformer.main` would train with
the same gin files, without data or devices, and prints its layout report
(see `mesh_tensorflow.analysis.layout_report`); optionally draws it as a PNG, or first
lets auto_mtf choose the layout:

    python -m mesh_tensorflow.report --gin_file=models/tiny_lm.gin \
        --gin_file=layouts/2x4.gin --png=/tmp/layout.png
    python -m mesh_tensorflow.report --gin_param='run.batch_size = 16' --auto

--mesh_shape and --layout override the config's; --exact takes the
communication from a real lowering (slower, every op type).
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import List, Optional, Sequence, Tuple

import mesh_tensorflow as mtf
from mesh_tensorflow import auto_mtf
from mesh_tensorflow import cli
from mesh_tensorflow.analysis.layout_report import layout_report
from mesh_tensorflow.transformer import gin_config
from mesh_tensorflow.transformer import learning_rate_schedules
from mesh_tensorflow.transformer import modeling
from mesh_tensorflow.transformer import plan_stacks
from mesh_tensorflow.transformer import application
from mesh_tensorflow.transformer import run_config
from mesh_tensorflow.transformer import vocabulary as vocabulary_lib


@dataclasses.dataclass
class TrainingStep:
  """An mtf training step built from a gin config.

  Attributes:
    graph, mesh: the mtf graph and mesh.
    loss: the scalar loss.
    updates: the optimizer's assign operations.
    mesh_shape, layout: the config's (or the overriding) mesh and layout.
    first_backward_op, first_optimizer_op: index in `graph.operations` of
      the first operation of the backward pass and of the optimizer's update
      (the forward pass is everything before).
    pipeline_refusal: why the model's layers could not run pipelined
      (`LayerStack.pipeline_refusal` of a stack built without a pipeline),
      or None.
  """
  graph: object
  mesh: object
  loss: object
  updates: list
  mesh_shape: str
  layout: str
  first_backward_op: int = 0
  first_optimizer_op: int = 0
  pipeline_refusal: Optional[str] = None


# Bindings that `build_training_step(num_layers=...)` replaces while it builds
# (one micro-batch of a plain stack), with the library's defaults to restore
# where the config left them unset.
_STACK_DEFAULTS = {"transformer.make_layer_stack.num_layers": 6,
                   "transformer.make_layer_stack.num_stages": 1,
                   "transformer.make_layer_stack.num_microbatches": 1,
                   "transformer.make_layer_stack.recompute": "none",
                   "transformer.make_layer_stack.recompute_layers": None,
                   "transformer.make_layer_stack.pipeline_schedule": "gpipe",
                   "transformer.make_layer_stack.virtual_stages": 1}


def config_mesh_and_layout(mesh_shape: Optional[str] = None,
                           layout: Optional[str] = None) -> Tuple[str, str]:
  """The mesh shape and layout rules (strings) of the parsed gin config, or
  the overriding ones, without rules naming an optional mesh dimension the
  mesh lacks (`run_config.rules_for_mesh`).

  Raises:
    ValueError: a rule names another mesh dimension the mesh lacks (a typo,
      or a layout written for another mesh).

  Example:
    >>> config_mesh_and_layout("b:4;m:2", "ensemble:ensemble;batch:b;d_ff:m")
    ('b:4;m:2', 'batch:b;d_ff:m')
  """
  import gin  # pylint: disable=g-import-not-at-top
  b = dict(gin.get_bindings("run"))
  mesh_shape = mesh_shape or b.get("mesh_shape", "rows:2;cols:4")
  layout = layout if layout is not None else b.get(
      "layout_rules", "batch:rows;d_ff:cols;heads:cols;experts:rows")
  if isinstance(mesh_shape, mtf.Shape):  # the original's @utils.tpu_mesh_shape()
    mesh_shape = mesh_shape.to_string()
  layout = run_config.rules_for_mesh(layout, mesh_shape)
  mtf.convert_to_layout_rules(layout).check_mesh_shape(mesh_shape)
  return (mtf.convert_to_shape(mesh_shape).to_string(),
          mtf.convert_to_layout_rules(layout).to_string())


def _configured_sequence_lengths() -> dict:
  import gin  # pylint: disable=g-import-not-at-top
  # An unset or empty binding (0, {}) is the default lengths.
  return run_config.as_sequence_lengths(
      dict(gin.get_bindings("run")).get("sequence_length") or None)


def configured_batch_size(mesh_shape: str, layout: str) -> int:
  """Sequences per step of the parsed gin config's `run.batch_size` on this
  mesh and layout: a number, or the original's (method, value) form such as
  ("tokens_per_batch", 65536) (`run_config.compute_batch_size`).

  The counts a step is built from (the batch, `run.sequence_length`,
  `run.grad_accum_steps`, `run.outer_batch_size`) are checked as training
  checks them (`run_config.check_settings`): a plan or report of a step
  that cannot run is a ValueError naming the setting.

  Example:
    >>> gin_config.parse([], ["run.batch_size = ('tokens_per_batch', 8192)",
    ...                       "run.sequence_length = {'inputs': 512, 'targets': 512}"])
    >>> configured_batch_size("data:4", "batch:data")
    16
  """
  import gin  # pylint: disable=g-import-not-at-top
  b = dict(gin.get_bindings("run"))
  batch_size = b.get("batch_size", 32)
  if not isinstance(batch_size, (int, tuple, list)):
    raise ValueError(f"run.batch_size = {batch_size!r}: must be a positive integer or a "
                     "(method, value) pair such as ('tokens_per_batch', 65536).")
  lengths = _configured_sequence_lengths()
  if not isinstance(batch_size, int):
    batch_size = run_config.compute_batch_size(lengths, mesh_shape, layout, batch_size)
  run_config.check_settings(
      "train", sequence_length=lengths, batch_size=batch_size,
      grad_accum_steps=_count_or_one(b.get("grad_accum_steps")),
      outer_batch_size=_count_or_one(b.get("outer_batch_size")))
  return batch_size


def _count_or_one(value):
  """A count binding, None (unset) as 1."""
  return 1 if value is None else value


def dimension_names(operations) -> frozenset:
  """The names of every dimension of the tensors `operations` make: what
  `unused_rule_notes` checks a layout's rules against.

  Example:
    >>> sorted(dimension_names(graph.operations))
    ['batch', 'd_ff', 'd_model', ...]
  """
  return frozenset(d.name for op in operations for t in op.outputs for d in t.shape.dims)


def unused_rule_notes(layout, dimension_names) -> List[str]:
  """A note for each layout rule whose tensor dimension is not among
  `dimension_names` (those of a model's tensors): it splits nothing, which
  a typo does silently. ZeRO's own rules (`zero_<mesh dim>`) are left out.

  Example:
    >>> notes = unused_rule_notes("batch:data;dff:model", {"batch", "d_ff"})
    >>> len(notes), "did you mean 'd_ff'?" in notes[0]
    (1, True)
  """
  notes = []
  for tensor_dim, mesh_dim in mtf.convert_to_layout_rules(layout).pairs:
    if tensor_dim in dimension_names or tensor_dim.startswith(mtf.zero.ZERO_DIM_PREFIX):
      continue
    close = difflib.get_close_matches(tensor_dim, sorted(dimension_names), n=1)
    notes.append(f"layout rule '{tensor_dim}:{mesh_dim}' splits nothing: no tensor of this model "
                 f"has a dimension {tensor_dim!r}"
                 + (f" (did you mean {close[0]!r}?)" if close else ""))
  return notes


def configured_zero_stage() -> int:
  """The parsed gin config's `run.zero_stage` (0 when unset)."""
  return gin_config.query_count("run.zero_stage", 0)


def configured_zero_reshard() -> bool:
  """The parsed gin config's `run.zero_reshard_after_forward`, read as
  training reads it: by truth value (True when unset)."""
  value = gin_config.query("run.zero_reshard_after_forward")
  return value is None or bool(value)


def configured_activation_dtype() -> str:
  """The parsed gin config's activation dtype, as training takes it:
  `run.activation_dtype`, else the original's
  `utils.get_variable_dtype.activation_dtype` ("float32" when neither is
  set): "float32", "bfloat16" or "float16"."""
  value = gin_config.query("run.activation_dtype")
  if value is None:
    return run_config.get_variable_dtype().activation_dtype.name
  return run_config.float_dtype_name(value)


def build_training_step(mesh_shape: Optional[str] = None, layout: Optional[str] = None,
                        batch_size: Optional[int] = None,
                        num_layers: Optional[int] = None,
                        zero_stage: Optional[int] = None,
                        float32_master: Optional[bool] = None) -> TrainingStep:
  """One training step of the transformer configured by the gin config that
  is parsed now (`gin_config.parse`), as `application.run` would build it: the
  step of `python -m mesh_tensorflow.report` and, one micro-batch with one
  and two layers, of `python -m mesh_tensorflow.plan`. No tensor of the
  model's size is allocated (features are broadcast scalars, variables are
  not initialized).

  Args:
    mesh_shape, layout: override the config's.
    batch_size: sequences in the step (default: run.batch_size divided by
      run.grad_accum_steps, one accumulation step).
    num_layers: build a plain stack of this many layers (no pipeline stages,
      micro-batches or recomputation), whatever the config says.
    zero_stage: shard the training state with ZeRO (`mtf.zero`) at this
      stage; default: the config's `run.zero_stage`. The returned layout
      then has the rule that shards it.
    float32_master: store the variables in the activation dtype with float32
      masters in the optimizer (`run.float32_master_in_optimizer`, the
      default).

  Example:
    >>> gin_config.parse(["models/tiny_lm.gin"])
    >>> step = build_training_step()
  """
  import gin  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  mesh_shape, layout = config_mesh_and_layout(mesh_shape, layout)
  overrides = {} if num_layers is None else plan_stacks.with_scoped(dict(
      _STACK_DEFAULTS, **{"transformer.make_layer_stack.num_layers": num_layers}))
  with gin_config.overridden(overrides, _STACK_DEFAULTS):
    b = dict(gin.get_bindings("run"))
    vocabulary = b.get("vocabulary") or vocabulary_lib.ByteVocabulary()
    if not hasattr(vocabulary, "vocab_size"):
      raise ValueError(f"run.vocabulary is {vocabulary!r}: set one of this library's "
                       "vocabularies (see docs/porting_t5_models.md), or only its size: "
                       "run.vocabulary = @vocabulary.SizedVocabulary() and "
                       "vocabulary.SizedVocabulary.size = N.")
    sequence_length = _configured_sequence_lengths()
    if batch_size is None:
      grad_accum = int(b.get("grad_accum_steps") or 1)
      batch_size = configured_batch_size(mesh_shape, layout) // grad_accum
    impl = mtf.MeshImpl(mesh_shape, layout)
    setup = modeling.Setup(
        model_type=b.get("model_type", "lm"), vocabulary=vocabulary, mesh_impl=impl,
        sequence_length=sequence_length, batch_size=batch_size,
        vocab_size=vocabulary.vocab_size, vocab_divisor=b.get("vocab_divisor"),
        variable_dtype=mtf.VariableDType(tf.float32, tf.float32,
                                         configured_activation_dtype()),
        outer_batch_size=int(b.get("outer_batch_size") or 1))
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    features = {}
    for name, shape in setup.training_feature_shapes().items():
      shape = mtf.convert_to_shape(shape)
      # A broadcast scalar: no tensor of the feature's size is allocated.
      features[name] = mtf.import_tf_tensor(
          mesh, tf.broadcast_to(tf.constant(0, tf.int32), shape.to_integer_list()), shape,
          name=name)
    model = setup.new_model()
    loss, _ = modeling.make_model_fn(setup, model)(mesh, features, "train")
    # A stack of another kind (UTLayerStack) has no pipelined form to refuse.
    refusals = [r for r in (getattr(s, "pipeline_refusal", None) for s in _layer_stacks(model))
                if r]
    stage = configured_zero_stage() if zero_stage is None else zero_stage
    reshard = configured_zero_reshard()
    if zero_stage is None:  # the config's own stage: its settings must agree
      mtf.zero.check_reshard(stage, reshard)
    if float32_master is None:
      float32_master = bool(gin_config.query("run.float32_master_in_optimizer", False))
    if stage or float32_master:
      mtf.zero.shard_training_state(graph, impl, stage,
                                    reshard_after_forward=reshard or stage != 3,
                                    float32_master_in_optimizer=float32_master)
      layout = impl.layout_rules.to_string()
    first_backward = len(graph.operations)
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    grads = mtf.zero.shard_gradients(grads, variables)
    first_optimizer = len(graph.operations)
    steps = b.get("total_run_steps") or b.get("train_steps")
    schedule = learning_rate_schedules.bind_total_train_steps(
        run_config.as_schedule(b.get("learning_rate_schedule")),
        steps if isinstance(steps, int) else 1000)
    optimizer = application.make_optimizer(b.get("optimizer"), schedule)
    updates = optimizer.apply_grads(grads, variables)
  return TrainingStep(graph, mesh, loss, updates, mesh_shape, layout, first_backward,
                      first_optimizer, refusals[0] if refusals else None)


def _layer_stacks(model) -> list:
  """The LayerStacks of a Unitransformer or of a Bitransformer's two halves."""
  parts = [model, getattr(model, "encoder", None), getattr(model, "decoder", None)]
  return [p.layer_stack for p in parts if p is not None and hasattr(p, "layer_stack")]


def report_for_current_config(mesh_shape: Optional[str] = None, layout: Optional[str] = None,
                              exact: bool = False, params=None, auto: bool = False,
                              memory_budget_bytes: Optional[int] = None):
  """The LayoutReport of the training step of the parsed gin config (with
  auto=True, of the layout auto_mtf picks on that mesh shape).

  Example:
    >>> print(report_for_current_config())
  """
  # With auto, the config's layout (which may name other mesh dimensions)
  # plays no part.
  # ZeRO adds a rule for the data-parallel mesh dimension, which auto_mtf
  # has yet to choose: the search prices the step without it.
  step = build_training_step(mesh_shape, "" if auto and layout is None else layout,
                             zero_stage=0 if auto else None)
  params, rate_note = _at_activation_dtype_rate(params)
  chosen = step.layout
  explanation = None
  if auto:
    result = auto_mtf.search(step.graph, step.mesh_shape, params=params,
                             memory_budget_bytes=memory_budget_bytes)
    chosen = result.layout.to_string()
    explanation = result.explain()
    configured = configured_zero_stage()
    if configured:
      explanation += (f"\nZeRO: the config's run.zero_stage = {configured} is not applied here "
                      "(it needs the data-parallel mesh dimension the search picks); rerun "
                      "without --auto with the picked layout to see it.")
  report = layout_report(step.graph, step.mesh_shape, chosen, params=params,
                                       exact=exact)
  report.search_explanation = explanation
  # A layout given here is checked; the config's may serve several models.
  report.notes = [] if layout is None else unused_rule_notes(
      chosen, dimension_names(step.graph.operations))
  report.notes += [rate_note] if rate_note else []
  return report


def _at_activation_dtype_rate(params):
  """(params, note): device parameters named after a hardware preset ("gpu",
  "h100-sxm", ...) with its matrix products at the rate of the config's
  run.activation_dtype, as `python -m mesh_tensorflow.plan` prices them
  (`Hardware.for_products`), and the line saying so; other parameters, and
  a preset whose rate is its peak, as they are (note None)."""
  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.analysis.cost_model import hardware
  from mesh_tensorflow.analysis.cost_model import params as params_lib
  device = hardware.find_preset(params) if isinstance(params, str) else None
  if device is None:
    return params, None
  dtype = configured_activation_dtype()
  device.check_dtype(dtype)
  note = device.slower_products_note(dtype)
  if note is None:
    return params, None
  return params_lib.from_hardware(device.for_products(dtype)), note


def main(argv: Optional[Sequence[str]] = None) -> int:
  """`python -m mesh_tensorflow.report ARGS`; returns the exit status (see cli.run_module_command)."""
  return cli.run_module_command("mesh_tensorflow.report", _main, argv)


def _main(argv: Sequence[str]) -> int:
  """`python -m mesh_tensorflow.report --gin_file=... [--png=out.png]`."""
  parser = cli.FlagParser(
      prog="python -m mesh_tensorflow.report",
      description="Layout report (tensors' splits, per-op compute and communication, "
      "memory per device) of a transformer configured by gin files.")
  parser.add_argument("--gin_file", action="append", default=[],
                      help="gin files read after gin/defaults.gin (paths or names under "
                      "the package's gin/ directory, e.g. models/tiny_lm.gin)")
  parser.add_argument("--gin_param", action="append", default=[],
                      help="gin bindings, e.g. 'run.batch_size = 16'")
  parser.add_argument("--gin_location_prefix", action="append", default=[],
                      help=cli.GIN_FLAG_HELP["gin_location_prefix"])
  parser.add_argument("--mesh_shape", default=None, help="override the config's mesh shape")
  parser.add_argument("--layout", default=None, help="override the config's layout rules")
  parser.add_argument("--png", default=None, help="also draw the report to this PNG")
  parser.add_argument("--exact", action="store_true",
                      help="communication from a real lowering (slower)")
  parser.add_argument("--params", default="cpu",
                      help="device parameters: cpu (this machine, calibrated), a hardware "
                      "preset (gpu = a100-80gb, tpu = tpu-v3, h100-sxm, tpu-v4, ...: the mesh's "
                      "processors are that many of its devices and each collective is priced "
                      "on the links it crosses, as python -m mesh_tensorflow.plan does) or a "
                      "JSON file from python -m mesh_tensorflow.analysis.cost_model --calibrate")
  parser.add_argument("--auto", action="store_true",
                      help="report the layout auto_mtf picks on the mesh shape instead")
  parser.add_argument("--memory_budget_bytes", type=int, default=None,
                      help="with --auto: bytes per device a layout may use")
  args = parser.parse_args(argv)
  if args.memory_budget_bytes is not None and args.memory_budget_bytes <= 0:
    parser.error(f"--memory_budget_bytes={args.memory_budget_bytes}: must be a positive "
                 "number of bytes")
  gin_config.add_search_paths(args.gin_location_prefix)
  gin_config.parse(args.gin_file, args.gin_param)
  report = report_for_current_config(args.mesh_shape, args.layout, exact=args.exact,
                                     params=args.params, auto=args.auto,
                                     memory_budget_bytes=args.memory_budget_bytes)
  if report.search_explanation:
    print(report.search_explanation + "\n")
  print(report)
  for note in report.notes:
    print(f"note: {note}")
  if args.png:
    report.to_png(args.png)
    print(f"\nwrote {args.png}")
  return 0

