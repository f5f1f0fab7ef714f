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
  # orbax loads on the first checkpoint, matplotlib with the harness, HF and CLIP on first use
  code = ("import sys, fedjaxsparse\n"
          "heavy = ('tensorflow', 'tensorflow_datasets', 'matplotlib', 'safetensors', "
          "'tokenizers', 'fedjaxsparse.models.hf', 'fedjaxsparse.models.clip', "
          "'fedjaxsparse.models.clip_teacher', 'fedjaxsparse.models.clip_resnet', "
          "'fedjaxsparse.pruning.lm', 'fedjaxsparse.harness', "
          "'orbax', 'orbax.checkpoint')\n"
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


def _public_modules():
  import importlib
  import pkgutil
  for info in pkgutil.walk_packages(fjs.__path__, "fedjaxsparse."):
    if not any(part.startswith("_") for part in info.name.split(".")):
      yield importlib.import_module(info.name)


def test_every_public_module_shows_exactly_its_all():
  """``dir(module)`` (and tab completion) is ``__all__``: no ``jnp``, ``np``, ``Any`` or a
  neighbour's ``ConfigError``; every listed name resolves; every function or class a module
  defines under a public name is listed (an unlisted one is a name to make private)."""
  import inspect
  modules = [fjs, *_public_modules()]
  assert len(modules) > 90
  for m in modules:
    assert sorted(dir(m)) == sorted(set(m.__all__)), m.__name__
    for name in m.__all__:
      assert hasattr(m, name), f"{m.__name__}.__all__ lists {name!r}, which does not exist"
    unlisted = [n for n, v in vars(m).items()
                if not n.startswith("_") and (inspect.isfunction(v) or inspect.isclass(v))
                and v.__module__ == m.__name__ and n not in m.__all__]
    assert not unlisted, f"{m.__name__} defines public {unlisted} outside __all__"



_INWARD = re.compile(r"seed 0\d\d|spec [A-Z]\.| l\. \d")


def _sections(doc: str) -> dict:
  """Google-style sections of a docstring: ``{"Args": text, "Returns": text, ...}``."""
  out, name = {}, None
  for line in doc.splitlines():
    head = re.fullmatch(r"(Args|Returns|References|Raises|Example|Examples):\s*", line)
    if head:
      name = head.group(1)
      out[name] = ""
    elif name and (not line or line.startswith(" ")):
      out[name] += line + "\n"
    else:
      name = None
  return out


@pytest.mark.parametrize("name", fjs.METHODS + fjs.PRUNING_TRAINERS)
def test_every_method_docstring_reads_without_the_specs(name):
  """``help(fjs.X)``: a first paragraph naming the method and its paper's year; Args with
  every parameter of the signature; Returns; References; no pointer into the team's specs
  outside the one closing "Source for the team" line."""
  import inspect
  fn = getattr(fjs, name)
  doc = inspect.getdoc(fn)
  first = doc.split("\n\n")[0]
  assert re.search(r"\b(19|20)\d\d\b", first), f"{name}: the first paragraph names no paper year"
  sections = _sections(doc)
  for section in ("Args", "Returns", "References"):
    assert sections.get(section, "").strip(), f"{name}: no {section} section"
  documented = set(re.findall(r"^  (\w+)(?: \(.*?\))?:", sections["Args"], re.M))
  params = [p.name for p in inspect.signature(fn).parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
  missing = [p for p in params if p not in documented]
  assert not missing, f"{name}: Args does not document {missing}"
  inward = _INWARD.findall(doc.split("Source for the team")[0])
  assert not inward, f"{name}: pointers into the specs outside the team line: {inward}"


def test_shared_doc_writes_the_shared_text_into_each_docstring():
  """``core.shared_doc``: a marker line becomes the part at its indentation (the part's later
  lines keep theirs), so ``help()`` shows the whole text; a marker without a part raises."""
  part = "    x: the input,\n      a vector."

  @fjs.core.shared_doc(arg_x=part)
  def f(x):
    """F.

    Args:
      {{arg_x}}
    """
  assert "Args:\n      x: the input,\n      a vector.\n" in f.__doc__

  def g():
    """G: {{missing}}."""
  with pytest.raises(ValueError, match="unfilled marker"):
    fjs.core.shared_doc(arg_x=part)(g)
