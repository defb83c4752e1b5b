"""Layout report: text, PNG, the report CLI and the transformer CLI's flag."""

import numpy as np
import pytest

import mesh_tensorflow as mtf
from mesh_tensorflow import report as report_cli
from mesh_tensorflow.analysis.layout_report import LayoutReport

PIL_image = pytest.importorskip("PIL.Image")
pytest.importorskip("matplotlib")

SMALL = ["run.batch_size = 8", "run.sequence_length = {'inputs': 16, 'targets': 16}",
         "num_layers = 1"]


def mlp_graph():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  b, f = mtf.Dimension("batch", 16), mtf.Dimension("features", 8)
  h, c = mtf.Dimension("hidden", 64), mtf.Dimension("classes", 4)
  x = mtf.import_tf_tensor(mesh, np.ones((16, 8), np.float32), [b, f])
  y = mtf.import_tf_tensor(mesh, np.zeros((16,), np.int32), [b])
  w1 = mtf.get_variable(mesh, "w1", [f, h])
  w2 = mtf.get_variable(mesh, "w2", [h, c])
  logits = mtf.einsum([mtf.relu(mtf.einsum([x, w1], output_shape=[b, h])), w2],
                      output_shape=[b, c])
  loss = mtf.reduce_mean(mtf.layers.softmax_cross_entropy_with_logits(logits, y, c))
  grads = mtf.gradients([loss], [w1, w2])
  mtf.optimize.SgdOptimizer(0.1).apply_grads(grads, graph.trainable_variables)
  return graph


def test_report_text_lists_splits_ops_and_memory():
  report = mtf.layout_report(mlp_graph(), "rows:2;cols:4", "batch:rows;hidden:cols")
  assert isinstance(report, LayoutReport)
  text = str(report)
  assert "mesh 'rows:2;cols:4' (8 processors), layout 'batch:rows;hidden:cols'" in text
  assert "[var] w1" in text and "hidden->cols" in text
  w1 = next(s for s in report.tensors if s.name == "w1")
  assert w1.layout == (None, "cols") and w1.slice_shape == (8, 16)
  assert w1.slice_bytes == 8 * 16 * 4
  assert "Memory per processor: variables" in text
  assert "allreduce[rows]" in text  # the weight gradients, summed over the batch rows
  comm = report.comm_by_mesh_dim()
  assert comm["rows"]["allreduce"] > 0
  assert report.tensors[0].full_bytes >= report.tensors[-1].full_bytes


def test_report_header_names_the_parameters_and_their_preset():
  header = {p: str(mtf.layout_report(mlp_graph(), "rows:2;cols:4", "batch:rows", params=p)
                   ).splitlines()[1] for p in ("gpu", "h100", "cpu")}
  assert "with 'gpu' parameters (the a100-80gb preset);" in header["gpu"]
  assert "with 'h100-sxm' parameters;" in header["h100"]
  assert "with 'cpu' parameters;" in header["cpu"]


def test_report_rejects_illegal_layouts_by_name():
  with pytest.raises(ValueError, match="does not divide dimension 'classes'"):
    mtf.layout_report(mlp_graph(), "all:8", "classes:all")


def _check_png(path):
  image = PIL_image.open(path).convert("RGB")
  width, height = image.size
  assert width >= 400 and height >= 300
  pixels = np.asarray(image).reshape(-1, 3)
  assert pixels.std() > 20  # not blank
  assert len(np.unique(pixels[::7], axis=0)) > 20  # many colours: cells, bars, text


def test_png_is_written_and_not_blank(tmp_path):
  report = mtf.layout_report(mlp_graph(), "rows:2;cols:4", "batch:rows;hidden:cols")
  path = report.to_png(str(tmp_path / "layout.png"))
  _check_png(path)


def test_report_cli_builds_the_gin_transformer(tmp_path, capsys):
  png = tmp_path / "cli.png"
  argv = ["--gin_file=models/tiny_lm.gin", "--gin_file=layouts/2x4.gin", f"--png={png}"]
  argv += [f"--gin_param={p}" for p in SMALL]
  assert report_cli.main(argv) == 0
  out = capsys.readouterr().out
  assert "Layout report: mesh 'rows:2;cols:4'" in out
  assert "d_ff->cols" in out and "batch->rows" in out
  assert "Operations (the" in out and "wrote" in out
  _check_png(png)
  # The config's own layout splits 'experts', which this model lacks: no
  # note for it (a config's layout may serve several models).
  assert "note:" not in out


