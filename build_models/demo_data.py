"""A deterministic, synthetic set of product reviews with 1-5 star ratings (the default training data).

It is generated, not collected: good enough to train a forest that maps sentiment to a score and
to exercise every part of the pipeline, not a benchmark of model quality.
"""

from __future__ import annotations

import random

PRODUCTS = [
    "headphones",
    "coffee maker",
    "running shoes",
    "laptop stand",
    "blender",
    "backpack",
    "phone case",
    "desk lamp",
    "water bottle",
    "keyboard",
    "vacuum cleaner",
    "tent",
    "electric kettle",
    "office chair",
    "smart watch",
    "yoga mat",
    "air fryer",
    "monitor",
]

OPENINGS = {
    1: [
        "Terrible {p}.",
        "Do not buy this {p}.",
        "Worst {p} I have ever owned.",
        "Complete waste of money.",
    ],
    2: [
        "Disappointing {p}.",
        "The {p} is below average.",
        "Not great, not awful, mostly bad.",
        "I expected more from this {p}.",
    ],
    3: [
        "It's an okay {p}.",
        "Average {p}, does the job.",
        "Mixed feelings about this {p}.",
        "The {p} is fine for the price.",
    ],
    4: [
        "Good {p}.",
        "Pretty happy with this {p}.",
        "Solid {p}, a few small issues.",
        "Would recommend this {p} to friends.",
    ],
    5: [
        "Excellent {p}!",
        "Absolutely love this {p}.",
        "Best {p} I have bought in years.",
        "Perfect {p}, five stars.",
    ],
}

DETAILS = {
    1: [
        "It broke after two days.",
        "Customer support never answered.",
        "It arrived damaged and dirty.",
        "The battery died within an hour.",
        "Cheap plastic that cracked immediately.",
    ],
    2: [
        "It works sometimes but feels flimsy.",
        "Shipping was slow and the box was dented.",
        "The instructions were confusing.",
        "Build quality is poor for the money.",
    ],
    3: [
        "Nothing special, but it works.",
        "Some features are nice, others are missing.",
        "Delivery was on time.",
        "It is a bit noisy but usable.",
    ],
    4: [
        "Works well and looks nice.",
        "Setup took five minutes.",
        "Battery life is good.",
        "Comfortable and well made, though a little pricey.",
    ],
    5: [
        "Works flawlessly every day.",
        "Build quality is outstanding.",
        "Arrived early and well packed.",
        "Worth every penny, I bought a second one.",
    ],
}

FILLER = [
    "I have been using it for a few weeks now.",
    "My partner uses it as well.",
    "I compared several brands before choosing.",
    "The colour matches the photos.",
    "I use it mostly at home and sometimes when travelling.",
    "Packaging was recyclable.",
]


def make_reviews(count: int = 2000, seed: int = 20241010) -> list[tuple[str, float]]:
    """Return ``count`` (text, rating) pairs; the same arguments always give the same list.

    Lengths are long-tailed like real reviews: most are one or two sentences, a few run long.
    Ratings carry a little label noise so the regression is not trivially separable.
    """
    rng = random.Random(seed)
    reviews = []
    for _ in range(count):
        rating = rng.randint(1, 5)
        product = rng.choice(PRODUCTS)
        sentences = [rng.choice(OPENINGS[rating]).format(p=product)]
        extra = min(int(rng.expovariate(0.8)), 12)
        for _ in range(extra):
            pool = DETAILS[rating] if rng.random() < 0.7 else FILLER
            sentences.append(rng.choice(pool))
        noisy = rating + rng.choice([0, 0, 0, 0, 0.5, -0.5])
        reviews.append((" ".join(sentences), float(min(5.0, max(1.0, noisy)))))
    return reviews
