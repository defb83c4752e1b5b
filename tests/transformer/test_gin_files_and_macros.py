"""gin files found as the original and T5 find them (a directory tree whose
files include each other by `models/...` names, --gin_location_prefix), and
macros whose names are typing slips of the ones a config uses."""

import json
import os
import subprocess
import sys

import gin
import pytest

from mesh_tensorflow.transformer import gin_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A tree laid out as T5's t5/models/gin: a size file includes a base file by
# its name under the tree's root.
BASE = """
num_layers = 2
d_model = 64
d_ff = 128
num_heads = 4
d_kv = 16
transformer.make_layer_stack.num_layers = %num_layers
Unitransformer.d_model = %d_model
DenseReluDense.hidden_size = %d_ff
SelfAttention.num_heads = %num_heads
SelfAttention.key_value_size = %d_kv
"""
LARGER = """
include 'models/my_base.gin'
d_model = 96
"""


@pytest.fixture
def tree(tmp_path):
  (tmp_path / "models").mkdir()
  (tmp_path / "models" / "my_base.gin").write_text(BASE)
  (tmp_path / "models" / "my_larger.gin").write_text(LARGER)
  yield str(tmp_path)
  # Search paths last for the process (as gin's own); drop this test's.
  for directory in (str(tmp_path), "/nonexistent"):
    if directory in gin_config._SEARCH_PATHS:
      gin_config._SEARCH_PATHS.remove(directory)


def test_a_file_includes_by_the_name_under_its_tree(tree):
  gin_config.parse([os.path.join(tree, "models", "my_larger.gin")])
  assert gin.query_parameter("d_model/macro.value") == 96
  assert gin.query_parameter("num_layers/macro.value") == 2


def test_search_paths_find_files_by_name(tree):
  with pytest.raises(ValueError, match="No gin file 'models/my_larger.gin'.*"
                     "--gin_location_prefix"):
    gin_config.parse(["models/my_larger.gin"])
  gin_config.add_search_paths([f"/nonexistent,{tree}"])
  gin_config.parse(["models/my_larger.gin"])
  assert gin.query_parameter("d_model/macro.value") == 96


@pytest.mark.parametrize("typo, meant", [("num_layerz", "num_layers"), ("d_modle", "d_model"),
                                         ("num_head", "num_heads")])
def test_a_macro_one_slip_from_a_used_one_is_an_error(tree, typo, meant):
  with pytest.raises(ValueError, match=f"macro '{typo}' is not used by any binding; did you "
                     f"mean '{meant}'"):
    gin_config.parse([os.path.join(tree, "models", "my_base.gin")], [f"{typo} = 3"])


def test_macros_for_other_tools_are_left_alone(tree):
  # As T5's infer_from_task.gin: input_filename for a launch script beside a
  # used output_filename; a macro nobody uses at all; a short name two
  # slips from used ones (d_xy: d_kv, d_ff).
  gin_config.parse([os.path.join(tree, "models", "my_base.gin")], [
      "output_filename = '/tmp/out'", "Bitransformer.decode.beam_size = %output_filename",
      "input_filename = None", "my_own_setting = 3", "d_xy = 8"])
  assert gin.query_parameter("input_filename/macro.value") is None


def test_plan_reads_a_tree_through_gin_location_prefix(tree):
  out = subprocess.run(
      [sys.executable, "-m", "mesh_tensorflow.plan", f"--gin_location_prefix={tree}",
       "--gin_file=models/my_larger.gin", "--gin_param=run.batch_size = 8",
       "--gin_param=run.model_type = 'lm'",
       "--gin_param=run.sequence_length = {'inputs': 32, 'targets': 32}",
       "--gin_param=run.vocabulary = @vocabulary.SizedVocabulary()",
       "--gin_param=vocabulary.SizedVocabulary.size = 256",
       "--hardware=a100-80gb:8", "--mesh_shape=data:8", "--layout=batch:data", "--json"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  plan = json.loads(out.stdout)
  assert plan["num_layers"] == 2
