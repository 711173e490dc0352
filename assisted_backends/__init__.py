"""Assisted generation (speculative decoding) on Gaudi, Xeon and NVIDIA GPUs.

Importing the package imports torch and transformers only; vendor libraries (habana_frameworks,
intel_extension_for_pytorch, deepspeed) load lazily inside the backend that needs them.
"""

from assisted_backends.api import GenerateResult, generate
from assisted_backends.core.stats import GenerationStats
from assisted_backends.transformers_integration import disable, enable

__version__ = "0.1.0"

__all__ = ["GenerateResult", "GenerationStats", "disable", "enable", "generate", "__version__"]
