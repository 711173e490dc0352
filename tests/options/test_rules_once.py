"""Each rule of a call's options is written once (torch-free, in `options/`) and gives the same answer through the
CLI (`cli.args.validate`, `cli.preflight`, before torch loads) and the API (`plan_generation`): streaming with a
batch, one way of drafting (an EAGLE-3 head taking prompt lookup beside it, stated as a `DraftingRequest`), the
γ defaults, the target's positions. A queue plans through the same function, its shape an input; and a plan
that planning accepted is not refused once the models are prepared."""

from __future__ import annotations

import argparse
import math

import pytest
import torch
from eagle_fixtures import random_head
from tiny_models import MAX_POSITIONS, tiny_model

from assisted_backends import generate
from assisted_backends.api.generation import AssistedGenerator
from assisted_backends.cli import preflight
from assisted_backends.cli.args import build_parser, validate
from assisted_backends.drafters.eagle import save_head
from assisted_backends.drafters.factory import drafting_request
from assisted_backends.options import fields, ranges
from assisted_backends.options.errors import OptionError, OptionNotSupported
from assisted_backends.options.request import QueueShape
from assisted_backends.startup.flags import assistant_kind, cli_spelling

pytestmark = pytest.mark.usefixtures("one_thread")
IDS = torch.tensor([[5, 9, 3, 17, 4, 8]])


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", 0)


@pytest.fixture(scope="module")
def draft():
    return tiny_model("llama", 1)


def cli(*argv: str) -> argparse.Namespace:
    return build_parser(["auto", "cpu"]).parse_args(["--max-new-tokens", "4", *argv])


def refused(call) -> OptionError:
    with pytest.raises(OptionError) as raised:
        call()
    return raised.value


class Sink:
    def put(self, value) -> None: ...

    def end(self) -> None: ...


def test_streaming_with_a_batch_is_one_rule(target):
    ids = torch.tensor([[5, 9, 3], [7, 2, 6]])
    api = refused(lambda: generate(target, ids, attention_mask=torch.ones_like(ids), max_new_tokens=2,
                                   streamer=Sink()))  # fmt: skip
    command_line = refused(lambda: validate(cli("--batch-size", "2", "--stream")))
    assert api.template == command_line.template
    assert str(api).startswith("streamer streams one sequence, but input_ids gives 2 rows")
    assert command_line.render(cli_spelling) == (
        "--stream streams one sequence, but --batch-size gives 2 rows; drop --stream or generate one prompt at a time"
    )
    validate(cli("--batch-size", "2", "--no-stream"))  # not asked: accepted by both
    ranges.check_streaming(True, 1)


@pytest.mark.parametrize(
    "api_options,flags",
    [
        ({"suffix_cache": True, "prompt_lookup_num_tokens": 3}, ["--suffix-cache", "--prompt-lookup", "3"]),
        (
            {"assistant_early_exit": 1, "prompt_lookup_num_tokens": 3},
            ["--assistant-early-exit", "1", "--prompt-lookup", "3"],
        ),
        ({"num_assistant_tokens": 0}, ["--num-assistant-tokens", "0"]),
    ],
)
def test_one_way_of_drafting_is_one_rule(target, api_options, flags):
    api = refused(lambda: generate(target, IDS, max_new_tokens=2, **api_options))
    assert api.template == refused(lambda: validate(cli(*flags))).template


def test_a_draft_model_with_prompt_lookup_is_refused_by_both(target, draft, tmp_path):
    draft_dir = tmp_path / "draft"
    draft.save_pretrained(draft_dir)
    api = refused(lambda: generate(target, IDS, assistant_model=draft, prompt_lookup_num_tokens=3, max_new_tokens=2))
    command_line = refused(lambda: validate(cli("--assistant-model", str(draft_dir), "--prompt-lookup", "3")))
    assert api.template == command_line.template == "choose one way of drafting, got {d0} and {d1}"


def test_an_eagle_head_with_prompt_lookup_is_stated_the_same_by_both(target, tmp_path):
    """The head is named explicitly (`AssistantKind`), not recognised by an attribute it happens to carry."""
    head = random_head(target)
    directory = save_head(head, tmp_path / "head", target_layers=2)
    args = cli("--assistant-model", str(directory), "--prompt-lookup", "3")
    validate(args)
    assert assistant_kind(args) == "eagle_head"
    from_flags = ranges.check_drafting({"assistant_model": assistant_kind(args), "prompt_lookup_num_tokens": 3})
    assert from_flags == drafting_request(head, 3) == ranges.DraftingRequest("eagle", lookup_tokens=3)
    plan = AssistedGenerator(target, head).plan(IDS, prompt_lookup_num_tokens=3, max_new_tokens=2)
    assert (plan.draft.kind, plan.draft.combined_lookup) == ("eagle", 3)


def test_no_assisted_names_the_flag_that_asked_for_a_drafter():
    with pytest.raises(ValueError, match="--no-assisted conflicts with --prompt-lookup; drop one of them"):
        validate(cli("--no-assisted", "--prompt-lookup", "3"))
    assert ranges.check_drafting({"suffix_cache": True}).option == "suffix_cache"


