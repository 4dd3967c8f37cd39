"""Where litellm's model map disagrees with AWS's Bedrock model cards, the card wins: rows that
`proxy.tokenizers.map_corrections` applies with its own (the map key, the card's context window
and output limit, the card's page, the date it was read).

A Bedrock model is looked up by the foundation model's id: a regional or global inference
profile's id (`us.amazon.nova-premier-v1:0`) falls back to it (`proxy.core.models.model_registry`),
so one row corrects every profile of the model. What each maker's models are counted with: Claude
by a bound (no tokenizer of Claude ships), Llama 3.x and 4 and Mistral's by their own
vocabularies (exact), DeepSeek's and Qwen's too, OpenAI's gpt-oss by o200k_base; Amazon Nova,
Writer, Cohere and AI21 by the `open` family bound (no vocabulary of theirs is published).
"""

from __future__ import annotations

_CARDS = "https://docs.aws.amazon.com/bedrock/latest/userguide/"

# (map key, context window, max output tokens, source, checked)
BEDROCK_CORRECTIONS: tuple[tuple[str, int, int, str, str], ...] = (
    # "Context window: 1M tokens · Max output tokens: 25K"; the map says 10,000 output tokens.
    ("amazon.nova-premier-v1:0", 1_000_000, 25_000, _CARDS + "model-card-amazon-nova-premier.html", "2026-12-02"),
)
