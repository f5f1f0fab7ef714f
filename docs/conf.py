"""Sphinx configuration of fedjaxsparse's documentation (``docs/``).

Build (offline, a couple of minutes on 2 CPU cores)::

    .venv/bin/pip install -e ".[docs]"
    .venv/bin/sphinx-build -W --keep-going -b html docs docs/_build/html

The API reference, the reproduction ledger, the paper pages and the notebooks' copies are
generated at every build by ``docs/_ext/fjsdocs.py`` into ``docs/_generated/`` (not committed):
from the public namespaces' ``__all__``, ``docs/reproduction.toml`` and the experiments'
paper configurations, so none of them can drift from the code. Notebooks render without
executing (the tests execute them); ``FEDJAXSPARSE_DOCS_EXECUTE=1`` executes them during
the build.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "_ext"))
sys.path.insert(0, os.path.dirname(HERE))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import fedjaxsparse  # noqa: E402

project = "fedjaxsparse"
author = "the fedjaxsparse developers"
copyright = "2026, the fedjaxsparse developers"
release = version = fedjaxsparse.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "myst_nb",
    "fjsdocs",
]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "README.md", "reproduction.toml", "rules", "Thumbs.db", ".DS_Store"]
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
nb_execution_mode = "auto" if os.environ.get("FEDJAXSPARSE_DOCS_EXECUTE") == "1" else "off"
nb_execution_timeout = 600

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
add_module_names = False
python_use_unqualified_type_names = True
nitpicky = False
# a re-exported name (fjs.Model, fjs.data.FederatedData) has an entry under each public
# path; a short cross-reference to it resolves to either, which is the same object
suppress_warnings = ["myst.header", "config.cache", "ref.python"]

html_theme = "furo"
html_title = f"fedjaxsparse {release}"
html_static_path = []
html_theme_options = {"navigation_with_keys": True}
smartquotes = False   # options such as --paper must read as typed
