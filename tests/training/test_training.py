"""mtf.training.Trainer: resuming after SIGKILL (mid-training and mid-save),
gradient accumulation, TensorBoard events, progress lines and errors.

The subprocess runs use tests/data/train_digits.py (an MLP with dropout on
scikit-learn's digits, momentum with a step-dependent learning rate), which
prints `loss <step> <repr(loss)>` after every step.
"""

import functools
import glob
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.lowering import slice_variables
from mtf_test_utils import import_script

# The module's fixtures are computed once: its tests share one test worker.
pytestmark = pytest.mark.xdist_group("training")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO_ROOT, "tests", "data", "train_digits.py")
STEPS = 60
_LOSS = re.compile(r"^loss (\d+) (\S+)$", re.M)
_RESTORED = re.compile(r"restored checkpoint (\S+)-(\d+) \(step (\d+)\)")
_PROGRESS = re.compile(
    r"^step (\d+)/(\d+) loss=(\d+\.\d{4}) accuracy=\d\.\d{4} summary/mean_logit=\S+ "
    r"(\d+\.\d) steps/s eta (\d+:\d\d:\d\d)$")


digits = import_script("train_digits_script", "tests", "data", "train_digits.py")


def _command(model_dir, *args):
  return [sys.executable, "-u", SCRIPT, f"--model_dir={model_dir}", *args]


def _env():
  return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


def _losses(stdout):
  return {int(step): float(loss) for step, loss in _LOSS.findall(stdout)}


def _run(model_dir, *args, timeout=600):
  proc = subprocess.run(_command(model_dir, *args), capture_output=True, text=True,
                        env=_env(), cwd=REPO_ROOT, timeout=timeout, check=False)
  assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-3000:]}"
  return proc.stdout


def _run_and_kill(model_dir, *args, when, delay=0.0, timeout=600):
  """Starts the script and SIGKILLs it `delay` seconds after a stdout line
  satisfies `when`; returns what it printed."""
  with open(os.path.join(str(model_dir) + ".stderr"), "w") as stderr:
    proc = subprocess.Popen(_command(model_dir, *args), stdout=subprocess.PIPE,
                            stderr=stderr, text=True, env=_env(), cwd=REPO_ROOT)
  lines = queue.Queue()

  def pump():
    for line in proc.stdout:
      lines.put(line)
    lines.put(None)
  threading.Thread(target=pump, daemon=True).start()
  seen, deadline = [], time.monotonic() + timeout
  try:
    while True:
      line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
      if line is None:
        raise AssertionError("the run ended before it could be killed:\n" + "".join(seen))
      seen.append(line)
      if when(line):
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        break
  finally:
    if proc.poll() is None:
      os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
  assert proc.returncode == -signal.SIGKILL
  return "".join(seen)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """Losses of an uninterrupted run of STEPS steps."""
  stdout = _run(tmp_path_factory.mktemp("reference"), f"--steps={STEPS}")
  losses = _losses(stdout)
  assert sorted(losses) == list(range(1, STEPS + 1)) and f"done {STEPS}" in stdout
  return losses


def _resume(model_dir, reference, *args):
  """Resumes to STEPS; checks the losses equal the reference's; returns the
  step it resumed from."""
  stdout = _run(model_dir, f"--steps={STEPS}", *args)
  restored = _RESTORED.search(stdout)
  assert restored, stdout
  start = int(restored.group(3))
  assert int(restored.group(2)) == start
  losses = _losses(stdout)
  assert sorted(losses) == list(range(start + 1, STEPS + 1))
  return start, losses


def test_resume_after_sigkill_mid_training(tmp_path, reference):
  model_dir = tmp_path / "run"
  killed = _run_and_kill(model_dir, f"--steps={STEPS}", "--step_sleep=0.05",
                         when=lambda line: line.startswith("loss 25 "))
  before = _losses(killed)
  assert before == {s: reference[s] for s in before}
  start, losses = _resume(model_dir, reference)
  # The last checkpoint before the kill (20, unless the machine is slow to react).
  assert start % 10 == 0 and 20 <= start < STEPS
  # Weights, momentum, global step (learning rate) and dropout's random step
  # counter are restored, and the consumed batches skipped: bit-identical.
  assert losses == {s: reference[s] for s in losses}


