"""Meshes over several processes or hosts, on TensorFlow's distributed runtime.

A cluster is a list of worker tasks ("host:port"). Each worker runs a
`tf.distribute.Server` exposing some CPU devices; one client process connects
to all of them (`tf.config.experimental_connect_to_cluster`), builds the model
and places each mesh processor on a remote device such as
`/job:worker/replica:0/task:1/device:CPU:2`. Any mesh implementation that takes
a list of device names (PlacementMeshImpl today) then runs across the cluster.

The cluster comes from a flag (`--cluster=host:port,host:port --task=N`), or
from the environment: `MTF_CLUSTER` (set by `python -m mesh_tensorflow.launch`)
or `TF_CONFIG`, both JSON of the form

    {"cluster": {"worker": ["127.0.0.1:23001", "127.0.0.1:23002"]},
     "task": {"type": "worker", "index": 1}}

where a task type other than "worker" (or no task) means "this is the client".

Start a worker by hand (blocks until killed; `python -m mesh_tensorflow.launch`
starts all of them for you on one machine):

    python -m mesh_tensorflow.launch --serve --cluster=127.0.0.1:23001,127.0.0.1:23002 \
        --task=0 --devices_per_worker=4

and, in the client:

    >>> config = mtf.cluster.resolve("127.0.0.1:23001,127.0.0.1:23002")
    >>> devices = mtf.cluster.connect(config)        # 8 names, task-major
    >>> impl = mtf.PlacementMeshImpl("rows:2;cols:4", "batch:rows;hidden:cols", devices)
    >>> with mtf.cluster.Watchdog(config), mtf.cluster.worker_errors(config):
    ...   trainer.train(dataset, steps=1000)

Failures: when a worker process dies, TensorFlow's next remote call fails
with `tf.errors.UnavailableError` ("Socket closed") within about a second
(see docs/multihost.md); `worker_errors` turns that into a `WorkerLostError`
naming the task and its address. A worker that hangs without dying leaves
TensorFlow's calls waiting forever; `Watchdog` bounds that: it checks every
worker's port and runs a tiny heartbeat op on each worker, and if a worker
stops answering for `timeout_s` it prints the reason and ends the process
with exit code `EXIT_WORKER_LOST` (a blocked TensorFlow call cannot be
interrupted any other way).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import socket
import sys
import threading
import time
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import tensorflow as tf

WORKER_JOB = "worker"
ENV_VAR = "MTF_CLUSTER"
TF_CONFIG_VAR = "TF_CONFIG"
# Exit status of a client that lost a worker (EX_TEMPFAIL: try again). The
# launcher restarts the cluster after it (with --max_restarts), and after a
# worker's death, but not after other failures of the client.
EXIT_WORKER_LOST = 75

_ADDRESS = re.compile(r"^\[?[A-Za-z0-9_.:-]+?\]?:\d{1,5}$")
_TASK_IN_MESSAGE = re.compile(r"/job:([A-Za-z0-9_]+)/replica:\d+/task:(\d+)")


class WorkerLostError(RuntimeError):
  """A worker of the cluster died or stopped answering.

  Attributes:
    task: the worker's task index, or None if TensorFlow's error did not say.
    address: its "host:port", or None.
  """

  def __init__(self, message: str, task: Optional[int] = None,
               address: Optional[str] = None):
    super().__init__(message)
    self.task = task
    self.address = address


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
  """The worker tasks of a cluster and this process's role in it.

  Attributes:
    workers: "host:port" of each worker task, in task order.
    task: this process's worker task index, or None for the client.

  Example:
    >>> config = ClusterConfig(("127.0.0.1:23001", "127.0.0.1:23002"), task=None)
    >>> config.num_workers
    2
  """
  workers: Tuple[str, ...]
  task: Optional[int] = None

  def __post_init__(self):
    workers = tuple(self.workers)
    object.__setattr__(self, "workers", workers)
    if not workers:
      raise ValueError("Cluster: no workers given; pass --cluster=host:port[,host:port...].")
    for i, address in enumerate(workers):
      if not isinstance(address, str) or not _ADDRESS.match(address):
        raise ValueError(
            f"Cluster: worker {i} has address {address!r}; expected 'host:port', e.g. "
            "'127.0.0.1:23001'.")
    if len(set(workers)) != len(workers):
      raise ValueError(f"Cluster: worker addresses repeat in {list(workers)}; give each "
                       "task its own host:port.")
    if self.task is not None and not 0 <= self.task < len(workers):
      raise ValueError(
          f"Cluster: --task={self.task} is out of range for {len(workers)} workers "
          f"(0..{len(workers) - 1}); omit it (or pass -1) for the client.")

  @property
  def num_workers(self) -> int:
    return len(self.workers)

  @property
  def is_worker(self) -> bool:
    return self.task is not None

  def cluster_spec(self) -> tf.train.ClusterSpec:
    """The tf.train.ClusterSpec with one job, "worker"."""
    return tf.train.ClusterSpec({WORKER_JOB: list(self.workers)})

  def to_json(self) -> str:
    """TF_CONFIG-style JSON (what MTF_CLUSTER holds).

    Example:
      >>> ClusterConfig(("127.0.0.1:23001",)).to_json()
      '{"cluster": {"worker": ["127.0.0.1:23001"]}, "task": {"type": "client", "index": 0}}'
    """
    task = ({"type": WORKER_JOB, "index": self.task} if self.is_worker
            else {"type": "client", "index": 0})
    return json.dumps({"cluster": {WORKER_JOB: list(self.workers)}, "task": task})

  def with_task(self, task: Optional[int]) -> "ClusterConfig":
    return ClusterConfig(self.workers, task)


def parse_cluster(text: str, task: Optional[int] = None) -> ClusterConfig:
  """A ClusterConfig from "host:port,host:port" (task None or < 0: the client).

  Example:
    >>> parse_cluster("127.0.0.1:23001,127.0.0.1:23002", task=1).task
    1
  """
  workers = [w.strip() for w in text.split(",") if w.strip()]
  if task is not None and task < 0:
    task = None
  return ClusterConfig(tuple(workers), task)


def from_json(text: str, source: str = "TF_CONFIG") -> ClusterConfig:
  """A ClusterConfig from TF_CONFIG-style JSON (see the module docstring).

  Only the "worker" job is used; a task of another type (e.g. "chief" or
  "client"), or no task, means this process is the client.

  Example:
    >>> from_json('{"cluster": {"worker": ["h0:2222", "h1:2222"]}, '
    ...           '"task": {"type": "worker", "index": 0}}').task
    0
  """
  try:
    spec = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{source} is not valid JSON ({e}): {text!r}") from None
  if not isinstance(spec, dict) or not isinstance(spec.get("cluster"), dict):
    raise ValueError(f"{source} must be a JSON object with a 'cluster' object, got {text!r}.")
  workers = spec["cluster"].get(WORKER_JOB)
  if not isinstance(workers, list) or not workers:
    raise ValueError(
        f"{source}: cluster has no '{WORKER_JOB}' job (jobs: {sorted(spec['cluster'])}); "
        "mesh devices live on the worker tasks.")
  task = spec.get("task") or {}
  index = None
  if task.get("type") == WORKER_JOB:
    index = task.get("index", 0)
    if not isinstance(index, int):
      raise ValueError(f"{source}: task index must be an integer, got {index!r}.")
  return ClusterConfig(tuple(workers), index)


def resolve(cluster: str = "", task: Optional[int] = None,
            environ: Optional[Mapping[str, str]] = None) -> Optional[ClusterConfig]:
  """The cluster from a flag value, else MTF_CLUSTER, else TF_CONFIG; None if none.

  Args:
    cluster: "host:port,host:port", or "" to read the environment.
    task: with `cluster`, this process's worker task (None or -1: client).
    environ: the environment (default os.environ).

  Example:
    >>> resolve("", environ={})          # no cluster: run locally
    >>> resolve("127.0.0.1:23001").workers
    ('127.0.0.1:23001',)
  """
  environ = os.environ if environ is None else environ
  if cluster:
    return parse_cluster(cluster, task)
  for var in (ENV_VAR, TF_CONFIG_VAR):
    text = environ.get(var, "").strip()
    if text:
      return from_json(text, source=var)
  return None


# ---- workers -----------------------------------------------------------------
def start_worker(config: ClusterConfig, devices_per_worker: int = 1,
                 inter_op_threads: int = 0, intra_op_threads: int = 0) -> tf.distribute.Server:
  """Starts this process's worker server with `devices_per_worker` CPU devices.

  The server's ConfigProto sets the CPU device count (logical device
  configurations made with tf.config do not reach a server's devices).

  TensorFlow's server listens on 0.0.0.0 (every interface) at the task's
  port, whatever host the cluster spec names, and runs any graph it is sent
  without authentication: start workers only where untrusted machines cannot
  reach the port (a private network, or behind a firewall).

  Example:
    >>> server = start_worker(parse_cluster("127.0.0.1:23001", task=0), 4)
    >>> server.join()
  """
  if not config.is_worker:
    raise ValueError("start_worker: the cluster config has no --task; pass the index of "
                     "this worker (0..num_workers-1).")
  if devices_per_worker < 1:
    raise ValueError(f"start_worker: devices_per_worker={devices_per_worker} must be >= 1.")
  proto = tf.compat.v1.ConfigProto(device_count={"CPU": devices_per_worker},
                                   inter_op_parallelism_threads=inter_op_threads,
                                   intra_op_parallelism_threads=intra_op_threads)
  return tf.distribute.Server(config.cluster_spec(), job_name=WORKER_JOB,
                              task_index=config.task, protocol="grpc", config=proto,
                              start=True)


def _exit_when_orphaned(interval_s: float = 0.5) -> None:
  parent = os.getppid()

  def watch():
    while True:
      time.sleep(interval_s)
      if os.getppid() != parent:
        print("mesh_tensorflow.distributed.cluster: the worker's parent process ended; exiting.",
              file=sys.stderr, flush=True)
        os._exit(1)  # pylint: disable=protected-access
  threading.Thread(target=watch, daemon=True, name="mtf-orphan-watch").start()


# ---- the client ----------------------------------------------------------------
def _split_address(address: str) -> Tuple[str, int]:
  host, _, port = address.rpartition(":")
  return host.strip("[]"), int(port)


def port_open(address: str, timeout_s: float = 1.0) -> bool:
  """Whether something accepts TCP connections at "host:port".

  Example:
    >>> port_open("127.0.0.1:1")
    False
  """
  try:
    with socket.create_connection(_split_address(address), timeout=timeout_s):
      return True
  except OSError:
    return False


def wait_for_workers(config: ClusterConfig, timeout_s: float = 60.0,
                     poll_s: float = 0.1) -> None:
  """Waits until every worker's port accepts connections.

  TensorFlow itself waits forever for a worker that never comes up; this
  bounds the wait.

  Raises:
    WorkerLostError: naming the workers still unreachable after timeout_s.

  Example:
    >>> wait_for_workers(config, timeout_s=30)
  """
  deadline = time.monotonic() + timeout_s
  pending = list(range(config.num_workers))
  while True:
    pending = [i for i in pending if not port_open(config.workers[i], timeout_s=1.0)]
    if not pending:
      return
    if time.monotonic() > deadline:
      names = ", ".join(f"task {i} at {config.workers[i]}" for i in pending)
      raise WorkerLostError(
          f"Cluster: no answer from worker {names} after {timeout_s:.0f} s. Start the "
          "workers (python -m mesh_tensorflow.launch --serve --cluster=... --task=N, "
          "or let python -m mesh_tensorflow.launch start them), or check the addresses.",
          task=pending[0], address=config.workers[pending[0]])
    time.sleep(poll_s)


def _device_sort_key(name: str):
  spec = tf.DeviceSpec.from_string(name)
  return (spec.job or "", spec.replica or 0, spec.task or 0, spec.device_type or "",
          spec.device_index or 0)


def mesh_devices(job: str = WORKER_JOB, device_type: str = "CPU") -> List[str]:
  """The connected cluster's devices of `job`, task-major then by index.

  Example:
    >>> mesh_devices()[:2]
    ['/job:worker/replica:0/task:0/device:CPU:0', '/job:worker/replica:0/task:0/device:CPU:1']
  """
  names = [d.name for d in tf.config.list_logical_devices(device_type)
           if tf.DeviceSpec.from_string(d.name).job == job]
  return sorted(names, key=_device_sort_key)


def connect(config: ClusterConfig, timeout_s: float = 60.0,
            devices_per_worker: Optional[int] = None) -> List[str]:
  """Connects this (client) process to the cluster; returns the mesh devices.

  Waits (at most timeout_s) for every worker, then calls
  tf.config.experimental_connect_to_cluster. Call it before building any
  TensorFlow state on devices: connecting again invalidates remote handles.

  Args:
    config: the cluster.
    timeout_s: how long to wait for the workers to come up.
    devices_per_worker: if given, check that every worker has exactly this
      many CPU devices.

  Returns:
    Every worker's CPU devices, task by task, e.g.
    ["/job:worker/replica:0/task:0/device:CPU:0", ..., ".../task:1/device:CPU:3"].
    Give the first `mesh.size` of them to a mesh implementation.

  Raises:
    WorkerLostError: if a worker does not answer within timeout_s.
    ValueError: if config names a worker task (this is for the client) or the
      device counts differ from devices_per_worker.

  Example:
    >>> devices = connect(resolve())
  """
  if config.is_worker:
    raise ValueError(
        f"cluster.connect: this process is worker task {config.task}; the client runs with "
        "no --task (or task type 'client'/'chief' in MTF_CLUSTER / TF_CONFIG).")
  wait_for_workers(config, timeout_s)
  tf.config.experimental_connect_to_cluster(config.cluster_spec())
  devices = mesh_devices()
  per_task: Dict[int, int] = {}
  for name in devices:
    task = tf.DeviceSpec.from_string(name).task
    per_task[task] = per_task.get(task, 0) + 1
  missing = [i for i in range(config.num_workers) if i not in per_task]
  if missing:
    raise WorkerLostError(f"Cluster: workers {missing} expose no CPU devices.",
                          task=missing[0], address=config.workers[missing[0]])
  if devices_per_worker is not None and set(per_task.values()) != {devices_per_worker}:
    raise ValueError(
        f"Cluster: expected {devices_per_worker} CPU devices per worker, found "
        f"{dict(sorted(per_task.items()))} (task: count). Start every worker with "
        f"--devices_per_worker={devices_per_worker}.")
  return devices


def describe_devices(devices: Sequence[str]) -> str:
  """A one-line summary, e.g. "8 devices on 2 workers (4 per worker)".

  Example:
    >>> describe_devices(["/job:worker/task:0/device:CPU:0"])
    '1 devices on 1 workers (1 per worker)'
  """
  tasks: Dict[int, int] = {}
  for name in devices:
    task = tf.DeviceSpec.from_string(name).task or 0
    tasks[task] = tasks.get(task, 0) + 1
  counts = sorted(set(tasks.values()))
  per = str(counts[0]) if len(counts) == 1 else "/".join(str(c) for c in counts)
  return f"{len(devices)} devices on {len(tasks)} workers ({per} per worker)"


def _lost_task(message: str, config: Optional[ClusterConfig], settle_s: float = 2.0):
  """(task, address) of the lost worker: the first whose port is closed, else
  the first worker task that TensorFlow's message names (a surviving worker
  may report the failure of its transfer from the dead one).

  A dying process may drop its connections a moment before its listening
  port closes, so the ports are checked again for up to `settle_s`."""
  if config is not None:
    deadline = time.monotonic() + settle_s
    while True:
      for task, address in enumerate(config.workers):
        if not port_open(address, timeout_s=0.5):
          return task, address
      if time.monotonic() >= deadline:
        break
      time.sleep(0.1)
  for job, task in _TASK_IN_MESSAGE.findall(message):
    if job == WORKER_JOB:
      task = int(task)
      address = (config.workers[task] if config is not None and task < config.num_workers
                 else None)
      return task, address
  return None, None


@contextlib.contextmanager
def worker_errors(config: Optional[ClusterConfig] = None) -> Iterator[None]:
  """Turns TensorFlow's errors about unreachable workers into WorkerLostError.

  TensorFlow reports a dead worker as tf.errors.UnavailableError (gRPC
  "Socket closed" / "Connection reset by peer"), often with many "root
  errors"; the WorkerLostError names the worker whose port is closed (else the
  first worker task the message mentions) and its address.

  Example:
    >>> with worker_errors(config):
    ...   trainer.train(dataset, steps=100)
  """
  try:
    yield
  except (tf.errors.UnavailableError, tf.errors.AbortedError) as e:
    message = str(e)
    task, address = _lost_task(message, config)
    who = (f"worker task {task}" + (f" ({address})" if address else "")
           if task is not None else "a worker")
    first = message.strip().splitlines()
    detail = next((line.strip() for line in first if "UNAVAILABLE" in line or "Socket" in line
                   or "connect" in line), first[0] if first else type(e).__name__)
    raise WorkerLostError(
        f"Lost {who}: TensorFlow reported {type(e).__name__}: {detail}. The cluster cannot "
        "continue; restart it (python -m mesh_tensorflow.launch --max_restarts=N restarts "
        "by itself) and training resumes from the last checkpoint in the model_dir.",
        task=task, address=address) from e


class Watchdog:
  """Ends the client within a bounded time when a worker dies or hangs.

  A background thread checks, every `interval_s`, that each worker's port
  accepts connections and that a tiny op (a heartbeat) on each worker
  finishes. If a port refuses connections, or a heartbeat has not come back
  after `timeout_s`, it prints which worker failed and why to stderr and ends
  the process with exit code EXIT_WORKER_LOST: a TensorFlow call blocked on
  a dead or frozen worker cannot be interrupted from Python otherwise.

  Args:
    config: the cluster (after `connect`).
    timeout_s: how long a heartbeat may take before the worker counts as hung.
      Heartbeats are small ops queued on the worker's CPU:0 next to the model's
      ops, so give it room for a step's worth of work there.
    interval_s: seconds between checks.
    heartbeat: run heartbeat ops (False: only check the ports).
    exit_fn: called with the message instead of exiting (for tests).

  Example:
    >>> with Watchdog(config, timeout_s=60):
    ...   trainer.train(dataset, steps=1000)
  """

  def __init__(self, config: ClusterConfig, timeout_s: float = 120.0,
               interval_s: float = 1.0, heartbeat: bool = True, exit_fn=None):
    if timeout_s <= 0 or interval_s <= 0:
      raise ValueError(f"Watchdog: timeout_s={timeout_s} and interval_s={interval_s} must be "
                       "> 0.")
    self._config = config
    self._timeout_s = float(timeout_s)
    self._interval_s = float(interval_s)
    self._heartbeat = heartbeat
    self._exit_fn = exit_fn
    self._stop = threading.Event()
    self._threads: List[threading.Thread] = []
    now = time.monotonic()
    self._beat_started = {i: None for i in range(config.num_workers)}
    self._last_beat = {i: now for i in range(config.num_workers)}
    self.failure: Optional[str] = None

  def __enter__(self) -> "Watchdog":
    self.start()
    return self

  def __exit__(self, *exc) -> None:
    self.stop()

  def start(self) -> None:
    """Starts the checks (idempotent)."""
    if self._threads:
      return
    self._threads.append(threading.Thread(target=self._watch, daemon=True,
                                          name="mtf-watchdog"))
    if self._heartbeat:
      for task in range(self._config.num_workers):
        self._threads.append(threading.Thread(target=self._beat, args=(task,), daemon=True,
                                              name=f"mtf-heartbeat-{task}"))
    for t in self._threads:
      t.start()

  def stop(self) -> None:
    """Stops checking (threads blocked in a heartbeat are daemons and left)."""
    self._stop.set()

  def _beat(self, task: int) -> None:
    device = f"/job:{WORKER_JOB}/replica:0/task:{task}/device:CPU:0"
    while not self._stop.is_set():
      self._beat_started[task] = time.monotonic()
      try:
        with tf.device(device):
          tf.identity(tf.constant(task)).numpy()  # a round trip to the worker
      except Exception:  # pylint: disable=broad-except
        pass  # A dead worker also refuses its port; the watcher reports that.
      self._last_beat[task] = time.monotonic()
      self._beat_started[task] = None
      self._stop.wait(self._interval_s)

  def _fail(self, message: str) -> None:
    self.failure = message
    self._stop.set()
    if self._exit_fn is not None:
      self._exit_fn(message)
      return
    print(f"mesh_tensorflow.distributed.cluster.Watchdog: {message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(EXIT_WORKER_LOST)  # pylint: disable=protected-access

  def _watch(self) -> None:
    refused_since: Dict[int, float] = {}
    while not self._stop.wait(self._interval_s):
      now = time.monotonic()
      for task, address in enumerate(self._config.workers):
        if port_open(address, timeout_s=min(self._interval_s, 2.0)):
          refused_since.pop(task, None)
        else:
          first = refused_since.setdefault(task, now)
          # Two failed checks in a row (a restarting listener may blink once).
          if now - first >= self._interval_s:
            self._fail(f"Lost worker task {task} ({address}): its port stopped accepting "
                       f"connections (the process died or the host is unreachable). The "
                       "cluster cannot continue; restart it and training resumes from the "
                       "last checkpoint.")
            return
        started = self._beat_started[task]
        if started is not None and now - started > self._timeout_s:
          self._fail(f"Worker task {task} ({address}) did not answer a heartbeat for "
                     f"{now - started:.0f} s (timeout_s={self._timeout_s:g}): it hangs. The "
                     "cluster cannot continue; restart it and training resumes from the "
                     "last checkpoint.")
          return


WATCHDOG_TIMEOUT_VAR = "MTF_WATCHDOG_TIMEOUT_S"


@contextlib.contextmanager
def exit_on_worker_loss(config: Optional[ClusterConfig],
                        watchdog_timeout_s: Optional[float] = None) -> Iterator[None]:
  """Runs the body under a Watchdog; a lost worker ends the process clearly.

  A WorkerLostError (from TensorFlow's errors, see worker_errors) prints
  "error: Lost worker task N (host:port): ..." to stderr and ends the process
  at once (os._exit, skipping a teardown that can wait on the dead worker) with
  status EXIT_WORKER_LOST, which `mesh_tensorflow.distributed.launch` answers with a restart when
  --max_restarts allows. With config None (no cluster) it does nothing.

  Args:
    config: the cluster, or None.
    watchdog_timeout_s: the heartbeat timeout (default: $MTF_WATCHDOG_TIMEOUT_S,
      set by the launcher, else 120 s).

  Example:
    >>> with exit_on_worker_loss(config):
    ...   trainer.train(dataset, steps=1000)
  """
  if config is None:
    yield
    return
  if watchdog_timeout_s is None:
    watchdog_timeout_s = float(os.environ.get(WATCHDOG_TIMEOUT_VAR, "") or 120.0)
  try:
    with Watchdog(config, timeout_s=watchdog_timeout_s), worker_errors(config):
      yield
  except WorkerLostError as e:
    print(f"error: {e}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    # Not sys.exit: the interpreter's teardown destroys TensorFlow's eager
    # context, which waits on the dead worker's connections and can block
    # until the launcher kills the process.
    os._exit(EXIT_WORKER_LOST)  # pylint: disable=protected-access


def serve(config: ClusterConfig, devices_per_worker: int = 1,
          exit_with_parent: bool = False) -> None:
  """Runs this process as worker task `config.task` until it is killed.

  The command line form is `python -m mesh_tensorflow.launch --serve
  --cluster=host:port,... --task=N --devices_per_worker=K`.

  Args:
    config: the cluster, with this worker's task index.
    devices_per_worker: CPU devices the worker exposes to the mesh.
    exit_with_parent: exit when the parent process (the launcher) ends, so no
      worker outlives a launcher that was killed.

  Example:
    >>> serve(parse_cluster("127.0.0.1:23001,127.0.0.1:23002", task=0), 4)
  """
  if exit_with_parent:
    _exit_when_orphaned()
  server = start_worker(config, devices_per_worker)
  port = config.workers[config.task].rpartition(":")[2]
  print(f"worker task {config.task} serving {devices_per_worker} CPU devices at "
        f"{config.workers[config.task]} (pid {os.getpid()}); TensorFlow listens on "
        f"0.0.0.0:{port}, every interface, without authentication: keep the port behind "
        "a firewall", flush=True)
  server.join()
