"""Analysis tools over algorithms' outputs: scoring estimators against exact advantages
(``arena``) and ablation grids over the GRPO family (``ablation``)."""
