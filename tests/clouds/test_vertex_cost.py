"""What a Vertex AI sweep costs (launch/hydra_plugins/vertex_launcher/_cost.py): the price table every GPU preset is
priced from, a job's price per hour against a hand computation, the Spot price under strategy=SPOT, the line a
sweep prints as it starts, a user's override, and a misspelt price refused by name. The figures of a real
(fake-server) sweep are checked in tests/clouds/test_vertex.py."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Dict

import pytest
import yaml
from hydra import compose
from hydra.errors import ConfigCompositionException

from hydra_plugins.vertex_launcher import _cost
from hydra_plugins.vertex_launcher._checks import LaunchError, check_settings
from hydra_plugins.vertex_launcher._spec import Machine
from hydra_plugins.vertex_launcher.config import VertexLauncherConf
from hydra_plugins.vertex_launcher.vertex_launcher import VertexLauncher
from tests.support.runs import ROOT

CONF = ROOT / "conf"
# Every setting the launcher needs typed, whatever gcloud or a conf/local/vertex.yaml of the checkout says.
TYPED = ["hydra.launcher.project=p", "hydra.launcher.region=us-central1", "hydra.launcher.staging_bucket=gs://b",
         "hydra.launcher.image_uri=us-central1-docker.pkg.dev/p/r/i:t"]
# What the table (conf/hydra/launcher/prices/us-central1.yaml) has no on-demand price of: none could be read from
# Google's page. Kept here so that the list only shrinks: a preset added without a price fails below.
UNPRICED = {"n1-standard-8", "n1-standard-16", "n1-highcpu-16", "a2-highgpu-1g", "a2-highgpu-8g", "a3-highgpu-1g",
            "a3-highgpu-8g", "NVIDIA_TESLA_T4", "NVIDIA_TESLA_V100", "NVIDIA_TESLA_A100"}


def settings(*overrides: str, launcher: str = "vertex") -> VertexLauncherConf:
    """The launcher's settings as ``hydra/launcher=<launcher>`` composes them (the project's table), as the
    launcher makes them (vertex_launcher.py), with ``overrides``."""
    config = compose("train", overrides=[f"hydra/launcher={launcher}", *TYPED, *overrides], return_hydra_config=True)
    return VertexLauncher(**{key: value for key, value in config.hydra.launcher.items() if key != "_target_"}).settings


def gpu_presets() -> Dict[str, Dict[str, Any]]:
    """Each preset of conf/hw/ that Vertex AI runs on GPUs or a CPU (not TPUs, not hw=auto): its vertex node."""
    found = {}
    for path in sorted(CONF.glob("hw/*.yaml")):
        preset = yaml.safe_load(path.read_text())
        if preset["accelerator"] in ("cuda", "cpu"):
            found[path.stem] = {**preset["vertex"], "gpus_per_node": preset.get("gpus_per_node", 0)}
    return found


def test_every_gpu_presets_machine_and_accelerator_is_in_the_table_priced_or_listed_as_unpriced() -> None:
    table = yaml.safe_load((CONF / "hydra" / "launcher" / "prices" / "us-central1.yaml").read_text())
    presets = gpu_presets()
    assert {"a100", "h100", "v100", "t4", "2xv100", "8xa100", "2x8xa100", "4x8xh100", "cpu"} <= set(presets)
    needed = {("machines", each["machine_type"]) for each in presets.values()}
    needed |= {("accelerators", each["accelerator_type"]) for each in presets.values() if each["accelerator_type"]}
    needed.add(("machines", VertexLauncherConf.reduction_server_machine_type))
    missing = sorted(f"{kind}.{name}" for kind, name in needed if name not in table[kind])
    assert missing == [], "add each to conf/hydra/launcher/prices/us-central1.yaml, with its price and source"
    unpriced = {name for kind, name in needed if table[kind][name]["on_demand"] is None}
    assert unpriced == UNPRICED, "a new preset needs an on-demand price (or a price found: take it off UNPRICED)"
    prices = [price for kind in ("machines", "accelerators") for entry in table[kind].values()
              for price in entry.values() if price is not None]
    assert prices and all(price > 0 for price in prices)


def test_a_jobs_price_is_its_machines_accelerators_and_reduction_servers() -> None:
    """hw=2x8xa100 with four Reduction Server replicas, by hand: 2 machines at 1.5, 16 A100s at 2.25 and 4
    replicas at 0.5: 3 + 36 + 2 = 41 USD per hour; on Spot VMs 2 x 0.5 + 16 x 0.75 + 4 x 0.25 = 14."""
    prices = ["hydra.launcher.prices.machines.a2-highgpu-8g={on_demand:1.5,spot:0.5}",
              "hydra.launcher.prices.accelerators.NVIDIA_TESLA_A100={on_demand:2.25,spot:0.75}",
              "hydra.launcher.prices.machines.n1-highcpu-16={on_demand:0.5,spot:0.25}",
              "hydra.launcher.reduction_server_replicas=4"]
    hw = Machine("a2-highgpu-8g", "NVIDIA_TESLA_A100", 8, None, 2)
    assert _cost.job_price(hw, settings(*prices)) == _cost.Quote(41.0)
    assert _cost.job_price(hw, settings(*prices, "hydra.launcher.strategy=SPOT")) == _cost.Quote(14.0)
    assert _cost.gpus(hw) == 16 and _cost.gpus(Machine("cloud-tpu", "TPU_V3", 8, None, 1)) == 0


def test_vertex_spot_takes_the_spot_price_and_names_the_one_it_lacks() -> None:
    spot = settings("hydra.launcher.prices.machines.n1-standard-8.spot=0.1", launcher="vertex-spot")
    v100 = Machine("n1-standard-8", "NVIDIA_TESLA_V100", 1, None, 1)
    quote = _cost.job_price(v100, spot)
    assert quote.per_hour is None and quote.missing == (
        "no Spot price known for NVIDIA_TESLA_V100; give one by override "
        "(hydra.launcher.prices.accelerators.NVIDIA_TESLA_V100.spot=USD_PER_HOUR)")
    priced = settings("hydra.launcher.prices.machines.n1-standard-8.spot=0.1",
                      "hydra.launcher.prices.accelerators.NVIDIA_TESLA_V100.spot=0.7", launcher="vertex-spot")
    assert _cost.job_price(v100, priced).per_hour == pytest.approx(0.8)
    unknown = _cost.job_price(Machine("n2-standard-8", None, 0, None, 1), priced)
    assert unknown.missing.startswith("no price known for n2-standard-8; give one by override "
                                      "('++hydra.launcher.prices.machines={n2-standard-8: {spot: USD_PER_HOUR}}')")


def test_the_start_line_has_the_price_of_the_jobs_at_once_and_the_ceiling() -> None:
    """Three jobs of 2, 3 and 5 USD per hour, two at once, a timeout of 30 minutes: $5.00/h (the first two)
    and a ceiling of (2 + 3 + 5) x 0.5 = $5.00; and Vertex AI's 7 days where the sweep sets no timeout."""
    quotes = [_cost.Quote(2.0), _cost.Quote(3.0), _cost.Quote(5.0)]
    line = _cost.estimate(quotes, settings("hydra.launcher.max_concurrent_jobs=2", "hydra.launcher.timeout=1800"))
    assert line == ("estimated price: $5.00/h for 2 jobs at once (up to max_concurrent_jobs=2), ceiling $5.00 if "
                    "every job ran to its timeout (0.5h); prices of us-central1 read on 2026-10-07: estimates "
                    "(hydra.launcher.prices)")
    elsewhere = _cost.estimate(quotes, settings("hydra.launcher.region=europe-west4"))
    assert "for 3 jobs at once" in elsewhere and "ceiling $1680.00 if every job ran to its timeout (168h)" in elsewhere
    assert elsewhere.endswith("; the jobs run in europe-west4, whose prices may differ")
    missing = _cost.estimate([_cost.Quote(2.0), _cost.Quote(None, "no price known for X")], settings())
    assert missing.startswith("estimated price: unknown, no price known for X; prices of us-central1")


