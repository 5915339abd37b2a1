"""The RL guard: rules over a GRPO stage's step metrics that catch reward hacking and collapse
while the stage runs (guard.rules; guard.skill for the held-out probe's, with the paired readings
of guard.paired), the verdict they give (guard.watch) and the stop that names every rule tripped
at its step (guard.stop). Pure: no Prefect, no MLflow, no torch; the stage acts on the verdict
and reports it."""
