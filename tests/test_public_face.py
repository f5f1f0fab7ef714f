"""The public face (DESIGN.md, "The public face"): ``import fedjaxsparse as fjs`` gives every
paper method, the runner and the concept namespaces; heavy optional modules stay unloaded; the
README's quickstart runs as written (fewer rounds)."""
import os
import re
import subprocess
import sys

import pytest

import fedjaxsparse as fjs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_paper_method_is_a_constructor_at_the_top():
  assert set(fjs.METHODS) | set(fjs.PRUNING_TRAINERS) <= set(fjs.__all__)
  assert not set(fjs.METHODS) & set(fjs.PRUNING_TRAINERS)
  for name in fjs.__all__:
    assert hasattr(fjs, name), name
  for name in fjs.METHODS + fjs.PRUNING_TRAINERS:
    fn = getattr(fjs, name)
    assert callable(fn) and fn.__module__.startswith("fedjaxsparse.algorithms."), name
    assert fn.__doc__, f"{name} has no docstring"


def test_import_loads_no_heavy_optional_module():
  code = ("import sys, fedjaxsparse\n"
          "heavy = ('tensorflow', 'tensorflow_datasets', 'matplotlib', 'safetensors', "
          "'tokenizers', 'fedjaxsparse.models.hf', 'fedjaxsparse.models.clip', "
          "'fedjaxsparse.pruning.lm', 'fedjaxsparse.harness')\n"
          "print(sorted(m for m in heavy if m in sys.modules))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]"
  assert fjs.models.hf.__name__ == "fedjaxsparse.models.hf"   # ... and load on first use


def test_personal_params_reads_a_personalised_state_and_names_a_global_one():
  class Personal:
    personal = {"w": 1}
  assert fjs.personal_params(Personal()) == {"w": 1}
  with pytest.raises(TypeError, match="no `personal` field"):
    fjs.personal_params(object())


def test_readme_quickstart_runs(tmp_path, monkeypatch):
  with open(os.path.join(ROOT, "README.md")) as f:
    code = re.search(r"```python\n(.*?)```", f.read(), re.S).group(1)
  assert "import fedjaxsparse as fjs" in code and "from fedjaxsparse" not in code
  code = code.replace("num_rounds=200", "num_rounds=4").replace("eval_every=10", "eval_every=2")
  monkeypatch.chdir(tmp_path)
  scope = {}
  exec(compile(code, "README.md", "exec"), scope)
  accuracy = float(scope["res"].history.evals["accuracy"][-1])
  assert accuracy > 0.3, accuracy   # 4 rounds of FedAvg on 10 classes: well above chance (0.1)
