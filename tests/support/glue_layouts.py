"""Tiny GLUE directories written the way the original GLUE download lays each task out.

``LAYOUTS`` holds, per task, a few rows in each file with the real header (or none: CoLA's train
and dev), the real columns and the quirks that trip up a naive reader: unbalanced quotes in
SST-2, QQP and MRPC text, MRPC's byte-order mark, MNLI's parse columns and five annotator labels,
and test files without labels. ``EXPECTED`` is what the Hub's copy (``nyu-mll/glue``) holds for
those rows: text fields and label ids in the Hub's order, written out by hand.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Dict, List, Tuple

MNLI_HEAD = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
             "sentence1_parse", "sentence2_parse", "sentence1", "sentence2"]
STSB_HEAD = ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2"]


def mnli_row(i: int, premise: str, hypothesis: str, *labels: str) -> List[str]:
    return [str(i), "31193", f"{31193 + i}n", "government", f"( ( {premise} ) )", f"( {hypothesis} )",
            f"(ROOT (S {premise}))", f"(ROOT (S {hypothesis}))", premise, hypothesis, *labels]


def stsb_row(i: int, a: str, b: str, *score: str) -> List[str]:
    return [str(i), "main-captions", "MSRvid", "2012test", f"{i:04d}", "none", "none", a, b, *score]


# task -> file -> rows (the first row is the header, where the file has one)
LAYOUTS: Dict[str, Dict[str, List[List[str]]]] = {
    "CoLA": {
        "train.tsv": [["gj04", "1", "", "Our friends won't buy this analysis, let alone the next one we propose."],
                      ["gj04", "0", "*", "They drank the pub."]],
        "dev.tsv": [["gj04", "0", "*", "The more we study verbs, the crazier they get get."]],
        "test.tsv": [["index", "sentence"], ["0", "Bill whistled past the house."]],
    },
    "SST-2": {
        "train.tsv": [["sentence", "label"], ["hide new secretions from the parental units ", "0"],
                      ['the film \'s " gone with the wind " charm ', "1"]],
        "dev.tsv": [["sentence", "label"], ['it \'s a " charming and often affecting journey . ', "1"],
                    ['" tadpole " is a sweet , charming film . ', "1"]],
        "test.tsv": [["index", "sentence"], ["0", 'uneasy mishmash of styles and " genres .']],
    },
    "MRPC": {
        "train.tsv": [["\ufeffQuality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
                      ["1", "702876", "702977", 'Amrozi accused his brother , whom he called " the witness " .',
                       'Referring to him as only " the witness " , Amrozi accused his brother .'],
                      ["0", "2108705", "2108831", "Yucaipa owned Dominick 's before selling the chain.",
                       "Yucaipa bought Dominick 's in 1995 ."]],
        "dev.tsv": [["\ufeffQuality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
                    ["1", "1355540", "1355592", "He said the foodservice pie business doesn 't fit .",
                     "The foodservice pie business does not fit , he said ."]],
        "test.tsv": [["index", "#1 ID", "#2 ID", "#1 String", "#2 String"],
                     ["0", "1089874", "1089925", "PCCW 's chief operating officer will also leave.",
                      "The chief operating officer of PCCW will leave too ."]],
    },
    "QQP": {
        "train.tsv": [["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
                      ["133273", "213221", "213222", 'What does "Wk" mean?', 'What is the meaning of "wk"?', "1"],
                      ["402555", "536040", "536041", "How do I learn C?", 'Is "C" hard?', "0"]],
        "dev.tsv": [["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
                    ["201359", "303345", "303346", "Why are African-Americans so beautiful?",
                     'Why are hispanics so "beautiful?', "0"],
                    ["201360", "303347", "303348", '"Hello world" in Go?', "How do I print in Go?", "1"]],
        "test.tsv": [["id", "question1", "question2"],
                     ["0", "How do I stop being lazy?", "How can I stop being lazy?"]],
    },
    "STS-B": {
        "train.tsv": [[*STSB_HEAD, "score"],
                      stsb_row(0, "A plane is taking off.", "An air plane is taking off.", "5.000"),
                      stsb_row(1, "A man is playing a flute.", "A man is playing a large flute.", "3.800")],
        "dev.tsv": [[*STSB_HEAD, "score"], stsb_row(0, "A man with a hard hat is dancing.",
                                                    "A man wearing a hard hat is dancing.", "5.000")],
        "test.tsv": [STSB_HEAD, stsb_row(0, "A girl is styling her hair.", "A girl is brushing her hair.")],
    },
    "MNLI": {
        "train.tsv": [[*MNLI_HEAD, "label1", "gold_label"],
                      mnli_row(0, "Conceptually cream skimming has two dimensions.",
                                "Product and geography are what make cream skimming work.", "neutral", "neutral"),
                      mnli_row(1, "you know during the season", "You lose the things.", "entailment", "entailment")],
        "dev_matched.tsv": [[*MNLI_HEAD, "label1", "label2", "label3", "label4", "label5", "gold_label"],
                            mnli_row(0, "The new rights are nice enough", "Everyone really likes the rights.",
                                      "neutral", "entailment", "neutral", "neutral", "neutral", "neutral")],
        "dev_mismatched.tsv": [[*MNLI_HEAD, "label1", "label2", "label3", "label4", "label5", "gold_label"],
                               mnli_row(0, "Your contribution helped.", "Your contribution did not help.",
                                         "contradiction", "contradiction", "contradiction", "neutral",
                                         "contradiction", "contradiction")],
        "test_matched.tsv": [MNLI_HEAD, mnli_row(0, "Hierbas, ans seco.", "Hierbas is a name.")],
        "test_mismatched.tsv": [MNLI_HEAD, mnli_row(0, "What have you decided?", "What are you doing?")],
    },
    "QNLI": {
        "train.tsv": [["index", "question", "sentence", "label"],
                      ["0", "When did the third Digimon series begin?", "Unlike the two seasons before it...",
                       "not_entailment"]],
        "dev.tsv": [["index", "question", "sentence", "label"],
                    ["0", "What came into force after the new constitution?", "As of that day, the new law came.",
                     "entailment"]],
        "test.tsv": [["index", "question", "sentence"], ["0", "What organization is devoted to Jihad?", "It is one."]],
    },
}

# task -> split -> rows of (text fields..., Hub label id); -1: a test file without labels.
EXPECTED: Dict[str, Dict[str, List[Tuple]]] = {
    "cola": {"train": [("Our friends won't buy this analysis, let alone the next one we propose.", 1),
                       ("They drank the pub.", 0)],
             "validation": [("The more we study verbs, the crazier they get get.", 0)],
             "test": [("Bill whistled past the house.", -1)]},
    "sst2": {"train": [("hide new secretions from the parental units ", 0),
                       ('the film \'s " gone with the wind " charm ', 1)],
             "validation": [('it \'s a " charming and often affecting journey . ', 1),
                            ('" tadpole " is a sweet , charming film . ', 1)],
             "test": [('uneasy mishmash of styles and " genres .', -1)]},
    "mrpc": {"train": [('Amrozi accused his brother , whom he called " the witness " .',
                        'Referring to him as only " the witness " , Amrozi accused his brother .', 1),
                       ("Yucaipa owned Dominick 's before selling the chain.",
                        "Yucaipa bought Dominick 's in 1995 .", 0)],
             "validation": [("He said the foodservice pie business doesn 't fit .",
                             "The foodservice pie business does not fit , he said .", 1)],
             "test": [("PCCW 's chief operating officer will also leave.",
                       "The chief operating officer of PCCW will leave too .", -1)]},
    "qqp": {"train": [('What does "Wk" mean?', 'What is the meaning of "wk"?', 1),
                      ("How do I learn C?", 'Is "C" hard?', 0)],
            "validation": [("Why are African-Americans so beautiful?", 'Why are hispanics so "beautiful?', 0),
                           ('"Hello world" in Go?', "How do I print in Go?", 1)],
            "test": [("How do I stop being lazy?", "How can I stop being lazy?", -1)]},
    "stsb": {"train": [("A plane is taking off.", "An air plane is taking off.", 5.0),
                       ("A man is playing a flute.", "A man is playing a large flute.", 3.8)],
             "validation": [("A man with a hard hat is dancing.", "A man wearing a hard hat is dancing.", 5.0)],
             "test": [("A girl is styling her hair.", "A girl is brushing her hair.", -1.0)]},
    "mnli": {"train": [("Conceptually cream skimming has two dimensions.",
                        "Product and geography are what make cream skimming work.", 1),
                       ("you know during the season", "You lose the things.", 0)],
             "validation_matched": [("The new rights are nice enough", "Everyone really likes the rights.", 1)],
             "validation_mismatched": [("Your contribution helped.", "Your contribution did not help.", 2)],
             "test_matched": [("Hierbas, ans seco.", "Hierbas is a name.", -1)],
             "test_mismatched": [("What have you decided?", "What are you doing?", -1)]},
    "qnli": {"train": [("When did the third Digimon series begin?", "Unlike the two seasons before it...", 1)],
             "validation": [("What came into force after the new constitution?",
                             "As of that day, the new law came.", 0)],
             "test": [("What organization is devoted to Jihad?", "It is one.", -1)]},
}

FOLDERS = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "qqp": "QQP", "stsb": "STS-B", "mnli": "MNLI",
           "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}


def write_tsv(path: Path, rows: List[List[str]]) -> None:
    """Tab-separated, no quoting: the GLUE files' own format."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join("\t".join(row) + "\n" for row in rows), encoding="utf-8")


