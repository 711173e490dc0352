"""Graph-capture bookkeeping (backends/cuda/graphs.py) and the CUDA backend's decisions, on CPU.

The device is replaced by `RecordingFakeGraphRuntime`, a FAKE of CUDA graphs: its capture *does*
run the step (a real capture runs nothing) and hands back an output buffer full of NaN (a real
captured output holds garbage until the first replay); its replay re-runs the recorded step
eagerly on the captured static buffers and writes into that same output buffer. So on CPU these
tests prove what the bookkeeping controls: which calls are captured or replayed, that replays read
the new inputs through the static buffers, that capture leaves the KV cache's write position where
the eager step did, and that greedy output stays identical to the target's own `generate`. What
they cannot prove (values baked into a real graph, host syncs) is tested in test_cuda_gpu.py.
"""

from __future__ import annotations

from functools import cache

import pytest
import torch
from suffix_fixtures import competing_cache, needs_layered_caches
from tiny_models import ARCHITECTURES, noisy_copy, random_prompt, reference_greedy, tiny_model
from transformers import LlamaForCausalLM

from assisted_backends import generate, hf_compat
from assisted_backends.backends.base import BackendOptions
from assisted_backends.backends.cuda.backend import CUDABackend
from assisted_backends.backends.cuda.graphs import GraphedCausalLM, StepGraphs, graph_capturable

MAX_NEW_TOKENS = 23


class RecordingFakeGraph:
    """FAKE torch.cuda.CUDAGraph: replay re-runs the recorded step and writes into the captured output."""

    def __init__(self, step, output: torch.Tensor) -> None:
        self.step = step
        self.output = output
        self.replays = 0

    def replay(self) -> None:
        self.output.copy_(self.step())
        self.replays += 1


class RecordingFakeGraphRuntime:
    """FAKE GraphRuntime for CPU: counts warm-ups, records every capture."""

    def __init__(self) -> None:
        self.warmups = 0
        self.graphs: list[RecordingFakeGraph] = []

    def warmup(self, step):
        self.warmups += 1
        return step()

    def capture(self, step):
        output = torch.full_like(step(), float("nan"))  # executes, unlike a real capture; content is garbage
        graph = RecordingFakeGraph(step, output)
        self.graphs.append(graph)
        return graph, output


class CUDABackendOnCPU(CUDABackend):
    """The real CUDABackend logic with the device swapped for the CPU and graphs for the fake."""

    def __init__(self, options: BackendOptions | None = None, bf16: bool = True) -> None:
        super().__init__(options)
        self._bf16 = bf16
        self.runtimes: list[RecordingFakeGraphRuntime] = []

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def bf16_supported(self) -> bool:
        return self._bf16

    def graph_runtime(self) -> RecordingFakeGraphRuntime:
        self.runtimes.append(RecordingFakeGraphRuntime())
        return self.runtimes[-1]

    def synchronize(self) -> None:
        return None  # the fake runs on the CPU: nothing is queued


@cache
def pair(arch: str):
    target = tiny_model(arch, seed=0)
    return target, noisy_copy(target, seed=3, scale=0.02)


@cache
def expected(arch: str, prompt_length: int) -> torch.Tensor:
    return reference_greedy(pair(arch)[0], random_prompt(prompt_length, seed=prompt_length), MAX_NEW_TOKENS)


def graphs_of(backend: CUDABackend, model, role: str) -> StepGraphs:
    wrapper = backend.prepare(model, role)
    assert isinstance(wrapper, GraphedCausalLM)
    return wrapper.graphs


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("gamma", [1, 4])
def test_graphed_assisted_greedy_matches_target_generate(arch, gamma):
    target, draft = pair(arch)
    if not graph_capturable(target):
        pytest.skip(f"{arch} has no static cache in this transformers version (the backend falls back to dynamic)")
    backend = CUDABackendOnCPU()
    for prompt_length in (1, 6):
        result = generate(
            target,
            random_prompt(prompt_length, seed=prompt_length),
            assistant_model=draft,
            max_new_tokens=MAX_NEW_TOKENS,
            num_assistant_tokens=gamma,
            backend=backend,
        )
        assert result.stats.cache_layout == "static"
        assert torch.equal(result.sequences, expected(arch, prompt_length)), (arch, gamma, prompt_length)
    target_graphs, draft_graphs = graphs_of(backend, target, "target"), graphs_of(backend, draft, "draft")
    assert target_graphs.stats.caches_bound == 2 and draft_graphs.stats.caches_bound == 2  # one per generate call
    assert target_graphs.stats.replays > 0 and draft_graphs.stats.replays > 0
    replayed = sum(graph.replays for runtime in backend.runtimes for graph in runtime.graphs)
    assert replayed == target_graphs.stats.replays + draft_graphs.stats.replays


