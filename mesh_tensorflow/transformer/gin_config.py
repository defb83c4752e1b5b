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

import os
from typing import Dict, List, Optional, Sequence

import gin

GIN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gin")

# Filled by register_configurables(): gin-aware versions of the model
# classes, to be called instead of the classes themselves.
CONFIGURABLES: Dict[str, object] = {}
_SEARCH_PATH_ADDED: List[bool] = []

# (module of this package, gin module, names).
_MODEL_NAMES = [
    ("transformer", "transformer",
     ["Unitransformer", "Bitransformer", "LayerStack", "make_layer_stack", "VocabEmbedding",
      "get_vocab_embedding_cls", "make_bitransformer", "shift_targets",
      # The original's sublayer functions (sublayers.py):
      # `transformer.LayerStack.sublayers_per_layer = [@transformer.sublayer_rms_norm, ...]`.
      "sublayer_call_layer", "sublayer_mask_padding", "sublayer_rms_norm",
      "sublayer_rms_norm_subsampled", "sublayer_legacy_rms_norm",
      "sublayer_legacy_final_rms_norm", "sublayer_true_layer_norm", "sublayer_scale_norm",
      "sublayer_dropout", "sublayer_legacy_dropout", "sublayer_residual", "sublayer_rezero",
      "sublayer_clip_activation_gradient"]),
    ("transformer_layers", "transformer_layers",
     ["SelfAttention", "EncDecAttention", "LocalSelfAttention", "DenseReluDense",
      "Conv1DLayer"]),
    ("moe", "moe", ["MoE1D", "MoE2D"]),
    ("memory_layers", "memory_layers", ["ProductKeyValueMemory"]),
    ("funnel_transformer", "funnel_transformer",
     ["FunnelTransformerLayerStack", "BitransformerFunnel"]),
    ("vocab_embeddings", "vocab_embeddings",
     ["FactorizedVocabEmbedding", "AdaptiveVocabEmbedding", "MixtureOfSoftmaxes", "Mixtape"]),
    ("adaptive_softmax", "adaptive_softmax",
     ["AdaptiveSoftmaxVocabEmbedding", "adaptive_softmax_loss_fn"]),
    ("transformer_extras", "transformer",
     ["ReversibleLayerStack", "StudentTeacher", "make_bi_student_teacher",
      "reduce_ensemble_logits", "reduce_ensemble_logits_select",
      "reduce_ensemble_logits_mean_prob", "reduce_ensemble_logits_mean_logit",
      "sublayer_annealed_dropout"]),
    ("evolved_transformer", "evolved_transformer",
     ["GatedLinearUnitLayer", "EncoderConvolutionalLayer", "DecoderAttentionLayer",
      "DecoderConvolutionalLayer"]),
    ("universal_transformer", "universal_transformer", ["UTLayerStack"]),
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
  import importlib  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import utils  # noqa: F401 (registers run & co.)
  for module_name, gin_module, names in _MODEL_NAMES:
    try:
      module = importlib.import_module(f"mesh_tensorflow.transformer.{module_name}")
    except ImportError:
      continue
    for name in names:
      obj = getattr(module, name, None)
      if obj is None:
        continue
      CONFIGURABLES[name] = gin.external_configurable(obj, module=gin_module)
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


def resolve(path: str) -> str:
  """A gin file path: as given if it exists, else under the package's gin dir.

  Example:
    >>> os.path.basename(resolve("layouts/2x4.gin"))
    '2x4.gin'
  """
  if os.path.exists(path):
    return path
  candidate = os.path.join(GIN_DIR, path)
  if os.path.exists(candidate):
    return candidate
  if not path.endswith(".gin") and os.path.exists(candidate + ".gin"):
    return candidate + ".gin"
  raise ValueError(f"No gin file {path!r} (looked in the working directory and {GIN_DIR}; "
                   f"see `ls {GIN_DIR}/*/`).")


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


def parse(files: Sequence[str] = (), bindings: Sequence[str] = (),
          defaults: bool = True, clear: bool = True) -> None:
  """Parses defaults.gin, then `files`, then `bindings` (later ones win).

  Args:
    files: gin files (see `resolve`).
    bindings: gin statements such as "run.train_steps = 100"; each may hold
      several lines.
    defaults: parse the package's gin/defaults.gin first.
    clear: forget earlier configs first.

  Example:
    >>> parse(["models/tiny_lm.gin"], ["run.batch_size = 16"])
  """
  register_configurables()
  if clear:
    gin.clear_config()
  if not _SEARCH_PATH_ADDED:
    gin.add_config_file_search_path(GIN_DIR)  # for `include "models/..."` in gin files
    _SEARCH_PATH_ADDED.append(True)
  paths = ([os.path.join(GIN_DIR, "defaults.gin")] if defaults else [])
  paths += [resolve(f) for f in files]
  gin.parse_config_files_and_bindings(paths, list(bindings), finalize_config=False)
