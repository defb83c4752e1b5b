"""The documentation site builds without warnings, and its generated tables
(every command's flags, the `run.*` gin parameters, the coverage of the
original's names, setup.py's requirements) equal what the code says.

Building the site imports every module of the API reference (autodoc) and
reads every page; it runs as users run it, `sphinx-build -W -n` in a
subprocess, into a temporary directory.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

import mtf_test_utils

ROOT = pathlib.Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.xdist_group("docs_site")


@pytest.fixture(scope="module")
def docgen():
  return mtf_test_utils.import_script("docgen", "docs", "_ext", "docgen.py")


@pytest.fixture(scope="module")
def generated(docgen):
  return docgen.generated_files()


def test_generated_tables_match_the_code(generated):
  stale = [str(path.relative_to(ROOT)) for path, text in generated.items()
           if not path.exists() or path.read_text() != text]
  assert not stale, f"out of date: {stale}; run python docs/_ext/docgen.py"


def test_command_tables_list_every_defined_flag(generated):
  """The generator finds each command's flags: every flag the command's source
  defines (DEFINE_* or add_argument) is a row of its section."""
  page = generated[ROOT / "docs" / "reference" / "commands.md"]
  sections = dict(re.findall(r"^## `python -m ([\w.]+)`\n(.*?)(?=^## |\Z)", page, re.M | re.S))
  sources = {
      "mesh_tensorflow.transformer.main": "mesh_tensorflow/transformer/main.py",
      "mesh_tensorflow.check_devices": "mesh_tensorflow/check_devices.py",
      "mesh_tensorflow.report": "mesh_tensorflow/transformer/report.py",
      "mesh_tensorflow.launch": "mesh_tensorflow/distributed/launch.py",
      "mesh_tensorflow.inspect_checkpoint": "mesh_tensorflow/inspect_checkpoint.py",
      "mesh_tensorflow.export_original_checkpoint": "mesh_tensorflow/export_original_checkpoint.py",
      "mesh_tensorflow.analysis.cost_model": "mesh_tensorflow/analysis/cost_model/calibration.py",
      "mesh_tensorflow.plan": "mesh_tensorflow/plan.py",
  }
  assert set(sections) == set(sources)
  for command, source in sources.items():
    text = (ROOT / source).read_text()
    defined = set(re.findall(r"DEFINE_\w+\(\s*[\"'](\w+)[\"']", text))
    defined |= set(re.findall(r"add_argument\(\s*[\"']--(\w+)[\"']", text))
    if "define_gin_flags()" in text:  # the gin flags, defined in cli for the program
      from mesh_tensorflow import cli  # pylint: disable=g-import-not-at-top
      defined |= set(cli.GIN_FLAG_HELP)
    assert defined, command
    listed = set(re.findall(r"^\| `--(?:\[no\])?(\w+)`", sections[command], re.M))
    assert listed == defined, f"{command}: table {sorted(listed)} vs source {sorted(defined)}"
  assert "`--cpu_devices` | int | `8`" in sections["mesh_tensorflow.transformer.main"]


def test_every_command_is_in_the_reference(generated):
  """Each `python -m mesh_tensorflow...` entry point of this library (a module
  with a __main__ block) has its section; the original's BERT and U-Net
  programs are documented on their own pages."""
  page = generated[ROOT / "docs" / "reference" / "commands.md"]
  documented = set(re.findall(r"^## `python -m ([\w.]+)`", page, re.M))
  aliases = {"mesh_tensorflow.distributed.launch": "mesh_tensorflow.launch"}
  found = set()
  for path in (ROOT / "mesh_tensorflow").rglob("*.py"):
    if '__name__ == "__main__"' not in path.read_text():
      continue
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    module = module.removesuffix(".__main__")
    if module.startswith(("mesh_tensorflow.bert.", "mesh_tensorflow.experimental.")) or (
        module == "mesh_tensorflow.cli"):
      continue
    found.add(aliases.get(module, module))
  assert found - documented == set(), (
      f"commands without a flag table: {sorted(found - documented)}; add them to "
      "COMMANDS in docs/_ext/docgen.py and run it")


def test_run_parameter_table_has_every_parameter(generated):
  import inspect  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import utils  # pylint: disable=g-import-not-at-top
  page = generated[ROOT / "docs" / "reference" / "run_parameters.md"]
  for name in inspect.signature(inspect.unwrap(utils.run)).parameters:
    assert f"`{name}`" in page, name
  # The function's default and the value defaults.gin gives the main job.
  assert re.search(r"^\| `train_steps` \| `1000` \| `400` \|", page, re.M)


def test_a_stale_table_is_reported(docgen, tmp_path):
  page = "intro\n<!-- generated: t -->\nold\n<!-- end generated: t -->\nrest\n"
  assert docgen._replace_between(page, "t", "new") == (  # pylint: disable=protected-access
      "intro\n<!-- generated: t -->\nnew\n<!-- end generated: t -->\nrest\n")
  with pytest.raises(ValueError, match="no <!-- generated: u -->"):
    docgen._replace_between(page, "u", "new")  # pylint: disable=protected-access
  messages = []
  assert docgen.main(["--check"], write=messages.append) == 0, messages


def test_docstring_markup_is_escaped():
  conf = mtf_test_utils.import_script("docs_conf", "docs", "conf.py")
  assert conf._escape_markup("x * y | z, `a*b`") == "x \\* y \\| z, `a*b`"  # pylint: disable=protected-access
  assert conf._escape_markup("* a `Dimension`s") == "* a `Dimension`\\ s"  # pylint: disable=protected-access
  lines = ["Text:", "", "    code()", "      more()", "", "after"]
  assert conf._restructure(lines) == [  # pylint: disable=protected-access
      "Text:", "", "::", "", "    code()", "      more()", "", "after"]


def test_site_builds_without_warnings_or_broken_links(tmp_path):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(ROOT))
  out = subprocess.run(
      [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html",
       str(ROOT / "docs"), str(tmp_path / "html")],
      capture_output=True, text=True, env=env, timeout=900, cwd=tmp_path)
  warnings = [line for line in out.stderr.splitlines()
              if "WARNING" in line or "ERROR" in line and "absl::" not in line]
  assert out.returncode == 0, "\n".join(warnings) or out.stderr[-3000:]
  for page in ("index", "quickstart", "reference/api/core", "reference/commands"):
    assert (tmp_path / "html" / f"{page}.html").exists(), page
  core = (tmp_path / "html" / "reference" / "api" / "core.html").read_text()
  assert "convert_to_layout_rules" in core  # autodoc ran
