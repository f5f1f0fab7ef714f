"""Experiments runnable with ``fedjaxsparse run NAME`` (installed as
``fedjaxsparse.experiments``). Each module defines ``NAME``, ``DESCRIPTION``, ``DEFAULTS`` and
``run(cfg)``; see :mod:`fedjaxsparse.harness.experiment`."""
