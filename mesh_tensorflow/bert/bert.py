"""BERT (Bidirectional Encoder Representations from Transformers) in mtf ops.

The model is built from mtf operations only, so it lowers under any mesh
shape and layout with the same values and gradients. Variable names and
shapes are those of Mesh TensorFlow's BERT checkpoints:

    bert/embeddings/word_embeddings          [vocab, hidden]
    bert/embeddings/token_type_embeddings    [token_type_vocab, hidden]
    bert/embeddings/position_embeddings      [max_position_embeddings, hidden]
    bert/embeddings/layer_norm/{scale,bias}  [hidden]
    bert/encoder/block_<i>/attention/{query,key,value}/{kernel,bias}
    bert/encoder/block_<i>/attention/output/{kernel,bias}
    bert/encoder/block_<i>/attention/layer_norm/{scale,bias}
    bert/encoder/block_<i>/feedforward/{dense_1,dense_2}/{kernel,bias}
    bert/encoder/block_<i>/feedforward/layer_norm/{scale,bias}
    bert/pooler/dense/{kernel,bias}
    cls/predictions/transform/dense/..., cls/predictions/output_bias
    cls/seq_relationship/{kernel,bias}

The vocabulary dimension is padded to a multiple of 128
so that it can be split over a mesh dimension.

Example:
  >>> config = BertConfig(vocab_size=100, d_model=32, num_blocks=2,
  ...                     attention_num_heads=4, feedforward_intermediate_size=64)
  >>> model = BertModel(config, is_training=False, input_ids=ids)  # ids: [batch, seq]
  >>> pooled = model.get_pooled_output()                           # [batch, hidden]
"""

from __future__ import annotations

import collections
import copy
import json
import re
from typing import Callable, Dict, List, Optional, Tuple, Union

import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.layers.attention import _relative_position_bucket

_POSITION_SIGNALS = ("embedding", "relative_attention_bias")
_RESIDUAL_STRUCTURES = ("original", "direct")
_LAYER_TYPES = ("attention", "feedforward", "moe")

# Names of the Google BERT json config files, mapped to BertConfig's.
_CONFIG_ALIASES = {
    "hidden_size": "d_model",
    "num_hidden_layers": "num_blocks",
    "num_attention_heads": "attention_num_heads",
    "intermediate_size": "feedforward_intermediate_size",
    "hidden_act": "feedforward_intermediate_act",
    "hidden_dropout_prob": "layer_output_dropout_prob",
}


