"""`train`: one run of `train-draft`, from local text or chat logs to an EAGLE-3 head in SpecForge's layout.

Phases, within one time budget (`minutes`, counted over all sessions of a resumed run):
1. held-out data: the target's continuations of up to `held_out` prompts from held-out documents (or
   held-out conversations with `chat`: `prompt_streams`), within `HELD_OUT_SHARE` of the data budget
   (`data_share` of the budget);
2. training data: continuations of training prompts, batch after batch, until the data budget (or
   `max_sequences` are made); each batch is sized to the time left from the measured seconds per sequence,
   decoding stops at the budget's end (continuations cut short), and each batch becomes a shard on disk. A
   run resumed before training began (none of its data made, say) goes on generating within its new budget;
3. the draft vocabulary: the `draft_vocab` tokens the target chose most often on the training data (fewer
   when it chose fewer distinct tokens, at least 1024: rows no example trains are cost without use), or with
   `draft_vocab="auto"` the fewest covering `vocab_coverage` of its choices (the coverage curve is printed);
4. training: AdamW on the TTT loss (`train_draft.ttt`), the learning rate warmed up over 20 steps and
   cosine-decayed over the training time, until the budget (or `max_steps`) is spent; held-out acceptance is
   printed every `eval_every_s` seconds; the state and the exported head are written every
   `checkpoint_every_s` seconds and at the end.
Held-out acceptance is teacher-forced greedy chain acceptance on the target's own continuations: α_k =
P(draft token k agrees | tokens 1..k−1 did), E(γ) = 1 + Σ Π α_i tokens per round, α = (E − 1)/γ the
acceptance rate the package's statistics report for a constant γ.
"""

from __future__ import annotations

import itertools
import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from assisted_backends import hf_compat
from assisted_backends.api import threads as cpu_threads
from assisted_backends.drafters.eagle.checkpoint import save_head
from assisted_backends.drafters.eagle.config import default_feature_layers
from assisted_backends.drafters.eagle.features import LayerTap
from assisted_backends.drafters.eagle.head import Eagle3Head
from assisted_backends.train_draft import batches, chat, ttt
from assisted_backends.train_draft.corpus import DEFAULT_EXTENSIONS, PromptSource, read_documents, split_documents
from assisted_backends.train_draft.data import Example, generate_examples
from assisted_backends.train_draft.head_init import head_config, new_head
from assisted_backends.train_draft.store import RunDirectory
from assisted_backends.train_draft.target_tables import dense_rows
from assisted_backends.train_draft.vocab import DEFAULT_COVERAGE, choose_vocabulary, coverage, size_for_coverage


@dataclass(frozen=True)
class TrainSettings:
    """One run. `target`: a model directory, a .gguf, a Hub id or a real-model name (`loading.real_weights`);
    `text`: files or directories of local text, or `chat`: a ShareGPT-format JSON file or `sharegpt`
    (`train_draft.chat`; prompts at most `chat_context` tokens with the answer, default the target's context);
    `output`: the run directory (resumed when it holds a run)."""

    target: str
    text: tuple[str, ...]
    output: str
    minutes: float = 10.0
    data_share: float = 0.5
    prompt_tokens: int = 96
    new_tokens: int = 96
    generation_batch: int = 16
    held_out: int = 16
    max_sequences: int | None = None
    max_steps: int | None = None
    draft_vocab: int | str = 8192  # or "auto": the smallest V_d covering `vocab_coverage` (`vocab.size_for_coverage`)
    vocab_coverage: float = DEFAULT_COVERAGE
    top_k: int = 8
    steps: int = 4
    batch_size: int = 8
    learning_rate: float = 1e-3
    eval_every_s: float = 60.0
    checkpoint_every_s: float = 120.0
    seed: int = 0
    device: str = "auto"
    chat_share: float = 0.5
    open_share: float = 0.5
    extensions: tuple[str, ...] = DEFAULT_EXTENSIONS
    embed_tokens: bool = True
    progress_bar: bool = True
    chat: str | None = None
    chat_context: int | None = None
    target_precision: str = "auto"  # `load_target`: a .gguf on a CPU keeps its quantization


