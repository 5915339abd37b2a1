"""The RL guard: rules over a GRPO stage's step metrics that catch reward hacking and collapse
while the stage runs (guard.rules), and the verdict they give (guard.watch). Pure: no Prefect,
no MLflow, no torch; the stage acts on the verdict and reports it."""
