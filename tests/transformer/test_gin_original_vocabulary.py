"""The original Mesh TensorFlow's gin vocabulary, as T5 model directories'
operative configs write it: full module paths, `utils.run.*` with all of the
original's run() parameters, the run-level helpers (`utils.tpu_mesh_shape`,
`utils.get_variable_dtype`, `serialize_num_microbatches`,
`adafactor_decay_rate_pow`, `VarianceScalingInitializer`), bindings of
other packages skipped with ONE warning, and values the config sets winning
over this library's defaults."""

import logging
import os

import gin
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import gin_config
from mesh_tensorflow.transformer import modeling
from mesh_tensorflow.transformer import run_config
from mesh_tensorflow.transformer import transformer_layers
from mesh_tensorflow.transformer import utils
from mesh_tensorflow.transformer import vocabulary as vocabulary_lib

OPERATIVE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                         "t5_style_operative_config.gin")


@pytest.fixture(autouse=True)
def _clear_gin():
  yield
  gin.clear_config()


def _gin_warnings(caplog):
  return [r for r in caplog.records
          if r.levelno == logging.WARNING and r.getMessage().startswith("gin: skipped")]


def test_full_module_paths_and_short_names_name_the_same_configurables():
  skipped = gin_config.parse([], [
      "mesh_tensorflow.transformer.transformer.make_layer_stack.layers = ["
      "@mesh_tensorflow.transformer.transformer_layers.SelfAttention, "
      "@transformer_layers.DenseReluDense]",
      "mesh_tensorflow.transformer.transformer.make_layer_stack.num_layers = 3",
      "utils.run.batch_size = 16",
      "mesh_tensorflow.transformer.utils.run.train_steps = 7",
      "run.optimizer = @mesh_tensorflow.optimize.AdafactorOptimizer",
      "SelfAttention.num_heads = 2",
  ], defaults=False)
  assert skipped == []
  # Each spelling reads back the one binding.
  assert gin.query_parameter("transformer.make_layer_stack.num_layers") == 3
  assert gin.query_parameter("make_layer_stack.num_layers") == 3
  assert gin.query_parameter("run.batch_size") == 16
  assert gin.query_parameter("utils.run.train_steps") == 7
  stack = gin_config.configurable("make_layer_stack")()
  kinds = [type(layer).__name__ for layer in stack.layers]
  assert kinds == ["SelfAttention", "DenseReluDense"] * 3
  assert stack.layers[0].num_heads == 2


def test_operative_config_parses_with_one_warning_listing_other_packages(caplog):
  with caplog.at_level(logging.WARNING):
    skipped = gin_config.parse([OPERATIVE])
  warnings = _gin_warnings(caplog)
  assert len(warnings) == 1, [w.getMessage() for w in warnings]
  message = warnings[0].getMessage()
  # (mesh_tensorflow.transformer.t2t_vocabulary exists here, so its import line is kept.)
  for item in ("import t5.models.mesh_transformer",
               "mesh_train_dataset_fn.mixture_or_task_name",
               "run.train_dataset_fn = @t5.models.mesh_transformer.mesh_train_dataset_fn",
               "tpu_estimator_model_fn.tpu_summaries",
               "rewrite_stack_variables.max_combined_variable_size",
               "SimdMeshImpl.allreduce_in_bfloat16_max_group_size"):
    assert item in skipped and item in message
  # What this library knows is bound as written (later files win over
  # defaults.gin, and nothing of the config is dropped).
  assert gin.query_parameter("decoder/Unitransformer.vocab_divisor") == 128
  assert gin.query_parameter("encoder/SelfAttention.relative_attention_type") == "bias_shared"
  assert gin.query_parameter("decoder/DenseReluDense.activation") == ["gelu", "linear"]
  assert gin.query_parameter("run.batch_size") == ("tokens_per_batch", 192)
  assert gin.query_parameter("adafactor_decay_rate_pow.offset") == 0
  assert not any(s.startswith(("decoder/Unitransformer", "encoder/SelfAttention", "run.batch"))
                 for s in skipped)
  # The t5 vocabulary is kept as a marker: run says what to set instead of
  # silently falling back to bytes.
  vocab = gin.query_parameter("run.vocabulary")
  assert isinstance(vocab, gin_config.ForeignValue)
  with pytest.raises(ValueError, match=r"SentencePieceVocabulary.*extra_ids = 100"):
    utils.run(model_dir=None)
  # A later binding replaces it.
  gin_config.parse([OPERATIVE], ["run.vocabulary = @vocabulary.ByteVocabulary()"])
  assert isinstance(gin.query_parameter("run.vocabulary").scoped_configurable_fn(),
                    vocabulary_lib.ByteVocabulary)