def test_report_cli_notes_a_layout_rule_that_splits_nothing(capsys):
  argv = ["--gin_file=models/tiny_lm.gin", "--layout=batch:rows;dff:cols"]
  argv += [f"--gin_param={p}" for p in SMALL]
  assert report_cli.main(argv) == 0
  notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
  assert notes == ["note: layout rule 'dff:cols' splits nothing: no tensor of this model has a "
                   "dimension 'dff' (did you mean 'd_ff'?)"]


def test_report_cli_auto_and_bad_flags(capsys):
  argv = ["--gin_file=models/tiny_lm.gin", "--mesh_shape=all:8", "--auto"]
  argv += [f"--gin_param={p}" for p in SMALL]
  assert report_cli.main(argv) == 0
  out = capsys.readouterr().out
  assert "auto_mtf (" in out and "picked mesh 'all:8'" in out
  assert report_cli.main(["--gin_file=models/tiny_lm.gin", "--layout=batch:nope"]) == 2
  assert "mesh dimension 'nope'" in capsys.readouterr().err


def test_report_of_the_configured_transformer(capsys):
  """What `mesh_tensorflow.transformer.main --print_layout_report` prints (the
  flag itself is exercised in tests/transformer/test_transformer_cli.py: importing main
  here would define its absl flags in the test process)."""
  from mesh_tensorflow.transformer import gin_config
  gin_config.parse(["models/tiny_lm.gin"], SMALL)
  text = str(report_cli.report_for_current_config())
  assert "layout 'batch:rows;d_ff:cols;heads:cols;experts:rows'" in text


def test_report_prices_the_configured_zero_stage():
  from mesh_tensorflow.transformer import gin_config
  reports = []
  for stage in (0, 2, 3):
    gin_config.parse(["models/tiny_lm.gin"], SMALL + [f"run.zero_stage = {stage}"])
    reports.append(report_cli.report_for_current_config())
  texts = [str(r) for r in reports]
  assert "zero_rows:rows" not in texts[0] and "reduce_scatter" not in texts[0]
  # Stage 2: the gradients reduce-scattered, the updated values all-gathered.
  assert "layout 'batch:rows;d_ff:cols;heads:cols;experts:rows;zero_rows:rows'" in texts[1]
  assert "reduce_scatter" in texts[1] and "allgather" in texts[1]
  mem = [r.estimate.memory for r in reports]
  assert mem[1].slots < mem[0].slots and mem[1].variables == mem[0].variables
  # Stage 3: the variables stored split over rows (2 ways) too.
  assert mem[2].variables < mem[1].variables


def test_report_auto_says_the_configured_zero_stage_is_not_applied(capsys):
  argv = ["--gin_file=models/tiny_lm.gin", "--mesh_shape=all:8", "--auto",
          "--gin_param=run.zero_stage = 2"]
  argv += [f"--gin_param={p}" for p in SMALL]
  assert report_cli.main(argv) == 0
  out = capsys.readouterr().out
  assert "run.zero_stage = 2 is not applied here" in out
  assert "zero_all" not in out


def test_report_prices_products_at_the_activation_dtypes_rate_as_plan_does():
  from mesh_tensorflow.transformer import gin_config
  rates, notes = {}, {}
  for dtype in ("float32", "bfloat16"):
    gin_config.parse(["models/tiny_lm.gin"], SMALL + [f"run.activation_dtype = '{dtype}'"])
    report = report_cli.report_for_current_config(params="gpu")
    rates[dtype] = report.estimate.params.flops_per_s
    notes[dtype] = report.notes
  # float32 on an A100 runs at the TF32 rate, half the bfloat16 peak.
  assert rates["float32"] == pytest.approx(rates["bfloat16"] / 2)
  assert any("float32 products priced at 156 TFLOP/s" in n for n in notes["float32"])
  assert not notes["bfloat16"]
  gin_config.parse(["models/tiny_lm.gin"], SMALL)
  assert not report_cli.report_for_current_config(params="cpu").notes
  gin_config.parse(["models/tiny_lm.gin"], SMALL + ["run.activation_dtype = 'float16'"])
  with pytest.raises(ValueError, match="TPUs compute in float32 and bfloat16 only"):
    report_cli.report_for_current_config(params="tpu-v4")
