"""Damaged checkpoints are found before restoring (mesh_tensorflow.training.checkpoint_verify).

Three checkpoints of a small model trained with Adam on a 2x4 mesh; the newest
is damaged five ways (data file truncated, overwritten with random bytes or
deleted; index overwritten or truncated). Restoring the latest reports the
damaged file in one line and restores the newest intact checkpoint with its
exact values; asking for the damaged one by path stops with the intact ones
named; nothing is ever deleted. Interrupted saves' leftovers go at the next save.
"""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import mesh_tensorflow as mtf
from mesh_tensorflow.training import checkpoint_verify
from mtf_test_utils import make_impl
from test_checkpoint import SAVE_LAYOUT, SAVE_MESH, _data, _make_step, _trace, _values

# The module's fixtures are computed once: its tests share one test worker.
pytestmark = pytest.mark.xdist_group("checkpoint_verify")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def three(tmp_path_factory):
  """(directory, {step: values}) with checkpoints ckpt-1, ckpt-2, ckpt-3."""
  directory = str(tmp_path_factory.mktemp("three"))
  impl = make_impl(SAVE_MESH, SAVE_LAYOUT)
  step = _make_step(impl)
  manager = mtf.checkpoint.CheckpointManager(impl, directory)
  x, y = _data()
  values = {}
  for n in (1, 2, 3):
    step(x, y)
    manager.save(n)
    values[n] = _values(impl)
  return directory, values


def _truncate(path):
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)


def _random_bytes(path):
  size = os.path.getsize(path)
  with open(path, "wb") as f:
    f.write(np.random.default_rng(0).bytes(size))


DAMAGE = {
    "data_truncated": (".data-00000-of-00001", _truncate),
    "data_random": (".data-00000-of-00001", _random_bytes),
    "data_deleted": (".data-00000-of-00001", os.remove),
    "index_random": (".index", _random_bytes),
    "index_truncated": (".index", _truncate),
}


def _copy(three, tmp_path, case):
  directory = str(tmp_path / "model")
  shutil.copytree(three[0], directory)
  suffix, damage = DAMAGE[case]
  damaged_file = os.path.join(directory, "ckpt-3" + suffix)
  damage(damaged_file)
  return directory, damaged_file


def _listing(directory):
  return {name: os.path.getsize(os.path.join(directory, name))
          for name in sorted(os.listdir(directory))}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_damaged_latest_falls_back_to_newest_intact(three, tmp_path, capsys, case):
  directory, damaged_file = _copy(three, tmp_path, case)
  problem = checkpoint_verify.verify(os.path.join(directory, "ckpt-3"))
  assert problem is not None and damaged_file.rsplit(".data", 1)[0] in problem
  assert "\n" not in problem
  assert checkpoint_verify.verify(os.path.join(directory, "ckpt-2")) is None
  before = _listing(directory)
  impl = make_impl(SAVE_MESH, SAVE_LAYOUT)
  manager = mtf.checkpoint.CheckpointManager(impl, directory)
  restored = manager.restore_or_initialize()
  assert restored == os.path.join(directory, "ckpt-2")
  _trace(_make_step(impl))
  got = _values(impl)
  for name, (value, _) in three[1][2].items():
    np.testing.assert_array_equal(got[name][0], value, err_msg=name)
  err = capsys.readouterr().err
  lines = [line for line in err.splitlines() if line.startswith("warning:")]
  assert len(lines) == 2, err
  assert "ckpt-3" in lines[0] and "damaged" in lines[0]
  assert "ckpt-2" in lines[1] and "newest intact" in lines[1]
  assert _listing(directory) == before  # nothing deleted or changed


def test_damaged_explicit_checkpoint_stops_naming_intact_ones(three, tmp_path):
  directory, _ = _copy(three, tmp_path, "data_truncated")
  before = _listing(directory)
  manager = mtf.checkpoint.CheckpointManager(make_impl(SAVE_MESH, SAVE_LAYOUT), directory)
  with pytest.raises(checkpoint_verify.CheckpointError) as info:
    manager.restore(os.path.join(directory, "ckpt-3"))
  message = str(info.value)
  for part in ("ckpt-3.data-00000-of-00001", "ckpt-1", "ckpt-2", "--checkpoint_path"):
    assert part in message
  assert _listing(directory) == before


def test_explicit_older_checkpoint_is_restored(three, tmp_path):
  directory, _ = _copy(three, tmp_path, "index_random")
  impl = make_impl(SAVE_MESH, SAVE_LAYOUT)
  manager = mtf.checkpoint.CheckpointManager(impl, directory)
  path = os.path.join(directory, "ckpt-1")
  assert manager.restore_or_initialize(path) == path
  _trace(_make_step(impl))
  np.testing.assert_array_equal(_values(impl)["w1"][0], three[1][1]["w1"][0])


def test_all_damaged_is_an_error_naming_them(three, tmp_path):
  directory = str(tmp_path / "model")
  shutil.copytree(three[0], directory)
  for n in (1, 2, 3):
    _truncate(os.path.join(directory, f"ckpt-{n}.data-00000-of-00001"))
  manager = mtf.checkpoint.CheckpointManager(make_impl(SAVE_MESH, SAVE_LAYOUT), directory)
  with pytest.raises(ValueError, match="no intact checkpoint") as info:
    manager.restore_or_initialize()
  assert "ckpt-1" in str(info.value) and "--fresh" in str(info.value)


def test_leftovers_of_interrupted_saves_go_at_next_save(three, tmp_path):
  directory = str(tmp_path / "model")
  shutil.copytree(three[0], directory)
  temp = os.path.join(directory, "ckpt-4_temp")
  os.makedirs(temp)
  with open(os.path.join(temp, "part-00000-of-00001.data-00000-of-00001"), "wb") as f:
    f.write(b"partial")
  orphan = os.path.join(directory, "ckpt-5.data-00000-of-00001")
  with open(orphan, "wb") as f:
    f.write(b"orphan")
  impl = make_impl(SAVE_MESH, SAVE_LAYOUT)
  manager = mtf.checkpoint.CheckpointManager(impl, directory, max_to_keep=10)
  manager.restore_or_initialize()
  _trace(_make_step(impl))
  manager.save(6)
  assert not os.path.exists(temp) and not os.path.exists(orphan)
  for n in (1, 2, 3, 6):  # every checkpoint with an index stays
    assert checkpoint_verify.verify(os.path.join(directory, f"ckpt-{n}")) is None


def test_inspect_checkpoint_verify_cli(three, tmp_path):
  directory, damaged_file = _copy(three, tmp_path, "data_random")
  env = dict(os.environ, PYTHONPATH=REPO_ROOT)
  env.pop("MTF_VERBOSE", None)
  cmd = [sys.executable, "-m", "mesh_tensorflow.inspect_checkpoint", "--verify"]
  proc = subprocess.run(cmd + [directory], capture_output=True, text=True, env=env,
                        cwd=REPO_ROOT, timeout=300, check=False)
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "ckpt-3.data-00000-of-00001" in errors[0], proc.stderr
  assert "ckpt-2" in proc.stderr  # the intact ones are named
  status = dict(line.split(None, 1)[::-1] for line in proc.stdout.splitlines()
                if line.startswith(("ok", "DAMAGED")))
  assert status == {os.path.join(directory, "ckpt-1"): "ok",
                    os.path.join(directory, "ckpt-2"): "ok",
                    os.path.join(directory, "ckpt-3"): "DAMAGED"}, proc.stdout
