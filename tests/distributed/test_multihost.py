"""Meshes over several worker processes (mesh_tensorflow.distributed.cluster and .launch).

The cluster tests start real worker processes on 127.0.0.1 with the
launcher, train examples/mnist.py across them, and compare the losses it logs
to TensorBoard with the same model trained in this process on 8 logical CPUs.
One test SIGKILLs a worker mid-run: the client must fail by itself with a
clear error, the launcher must stop everything within a bound, and the
restarted cluster must resume from the checkpoint and end with the same
losses as an uninterrupted run. Each worker and client imports TensorFlow, so
there are only two such tests (the launcher runs in this process).
"""

import glob
import os
import signal
import socket
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from mesh_tensorflow.distributed import cluster
from mesh_tensorflow.distributed import launch
import mtf_test_utils

# The module's fixtures are computed once: its tests share one test worker.
pytestmark = pytest.mark.xdist_group("multihost")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO_ROOT, "examples", "mnist.py")
# Tiny settings: every step is a full multi-process step, but a short one.
MNIST_ARGS = ["--hidden_size=64", "--batch_size=64", "--log_every=10",
              "--checkpoint_every=10"]
REFERENCE_STEPS = 150  # long enough that the kill always lands mid-run
# Cluster runs place every replica separately (no shared memory between
# processes), so some sums run in another order than in one process: measured
# max |difference| 2.4e-7 over 200 steps with 4 workers, 0 with 2.
LOSS_RTOL = 1e-5
# From a worker's death to every process stopped, at most (the client
# normally fails by itself within about a second of the kill; the bound leaves
# room for a shared CI machine running 3x slower than usual).
STOP_BOUND_S = 30.0


@pytest.fixture(scope="module")
def mnist():
  """The example imported as a module (absl's global flags left unchanged)."""
  return mtf_test_utils.import_mnist_example()


@pytest.fixture(scope="module")
def reference_losses(mnist):
  """Per-step losses of one process with 8 logical CPUs (conftest's), same model."""
  result = mnist.train(layout="2x4", train_steps=REFERENCE_STEPS, hidden_size=64,
                       batch_size=64, log_every=0, model_dir=None, log=lambda line: None)
  return np.array(result.losses)


def _logged_losses(model_dir):
  """{step: loss} from the TensorBoard events the Trainer wrote (full float32);
  a step logged by several attempts keeps the last attempt's value."""
  losses = {}
  paths = sorted(glob.glob(os.path.join(model_dir, "events.out.tfevents.*")),
                 key=lambda p: int(os.path.basename(p).split(".")[3]))
  per_file = []
  for path in paths:
    found = {}
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == "loss":
          found[event.step] = float(tf.make_ndarray(value.tensor))
    per_file.append(found)
    losses.update(found)
  return losses, per_file


