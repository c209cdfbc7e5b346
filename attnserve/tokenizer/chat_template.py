"""A chat template: how a list of chat messages becomes one prompt text, as Hugging Face keeps it (the
`chat_template` of tokenizer_config.json, a Jinja template rendered with `messages`,
`add_generation_prompt`, `bos_token` and `eos_token`).

`attnserve export --chat-template FILE` writes one into a BPE model's tokenizer_config.json; the
server's OpenAI-compatible /v1/chat/completions applies it. Rendered in Jinja's sandbox, as
transformers renders it. Torch-free and gRPC-free.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

CONFIG_FILE = "tokenizer_config.json"


class ChatTemplateError(ValueError):
    """The template does not compile, or does not render these messages: the message says why."""


def raise_exception(message: str) -> None:
    """What templates call to refuse messages (transformers gives them the same function)."""
    raise ChatTemplateError(message)


class ChatTemplate:
    """A compiled chat template."""

    def __init__(self, text: str, bos_token: str = "", eos_token: str = ""):
        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.globals["raise_exception"] = raise_exception
        try:
            self.template = environment.from_string(text)
        except TemplateError as e:
            raise ChatTemplateError(f"the chat template does not compile: {e}") from None
        self.text, self.bos_token, self.eos_token = text, bos_token, eos_token

    def render(self, messages: list[dict[str, Any]]) -> str:
        """The prompt for `messages`, ending where the assistant's answer starts."""
        try:
            return self.template.render(
                messages=messages, add_generation_prompt=True, bos_token=self.bos_token, eos_token=self.eos_token
            )
        except TemplateError as e:
            raise ChatTemplateError(f"the chat template does not render these messages: {e}") from None


def read_chat_template(model_dir: str | Path) -> ChatTemplate | None:
    """The model directory's chat template (tokenizer_config.json's chat_template), or None."""
    path = Path(model_dir) / CONFIG_FILE
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ChatTemplateError(f"not a JSON file: {e}") from None
    if not isinstance(config, dict):
        raise ChatTemplateError(f"a JSON object was expected, not {type(config).__name__}")
    text = default_template(config.get("chat_template"))
    if not text:
        return None
    return ChatTemplate(text, token_text(config.get("bos_token")), token_text(config.get("eos_token")))


def default_template(value: Any) -> str | None:
    """chat_template's text: a string, or from a list of named templates ({"name", "template"}, a format
    transformers reads) the one named "default", as transformers takes it when no name is asked."""
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise ChatTemplateError(f"chat_template: a string or a list of named templates, not {type(value).__name__}")
    named = {t.get("name"): t.get("template") for t in value}
    if "default" not in named:
        names = ", ".join(repr(name) for name in named) or "none"
        raise ChatTemplateError(f"chat_template: no template named 'default' among the list's ({names})")
    text = named["default"]
    if not isinstance(text, str):
        raise ChatTemplateError("chat_template: the template named 'default' is not a string")
    return text


def token_text(value: Any) -> str:
    """A tokenizer_config.json special token: a string, or an AddedToken's {"content": ...}; "" if unset."""
    return (value.get("content") if isinstance(value, dict) else value) or ""
