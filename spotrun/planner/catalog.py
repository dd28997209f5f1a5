"""The instance catalog (spotrun/planner/catalog.json): loading it, checking its prices, and pricing it in a region;
`usd`, how every message writes a dollar amount.

The planner, the simulator, the stage's config and the Lambda handlers read the catalog through these functions;
the file itself cites where each figure comes from. A region's prices come from the file's `regions`, or from a
snapshot of AWS's price list that `spotrun catalog update --region R` wrote (spotrun/planner/pricing.py).
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

from ..contract.spec import RunValidationError
from .pricing import read_snapshots

CATALOG_PATH = Path(__file__).with_name("catalog.json")
PRICES_DIR = Path(__file__).with_name("prices")  # the regions' snapshots (spotrun/planner/pricing.py)


def share_done(fraction: float) -> str:
    """A share of the work done, never rounded up to 100% while some is left (a refusal read "100% of the training"
    with another job needed): whole percents, one decimal from 99%."""
    if fraction >= 1:
        return "100%"
    if fraction < 0.99:
        return f"{math.floor(fraction * 100)}%"
    return f"{math.floor(fraction * 1000) / 10:.1f}%"


def hours_text(seconds: float) -> str:
    """A run's length in hours for people, one format wherever it is said (the estimate's wall time row, the
    deadline and target warnings, the refusals): `1.96 h`, `1,234.50 h` (the same figure read 1.96 h in one line
    and 2.0 h in the next)."""
    return f"{seconds / 3600:,.2f} h"


def usd(amount: float) -> str:
    """A dollar amount for people: cents from $1 (`$1,234.50`), two significant digits below it, so that a cap of
    $0.001 never reads $0.00 (`$0.001`, `$0.012`, `$0.50`); under a billionth of a dollar in exponent form, as a
    run can write it (`budget.max_usd: 1e-300` printed 300 zeros)."""
    if not math.isfinite(amount) or amount == 0 or abs(amount) >= 0.995:
        return f"${amount:,.2f}"
    if abs(amount) < 1e-9:
        return f"${amount:.2g}"
    digits = max(2, 1 - math.floor(math.log10(abs(amount))))
    text = f"{amount:.{digits}f}"
    whole, _, cents = text.partition(".")
    return f"${whole}.{cents[:2] + cents[2:].rstrip('0')}"


def load_catalog(path: Path = CATALOG_PATH, *, snapshots: bool = True) -> dict:
    """The catalog at `path` (the shipped one by default) with, unless `snapshots` is False, the regions' price
    snapshots in PRICES_DIR laid over its `regions` (`spotrun catalog update` writes them;
    spotrun/planner/pricing.py), its prices checked."""
    catalog = json.loads(Path(path).read_text())
    if snapshots:
        catalog.setdefault("regions", {}).update(read_snapshots(PRICES_DIR))
    check_prices(catalog)
    return catalog


def check_prices(catalog: dict) -> None:
    """Every price is a finite number > 0: a price of 0 would make every bound zero and disable the cap."""
    priced = {f"instances.{t}": s.get("on_demand_usd_per_hour") for t, s in catalog.get("instances", {}).items()
              if "on_demand_usd_per_hour" in s}
    for region, spec in catalog.get("regions", {}).items():
        priced.update({f"regions.{region}.{t}": p for t, p in spec.get("on_demand_usd_per_hour", {}).items()})
    for where, price in priced.items():
        if isinstance(price, bool) or not isinstance(price, (int, float)) or not math.isfinite(price) or price <= 0:
            raise ValueError(f"catalog {where}.on_demand_usd_per_hour={price!r} is invalid: expected a price in "
                             "USD per hour > 0 (a price of 0 would disable the cost cap)")


DEFAULT_PRICE_REGION = "us-east-1"  # the CLI's estimate without --region; a stage prices in its own region


def regional_catalog(catalog: dict, region: str) -> dict:
    """The catalog with the region's on-demand prices; RunValidationError for a region it has no prices for."""
    regions = catalog.get("regions", {})
    if region not in regions:
        raise RunValidationError("region", region, f"a region the catalog has prices for: "
                                 f"{', '.join(sorted(regions))}; run `spotrun catalog update --region {region}` "
                                 "(AWS credentials allowed pricing:GetProducts) to price it, then redeploy the stage "
                                 "so its functions carry it")
    check_prices(catalog)
    prices = regions[region]["on_demand_usd_per_hour"]
    out = copy.deepcopy(catalog)
    out["instances"] = {t: {**spec, "on_demand_usd_per_hour": prices[t]}
                        for t, spec in catalog["instances"].items() if t in prices}
    return out