class BertConfig:
  """Hyperparameters of a `BertModel`.

  Args:
    vocab_size: size of the wordpiece vocabulary.
    d_model: channels of every layer's input and output ("hidden").
    position_signal: "embedding" (learned absolute positions) or
      "relative_attention_bias" (a learned bias per head and relative-position
      bucket, added to the attention logits).
    max_position_embeddings: longest sequence the position embedding covers.
    num_blocks: number of blocks in the encoder.
    block_layers: comma-separated layer types of each block, from
      "attention", "feedforward" and "moe".
    layer_output_dropout_prob: dropout rate of every layer's output.
    residual_structure: "original" (layer norm after each residual sum, as
      in BERT) or "direct" (layer norm of each layer's input, and once at the
      end).
    use_bias: biases in dense layers and layer norms, and mean subtraction
      in layer norms.
    attention_num_heads: attention heads.
    attention_head_size: size of each head's queries, keys and values
      (default d_model / attention_num_heads).
    attention_num_key_heads: key heads (`key_heads_dims`).
    attention_key_head_size: size of `key_dim`.
    attention_num_value_heads: value heads (`value_heads_dims`).
    attention_value_head_size: size of `value_dim`.
    attention_probs_dropout_prob: dropout rate of the attention weights.
    feedforward_intermediate_size: hidden size of the feed-forward layers.
    feedforward_intermediate_act: activation of the feed-forward hidden
      layer and the masked-LM transform ("gelu", "relu", "tanh", "linear" or
      a function).
    feedforward_intermediate_dropout_prob: dropout rate inside the
      feed-forward layers.
    moe_num_experts: experts of "moe" layers.
    moe_intermediate_size: hidden size of each expert.
    type_vocab_size: number of token types (segments).
    initializer_range: stddev of the truncated-normal weight initializer; 0
      or None selects a variance-scaling initializer (scale 0.4).

  Example:
    >>> config = BertConfig.from_dict({"vocab_size": 30522, "hidden_size": 768})
    >>> config.d_model
    768
  """

  def __init__(self,
               vocab_size: Optional[int],
               d_model: int = 768,
               position_signal: str = "embedding",
               max_position_embeddings: int = 512,
               num_blocks: int = 12,
               block_layers: str = "attention,feedforward",
               layer_output_dropout_prob: float = 0.1,
               residual_structure: str = "original",
               use_bias: bool = True,
               attention_num_heads: int = 12,
               attention_head_size: Optional[int] = None,
               attention_num_key_heads: Optional[int] = None,
               attention_key_head_size: Optional[int] = None,
               attention_num_value_heads: Optional[int] = None,
               attention_value_head_size: Optional[int] = None,
               attention_probs_dropout_prob: float = 0.1,
               feedforward_intermediate_size: int = 3072,
               feedforward_intermediate_act: Union[str, Callable] = "gelu",
               feedforward_intermediate_dropout_prob: float = 0.0,
               moe_num_experts: int = 32,
               moe_intermediate_size: int = 6144,
               type_vocab_size: int = 16,
               initializer_range: Optional[float] = 0.02):
    self.vocab_size = vocab_size
    self.d_model = d_model
    self.position_signal = position_signal
    self.max_position_embeddings = max_position_embeddings
    self.num_blocks = num_blocks
    self.block_layers = (block_layers.split(",") if isinstance(block_layers, str)
                         else list(block_layers))
    self.layer_output_dropout_prob = layer_output_dropout_prob
    self.residual_structure = residual_structure
    self.use_bias = use_bias
    self.attention_num_heads = attention_num_heads
    self.attention_head_size = attention_head_size
    self.attention_num_key_heads = attention_num_key_heads
    self.attention_key_head_size = attention_key_head_size
    self.attention_num_value_heads = attention_num_value_heads
    self.attention_value_head_size = attention_value_head_size
    self.attention_probs_dropout_prob = attention_probs_dropout_prob
    self.feedforward_intermediate_size = feedforward_intermediate_size
    self.feedforward_intermediate_act = feedforward_intermediate_act
    self.feedforward_intermediate_dropout_prob = feedforward_intermediate_dropout_prob
    self.moe_num_experts = moe_num_experts
    self.moe_intermediate_size = moe_intermediate_size
    self.type_vocab_size = type_vocab_size
    self.initializer_range = initializer_range
    _check_choice("position_signal", position_signal, _POSITION_SIGNALS)
    _check_choice("residual_structure", residual_structure, _RESIDUAL_STRUCTURES)

  @classmethod
  def from_dict(cls, json_object: Dict) -> "BertConfig":
    """A config from a dict; Google BERT names (hidden_size, ...) are accepted.

    Example:
      >>> BertConfig.from_dict({"vocab_size": 99, "num_hidden_layers": 2}).num_blocks
      2
    """
    config = cls(vocab_size=None)
    known = set(config.__dict__)
    for key, value in json_object.items():
      name = _CONFIG_ALIASES.get(key, key)
      if name not in known:
        raise ValueError(
            f"BertConfig: unknown field {key!r}; known fields are {sorted(known)} "
            f"(and the Google BERT names {sorted(_CONFIG_ALIASES)}).")
      if name == "block_layers" and isinstance(value, str):
        value = value.split(",")
      config.__dict__[name] = value
    _check_choice("position_signal", config.position_signal, _POSITION_SIGNALS)
    _check_choice("residual_structure", config.residual_structure, _RESIDUAL_STRUCTURES)
    return config

  @classmethod
  def from_json_file(cls, json_file: str) -> "BertConfig":
    """A config from a JSON file (see `from_dict`).

    Example:
      >>> config = BertConfig.from_json_file("bert_config.json")
    """
    try:
      with tf.io.gfile.GFile(json_file, "r") as reader:
        text = reader.read()
    except tf.errors.NotFoundError:
      raise FileNotFoundError(f"BERT config file {json_file} does not exist.") from None
    try:
      values = json.loads(text)
    except ValueError as e:
      raise ValueError(f"BERT config file {json_file} is not valid JSON: {e}") from None
    if not isinstance(values, dict):
      raise ValueError(f"BERT config file {json_file} must hold a JSON object.")
    return cls.from_dict(values)

  def to_dict(self) -> Dict:
    """The fields as a (deep-copied) dict.

    Example:
      >>> BertConfig(vocab_size=10).to_dict()["vocab_size"]
      10
    """
    return copy.deepcopy(self.__dict__)

  def to_json_string(self) -> str:
    """The fields as indented, key-sorted JSON (ends with a newline).

    Example:
      >>> text = BertConfig(vocab_size=10).to_json_string()
    """
    return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"


