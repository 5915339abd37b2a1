"""GRPO: group-normalised advantages, the clipped surrogate, KL estimators, loss aggregation,
and the trainer loop that uses them."""
