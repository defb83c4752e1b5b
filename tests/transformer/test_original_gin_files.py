"""gin files in the original Mesh TensorFlow's style run here: a small set of
our own, written with the original's vocabulary (always), and the original's
own files under mesh_tensorflow/transformer/gin/ when a copy of that
directory is named by the environment variable MTF_ORIGINAL_GIN_DIR (they are
not part of this repository):

    MTF_ORIGINAL_GIN_DIR=/path/to/mesh/mesh_tensorflow/transformer/gin \\
        python -m pytest tests/transformer/test_original_gin_files.py -p no:xdist

Each file is parsed after the original's defaults.gin, with sizes shrunk so
that one training step takes seconds, and trained for one step (layouts whose
mesh needs more devices than the 8 logical CPUs must fail with the clear
error that says so)."""

import glob
import math
import os

import gin
import pytest

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import gin_config
from mesh_tensorflow.transformer import utils

ORIGINAL_DIR = os.environ.get("MTF_ORIGINAL_GIN_DIR")

# Sizes and run settings small enough for one quick step; bound after the
# files, so they win over the files' sizes (never over their structure).
TINY = [
    "num_layers = 1", "d_model = 16", "d_ff = 32", "num_heads = 8", "d_kv = 2",
    "MoE1D.hidden_size = 32", "MoE1D.num_experts = 4",
    "utils.run.sequence_length = {'inputs': 8, 'targets': 8}",
    "utils.run.batch_size = 8", "utils.run.train_steps = 1", "utils.run.eval_steps = 1",
    "utils.run.total_run_steps = 100",  # what the schedules see
    "utils.run.num_samples = 0", "dataset_fn.unit = 'line'",
    "dataset_fn.shuffle_buffer = 16", "utils.run.log_every = 1",
]

# Our own files in the original's vocabulary (what its defaults.gin, a
# models/ file, a layouts/ file and a schedule file say, in our words).
OWN_DEFAULTS = """
import mesh_tensorflow.optimize
import mesh_tensorflow.transformer.transformer
import mesh_tensorflow.transformer.transformer_layers as layers_module
import mesh_tensorflow.transformer.learning_rate_schedules

transformer.make_layer_stack.layers = [
    @mesh_tensorflow.transformer.transformer_layers.SelfAttention,
    @mesh_tensorflow.transformer.transformer_layers.DenseReluDense,
]
encoder/transformer.make_layer_stack.layers = [
    @mesh_tensorflow.transformer.transformer_layers.SelfAttention,
    @mesh_tensorflow.transformer.transformer_layers.DenseReluDense,
]
decoder/transformer.make_layer_stack.layers = [
    @mesh_tensorflow.transformer.transformer_layers.SelfAttention,
    @mesh_tensorflow.transformer.transformer_layers.EncDecAttention,
    @mesh_tensorflow.transformer.transformer_layers.DenseReluDense,
]
transformer.LayerStack.sublayers_initial = [@transformer.sublayer_dropout]
transformer.LayerStack.sublayers_per_layer = [
    @transformer.sublayer_rms_norm, @transformer.sublayer_call_layer,
    @transformer.sublayer_dropout, @transformer.sublayer_residual]
transformer.LayerStack.sublayers_final = [
    @transformer.sublayer_rms_norm, @transformer.sublayer_dropout]
LayerStack.dropout_rate = None
LayerStack.norm_epsilon = None
Unitransformer.shared_embedding_and_softmax_weights = True
transformer.make_layer_stack.num_layers = %num_layers
Unitransformer.d_model = %d_model
DenseReluDense.hidden_size = %d_ff
SelfAttention.num_heads = %num_heads
SelfAttention.key_value_size = %d_kv
dropout_rate = 0.1
DenseReluDense.dropout_rate = %dropout_rate
SelfAttention.dropout_rate = %dropout_rate
transformer.sublayer_dropout.dropout_rate = %dropout_rate
TalkingHeadsSelfAttention.dropout_rate = %dropout_rate
decoder/Unitransformer.label_smoothing = 0.0
Unitransformer.max_length = 64
utils.run.optimizer = @optimize.AdafactorOptimizer
utils.run.layout_rules = "ensemble:ensemble,batch:batch,d_ff:model,heads:model,vocab:model"
utils.serialize_num_microbatches.tokens_per_microbatch_per_replica = 16
utils.run.learning_rate_schedule = @learning_rate_schedules.learning_rate_schedule_noam
utils.run.mesh_shape = @mesh_tensorflow.transformer.utils.tpu_mesh_shape()
utils.tpu_mesh_shape.model_parallelism = 2
utils.get_variable_dtype.activation_dtype = "bfloat16"
"""
OWN_MODEL = 'utils.run.model_type = "bitransformer"\nd_model = 16\n'
OWN_SCHEDULE = """
import mesh_tensorflow.transformer.learning_rate_schedules
learning_rate_schedules.constant_learning_rate.learning_rate = 0.01
run.learning_rate_schedule = @learning_rate_schedules.constant_learning_rate
"""