def test_resume_after_sigkill_during_save(tmp_path, reference):
  model_dir = tmp_path / "run"
  killed = _run_and_kill(model_dir, f"--steps={STEPS}", "--slow_save_at=30",
                         "--save_sleep=120", when=lambda line: line.startswith("SAVE_WRITTEN"))
  assert "SAVE_WRITTEN" in killed and f"{os.sep}ckpt-30" in killed
  # ckpt-30's files were written, but the state file still names ckpt-20.
  assert os.path.exists(model_dir / "ckpt-30.index")
  assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-20")
  # Resume on another mesh and layout: the same sequence up to float rounding.
  start, losses = _resume(model_dir, reference, "--mesh_shape=all:8", "--layout=hidden:all")
  assert start == 20
  np.testing.assert_allclose([losses[s] for s in sorted(losses)],
                             [reference[s] for s in sorted(losses)], rtol=1e-4)


def test_sigkill_at_random_points_of_frequent_saves_keeps_a_usable_checkpoint(tmp_path):
  model_dir = tmp_path / "run"
  rng = random.Random(0)
  for attempt in range(2):
    _run_and_kill(model_dir, "--steps=100000", "--checkpoint_every=1",
                  when=lambda line: line.startswith("saved checkpoint"),
                  delay=rng.uniform(0.2, 1.0))
    latest = tf.train.latest_checkpoint(str(model_dir))
    assert latest, f"attempt {attempt}: no checkpoint"
    reader = tf.train.load_checkpoint(latest)
    names = [name for name, _, _ in mtf.checkpoint.list_variables(latest)]
    assert {"w1", "b1", "w2", "global_step"} <= set(names)
    assert any(name.startswith("w1/") for name in names)  # the momentum slot
    for name in names:
      reader.get_tensor(slice_variables.checkpoint_key(name))  # every tensor readable
    step = int(latest.rsplit("-", 1)[1])
    assert reader.get_tensor(slice_variables.checkpoint_key("global_step")) == step
  # It restores in process too (on one device).
  trainer = digits.make_trainer("all:1", "", model_dir=str(model_dir), log_fn=lambda _: None)
  assert trainer.global_step == step


def _variables(trainer):
  return {name: var.numpy() for name, var in trainer.checkpoint_manager.variables().items()}


def test_gradient_accumulation_equals_one_big_batch(tmp_path):
  no_dropout = functools.partial(digits.model_fn, dropout_rate=0.0)

  def run(batch, accum, model_dir):
    trainer = mtf.training.Trainer(
        no_dropout, digits.feature_shapes(batch), digits.make_impl("rows:2;cols:4",
                                                                   "batch:rows;hidden:cols"),
        digits.schedule, model_dir=str(model_dir), grad_accum_steps=accum,
        checkpoint_every=None, log_every=0)
    history = trainer.train(digits.dataset(batch), steps=3)
    return trainer, history

  big, big_history = run(64, 1, tmp_path / "big")
  small, small_history = run(32, 2, tmp_path / "small")
  assert big.global_step == small.global_step == 3
  np.testing.assert_allclose(small_history["loss"], big_history["loss"], rtol=1e-5)
  big_vars, small_vars = _variables(big), _variables(small)
  accumulators = [n for n in small_vars if n.startswith("grad_accumulator/")]
  assert sorted(accumulators) == ["grad_accumulator/b1", "grad_accumulator/w1",
                                  "grad_accumulator/w2"]
  for name in accumulators:
    assert not np.any(small_vars[name]), name  # emptied by every update
  # Weights, momentum slots and counters agree.
  assert set(small_vars) - set(accumulators) == set(big_vars)
  assert len([n for n in big_vars if n.startswith("w1/")]) == 1
  for name in big_vars:
    np.testing.assert_allclose(small_vars[name], big_vars[name], rtol=1e-5, atol=1e-6,
                               err_msg=name)