def test_import_lines_with_aliases_and_unknown_modules(caplog):
  with caplog.at_level(logging.WARNING):
    skipped = gin_config.parse([], [
        "import mesh_tensorflow.transformer.utils as mtf_utils\n"
        "import mesh_tensorflow.transformer.transformer_layers\n"
        "import t5.data.sentencepiece_vocabulary as spv\n"
        "from t5.models import mesh_transformer\n"
        "utils.run.model_type = 'bitransformer'"], defaults=False)
  assert skipped == ["import t5.data.sentencepiece_vocabulary",
                     "import t5.models.mesh_transformer"]
  assert len(_gin_warnings(caplog)) == 1
  assert gin.query_parameter("run.model_type") == "bitransformer"


@pytest.mark.parametrize("binding, message", [
    ("Unitransformr.d_model = 8", r"no configurable 'Unitransformr'; did you mean "
                                  r"'Unitransformer'"),
    ("Unitransformer.d_modle = 8", r"has no parameter 'd_modle'; did you mean 'd_model'"),
    ("transformer.make_layer_stack.layers = "
     "[@mesh_tensorflow.transformer.transformer_layers.NoSuchLayer]",
     r"NoSuchLayer is a Mesh TensorFlow configurable that this library does not have"),
])
def test_typos_and_missing_layers_are_errors_not_skips(binding, message):
  with pytest.raises(ValueError, match=message):
    gin_config.parse([], [binding], defaults=False)


def test_run_ignores_tpu_settings_with_one_warning_and_refuses_variable_filter(caplog):
  gin_config.parse([], defaults=False)
  with caplog.at_level(logging.WARNING), pytest.raises(ValueError, match="model_type"):
    utils.run(model_dir=None, model_type="aligned", autostack=True, iterations_per_loop=100,
              tpu="my-tpu", mesh_devices=["gpu:0"], export_path="")
  runs = [r.getMessage() for r in caplog.records if r.getMessage().startswith("utils.run:")]
  assert len(runs) == 1
  for item in ("autostack=True", "iterations_per_loop=100", "tpu='my-tpu'",
               "mesh_devices=['gpu:0']", "export_path=''"):
    assert item in runs[0]
  with pytest.raises(ValueError, match="variable_filter"):
    utils.run(model_dir=None, variable_filter="encoder/.*")


