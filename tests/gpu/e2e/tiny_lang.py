"""Synthetic languages a tiny Gemma 4 can learn in minutes, but only with context (train_models.py).

"chain" (LANGUAGE, the one the recorded models learned): four dialects, each a fixed cycle through 64 words; a
document names its dialect once, right after BOS, then follows that dialect's successor of each word, one word
in ten drawn at random instead. The dialect lies beyond the target's 64-token sliding window for most positions,
so only the full-attention layers see it; predicting k words ahead needs the chain applied k times, what a
drafter reading the target's hidden states can learn.

"copy" (kept, not used): plain words in fresh stretches (8-40 random words) and copies (32-160 words repeating
the document from at least MIN_COPY_DISTANCE words back, beyond the sliding window), a copy starting unannounced.
It needs an induction mechanism over the full layers; the 30-layer target stayed at the unigram loss for 700
steps of it, so the chain language replaced it.

Standard library only; every function is deterministic from its seed.
"""

from __future__ import annotations

import random

BOS = 2
FIRST_WORD = 16
NUM_WORDS = 512
MIN_COPY_DISTANCE = 96  # > the target's sliding window (train_models.TARGET_WINDOW = 64)


def document(rng: random.Random, length: int) -> list[int]:
    """BOS and `length` words."""
    words: list[int] = []
    while len(words) < length:
        if len(words) >= MIN_COPY_DISTANCE + 32 and rng.random() < 0.7:
            span = rng.randint(32, 160)
            src = rng.randint(0, len(words) - MIN_COPY_DISTANCE)
            for i in range(span):  # word by word: a source that runs into the copy itself repeats (a cycle)
                words.append(words[src + i])
        else:
            words.extend(rng.randrange(FIRST_WORD, FIRST_WORD + NUM_WORDS) for _ in range(rng.randint(8, 40)))
    return [BOS, *words[:length]]


# --- the "chain" language: four dialects, each a fixed permutation of CHAIN_WORDS words; a document names its
# dialect once, right after BOS, and then follows that dialect's chain (each word's successor), with one word in
# ten drawn at random instead. Predicting a word needs the dialect, which lies further back than the sliding
# window for most positions (only the full layers see it); predicting k words ahead needs the chain composed k
# times: what a drafter must learn. Easier to learn quickly than copying, which needs an induction mechanism.
CHAIN_WORDS = 64
DIALECTS = 4
DIALECT_TOKEN = FIRST_WORD + NUM_WORDS  # ids 528..531 name the dialect
NOISE = 0.1


def chains(seed: int = 97) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(DIALECTS):
        words = list(range(FIRST_WORD, FIRST_WORD + CHAIN_WORDS))
        rng.shuffle(words)
        succ = {w: words[(i + 1) % len(words)] for i, w in enumerate(words)}  # one cycle through all words
        out.append([succ[w] for w in range(FIRST_WORD, FIRST_WORD + CHAIN_WORDS)])
    return out


CHAINS = chains()


def chain_document(rng: random.Random, length: int) -> list[int]:
    d = rng.randrange(DIALECTS)
    w = rng.randrange(FIRST_WORD, FIRST_WORD + CHAIN_WORDS)
    words = [DIALECT_TOKEN + d, w]
    while len(words) < length:
        noise = rng.random() < NOISE
        w = rng.randrange(FIRST_WORD, FIRST_WORD + CHAIN_WORDS) if noise else CHAINS[d][w - FIRST_WORD]
        words.append(w)
    return [BOS, *words[:length]]


LANGUAGE = "chain"  # "chain" or "copy": which document() the training and the prompts use


def make_document(rng: random.Random, length: int) -> list[int]:
    return chain_document(rng, length) if LANGUAGE == "chain" else document(rng, length)


def training_batch(seed: int, step: int, batch: int, length: int) -> list[list[int]]:
    rng = random.Random(seed * 1_000_003 + step)
    return [make_document(rng, length) for _ in range(batch)]


def _ending_in_copy(rng: random.Random, n: int) -> list[int]:
    """A document of about n words whose last 12 words start a copy (of a source at least MIN_COPY_DISTANCE back)."""
    if LANGUAGE == "chain":
        return chain_document(rng, n)
    doc = document(rng, max(n - 12, MIN_COPY_DISTANCE + 16))
    words = doc[1:]
    src = rng.randint(0, len(words) - MIN_COPY_DISTANCE)
    return [BOS, *words, *words[src:src + 12]]


def eval_prompts(seed: int = 4321) -> list[dict[str, object]]:
    """The fixed prompt set of the acceptance runs: 48 text prompts of 100-1500 tokens, each ending 12 words into
    a copy (so the greedy continuation copies on), ids p00..p47, max_tokens 48-128."""
    rng = random.Random(seed)
    out: list[dict[str, object]] = []
    for i in range(48):
        n = 100 + (1400 * i) // 47
        out.append({"id": f"p{i:02d}", "token_ids": _ending_in_copy(rng, n), "max_tokens": 48 + (i * 11) % 81})
    return out


def long_context_prompts(seed: int = 8765) -> list[dict[str, object]]:
    """Prompts of growing length (the drafter's window is 256): acceptance by context length."""
    rng = random.Random(seed)
    out: list[dict[str, object]] = []
    for n in [64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072]:
        for j in range(3):
            doc = _ending_in_copy(rng, n)
            out.append({"id": f"L{n}-{j}", "context": n, "token_ids": doc, "max_tokens": 96})
    return out


def text_of(ids: list[int]) -> str:
    """Words as the tiny tokenizer spells them (w<id>), whitespace-separated; ids below the words left out."""
    return " ".join(f"w{i}" for i in ids if i >= FIRST_WORD)
