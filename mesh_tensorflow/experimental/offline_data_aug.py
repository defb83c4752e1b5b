"""Writes augmented copies of a CT dataset (synthetic lesions) to TFRecords.

Reads GZIP TFRecords of tf.Examples with "image/ct_image" and "image/label"
(raw float32 bytes of an R^3 volume, raw intensities), maps the intensities
to [0, 1], applies `data_aug_lib.maybe_gen_fake_data_based_on_real_data`
and writes each result to its own GZIP TFRecord file
`<output_file_prefix>-<process_no>-<i>.tfrecords` in the same format:

    python -m mesh_tensorflow.experimental.offline_data_aug \\
        --input_file_pattern='/data/ct/*.tfrecords' --output_folder=/data/aug \\
        --num_data_aug=100 --process_no=0
"""

from __future__ import annotations

import functools
import os
import sys
from typing import List, Optional

import numpy as np
import tensorflow as tf

from mesh_tensorflow.experimental import _flag_specs
from mesh_tensorflow.experimental import data_aug_lib
from mesh_tensorflow.experimental._flag_specs import FlagSpec

FLAGS = _flag_specs.FLAGS

FLAG_SPECS = {
    "input_file_pattern": FlagSpec("string", "", "Input CT TFRecords (GZIP)."),
    "output_folder": FlagSpec("string", "", "Where the augmented TFRecords go."),
    "output_file_prefix": FlagSpec("string", "augmented", "Output file name prefix."),
    "ct_resolution": FlagSpec("integer", 128, "Resolution of the volumes along every axis."),
    "num_data_aug": FlagSpec("integer", 1000, "How many augmented examples to write."),
    "process_no": FlagSpec("integer", None, "This process's number (in the file names)."),
    "gen_fake_probability": FlagSpec("float", 0.50,
                                     "Probability of replacing the lesions by synthetic ones."),
    "min_fake_lesion_ratio": FlagSpec("float", 0.05, "Least share of synthetic lesion."),
}


def define_flags(flag_values=FLAGS) -> List[str]:
  """Defines this module's absl flags (those not defined elsewhere yet);
  returns the names it defined.

  Example:
    >>> offline_data_aug.define_flags()
  """
  return _flag_specs.define(FLAG_SPECS, flag_values)


def _flag(name: str):
  return _flag_specs.value(FLAG_SPECS, name)


def _dataset_creator() -> tf.data.Dataset:
  """The repeated, shuffled dataset of augmented (image, label) volumes."""
  pattern = _flag("input_file_pattern")
  if not pattern or not tf.io.gfile.glob(pattern):
    raise ValueError(f"offline_data_aug: --input_file_pattern={pattern!r} matches no file.")
  reso = _flag("ct_resolution")

  def parse(serialized):
    features = {"image/ct_image": tf.io.FixedLenFeature([], tf.string),
                "image/label": tf.io.FixedLenFeature([], tf.string)}
    parsed = tf.io.parse_single_example(serialized, features)
    image = tf.io.decode_raw(parsed["image/ct_image"], tf.float32)
    label = tf.io.decode_raw(parsed["image/label"], tf.float32)
    image = tf.clip_by_value(image / 1024.0 + 0.5, 0.0, 1.0)
    image = tf.reshape(image, [reso] * 3)
    label = tf.reshape(label, [reso] * 3)
    return data_aug_lib.maybe_gen_fake_data_based_on_real_data(
        image, label, reso, _flag("min_fake_lesion_ratio"), _flag("gen_fake_probability"))

  files = tf.data.Dataset.list_files(pattern, shuffle=True).repeat()
  ds = files.interleave(functools.partial(tf.data.TFRecordDataset, compression_type="GZIP"))
  return ds.shuffle(2).map(parse, num_parallel_calls=2)


def save_to_tfrecord(image, label, process_no, idx, output_path, output_file_prefix) -> str:
  """Writes one example (float32 image and label arrays, stored as raw bytes
  under "image/ct_image" and "image/label") to the GZIP TFRecord file
  `<output_file_prefix>-<process_no>-<idx>.tfrecords` in output_path.

  Returns:
    The file's path.

  Example:
    >>> save_to_tfrecord(image, label, 0, 7, "/tmp/aug", "augmented")
    '/tmp/aug/augmented-0-7.tfrecords'
  """
  def raw(a):
    data = np.ascontiguousarray(np.asarray(a, dtype=np.float32)).reshape([-1]).tobytes()
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[data]))
  example = tf.train.Example(features=tf.train.Features(feature={
      "image/ct_image": raw(image), "image/label": raw(label)}))
  path = os.path.join(output_path, f"{output_file_prefix}-{process_no}-{idx}.tfrecords")
  with tf.io.TFRecordWriter(path, options=tf.io.TFRecordOptions(compression_type="GZIP")) as w:
    w.write(example.SerializeToString())
  return path


def apply_data_aug() -> None:
  """Writes `num_data_aug` augmented examples from `input_file_pattern` to
  `output_folder` (the flags).

  Example:
    >>> apply_data_aug()
  """
  folder = _flag("output_folder")
  if not folder:
    raise ValueError("offline_data_aug: set --output_folder.")
  tf.io.gfile.makedirs(folder)
  examples = iter(_dataset_creator())
  for idx in range(_flag("num_data_aug")):
    image, label = next(examples)
    save_to_tfrecord(image.numpy(), label.numpy(), _flag("process_no"), idx, folder,
                     _flag("output_file_prefix"))


def main(argv) -> None:
  """The program's main (after absl parsed the flags).

  Example:
    >>> main(["offline_data_aug"])
  """
  del argv
  apply_data_aug()


def _run(argv: Optional[list] = None) -> int:
  from mesh_tensorflow import cli  # pylint: disable=import-outside-toplevel
  define_flags()

  def guarded(args):
    try:
      return main(args)
    except ValueError as e:
      raise cli.UserError(str(e)) from None
  return cli.run_absl_main(guarded, argv)


if __name__ == "__main__":
  sys.exit(_run())
