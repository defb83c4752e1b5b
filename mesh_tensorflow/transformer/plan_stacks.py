"""The layer-stack settings a plan reads, the same in every stack of the model.

An encoder-decoder model (`run.model_type = "bitransformer"`) has two layer
stacks, built inside the gin scopes "encoder" and "decoder": a binding such
as `encoder/transformer.make_layer_stack.num_layers = 24` sets one stack
apart from the other. The planner prices one layer of each stack together
(one encoder layer and one decoder layer per layer it counts), so each
setting it reads must be the same in both stacks; where the scopes disagree
it says which bindings do, rather than price a model the config does not
build.

Example:
  >>> gin_config.parse([], ["run.model_type = 'bitransformer'",
  ...                       "encoder/transformer.make_layer_stack.num_layers = 24",
  ...                       "decoder/transformer.make_layer_stack.num_layers = 24"])
  >>> stack_setting("num_layers", 6)
  24
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional

from mesh_tensorflow.transformer import gin_config

STACK = "transformer.make_layer_stack."
SCOPES = ("encoder", "decoder")  # the scopes modeling.build_model gives a bitransformer's stacks
_UNBOUND = object()
# A layer's scope in an operation's name ("decoder/block_003/layer_001/wi/einsum"
# is in "decoder/block_003"; a stack without block scopes names its layers
# "layer_003"): layer_stack.py's naming.
_LAYER_SCOPE = re.compile(r"(?:^|/)(?:block|layer)_\d+/")


def encoder_decoder() -> bool:
  """Whether the parsed config builds an encoder-decoder model."""
  return gin_config.query("run.model_type", "lm") == "bitransformer"


def _scopes() -> tuple:
  """The gin scopes of the configured model's layer stacks ("" for none)."""
  return SCOPES if encoder_decoder() else ("",)


def stack_setting(parameter: str, default=None):
  """`transformer.make_layer_stack.<parameter>` as every stack of the parsed
  config takes it (a scoped binding first, then the unscoped one, then
  `default`).

  Raises:
    ValueError: naming both bindings, where an encoder-decoder model's two
      stacks take different values.
  """
  unscoped = gin_config.query(STACK + parameter, default)
  values = {scope: (gin_config.query(f"{scope}/{STACK}{parameter}", unscoped) if scope
                    else unscoped) for scope in _scopes()}
  if len({repr(v) for v in values.values()}) > 1:
    stated = " and ".join(f"{s}/{STACK}{parameter} = {v!r}" for s, v in values.items())
    raise ValueError(
        f"{stated}: plan prices an encoder-decoder model whose two layer stacks have the "
        f"same {parameter} (a layer of each, priced together); to plan it, bind "
        f"{STACK}{parameter} once, without a scope, for both stacks.")
  return next(iter(values.values()))


def stack_count(parameter: str, default: int) -> int:
  """`stack_setting` of a whole-number parameter; unset (or None) is `default`.

  Raises:
    ValueError: naming the binding, where the stacks disagree or the value
      is not a whole number.
  """
  return gin_config.whole_number(STACK + parameter, stack_setting(parameter), default)


def _scopes_binding(name: str) -> List[str]:
  """The scopes in which the parsed config binds `name` itself."""
  if not name.startswith(STACK):
    return []
  return [s for s in SCOPES if gin_config.query(f"{s}/{name}", _UNBOUND) is not _UNBOUND]


def with_scoped(bindings: Dict[str, object]) -> Dict[str, object]:
  """`bindings` of `transformer.make_layer_stack` parameters, plus the same
  value for each scope that binds that parameter itself (a scoped binding
  would otherwise win over the unscoped override)."""
  out = dict(bindings)
  for name, value in bindings.items():
    for scope in _scopes_binding(name):
      out[f"{scope}/{name}"] = value
  return out


def with_scoped_lines(lines: List[str]) -> List[str]:
  """Gin lines ("name = value"), each `transformer.make_layer_stack` one
  followed by the same line in each scope the parsed config binds it in, so
  that the lines set every stack (what `plan --auto` prints to paste).

  Example:
    >>> with_scoped_lines(["transformer.make_layer_stack.recompute = 'layer'"])
    ["transformer.make_layer_stack.recompute = 'layer'",
     "encoder/transformer.make_layer_stack.recompute = 'layer'"]
  """
  out = []
  for line in lines:
    out.append(line)
    out += [f"{scope}/{line}" for scope in _scopes_binding(line.split(" = ", 1)[0].strip())]
  return out


def layer_of(op) -> Optional[str]:
  """The scope of the stack layer an operation belongs to (its block:
  "transformer/block_003"), or None for one outside the layers."""
  match = _LAYER_SCOPE.search(op.name)  # the first: a block's layers are in it
  return op.name[:match.end() - 1] if match else None
