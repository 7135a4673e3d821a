"""A small NLI task the project generates itself, so that everything runs offline.

Each premise states who did what to what, where; the hypothesis restates, negates or adds to it:

- entailment: a part of the premise (``the cat found the ball .``);
- contradiction: the premise negated (``the cat did not find the ball .``, ``nobody found ...``);
- neutral: a reason or a doubt the premise never gives, or another object than the premise's.

Most labels show in the hypothesis's words; "another object" needs the premise too, and is what
separates a model that reads both sentences (up to 1.0) from one that does not (about 0.89).
The same seed gives the same rows.
"""

from __future__ import annotations

import random
from typing import Callable, Dict, List, Tuple

SUBJECTS = ["cat", "dog", "bird", "horse", "teacher", "child", "farmer", "doctor", "pilot",
            "singer", "baker", "student", "sailor", "painter", "driver", "nurse"]
OBJECTS = ["ball", "apple", "book", "letter", "car", "cake", "song", "box", "door", "map",
           "lamp", "chair", "bottle", "picture", "key", "basket"]
VERBS = [("found", "find"), ("watched", "watch"), ("carried", "carry"), ("painted", "paint"),
         ("opened", "open"), ("moved", "move"), ("cleaned", "clean"), ("liked", "like")]
ADJECTIVES = ["small", "old", "happy", "quiet", "tall", "young", "brown", "clever"]
PLACES = ["in the park", "at home", "near the river", "in the city", "on the farm", "at school"]
REASONS = ["it was late", "it was raining", "someone asked", "it was fun"]

LABELS = ["entailment", "neutral", "contradiction"]

Scene = Dict[str, str]
Template = Callable[[Scene, random.Random], str]


def _other(rng: random.Random, choices: List[str], not_this: str) -> str:
    return rng.choice([c for c in choices if c != not_this])


HYPOTHESES: Dict[str, List[Template]] = {
    "entailment": [
        lambda s, r: f"the {s['subj']} {s['past']} the {s['obj']} .",
        lambda s, r: f"the {s['adj']} {s['subj']} {s['past']} the {s['obj']} .",
    ],
    "contradiction": [
        lambda s, r: f"the {s['subj']} did not {s['base']} the {s['obj']} .",
        lambda s, r: f"nobody {s['past']} the {s['obj']} .",
    ],
    "neutral": [
        lambda s, r: f"the {s['subj']} {s['past']} the {_other(r, OBJECTS, s['obj'])} .",
        lambda s, r: f"the {s['subj']} {s['past']} the {s['obj']} because {r.choice(REASONS)} .",
        lambda s, r: f"the {s['subj']} may have {s['past']} the {s['obj']} again .",
    ],
}


def _scene(rng: random.Random) -> Scene:
    past, base = rng.choice(VERBS)
    return {"subj": rng.choice(SUBJECTS), "obj": rng.choice(OBJECTS), "adj": rng.choice(ADJECTIVES),
            "place": rng.choice(PLACES), "past": past, "base": base}


def example(rng: random.Random) -> Tuple[str, str, int]:
    """One (premise, hypothesis, label id) with the labels in equal shares."""
    scene = _scene(rng)
    premise = f"the {scene['adj']} {scene['subj']} {scene['past']} the {scene['obj']} {scene['place']} ."
    label = rng.randrange(len(LABELS))
    hypothesis = rng.choice(HYPOTHESES[LABELS[label]])(scene, rng)
    return premise, hypothesis, label


def generate(num_examples: int, seed: int) -> Dict[str, list]:
    """Columns ``premise``, ``hypothesis`` and ``label``, ready for ``Dataset.from_dict``."""
    rng = random.Random(seed)
    rows = [example(rng) for _ in range(num_examples)]
    premises, hypotheses, labels = zip(*rows) if rows else ((), (), ())
    return {"premise": list(premises), "hypothesis": list(hypotheses), "label": list(labels)}
