"""Keeps AutoGraph out of mtf's graph-building code.

A `tf.function` (AutoGraph is on by default) rewrites every Python function
its body calls, and every function those call in turn, unless the function is
marked `tf.autograph.experimental.do_not_convert`. mtf builds its graphs in
plain Python, so the rewriting only costs time: on the two-layer transformer
of `benchmarks/`, it made the first trace of a training step ten times slower
and every later trace about twice as slow. `exempt` marks what a namespace
exports: its functions and the public methods of its classes. Code they call,
including callbacks such as a `while_loop` body, then runs as written.

    >>> exempt(globals())   # at the end of a public module
"""

from __future__ import annotations

import inspect

import tensorflow as tf

_MARK = "_mtf_autograph_exempt"


def exempt(namespace: dict, public_only: bool = False) -> None:
  """Marks the mtf functions in `namespace` (replaced by their exempt
  wrappers) and the public methods of its mtf classes and their mtf bases;
  with `public_only`, names starting with "_" are left as they are."""
  for name, value in list(namespace.items()):
    if name.startswith("__") or not _ours(value) or (public_only and name.startswith("_")):
      continue
    if inspect.isfunction(value) and not getattr(value, _MARK, False):
      namespace[name] = _wrap(value)
    elif inspect.isclass(value):
      for cls in value.__mro__:
        if _ours(cls) and not cls.__dict__.get(_MARK, False):
          _exempt_methods(cls)


def _exempt_methods(cls) -> None:
  for name, attr in list(vars(cls).items()):
    public = not name.startswith("_") or name == "__call__"
    if public and inspect.isfunction(attr) and not getattr(attr, _MARK, False):
      setattr(cls, name, _wrap(attr))
  setattr(cls, _MARK, True)


def _wrap(fn):
  wrapped = tf.autograph.experimental.do_not_convert(fn)
  setattr(wrapped, _MARK, True)
  return wrapped


def _ours(value) -> bool:
  return (getattr(value, "__module__", None) or "").startswith("mesh_tensorflow")


def plain_tf(fn):
  """`fn`, marked for AutoGraph to leave alone: for the functions handed to
  tf.data (`map`, `filter`, `flat_map`, `scan`) that already use TensorFlow's
  own control flow (`tf.cond`, `tf.where`). tf.data rewrites its functions with
  AutoGraph otherwise, about three seconds per text input pipeline.

      >>> ds = ds.map(plain_tf(lambda ex: {"targets": ex["targets"][:64]}))
  """
  return _wrap(fn)
