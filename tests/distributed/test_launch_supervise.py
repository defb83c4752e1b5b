"""The launcher's supervision loop, on stand-in processes: who failed."""

import subprocess
import sys
import time

from mesh_tensorflow.distributed import cluster as cluster_lib
from mesh_tensorflow.distributed import launch


def _process(code: str) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, "-c", code])


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
  launcher = launch.Launcher(["examples/mnist.py"], workers=2, log=lines.append,
                             log_dir=str(tmp_path))
  attempt = launch.Attempt(0, ["127.0.0.1:1", "127.0.0.1:2"], [w.pid for w in workers],
                           client.pid)
  try:
    launcher._supervise(attempt, workers, client,  # pylint: disable=protected-access
                        [str(tmp_path / "w0.log"), str(tmp_path / "w1.log")], time.monotonic())
  finally:
    for w in workers:
      w.kill()
      w.wait()
  assert attempt.failed_worker == 1 and attempt.restartable
  assert "worker task 1" in attempt.failure and "SIGKILL" in attempt.failure
  assert attempt.client_exited_by_itself is True
  assert attempt.returncode == cluster_lib.EXIT_WORKER_LOST
  assert workers[0].poll() is not None  # stopped


def test_a_client_that_fails_on_its_own_is_the_failure(tmp_path):
  workers = [_process("import time; time.sleep(60)") for _ in range(2)]
  client = _process("import sys; sys.exit(3)")
  client.wait(timeout=60)
  launcher = launch.Launcher(["examples/mnist.py"], workers=2, log=lambda line: None,
                             log_dir=str(tmp_path))
  attempt = launch.Attempt(0, ["127.0.0.1:1", "127.0.0.1:2"], [w.pid for w in workers],
                           client.pid)
  try:
    launcher._supervise(attempt, workers, client,  # pylint: disable=protected-access
                        [str(tmp_path / "w0.log"), str(tmp_path / "w1.log")], time.monotonic())
  finally:
    for w in workers:
      w.kill()
      w.wait()
  assert attempt.failed_worker is None and not attempt.restartable
  assert attempt.returncode == 3 and attempt.failure.startswith("the client")
