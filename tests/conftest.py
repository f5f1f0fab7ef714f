"""Test configuration: CPU only. Multi-device tests start their own subprocess with
``XLA_FLAGS=--xla_force_host_platform_device_count=4`` (it must be set before jax starts)."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