@pytest.mark.parametrize("schedule,gamma", [("constant", fields.DEFAULT_NUM_ASSISTANT_TOKENS),
                                            (None, fields.MAX_ADAPTIVE_GAMMA)])  # fmt: skip
def test_the_gamma_defaults_the_help_states_are_the_plans(target, draft, schedule, gamma):
    plan = AssistedGenerator(target, draft).plan(IDS, max_new_tokens=4, schedule=schedule)
    assert plan.schedule.gamma == gamma
    help_text = " ".join(build_parser(["auto"]).format_help().split())
    assert f"uses {fields.DEFAULT_NUM_ASSISTANT_TOKENS}" in help_text
    assert f"picks γ from 0 to {fields.MAX_ADAPTIVE_GAMMA}" in help_text


class _ConfigFiles:
    """What `cli.preflight.check_length` reads of a target's files: its positions and a prompt's token count."""

    def __init__(self, limit: int, tokens: int) -> None:
        self.position_limit, self.tokens = limit, tokens

    def count_tokens(self, text: str) -> int:
        return self.tokens


def test_the_target_positions_are_one_rule(target):
    new = MAX_POSITIONS - IDS.shape[1] + 1
    api = refused(lambda: generate(target, IDS, max_new_tokens=new))
    args = cli("--prompt", "some text")
    args.max_new_tokens, args.prompt_text = new, None
    command_line = refused(lambda: preflight.check_length(args, _ConfigFiles(MAX_POSITIONS, IDS.shape[1])))
    assert api.template == command_line.template
    assert command_line.render(cli_spelling).endswith("shorten the prompt or lower --max-new-tokens")


def test_a_queue_plans_through_the_same_function_with_its_shape(target, draft):
    """Capacity from the queue's longest prompt, the schedule's horizon over the queue, and the queue's refusals:
    all decided by `plan_generation`, which `generate_many` calls with the queue's shape."""
    generator = AssistedGenerator(target, draft)
    shape = QueueShape(slots=2, prompts=5, longest=20)
    alone = generator.plan(IDS, max_new_tokens=4)
    queued = generator.plan(IDS, max_new_tokens=4, queue=shape)
    assert queued.capacity == alone.capacity + 20 - IDS.shape[1]
    assert queued.schedule.horizon == 4 * math.ceil(5 / 2) and alone.schedule.horizon == 4
    live = generator.plan(IDS, max_new_tokens=1, queue=QueueShape(2, 2, IDS.shape[1], context=64))
    assert live.schedule.horizon is None and live.capacity == 64 + live.schedule.gamma + 1
    by_plan = refused(lambda: generator.plan(IDS, max_length=30, queue=shape))
    by_queue = refused(lambda: generator.generate_many([[5, 9, 3], [4, 4]], max_length=30))
    assert by_plan.template == by_queue.template
    assert str(by_queue).startswith("max_length is not served by a queue of prompts")
    with pytest.raises(OptionError, match="^max_length is not served"):  # a caller's MaxLengthCriteria counts too
        from transformers import MaxLengthCriteria, StoppingCriteriaList

        generator.plan(IDS, queue=shape, stopping_criteria=StoppingCriteriaList([MaxLengthCriteria(30)]))
    assert generator.plan(IDS, queue=shape, max_new_tokens=3).options.limit_source == "max_new_tokens"


class _Sized:
    """A tokenizer whose vocabulary size is all planning reads to know that translation is needed."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


def test_a_plan_planning_accepts_is_not_refused_after_the_models_are_prepared(monkeypatch):
    """A draft of another tokenizer cannot keep static shapes: refused by planning, before any model is prepared
    (it used to be refused by the drafter's builder, after `run` had prepared both models)."""
    target, other = tiny_model("llama", 0, vocab=96), tiny_model("llama", 1, vocab=64)
    generator = AssistedGenerator(target, other, tokenizer=_Sized(96), assistant_tokenizer=_Sized(64))
    prepared = []
    monkeypatch.setattr(generator.backend, "prepare", lambda model, role: prepared.append(role) or model)
    with pytest.raises(OptionNotSupported, match=r"^static_shapes=True with a draft of another tokenizer") as raised:
        generator.generate(torch.tensor([[5, 9, 3]]), max_new_tokens=2, static_shapes=True)
    assert isinstance(raised.value, NotImplementedError) and prepared == []
    assert generator.plan(torch.tensor([[5, 9, 3]]), max_new_tokens=2).draft.kind == "translated"


def test_a_queue_refuses_before_preparing_a_model(target, draft, monkeypatch):
    generator = AssistedGenerator(target, draft)
    prepared = []
    monkeypatch.setattr(generator.backend, "prepare", lambda model, role: prepared.append(role) or model)
    for options in ({"output_scores": True}, {"prefix_allowed_tokens_fn": lambda b, ids: [1]}):
        name = next(iter(options))
        with pytest.raises(OptionError, match=f"^{name} is not served by a queue of prompts"):
            generator.generate_many([[5, 9, 3]], max_new_tokens=2, **options)
    assert prepared == []
