"""Integrations: a stage inside another library's model pipeline.

* ``xstage.integrations.transformers`` (the ``xstage[transformers]`` extra): a transformers
  model's vision tower replaced, for the length of a ``with`` block, by a proxy that runs an
  opened ``Stage``. ``offload(model, "visual", stage)``.
* ``xstage.integrations.tiny``: transformers' own Qwen3.5 / Qwen3-VL generation models built
  from tiny configs with fixed random weights (the exporter's tiny tower, extended to the
  language model), and (image, prompt) pairs for them, so a pipeline runs with no download.
* ``xstage.integrations.vllm_omni``: vLLM-Omni's external-stage API (``plan_external_stage``,
  ``ExternalStage``, the graph backend's ``ExternalWorker``) backed by xstage's planner, ledger
  and ``open_stage`` (docs/engines.md).

Nothing here is imported by ``import xstage``: torch and transformers are imported only by
these modules.
"""

__all__: list[str] = []
