"""The CUDA backend on a real NVIDIA GPU (every test here is skipped without one).

- fp32: graph-captured assisted greedy output is token-identical to the target's own `generate`.
- bf16: identical up to documented ties: where the two outputs first differ, the target's top-two
  logits after the common prefix lie within `BF16_TIE_TOLERANCE` of each other (relative to the
  largest logit). Verifying γ+1 positions in one pass sums in another order than one position at a
  time, so bf16 rounding may pick either side of such a near-tie; both continuations are greedy.
- a replayed step makes no host synchronisation (torch.cuda's sync debug mode turns one into an error).
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import ARCHITECTURES, noisy_copy, random_prompt, tiny_model

from assisted_backends import generate
from assisted_backends.backends.base import BackendOptions
from assisted_backends.backends.cuda.backend import CUDABackend
from assisted_backends.backends.cuda.graphs import GraphedCausalLM

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)"
    ),
]

MAX_NEW_TOKENS = 40
BF16_TIE_TOLERANCE = 2**-6  # top-two logit gap / max |logit| below which a greedy choice is a bf16 tie


def cuda_pair(arch: str, dtype: torch.dtype):
    target = tiny_model(arch, seed=0)
    draft = noisy_copy(target, seed=3, scale=0.02)
    return target.to("cuda", dtype), draft.to("cuda", dtype)


def target_greedy(model, prompt: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    with torch.inference_mode():
        return model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("gamma", [1, 4])
@pytest.mark.parametrize("static_shapes", [False, True])
def test_fp32_graphed_greedy_is_token_identical(arch, gamma, static_shapes):
    target, draft = cuda_pair(arch, torch.float32)
    backend = CUDABackend(BackendOptions(dtype="fp32", bucket_size=32))
    for prompt_length in (1, 7):
        prompt = random_prompt(prompt_length, seed=prompt_length).cuda()
        result = generate(
            target,
            prompt,
            assistant_model=draft,
            max_new_tokens=MAX_NEW_TOKENS,
            num_assistant_tokens=gamma,
            static_shapes=static_shapes,
            backend=backend,
        )
        assert result.stats.cache_layout == "static"
        assert torch.equal(result.sequences, target_greedy(target, prompt, MAX_NEW_TOKENS)), (arch, prompt_length)
    graphs = backend.prepare(target, "target").graphs
    assert graphs.stats.captures > 0 and graphs.stats.replays > 0


def first_difference(a: torch.Tensor, b: torch.Tensor) -> int | None:
    length = min(a.shape[1], b.shape[1])
    differing = (a[0, :length] != b[0, :length]).nonzero()
    return int(differing[0, 0]) if differing.numel() else None


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_bf16_greedy_is_identical_up_to_ties(arch):
    target, draft = cuda_pair(arch, torch.bfloat16)
    backend = CUDABackend(BackendOptions(dtype="bf16"))
    prompt = random_prompt(7, seed=7).cuda()
    result = generate(target, prompt, assistant_model=draft, max_new_tokens=MAX_NEW_TOKENS, backend=backend)
    reference = target_greedy(target, prompt, MAX_NEW_TOKENS)
    position = first_difference(result.sequences, reference)
    if position is None:
        return
    with torch.inference_mode():
        logits = target(reference[:, :position]).logits[0, -1].float()
    top2 = logits.topk(2).values
    assert float(top2[0] - top2[1]) <= BF16_TIE_TOLERANCE * float(logits.abs().max()), (arch, position)


def test_replayed_step_makes_no_host_sync():
    target, draft = cuda_pair("llama", torch.float32)
    backend = CUDABackend(BackendOptions(bucket_size=32))
    prompt = random_prompt(7, seed=7).cuda()
    generate(target, prompt, assistant_model=draft, max_new_tokens=12, num_assistant_tokens=3, backend=backend)
    wrapper = backend.prepare(target, "target")
    assert isinstance(wrapper, GraphedCausalLM)
    cache = wrapper.graphs._cache
    position = torch.arange(20, 24, device="cuda")
    kwargs = dict(
        input_ids=prompt[:, :4],
        attention_mask=torch.ones(1, 32, dtype=torch.long, device="cuda"),  # the static mask spans the capacity, 32
        position_ids=position[None, :],
        past_key_values=cache,
        use_cache=True,
        cache_position=position,
    )
    before = wrapper.graphs.stats.replays
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.inference_mode():
            wrapper(**kwargs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert wrapper.graphs.stats.replays == before + 1


def test_memory_stats_and_describe_come_from_torch_cuda():
    backend = CUDABackend(BackendOptions(dtype="auto"))
    target, _ = cuda_pair("gpt2", torch.float32)
    backend.prepare(target, "target")
    stats = backend.memory_stats()
    assert stats["allocated_bytes"] > 0 and stats["peak_allocated_bytes"] >= stats["allocated_bytes"]
    facts = backend.describe()
    expected = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    assert facts["target_dtype"] == expected and facts["gpu"] == torch.cuda.get_device_name()


def test_train_draft_on_the_gpu_then_its_head_drafts_there(tmp_path):
    """`train-draft --device cuda` (bf16 target) raises held-out acceptance; the head then drafts for the fp32
    target on the GPU (graphs on by default: such a call steps the target eagerly), token-identical."""
    from eagle_fixtures import DEMO_DIR, demo_prompts
    from transformers import AutoModelForCausalLM

    from assisted_backends.train_draft.trainer import TrainSettings, train

    lines = (DEMO_DIR / "held_out.txt").read_text().splitlines(keepends=True)
    (tmp_path / "texts").mkdir()
    per = len(lines) // 24
    for i in range(24):
        (tmp_path / "texts" / f"doc{i:02d}.py").write_text("".join(lines[i * per : (i + 1) * per]))
    settings = TrainSettings(
        target=str(DEMO_DIR / "target"), text=(str(tmp_path / "texts"),), output=str(tmp_path / "run"), minutes=5.0,
        data_share=0.9, prompt_tokens=24, new_tokens=24, generation_batch=16, held_out=8, max_sequences=64,
        max_steps=60, draft_vocab=512, top_k=4, steps=3, batch_size=8, learning_rate=3e-3, eval_every_s=1e9,
        checkpoint_every_s=1e9, progress_bar=False, device="cuda",
    )  # fmt: skip
    result = train(settings)
    assert result.after.acceptance > result.before.acceptance + 0.03
    target = AutoModelForCausalLM.from_pretrained(DEMO_DIR / "target", dtype=torch.float32).to("cuda").eval()
    prompt = torch.tensor(demo_prompts(1, 20, seed=99), device="cuda")
    out = generate(target, prompt, assistant_model=str(tmp_path / "run"), max_new_tokens=MAX_NEW_TOKENS,
                   num_assistant_tokens=3)  # fmt: skip
    assert torch.equal(out.sequences, target_greedy(target, prompt, MAX_NEW_TOKENS))
    assert out.stats.accepted > 0