def test_run_level_helpers_compute_as_the_original():
  assert utils.tpu_mesh_shape("v3-8", 2).to_string() == "batch:4;model:2"
  assert utils.tpu_mesh_shape("4x4", 8).to_string() == "batch:4;model:8"
  assert utils.tpu_mesh_shape("v2-8", 8).to_string() == "model:8"
  assert utils.tpu_mesh_shape(None, 1).size == len(tf.config.list_logical_devices("CPU"))
  rules = "ensemble:ensemble,batch:batch,d_ff:model,heads:model,vocab:model"
  lengths = {"inputs": 64, "targets": 32}
  assert utils.compute_batch_size(lengths, "batch:4;model:2", rules,
                                  ("tokens_per_batch", 1024)) == 16
  assert utils.compute_batch_size(lengths, "batch:4;model:2", rules,
                                  ("tokens_per_replica", 128)) == 8
  assert utils.compute_batch_size(lengths, "batch:4;model:2", rules,
                                  ("sequences_per_replica", 3)) == 12
  assert utils.compute_batch_size(lengths, "batch:4;model:2", rules,
                                  ("sequences_per_batch", 5)) == 5
  with pytest.raises(ValueError, match="not a whole number of sequences"):
    utils.compute_batch_size(lengths, "batch:4", "batch:batch", ("tokens_per_batch", 100))
  # 16 sequences per replica of 64 tokens, at most 256 tokens per micro-batch.
  assert utils.serialize_num_microbatches(16, lengths, 256) == 4
  assert utils.serialize_num_microbatches(6, lengths, 256) == 2  # largest divisor <= 4
  assert utils.serialize_num_microbatches(16, lengths, None) == 1
  assert utils.auto_train_steps(128, lengths, 2 ** 20) == 128
  assert utils.rules_for_mesh(rules, "batch:2;model:4") == (
      "batch:batch;d_ff:model;heads:model;vocab:model")
  with pytest.raises(ValueError, match=r"mesh shape 'data:4;data:2' repeats the dimension "
                     r"name\(s\) \['data'\]: give each mesh dimension its own name"):
    utils.rules_for_mesh("batch:data", "data:4;data:2")
  dtype = utils.get_variable_dtype(activation_dtype="bfloat16")
  assert (dtype.master_dtype, dtype.slice_dtype, dtype.activation_dtype) == (
      tf.float32, tf.float32, tf.bfloat16)
  constant = run_config.as_schedule(0.25)
  assert constant(3) == 0.25
  product = run_config.as_schedule([0.5, 2.0])
  assert float(product(1, total_train_steps=10)) == 1.0


def test_gin_bindings_reach_the_optimizer_and_the_initializer():
  gin_config.parse([], ["adafactor_decay_rate_pow.exponent = 0.5",
                        "adafactor_decay_rate_pow.offset = 1",
                        "VarianceScalingInitializer.scale = 4.0",
                        "VarianceScalingInitializer.distribution = 'uniform'"],
                   defaults=False)
  optimizer = utils.make_optimizer(None, None)
  # 1 - (t + 1 - offset) ** -exponent at step 4: 1 - 4 ** -0.5.
  assert float(optimizer.decay_rate(4)) == pytest.approx(0.5)
  init = mtf.initializers.VarianceScalingInitializer()
  assert init.scale == 4.0 and init.distribution == "uniform"
  assert mtf.initializers.VarianceScalingInitializer(scale=2.0).scale == 2.0  # explicit wins
  gin.clear_config()
  assert mtf.initializers.VarianceScalingInitializer().scale == 1.0


def _setup(model_type, vocab_divisor=None):
  impl = utils.make_mesh_impl("all:1", "")
  return modeling.Setup(model_type, vocabulary_lib.ByteVocabulary(), impl,
                        {"inputs": 16, "targets": 16}, 8, 259, vocab_divisor,
                        mtf.VariableDType())


def test_values_the_config_sets_are_not_overridden():
  # defaults.gin rounds to 8; the config's 128 wins, and the LM keeps the
  # name and max_length the config gives it.
  gin_config.parse([], ["Unitransformer.vocab_divisor = 128",
                        "Unitransformer.name = 'my_lm'",
                        "Unitransformer.max_length = 77",
                        "Unitransformer.positional_embedding = 'learned'"])
  lm = _setup("lm").new_model()
  assert (lm.output_vocab_dim.size, lm.name, lm.max_length_dim.size) == (384, "my_lm", 77)
  assert _setup("lm").model_vocab_size() == 384
  # An explicit run.vocab_divisor still applies when given.
  assert _setup("lm", vocab_divisor=8).new_model().output_vocab_dim.size == 264
  # Without bindings: the class defaults (name "transformer", as the original).
  gin_config.parse([], [])
  lm = _setup("lm").new_model()
  assert (lm.output_vocab_dim.size, lm.name, lm.max_length_dim.size) == (264, "transformer", 16)
  # Scoped bindings of an encoder-decoder.
  gin_config.parse([OPERATIVE], ["run.vocabulary = @vocabulary.ByteVocabulary()"])
  bi = _setup("bitransformer").new_model()
  assert bi.decoder.output_vocab_dim.size == 384 and bi.encoder.input_vocab_dim.size == 384
  assert (bi.encoder.name, bi.decoder.name) == ("encoder", "decoder")
  assert not bi.decoder.shared_embedding_and_softmax_weights
  dense = [layer for layer in bi.decoder.layer_stack.layers
           if isinstance(layer, transformer_layers.DenseReluDense)]
  assert dense and dense[0].activation == ["gelu", "linear"]