def _check_choice(field: str, value, choices) -> None:
  if value not in choices:
    raise ValueError(f"BertConfig: {field}={value!r} is not one of {list(choices)}.")


class BertModel:
  """The BERT encoder with embeddings and pooler, on mtf Tensors.

  Args:
    config: a `BertConfig`.
    is_training: apply dropout (False sets every dropout rate to zero).
    input_ids: int32 mtf Tensor [batch, seq] of wordpiece ids.
    input_mask: optional int32/float mtf Tensor [batch, seq]; 1 for real
      tokens, 0 for padding (padding is not attended to).
    token_type_ids: optional int32 mtf Tensor [batch, seq] (default zeros).
    scope: variable scope of the encoder (default "bert").
    mesh_shape: mesh shape, used only by "moe" layers.
    layout: layout rules, used only by "moe" layers.

  Example:
    >>> model = BertModel(config, True, ids, input_mask=mask, token_type_ids=types)
    >>> loss, _, _ = model.get_masked_lm_output(positions, label_ids, label_weights)
  """

  def __init__(self, config: BertConfig, is_training: bool, input_ids: mtf.Tensor,
               input_mask: Optional[mtf.Tensor] = None,
               token_type_ids: Optional[mtf.Tensor] = None,
               scope: Optional[str] = None, mesh_shape="", layout=""):
    self.config = copy.deepcopy(config)
    del config
    self._check_config()
    self._is_training = bool(is_training)
    if not is_training:
      self.config.layer_output_dropout_prob = 0.0
      self.config.attention_probs_dropout_prob = 0.0
      self.config.feedforward_intermediate_dropout_prob = 0.0
    if not isinstance(input_ids, mtf.Tensor) or input_ids.shape.ndims != 2:
      raise ValueError(f"BertModel: input_ids must be an mtf Tensor [batch, seq], got "
                       f"{getattr(input_ids, 'shape', input_ids)}.")
    input_shape = input_ids.shape
    self._seq_dim = input_shape.dims[1]
    self._memory_seq_dim = mtf.Dimension("memory_seq", self._seq_dim.size)
    self._extra_losses: List[mtf.Tensor] = []
    for name, t in (("input_mask", input_mask), ("token_type_ids", token_type_ids)):
      if t is not None and t.shape != input_shape:
        raise ValueError(f"BertModel: {name} has shape {t.shape}; it must match input_ids "
                         f"{input_shape}.")
    if (self.config.position_signal == "embedding"
        and self._seq_dim.size > self.config.max_position_embeddings):
      raise ValueError(
          f"BertModel: sequence length {self._seq_dim.size} exceeds "
          f"max_position_embeddings={self.config.max_position_embeddings}; shorten the "
          "sequences or raise max_position_embeddings.")
    mesh = input_ids.mesh
    if token_type_ids is None:
      token_type_ids = mtf.zeros(mesh, input_shape, dtype=tf.int32)

    with tf.compat.v1.variable_scope(scope or "bert"):
      with tf.compat.v1.variable_scope("embeddings"):
        self.embedding_table = mtf.get_variable(
            mesh, "word_embeddings", mtf.Shape([self.vocab_dim, self.model_dim]),
            initializer=self.embedding_initializer)
        self.word_embedding_output = mtf.gather(self.embedding_table, input_ids,
                                                self.vocab_dim)
        output = self.word_embedding_output
        token_type_table = mtf.get_variable(
            mesh, "token_type_embeddings",
            mtf.Shape([self.token_type_vocab_dim, self.model_dim]),
            initializer=self.embedding_initializer)
        output += mtf.gather(token_type_table, token_type_ids, self.token_type_vocab_dim)
        if self.config.position_signal == "embedding":
          position_table = mtf.get_variable(
              mesh, "position_embeddings",
              mtf.Shape([self.max_position_embeddings_dim, self.model_dim]),
              initializer=self.embedding_initializer)
          positions = mtf.slice(position_table, 0, self.seq_dim.size,
                                self.max_position_embeddings_dim.name)
          output += mtf.rename_dimension(positions, self.max_position_embeddings_dim.name,
                                         self.seq_dim.name)
        output = self.normalize(output)
        self.embedding_output = self._dropout(output, self.config.layer_output_dropout_prob)

      with tf.compat.v1.variable_scope("encoder"):
        biases = []
        if input_mask is not None:
          memory_mask = mtf.replace_dimensions(input_mask, self.seq_dim, self.memory_seq_dim)
          biases.append((1.0 - mtf.to_float(memory_mask)) * -10000.0)
        if self.config.position_signal == "relative_attention_bias":
          buckets_dim = mtf.Dimension("buckets", 32)
          relative = (mtf.mtf_range(mesh, self.memory_seq_dim, tf.int32)
                      - mtf.mtf_range(mesh, self.seq_dim, tf.int32))
          bucket = _relative_position_bucket(relative, num_buckets=buckets_dim.size)
          table = mtf.get_variable(mesh, "relative_attention_bias",
                                   [self.num_heads_dim, buckets_dim],
                                   initializer=tf.zeros_initializer())
          biases.append(mtf.gather(table, bucket, buckets_dim))
        attention_bias = mtf.add_n(biases) if biases else None
        x = self.embedding_output
        self.all_encoder_layers = []
        for block in range(self.config.num_blocks):
          with tf.compat.v1.variable_scope(f"block_{block}"):
            for index, layer_type in enumerate(self.config.block_layers):
              earlier = self.config.block_layers[:index].count(layer_type)
              layer_name = f"{layer_type}_{earlier}" if earlier else layer_type
              with tf.compat.v1.variable_scope(layer_name):
                y = self.normalize(x) if self.config.residual_structure == "direct" else x
                if layer_type == "attention":
                  y = self.self_attention(y, attention_bias)
                elif layer_type == "feedforward":
                  y = self.feedforward(y)
                else:
                  y = self.moe(y, layout, mesh_shape, input_mask, self._is_training)
                y = self._dropout(y, self.config.layer_output_dropout_prob)
                x = x + y
                if self.config.residual_structure == "original":
                  x = self.normalize(x)
          self.all_encoder_layers.append(x)
        self.sequence_output = x
        if self.config.residual_structure == "direct":
          self.sequence_output = self.normalize(self.sequence_output)

      with tf.compat.v1.variable_scope("pooler"):
        # The pooled output is a dense tanh layer over the first ([CLS]) token.
        first_token = mtf.gather(self.sequence_output, 0, self.seq_dim)
        self.pooled_output = mtf.layers.dense(
            first_token, reduced_dims=[self.model_dim], new_dims=[self.model_dim],
            activation=mtf.tanh, kernel_initializer=self.dense_initializer,
            use_bias=self.config.use_bias, name="dense")

  # ---- layers ----------------------------------------------------------------
  def _check_config(self) -> None:
    c = self.config
    if not c.vocab_size or c.vocab_size < 1:
      raise ValueError(f"BertModel: config.vocab_size must be a positive integer, got "
                       f"{c.vocab_size!r}.")
    unknown = [t for t in c.block_layers if t not in _LAYER_TYPES]
    if unknown:
      raise ValueError(f"BertModel: config.block_layers has unknown layer types {unknown}; "
                       f"use {list(_LAYER_TYPES)}.")
    get_activation(c.feedforward_intermediate_act)  # fails early on a bad name
    self.size_per_head_dim  # pylint: disable=pointless-statement  (checks divisibility)

  def _dropout(self, x: mtf.Tensor, rate: float) -> mtf.Tensor:
    if not self._is_training or not rate:
      return x
    return mtf.dropout(x, True, rate=rate)

  def self_attention(self, x: mtf.Tensor, attention_bias: Optional[mtf.Tensor]) -> mtf.Tensor:
    """Multi-head self-attention with its output projection.

    Args:
      x: [batch, seq, hidden].
      attention_bias: None or a float Tensor broadcastable to
        [batch, num_heads, seq, memory_seq], added to the attention logits.

    Returns:
      a Tensor of x's shape.

    Example:
      >>> y = model.self_attention(x, None)
    """
    heads = [self.num_heads_dim, self.size_per_head_dim]
    memory = mtf.replace_dimensions(x, self.seq_dim, self.memory_seq_dim)

    def project(t, name):
      return mtf.layers.dense(t, reduced_dims=[self.model_dim], new_dims=heads,
                              kernel_initializer=self.dense_initializer, name=name,
                              use_bias=self.config.use_bias)
    queries = project(x, "query")
    keys = project(memory, "key")
    values = project(memory, "value")
    scores = mtf.einsum([queries, keys], reduced_dims=[self.size_per_head_dim])
    scores *= self.size_per_head_dim.size ** -0.5
    if attention_bias is not None:
      scores += attention_bias
    probs = mtf.softmax(scores, self.memory_seq_dim)
    probs = self._dropout(probs, self.config.attention_probs_dropout_prob)
    context = mtf.einsum([probs, values], reduced_dims=[self.memory_seq_dim])
    output = mtf.layers.dense(context, reduced_dims=heads, new_dims=[self.model_dim],
                              kernel_initializer=self.dense_initializer, name="output",
                              use_bias=self.config.use_bias)
    return mtf.transpose(output, x.shape)

  def feedforward(self, x: mtf.Tensor) -> mtf.Tensor:
    """The position-wise feed-forward layer (dense_1 with activation, dense_2).

    Example:
      >>> y = model.feedforward(x)
    """
    hidden = mtf.layers.dense(
        x, reduced_dims=[self.model_dim], new_dims=[self.feedforward_intermediate_dim],
        activation=get_activation(self.config.feedforward_intermediate_act),
        kernel_initializer=self.dense_initializer, name="dense_1",
        use_bias=self.config.use_bias)
    hidden = self._dropout(hidden, self.config.feedforward_intermediate_dropout_prob)
    return mtf.layers.dense(
        hidden, reduced_dims=[self.feedforward_intermediate_dim], new_dims=[self.model_dim],
        kernel_initializer=self.dense_initializer, name="dense_2",
        use_bias=self.config.use_bias)

  def moe(self, x: mtf.Tensor, layout, mesh_shape, input_mask: Optional[mtf.Tensor],
          is_training: bool) -> mtf.Tensor:
    """A top-2 mixture-of-experts layer (its load-balancing loss goes to
    `get_extra_loss`).

    Example:
      >>> y = model.moe(x, "batch:rows", "rows:2", mask, True)
    """
    from mesh_tensorflow.transformer import moe as moe_lib  # pylint: disable=g-import-not-at-top
    hparams = moe_lib.HParams(
        moe_gating="top_2", moe_num_experts=self.config.moe_num_experts,
        moe_loss_coef=1e-3, moe_hidden_size=self.config.moe_intermediate_size,
        moe_group_size=2048, moe_capacity_factor_train=1.25,
        moe_capacity_factor_eval=8.0, moe_use_second_place_loss=False,
        moe_second_policy_train="random", moe_second_policy_eval="random",
        moe_second_threshold_train=0.2, moe_second_threshold_eval=0.2)
    nonpadding = mtf.cast(input_mask, tf.float32) if input_mask is not None else None
    output, loss = moe_lib.transformer_moe_layer_v1(
        inputs=x, output_dim=self.model_dim, hparams=hparams, train=is_training,
        variable_dtype=mtf.VariableDType(tf.float32), layout=layout,
        mesh_shape=mesh_shape, nonpadding=nonpadding,
        activation=get_activation(self.config.feedforward_intermediate_act))
    self._extra_losses.append(loss)
    return output

  # ---- heads -------------------------------------------------------------------
  def get_masked_lm_output(self, positions: mtf.Tensor, label_ids: mtf.Tensor,
                           label_weights: mtf.Tensor
                           ) -> Tuple[mtf.Tensor, mtf.Tensor, mtf.Tensor]:
    """Masked language model loss (weighted mean), per-example loss and logits.

    Args:
      positions: int32 [batch, max_pred_seq] positions of the masked tokens.
      label_ids: int32 [batch, max_pred_seq] their original ids.
      label_weights: float [batch, max_pred_seq], 0 for padding predictions.

    Returns:
      (loss, per_example_loss [batch, max_pred_seq], logits [..., vocab]).

    Example:
      >>> loss, per_example, logits = model.get_masked_lm_output(pos, ids, weights)
    """
    x = mtf.gather(self.get_sequence_output(), positions, self.seq_dim)
    with tf.compat.v1.variable_scope("cls/predictions"):
      with tf.compat.v1.variable_scope("transform"):
        x = mtf.layers.dense(
            x, reduced_dims=[self.model_dim], new_dims=[self.model_dim],
            activation=get_activation(self.config.feedforward_intermediate_act),
            kernel_initializer=self.dense_initializer, use_bias=self.config.use_bias,
            name="dense")
        x = self.normalize(x)
      # Output weights are the input embeddings; the bias is output-only.
      output_bias = mtf.get_variable(x.mesh, "output_bias", [self.vocab_dim],
                                     initializer=tf.zeros_initializer())
      logits = mtf.einsum([x, self.get_embedding_table()],
                          reduced_dims=[self.model_dim]) + output_bias
      per_example_loss = mtf.layers.softmax_cross_entropy_with_logits(
          logits, label_ids, self.vocab_dim, z_loss=1e-4)
      label_weights = mtf.to_float(label_weights)
      numerator = mtf.reduce_sum(label_weights * per_example_loss)
      denominator = mtf.reduce_sum(label_weights) + 1e-5
      loss = numerator / denominator
    return loss, per_example_loss, logits

  def get_next_sentence_output(self, labels: mtf.Tensor
                               ) -> Tuple[mtf.Tensor, mtf.Tensor, mtf.Tensor]:
    """Next-sentence prediction: (mean loss, per-example loss, logits [batch, class]).

    Label 0 means "B follows A", 1 means "B is a random sentence".

    Example:
      >>> loss, per_example, logits = model.get_next_sentence_output(labels)
    """
    class_dim = mtf.Dimension("class", 2)
    logits = mtf.layers.dense(
        self.get_pooled_output(), reduced_dims=[self.model_dim], new_dims=[class_dim],
        kernel_initializer=self.dense_initializer, name="cls/seq_relationship",
        use_bias=self.config.use_bias)
    per_example_loss = mtf.layers.softmax_cross_entropy_with_logits(
        logits, labels, class_dim, z_loss=1e-4)
    return mtf.reduce_mean(per_example_loss), per_example_loss, logits

  # ---- accessors -----------------------------------------------------------------
  def get_pooled_output(self) -> mtf.Tensor:
    """[batch, hidden]: tanh(dense) of the first token's final hidden state."""
    return self.pooled_output

  def get_sequence_output(self) -> mtf.Tensor:
    """[batch, seq, hidden]: the encoder's final hidden states."""
    return self.sequence_output

  def get_all_encoder_layers(self) -> List[mtf.Tensor]:
    """The output of every block, [batch, seq, hidden] each."""
    return self.all_encoder_layers

  def get_word_embedding_output(self) -> mtf.Tensor:
    """[batch, seq, hidden]: the wordpiece embeddings alone (before positions,
    token types and the layer norm)."""
    return self.word_embedding_output

  def get_embedding_output(self) -> mtf.Tensor:
    """[batch, seq, hidden]: the encoder's input (word + token type + position
    embeddings, layer-normalized, with dropout)."""
    return self.embedding_output

  def get_embedding_table(self) -> mtf.Tensor:
    """[vocab, hidden]: the wordpiece embedding variable."""
    return self.embedding_table

  def get_extra_loss(self) -> mtf.Tensor:
    """Sum of the auxiliary losses ("moe" load balancing); zero without any."""
    if not self._extra_losses:
      return mtf.zeros(self.embedding_table.mesh, mtf.Shape([]), dtype=tf.float32)
    return mtf.add_n(self._extra_losses)

  def normalize(self, x: mtf.Tensor) -> mtf.Tensor:
    """The model's layer norm over hidden (see `layer_norm`)."""
    return layer_norm(x, self.model_dim, subtract_mean=self.config.use_bias,
                      use_bias=self.config.use_bias)

  # ---- dimensions and initializers -------------------------------------------------
  @property
  def vocab_dim(self) -> mtf.Dimension:
    n = self.config.vocab_size
    return mtf.Dimension("vocab", n + (-n % 128))

  @property
  def model_dim(self) -> mtf.Dimension:
    return mtf.Dimension("hidden", self.config.d_model)

  @property
  def token_type_vocab_dim(self) -> mtf.Dimension:
    return mtf.Dimension("token_type_vocab", self.config.type_vocab_size)

  @property
  def feedforward_intermediate_dim(self) -> mtf.Dimension:
    return mtf.Dimension("intermediate", self.config.feedforward_intermediate_size)

  @property
  def num_heads_dim(self) -> mtf.Dimension:
    return mtf.Dimension("num_heads", self.config.attention_num_heads)

  @property
  def softmax_heads_dims(self) -> mtf.Dimension:
    return self.num_heads_dim

  @property
  def max_position_embeddings_dim(self) -> mtf.Dimension:
    return mtf.Dimension("max_position_embeddings", self.config.max_position_embeddings)

  @property
  def seq_dim(self) -> mtf.Dimension:
    return self._seq_dim

  @property
  def memory_seq_dim(self) -> mtf.Dimension:
    return self._memory_seq_dim

  @property
  def dense_initializer(self):
    """Truncated normal with stddev initializer_range (layout-invariant: each
    value is a hash of the variable name and index), or variance scaling 0.4."""
    if self.config.initializer_range:
      return mtf.initializers.truncated_normal(stddev=self.config.initializer_range)
    return mtf.initializers.VarianceScalingInitializer(scale=0.4)

  @property
  def embedding_initializer(self):
    initializer = self.dense_initializer
    if isinstance(initializer, mtf.initializers.VarianceScalingInitializer):
      # The embedding is also the masked-LM output matrix: scale it as one.
      return initializer.for_dims([self.model_dim], [self.vocab_dim])
    return initializer

  @property
  def size_per_head_dim(self) -> mtf.Dimension:
    size = self.config.attention_head_size
    if not size:
      if self.config.d_model % self.config.attention_num_heads:
        raise ValueError(
            f"BertModel: d_model={self.config.d_model} is not a multiple of "
            f"attention_num_heads={self.config.attention_num_heads}; change one or set "
            "attention_head_size.")
      size = self.config.d_model // self.config.attention_num_heads
    return mtf.Dimension("attention_head", size)

  def _configured_dim(self, field: str, name: str) -> mtf.Dimension:
    """Dimension `name` of the size config.`field`, which must be set."""
    size = getattr(self.config, field)
    if size is None:
      raise ValueError(f"BertModel: config.{field} is not set.")
    return mtf.Dimension(name, size)

  key_dim = property(lambda self: self._configured_dim("attention_key_head_size", "d_k"))
  key_heads_dims = property(
      lambda self: self._configured_dim("attention_num_key_heads", "key_heads"))
  value_dim = property(lambda self: self._configured_dim("attention_value_head_size", "d_v"))
  value_heads_dims = property(
      lambda self: self._configured_dim("attention_num_value_heads", "value_heads"))


