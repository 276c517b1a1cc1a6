"""The rule-set API: thin Falcon resources over ``manage``."""

from __future__ import annotations

import asyncio

import falcon

from millm_host.api import JsonResource, operation

from . import manage
from .manage import AttachRequest, EvaluateRequest, RuleSetDocument
from .runtime import Runtime


class _Resource(JsonResource):
    def __init__(self, runtime: Runtime) -> None:
        super().__init__(runtime.host)
        self.runtime = runtime


class RuleSets(_Resource):
    """``GET /api/rule-sets``; ``POST /api/rule-sets/validate`` and ``/import``."""

    @operation("The imported rule sets")
    async def on_get(self, req, resp) -> None:
        resp.media = manage.list_sets(self.runtime)

    @operation("Run every check on a rule set, cases included; nothing is stored", request=RuleSetDocument)
    async def on_post_validate(self, req, resp) -> None:
        document = await self.parse_json(await self.raw_body(req))
        resp.media = await asyncio.to_thread(manage.validate_document, self.runtime, document)

    @operation(
        "Import a rule set as published (it must pass every check and its cases)",
        request=RuleSetDocument,
        status=201,
        errors=(409,),
    )
    async def on_post_import(self, req, resp) -> None:
        raw = await self.raw_body(req)  # stored as the bytes received
        document = await self.parse_json(raw)
        resp.media = await asyncio.to_thread(manage.import_document, self.runtime, raw, document)
        resp.status = falcon.HTTP_201


class RuleSetItem(_Resource):
    """One rule set: read, delete, evaluate."""

    @operation("One rule set, with its document", errors=(404,))
    async def on_get(self, req, resp, rule_set_id: str) -> None:
        loaded = manage.loaded_or_404(self.runtime, rule_set_id)
        resp.media = await asyncio.to_thread(manage.describe, self.runtime, loaded, True)

    @operation("Delete a rule set (detach it first)", errors=(404, 409))
    async def on_delete(self, req, resp, rule_set_id: str) -> None:
        resp.media = await asyncio.to_thread(manage.delete, self.runtime, rule_set_id)

    @operation(
        "Run the rule set on sent text (spans with return_rule_positions)", request=EvaluateRequest, errors=(404,)
    )
    async def on_post_evaluate(self, req, resp, rule_set_id: str) -> None:
        body = await self.json(req)
        resp.media = await asyncio.to_thread(manage.evaluate_text, self.runtime, rule_set_id, body)


class RuleSignals(_Resource):
    """``/api/probes/behaviours/{key}/rule-signals``: the set that runs beside a behaviour's probes."""

    @operation("The rule set attached to a behaviour")
    async def on_get(self, req, resp, key: str) -> None:
        resp.media = manage.behaviour_view(self.runtime, key)

    @operation("Attach a rule set to a behaviour", request=AttachRequest, errors=(404,))
    async def on_put(self, req, resp, key: str) -> None:
        body = await self.json(req)
        resp.media = await asyncio.to_thread(manage.attach, self.runtime, key, body)

    @operation("Detach the behaviour's rule set", errors=(404,))
    async def on_delete(self, req, resp, key: str) -> None:
        resp.media = await asyncio.to_thread(manage.detach, self.runtime, key)


class RuleRunner(_Resource):
    """``GET /api/rule-runner``: the sidecar that runs operator code (code_rule)."""

    @operation("The rule runner: whether it runs, its pid, how often it was started, its limits")
    async def on_get(self, req, resp) -> None:
        resp.media = self.runtime.runner.status()


def install(runtime: Runtime, add_route) -> None:
    sets, item = RuleSets(runtime), RuleSetItem(runtime)
    add_route("/api/rule-sets", sets)
    add_route("/api/rule-sets/validate", sets, suffix="validate")
    add_route("/api/rule-sets/import", sets, suffix="import")
    add_route("/api/rule-sets/{rule_set_id}", item)
    add_route("/api/rule-sets/{rule_set_id}/evaluate", item, suffix="evaluate")
    add_route("/api/probes/behaviours/{key}/rule-signals", RuleSignals(runtime))
    add_route("/api/rule-runner", RuleRunner(runtime))
