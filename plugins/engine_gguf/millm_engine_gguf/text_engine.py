"""What both GGUF engines do with the vocabulary alone: tokenize, decode, render chats.

``GGUFEngine`` (llama.cpp in this process) and ``ProcessEngine`` (llama.cpp in a
child process) share this base. It needs only a ``LlamaModel``: the full model
in-process, a vocabulary-only load beside a child process. So tokenizing and
decoding never cross the pipe (the host decodes twice per generated token).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from llama_cpp._internals import LlamaModel

from millm_host.api import ContextLengthExceeded, Engine, FieldNotHonoured, HookPoint, InvalidParameter, LayerHook

from . import control
from .chat import ChatTemplate
from .spec import ENGINE_NAME
from .token_floor import TokenFloor, WordFloor
from .vocab import Vocab


class GGUFTextEngine(Engine):
    """A GGUF model's vocabulary, chat template and request checks. No compute here."""

    name = ENGINE_NAME
    hook_points = ()

    def __init__(self, model: LlamaModel) -> None:
        self._text_model = model
        self.vocab = Vocab(model.model)
        self.metadata = model.metadata()
        bos = self.vocab.bos()
        self.bos_text = self.vocab.piece(bos, special=True).decode("utf-8", "replace") if bos is not None else None
        eos = model.token_eos()
        eos_text = self.vocab.piece(eos, special=True).decode("utf-8", "replace") if eos >= 0 else ""
        template = self.metadata.get("tokenizer.chat_template")
        self.template = ChatTemplate(template, self.bos_text or "", eos_text) if template else None
        self._token_floor: TokenFloor | WordFloor | None = None
        self._token_floor_read = False

    @property
    def steering_points(self) -> tuple[HookPoint, ...]:
        """Where llama.cpp's control vectors add (see ``control``); no hook point reads."""
        return control.steering_points(self.info.n_layers)

    # --- text -------------------------------------------------------------------------
    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidParameter(f"the text is not valid Unicode: {exc.reason} at character {exc.start}") from None
        return self.vocab.tokenize(data, add_special_tokens)

    def min_tokens(self, texts: Sequence[str]) -> int:
        """From the longest piece in the vocabulary (``token_floor``), found on the first call (reading every
        piece of a 150,000-token vocabulary takes about a tenth of a second: not at load)."""
        if not self._token_floor_read:
            with self.vocab.in_use():
                self._token_floor, self._token_floor_read = TokenFloor.of(self.vocab.vocab, self.vocab.size), True
        floor = self._token_floor
        return 0 if floor is None else floor.tokens(texts)

    def decode(self, ids: Sequence[int]) -> str:
        return self.vocab.detokenize(ids).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        return self.vocab.piece(token_id, special=True)

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The file's own template. ``template_kwargs`` are not passed: the host reports them."""
        if tools:
            raise FieldNotHonoured("tools cannot be honoured by the gguf engine", param="tools")
        if self.template is None:
            return super().render_chat(
                messages, add_generation_prompt=add_generation_prompt, tools=tools, template_kwargs=template_kwargs
            )
        return self.template.render(messages, add_generation_prompt)

    # --- checks -----------------------------------------------------------------------
    def check_generation(
        self,
        prompt_ids: Sequence[int],
        hooks: Sequence[LayerHook],
        logits_processors: Sequence[Callable[[Sequence[int], Any], Any]],
    ) -> tuple[list[int], control.LayerVectors]:
        """Refuse what ``generate`` cannot do, before any token: hooks other than additive vectors
        at a served point, constraints, a prompt past the window. The prompt and the control vectors."""
        vectors = control.layer_vectors(hooks, self.info.n_layers, self.info.d_model)
        if logits_processors:
            raise FieldNotHonoured("the gguf engine cannot constrain generation", param=None)
        window = self.info.context_window
        if window is not None and len(prompt_ids) >= window:
            raise ContextLengthExceeded(
                f"this model's maximum context length is {window} tokens; the prompt has {len(prompt_ids)} tokens",
                param="messages",
            )
        self.vocab.check(prompt_ids, param="prompt")
        return list(prompt_ids), vectors

    def close_text(self) -> None:
        """Free the vocabulary's model (after everything else, and once no thread reads it)."""
        self.vocab.retire()
        self._text_model.close()
