"""Beam search decodes equal those of the original Mesh TensorFlow 0.1.21.

tests/data/original_0.1.21/<model>/beam_decodes.json holds what the original
itself decoded from the checkpoints it wrote there
(oss_scripts/make_original_beam_decodes.py, run with mesh-tensorflow 0.1.21):
per setting (beam size, alpha, decode length, end id, and the layout and
mesh shape that turn on its vocabulary prefilter) the best beam's ids, every
beam's ids and every beam's score. Here the same checkpoints decode through
the Python API (every beam, every score) and through the command line
(`--mode=infer` with the original's gin bindings `Bitransformer.decode.*`).
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.layers import beam_search as beam_search_lib
from mesh_tensorflow.transformer import gin_config
from mesh_tensorflow.transformer import inference
from mesh_tensorflow.transformer import modeling
from mesh_tensorflow.transformer import utils
from mesh_tensorflow.transformer import vocabulary as vocabulary_lib

pytestmark = pytest.mark.xdist_group("original_beam_search")

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "original_0.1.21"
MODELS = ["t5_v1_0_bi", "t5_1_1_bi", "lm"]
LENGTH = 16


def _fixture(name):
  return json.loads((DATA / name / "beam_decodes.json").read_text())


def _decode_here(name, setting, input_ids):
  """(best ids, beams, scores) of this library's decode of model `name`."""
  model_type = "lm" if name == "lm" else "bitransformer"
  captured = {}
  real = beam_search_lib.beam_search

  def capturing(*args, **kwargs):
    captured["beams"], captured["scores"] = real(*args, **kwargs)
    return captured["beams"], captured["scores"]

  def build(mesh, features):
    model = modeling.build_model(model_type, 259, 259, LENGTH,
                                 layout=setting.get("layout"),
                                 mesh_shape=setting.get("mesh_shape"))
    dtype = utils.get_variable_dtype()
    eos = setting.get("eos_id", 1)
    beam_search_lib.beam_search = capturing
    try:
      if model_type == "lm":
        zeros = mtf.zeros(mesh, mtf.Shape([mtf.Dimension("batch", 1),
                                           mtf.Dimension("beam", setting["beam_size"]),
                                           mtf.Dimension("length", LENGTH)]), dtype=tf.int32)
        best = model.beam_search(zeros, setting["decode_length"], variable_dtype=dtype,
                                 alpha=setting["alpha"], stop_at_token=eos,
                                 bos_id=setting.get("bos_id", 0))
      else:
        options = {k: v for k, v in setting.items()
                   if k in ("beam_size", "alpha", "decode_length_multiplier",
                            "decode_length_constant")}
        best = model.decode(features["inputs"], variable_dtype=dtype, stop_at_token=eos,
                            max_decode_length=LENGTH, **options)
    finally:
      beam_search_lib.beam_search = real
    return {"best": best, "beams": captured["beams"], "scores": captured["scores"]}

  ids = np.asarray(input_ids if input_ids is not None else [[0] * LENGTH], np.int32)
  impl = _STATE["impl"]
  out = inference.run_mtf(impl, {"inputs": ids},
                          {"inputs": f"batch:{ids.shape[0]};length:{LENGTH}"}, build)
  return out["best"].reshape([-1, LENGTH]), out["beams"], out["scores"]


_STATE = {}


@pytest.fixture(scope="module", params=MODELS)
def restored(request):
  name = request.param
  gin_config.parse([str(DATA / name / "operative_config.gin")], [])
  impl = utils.make_mesh_impl("all:1", "")
  inference.restore(impl, str(DATA / name))
  _STATE["impl"] = impl
  yield name
  _STATE.clear()
  gin.clear_config()  # the operative config binds Unitransformer for later tests too


