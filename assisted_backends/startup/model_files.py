"""What a model argument's files say, read without torch or transformers: a saved directory's config.json
and tokenizer files, a `.gguf` file's metadata, a Hub id's cached snapshot.

The CLI checks flags against these before anything loads (`preflight`): a directory with no weights, a
chat template that is not there, an early-exit depth past the last layer, a length past the positions.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from assisted_backends.loading import files
from assisted_backends.startup import machine
from assisted_backends.startup.errors import CLIError

WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.safetensors.index.json", "*.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")
GGUF_KEYS = {"block_count": "num_hidden_layers", "context_length": "max_position_embeddings"}
GGUF_ARCHITECTURES = {"gemma3": "gemma3_text", "qwen2": "qwen2", "llama": "llama"}  # general.architecture -> model_type


@dataclass(frozen=True)
class ModelFiles:
    """A model argument's facts as its files state them (None: the files do not say)."""

    name: str
    flag: str
    config: dict = field(default_factory=dict)
    generation_config: dict = field(default_factory=dict)
    tokenizer_json: Path | None = None
    chat_template: bool | None = None
    counted_parameters: int | None = None  # a .gguf's tensor elements, counted exactly

    @property
    def parameters(self) -> int | None:
        """The model's parameter count: counted in a .gguf, else estimated from config.json (None: unknown)."""
        return self.counted_parameters or estimate_parameters(self.config)

    def _first(self, keys: tuple[str, ...]) -> int | None:
        for source in (self.config, self.config.get("text_config") or {}):
            for key in keys:
                if isinstance(source.get(key), int):
                    return source[key]
        return None

    @property
    def layers(self) -> int | None:
        return self._first(LAYER_KEYS)

    @property
    def position_limit(self) -> int | None:
        return self._first(POSITION_KEYS)

    def count_tokens(self, text: str) -> int | None:
        """The prompt's token count from tokenizer.json (the `tokenizers` library; no torch), or None."""
        if self.tokenizer_json is None or importlib.util.find_spec("tokenizers") is None:
            return None
        from tokenizers import Tokenizer

        try:
            return len(Tokenizer.from_file(str(self.tokenizer_json)).encode(text).ids)
        except Exception:  # noqa: BLE001 - a tokenizer this library cannot read is transformers' to judge later
            return None


def estimate_parameters(config: dict) -> int | None:
    """A decoder's parameter count from its config (embeddings, the head unless tied, attention and MLP per
    layer; norms and biases left out), or None when the config lacks the sizes."""
    text = config.get("text_config") or config
    hidden = text.get("hidden_size") or text.get("n_embd") or text.get("d_model")
    layers = text.get("num_hidden_layers") or text.get("n_layer") or text.get("num_layers")
    vocab = text.get("vocab_size")
    if not all(isinstance(value, int) for value in (hidden, layers, vocab)):
        return None
    heads = text.get("num_attention_heads") or text.get("n_head") or 1
    kv_heads = text.get("num_key_value_heads") or heads
    head_dim = text.get("head_dim") or hidden // heads
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    inner = text.get("intermediate_size") or text.get("n_inner") or text.get("ffn_dim") or 4 * hidden
    activation = text.get("hidden_act", text.get("activation_function", ""))
    gated = 3 if activation in ("silu", "swiglu", "gelu_pytorch_tanh") else 2
    embeddings = vocab * hidden * (1 if text.get("tie_word_embeddings", config.get("tie_word_embeddings", True)) else 2)
    return embeddings + layers * (attention + gated * hidden * inner)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def looks_like_eagle_head(config: dict) -> bool:
    """An EAGLE-3 head's config.json (one decoder layer, or a draft vocabulary): it has no tokenizer of its own,
    it uses its target's (`drafters.eagle.checkpoint.is_eagle_checkpoint` checks the weights once torch loads)."""
    return config.get("num_hidden_layers") == 1 or "draft_vocab_size" in config


