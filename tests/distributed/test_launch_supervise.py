"""The launcher's supervision loop, on stand-in processes: who failed."""

import subprocess
import sys
import time

from mesh_tensorflow.distributed import cluster as cluster_lib
from mesh_tensorflow.distributed import launch


def _process(code: str) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, "-c", code])


def _supervised(tmp_path, workers, client, log=lambda line: None) -> launch.Attempt:
  """The attempt as `Launcher._supervise` records it; the workers are
  stopped afterwards whatever happens."""
  launcher = launch.Launcher(["examples/mnist.py"], workers=len(workers), log=log,
                             log_dir=str(tmp_path))
  attempt = launch.Attempt(0, [f"127.0.0.1:{i + 1}" for i in range(len(workers))],
                           [w.pid for w in workers], client.pid)
  logs = [str(tmp_path / f"w{i}.log") for i in range(len(workers))]
  try:
    launcher._supervise(attempt, workers, client, logs,  # pylint: disable=protected-access
                        time.monotonic())
  finally:
    for w in workers:
      w.kill()
      w.wait()
  return attempt


def test_a_client_that_exits_first_on_a_lost_worker_still_names_the_worker(tmp_path):
  # Worker 1 is killed and the client, noticing it, exits with
  # EXIT_WORKER_LOST, both before the launcher's next poll: the failure is
  # the worker's, and the client ended by itself.
  workers = [_process("import time; time.sleep(60)"),
             _process("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")]
  client = _process(f"import sys; sys.exit({cluster_lib.EXIT_WORKER_LOST})")
  workers[1].wait(timeout=60)
  client.wait(timeout=60)
  lines = []
  attempt = _supervised(tmp_path, workers, client, lines.append)
  assert attempt.failed_worker == 1 and attempt.restartable
  assert "worker task 1" in attempt.failure and "SIGKILL" in attempt.failure
  assert attempt.client_exited_by_itself is True
  assert attempt.returncode == cluster_lib.EXIT_WORKER_LOST
  assert any("worker task 1" in line for line in lines)


def test_a_client_that_fails_on_its_own_is_the_failure(tmp_path):
  workers = [_process("import time; time.sleep(60)") for _ in range(2)]
  client = _process("import sys; sys.exit(3)")
  client.wait(timeout=60)
  attempt = _supervised(tmp_path, workers, client)
  assert attempt.failed_worker is None and not attempt.restartable
  assert attempt.returncode == 3 and attempt.failure.startswith("the client")
