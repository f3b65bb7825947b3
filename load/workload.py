"""The traffic: deterministic requests whose text lengths follow a realistic, long-tailed mix.

Real reviews are mostly a sentence or two with a long tail of essays. Word counts are drawn from a
lognormal distribution and capped (the tokenizer truncates long texts anyway, so a longer text
costs no more than the cap). The same seed always gives the same requests, so every target of a
comparison receives identical traffic.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from build_models.demo_data import make_reviews

# Median of about 20 words, about 10% above 60 words: most short, some long.
DEFAULT_MEDIAN_WORDS = 20.0
DEFAULT_SIGMA = 0.9
DEFAULT_MAX_WORDS = 200
DEFAULT_SEED = 20241010


@dataclass(frozen=True)
class TextMix:
    """Parameters of the word-count distribution of the texts."""

    median_words: float = DEFAULT_MEDIAN_WORDS
    sigma: float = DEFAULT_SIGMA
    max_words: int = DEFAULT_MAX_WORDS
    seed: int = DEFAULT_SEED


def _vocabulary_sentences(seed: int) -> list[list[str]]:
    # Sentences of the demo reviews: real words the tokenizer knows, so token counts are realistic.
    sentences: list[list[str]] = []
    for text, _ in make_reviews(400, seed):
        sentences.extend(
            sentence.split() for sentence in text.replace("!", ".").split(".") if sentence.strip()
        )
    return sentences


def word_counts(count: int, mix: TextMix) -> list[int]:
    """``count`` word counts drawn from the mix (at least 1, at most ``mix.max_words``)."""
    rng = random.Random(mix.seed)
    mu = math.log(mix.median_words)
    return [
        max(1, min(mix.max_words, round(rng.lognormvariate(mu, mix.sigma)))) for _ in range(count)
    ]


def make_texts(count: int, mix: TextMix = TextMix()) -> list[str]:
    """``count`` review-like texts whose word counts follow ``mix``; deterministic for a seed."""
    rng = random.Random(mix.seed + 1)
    sentences = _vocabulary_sentences(mix.seed)
    texts = []
    for words_wanted in word_counts(count, mix):
        words: list[str] = []
        while len(words) < words_wanted:
            words.extend(rng.choice(sentences))
        texts.append(" ".join(words[:words_wanted]) + ".")
    return texts


def make_requests(count: int, texts_per_request: int, mix: TextMix = TextMix()) -> list[list[str]]:
    """``count`` requests of ``texts_per_request`` texts each, drawn from the mix."""
    if texts_per_request < 1:
        raise ValueError("texts_per_request must be at least 1")
    texts = make_texts(count * texts_per_request, mix)
    return [texts[i : i + texts_per_request] for i in range(0, len(texts), texts_per_request)]


def typical_request(texts_per_request: int, mix: TextMix = TextMix()) -> list[str]:
    """A request of median-length texts: the probe for first-request (cold start) latency."""
    texts = sorted(make_texts(201, mix), key=lambda text: len(text.split()))
    return [texts[100]] * texts_per_request
