"""Opening a `.gguf` reads what it needs from the file itself: the model type and generation settings come from its
metadata as transformers' conversion gave them (nothing converted to fp32, nothing written), the command line leaves
only the repacked weights and the tokenizer in the cache, and every way of opening one (`generate(path)`,
`AssistedGenerator(path)`, `load_gguf_quantized(path)`, `load_model(path)`, `enable` on the loaded model) takes the
native decoder step, with the same greedy tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

pytest.importorskip("gguf")
pytest.importorskip("accelerate")
if tuple(int(part) for part in transformers.__version__.split(".")[:2]) < (5, 0):
    pytest.skip(f".gguf loading is tested on transformers 5.x, not {transformers.__version__}", allow_module_level=True)

from quantized_fixtures import write_tiny_llama_gguf  # noqa: E402

import assisted_backends  # noqa: E402
from assisted_backends.cache_dir import cache_root  # noqa: E402
from assisted_backends.cli import main  # noqa: E402
from assisted_backends.loading import files, models  # noqa: E402
from assisted_backends.loading.open import open_model  # noqa: E402
from assisted_backends.native import decoder_build, decoder_model  # noqa: E402
from assisted_backends.quantized.model import load_gguf_quantized  # noqa: E402

TEMPLATE = "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
BUILDS = cache_root()  # where this machine's kernels and native decoder are built (before any test moves the cache)
IDS = torch.tensor([[256, 72, 101, 108, 108, 111, 32, 119]])
pytestmark = pytest.mark.usefixtures("one_thread")
needs_native = pytest.mark.skipif(bool(decoder_build.why_unavailable()), reason="the native decoder cannot run here")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    """A tiny Q8_0 Llama whose metadata also holds a padding id and a chat template."""
    import gguf

    adding_eos = gguf.GGUFWriter.add_eos_token_id

    def with_pad_and_template(writer, token: int) -> None:
        adding_eos(writer, token)
        writer.add_pad_token_id(token)
        writer.add_chat_template(TEMPLATE)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf.GGUFWriter, "add_eos_token_id", with_pad_and_template)
        return write_tiny_llama_gguf(tmp_path_factory.mktemp("open") / "tiny-open.gguf", "Q8_0")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch) -> Path:
    """A cache of this test's own, sharing the machine's builds of the kernels and the decoder (not rebuilt)."""
    root = tmp_path / "cache"
    root.mkdir()
    for folder in ("kernels", "decoder"):
        (BUILDS / folder).mkdir(parents=True, exist_ok=True)
        (root / folder).symlink_to(BUILDS / folder, target_is_directory=True)
    monkeypatch.setenv("ASSISTED_BACKENDS_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    models.resolve.cache_clear()
    return root


def _written(root: Path) -> list[str]:
    """Every path under the cache but the shared builds, relative to it."""
    return sorted(
        str(path.relative_to(root)) for path in root.rglob("*") if path.relative_to(root).parts[0] not in
        ("kernels", "decoder")
    )  # fmt: skip


def _comparable(fields: dict) -> dict:
    """A generation config's settings as transformers reads them (defaults filled in; its version left out)."""
    read = transformers.GenerationConfig.from_dict(fields).to_dict()
    return {key: value for key, value in read.items() if key not in ("transformers_version", "_original_object_hash")}


def test_type_and_generation_settings_come_from_the_metadata_as_the_conversion_gave_them(tiny_gguf, _private_cache):
    kind, settings = models.gguf_config(tiny_gguf)["model_type"], models.saved_generation_config(tiny_gguf)
    assert settings["bos_token_id"] == 270 and settings["eos_token_id"] == settings["pad_token_id"] == 271
    assert _written(_private_cache) == []  # read from the header: nothing converted, nothing written
    converted = Path(files.model_dir(tiny_gguf))  # what the command line read before: transformers' conversion
    assert kind == json.loads((converted / "config.json").read_text())["model_type"] == "llama"
    saved = json.loads((converted / "generation_config.json").read_text())
    assert _comparable(settings) == _comparable(saved)


def test_the_tokenizer_carries_the_metadata_chat_template(tiny_gguf):
    tokenizer = models.load_tokenizer(tiny_gguf)
    assert tokenizer.chat_template == TEMPLATE
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (270, 271)


def test_one_call_opens_the_model_its_tokenizer_settings_and_chat_template(tiny_gguf, _private_cache):
    opened = open_model(str(tiny_gguf), "-m/--model")
    assert (opened.model_type, opened.chat_template) == ("llama", TEMPLATE)
    assert opened.generation_settings == models.saved_generation_config(tiny_gguf)
    assert opened.tokenizer.eos_token_id == opened.generation_settings["eos_token_id"] == 271
    assert opened.model.get_input_embeddings().num_embeddings == opened.tokenizer.vocab_size == 272


