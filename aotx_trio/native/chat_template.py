"""A model's chat template (GGUF ``tokenizer.chat_template``), rendered safely.

The template is Jinja2 source, rendered in Jinja2's immutable sandbox the way the
Hugging Face chat templates are meant to be rendered (``trim_blocks``,
``lstrip_blocks``, the ``loopcontrols`` extension; the variables ``messages``,
``add_generation_prompt``, ``bos_token``, ``eos_token``, ``tools`` when given, and the
functions ``raise_exception`` and ``strftime_now``; ``tojson`` keeps non-ASCII).

**Caller text never becomes a control token.**  Every message's content is replaced
by a marker (a random nonce and the message's index) before rendering; the output is
cut at the markers into template text and caller pieces (:meth:`ChatTemplate.pieces`).
The caller (runtime/prompt.py) tokenizes the template's text with special tokens on
and each caller piece with special tokens off.  A template that transforms content
(so that a marker does not come out whole) is refused, never rendered approximately.

**Turns** (:meth:`ChatTemplate.turns`): the strings around one user and one model
turn, worked out by rendering probe conversations.  The conversation contexts
(runtime/prompt.py, "Revisions") lay their turns out with them, and the model
turn's closing text gives the end-of-turn tokens generation stops at
(:func:`turn_tokens`).  A template whose turns cannot be worked out this way keeps
the built-in markers for contexts (its messages still render through it).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from aotx_trio import errors

#: The built-in turn markers (Gemma's): used by models without a template.
LEGACY_MARKERS = ("<start_of_turn>user\n", "<end_of_turn>\n", "<start_of_turn>model\n")
#: the longest template source accepted (the largest published ones are ~10 KB)
MAX_SOURCE = 64 * 1024


#: the code of every refusal here: a template that does not compile, raises (its
#: ``raise_exception``), fails, or transforms message content
CODE = "chat_template_error"


def _refused(message: str, field: str = "messages") -> errors.InvalidInput:
    return errors.InvalidInput(message, code=CODE, field=field)


def _tojson(value: Any, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators,
                      sort_keys=sort_keys)


@dataclass(frozen=True)
class Turns:
    """The template's text around turns: ``preamble`` opens the prompt (before the
    first user turn's opening), then each user turn is ``user_open content
    user_close`` and each model turn ``model_open content model_close``;
    ``generation`` follows the last user turn's close to start the model's turn."""

    preamble: str
    user_open: str
    user_close: str
    model_open: str
    model_close: str
    generation: str


class ChatTemplate:
    """A compiled chat template.  ``name`` (the model's) goes into error messages."""

    def __init__(self, source: str, *, name: str = "", bos_token: str = "",
                 eos_token: str = "") -> None:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        self.name = name
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        if len(source) > MAX_SOURCE:
            raise _refused(f"{name}: the chat template has {len(source)} characters "
                           f"(at most {MAX_SOURCE})", "tokenizer.chat_template")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = self._raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise _refused(f"{name}: the chat template does not compile (line "
                           f"{exc.lineno}: {exc.message})", "tokenizer.chat_template") from None
        self._turns: Turns | bool | None = False    # False: not worked out yet

    def _raise_exception(self, message: str) -> None:
        raise _refused(f"the chat template of {self.name} refused the messages: {message}")

    def render(self, messages: Sequence[Mapping[str, Any]], *,
               add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """The template's output for these messages, as text."""
        import jinja2

        context: dict[str, Any] = {
            "messages": [dict(m) for m in messages],
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token, "eos_token": self.eos_token}
        if tools is not None:
            context["tools"] = [dict(t) for t in tools]
        try:
            return str(self._template.render(**context))
        except errors.AotxError:          # raise_exception's
            raise
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError,
                AttributeError, ZeroDivisionError) as exc:
            raise _refused(f"the chat template of {self.name} failed on these messages "
                           f"({type(exc).__name__}: {exc})") from None

    def pieces(self, roles: Sequence[str], *, add_generation_prompt: bool = True,
               ) -> list[str | int]:
        """The rendering of one message per role, each content a marker: template text
        (``str``) and, where the template put message ``i``'s content, ``i``.  Refused
        when the template changed a marker (it transforms content: unsafe to render)."""
        nonce = secrets.token_hex(8)
        marks = [f"\ue000{nonce}.{i}\ue001" for i in range(len(roles))]
        text = self.render([{"role": r, "content": m} for r, m in zip(roles, marks,
                                                                       strict=True)],
                           add_generation_prompt=add_generation_prompt)
        out: list[str | int] = []
        for k, part in enumerate(re.split(f"\ue000{nonce}\\.(\\d+)\ue001", text)):
            if k % 2:
                out.append(int(part))
            elif part:
                if "\ue000" in part or "\ue001" in part:   # a marker, changed
                    raise _refused(f"the chat template of {self.name} transforms message "
                                   "content; it cannot be rendered safely")
                out.append(part)
        return out

    def turns(self) -> Turns | None:
        """The text around user and model turns (class doc), or None when the template
        does not lay turns out as plain text around each content (worked out once)."""
        if self._turns is False:
            try:
                self._turns = self._work_out_turns()
            except errors.InvalidInput:
                self._turns = None
        assert not isinstance(self._turns, bool)
        return self._turns

    def _work_out_turns(self) -> Turns | None:
        def shape(roles: Sequence[str], gen: bool) -> list[str] | None:
            """The template text between the contents (one before each, one after the
            last), when every content comes out once, in order."""
            parts = self.pieces(roles, add_generation_prompt=gen)
            texts, want = [""], 0
            for p in parts:
                if isinstance(p, int):
                    if p != want:
                        return None
                    want += 1
                    texts.append("")
                else:
                    texts[-1] += p
            return texts if want == len(roles) else None

        one = shape(["user"], False)
        two = shape(["user", "assistant"], False)
        three = shape(["user", "assistant", "user"], False)
        gen = shape(["user"], True)
        if one is None or two is None or three is None or gen is None:
            return None
        head, user_close = one
        _, user_model, model_close = two
        _, _, model_user, last_close = three
        if not (two[0] == head and three[0] == head and three[1] == user_model
                and last_close == user_close and gen[0] == head
                and user_model.startswith(user_close) and model_user.startswith(model_close)
                and gen[1].startswith(user_close)):
            return None
        user_open = model_user[len(model_close):]
        if not head.endswith(user_open) or not user_open:
            return None
        return Turns(preamble=head[:len(head) - len(user_open)], user_open=user_open,
                     user_close=user_close, model_open=user_model[len(user_close):],
                     model_close=model_close, generation=gen[1][len(user_close):])


@dataclass(frozen=True)
class TurnTokens:
    """:class:`Turns` as tokens (template text tokenized with special tokens on), and
    the end-of-turn tokens: the control tokens that close a model turn."""

    preamble: list[int]
    user_open: list[int]
    user_close: list[int]
    model_open: list[int]
    model_close: list[int]
    generation: list[int]
    end_of_turn: frozenset[int]
    from_template: bool


def turn_tokens(template: ChatTemplate | None, special: Callable[[str], list[int]],
                plain: Callable[[str], list[int]], bos_id: int) -> TurnTokens:
    """The turns of ``template`` as tokens (``special``/``plain``: tokenize with special
    tokens on/off); without a template, or with one whose turns are not plain text
    around the contents, the built-in markers after the BOS token."""
    turns = template.turns() if template is not None else None
    if turns is None:
        user, end, model = (special(m) for m in LEGACY_MARKERS)
        return TurnTokens([bos_id] if bos_id >= 0 else [], user, end, model, end, model,
                          frozenset(), False)
    close = special(turns.model_close)
    # a control token is one that the text tokenizes to only with special tokens on
    eot = frozenset(close) - frozenset(plain(turns.model_close))
    return TurnTokens(special(turns.preamble) if turns.preamble else [],
                      special(turns.user_open), special(turns.user_close),
                      special(turns.model_open), close, special(turns.generation), eot, True)