@pytest.fixture(autouse=True)
def _clear_gin():
  yield
  gin.clear_config()


@pytest.fixture(scope="module")
def data_bindings(tmp_path_factory):
  """inputs<TAB>targets lines: pairs for an encoder-decoder, lines of text
  for a language model."""
  path = tmp_path_factory.mktemp("data") / "pairs.tsv"
  words = ["red", "green", "blue", "cyan", "magenta", "yellow"]
  path.write_text("".join(f"{a} {b}\t{b} {a}\n" for a in words for b in words))
  return [f"dataset_fn.train_files = ['{path}']", f"dataset_fn.eval_files = ['{path}']"]


def _train_one_step(files, bindings):
  gin_config.parse(files, list(TINY) + list(bindings))
  result = utils.run(model_dir=None, mode="train")
  assert result["step"] == 1 and math.isfinite(result["loss"])
  return result


def test_own_files_in_the_original_vocabulary_train(tmp_path, caplog, data_bindings):
  paths = []
  for name, text in (("defaults.gin", OWN_DEFAULTS), ("bi.gin", OWN_MODEL),
                     ("constant.gin", OWN_SCHEDULE)):
    path = tmp_path / name
    path.write_text(text)
    paths.append(str(path))
  with caplog.at_level("WARNING"):
    _train_one_step(paths, data_bindings)
  # The mesh came from tpu_mesh_shape() on this machine's 8 devices, two of
  # them per model replica; bfloat16 activations; 16-token micro-batches of
  # the 4 sequences (of 8 tokens) per replica: 2 micro-batches.
  assert gin.query_parameter("utils.tpu_mesh_shape.model_parallelism") == 2
  assert utils.tpu_mesh_shape(model_parallelism=2).to_string() == "batch:4;model:2"
  assert utils.get_variable_dtype().activation_dtype == mtf.VariableDType(
      activation_dtype="bfloat16").activation_dtype
  skipped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("gin: skipped")]
  # Every binding names something this library has (TalkingHeadsSelfAttention too).
  assert skipped == []


def _original_files(subdir):
  return sorted(glob.glob(os.path.join(ORIGINAL_DIR or "", subdir, "*.gin")))


needs_original = pytest.mark.skipif(
    not ORIGINAL_DIR, reason="set MTF_ORIGINAL_GIN_DIR to the original's "
    "mesh_tensorflow/transformer/gin directory")


def _ids(paths):
  return [os.path.relpath(p, ORIGINAL_DIR) for p in paths]


@needs_original
@pytest.mark.parametrize("model_file", _original_files("models"),
                         ids=_ids(_original_files("models")))
def test_original_model_files_train(model_file, data_bindings):
  defaults = os.path.join(ORIGINAL_DIR, "defaults.gin")
  layout = os.path.join(ORIGINAL_DIR, "layouts", "2x2_dp_mp.gin")
  _train_one_step([defaults, model_file, layout], data_bindings)


@needs_original
@pytest.mark.parametrize("layout_file", _original_files("layouts") + [
    os.path.join(ORIGINAL_DIR or "", "8x8_dp_r4.gin")],
    ids=_ids(_original_files("layouts") + [os.path.join(ORIGINAL_DIR or "", "8x8_dp_r4.gin")]))
def test_original_layout_files(layout_file, data_bindings):
  files = [os.path.join(ORIGINAL_DIR, "defaults.gin"),
           os.path.join(ORIGINAL_DIR, "models", "tiny.gin"), layout_file]
  gin_config.parse(files, TINY + data_bindings)
  mesh_shape = gin.query_parameter("utils.run.mesh_shape")
  if mtf.convert_to_shape(mesh_shape).size > 8:
    with pytest.raises(ValueError, match="devices"):
      utils.run(model_dir=None, mode="train")
    return
  _train_one_step(files, data_bindings)


@needs_original
@pytest.mark.parametrize("schedule_file", _original_files("learning_rate_schedules"),
                         ids=_ids(_original_files("learning_rate_schedules")))
def test_original_schedule_files_and_defaults_train(schedule_file, data_bindings):
  _train_one_step([os.path.join(ORIGINAL_DIR, "defaults.gin"), schedule_file,
                   os.path.join(ORIGINAL_DIR, "layouts", "2x2_dp.gin")], data_bindings)
