"""gin for the transformer library: the configurable names and config files.

The model classes are plain Python (no gin import); `register_configurables`
makes them configurable under the names the original Mesh TensorFlow gin files
use, so a config says e.g.

    transformer.make_layer_stack.layers = [@transformer_layers.SelfAttention,
                                           @transformer_layers.DenseReluDense]
    Unitransformer.d_model = 512
    SelfAttention.num_heads = 8
    run.optimizer = @optimize.AdafactorOptimizer
    Unitransformer.vocab_embedding_cls = @vocab_embeddings.FactorizedVocabEmbedding
    FactorizedVocabEmbedding.inner_dimension_size = 64

`parse` reads the package's `gin/defaults.gin` (the main job's settings), then
the given files (paths, or names relative to the package's gin directory such
as "models/tiny_lm.gin" or "layouts/2x4.gin"), then the bindings:

    >>> parse(["models/small_lm.gin", "layouts/data_parallel.gin"],
    ...       ["run.train_steps = 1000"])
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import inspect
import io
import os
import re
import tokenize
from typing import Dict, List, Optional, Sequence, Set, Tuple

from absl import logging
import gin
import tensorflow as tf

from mesh_tensorflow.transformer.modeling import ForeignValue  # noqa: F401 (gin_config.ForeignValue)

GIN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gin")

# Filled by register_configurables(): gin-aware versions of the model
# classes, to be called instead of the classes themselves.
CONFIGURABLES: Dict[str, object] = {}
_SEARCH_PATH_ADDED: List[bool] = []
# Directories added by `add_search_path` (--gin_location_prefix), searched
# for gin files and includes.
_SEARCH_PATHS: List[str] = []

# (module of this package, gin module, names). Each is registered under the
# original's full module path (mesh_tensorflow.transformer.<gin module>), so
# a config may name it by any suffix of that path:
# `@mesh_tensorflow.transformer.transformer_layers.SelfAttention`,
# `@transformer_layers.SelfAttention` or `@SelfAttention`.
_MODEL_NAMES = [
    ("transformer", "transformer",
     ["Unitransformer", "Bitransformer", "LayerStack", "make_layer_stack", "VocabEmbedding",
      "get_vocab_embedding_cls", "make_bitransformer", "make_bi_student_teacher",
      "shift_targets",
      # The sublayer functions (sublayers.py):
      # `transformer.LayerStack.sublayers_per_layer = [@transformer.sublayer_rms_norm, ...]`.
      "sublayer_call_layer", "sublayer_mask_padding", "sublayer_rms_norm",
      "sublayer_rms_norm_subsampled", "sublayer_legacy_rms_norm",
      "sublayer_legacy_final_rms_norm", "sublayer_true_layer_norm", "sublayer_scale_norm",
      "sublayer_dropout", "sublayer_legacy_dropout", "sublayer_residual", "sublayer_rezero",
      "sublayer_clip_activation_gradient"]),
    ("transformer_layers", "transformer_layers",
     ["SelfAttention", "EncDecAttention", "LocalSelfAttention", "DenseReluDense",
      "Conv1DLayer", "TalkingHeadsSelfAttention", "TalkingHeadsEncDecAttention",
      "GeneralBilinearSelfAttention", "GeneralBilinearEncDecAttention",
      "BranchedSelfAttention", "BranchedEncDecAttention", "TransparentEncDecAttention",
      "Synthesizer", "ParallelLayer", "SeparableConv1DLayer", "Conv1DLocalAttn",
      "LightweightConv1DLocalAttn", "DynamicConv1DLocalAttn", "LocalConvAttnBlock",
      "ExpertsSelfAttention", "ExpertsEncDecAttention", "enc_dec_attention",
      "enc_dec_attention_bias", "relative_position_spans"]),
    ("moe", "moe", ["MoE1D", "MoE2D"]),
    ("memory_layers", "memory_layers", ["ProductKeyValueMemory"]),
    ("funnel_transformer", "funnel_transformer",
     ["FunnelTransformerLayerStack", "BitransformerFunnel"]),
    ("vocab_embeddings", "vocab_embeddings",
     ["FactorizedVocabEmbedding", "AdaptiveVocabEmbedding", "MixtureOfSoftmaxes", "Mixtape"]),
    ("adaptive_softmax", "adaptive_softmax",
     ["AdaptiveSoftmaxVocabEmbedding", "adaptive_softmax_loss_fn"]),
    ("transformer_extras", "transformer",
     ["ReversibleLayerStack", "StudentTeacher", "reduce_ensemble_logits", "reduce_ensemble_logits_select",
      "reduce_ensemble_logits_mean_prob", "reduce_ensemble_logits_mean_logit",
      "sublayer_annealed_dropout"]),
    ("evolved_transformer", "evolved_transformer",
     ["GatedLinearUnitLayer", "EncoderConvolutionalLayer", "DecoderAttentionLayer",
      "DecoderConvolutionalLayer"]),
    ("universal_transformer", "universal_transformer", ["UTLayerStack"]),
    ("fixup_layers", "fixup_layers",
     ["DenseReluDenseFixup", "SelfAttentionFixup", "EncDecAttentionFixup",
      "sublayer_fixup_scale", "sublayer_fixup_shift"]),
]


def register_configurables() -> Dict[str, object]:
  """Makes the model classes and functions configurable (once per process).

  Names that a module lacks are skipped, as is a module that is missing or
  fails to import (its gin names then stay unknown, and a config that uses
  them says so when parsed).

  Returns:
    {name: configurable} of what is registered, e.g. CONFIGURABLES["Unitransformer"].

  Example:
    >>> register_configurables()["make_layer_stack"]
  """
  if CONFIGURABLES:
    return CONFIGURABLES
  from mesh_tensorflow.transformer import application  # noqa: F401 (registers run & co.)
  decorated = set()
  for module_name, gin_module, names in _MODEL_NAMES:
    try:
      module = importlib.import_module(f"mesh_tensorflow.transformer.{module_name}")
    except ImportError:
      continue
    for name in names:
      obj = getattr(module, name, None)
      if obj is None:
        continue
      gin_module_path = f"mesh_tensorflow.transformer.{gin_module}"
      if isinstance(obj, type) and id(obj) not in decorated:
        # In place, as a @gin.configurable class decorator does: a
        # subclass's super().__init__() then takes its base's bindings too
        # (SelfAttention.num_heads reaches EncDecAttention).
        decorated.add(id(obj))
        CONFIGURABLES[name] = gin.configurable(name, module=gin_module_path)(obj)
      else:
        CONFIGURABLES[name] = gin.external_configurable(obj, module=gin_module_path)
  bitransformer = CONFIGURABLES.get("Bitransformer")
  if bitransformer is not None:
    # The decoding settings: `Bitransformer.decode.beam_size = 4`,
    # `Bitransformer.decode.alpha = 0.6`, ... (T5's beam_search.gin).
    bitransformer.decode = gin.configurable("decode", module="Bitransformer")(
        bitransformer.decode)
    CONFIGURABLES["Bitransformer.decode"] = bitransformer.decode
  unitransformer = CONFIGURABLES.get("Unitransformer")
  if unitransformer is not None:
    # A language model's: `Unitransformer.sample_autoregressive.temperature`
    # (T5's sample_decode.gin).
    unitransformer.sample_autoregressive = gin.configurable(
        "sample_autoregressive", module="Unitransformer")(unitransformer.sample_autoregressive)
    CONFIGURABLES["Unitransformer.sample_autoregressive"] = unitransformer.sample_autoregressive
  return CONFIGURABLES


def configurable(name: str):
  """The gin-aware version of a model class or function, by name.

  Example:
    >>> Unitransformer = configurable("Unitransformer")
  """
  register_configurables()
  if name not in CONFIGURABLES:
    raise ImportError(f"{name} is not available: its module failed to import or lacks it.")
  return CONFIGURABLES[name]


def add_search_path(directory: str) -> None:
  """Looks for gin files, and the files they include, in `directory` too
  (the original's --gin_location_prefix; e.g. T5's `t5/models/gin`, whose
  files include `models/bi_v1.gin` and `objectives/...` by such names).

  Example:
    >>> add_search_path("/path/to/t5/models/gin")
    >>> parse(["models/bi_v1.gin"])
  """
  if directory and directory not in _SEARCH_PATHS:
    _SEARCH_PATHS.append(directory)
    gin.add_config_file_search_path(directory)


def add_search_paths(values: Sequence[str]) -> None:
  """`add_search_path` for each directory of --gin_location_prefix values
  (each comma-separated, as the original's list flag)."""
  for value in values:
    for directory in value.split(","):
      add_search_path(directory.strip())


def resolve(path: str) -> str:
  """A gin file path: as given if it exists, else under a search path
  (`add_search_path`), else under the package's gin dir.

  Example:
    >>> os.path.basename(resolve("layouts/2x4.gin"))
    '2x4.gin'
  """
  if tf.io.gfile.exists(path):
    return path
  for base in _SEARCH_PATHS + [GIN_DIR]:
    candidate = os.path.join(base, path)
    if tf.io.gfile.exists(candidate):
      return candidate
    if not path.endswith(".gin") and tf.io.gfile.exists(candidate + ".gin"):
      return candidate + ".gin"
  searched = ", ".join(["the working directory"] + _SEARCH_PATHS + [GIN_DIR])
  raise ValueError(f"No gin file {path!r} (looked in {searched}; see `ls {GIN_DIR}/*/`, or "
                   "add a directory to search with --gin_location_prefix).")


def gin_files(subdir: Optional[str] = None) -> List[str]:
  """The package's gin files (of one subdirectory such as "layouts"), sorted.

  Example:
    >>> [os.path.basename(f) for f in gin_files("layouts")][:2]
    ['2x2_dp.gin', '2x2_dp_mp.gin']
  """
  root = os.path.join(GIN_DIR, subdir) if subdir else GIN_DIR
  out = []
  for dirpath, _, names in os.walk(root):
    out.extend(os.path.join(dirpath, n) for n in names if n.endswith(".gin"))
  return sorted(out)


# Classes of other packages that mean the same as one of this library's (the
# t5 / seqio vocabularies with the same arguments): a reference to them, or a
# binding of their parameters, is taken as this library's.
_SAME_MEANING = {
    "SentencePieceVocabulary": "mesh_tensorflow.transformer.vocabulary.SentencePieceVocabulary",
    "ByteVocabulary": "mesh_tensorflow.transformer.vocabulary.ByteVocabulary",
}
# The original's parameters of its per-mode functions that `run` has under
# another name (T5's infer.gin and score_from_file.gin name their files
# through them).
_RUN_ALIASES = {
    ("decode_from_file", "input_filename"): "input_file",
    ("decode_from_file", "output_filename"): "output_file",
    ("score_from_strings", "inputs"): "input_file",
    ("score_from_strings", "targets"): "targets_file",
    ("save_scores", "scores_filename"): "output_file",
    ("tpu_estimator_model_fn", "outer_batch_size"): "outer_batch_size",
}
# Parameters whose foreign value is kept as a ForeignValue (the callee raises
# a clear error unless a later binding replaces it), rather than dropped.
_KEEP_FOREIGN = {("mesh_tensorflow.transformer.utils.run", "vocabulary")}
# First selector components of the original library's configurables: an
# unknown reference with one of these is a layer or function of Mesh
# TensorFlow that this library lacks, an error rather than a skipped binding.
_MTF_MODULES = {"mesh_tensorflow", "transformer", "transformer_layers", "moe", "utils",
                "optimize", "learning_rate_schedules", "vocabulary", "dataset",
                "memory_layers", "funnel_transformer", "vocab_embeddings",
                "adaptive_softmax", "layers", "attention", "heterogeneous_moe",
                "fixup_layers"}


class _Delegate(gin.config.ParserDelegate):
  """gin's parser delegate, but records references to unknown configurables
  (and returns gin's placeholder for them) instead of raising."""

  def __init__(self):
    super().__init__(skip_unknown=False)
    self.unknown: List[str] = []

  def macro(self, name):
    _REFERENCED_MACROS.add(name)
    return super().macro(name)

  def configurable_reference(self, scoped_configurable_name, evaluate):
    try:
      return super().configurable_reference(scoped_configurable_name, evaluate)
    except ValueError as e:
      if "No configurable matching" not in str(e):
        raise
      *scopes, selector = scoped_configurable_name.split("/")
      same = _SAME_MEANING.get(selector.split(".")[-1])
      if same:
        return super().configurable_reference("/".join(scopes + [same]), evaluate)
      self.unknown.append("@" + scoped_configurable_name + ("()" if evaluate else ""))
      return gin.config.ParserDelegate(skip_unknown=True).configurable_reference(
          scoped_configurable_name, evaluate)


def _where(location) -> str:
  name = getattr(location, "filename", None) or "<bindings>"
  line = getattr(location, "line_num", None)
  return f"{name}:{line}" if isinstance(line, int) else name


def _known_names() -> List[str]:
  names = list(CONFIGURABLES) + ["run", "build_model", "dataset_fn", "tpu_mesh_shape",
                                 "get_variable_dtype", "serialize_num_microbatches",
                                 "AdafactorOptimizer", "ByteVocabulary",
                                 "SentencePieceVocabulary", "VarianceScalingInitializer"]
  return sorted(set(names))


def _parameters_of(selector: str) -> Optional[List[str]]:
  short = selector.split(".")[-1]
  obj = CONFIGURABLES.get(short)
  for module_name in ("application", "run_config", "dataset", "export",
                      "learning_rate_schedules", "vocabulary"):
    if obj is not None:
      break
    module = importlib.import_module(f"mesh_tensorflow.transformer.{module_name}")
    obj = getattr(module, short, None)
  obj = getattr(obj, "__wrapped__", obj)
  if obj is None:
    return None
  try:
    fn = obj.__init__ if inspect.isclass(obj) else obj
    return [p for p in inspect.signature(fn).parameters if p != "self"]
  except (TypeError, ValueError):
    return None


class _ParseState:
  """What one `parse` call skipped, for its single warning, and the macros
  it defined (name, where), to catch misspelled ones."""

  def __init__(self):
    self.skipped: List[str] = []
    self.macros: List[Tuple[str, str]] = []


# Macros that bindings parsed since the last clear refer to (%name).
_REFERENCED_MACROS: Set[str] = set()


def _edits(a: str, b: str) -> int:
  """Edits (insert, delete, replace, swap two neighbours) from a to b."""
  rows = [list(range(len(b) + 1))]
  for i in range(1, len(a) + 1):
    row = [i] + [0] * len(b)
    for j in range(1, len(b) + 1):
      row[j] = min(rows[-1][j] + 1, row[j - 1] + 1,
                   rows[-1][j - 1] + (a[i - 1] != b[j - 1]))
      if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
        row[j] = min(row[j], rows[-2][j - 2] + 1)
    rows.append(row)
  return rows[-1][-1]


def _check_macro_names(state: _ParseState) -> None:
  """A macro nothing refers to whose name is a typing slip (two, for names
  of 8 characters or more) from one that is referred to (`num_layerz = 3`
  where the config uses %num_layers) is a typo: it would leave the intended
  value unchanged without a word. (Files may define macros for other tools, `input_filename`
  beside `output_filename`: names further apart are left alone.)"""
  for name, where in state.macros:
    if name in _REFERENCED_MACROS or len(name) < 4:
      continue
    close = sorted((_edits(name, used), used) for used in _REFERENCED_MACROS
                   if abs(len(used) - len(name)) <= 2)
    # Short names are near each other by chance (d_kv, d_ff): one slip only.
    if close and close[0][0] <= (2 if len(name) >= 8 else 1):
      used = close[0][1]
      raise ValueError(f"{where}: macro {name!r} is not used by any binding; did you mean "
                       f"{used!r} (used as %{used})?")


def _matches(selector: str) -> bool:
  try:
    gin.config.ParsedBindingKey.parse(("", selector, "__any__"))
  except ValueError as e:
    return "No configurable matching" not in str(e)
  return True


def _is_mtf_reference(reference: str) -> bool:
  selector = reference.lstrip("@").split("/")[-1].rstrip("()")
  return "." in selector and selector.split(".")[0] in _MTF_MODULES


def _syntax_message(error: SyntaxError) -> str:
  """gin's syntax error without Python's parser internals, and for a bare
  word where a value belongs (the shell ate the quotes of a string), what to
  write instead."""
  message = re.sub(r"malformed node or string (on line \d+: )?<ast\.\w+ object at 0x[0-9a-f]+>\s*",
                   "", str(error))
  bare = re.search(r"Failed to parse token '([A-Za-z_][A-Za-z0-9_]*)'", message)
  if bare:
    word = bare.group(1)
    message += (f". A string value needs quotes inside the binding ('{word}' or \"{word}\"); "
                f"on a command line quote the whole binding, e.g. "
                f"--gin_param=\"name = '{word}'\" (a shell removes quotes it does not see "
                "inside other quotes)")
  return message


def _parse_text(text: str, source: str, state: _ParseState, directory: Optional[str]) -> None:
  """Applies the statements of one gin file or binding string (see `parse`)."""
  delegate = _Delegate()
  stream = io.StringIO(text)
  stream.name = source  # error messages then say file:line
  parser = gin.config_parser.ConfigParser(stream, delegate)
  statements = iter(parser)
  while True:
    try:
      statement = next(statements)
    except StopIteration:
      break
    except SyntaxError as e:
      raise ValueError(f"{source}: gin syntax error: {_syntax_message(e)}") from e
    except tokenize.TokenError as e:  # the text ended inside brackets or a string
      raise ValueError(f"{source}: gin syntax error: {e.args[0]}: a bracket or quote is not "
                       "closed") from e
    unknown, delegate.unknown = delegate.unknown, []
    if isinstance(statement, gin.config_parser.ImportStatement):
      if statement.module.startswith("__gin__"):
        state.skipped.append(f"from {statement.module}")
        continue
      try:
        __import__(statement.module, fromlist=[""])
      except ImportError:
        state.skipped.append(f"import {statement.module}")
      continue
    if isinstance(statement, gin.config_parser.IncludeStatement):
      _parse_file(_resolve_include(statement.filename, directory), state)
      continue
    if not isinstance(statement, gin.config_parser.BindingStatement):
      continue  # a block declaration: nothing to bind
    scope, selector, arg_name, value, location = statement
    where = _where(location) if getattr(location, "filename", None) else source
    mtf_refs = [r for r in unknown if _is_mtf_reference(r)]
    if mtf_refs:
      raise ValueError(
          f"{where}: {mtf_refs[0]} is a Mesh TensorFlow configurable that this library "
          f"does not have (used by {selector}.{arg_name or ''}); replace it, or drop the "
          "binding.")
    if not arg_name:  # a macro
      macro_name = f"{scope}/{selector}" if scope else selector
      if unknown:
        state.skipped.append(f"{macro_name} = {unknown[0]}")
        continue
      gin.bind_parameter((macro_name, "gin.macro", "value"), value)
      state.macros.append((macro_name, where))
      continue
    same = _SAME_MEANING.get(selector.split(".")[-1])
    if same and selector != same and not _matches(selector):
      selector = same
    alias = _RUN_ALIASES.get((selector.split(".")[-1], arg_name))
    if alias and not _matches(selector):
      selector, arg_name = "run", alias
    key = f"{scope + '/' if scope else ''}{selector}.{arg_name}"
    try:
      parsed = gin.config.ParsedBindingKey.parse((scope, selector, arg_name))
    except ValueError as e:
      message = str(e)
      if "No configurable matching" in message:
        short = selector.split(".")[-1]
        close = difflib.get_close_matches(short, _known_names(), n=1, cutoff=0.85)
        if close and close[0] != short:
          raise ValueError(f"{where}: no configurable {selector!r}; did you mean "
                           f"{close[0]!r}?") from None
        state.skipped.append(key)
        continue
      if "doesn't have a parameter named" in message:
        params = _parameters_of(selector) or []
        close = difflib.get_close_matches(arg_name, params, n=1, cutoff=0.8)
        if close:
          raise ValueError(f"{where}: {selector} has no parameter {arg_name!r}; did you "
                           f"mean {close[0]!r}?") from None
        state.skipped.append(key)
        continue
      raise ValueError(f"{where}: {message}") from None
    if unknown:
      if (parsed.complete_selector, arg_name) in _KEEP_FOREIGN:
        gin.bind_parameter((scope, selector, arg_name), ForeignValue(key, unknown[0]))
      else:
        state.skipped.append(f"{key} = {unknown[0]}")
      continue
    gin.bind_parameter((scope, selector, arg_name), value)


def _resolve_include(filename: str, directory: Optional[str]) -> str:
  """An included file: beside the including file or in a directory above it
  (a tree of gin files includes `models/x.gin` from `models/y.gin`), then as
  `resolve` finds it."""
  bases = []
  while directory and len(bases) < 3:
    bases.append(directory)
    directory = os.path.dirname(directory) if os.path.dirname(directory) != directory else None
  for base in bases + [os.getcwd()]:
    candidate = os.path.join(base, filename)
    if tf.io.gfile.exists(candidate):
      return candidate
  return resolve(filename)


def _parse_file(path: str, state: _ParseState) -> None:
  with tf.io.gfile.GFile(path, "r") as f:
    text = f.read()
  _parse_text(text, path, state, os.path.dirname(path))


@contextlib.contextmanager
def overridden(bindings: Dict[str, object], defaults: Dict[str, object]):
  """Binds `bindings` for the duration, then each name's previous binding
  again (as bound: a macro stays one), or its value in `defaults` where it
  was not bound.

  Example:
    >>> with overridden({"transformer.make_layer_stack.num_layers": 1},
    ...                 {"transformer.make_layer_stack.num_layers": 6}):
    ...   step = build()
  """
  unbound = object()  # a name bound to None is bound: it gets None back
  saved = {}
  for name in bindings:
    try:
      saved[name] = gin.query_parameter(name)
    except ValueError:
      saved[name] = unbound
  with gin.unlock_config():
    for name, value in bindings.items():
      gin.bind_parameter(name, value)
  try:
    yield
  finally:
    with gin.unlock_config():
      for name, value in saved.items():
        gin.bind_parameter(name, defaults[name] if value is unbound else value)


def query(name: str, default=None):
  """The value bound to `name` ("run.zero_stage") in the parsed config,
  following macros (`%num_layers`) to their values; `default` when it is not
  bound, or bound to something other than a value or a macro.

  Example:
    >>> parse([], ["num_layers = 4", "run.zero_stage = 2"])
    []
    >>> query("run.zero_stage"), query("transformer.make_layer_stack.num_layers")
    (2, 4)
  """
  try:
    value = gin.query_parameter(name)
  except ValueError:
    return default
  for _ in range(8):  # a macro names another binding
    if not isinstance(value, gin.config.ConfigurableReference):
      return value
    text = str(value)
    if not text.startswith("%"):
      return default
    try:
      value = gin.query_parameter(text)
    except ValueError:
      return default
  return default


def query_count(name: str, default: int) -> int:
  """`query` of a whole-number binding; unset (or None) is `default`.

  Example:
    >>> parse([], ["run.zero_stage = 2"])
    []
    >>> query_count("run.zero_stage", 0), query_count("run.grad_accum_steps", 1)
    (2, 1)

  Raises:
    ValueError: naming the binding, for anything but a whole number.
  """
  return whole_number(name, query(name), default)


def whole_number(name: str, value, default: int) -> int:
  """`value`, bound to `name`, as a whole number; None is `default`.

  Raises:
    ValueError: naming the binding, for anything but a whole number.
  """
  value = default if value is None else value
  whole = (isinstance(value, (int, float)) and not isinstance(value, bool)
           and float(value).is_integer())
  if not whole:
    raise ValueError(f"{name} = {value!r}: must be a whole number.")
  return int(value)


def parse(files: Sequence[str] = (), bindings: Sequence[str] = (),
          defaults: bool = True, clear: bool = True) -> List[str]:
  """Parses defaults.gin, then `files`, then `bindings` (later ones win).

  The original Mesh TensorFlow's vocabulary is accepted: full module paths
  (`@mesh_tensorflow.transformer.transformer_layers.SelfAttention`,
  `mesh_tensorflow.transformer.transformer.make_layer_stack.layers`),
  `utils.run.*`, and operative configs as gin writes them (import lines,
  macros, every default spelled out). What belongs to other packages (the
  `t5` package's datasets and vocabularies, TPUEstimator settings,
  parameters of the original that have no counterpart here) is skipped, and
  the skipped bindings are listed in ONE warning. A near-miss of a name this
  library has (`Unitransformr`, `d_modle`) is an error that suggests it, and
  a reference to a Mesh TensorFlow layer or function missing here is an
  error, so a typo or a missing layer never passes silently.

  Args:
    files: gin files (see `resolve`): paths, or names under the package's
      gin directory.
    bindings: gin statements such as "run.train_steps = 100"; each may hold
      several lines.
    defaults: parse the package's gin/defaults.gin first.
    clear: forget earlier configs first.

  Returns:
    The skipped bindings and imports (also logged as one warning).

  Example:
    >>> parse(["models/tiny_lm.gin"], ["run.batch_size = 16"])
    []
    >>> parse([], ["t5.models.mesh_transformer.tsv_dataset_fn.filename = 'a.tsv'"])
    ['t5.models.mesh_transformer.tsv_dataset_fn.filename']
  """
  register_configurables()
  if clear:
    gin.clear_config()
    _REFERENCED_MACROS.clear()
  if not _SEARCH_PATH_ADDED:
    gin.add_config_file_search_path(GIN_DIR)  # for `include "models/..."` in gin files
    _SEARCH_PATH_ADDED.append(True)
  state = _ParseState()
  paths = ([os.path.join(GIN_DIR, "defaults.gin")] if defaults else [])
  paths += [resolve(f) for f in files]
  for path in paths:
    _parse_file(path, state)
  for binding in bindings:
    _parse_text(binding, "--gin_param " + repr(binding), state, None)
  _check_macro_names(state)
  if state.skipped:
    logging.warning(
        "gin: skipped %d bindings and imports that name other packages or settings with no "
        "meaning in this library (t5 datasets and vocabularies, TPU settings, ...): %s",
        len(state.skipped), "; ".join(state.skipped))
  return state.skipped
