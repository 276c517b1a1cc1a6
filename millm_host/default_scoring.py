"""Built-in plugin: what the host itself honours for scoring mode and embeddings.

The engines claim the scoring fields they can serve; the host claims the
embeddings fields it reads itself, declares its embeddings setting, and refuses
scoring-only fields on a request that is not a scoring request (they would
otherwise be accepted and ignored).
"""

from __future__ import annotations

from .context import RequestContext
from .errors import FieldNotHonoured
from .fields import is_no_change
from .hookspecs import hookimpl
from .settings import Setting

#: Fields that mean something only in scoring mode (logprobs or allowed_token_ids, max_tokens 1).
SCORING_ONLY_FIELDS = ("return_tokens_as_token_ids", "scoring_precision")


@hookimpl(trylast=True)
def register_settings(register) -> None:
    register(Setting(
        "EMBEDDINGS_MAX_INPUTS", int, 256,
        "Most strings one /v1/embeddings request may carry (400 invalid_parameter above)",
    ))


@hookimpl(trylast=True)
def register_request_fields(register) -> None:
    # The host reads these itself, whatever the engine; engines claim pooling.
    register("embeddings", ("input", "encoding_format", "normalize"))


@hookimpl(tryfirst=True)
def validate_request(ctx: RequestContext) -> None:
    """Refuse a scoring-only field sent outside scoring mode rather than ignore it."""
    if ctx.scoring or ctx.endpoint == "embeddings":
        return
    for name in SCORING_ONLY_FIELDS:
        if name in ctx.body and not is_no_change(name, ctx.body[name]):
            raise FieldNotHonoured(
                f"{name} applies only to scoring requests (logprobs or allowed_token_ids, with max_tokens: 1)",
                param=name,
            )