def test_a_users_price_overrides_the_tables() -> None:
    assert settings().prices.accelerators["NVIDIA_H100_80GB"].on_demand == pytest.approx(9.79655057)
    mine = settings("hydra.launcher.prices.accelerators.NVIDIA_H100_80GB.on_demand=8",
                    "++hydra.launcher.prices.machines={n2-standard-8:{on_demand:0.45}}")
    assert mine.prices.accelerators["NVIDIA_H100_80GB"].on_demand == 8.0
    assert mine.prices.machines["n2-standard-8"].on_demand == 0.45  # a machine type of the user's own, added
    assert mine.prices.machines["a3-highgpu-1g"].on_demand is None  # the rest of the table stays
    assert _cost.job_price(Machine("n2-standard-8", None, 0, None, 2), mine) == _cost.Quote(0.9)


@pytest.mark.parametrize("override, refused", [
    ("hydra.launcher.prices.accelerators.NVIDIA_TESLA_A100.spto=1.5", "spto"),
    ("hydra.launcher.prices.acelerators.NVIDIA_TESLA_A100.spot=1.5", "acelerators"),
])
def test_a_misspelt_price_key_is_refused_at_composition_by_name(override: str, refused: str) -> None:
    with pytest.raises(ConfigCompositionException) as error:
        settings(override)
    assert refused in str(error.value) + str(error.value.__cause__)


@pytest.mark.parametrize("override, named", [
    ("+hydra.launcher.prices.accelerators.NVIDIA_TESLA_A100.spto=1.5",
     "hydra.launcher.prices.accelerators.NVIDIA_TESLA_A100.spto: not a key of the price table"),
    ("+hydra.launcher.prices.read_onn=2026-01-01", "hydra.launcher.prices.read_onn: not a key of the price table"),
    ("hydra.launcher.prices.machines.n1-standard-8.spot=-1",
     "hydra.launcher.prices.machines.n1-standard-8.spot=-1.0: a price per hour cannot be negative"),
])
def test_a_price_key_added_with_plus_is_refused_by_the_launchers_checks(override: str, named: str) -> None:
    """``+`` adds any key to a typed node; the launcher's checks refuse it before anything is submitted."""
    with pytest.raises(LaunchError, match=named.replace(".", r"\.")):
        check_settings(settings(override))
    check_settings(settings())


def test_a_rows_cost_is_its_price_times_the_time_it_ran() -> None:
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    columns = _cost.row_columns(_cost.Quote(3.0), 8, start, start + timedelta(minutes=90))
    assert columns == {"cost_usd": 4.5, "gpu_hours": 12.0}
    assert _cost.row_columns(_cost.Quote(None, "no price"), 0, start, start + timedelta(hours=1)) == {}
    assert _cost.row_columns(_cost.Quote(3.0), 1, None, None) == {}  # never ran: nothing billed
    assert _cost.row_columns(_cost.UNPRICED, 2, start, start + timedelta(hours=1)) == {"gpu_hours": 2.0}
