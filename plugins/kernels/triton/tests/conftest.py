"""Without CUDA the kernels run under Triton's interpreter, which must be chosen before triton is imported."""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
