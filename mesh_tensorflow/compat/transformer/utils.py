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

# pylint: disable=unused-import
from mesh_tensorflow.compat.transformer.decoding import _maybe_add_pretokenized_features  # noqa: F401
from mesh_tensorflow.compat.transformer.decoding import compute_log_likelihoods  # noqa: F401
from mesh_tensorflow.compat.transformer.decoding import decode  # noqa: F401
from mesh_tensorflow.compat.transformer.decoding import decode_from_dataset  # noqa: F401
from mesh_tensorflow.compat.transformer.decoding import decode_from_file  # noqa: F401
from mesh_tensorflow.compat.transformer.decoding import get_checkpoint_iterator  # noqa: F401
from mesh_tensorflow.compat.transformer.decoding import infer_model  # noqa: F401
from mesh_tensorflow.compat.transformer.decoding import save_scores  # noqa: F401
from mesh_tensorflow.compat.transformer.decoding import score_from_dataset  # noqa: F401
from mesh_tensorflow.compat.transformer.decoding import score_from_strings  # noqa: F401
from mesh_tensorflow.compat.transformer.decoding import score_with_estimator  # noqa: F401
from mesh_tensorflow.compat.transformer.estimator import FLAGS  # noqa: F401
from mesh_tensorflow.compat.transformer.estimator import MeshEstimator  # noqa: F401
from mesh_tensorflow.compat.transformer.estimator import build_model  # noqa: F401
from mesh_tensorflow.compat.transformer.estimator import get_estimator  # noqa: F401
from mesh_tensorflow.compat.transformer.estimator import parse_gin_defaults_and_flags  # noqa: F401
from mesh_tensorflow.compat.transformer.estimator import train_model  # noqa: F401
from mesh_tensorflow.compat.transformer.evaluation import eval_model  # noqa: F401
from mesh_tensorflow.compat.transformer.evaluation import export_model  # noqa: F401
from mesh_tensorflow.compat.transformer.evaluation import flexible_ckpt_init_mapping  # noqa: F401
from mesh_tensorflow.compat.transformer.evaluation import metric_max  # noqa: F401
from mesh_tensorflow.compat.transformer.evaluation import metric_sum  # noqa: F401
from mesh_tensorflow.compat.transformer.helpers import encode_delimited_lm  # noqa: F401
from mesh_tensorflow.compat.transformer.helpers import encode_inputs  # noqa: F401
from mesh_tensorflow.compat.transformer.helpers import get_inputs_from_file  # noqa: F401
from mesh_tensorflow.compat.transformer.helpers import get_step_from_checkpoint_path  # noqa: F401
from mesh_tensorflow.compat.transformer.helpers import init_checkpoint_variable_mapping  # noqa: F401
from mesh_tensorflow.compat.transformer.helpers import inputs_vocabulary  # noqa: F401
from mesh_tensorflow.compat.transformer.helpers import separate_vocabularies  # noqa: F401
from mesh_tensorflow.compat.transformer.helpers import should_load_variable  # noqa: F401
from mesh_tensorflow.compat.transformer.helpers import targets_vocabulary  # noqa: F401
from mesh_tensorflow.compat.transformer.helpers import tpu_estimator_model_fn  # noqa: F401
from mesh_tensorflow.compat.transformer.helpers import variable_filter_max_size  # noqa: F401
from mesh_tensorflow.compat.transformer.helpers import write_lines_to_file  # noqa: F401
from mesh_tensorflow.transformer.application import checkpoint_at_step  # noqa: F401
from mesh_tensorflow.transformer.application import configure_cpu_devices  # noqa: F401
from mesh_tensorflow.transformer.application import make_mesh_impl  # noqa: F401
from mesh_tensorflow.transformer.application import make_optimizer  # noqa: F401
from mesh_tensorflow.transformer.application import resolve_checkpoint  # noqa: F401
from mesh_tensorflow.transformer.application import run  # noqa: F401
from mesh_tensorflow.transformer.application import start_from_checkpoint  # noqa: F401
from mesh_tensorflow.transformer.application import unigram_entropy  # noqa: F401
from mesh_tensorflow.transformer.run_config import AdafactorOptimizer  # noqa: F401
from mesh_tensorflow.transformer.run_config import RunConfig  # noqa: F401
from mesh_tensorflow.transformer.run_config import auto_train_steps  # noqa: F401
from mesh_tensorflow.transformer.run_config import check_settings  # noqa: F401
from mesh_tensorflow.transformer.run_config import compute_batch_size  # noqa: F401
from mesh_tensorflow.transformer.run_config import get_variable_dtype  # noqa: F401
from mesh_tensorflow.transformer.run_config import rules_for_mesh  # noqa: F401
from mesh_tensorflow.transformer.run_config import serialize_num_microbatches  # noqa: F401
from mesh_tensorflow.transformer.run_config import tpu_mesh_shape  # noqa: F401
from mesh_tensorflow.transformer.sequence_ops import clean_decodes  # noqa: F401
from mesh_tensorflow.transformer.sequence_ops import concat_inputs_and_targets  # noqa: F401

# The original's name of concat_inputs_and_targets.
_dynamic_text2self = concat_inputs_and_targets
