"""OpenAI's Batch API: uploaded files (``/v1/files``) and batches over them (``/v1/batches``).

``store``: files in the data directory and their rows; ``lines``: reading and
validating an input file; ``runner``: running a batch's lines in the background,
through ``host.serving[endpoint].handle`` as live requests are, at a lower
priority; ``resources``: the routes. State lives in the host's own tables
(``tables``, migrated as ``alembic_version_batch``), so a batch resumes after a restart.
"""