def _launcher(tmp_path, workers, devices_per_worker, train_steps, extra_args=(), **kwargs):
  out = open(tmp_path / "client.out", "w+")  # pylint: disable=consider-using-with
  messages = []
  model_dir = tmp_path / "model"
  launcher = launch.Launcher(
      [SCRIPT, f"--model_dir={model_dir}", f"--train_steps={train_steps}", *MNIST_ARGS,
       *extra_args],
      workers=workers, devices_per_worker=devices_per_worker, stdout=out,
      log=messages.append, log_dir=str(tmp_path / "logs"),
      env={"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}, **kwargs)
  return launcher, out, messages, str(model_dir)


def _read(out):
  out.flush()
  out.seek(0)
  return out.read()


def test_four_workers_train_like_one_process(tmp_path, reference_losses):
  """With the SIMD lowering (one program for every processor) across the
  workers; the other multi-host test uses the placement lowering."""
  steps = 30
  launcher, out, messages, model_dir = _launcher(tmp_path, 4, 2, steps, timeout_s=900,
                                                 extra_args=["--lowering=simd"])
  result = launcher.run()
  text = _read(out)
  assert result.returncode == 0, f"{messages}\n{text[-3000:]}"
  assert len(result.attempts) == 1 and not result.attempts[0].failure
  assert "cluster: 8 devices on 4 workers (2 per worker): /job:worker/replica:0/task:0/" in text
  assert f"final: step={steps} " in text
  losses, _ = _logged_losses(model_dir)
  assert sorted(losses) == list(range(1, steps + 1))
  np.testing.assert_allclose([losses[s] for s in range(1, steps + 1)],
                             reference_losses[:steps], rtol=LOSS_RTOL, atol=0)
  # The workers were stopped once the client finished.
  assert all(p.poll() is not None for p in launcher.worker_processes)


def test_two_workers_killed_worker_fails_fast_and_restart_resumes(tmp_path, reference_losses):
  """2 workers x 4 devices; worker 1 is SIGKILLed mid-run."""
  steps = REFERENCE_STEPS
  launcher, out, messages, model_dir = _launcher(
      tmp_path, 2, 4, steps, max_restarts=1, timeout_s=900, client_grace_s=20.0)
  results = []
  thread = threading.Thread(target=lambda: results.append(launcher.run()), daemon=True)
  thread.start()
  # Kill worker task 1 mid-run, once a checkpoint is complete (its state file
  # names it), so the restart has something to resume from.
  deadline = time.monotonic() + 900
  while tf.train.latest_checkpoint(model_dir) is None:
    assert time.monotonic() < deadline, f"no checkpoint appeared\n{messages}\n{_read(out)}"
    assert thread.is_alive(), f"launcher ended early\n{messages}\n{_read(out)}"
    time.sleep(0.02)
  killed_at_checkpoint = tf.train.latest_checkpoint(model_dir)
  victim = launcher.worker_processes[1]
  os.kill(victim.pid, signal.SIGKILL)
  thread.join(timeout=1800)
  assert not thread.is_alive(), "the launcher hangs"
  (result,) = results
  text = _read(out)
  report = f"{messages}\n{text[-4000:]}"

  assert result.returncode == 0, report
  first, second = result.attempts
  assert first.failed_worker == 1 and first.restartable, report
  assert "worker task 1" in first.failure and "SIGKILL" in first.failure, report
  # The client noticed by itself, with a clear error naming the worker...
  assert first.client_exited_by_itself, report
  assert first.returncode == cluster.EXIT_WORKER_LOST, report
  assert f"Lost worker task 1 ({first.addresses[1]})" in text, report
  # ...and everything was stopped within the bound.
  assert first.seconds_to_stop < STOP_BOUND_S, report
  assert not second.failure and second.returncode == 0, report

  # The restart resumed from the checkpoint and the step counter continued.
  restored = [line for line in text.splitlines() if line.startswith("restored checkpoint")]
  assert len(restored) == 1, report
  resumed_step = int(restored[0].rsplit("(step ", 1)[1].rstrip(")"))
  assert resumed_step >= int(killed_at_checkpoint.rsplit("-", 1)[1]) > 0, report
  assert f"trained steps {resumed_step + 1}..{steps}" in text, report
  assert f"final: step={steps} " in text, report

  # Across the kill and the restart, every step's loss equals one process's.
  losses, per_file = _logged_losses(model_dir)
  assert len(per_file) == 2 and min(per_file[1]) == resumed_step + 1, report
  assert sorted(losses) == list(range(1, steps + 1))
  np.testing.assert_allclose([losses[s] for s in range(1, steps + 1)], reference_losses,
                             rtol=LOSS_RTOL, atol=0)


# ---- no processes: parsing and errors ------------------------------------------------
def test_cluster_config_from_flags_and_environment():
  config = cluster.resolve("127.0.0.1:23001, 127.0.0.1:23002", task=-1, environ={})
  assert config.workers == ("127.0.0.1:23001", "127.0.0.1:23002") and not config.is_worker
  assert cluster.resolve("", environ={}) is None
  env = {"MTF_CLUSTER": config.to_json(),
         "TF_CONFIG": '{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker"}}'}
  assert cluster.resolve("", environ=env) == config  # MTF_CLUSTER wins over TF_CONFIG
  del env["MTF_CLUSTER"]
  worker = cluster.resolve("", environ=env)
  assert worker.workers == ("h:1",) and worker.task == 0
  assert worker.cluster_spec().as_dict() == {"worker": ["h:1"]}


@pytest.mark.parametrize("text,task,message", [
    ("", None, "no workers given"),
    ("127.0.0.1", None, "worker 0 has address '127.0.0.1'"),
    ("h:1,h:1", None, "repeat"),
    ("h:1,h:2", 2, "--task=2 is out of range for 2 workers"),
])
def test_bad_cluster_flags_name_the_problem(text, task, message):
  with pytest.raises(ValueError, match=message):
    cluster.parse_cluster(text, task)


@pytest.mark.parametrize("tf_config,message", [
    ("{not json", "TF_CONFIG is not valid JSON"),
    ('{"cluster": {"ps": ["h:1"]}}', "no 'worker' job"),
    ('{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": "0"}}',
     "task index must be an integer"),
])
def test_bad_tf_config_names_the_problem(tf_config, message):
  with pytest.raises(ValueError, match=message):
    cluster.resolve("", environ={"TF_CONFIG": tf_config})


def test_unreachable_worker_is_a_bounded_clear_error():
  (port,) = launch.free_ports(1)
  config = cluster.parse_cluster(f"127.0.0.1:{port}")
  start = time.monotonic()
  with pytest.raises(cluster.WorkerLostError, match=f"task 0 at 127.0.0.1:{port}") as info:
    cluster.wait_for_workers(config, timeout_s=0.5)
  assert time.monotonic() - start < 5 and info.value.task == 0


def test_worker_errors_name_the_lost_task():
  """The worker whose port is closed is named, even when TensorFlow's message
  first mentions a surviving worker; without a config, the message decides."""
  error = tf.errors.UnavailableError(
      None, None, "Socket closed\nAdditional GRPC error information from remote target "
      "/job:worker/replica:0/task:0/device:CPU:3 while calling RunComponentFunction")
  with socket.socket() as alive:
    alive.bind(("127.0.0.1", 0))
    alive.listen()
    (dead_port,) = launch.free_ports(1)
    config = cluster.parse_cluster(
        f"127.0.0.1:{alive.getsockname()[1]},127.0.0.1:{dead_port}")
    with pytest.raises(cluster.WorkerLostError,
                       match=rf"Lost worker task 1 \(127.0.0.1:{dead_port}\): .*Socket closed"):
      with cluster.worker_errors(config):
        raise error
  with pytest.raises(cluster.WorkerLostError, match=r"Lost worker task 0: ") as info:
    with cluster.worker_errors(None):
      raise error
  assert info.value.task == 0 and info.value.address is None


def test_worker_errors_wait_for_a_dying_workers_port_to_close():
  """A killed worker's connections may drop a moment before its listening
  port closes: the error still names it (its port closing 0.3 s later)."""
  error = tf.errors.UnavailableError(None, None, "Socket closed")
  alive, dying = socket.socket(), socket.socket()
  try:
    for s in (alive, dying):
      s.bind(("127.0.0.1", 0))
      s.listen()
    address = f"127.0.0.1:{dying.getsockname()[1]}"
    config = cluster.parse_cluster(f"127.0.0.1:{alive.getsockname()[1]},{address}")
    closer = threading.Timer(0.3, dying.close)
    closer.start()
    with pytest.raises(cluster.WorkerLostError,
                       match=rf"Lost worker task 1 \({address}\): .*Socket closed"):
      with cluster.worker_errors(config):
        raise error
    closer.join()
  finally:
    alive.close()
    dying.close()


def test_watchdog_reports_a_closed_port():
  (port,) = launch.free_ports(1)
  failures = []
  dog = cluster.Watchdog(cluster.parse_cluster(f"127.0.0.1:{port}"), timeout_s=5,
                         interval_s=0.05, heartbeat=False, exit_fn=failures.append)
  with dog:
    deadline = time.monotonic() + 60  # a bound against hanging; it reports in ~0.1 s
    while not failures and time.monotonic() < deadline:
      time.sleep(0.02)
  assert failures and f"Lost worker task 0 (127.0.0.1:{port})" in failures[0]


def test_launcher_restarts_only_after_a_lost_worker(tmp_path):
  """A client exiting with EXIT_WORKER_LOST is restarted; any other failure
  (and a timeout) is final. (The client here is a tiny program; the worker is
  stopped at once.)"""
  def run(code):
    messages = []
    launcher = launch.Launcher([sys.executable, "-c", f"import sys; sys.exit({code})"],
                               workers=1, devices_per_worker=1, max_restarts=1,
                               log=messages.append, log_dir=str(tmp_path / str(code)))
    return launcher.run(), messages

  result, messages = run(3)
  assert result.returncode == 3 and len(result.attempts) == 1, messages
  assert result.attempts[0].failure == "the client exited with status 3"
  result, messages = run(cluster.EXIT_WORKER_LOST)
  assert result.returncode == cluster.EXIT_WORKER_LOST and len(result.attempts) == 2, messages
  assert all(a.restartable for a in result.attempts)
  assert any("giving up after 1 restarts" in m for m in messages), messages

  # --timeout_s bounds a client that never ends.
  start = time.monotonic()
  result = launch.Launcher([sys.executable, "-c", "import time; time.sleep(60)"], workers=1,
                           devices_per_worker=1, timeout_s=1.0, kill_grace_s=2.0,
                           log=messages.append, log_dir=str(tmp_path / "timeout")).run()
  assert result.returncode == launch.EXIT_TIMEOUT and len(result.attempts) == 1
  assert "--timeout_s=1" in result.attempts[0].failure
  assert time.monotonic() - start < 10


def test_launcher_rejects_bad_arguments():
  assert launch.program_command(["x.py", "--a=1"]) == [sys.executable, "x.py", "--a=1"]
  assert launch.program_command(["-m", "pkg"]) == [sys.executable, "-m", "pkg"]
  with pytest.raises(ValueError, match="no program given"):
    launch.Launcher([])
  with pytest.raises(ValueError, match="--workers=0 must be >= 1"):
    launch.Launcher(["x.py"], workers=0)
  assert launch.main(["--workers=2"]) == 2  # no program after "--": an error line


def test_devices_are_ordered_task_major_numerically():
  names = [f"/job:worker/replica:0/task:{t}/device:CPU:{d}" for t in (10, 2) for d in (1, 0)]
  ordered = sorted(names, key=cluster._device_sort_key)  # pylint: disable=protected-access
  assert [n.split("/", 3)[3] for n in ordered] == [
      "task:2/device:CPU:0", "task:2/device:CPU:1", "task:10/device:CPU:0",
      "task:10/device:CPU:1"]
  assert cluster.describe_devices(ordered) == "4 devices on 2 workers (2 per worker)"


def test_checkpoint_saves_processor_0_copy_of_unshared_state(tmp_path, devices):
  """Processes share no memory, so every processor holds its own copy of
  replicated state; the global step is advanced on processor 0's copy only and
  a checkpoint must save that one (it saved a stale copy, 0, before)."""
  import mesh_tensorflow as mtf  # pylint: disable=import-outside-toplevel
  impl = mtf.PlacementMeshImpl("all:8", "", devices, share_replicas=False)
  step = mtf.slice_variables.scalar_state(impl, "global_step", tf.int64)
  step.assign_add(7)
  path = mtf.checkpoint.CheckpointManager(impl, str(tmp_path)).save(7)
  saved = tf.train.load_checkpoint(path).get_tensor(
      mtf.slice_variables.checkpoint_key("global_step"))
  assert int(saved) == 7