def test_tensorboard_events_are_written(tmp_path):
  trainer = digits.make_trainer(model_dir=str(tmp_path), log_every=0, checkpoint_every=None)
  history = trainer.train(digits.dataset(), steps=4)
  evaluation = trainer.evaluate(digits.dataset(repeat=False), steps=2)
  scalars = {}
  for path in glob.glob(str(tmp_path / "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        scalars.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
  assert {"loss", "accuracy", "mean_logit", "eval/loss", "eval/accuracy"} <= set(scalars)
  assert sorted(scalars["loss"]) == [1, 2, 3, 4]
  np.testing.assert_allclose([scalars["loss"][s] for s in (1, 2, 3, 4)], history["loss"],
                             rtol=1e-6)
  assert scalars["eval/loss"] == {4: pytest.approx(evaluation["loss"], rel=1e-6)}


def test_progress_lines(tmp_path):
  lines = []
  trainer = digits.make_trainer(model_dir=str(tmp_path), log_every=3, checkpoint_every=3,
                                log_fn=lines.append)
  hooked = []
  trainer.train(digits.dataset(), steps=6, hooks=[lambda step, out: hooked.append(step)])
  progress = [_PROGRESS.match(line) for line in lines if line.startswith("step ")]
  assert len(progress) == 2 and all(progress), lines
  assert [(m.group(1), m.group(2)) for m in progress] == [("3", "6"), ("6", "6")]
  assert all(float(m.group(3)) > 0 and float(m.group(4)) > 0 for m in progress)
  assert progress[-1].group(5) == "0:00:00"
  assert f"saved checkpoint {tmp_path}{os.sep}ckpt-6" in lines
  assert lines[-1].startswith("trained steps 1..6 in ")
  assert hooked == [1, 2, 3, 4, 5, 6]
  # A second Trainer on the directory resumes and says so.
  again = []
  trainer = digits.make_trainer("all:8", "batch:all", model_dir=str(tmp_path),
                                log_fn=again.append)
  assert again == [f"restored checkpoint {tmp_path}{os.sep}ckpt-6 (step 6)"]
  assert trainer.train(digits.dataset(), steps=6) == {"step": [], "loss": []}
  assert again[-1] == "already at step 6 >= 6; nothing to train"


def _quiet_trainer(model_fn=digits.model_fn, **kwargs):
  return mtf.training.Trainer(model_fn, kwargs.pop("feature_shapes", digits.FEATURE_SHAPES),
                              digits.make_impl("all:8", "batch:all"),
                              mtf.optimize.SgdOptimizer(0.1), log_every=0, **kwargs)


def test_error_missing_feature():
  trainer = _quiet_trainer()
  ds = digits.dataset().map(lambda batch: {"image": batch["image"]})
  with pytest.raises(ValueError, match=r"the dataset has no feature 'label' \(it has "
                                       r"\['image'\]\); check feature_shapes"):
    trainer.train(ds, steps=1)
  with pytest.raises(ValueError, match="must be dicts of features"):
    trainer.train(digits.dataset().map(lambda b: (b["image"], b["label"])), steps=1)


def test_error_batch_shape():
  trainer = _quiet_trainer()
  with pytest.raises(ValueError, match=r"feature 'image' has shape \(16, 64\) in the dataset "
                                       r"but feature_shapes gives"):
    trainer.train(digits.dataset(16), steps=1)
  # A batch size left open (no drop_remainder): the short batch is reported.
  ds = digits.dataset().take(2).unbatch().batch(digits.BATCH - 8)  # 24, 24, 16
  with pytest.raises(ValueError, match=r"feature 'image' of a batch has shape \(16, 64\).*"
                                       r"drop_remainder=True"):
    _quiet_trainer(feature_shapes=digits.feature_shapes(24)).train(ds, steps=3)


def test_error_non_scalar_loss():
  def per_example_loss(mesh, features, mode):
    loss, _ = digits.model_fn(mesh, features, mode)
    return loss * mtf.ones(mesh, features["label"].shape)
  with pytest.raises(ValueError, match="model_fn must return a scalar mtf loss"):
    _quiet_trainer(per_example_loss).train(digits.dataset(), steps=1)

  def no_loss(mesh, features, mode):
    return {"accuracy": digits.model_fn(mesh, features, mode)[1]["accuracy"]}
  with pytest.raises(TypeError, match=r"must return a loss tensor or \(loss, metrics dict\)"):
    _quiet_trainer(no_loss).train(digits.dataset(), steps=1)


def test_error_dataset_exhausted():
  trainer = _quiet_trainer(grad_accum_steps=2)
  with pytest.raises(ValueError, match=r"the dataset ran out at step 3 .*repeat\(\) it"):
    trainer.train(digits.dataset().take(5), steps=4)
  assert trainer.global_step == 2
  with pytest.raises(ValueError, match="evaluate: the dataset is empty"):
    trainer.evaluate(digits.dataset().take(0))


def test_error_bad_grad_accum_steps():
  with pytest.raises(ValueError, match="grad_accum_steps must be >= 1"):
    _quiet_trainer(grad_accum_steps=0)
