"""The recipes of conf/experiment/: each composes for the tasks it is meant for, starts from the
checkpoint it says, and the table of published figures in docs/recipes.md is the benchmark's."""

from __future__ import annotations

import re

import pytest

from benchmarks.recipes import PUBLISHED
from tests.conftest import build_config
from tests.support.runs import ROOT

SMALL_TASKS = ("rte", "mrpc", "stsb")
FROM_MNLI = {"roberta-large-from-mnli": "FacebookAI/roberta-large-mnli",
             "deberta-v3-base-from-mnli": "MoritzLaurer/DeBERTa-v3-base-mnli"}


@pytest.mark.parametrize("recipe,task", sorted({(row.recipe, row.task) for row in PUBLISHED}
                                                | {(name, task) for name in FROM_MNLI for task in SMALL_TASKS}))
def test_each_recipe_composes_for_its_tasks(recipe: str, task: str) -> None:
    cfg = build_config([f"experiment={recipe}", f"task={task}"])
    assert cfg.task.name == task  # the command line's task wins over the recipe's own
    assert cfg.model.pretrained


@pytest.mark.parametrize("recipe,checkpoint", FROM_MNLI.items())
def test_small_task_recipes_start_from_an_mnli_checkpoint(recipe: str, checkpoint: str) -> None:
    for task in SMALL_TASKS:  # two labels or one score: the three-label head gives way to a new one
        cfg = build_config([f"experiment={recipe}", f"task={task}"])
        assert cfg.model.name_or_path == checkpoint and cfg.model.ignore_mismatched_sizes


def test_recipes_carry_their_families_knobs() -> None:
    assert build_config(["experiment=electra-base-mnli"]).optimizer.layer_decay == 0.8
    assert build_config(["experiment=electra-large-mnli"]).optimizer.layer_decay == 0.9
    large = build_config(["experiment=deberta-v3-large-mnli"])
    assert large.model.classifier_dropout == 0.3 and large.model.attention.value == "eager"
    assert large.schedule.warmup_steps == 500 and large.train.batch_size == 64
    modern = build_config(["experiment=modernbert-base-mnli"])
    assert modern.optimizer.lr == 8e-5 and modern.optimizer.betas == [0.9, 0.98] and modern.optimizer.weight_decay == 0
    lora = build_config(["experiment=lora-roberta-base-mnli"])
    assert lora.model.peft is not None and (lora.model.peft.r, lora.model.peft.alpha) == (8, 16)


def test_the_docs_table_is_the_benchmarks() -> None:
    page = (ROOT / "docs" / "recipes.md").read_text()
    for row in PUBLISHED:
        for key, figure in row.figures.items():
            line = f"| `{row.recipe}` | {row.task} | {key} | {figure:.1f} |"
            assert line in page, f"docs/recipes.md has no row {line}"
    listed = set(re.findall(r"^\| `([a-z0-9-]+)` \| [a-z]+ \| [a-z_]+ \| [0-9.]+ \|", page, flags=re.M))
    assert listed == {row.recipe for row in PUBLISHED}
