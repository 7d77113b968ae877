"""memclaims: published memory-saving claims for PyTorch training, as regression tests."""

import logging

__version__ = "0.1.0"

# bitsandbytes >= 0.50 warns on import, on CPUs with AVX512-BF16, that it cannot fetch a 4-bit GEMM
# kernel from the Hugging Face Hub; memclaims uses only its 8-bit optimizers, so the line is noise.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
