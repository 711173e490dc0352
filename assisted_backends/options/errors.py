"""Errors that name the options they are about, so every front end can say them in its own words.

The message is a template with a `{placeholder}` where each option goes: `str(error)` spells them as
`generate` takes them (`max_new_tokens`, or `dtype='fp16'` with its value), the CLI as flags
(`--max-new-tokens`, `--dtype fp16`) through `error.render(spell)`. No front end rewrites another's
messages.

    raise OptionError("{name} must be >= 1, got 0", name="max_new_tokens")
    raise OptionError("{dtype} is not supported on cuda", dtype=("dtype", "fp16"))

A refusal of planning is written once, in `options.fields.REFUSALS`, and raised by its key:

    raise refusal("streaming_batch", {"count": 3}, name="streamer", rows="input_ids")
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from assisted_backends.options.fields import REFUSALS

NO_VALUE = object()  # an option named without its value
Spelling = Callable[[str, Any], str]  # (option, value or NO_VALUE) -> text


def api_spelling(option: str, value: Any = NO_VALUE) -> str:
    """`max_new_tokens`, or `dtype='fp16'` with a value: the keyword arguments of `generate`."""
    return option if value is NO_VALUE else f"{option}={value!r}"


class OptionError(ValueError):
    """A value (or a combination) of options that cannot be used.

    `options` maps each placeholder of `template` to an option name, or to (option name, value).
    """

    def __init__(self, template: str, **options: str | tuple[str, Any]) -> None:
        self.template = template
        self.options = {key: (item if isinstance(item, tuple) else (item, NO_VALUE)) for key, item in options.items()}
        super().__init__(self.render(api_spelling))

    @property
    def option(self) -> str:
        """The (first) option the error is about."""
        return next(iter(self.options.values()))[0]

    def render(self, spell: Spelling) -> str:
        """The message with each option spelled by `spell`."""
        text = self.template
        for placeholder, (option, value) in self.options.items():
            text = text.replace("{" + placeholder + "}", spell(option, value))
        return text


class OptionTypeError(OptionError, TypeError):
    """An option of the wrong type (a float where an int is needed, ...)."""


class OptionNotSupported(OptionError, NotImplementedError):
    """A request this package cannot serve (a feature, not a value out of range)."""


KINDS: dict[str, type[OptionError]] = {"value": OptionError, "unsupported": OptionNotSupported,
                                       "type": OptionTypeError}  # fmt: skip


class _Placeholders(dict):
    """`str.format_map`'s mapping that leaves the option placeholders (`{name}`) for `OptionError` to spell."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def refusal(key: str, values: Mapping[str, Any] | None = None, **options: str | tuple[str, Any]) -> OptionError:
    """The refusal `options.fields.REFUSALS[key]`: its `{slots}` filled from `values`, its option placeholders
    from `options` (as `OptionError` takes them); raise what it returns."""
    kind, template = REFUSALS[key]
    return KINDS[kind](template.format_map(_Placeholders(values or {})), **options)