def test_static_shapes_bound_the_number_of_graphs():
    """Fixed γ: the target captures only [1, γ+1]; the draft only its 1- and 2-token feeds."""
    gamma = 3
    target, draft = pair("llama")
    backend = CUDABackendOnCPU(BackendOptions(bucket_size=32))
    result = generate(
        target,
        random_prompt(6, seed=6),
        assistant_model=draft,
        max_new_tokens=MAX_NEW_TOKENS,
        num_assistant_tokens=gamma,
        static_shapes=True,
        backend=backend,
    )
    assert torch.equal(result.sequences, expected("llama", 6))

    def fed_shapes(graphs: StepGraphs) -> set[tuple[int, ...]]:
        return {dict(signature)["input_ids"][0] for signature in graphs.stats.signatures}

    target_graphs, draft_graphs = graphs_of(backend, target, "target"), graphs_of(backend, draft, "draft")
    assert fed_shapes(target_graphs) == {(1, gamma + 1)}
    assert fed_shapes(draft_graphs) <= {(1, 1), (1, 2)}
    assert target_graphs.stats.captures == 1 and draft_graphs.stats.captures <= 2
    assert target_graphs.stats.eager_calls == 1  # the prefill
    assert target_graphs.stats.replays == result.stats.target_forwards - 2  # minus prefill and the capture call


def test_plain_decoding_replays_one_graph():
    target, _ = pair("llama")
    backend = CUDABackendOnCPU()
    result = generate(target, random_prompt(6, seed=6), max_new_tokens=MAX_NEW_TOKENS, backend=backend)
    assert torch.equal(result.sequences, expected("llama", 6))
    graphs = graphs_of(backend, target, "target")
    assert graphs.stats.captures == 1 and graphs.stats.replays == MAX_NEW_TOKENS - 2


def test_replay_reads_new_inputs_and_capture_keeps_the_write_position():
    """Direct StepGraphs use: every call, replayed or not, equals an eager forward on a twin cache."""
    model = tiny_model("llama", seed=0)
    graphs = StepGraphs("target", RecordingFakeGraphRuntime(), max_query_tokens=4)
    graphed_cache = hf_compat.new_static_cache(model, 1, 64, torch.float32, torch.device("cpu"))
    eager_cache = hf_compat.new_static_cache(model, 1, 64, torch.float32, torch.device("cpu"))
    tokens = random_prompt(30, seed=30)
    length = 0
    with torch.inference_mode():
        for width in (5, 2, 2, 2, 3, 2, 1, 2):  # prefill, capture, replay, replay, capture, replay, ...
            feed = tokens[:, length : length + width]
            position = torch.arange(length, length + width)
            kwargs = {"input_ids": feed, "position_ids": position[None, :], "cache_position": position}
            got = graphs.run(
                model, kwargs, {"use_cache": True}, graphed_cache, start_position=lambda start=length: start
            )
            want = model(**kwargs, past_key_values=eager_cache, use_cache=True).logits
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
            length += width
            assert int(graphed_cache.get_seq_length()) == length
    assert graphs.stats.eager_calls == 1 and graphs.stats.captures == 3 and graphs.stats.replays == 4


def test_long_feeds_and_dynamic_caches_run_eagerly():
    model = tiny_model("opt", seed=0)
    wrapper = GraphedCausalLM(model, "target", RecordingFakeGraphRuntime(), max_query_tokens=2)
    cache = hf_compat.new_dynamic_cache(model)
    tokens = random_prompt(8, seed=8)
    with torch.inference_mode():
        for start, stop in ((0, 4), (4, 5), (5, 6), (6, 8)):
            wrapper(input_ids=tokens[:, start:stop], past_key_values=cache, cache_position=torch.arange(start, stop))
    assert wrapper.graphs.stats.captures == 0 and wrapper.graphs.stats.eager_calls == 4


@needs_layered_caches
def test_a_graph_wrapped_target_verifies_token_trees_on_the_dynamic_layout(tree_passes):
    """The backend wraps every capturable model for graphs; on the dynamic layout a tree pass calls the model it
    wrapped (the first H200 run found trees refused behind the wrapper); the static layout verifies chains."""
    target, _ = pair("llama")
    prompt = random_prompt(10, seed=0)
    reference = reference_greedy(target, prompt, 24)
    for layout in ("dynamic", None):
        backend = CUDABackendOnCPU(BackendOptions(dtype="fp32"))
        cache = competing_cache(prompt, reference[0, 10:].tolist())
        result = generate(target, prompt, max_new_tokens=24, suffix_cache=cache, num_assistant_tokens=6,
                          cache_layout=layout, backend=backend)  # fmt: skip
        assert torch.equal(result.sequences, reference), layout
        assert isinstance(backend.prepare(target, "target"), GraphedCausalLM)
        if layout == "dynamic":
            assert tree_passes, "a graph-wrapped target on the dynamic layout must verify trees"
            tree_passes.clear()
        else:
            assert result.stats.cache_layout == "static" and not tree_passes