def get_activation(activation_string):
  """The mtf activation for a name ("gelu", "relu", "tanh"; "linear", "" or
  None give None); a non-string is returned unchanged.

  Example:
    >>> get_activation("gelu") is mtf.gelu
    True
  """
  if not isinstance(activation_string, str):
    return activation_string
  if not activation_string:
    return None
  name = activation_string.lower()
  table = {"linear": None, "gelu": mtf.gelu, "relu": mtf.relu, "tanh": mtf.tanh}
  if name not in table:
    raise ValueError(f"Unsupported activation: {activation_string!r}; use one of "
                     f"{sorted(table)}.")
  return table[name]


def get_assignment_map_from_checkpoint(tvars, init_checkpoint: str
                                       ) -> Tuple[Dict[str, str], Dict[str, int]]:
  """Which variables a checkpoint can initialize.

  Args:
    tvars: variables (anything with a `.name`: mtf Variable operations, mtf
      Tensors or tf.Variables); names ending in ":0" are stripped, and
      optimizer state (global_step, adam_*, slot_*) is skipped.
    init_checkpoint: a checkpoint path (or a directory with one) written by
      this library or in the name-based TF1 format (compat.original_checkpoint).

  Returns:
    (assignment_map {checkpoint name: variable name}, initialized names, each
    also with ":0" appended, mapped to 1).

  Example:
    >>> amap, names = get_assignment_map_from_checkpoint(
    ...     graph.trainable_variables, "/tmp/bert/ckpt-100")
  """
  wanted = collections.OrderedDict()
  for var in tvars:
    name = var.name
    match = re.match(r"^(.*):\d+$", name)
    if match:
      name = match.group(1)
    if "global_step" in name or "adam_" in name or "slot_" in name:
      continue
    wanted[name] = var
  from mesh_tensorflow.training import checkpoint as checkpoint_lib  # pylint: disable=g-import-not-at-top
  try:
    stored = [name for name, _, _ in checkpoint_lib.list_variables(init_checkpoint)]
  except ValueError as e:
    raise ValueError(f"init_checkpoint {init_checkpoint}: no readable checkpoint ({e}).") \
        from None
  assignment_map = collections.OrderedDict()
  initialized = {}
  for name in stored:
    if name in wanted:
      assignment_map[name] = name
      initialized[name] = 1
      initialized[name + ":0"] = 1
  return assignment_map, initialized


