"""A small NLI task the project generates itself, so that everything runs offline.

Each premise states who did what to what, and often where (``the old cat found the ball in the park .``).
In version 2 (``data.synthetic_version``, the default) three in five hypotheses say where it happened,
and their label is in how that compares with the premise:

- ``the cat found the ball in the park .``: entailment at the premise's place, contradiction at
  another place, neutral when the premise names no place;

the rest show their label in the hypothesis alone: a part of the premise (entailment), the premise
negated (contradiction), a reason the premise never gives (neutral).

A model that reads the hypothesis alone reaches 0.6 (chance is 1/3). A small model learns next
whether the premise names a place, and last to compare the two places, so the learning rate, the
training's length and the seed show in how far it gets (the quickstart: 0.86 to 0.99).

Version 1, the task until November 2026, is kept so that runs started on it go on with the same
rows: all but one kind of its hypotheses show their label alone, and every learning rate, length and
seed the quickstart tried ended at 0.883, the hypothesis alone's ceiling. The same seed gives the
same rows.
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
# Version 1 draws from the first six; version 2 from all twelve, so that two places rarely agree by chance.
PLACES = ["in the park", "at home", "near the river", "in the city", "on the farm", "at school",
          "in the garden", "by the sea", "in the kitchen", "at the station", "in the forest", "on the bus"]
REASONS = ["it was late", "it was raining", "someone asked", "it was fun"]
WHERE = 0.6  # version 2: the share of hypotheses that say where, whose label needs the premise

LABELS = ["entailment", "neutral", "contradiction"]

Scene = Dict[str, str]
Template = Callable[[Scene, random.Random], str]
Example = Tuple[str, str, int]


def _other(rng: random.Random, choices: List[str], not_this: str) -> str:
    return rng.choice([c for c in choices if c != not_this])


def _scene(rng: random.Random, places: List[str]) -> Scene:
    past, base = rng.choice(VERBS)
    return {"subj": rng.choice(SUBJECTS), "obj": rng.choice(OBJECTS), "adj": rng.choice(ADJECTIVES),
            "place": rng.choice(places), "past": past, "base": base}


def _did(s: Scene) -> str:
    return f"the {s['subj']} {s['past']} the {s['obj']}"


def _premise(s: Scene, place: bool = True) -> str:
    return f"the {s['adj']} {s['subj']} {s['past']} the {s['obj']}{' ' + s['place'] if place else ''} ."


# -------------------------------------------------------------------------------------- version 2

# The hypotheses that show their label alone.
PLAIN: Dict[str, Template] = {
    "entailment": lambda s, r: f"{_did(s)} .",
    "contradiction": lambda s, r: r.choice([f"the {s['subj']} did not {s['base']} the {s['obj']} .",
                                            f"nobody {s['past']} the {s['obj']} ."]),
    "neutral": lambda s, r: f"{_did(s)} because {r.choice(REASONS)} .",
}


def _where(scene: Scene, label: str, rng: random.Random) -> Tuple[str, str]:
    """A premise and a hypothesis that says where: the label is in how their places compare."""
    if label == "neutral":
        return _premise(scene, place=False), f"{_did(scene)} {scene['place']} ."
    place = scene["place"] if label == "entailment" else _other(rng, PLACES, scene["place"])
    return _premise(scene), f"{_did(scene)} {place} ."


def _example_v2(rng: random.Random) -> Example:
    scene = _scene(rng, PLACES)
    label = rng.randrange(len(LABELS))
    if rng.random() < WHERE:
        premise, hypothesis = _where(scene, LABELS[label], rng)
    else:
        premise, hypothesis = _premise(scene, place=rng.random() < 0.5), PLAIN[LABELS[label]](scene, rng)
    return premise, hypothesis, label


# -------------------------------------------------------------------------------------- version 1

HYPOTHESES_V1: Dict[str, List[Template]] = {
    "entailment": [
        lambda s, r: f"{_did(s)} .",
        lambda s, r: f"the {s['adj']} {s['subj']} {s['past']} the {s['obj']} .",
    ],
    "contradiction": [
        lambda s, r: f"the {s['subj']} did not {s['base']} the {s['obj']} .",
        lambda s, r: f"nobody {s['past']} the {s['obj']} .",
    ],
    "neutral": [
        lambda s, r: f"the {s['subj']} {s['past']} the {_other(r, OBJECTS, s['obj'])} .",
        lambda s, r: f"{_did(s)} because {r.choice(REASONS)} .",
        lambda s, r: f"the {s['subj']} may have {s['past']} the {s['obj']} again .",
    ],
}


def _example_v1(rng: random.Random) -> Example:
    scene = _scene(rng, PLACES[:6])
    label = rng.randrange(len(LABELS))
    return _premise(scene), rng.choice(HYPOTHESES_V1[LABELS[label]])(scene, rng), label


VERSIONS: Dict[int, Callable[[random.Random], Example]] = {1: _example_v1, 2: _example_v2}


def example(rng: random.Random, version: int = 2) -> Example:
    """One (premise, hypothesis, label id) with the labels in equal shares."""
    return VERSIONS[version](rng)


def generate(num_examples: int, seed: int, version: int = 2) -> Dict[str, list]:
    """Columns ``premise``, ``hypothesis`` and ``label``, ready for ``Dataset.from_dict``."""
    rng = random.Random(seed)
    rows = [example(rng, version) for _ in range(num_examples)]
    premises, hypotheses, labels = zip(*rows) if rows else ((), (), ())
    return {"premise": list(premises), "hypothesis": list(hypotheses), "label": list(labels)}