def write_layout(root: Path, task: str) -> Path:
    for name, rows in LAYOUTS[FOLDERS[task]].items():
        write_tsv(root / FOLDERS[task] / name, rows)
    return root


def stsb_dir(root: Path, *, words: Tuple[int, int] = (6, 6), sizes: Tuple[int, int, int] = (128, 48, 20),
             seed: int = 0) -> Path:
    """STS-B in GLUE's layout: each second sentence is the first with k words swapped, scored 5 - k; a first
    sentence of ``words`` (fewest, most) words; ``sizes``: the train, dev and test files' rows."""
    rng = random.Random(seed)
    vocabulary = "the a man woman dog cat plays runs eats sees big small red green".split()

    def rows(n: int, labelled: bool) -> List[List[str]]:
        out = []
        for i in range(n):
            length = words[0] if words[0] == words[1] else rng.randint(*words)
            a = [rng.choice(vocabulary) for _ in range(length)]
            k = rng.randint(0, 5)
            b = [rng.choice(vocabulary) if j < k else w for j, w in enumerate(a)]
            out.append(stsb_row(i, " ".join(a), " ".join(b), *([f"{5 - k:.3f}"] if labelled else [])))
        return out

    for name, n, labelled in zip(("train", "dev", "test"), sizes, (True, True, False)):
        write_tsv(root / "STS-B" / f"{name}.tsv", [STSB_HEAD + (["score"] if labelled else []), *rows(n, labelled)])
    return root


def stsb_with_one_gold_score(glue: Path) -> Path:
    """GLUE's STS-B files whose dev pairs all have the same gold score: Pearson's r on them is undefined (NaN)."""
    stsb_dir(glue, sizes=(32, 8, 4))
    dev_file = glue / "STS-B" / "dev.tsv"
    dev = [line.split("\t") for line in dev_file.read_text().splitlines()]
    write_tsv(dev_file, [dev[0], *(stsb_row(int(row[0]), row[7], row[8], "3.000") for row in dev[1:])])
    return glue