@dataclass
class Evaluation:
    rates: list[float]  # α_1 .. α_K
    gamma: int

    @property
    def tokens_per_round(self) -> float:
        return ttt.expected_tokens(self.rates, self.gamma)

    @property
    def acceptance(self) -> float:
        return (self.tokens_per_round - 1.0) / self.gamma

    def line(self) -> str:
        per_step = " ".join(f"{r:.2f}" for r in self.rates)
        return f"α {self.acceptance:.3f}, E(γ={self.gamma}) {self.tokens_per_round:.2f}, α_k [{per_step}]"


@dataclass
class TrainResult:
    output: Path
    before: Evaluation
    after: Evaluation
    steps: int
    training_sequences: int
    history: list[dict] = field(default_factory=list)


def choose_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


TARGET_PRECISIONS = ("auto", "file", "fp32", "bf16", "int8", "int4")


def load_target(name: str, device: torch.device, precision: str = "auto"):
    """(target in eval mode, tokenizer) in `precision` (`TARGET_PRECISIONS`; the names of `loading.models`).

    "auto": on a CPU a `.gguf` target (or a real model's) keeps its file's quantization on the package's kernels
    ("file"): the data generation, most of a CPU run, goes at the quantized path's speed, and the head learns the
    features of the target it will draft for; any other target fp32 on a CPU, bf16 on a GPU."""
    from assisted_backends.loading import files, models, real_weights

    if precision not in TARGET_PRECISIONS:
        raise ValueError(f"target_precision={precision!r}: choose one of {', '.join(TARGET_PRECISIONS)}")
    real = name in real_weights.REAL_MODELS
    quantized_file = device.type == "cpu" and (real or files.find_gguf(name, "target") is not None)
    if precision == "auto":
        precision = "file" if quantized_file else ("fp32" if device.type == "cpu" else "bf16")
    if precision in ("file", "int8", "int4"):
        path = str(real_weights.real_model_gguf(name)) if real else name
    else:
        path = str(real_weights.real_model_dir(name)) if real else name
    # transformers' modeling, not the native step: training reads the target's layers (hooks) and token tables
    target = models.load_model(path, "target", None if precision == "file" else precision, native=False)
    target = target.to(device).eval()
    return target, models.load_tokenizer(path, "target")


class Clock:
    """Seconds spent per phase, carried over from earlier sessions of the run."""

    def __init__(self, total_s: float, spent: dict[str, float]) -> None:
        self.total_s = total_s
        self.spent = dict(spent)
        self._phase, self._since = None, time.perf_counter()

    def phase(self, name: str) -> None:
        self._charge()
        self._phase = name

    def _charge(self) -> None:
        now = time.perf_counter()
        if self._phase is not None:
            self.spent[self._phase] = self.spent.get(self._phase, 0.0) + now - self._since
        self._since = now

    def elapsed(self) -> float:
        self._charge()
        return sum(self.spent.values())

    def left(self) -> float:
        return self.total_s - self.elapsed()


def evaluate(head: Eagle3Head, examples: list[Example], lookup: torch.Tensor, steps: int, device, dtype) -> Evaluation:
    """Teacher-forced chain acceptance on `examples` (see the module docstring)."""
    was_training = head.training
    head.eval()
    results = []
    with torch.no_grad():
        for chunk in range(0, len(examples), 8):
            batch = batches.collate(examples[chunk : chunk + 8], lookup, device, dtype)
            results.append((ttt.unroll(head, batch, steps), batch.starts))
    head.train(was_training)
    tried = [0] * steps
    kept = [0] * steps
    for result, starts in results:
        anchors = result.valid[0]
        generated = torch.arange(anchors.shape[1], device=anchors.device)[None, :] + 1 >= starts[:, None]
        alive = anchors & generated
        for k, (agree, valid) in enumerate(zip(result.agreed, result.valid)):
            alive = alive & valid
            tried[k] += int(alive.sum())
            alive = alive & agree
            kept[k] += int(alive.sum())
    return Evaluation([kept[k] / tried[k] if tried[k] else 0.0 for k in range(steps)], steps)