def test_t5_sentencepiece_vocabulary_means_this_librarys():
  gin_config.parse([], [
      "run.vocabulary = @t5.data.sentencepiece_vocabulary.SentencePieceVocabulary()",
      "t5.data.sentencepiece_vocabulary.SentencePieceVocabulary.extra_ids = 100",
      "SentencePieceVocabulary.sentencepiece_model_file = 'spm.model'"], defaults=False)
  reference = gin.query_parameter("run.vocabulary")
  assert reference.configurable.wrapped is vocabulary_lib.SentencePieceVocabulary
  assert gin.query_parameter("SentencePieceVocabulary.extra_ids") == 100
  assert gin.query_parameter("SentencePieceVocabulary.sentencepiece_model_file") == "spm.model"


@pytest.mark.parametrize("block_scope, expected", [
    (True, {"transformer/block_000/layer_000/SelfAttention/q",
            "transformer/block_001/layer_001/DenseReluDense/wo/kernel",
            "transformer/block_001/layer_001/rms_norm/scale"}),
    (False, {"transformer/layer_000/SelfAttention/q",
             "transformer/layer_003/DenseReluDense/wo/kernel",
             "transformer/layer_003/rms_norm/scale"}),
])
def test_block_scope_the_config_sets_names_the_variables(block_scope, expected):
  gin_config.parse([], ["num_layers = 2", "d_model = 8", "d_ff = 16", "num_heads = 2",
                        "d_kv = 4", f"make_layer_stack.block_scope = {block_scope}",
                        "transformer.LayerStack.sublayers_per_layer = ["
                        "@transformer.sublayer_rms_norm, @transformer.sublayer_call_layer, "
                        "@transformer.sublayer_residual]"])
  model = _setup("lm").new_model()
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  batch, length = mtf.Dimension("batch", 2), mtf.Dimension("length", 16)
  targets = mtf.import_tf_tensor(mesh, tf.ones([2, 16], tf.int32), [batch, length])
  model.call_simple(targets, targets, True, mode="eval")
  names = {v.name for v in graph.trainable_variables}
  assert expected <= names, sorted(names)
  assert any("block_" in n for n in names) == block_scope


def test_eval_checkpoint_step_and_init_checkpoint_paths(tmp_path):
  (tmp_path / "checkpoint").write_text(
      'model_checkpoint_path: "model.ckpt-1200"\n'
      'all_model_checkpoint_paths: "model.ckpt-1000"\n'
      'all_model_checkpoint_paths: "model.ckpt-1200"\n')
  for step in (1000, 1200):
    (tmp_path / f"model.ckpt-{step}.index").write_text("")
  assert utils.checkpoint_at_step(str(tmp_path), 1000) == str(tmp_path / "model.ckpt-1000")
  with pytest.raises(ValueError, match="has no checkpoint of that step.*1000, 1200"):
    utils.checkpoint_at_step(str(tmp_path), 5)
  assert utils.resolve_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-1200")
  assert utils.resolve_checkpoint(str(tmp_path / "model.ckpt-1000")) == str(
      tmp_path / "model.ckpt-1000")
  with pytest.raises(ValueError, match="No checkpoint at"):
    utils.resolve_checkpoint(str(tmp_path / "model.ckpt-7"))
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(ValueError, match="No checkpoint in directory"):
    utils.resolve_checkpoint(str(empty))


def test_layout_report_of_an_operative_config():
  from mesh_tensorflow import report  # pylint: disable=g-import-not-at-top
  gin_config.parse([OPERATIVE], ["run.vocabulary = @vocabulary.ByteVocabulary()"])
  text = str(report.report_for_current_config())
  # tpu_mesh_shape's mesh, the config's layout without its ensemble rule.
  assert "mesh 'batch:2;model:4' (8 processors)" in text
  assert "layout 'batch:batch;d_ff:model;heads:model;vocab:model;experts:batch'" in text