def test_prepare_is_idempotent_and_wraps_per_role():
    target, draft = pair("llama")
    backend = CUDABackendOnCPU()
    wrapped = backend.prepare(target, "target")
    assert backend.prepare(target, "target") is wrapped and backend.prepare(wrapped, "target") is wrapped
    assert backend.prepare(target, "draft") is not wrapped  # a model drafting for itself gets its own graphs
    report = backend.describe()
    assert report["target_graphs"] == "cuda graphs"
    # the keys every backend reports (the CLI's summary line reads them; it raised KeyError on a GPU)
    assert report["dtype"] == "float32" and report["draft_precision"] == "float32"
    eager = CUDABackendOnCPU(BackendOptions(graphs=False)).prepare(draft, "draft")
    assert eager is draft


class _UncapturableLlama(LlamaForCausalLM):
    _can_compile_fullgraph = False


def test_models_that_cannot_be_captured_fall_back_to_the_dynamic_layout():
    target = tiny_model("llama", seed=0)
    uncapturable = _UncapturableLlama(target.config).eval()
    uncapturable.load_state_dict(target.state_dict())
    backend = CUDABackendOnCPU()
    assert graph_capturable(target) and not graph_capturable(uncapturable)
    assert backend.cache_layout_for(target, None) == "static"
    assert backend.cache_layout_for(target, uncapturable) == "dynamic"
    result = generate(uncapturable, random_prompt(6, seed=6), max_new_tokens=MAX_NEW_TOKENS, backend=backend)
    assert result.stats.cache_layout == "dynamic"
    assert backend.prepare(uncapturable, "target") is uncapturable  # not wrapped
    assert torch.equal(result.sequences, reference_greedy(target, random_prompt(6, seed=6), MAX_NEW_TOKENS))


def test_a_prepared_wrapper_passed_as_the_model_generates_as_the_model():
    """The CLI passes the backend's wrapper itself to `generate` (with a repetition penalty and stop strings):
    options resolve on the wrapped model (a GPU run failed with "GraphedCausalLM has no _get_logits_processor")."""
    target, draft = pair("llama")
    backend = CUDABackendOnCPU()
    prompt = random_prompt(6, seed=6)
    with torch.inference_mode():
        reference = target.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
            repetition_penalty=1.2,
        )  # fmt: skip
    wrapped, wrapped_draft = backend.prepare(target, "target"), backend.prepare(draft, "draft")
    assert isinstance(wrapped, GraphedCausalLM)
    result = generate(
        wrapped, prompt, assistant_model=wrapped_draft, max_new_tokens=MAX_NEW_TOKENS, repetition_penalty=1.2,
        backend=backend,
    )  # fmt: skip
    assert torch.equal(result.sequences, reference)
    assert graphs_of(backend, target, "target").stats.captures > 0  # the same wrapper's graphs served it


def test_the_cli_session_runs_both_its_generates_on_a_graph_wrapped_target():
    """The CLI's benchmark compares against transformers' own `generate` of the session's target, which the CUDA
    backend has wrapped (a GPU run failed with "'GraphedCausalLM' object has no attribute 'generate'")."""
    import argparse

    from assisted_backends.cli.session import Session

    target, draft = pair("llama")
    backend = CUDABackendOnCPU()
    wrapped, wrapped_draft = backend.prepare(target, "target"), backend.prepare(draft, "draft")
    tokenizer = argparse.Namespace(pad_token_id=0, eos_token_id=None)
    args = argparse.Namespace(
        do_sample=False, temperature=None, top_k=None, top_p=None, repetition_penalty=1.2, prompt_lookup=None,
        assistant_early_exit=None, num_assistant_tokens=None, schedule="adaptive", seed=None, static_shapes=False,
        no_prefix_cache=False,
    )  # fmt: skip
    session = Session(args=args, backend=backend, target=wrapped, tokenizer=tokenizer, draft=wrapped_draft)
    prompt = random_prompt(6, seed=6)
    theirs = session.transformers_generate(prompt, torch.ones_like(prompt), MAX_NEW_TOKENS)
    ours = session.generate(prompt, MAX_NEW_TOKENS, assisted=True, ignore_eos=True)
    assert torch.equal(ours.sequences, theirs)


def test_an_eagle_head_drafts_for_a_graph_wrapped_target_which_then_steps_eagerly():
    """A head reads the target's features with forward hooks, which a graph replay does not run: the target of
    such a call steps eagerly through the same static cache (it used to be refused), exact, no graph replayed."""
    from eagle_fixtures import trained_head

    target, _ = pair("llama")
    head = trained_head(target, steps=40)
    backend = CUDABackendOnCPU()
    prompt = random_prompt(6, seed=6)
    result = generate(target, prompt, max_new_tokens=MAX_NEW_TOKENS, backend=backend, assistant_model=head,
                      num_assistant_tokens=3, cache_layout="static")  # fmt: skip
    assert torch.equal(result.sequences, reference_greedy(target, prompt, MAX_NEW_TOKENS))
    assert result.stats.drafted > 0 and result.stats.drafting_stopped is None
    assert backend.runtimes and not any(graph.replays for runtime in backend.runtimes for graph in runtime.graphs)