def _learning_rate(settings: TrainSettings, step: int, fraction: float) -> float:
    warmup = min(1.0, (step + 1) / 20)
    return settings.learning_rate * warmup * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(fraction, 1.0))))


class Progress:
    """One tqdm bar per phase on stderr, counted in the phase's own units (held-out and training sequences, then
    steps), its total an estimate from the phase's measured rate that is revised as it goes; plain lines when
    the bar is off."""

    def __init__(self, settings: TrainSettings) -> None:
        self.enabled = settings.progress_bar
        self.bar = None

    def begin(self, description: str, unit: str, estimate: int | None, initial: int = 0) -> None:
        """A new bar for a phase (the previous one closed), `estimate` units expected (None: not known yet),
        `initial` of them done in earlier sessions."""
        self.close()
        if self.enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=estimate, initial=initial, unit=unit, desc=description, file=sys.stderr,
                            leave=True)  # fmt: skip

    def advance(self, count: int, estimate: int | None = None, **postfix) -> None:
        """`count` more units done; `estimate`: the revised total (at least what is done)."""
        if self.bar is None:
            return
        if estimate is not None:
            self.bar.total = max(estimate, self.bar.n + count)
        if postfix:
            self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(count)

    def say(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


HELD_OUT_SHARE = 0.25  # at most this share of the data budget goes to held-out continuations
FIRST_BATCH = 4  # sequences in a generation batch before any rate is measured


def projected_total(done: int, spent_s: float, left_s: float, cap: int | None = None) -> int | None:
    """Units a phase will reach: `done` plus what its measured rate fits in `left_s` (None before any
    measurement), at most `cap`."""
    if done <= 0 or spent_s <= 0:
        return cap
    total = done + int(max(left_s, 0.0) * done / spent_s)
    return total if cap is None else min(total, cap)


def batch_that_fits(wanted: int, seconds_per_sequence: float | None, left_s: float) -> int:
    """How many sequences the next generation batch holds: `wanted`, fewer when the measured seconds per
    sequence say they would not finish in `left_s`, 0 when not even one would."""
    if left_s <= 0:
        return 0
    if seconds_per_sequence is None:
        return wanted
    return max(0, min(wanted, int(left_s / seconds_per_sequence)))


def _generate_within(
    run_batch: Callable[[list[list[int]], float], list[Example]],
    prompts: Iterator[list[int]],
    wanted: int,
    batch: int,
    seconds: float,
    rate: float | None,
    on_batch: Callable[[list[Example], int, float], None],
) -> tuple[int, float | None]:
    """Generate up to `wanted` sequences in batches of up to `batch`, within `seconds`: each batch is sized to
    the time left from the measured seconds per sequence (`rate`, revised per batch) and decoding stops at the
    deadline. `on_batch(examples, prompts_used, seconds)` after each. Returns (prompts used, rate)."""
    began = time.perf_counter()
    deadline = began + seconds
    used = made = 0
    while made < wanted:
        left = deadline - time.perf_counter()
        count = batch_that_fits(min(batch, wanted - made), rate, left)
        if rate is None:
            count = min(count, FIRST_BATCH)  # a small first batch measures the rate the next ones are sized by
        if count == 0 and made == 0 and left > 0:
            count = 1  # one sequence, cut at the deadline, tells the rate and may be all there is
        if count == 0:
            break
        chunk = list(itertools.islice(prompts, count))
        if not chunk:
            break
        started = time.perf_counter()
        examples = run_batch(chunk, deadline)
        spent = time.perf_counter() - started
        used, made = used + len(chunk), made + len(examples)
        if examples:
            rate = spent / len(examples)
        on_batch(examples, len(chunk), spent)
        if time.perf_counter() >= deadline:
            break
    return used, rate


def _prompts(documents, tokenizer, settings: TrainSettings, seed: int, skip: int):
    source = iter(PromptSource(documents, tokenizer, settings.prompt_tokens, seed, settings.chat_share,
                               settings.open_share))  # fmt: skip
    return itertools.islice(source, skip, None)


@dataclass
class PromptStreams:
    """Where a run's prompts come from: held-out ones, training ones after the first `skip`, and a line that
    says what was read."""

    held_out: Callable[[], Iterator[list[int]]]
    training: Callable[[int], Iterator[list[int]]]
    described: str


def prompt_streams(settings: TrainSettings, target, tokenizer) -> PromptStreams:
    """The prompts of `settings.chat` (`train_draft.chat`) when given, else of the local text `settings.text`."""
    if settings.chat is not None:
        index = chat.load_index(chat.resolve_chat_file(settings.chat))
        training, held = chat.split_entries(index.entries, settings.seed)
        limit = chat.context_limit(target, tokenizer, settings.new_tokens, settings.chat_context)
        train_source = chat.ChatPrompts(index, training, tokenizer, limit, settings.seed)
        held_source = chat.ChatPrompts(index, held, tokenizer, limit, settings.seed + 1)
        cut = "" if index.complete else " (the file is cut off after them)"
        described = (f"{len(index.entries)} conversations{cut}: {len(training)} training, {len(held)} held-out, "
                     f"prompts of at most {limit} tokens")  # fmt: skip
        return PromptStreams(lambda: held_source.prompts(0), train_source.prompts, described)
    if not settings.text:
        raise ValueError("no prompts: give --text FILES or --chat FILE (a ShareGPT-format JSON, or sharegpt)")
    train_docs, held_docs = split_documents(read_documents(list(settings.text), settings.extensions))
    return PromptStreams(
        lambda: _prompts(held_docs, tokenizer, settings, settings.seed + 1, 0),
        lambda skip: _prompts(train_docs, tokenizer, settings, settings.seed, skip),
        f"{len(train_docs)} training and {len(held_docs)} held-out documents",
    )


def vocabulary_size(settings: TrainSettings, counts: torch.Tensor, say: Callable[[str], None]) -> int:
    """V_d for the target's answer-token counts [V]: `draft_vocab` (fewer when the target chose fewer tokens, at
    least 1024), or with "auto" the smallest V_d covering `vocab_coverage` of them, its coverage curve said."""
    if settings.draft_vocab == "auto":
        choice = size_for_coverage(counts, settings.vocab_coverage)
        for line in choice.lines():
            say(line)
        return choice.size
    return min(int(settings.draft_vocab), max(1024, int((counts > 0).sum())))


def train(settings: TrainSettings, target=None, tokenizer=None) -> TrainResult:
    """Run (or resume) one training run; `target`/`tokenizer` may be given already loaded."""
    run = RunDirectory(settings.output)
    progress = run.progress()
    clock = Clock(settings.minutes * 60.0, progress.get("seconds", {}))
    device = choose_device(settings.device)
    if target is None:
        target, tokenizer = load_target(settings.target, device, settings.target_precision)
    device = hf_compat.model_device(target)
    chosen = cpu_threads.for_call(target, device)  # measured on a CPU unless the caller fixed it
    dtype = torch.float32
    depth = int(hf_compat.text_config(target).num_hidden_layers)
    layers = default_feature_layers(depth)
    tap = LayerTap(target, layers)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    vocab_size = int(dense_rows(target.get_output_embeddings()).shape[0])
    eos = getattr(target.generation_config, "eos_token_id", None) or tokenizer.eos_token_id
    eos_ids = [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None]
    bar = Progress(settings)
    if chosen is not None:
        bar.say(f"train-draft: {chosen.threads} thread(s) ({chosen.source}: {chosen.reason})")

    def save_progress(**extra) -> None:
        clock.elapsed()
        progress.update(seconds=clock.spent, **extra)
        run.save_progress(progress)

    def run_batch(prompts: list[list[int]], deadline: float) -> list[Example]:
        return generate_examples(target, tap, prompts, settings.new_tokens, pad_id, eos_ids, settings.top_k, deadline)

    # 1-2: data (held-out first, at most HELD_OUT_SHARE of the data budget; then training data until the budget)
    streams = prompt_streams(settings, target, tokenizer)
    bar.say(f"train-draft: prompts from {streams.described}")
    clock.phase("data")
    data_budget = settings.data_share * clock.total_s
    rate = progress.get("seconds_per_sequence")
    held_out = run.held_out()
    if held_out is None:
        held_out = []
        bar.begin("held-out data", "seq", settings.held_out)

        def keep_held_out(examples: list[Example], _used: int, _spent: float) -> None:
            held_out.extend(examples)
            bar.advance(len(examples))

        seconds = HELD_OUT_SHARE * max(data_budget - clock.elapsed(), 0.0)
        source = streams.held_out()
        _, rate = _generate_within(run_batch, source, settings.held_out, settings.generation_batch, seconds, rate,
                                   keep_held_out)  # fmt: skip
        bar.close()
        if held_out:
            run.save_held_out(held_out)
        save_progress(seconds_per_sequence=rate)
        bar.say(f"held-out: {len(held_out)} continuations of held-out prompts "
                f"({seconds:.0f} s allowed: {HELD_OUT_SHARE:.0%} of the data budget)")  # fmt: skip
    used = progress.get("prompts_used", 0)
    sequences = progress.get("sequences", 0)
    wanted = settings.max_sequences - sequences if settings.max_sequences is not None else 1 << 40
    data_left = data_budget - clock.elapsed()  # the data phase comes first: all time spent so far is its
    training_started = (run.state / "head.pt").is_file()  # the vocabulary is chosen: the data stays as it is
    if not training_started and data_left > 0 and wanted > 0:
        phase = {"made": 0, "spent": 0.0}
        cap = None if settings.max_sequences is None else settings.max_sequences
        first = None if rate is None else sequences + int(data_left / rate)
        bar.begin("training data", "seq", first if cap is None or first is None else min(first, cap), sequences)

        def keep(examples: list[Example], count: int, spent: float) -> None:
            nonlocal used, sequences
            if examples:
                run.add_shard(examples)
            used, sequences = used + count, sequences + len(examples)
            phase["made"] += len(examples)
            phase["spent"] += spent
            save_progress(prompts_used=used, sequences=sequences)
            projected = projected_total(phase["made"], phase["spent"], data_budget - clock.elapsed())
            total = None if projected is None else sequences - phase["made"] + projected
            bar.advance(len(examples), total if cap is None or total is None else min(total, cap))

        source = streams.training(used)
        _, rate = _generate_within(run_batch, source, wanted, settings.generation_batch, data_left, rate, keep)
        bar.close()
        save_progress(prompts_used=used, sequences=sequences, seconds_per_sequence=rate)
    examples = run.training_examples()
    if not examples or not held_out:
        what = "training" if held_out else "held-out"
        raise RuntimeError(
            f"no {what} data: the data phase ({settings.data_share:g} of --minutes {settings.minutes:g}, "
            f"{clock.spent.get('data', 0.0):.0f} s spent) ended before a first sequence; run again with a larger "
            "--minutes (or --data-share) on the same --output: it resumes"
        )
    positions = sum(e.tokens.shape[0] for e in examples)
    bar.say(f"training data: {len(examples)} sequences, {positions} positions, "
            f"{clock.spent.get('data', 0.0):.0f} s of generation")  # fmt: skip

    # 3: vocabulary and head
    clock.phase("train")
    saved = run.load_state()
    if saved is None:
        counts = batches.token_counts(examples, vocab_size)
        size = vocabulary_size(settings, counts, bar.say)
        d2t, t2d = choose_vocabulary(counts, size)
        head = new_head(target, d2t, t2d, layers, settings.seed)
        progress["vocabulary_coverage"] = coverage(counts, t2d)
    else:
        head_state, _ = saved
        config = head_config(target, head_state["d2t"], head_state["t2d"], layers)
        head = Eagle3Head(config)
        head.load_state_dict(head_state)
    embedding_table = dense_rows(target.get_input_embeddings()).detach()
    head.use_target_embedding(embedding_table.to(dtype))
    head.to(device)
    head.train()
    parameters = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=settings.learning_rate, betas=(0.9, 0.95), weight_decay=0.0)
    if saved is not None:
        optimizer.load_state_dict(saved[1])
    lookup = batches.vocabulary_lookup(head.t2d.cpu())
    history = progress.setdefault("history", [])
    before = evaluate(head, held_out, lookup, settings.steps, device, dtype)
    if saved is None:
        progress["untrained"] = before.rates
        bar.say(f"held-out, untrained head: {before.line()}")
    step = progress.get("steps", 0)
    train_start = clock.spent.get("train", 0.0)
    train_budget = max(clock.left() + train_start, 1e-9)
    sampler = batches.epochs(examples, settings.batch_size, settings.seed + step)
    last_eval = last_save = time.perf_counter()

    def checkpoint(evaluation: Evaluation | None) -> None:
        run.save_state(head.state_dict(), optimizer.state_dict())
        embeddings = embedding_table if settings.embed_tokens else None
        save_head(head, run.root, "specforge", target_layers=depth, embeddings=embeddings)
        save_progress(steps=step)
        run.write_report(dict(settings=asdict(settings), steps=step, sequences=len(examples), positions=positions,
                              seconds=clock.spent, vocabulary_coverage=progress.get("vocabulary_coverage"),
                              untrained=progress.get("untrained"), history=history,
                              latest=evaluation.rates if evaluation else None))  # fmt: skip

    loss_value = float("nan")
    first_step, began = step, time.perf_counter()
    bar.begin("training", "step", settings.max_steps, step)
    while clock.left() > 0 and (settings.max_steps is None or step < settings.max_steps):
        done = step - first_step
        if done and clock.left() < (time.perf_counter() - began) / done:  # a step would not finish in time
            break
        batch = batches.collate(next(sampler), lookup, device, dtype)
        fraction = (clock.spent.get("train", 0.0)) / train_budget
        for group in optimizer.param_groups:
            group["lr"] = _learning_rate(settings, step, fraction)
        result = ttt.unroll(head, batch, settings.steps)
        optimizer.zero_grad(set_to_none=True)
        result.loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 0.5)
        optimizer.step()
        step += 1
        loss_value = float(result.loss.detach())
        projected = projected_total(step - first_step, time.perf_counter() - began, clock.left(), None)
        total = None if projected is None else first_step + projected
        bar.advance(1, total if settings.max_steps is None or total is None else min(total, settings.max_steps),
                    loss=f"{loss_value:.3f}")  # fmt: skip
        now = time.perf_counter()
        if now - last_eval >= settings.eval_every_s:
            evaluation = evaluate(head, held_out, lookup, settings.steps, device, dtype)
            history.append(dict(step=step, seconds=round(clock.elapsed()), loss=loss_value, rates=evaluation.rates))
            bar.say(f"step {step} ({clock.elapsed():.0f} s): loss {loss_value:.3f}; held-out {evaluation.line()}")
            last_eval = time.perf_counter()
        if now - last_save >= settings.checkpoint_every_s:
            checkpoint(None)
            last_save = time.perf_counter()
    after = evaluate(head, held_out, lookup, settings.steps, device, dtype)
    history.append(dict(step=step, seconds=round(clock.elapsed()), loss=loss_value, rates=after.rates))
    checkpoint(after)
    bar.close()
    print(f"train-draft: {step} steps on {len(examples)} sequences; held-out before {before.line()}; "
          f"after {after.line()}; head written to {run.root}", flush=True)  # fmt: skip
    return TrainResult(run.root, before, after, step, len(examples), history)