def layer_norm(x: mtf.Tensor, dim: mtf.Dimension, epsilon: float = 1e-6,
               subtract_mean: bool = True, use_scale: bool = True, use_bias: bool = True,
               name: Optional[str] = None) -> mtf.Tensor:
  """Layer normalization of x over `dim`.

  Variables "<name>/scale" and "<name>/bias" of shape [dim]; without a name
  the first free one of "layer_norm", "layer_norm_1", ... in the current
  variable scope is used.

  Args:
    x: an mtf Tensor with dimension dim.
    dim: the dimension to normalize over.
    epsilon: added to the variance.
    subtract_mean: center x first (else only divide by the root mean square).
    use_scale: multiply by a learned scale (initially one).
    use_bias: add a learned bias (initially zero).
    name: variable scope name.

  Returns:
    a Tensor of x's shape.

  Example:
    >>> y = layer_norm(x, mtf.Dimension("hidden", 768))
  """
  if dim not in x.shape.dims:
    raise ValueError(f"layer_norm: {x.name} has shape {x.shape}, without dimension {dim}.")
  if name is None:
    name = _free_scope_name(x.mesh, "layer_norm")
  with tf.compat.v1.variable_scope(name):
    if subtract_mean:
      x -= mtf.reduce_mean(x, reduced_dim=dim)
    variance = mtf.reduce_mean(mtf.square(x), reduced_dim=dim)
    if use_scale:
      scale = mtf.get_variable(x.mesh, "scale", mtf.Shape([dim]),
                               initializer=tf.ones_initializer(), activation_dtype=x.dtype)
      x = mtf.layers.scale_normalized(x, mtf.rsqrt(variance + epsilon), scale)
    else:
      x *= mtf.rsqrt(variance + epsilon)
    if use_bias:
      x += mtf.get_variable(x.mesh, "bias", mtf.Shape([dim]),
                            initializer=tf.zeros_initializer(), activation_dtype=x.dtype)
  return x


def _free_scope_name(mesh: mtf.Mesh, base: str) -> str:
  scope = tf.compat.v1.get_variable_scope().name
  taken = mesh.graph.name_to_variable
  index = 0
  while True:
    name = base if index == 0 else f"{base}_{index}"
    prefix = "/".join(p for p in [scope, name] if p) + "/"
    if not any(k.startswith(prefix) for k in taken):
      return name
    index += 1
