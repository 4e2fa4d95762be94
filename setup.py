"""Chooses which ONNX Runtime distribution edgespec depends on.

onnxruntime and onnxruntime-gpu (and the other builds) install the same ``onnxruntime``
module and overwrite each other, so exactly one may be required. The default keeps
``pip install .`` a working CPU install; GPU and Jetson users set EDGESPEC_ORT_PACKAGE
(see README, "Installing on a GPU or Jetson").
"""

import os
import platform

from setuptools import Extension, setup

ORT_PACKAGES = {
    "onnxruntime": "onnxruntime>=1.20",
    "onnxruntime-gpu": "onnxruntime-gpu>=1.20",
    "onnxruntime-directml": "onnxruntime-directml>=1.20",
    "onnxruntime-qnn": "onnxruntime-qnn>=1.20",
    "onnxruntime-openvino": "onnxruntime-openvino>=1.20",
    "none": None,
}

ort_choice = os.environ.get("EDGESPEC_ORT_PACKAGE", "onnxruntime").strip().lower()
if ort_choice not in ORT_PACKAGES:
    raise SystemExit(
        f"EDGESPEC_ORT_PACKAGE={ort_choice!r} is not one of {sorted(ORT_PACKAGES)}; "
        "unset it for the CPU build or pick one of those names"
    )

# onnx and gguf: the GGUF importer, which converts the default model on first use (no torch).
base = [
    "numpy>=1.24",
    "tokenizers>=0.19",
    "psutil>=5.9",
    "jinja2>=3.0",
    "httpx>=0.27",
    "onnx>=1.16",
    "gguf>=0.17",
]
ort_requirement = ORT_PACKAGES[ort_choice]

# edgespec's GGUF kernels: an ONNX Runtime custom-operator library (plain C, no Python API),
# loaded by ONNX Runtime, never imported. Optional: where it cannot build (no C compiler, a
# compiler without GCC/Clang extensions), the install goes on and GGUF files import into
# graphs of ONNX Runtime's own operators (`edgespec doctor` says which path runs).
posix = os.name != "nt"
# On AArch64 every multiply and add stays two roundings, as x86-64's baseline code has them,
# so the NEON path's outputs equal the AVX2 path's bit for bit (csrc/gguf_neon.c).
# csrc/ by job: the portable reference, one form per instruction set, dispatch, the plain C
# test API, the ONNX Runtime glue (tests/kernels/test_neon_kernels.py compiles the same list).
KERNEL_SOURCES = [
    "gguf_reference",
    "gguf_rows8",
    "gguf_x86",
    "gguf_neon",
    "gguf_dispatch",
    "gguf_test_api",
    "gguf_ops",
    "cache_attention",
    "ort_ops",
]
KERNEL_HEADERS = [
    "ort_abi.h",
    "ort_ops.h",
    "gguf_common.h",
    "gguf_rows8.h",
    "gguf_neon_rows8.h",
    "gguf_rows8_x86.h",
    "gguf_rows8_zmm.h",
    "cache_attention_x86.h",
    "cache_attention_neon.h",
]
no_contraction = ["-ffp-contract=off"] if platform.machine().lower() in ("aarch64", "arm64") else []
gguf_kernels = Extension(
    "edgespec.graph._gguf_kernels",
    sources=[f"csrc/{name}.c" for name in KERNEL_SOURCES],
    depends=[f"csrc/{name}" for name in KERNEL_HEADERS],
    include_dirs=["csrc"],
    extra_compile_args=["-O3", "-fvisibility=hidden", "-std=gnu11", *no_contraction]
    if posix
    else [],
    libraries=["m"] if posix else [],
    optional=True,
)
skip_kernels = os.environ.get("EDGESPEC_BUILD_KERNELS", "1").strip() == "0"
setup(
    install_requires=base + ([ort_requirement] if ort_requirement else []),
    ext_modules=[] if skip_kernels else [gguf_kernels],
)
