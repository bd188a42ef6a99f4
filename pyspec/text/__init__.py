"""Text in and out: tokenizers, chat templates, vocabularies, stop strings, conversation fitting."""
