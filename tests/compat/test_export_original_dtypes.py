"""`python -m mesh_tensorflow.export_original_checkpoint` with its default
flags writes the dtypes the original 0.1.21 restores: the model variables in
the master dtype the run trained with, the Adafactor slots in float32.

The source is this library's checkpoint of what fine-tuning an original
model directory with bfloat16 masters saves (every floating variable,
slots included, in bfloat16: `get_variable_dtype.master_dtype = 'bfloat16'`,
which the original's configs take by default); the export must have the
very dtypes, names and shapes of the checkpoint the original wrote there.
(oss_scripts/check_original_round_trip.py restores such an export in the
original itself and compares scores.)
"""

import pathlib

import pytest
import tensorflow as tf

from mesh_tensorflow import export_original_checkpoint
from mesh_tensorflow.compat import original_checkpoint
from mesh_tensorflow.lowering import slice_variables

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "original_0.1.21"
# (Both models' configs say AdafactorOptimizer.min_dim_size_to_factor = 128,
# the export's default.)
# The original's slot suffixes and this library's slot names (the factored
# moments swap names: the original's _slot_vr is the mean over columns).
OURS = {"_slot_v": "adafactor_v", "_slot_m": "adafactor_m", "_slot_vr": "adafactor_vc",
        "_slot_vc": "adafactor_vr"}


def _our_key(name: str) -> str:
  escaped = name.replace(".", "..").replace("/", ".S")
  return f"model/variables_by_name/{escaped}/.ATTRIBUTES/value"


def _trained_here(original_prefix: str, out_prefix: str, master_dtype) -> None:
  """Writes, in this library's format, the checkpoint's values as a run with
  `master_dtype` masters saves them (slots in the master dtype too)."""
  reader = tf.train.load_checkpoint(original_prefix)
  names, tensors = [], []
  for name, dtype in reader.get_variable_to_dtype_map().items():
    value = tf.constant(reader.get_tensor(name))
    if name == "global_step":
      names.append(slice_variables.checkpoint_key("global_step"))
      tensors.append(value)
      continue
    ours = name
    for suffix, slot in OURS.items():
      if name.endswith(suffix):
        ours = name[:-len(suffix)] + "/" + slot
    names.append(_our_key(ours))
    tensors.append(tf.cast(value, master_dtype) if dtype.is_floating else value)
  tf.raw_ops.SaveV2(prefix=out_prefix, tensor_names=names,
                    shape_and_slices=[""] * len(names), tensors=tensors)


@pytest.mark.parametrize("name", ["t5_v1_0_bi", "lm"])
def test_default_export_has_the_originals_dtypes(tmp_path, name):
  original = str(DATA / name / "model.ckpt-2")
  source = str(tmp_path / "run" / "ckpt-2")
  _trained_here(original, source, tf.bfloat16)
  # The command's entry point with its default flags (its subprocess run is
  # tests/compat/test_original_checkpoint.py's).
  assert export_original_checkpoint.main(
      ["export", f"--checkpoint={source}", f"--output_dir={tmp_path / 'exported'}"]) == 0
  want = tf.train.load_checkpoint(original)
  got = tf.train.load_checkpoint(str(tmp_path / "exported"))
  assert got.get_variable_to_dtype_map() == want.get_variable_to_dtype_map()
  assert got.get_variable_to_shape_map() == want.get_variable_to_shape_map()
  assert tf.bfloat16 in set(want.get_variable_to_dtype_map().values())
  assert original_checkpoint.saved_master_dtype(source) == tf.bfloat16
  assert original_checkpoint.saved_master_dtype(original) == tf.bfloat16
  # "saved" keeps this library's dtypes (bfloat16 slots), which the original refuses.
  original_checkpoint.export(source, str(tmp_path / "saved"), slot_dtype=None)
  saved = tf.train.load_checkpoint(str(tmp_path / "saved")).get_variable_to_dtype_map()
  assert {d for n, d in saved.items() if "_slot_" in n} == {tf.bfloat16}