# The settings compared here (each is one lowering and decode; the fixtures
# hold more, all equal as well): the vocabulary prefilter with ends, beam 2
# without length penalty, a decode length cut short, a language model that
# reads a start id (bos_id 2) first; the CLI test below
# decodes beam 4, alpha 0.6 on a split mesh.
CHECKED = {"t5_v1_0_bi": ["beam4_alpha0.6_eos_split", "beam2_alpha0_eos",
                          "beam3_alpha1_short_eos"],
           "t5_1_1_bi": ["beam4_alpha0.6_eos_split", "beam2_alpha0_eos",
                         "beam3_alpha1_short_eos"],
           "lm": ["beam4_alpha0.6_eos_split", "beam3_alpha2_len6_eos",
                  "beam4_alpha0.6_bos2_eos_split"]}


def test_python_api_beam_decodes_equal_the_originals(restored):
  name = restored
  entries = [e for e in _fixture(name)["decodes"] if e["name"] in CHECKED[name]]
  assert len(entries) == len(CHECKED[name])
  compared = 0
  for entry in entries:
    best, beams, scores = _decode_here(name, entry["settings"], entry.get("input_ids"))
    want_beams, want_scores = np.asarray(entry["beams"]), np.asarray(entry["scores"])
    np.testing.assert_array_equal(best, np.asarray(entry["best_ids"]), err_msg=entry["name"])
    np.testing.assert_array_equal(beams, want_beams, err_msg=entry["name"])
    np.testing.assert_allclose(scores, want_scores, rtol=0, atol=1e-4, err_msg=entry["name"])
    compared += len(entry["best_ids"])
  assert compared == sum(len(e["best_ids"]) for e in entries) > 0


def test_cli_beam_decodes_equal_the_originals(tmp_path):
  """--mode=infer with the original's gin bindings on a split mesh: the
  vocabulary split as the original's run prefiltered it."""
  name = "t5_1_1_bi"
  entry = next(e for e in _fixture(name)["decodes"] if e["name"] == "beam4_alpha0.6")
  setting = entry["settings"]
  model_dir = tmp_path / name
  shutil.copytree(DATA / name, model_dir)
  source = tmp_path / "inputs.txt"
  source.write_text("\n".join(entry["inputs"]) + "\n")
  env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
  out = subprocess.run(
      [sys.executable, "-m", "mesh_tensorflow.transformer.main", f"--model_dir={model_dir}",
       f"--gin_file={model_dir / 'operative_config.gin'}", "--mode=infer",
       f"--input_file={source}", f"--output_file={tmp_path / 'outputs.txt'}",
       f"--gin_param=utils.run.mesh_shape = '{setting['mesh_shape']}'",
       f"--gin_param=utils.run.layout_rules = '{setting['layout']}'",
       "--gin_param=utils.run.batch_size = 8",
       f"--gin_param=Bitransformer.decode.beam_size = {setting['beam_size']}",
       f"--gin_param=Bitransformer.decode.alpha = {setting['alpha']}"],
      capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
  assert out.returncode == 0, out.stderr[-4000:]
  vocab = vocabulary_lib.ByteVocabulary()
  want = [inference.escape(vocab.decode(row)) for row in entry["best_ids"]]
  got = (tmp_path / "outputs.txt").read_text().split("\n")[:-1]
  assert got == want and len(got) == len(entry["inputs"]) == 8
  assert any(got), got  # not all empty: the decodes hold byte ids


def test_gin_decode_settings_reach_the_entry_points():
  """The original's bindings (T5's beam_search.gin) set what
  utils.decode_from_file / decode and --mode=infer decode with; an explicit
  run.beam_size wins; without either, greedy."""
  gin_config.parse([], ["Bitransformer.decode.beam_size = 4",
                        "Bitransformer.decode.alpha = 0.7"], defaults=False)
  assert inference.decode_setting("beam_size", None, 1) == 4
  assert inference.decode_setting("alpha", None, 0.6) == 0.7
  assert inference.decode_setting("beam_size", 2, 1) == 2
  assert gin.query_parameter("Bitransformer.decode.beam_size") == 4
  gin_config.parse([], [], defaults=False)
  assert inference.decode_setting("beam_size", None, 1) == 1