def _check_complete(directory: Path, name: str, flag: str, config: dict) -> None:
    """A local model directory holds weights and a tokenizer (an EAGLE-3 head: weights only)."""
    if not any(any(directory.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        raise CLIError(
            f"{flag} {name}: config.json but no weights (*.safetensors or *.bin) in the directory; save the model "
            "with save_pretrained, or give another directory"
        )
    if looks_like_eagle_head(config):
        return
    if not any((directory / tokenizer).is_file() for tokenizer in TOKENIZER_FILES):
        raise CLIError(f"{flag} {name}: no tokenizer files in the directory; save the tokenizer next to the model")


def from_directory(directory: Path, name: str, flag: str, complete: bool = True) -> ModelFiles:
    """A saved model directory: config.json, and (`complete`: a local directory, not a Hub cache snapshot that
    may still be filled) weights and a tokenizer."""
    if not (directory / "config.json").is_file():
        raise CLIError(f"{flag} {name}: no config.json in the directory; give a saved model directory or a .gguf file")
    config, generation = _read_json(directory / "config.json"), _read_json(directory / "generation_config.json")
    if complete:
        _check_complete(directory, name, flag, config)
    tokenizer_config = _read_json(directory / "tokenizer_config.json")
    template = bool(tokenizer_config.get("chat_template")) or any(
        (directory / template_file).is_file() for template_file in CHAT_TEMPLATE_FILES
    )
    tokenizer_json = directory / "tokenizer.json" if (directory / "tokenizer.json").is_file() else None
    return ModelFiles(name, flag, config, generation, tokenizer_json, template)


def from_gguf(path: Path, name: str, flag: str) -> ModelFiles:
    """A `.gguf` file: its metadata (layers, context length, chat template, parameters), read in milliseconds
    without torch (`quantized.gguf_header`, the package's one header reader); a file cut short is refused here."""
    from assisted_backends.quantized.gguf_header import GGUFFormatError, read_header

    files.require_gguf(path, flag)
    try:
        header = read_header(path)
    except GGUFFormatError as error:  # any parse failure means the same thing to the user
        raise CLIError(str(files.incomplete(path, flag, error))) from None
    end = header.data_end()
    if end > header.size:
        raise CLIError(str(files.incomplete(path, flag, end=end)))
    values = header.metadata
    arch = values.get("general.architecture", "")
    config = {hf: values[f"{arch}.{key}"] for key, hf in GGUF_KEYS.items() if f"{arch}.{key}" in values}
    if arch:
        config["model_type"] = GGUF_ARCHITECTURES.get(arch, arch)
    parameters = sum(tensor.elements for tensor in header.tensors.values())
    return ModelFiles(name, flag, config, {}, None, bool(values.get("tokenizer.chat_template")), parameters or None)


def hub_snapshot(repo: str, flag: str) -> Path | None:
    """The cached snapshot directory of Hub id `repo`; None when it is not cached and the Hub can be reached.
    Unreachable (HF_HUB_OFFLINE=1, or its host does not resolve): an error at once, and HF_HUB_OFFLINE is set."""
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(repo, "config.json")
    except Exception:  # noqa: BLE001 - not a valid repo id: transformers will say so when it loads
        return None
    if isinstance(cached, str):
        return Path(cached).parent
    offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    host = machine.hub_host()
    if not offline and machine.resolves(host):
        return None
    os.environ["HF_HUB_OFFLINE"] = "1"  # nothing later spends time on retries
    why = "HF_HUB_OFFLINE=1" if offline else f"{host} does not resolve: this machine looks offline"
    raise CLIError(
        f"{flag} {repo}: not in the local Hub cache, and the Hub cannot be reached ({why}); download it where the "
        f"Hub is reachable (`hf download {repo}`) and pass its directory to {flag}"
    )


def demo_directory(role: str) -> Path | None:
    """The shipped demo pair's `target` or `draft` directory (found without importing the demo module)."""
    spec = importlib.util.find_spec("assisted_backends")
    if spec is None or not spec.submodule_search_locations:
        return None
    directory = Path(spec.submodule_search_locations[0]) / "demo" / "weights" / role
    return directory if (directory / "config.json").is_file() else None


def locate(name: str, flag: str) -> ModelFiles | None:
    """The files behind a model argument (directory, `.gguf`, cached Hub id), or None where they cannot be
    read before loading (a Hub id that will be downloaded)."""
    gguf = files.find_gguf(name, flag)  # one-line errors for missing paths and directories holding nothing
    if gguf is not None:
        return from_gguf(gguf, name, flag)
    path = Path(name).expanduser()
    if path.is_dir():
        return from_directory(path, name, flag)
    snapshot = hub_snapshot(name, flag)
    return None if snapshot is None else from_directory(snapshot, name, flag, complete=False)
