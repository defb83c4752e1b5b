"""Starts a cluster of worker processes on this machine and runs a client on it.

    python -m mesh_tensorflow.launch --workers=4 --devices_per_worker=2 \\
        --max_restarts=1 -- examples/mnist.py --model_dir=/tmp/mnist_cluster

starts 4 worker servers on 127.0.0.1 (free ports), each exposing 2 CPU
devices, then runs `examples/mnist.py ...` as the client with the cluster in
the environment variable MTF_CLUSTER (TF_CONFIG-style JSON; read it with
`mtf.cluster.resolve()`). The 8 devices `/job:worker/replica:0/task:T/device:CPU:K`
form the mesh, task-major.

Supervision:

* A worker that exits (crash, kill -9) is a failure of the whole cluster:
  the client gets `--client_grace_s` seconds to fail by itself (with
  `mtf.cluster` it does so within about a second, with a clear error), then
  it is stopped, then the other workers. Nothing waits forever.
* A client that exits with status 75 (`mtf.cluster.EXIT_WORKER_LOST`, e.g.
  after its Watchdog saw a hung worker) is the same kind of failure.
* With `--max_restarts=N`, after such a failure the whole cluster is started
  again (new ports) and the client rerun with the same arguments, up to N
  times; a client that resumes from its checkpoint (like examples/mnist.py with
  --model_dir) continues where the last checkpoint left off.
* Any other nonzero exit of the client ends the launch with that status (a
  bug or a bad flag is not fixed by restarting).
* `--timeout_s` bounds each attempt's wall time (exit status 124).
* Ctrl-C or SIGTERM to the launcher stops the client and the workers; a
  launcher killed with SIGKILL leaves no workers behind either (they exit when
  their parent does) and its client then fails on the lost workers.

Who can reach the workers: a TensorFlow worker server runs any graph it is
sent, without authentication, and it listens on every network interface of
the machine (TensorFlow binds 0.0.0.0:PORT whatever host the cluster names;
no public API narrows that). The launcher keeps the exposure short: workers
use fresh ports, start only for an attempt, are stopped as soon as the client
ends, and exit when the launcher dies. It says so in its first line. Run it,
and any cluster, only on a machine or network that untrusted hosts cannot
reach (a private network, or behind a firewall that blocks the ports).

Workers log to `--log_dir` (default: a new temporary directory); the last
lines of a failed worker's log are printed. The program after `--` is run with
this Python if it ends in ".py" or starts with "-m", else as a command.

One worker by hand (what the launcher runs for each task):

    python -m mesh_tensorflow.launch --serve --cluster=127.0.0.1:23001,127.0.0.1:23002 \\
        --task=0 --devices_per_worker=4
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Callable, IO, List, Optional, Sequence

from mesh_tensorflow import cli
from mesh_tensorflow.distributed import cluster as cluster_lib

EXIT_TIMEOUT = 124
_POLL_S = 0.05


@dataclasses.dataclass
class Attempt:
  """One run of the cluster.

  Attributes:
    number: 0 for the first run, k for the k-th restart.
    addresses: the workers' "host:port".
    worker_pids: the workers' process ids.
    client_pid: the client's process id.
    returncode: the client's exit status (negative: killed by that signal).
    failure: why the attempt failed ("" if it succeeded).
    restartable: whether the failure was a lost worker (worth a restart).
    failed_worker: the task index of the worker that exited, if one did.
    client_exited_by_itself: after a worker died, whether the client ended by
      itself (its own error) before the launcher stopped it.
    seconds_to_stop: from noticing the failure to every process stopped.
    seconds: wall time of the attempt.
  """
  number: int
  addresses: List[str]
  worker_pids: List[int]
  client_pid: int = 0
  returncode: Optional[int] = None
  failure: str = ""
  restartable: bool = False
  failed_worker: Optional[int] = None
  client_exited_by_itself: Optional[bool] = None
  seconds_to_stop: float = 0.0
  seconds: float = 0.0


@dataclasses.dataclass
class LaunchResult:
  """What `launch` did: the exit status and every attempt."""
  returncode: int
  attempts: List[Attempt]


def free_ports(n: int, host: str = "127.0.0.1") -> List[int]:
  """n distinct TCP ports that were free a moment ago.

  Example:
    >>> len(free_ports(4))
    4
  """
  sockets, ports = [], []
  try:
    for _ in range(n):
      s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      s.bind((host, 0))
      sockets.append(s)
      ports.append(s.getsockname()[1])
  finally:
    for s in sockets:
      s.close()
  return ports


_LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def exposure_notice(host: str) -> str:
  """The launcher's first line: who can reach the workers.

  Example:
    >>> exposure_notice("127.0.0.1")[:40]
    'note: TensorFlow worker servers take una'
  """
  where = ("the cluster names 127.0.0.1 but TensorFlow listens on every interface"
           if host in _LOOPBACK else
           f"--host={host} is reachable from other machines by design")
  return ("note: TensorFlow worker servers take unauthenticated requests that run any "
          f"graph on 0.0.0.0:PORT ({where}); they live only while the client runs. Use "
          "clusters only on a private network or behind a firewall.")


def program_command(program: Sequence[str]) -> List[str]:
  """The command that runs `program` (a .py script or "-m module" with this
  Python, anything else as is).

  Example:
    >>> program_command(["examples/mnist.py", "--train_steps=10"])[1:]
    ['examples/mnist.py', '--train_steps=10']
  """
  program = list(program)
  if not program:
    raise ValueError("launch: no program given; put it after '--', e.g. "
                     "python -m mesh_tensorflow.launch --workers=2 -- examples/mnist.py")
  if program[0].endswith(".py") or program[0] == "-m":
    return [sys.executable] + program
  return program


def _describe_exit(returncode: int) -> str:
  if returncode < 0:
    try:
      return f"was killed by {signal.Signals(-returncode).name}"
    except ValueError:
      return f"was killed by signal {-returncode}"
  return f"exited with status {returncode}"


def _tail(path: str, lines: int = 8) -> str:
  try:
    with open(path, errors="replace") as f:
      text = f.read().splitlines()
  except OSError:
    return ""
  text = [line for line in text if line.strip()][-lines:]
  return "\n".join("    | " + line for line in text)


def _stop(processes: Sequence[subprocess.Popen], grace_s: float) -> None:
  """SIGTERM, then SIGKILL whatever is still running after grace_s."""
  for p in processes:
    if p.poll() is None:
      p.terminate()
  deadline = time.monotonic() + grace_s
  for p in processes:
    remaining = max(0.0, deadline - time.monotonic())
    try:
      p.wait(timeout=remaining)
    except subprocess.TimeoutExpired:
      p.kill()
      p.wait()


class Launcher:
  """Runs a client program on a cluster of local workers, supervised.

  Args:
    program: the client command line (see program_command).
    workers: number of worker processes.
    devices_per_worker: CPU devices each worker exposes.
    max_restarts: restarts of the whole cluster after a lost worker.
    timeout_s: wall-time limit of each attempt (0: none).
    client_grace_s: after a worker exits, how long the client may take to
      fail by itself before it is stopped.
    kill_grace_s: after SIGTERM, how long before SIGKILL.
    watchdog_timeout_s: passed to the client as MTF_WATCHDOG_TIMEOUT_S (the
      heartbeat timeout of mtf.cluster.Watchdog).
    host: the address the workers listen on.
    log_dir: where worker logs go (default: a new temporary directory).
    log: where the launcher's own messages go (default: stderr).
    stdout: the client's stdout and stderr (default: inherited).
    env: extra environment variables for the client.

  Example:
    >>> result = Launcher(["examples/mnist.py", "--train_steps=50"], workers=2,
    ...                   devices_per_worker=4).run()
    >>> result.returncode
    0
  """

  def __init__(self, program: Sequence[str], workers: int = 2, devices_per_worker: int = 4,
               max_restarts: int = 0, timeout_s: float = 0.0, client_grace_s: float = 10.0,
               kill_grace_s: float = 5.0, watchdog_timeout_s: float = 120.0,
               host: str = "127.0.0.1", log_dir: Optional[str] = None,
               log: Optional[Callable[[str], None]] = None, stdout: Optional[IO] = None,
               env: Optional[dict] = None):
    if workers < 1:
      raise ValueError(f"launch: --workers={workers} must be >= 1.")
    if devices_per_worker < 1:
      raise ValueError(f"launch: --devices_per_worker={devices_per_worker} must be >= 1.")
    if max_restarts < 0:
      raise ValueError(f"launch: --max_restarts={max_restarts} must be >= 0.")
    if timeout_s < 0 or client_grace_s < 0 or kill_grace_s < 0 or watchdog_timeout_s <= 0:
      raise ValueError("launch: --timeout_s, --client_grace_s and --kill_grace_s must be "
                       ">= 0 and --watchdog_timeout_s > 0.")
    self.command = program_command(program)
    self.workers = workers
    self.devices_per_worker = devices_per_worker
    self.max_restarts = max_restarts
    self.timeout_s = timeout_s
    self.client_grace_s = client_grace_s
    self.kill_grace_s = kill_grace_s
    self.watchdog_timeout_s = watchdog_timeout_s
    self.host = host
    self.log_dir = log_dir or tempfile.mkdtemp(prefix="mtf_launch_")
    self._log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    self._stdout = stdout
    self._env = dict(env or {})
    self.attempts: List[Attempt] = []
    # The processes of the attempt running now (for tests and callers that
    # want to inject failures).
    self.worker_processes: List[subprocess.Popen] = []
    self.client_process: Optional[subprocess.Popen] = None

  def log(self, message: str) -> None:
    self._log(f"[launch] {message}")

  def run(self) -> LaunchResult:
    """Runs attempts until one succeeds, fails for good, or restarts run out."""
    os.makedirs(self.log_dir, exist_ok=True)
    for number in range(self.max_restarts + 1):
      if number:
        self.log(f"restarting the cluster (restart {number} of {self.max_restarts}); the "
                 "client resumes from its last checkpoint")
      attempt = self._attempt(number)
      self.attempts.append(attempt)
      if not attempt.failure:
        return LaunchResult(0, self.attempts)
      if not attempt.restartable:
        break
    last = self.attempts[-1]
    if last.restartable and self.max_restarts:
      self.log(f"giving up after {self.max_restarts} restarts")
    code = last.returncode if last.returncode not in (None, 0) else 1
    if code < 0:
      code = 128 - code
    return LaunchResult(code, self.attempts)

  def _attempt(self, number: int) -> Attempt:
    start = time.monotonic()
    addresses = [f"{self.host}:{p}" for p in free_ports(self.workers, self.host)]
    config = cluster_lib.ClusterConfig(tuple(addresses))
    workers, logs = [], []
    for task in range(self.workers):
      path = os.path.join(self.log_dir, f"worker-{task}.attempt-{number}.log")
      logs.append(path)
      with open(path, "w") as out:
        workers.append(subprocess.Popen(
            [sys.executable, "-m", "mesh_tensorflow.distributed.launch", "--serve",
             f"--cluster={','.join(addresses)}", f"--task={task}",
             f"--devices_per_worker={self.devices_per_worker}", "--exit_with_parent"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
    env = dict(os.environ)
    env.update(self._env)
    env[cluster_lib.ENV_VAR] = config.to_json()
    env["MTF_WATCHDOG_TIMEOUT_S"] = str(self.watchdog_timeout_s)
    env["MTF_LAUNCH_ATTEMPT"] = str(number)
    env.pop(cluster_lib.TF_CONFIG_VAR, None)
    client = subprocess.Popen(self.command, env=env, stdout=self._stdout,
                              stderr=subprocess.STDOUT if self._stdout is not None else None)
    self.worker_processes, self.client_process = workers, client
    attempt = Attempt(number, addresses, [w.pid for w in workers], client.pid)
    if number == 0:
      self.log(exposure_notice(self.host))
    self.log(f"attempt {number}: {self.workers} workers x {self.devices_per_worker} CPU "
             f"devices on {', '.join(addresses)} (pids "
             f"{' '.join(str(w.pid) for w in workers)}; logs in {self.log_dir}); client pid "
             f"{client.pid}: {' '.join(self.command)}")
    try:
      self._supervise(attempt, workers, client, logs, start)
    except KeyboardInterrupt:
      self.log("interrupted: stopping the client and the workers")
      _stop([client] + workers, self.kill_grace_s)
      raise
    attempt.seconds = time.monotonic() - start
    return attempt

  def _supervise(self, attempt: Attempt, workers, client, logs, start: float) -> None:
    while True:
      rc = client.poll()
      dead = [(task, w.returncode) for task, w in enumerate(workers) if w.poll() is not None]
      # A client that noticed a dead worker within one poll exits before the
      # worker is seen: the failure is still the worker's (below).
      if rc is not None and (rc == 0 or not dead):
        attempt.returncode = rc
        if rc == 0:
          self.log(f"attempt {attempt.number}: the client finished; stopping the workers")
          _stop(workers, self.kill_grace_s)
        else:
          attempt.restartable = rc == cluster_lib.EXIT_WORKER_LOST
          attempt.failure = (f"the client {_describe_exit(rc)}" +
                             (" (it lost a worker)" if attempt.restartable else ""))
          t0 = time.monotonic()
          _stop(workers, self.kill_grace_s)
          attempt.seconds_to_stop = time.monotonic() - t0
          self.log(f"attempt {attempt.number} failed: {attempt.failure}; stopped the workers")
        return
      if dead:
        task, wrc = dead[0]
        t0 = time.monotonic()
        attempt.failed_worker, attempt.restartable = task, True
        attempt.failure = (f"worker task {task} (pid {workers[task].pid}, "
                           f"{attempt.addresses[task]}) {_describe_exit(wrc)}")
        self.log(f"attempt {attempt.number}: {attempt.failure}; waiting up to "
                 f"{self.client_grace_s:g} s for the client to stop\n{_tail(logs[task])}")
        try:
          client.wait(timeout=self.client_grace_s)
          attempt.client_exited_by_itself = True
        except subprocess.TimeoutExpired:
          attempt.client_exited_by_itself = False
          _stop([client], self.kill_grace_s)
        _stop(workers, self.kill_grace_s)
        attempt.returncode = client.returncode
        attempt.seconds_to_stop = time.monotonic() - t0
        how = ("the client failed by itself" if attempt.client_exited_by_itself
               else "stopped the client")
        self.log(f"attempt {attempt.number} failed: {attempt.failure}; {how} "
                 f"({_describe_exit(client.returncode)}) and stopped the workers "
                 f"{attempt.seconds_to_stop:.1f} s after noticing")
        return
      if self.timeout_s and time.monotonic() - start > self.timeout_s:
        attempt.failure = f"the attempt ran past --timeout_s={self.timeout_s:g}"
        _stop([client] + workers, self.kill_grace_s)
        attempt.returncode = EXIT_TIMEOUT
        self.log(f"attempt {attempt.number} failed: {attempt.failure}; stopped everything")
        return
      time.sleep(_POLL_S)


def launch(program: Sequence[str], **kwargs) -> LaunchResult:
  """Launcher(program, **kwargs).run().

  Example:
    >>> launch(["examples/mnist.py", "--train_steps=50"], workers=4,
    ...        devices_per_worker=2).returncode
    0
  """
  return Launcher(program, **kwargs).run()


def _parser() -> cli.FlagParser:
  parser = cli.FlagParser(
      prog="python -m mesh_tensorflow.launch",
      usage="python -m mesh_tensorflow.launch [options] -- PROGRAM [ARGS...]\n"
            "       python -m mesh_tensorflow.launch --serve --cluster=H:P,... --task=N "
            "[--devices_per_worker=K]",
      description=__doc__.split("\n\n")[0])
  parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
  parser.add_argument("--devices_per_worker", type=int, default=None,
                      help="CPU devices per worker (default: 8 // workers, at least 1)")
  parser.add_argument("--max_restarts", type=int, default=0,
                      help="restart the whole cluster up to this many times after a lost "
                      "worker (default 0)")
  parser.add_argument("--timeout_s", type=float, default=0.0,
                      help="wall-time limit of each attempt in seconds (0: none)")
  parser.add_argument("--client_grace_s", type=float, default=10.0,
                      help="after a worker dies, seconds the client has to fail by itself "
                      "before it is stopped (default 10)")
  parser.add_argument("--kill_grace_s", type=float, default=5.0,
                      help="seconds between SIGTERM and SIGKILL (default 5)")
  parser.add_argument("--watchdog_timeout_s", type=float, default=120.0,
                      help="the client's heartbeat timeout for a hung worker (default 120)")
  parser.add_argument("--host", default="127.0.0.1", help="address the workers listen on")
  parser.add_argument("--log_dir", default=None, help="worker logs (default: a temp dir)")
  serve = parser.add_argument_group("running one worker (--serve)")
  serve.add_argument("--serve", action="store_true",
                     help="run one worker task of --cluster and block")
  serve.add_argument("--cluster", default="",
                     help="with --serve: host:port of every worker (default: $MTF_CLUSTER "
                     "or $TF_CONFIG)")
  serve.add_argument("--task", type=int, default=None, help="with --serve: this task's index")
  serve.add_argument("--exit_with_parent", action="store_true",
                     help="with --serve: exit when the parent process ends (the launcher "
                     "passes it, so no worker outlives it)")
  return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
  """`python -m mesh_tensorflow.launch ARGS`; returns the exit status (see cli.run_module_command)."""
  from mesh_tensorflow import cli as cli_lib  # pylint: disable=g-import-not-at-top
  return cli_lib.run_module_command("mesh_tensorflow.launch", _main, argv)


def _main(argv: Sequence[str]) -> int:
  argv = list(argv)
  program: List[str] = []
  if "--" in argv:
    split = argv.index("--")
    argv, program = argv[:split], argv[split + 1:]
  parser = _parser()
  args = parser.parse_args(argv)
  devices_per_worker = args.devices_per_worker or max(1, 8 // max(args.workers, 1))
  if args.serve:
    if program:
      parser.error("--serve runs a worker and takes no program after '--'.")
    try:
      config = cluster_lib.resolve(args.cluster, args.task)
      if config is None or not config.is_worker:
        raise ValueError("--serve needs --cluster=host:port,... and --task=N (or a worker "
                         "task in $MTF_CLUSTER / $TF_CONFIG).")
    except ValueError as e:
      parser.error(str(e))
    cluster_lib.serve(config, devices_per_worker, exit_with_parent=args.exit_with_parent)
    return 0
  if not program:
    parser.error("no program given; put it after '--', e.g. "
                 "python -m mesh_tensorflow.launch --workers=2 -- examples/mnist.py")
  try:
    launcher = Launcher(program, workers=args.workers, devices_per_worker=devices_per_worker,
                        max_restarts=args.max_restarts, timeout_s=args.timeout_s,
                        client_grace_s=args.client_grace_s, kill_grace_s=args.kill_grace_s,
                        watchdog_timeout_s=args.watchdog_timeout_s, host=args.host,
                        log_dir=args.log_dir)
  except ValueError as e:
    parser.error(str(e))
  def on_sigterm(signum, frame):
    del signum, frame
    raise KeyboardInterrupt  # run() stops the client and the workers, then re-raises
  signal.signal(signal.SIGTERM, on_sigterm)
  try:
    result = launcher.run()
  except KeyboardInterrupt:
    return 130
  if result.returncode:
    launcher.log(f"failed: {result.attempts[-1].failure} (exit status {result.returncode})")
  return result.returncode


if __name__ == "__main__":
  sys.exit(main())
