"""SageMaker AI on-demand prices per region from AWS's published price list (the Price List Query API), and the
snapshot files they are kept in (`spotrun catalog update`, spotrun/cli/catalog.py).

`region_prices` asks GetProducts (service code AmazonSageMaker) for the region's `ML Instance` products of two
components (the product attribute `platoinstancetype`): `Training` (what a training job bills per instance-hour;
managed spot bills the same rate for fewer seconds) and `Processing` (the preparation job's CPU instances). Each of
the catalog's instance types gets its one hourly USD on-demand price; a type the region does not offer is left
out (the estimate then never chooses it there), and two different prices for one type stop the update rather
than guessing. The attribute names and values are those public readers of the same price list use
(github.com/vantage-sh/ec2instances.info, sagemaker.py: `ML Instance` products by `platoinstancetype`, usage types
such as `USE1-Train:ml.m4.16xlarge`).

A snapshot is `prices/<region>.json` beside this module, with the date it was read: `load_catalog`
(spotrun/planner/catalog.py) lays each over the catalog's `regions`, so the CLI, the local pipeline and the stage's
functions (bundled from the checkout at deploy) all price a run in that region from it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SERVICE_CODE = "AmazonSageMaker"
# The Price List Query API answers in us-east-1 (also eu-central-1 and ap-south-1) for every region's prices.
PRICING_API_REGION = "us-east-1"
COMPONENTS = {"on_demand_usd_per_hour": "Training", "processing_usd_per_hour": "Processing"}
REGION_NAME = re.compile(r"[a-z]{2}(-[a-z]+)+-\d")
HOURLY_UNITS = ("Hrs", "Hours", "Hour")


class PricingError(Exception):
    """The price list could not be read, or did not give one price per instance type; the message says which."""


def price_filters(region: str, component: str) -> list[dict]:
    """GetProducts' Filters for one region's ML instances of one SageMaker component."""
    return [{"Type": "TERM_MATCH", "Field": "productFamily", "Value": "ML Instance"},
            {"Type": "TERM_MATCH", "Field": "regionCode", "Value": region},
            {"Type": "TERM_MATCH", "Field": "platoinstancetype", "Value": component}]


def products(client: Any, region: str, component: str) -> Iterator[dict]:
    """Every product of the region's component, each PriceList entry decoded (the API returns JSON strings)."""
    pages = client.get_paginator("get_products").paginate(ServiceCode=SERVICE_CODE, FormatVersion="aws_v1",
                                                           Filters=price_filters(region, component))
    for page in pages:
        for entry in page["PriceList"]:
            yield json.loads(entry)


def _instance_name(attributes: dict) -> str:
    # instanceName is "ml.g5.xlarge"; older products carry only instanceType ("ml.g5.xlarge-Training").
    return attributes.get("instanceName") or attributes.get("instanceType", "").split("-")[0]


def hourly_prices(items: Iterator[dict], wanted: set[str], component: str) -> dict[str, float]:
    """{instance type: USD per hour} of the `wanted` types among the products; PricingError when one type has
    two different prices."""
    found: dict[str, set[float]] = {}
    for item in items:
        name = _instance_name(item.get("product", {}).get("attributes", {}))
        if name not in wanted:
            continue
        for term in item.get("terms", {}).get("OnDemand", {}).values():
            for dimension in term.get("priceDimensions", {}).values():
                usd = dimension.get("pricePerUnit", {}).get("USD")
                if dimension.get("unit") in HOURLY_UNITS and usd is not None and float(usd) > 0:
                    found.setdefault(name, set()).add(float(usd))
    twice = {name: sorted(prices) for name, prices in found.items() if len(prices) > 1}
    if twice:
        raise PricingError(f"the price list gives more than one {component} price for {twice}: not updated (report "
                           "it; a price is never guessed)")
    return {name: prices.pop() for name, prices in sorted(found.items())}


def region_prices(client: Any, region: str, catalog: dict, *, today: str) -> dict:
    """The snapshot of `region`: the catalog's training and processing instance types priced from the price list
    through `client` (a boto3 `pricing` client), dated `today` (YYYY-MM-DD)."""
    processing_types = {t for spec in catalog.get("regions", {}).values()
                        for t in spec.get("processing_usd_per_hour", {})}
    snapshot: dict[str, Any] = {"region": region, "as_of": today,
                                "source": f"AWS Price List Query API, GetProducts ServiceCode={SERVICE_CODE}, "
                                          f"productFamily=ML Instance, regionCode={region}, read {today}"}
    for key, component in COMPONENTS.items():
        wanted = set(catalog["instances"]) if key == "on_demand_usd_per_hour" else processing_types
        snapshot[key] = hourly_prices(products(client, region, component), wanted, component)
    if not snapshot["on_demand_usd_per_hour"]:
        raise PricingError(f"the price list has no SageMaker training price in {region} for any instance type of the "
                           "catalog: is it a region SageMaker training runs in, with these GPU types?")
    return snapshot


def write_snapshot(snapshot: dict, directory: Path) -> Path:
    """Write `snapshot` as `<directory>/<region>.json`; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{snapshot['region']}.json"
    path.write_text(json.dumps(snapshot, indent=2, sort_keys=True) + "\n")
    return path


def read_snapshots(directory: Path) -> dict[str, dict]:
    """{region: its catalog `regions` entry} from the snapshot files in `directory` (none: empty)."""
    out = {}
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        snapshot = json.loads(path.read_text())
        out[snapshot["region"]] = {key: snapshot[key] for key in ("as_of", "source", *COMPONENTS) if key in snapshot}
    return out
