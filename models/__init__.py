"""Model and tokenizer machinery shared by the stages: build, train a tokenizer, load, chat."""
