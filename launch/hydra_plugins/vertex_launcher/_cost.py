"""What a sweep on Vertex AI costs, estimated from the price table (``hydra.launcher.prices``, conf/hydra/launcher/
prices/): a job's price per hour, from its machines and their accelerators, on demand or on Spot VMs; the line a
sweep prints before it submits (its price per hour and its ceiling); and an ended job's cost, from the time
Vertex AI ran it (its start to its end, as the API reports them: the time that is billed)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Dict, Optional, Sequence

from nli.sweep import cost

from ._spec import Machine
from .config import VertexLauncherConf

VERTEX_DEFAULT_TIMEOUT = 7 * 24 * 3600  # seconds a job with no timeout may run: Vertex AI's default of 7 days
_KEY = "hydra.launcher.prices"


@dataclass(frozen=True)
class Quote:
    """A job's price per hour, or why there is none."""

    per_hour: Optional[float]  # USD per hour, every machine of the job; None: a price the table lacks
    missing: str = ""  # where per_hour is None: the price missing, and the override that gives it


UNPRICED = Quote(None, "not priced")  # a job found again by python -m nli.cloud attach, which has no price table


def job_price(hw: Machine, settings: VertexLauncherConf) -> Quote:
    """What one job costs per hour: on each of its machines, the machine type and its accelerators; then
    Reduction Server's replicas, where the job has them."""
    parts = [("machines", hw.machine_type, hw.nodes),
             ("accelerators", hw.accelerator_type, hw.nodes * hw.accelerator_count if hw.accelerator_type else 0),
             ("machines", settings.reduction_server_machine_type, settings.reduction_server_replicas)]
    total = 0.0
    for table, name, count in parts:
        if not name or count <= 0:
            continue
        price = _price(settings, table, str(name))
        if isinstance(price, str):
            return Quote(None, price)
        total += count * price
    return Quote(total)


def _price(settings: VertexLauncherConf, table: str, name: str) -> float | str:
    """The table's price of one machine or accelerator under the sweep's strategy; what to give where it has none."""
    spot = _spot(settings)
    entry = getattr(settings.prices, table).get(name)
    if entry is None:
        return (f"no price known for {name}; give one by override ('++{_KEY}.{table}={{{name}: "
                f"{{{'spot' if spot else 'on_demand'}: USD_PER_HOUR}}}}')")
    value = entry.spot if spot else entry.on_demand
    if value is None:
        kind, key = ("Spot price", "spot") if spot else ("price", "on_demand")
        return f"no {kind} known for {name}; give one by override ({_KEY}.{table}.{name}.{key}=USD_PER_HOUR)"
    return float(value)


def _spot(settings: VertexLauncherConf) -> bool:
    """strategy=SPOT, compared by name (plugin discovery may load config.py twice: config.Strategy)."""
    return settings.strategy.name == "SPOT"


def gpus(hw: Machine) -> int:
    """The GPUs a job holds on all its machines (a TPU's chips are not GPUs)."""
    return hw.accelerator_count * hw.nodes if str(hw.accelerator_type or "").startswith("NVIDIA_") else 0


def estimate(quotes: Sequence[Quote], settings: VertexLauncherConf) -> str:
    """The line a sweep prints before it submits: the price per hour of the jobs that start at once (the first
    max_concurrent_jobs), and the ceiling, were every job to run to its timeout."""
    tail = f"prices of {settings.prices.region} read on {settings.prices.read_on}: estimates ({_KEY})"
    if settings.region != settings.prices.region:
        tail += f"; the jobs run in {settings.region}, whose prices may differ"
    if settings.strategy.name == "FLEX_START":
        tail += "; FLEX_START is priced here as on demand (its own prices are not in the table)"
    missing = next((quote.missing for quote in quotes if quote.per_hour is None), None)
    if missing is not None:
        return f"estimated price: unknown, {missing}; {tail}"
    at_once = min(len(quotes), settings.max_concurrent_jobs)
    per_hour = sum(float(quote.per_hour or 0.0) for quote in quotes[:at_once])
    hours = (settings.timeout or VERTEX_DEFAULT_TIMEOUT) / 3600
    ceiling = sum(float(quote.per_hour or 0.0) for quote in quotes) * hours
    return (f"estimated price: ${per_hour:.2f}/h for {at_once} jobs at once (up to max_concurrent_jobs="
            f"{settings.max_concurrent_jobs}), ceiling ${ceiling:.2f} if every job ran to its timeout "
            f"({hours:g}h); {tail}")


def row_columns(quote: Quote, gpu_count: int, started: Optional[datetime],
                ended: Optional[datetime]) -> Dict[str, Any]:
    """An ended job's ``cost_usd`` (its price per hour times the hours Vertex AI ran it) and ``gpu_hours``; none
    of either for a job that never ran, and no cost where its price is not known."""
    if started is None or ended is None:
        return {}
    seconds = max(0.0, (ended - started).total_seconds())
    found: Dict[str, Any] = {}
    if quote.per_hour is not None:
        found[cost.COST_USD] = round(quote.per_hour * seconds / 3600, cost.ROUNDING)
    found.update(cost.gpu_hours(gpu_count, seconds))
    return found