def test_a_truncated_file_is_one_line_before_any_conversion(tiny_gguf, tmp_path, _private_cache):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[:-4096])
    for read in (lambda name, what: models.gguf_config(Path(name), what), models.saved_generation_config):
        with pytest.raises(files.ModelFileError, match="truncated") as raised:
            read(str(cut), "-m/--model")
        assert "\n" not in str(raised.value) and "-m/--model" in str(raised.value)
    assert _written(_private_cache) == []


def _cli_text(gguf: Path, out: Path, *extra: str) -> str:
    code = main(["-m", str(gguf), "--max-new-tokens", "10", "--prompt", "hello world", "--no-stream",
                 "--json", str(out), *extra])  # fmt: skip
    assert code == 0
    return json.loads(out.read_text())["text"]


@needs_native
def test_the_command_line_leaves_only_the_repacked_weights_and_the_tokenizer(tiny_gguf, tmp_path, _private_cache):
    # No drafter named: the command reads the file's generation settings and family to choose one (before: from
    # an fp32 conversion of the whole file); the text is plain decoding's.
    assisted = _cli_text(tiny_gguf, tmp_path / "assisted.json")
    plain = _cli_text(tiny_gguf, tmp_path / "plain.json", "--no-assisted")
    assert assisted == plain and assisted
    entry = files.share_quantized_entry(tiny_gguf).relative_to(_private_cache)
    written = _written(_private_cache)
    assert not any(part.startswith("gguf") or part.endswith("model.safetensors") for part in written), written
    assert {path for path in written if "/" not in path} == {"quantized"}
    assert {Path(path).parts[2] for path in written if path.startswith(f"{entry}/")} >= {"config.json", "tokenizer"}
    assert {path for path in written if path.count("/") == 1} == {f"{entry}", "quantized/sha256.json"}
    weights = [path for path in written if path.startswith(f"{entry}/weights-")]
    assert len(weights) == 1 and weights[0].endswith(".safetensors")


def test_the_command_line_builds_the_tokenizer_before_the_weights(tiny_gguf, tmp_path, _private_cache, monkeypatch):
    # a 262k-token vocabulary peaks at +350 MiB while it is built: before the weights, that peak is not on theirs
    order: list[str] = []
    for name, label in (("load_tokenizer", "tokenizer"), ("load_model", "weights")):
        real = getattr(models, name)

        def recorded(*args, _real=real, _label=label, **kwargs):
            order.append(_label)
            return _real(*args, **kwargs)

        monkeypatch.setattr(models, name, recorded)
    assert _cli_text(tiny_gguf, tmp_path / "ordered.json", "--no-assisted")
    assert order == ["tokenizer", "weights"], order


@pytest.fixture
def native_calls(monkeypatch) -> list[int]:
    """Counts forwards of the native decoder step."""
    counted: list[int] = []
    real = decoder_model.NativeCausalLM.forward

    def counting(self, *args, **kwargs):
        counted.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(decoder_model.NativeCausalLM, "forward", counting)
    return counted


@needs_native
def test_every_route_takes_the_native_step_with_the_same_tokens(tiny_gguf, native_calls):
    reference = load_gguf_quantized(tiny_gguf, tokenizer=False, native=False)
    assert reference.model is reference.reference and "native=False" in reference.step
    expected = assisted_backends.generate(decoder_model.NativeCausalLM(reference.model), IDS, max_new_tokens=16)
    native_calls.clear()

    loaded = load_gguf_quantized(tiny_gguf, tokenizer=False)
    assert isinstance(loaded.model, decoder_model.NativeCausalLM) and loaded.step == decoder_model.STEP_LINE
    assert loaded.model.reference is loaded.reference
    enabled = assisted_backends.enable(load_gguf_quantized(tiny_gguf, tokenizer=False).model)
    routes = {
        "load_gguf_quantized": lambda: assisted_backends.generate(loaded.model, IDS, max_new_tokens=16).sequences,
        "generate(path)": lambda: assisted_backends.generate(tiny_gguf, IDS, max_new_tokens=16).sequences,
        "AssistedGenerator(path)": lambda: (
            assisted_backends.AssistedGenerator(str(tiny_gguf))
            .generate(IDS, max_new_tokens=16, prompt_lookup_num_tokens=3)
            .sequences
        ),  # fmt: skip
        "load_model(path)": lambda: (
            assisted_backends.generate(models.load_model(tiny_gguf), IDS, max_new_tokens=16).sequences
        ),  # fmt: skip
        "enable": lambda: enabled.generate(IDS, max_new_tokens=16),
    }
    for route, run in routes.items():
        native_calls.clear()
        assert torch.equal(run(), expected.sequences), route
        assert native_calls, f"{route}: the native step did not run"


def test_the_switch_keeps_transformers_modeling_and_says_why(tiny_gguf, monkeypatch):
    monkeypatch.setenv(decoder_build.SWITCH_VARIABLE, "off")
    loaded = load_gguf_quantized(tiny_gguf, tokenizer=False)
    assert loaded.model is loaded.reference and not isinstance(loaded.model, decoder_model.NativeCausalLM)
    assert loaded.step.startswith("forward pass: transformers' modeling")
    assert "ASSISTED_BACKENDS_NATIVE=off" in loaded.step
