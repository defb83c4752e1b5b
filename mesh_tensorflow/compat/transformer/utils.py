"""The original's `mesh_tensorflow.transformer.utils`, served at that path
(see `mesh_tensorflow.compat.original_paths`).

It gathers the library's run (`transformer.application`, its settings in
`transformer.run_config`), its sequence helpers (`transformer.sequence_ops`)
and the original's Estimator-era entry points (`estimator`, `decoding`,
`evaluation`, `helpers` beside this module) under the names the original
gave them:

    >>> from mesh_tensorflow.transformer import utils
    >>> utils.run(model_dir="/tmp/lm", mode="eval")["perplexity"]
    12.3
    >>> utils.tpu_mesh_shape("v3-8", 2).to_string()
    'batch:4;model:2'
"""

from mesh_tensorflow.compat.transformer.decoding import (
    _maybe_add_pretokenized_features, compute_log_likelihoods, decode, decode_from_dataset,
    decode_from_file, get_checkpoint_iterator, infer_model, save_scores, score_from_dataset,
    score_from_strings, score_with_estimator)
from mesh_tensorflow.compat.transformer.estimator import (
    FLAGS, MeshEstimator, build_model, get_estimator, parse_gin_defaults_and_flags, train_model)
from mesh_tensorflow.compat.transformer.evaluation import (
    eval_model, export_model, flexible_ckpt_init_mapping, metric_max, metric_sum)
from mesh_tensorflow.compat.transformer.helpers import (
    encode_delimited_lm, encode_inputs, get_inputs_from_file, get_step_from_checkpoint_path,
    init_checkpoint_variable_mapping, inputs_vocabulary, separate_vocabularies,
    should_load_variable, targets_vocabulary, tpu_estimator_model_fn, variable_filter_max_size,
    write_lines_to_file)
from mesh_tensorflow.transformer.application import (
    checkpoint_at_step, configure_cpu_devices, make_mesh_impl, make_optimizer, resolve_checkpoint,
    run, start_from_checkpoint, unigram_entropy)
from mesh_tensorflow.transformer.run_config import (
    AdafactorOptimizer, RunConfig, auto_train_steps, check_settings, compute_batch_size,
    get_variable_dtype, rules_for_mesh, serialize_num_microbatches, tpu_mesh_shape)
from mesh_tensorflow.transformer.sequence_ops import clean_decodes, concat_inputs_and_targets

# The original's name of concat_inputs_and_targets.
_dynamic_text2self = concat_inputs_and_targets

__all__ = [
    "AdafactorOptimizer", "FLAGS", "MeshEstimator", "RunConfig", "_dynamic_text2self",
    "_maybe_add_pretokenized_features", "auto_train_steps", "build_model", "check_settings",
    "checkpoint_at_step", "clean_decodes", "compute_batch_size", "compute_log_likelihoods",
    "concat_inputs_and_targets", "configure_cpu_devices", "decode", "decode_from_dataset",
    "decode_from_file", "encode_delimited_lm", "encode_inputs", "eval_model", "export_model",
    "flexible_ckpt_init_mapping", "get_checkpoint_iterator", "get_estimator",
    "get_inputs_from_file", "get_step_from_checkpoint_path", "get_variable_dtype", "infer_model",
    "init_checkpoint_variable_mapping", "inputs_vocabulary", "make_mesh_impl", "make_optimizer",
    "metric_max", "metric_sum", "parse_gin_defaults_and_flags", "resolve_checkpoint",
    "rules_for_mesh", "run", "save_scores", "score_from_dataset", "score_from_strings",
    "score_with_estimator", "separate_vocabularies", "serialize_num_microbatches",
    "should_load_variable", "start_from_checkpoint", "targets_vocabulary", "tpu_estimator_model_fn",
    "tpu_mesh_shape", "train_model", "unigram_entropy", "variable_filter_max_size",
    "write_lines_to_file"]
