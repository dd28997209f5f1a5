"""`spotrun catalog update --region R`: price a region from AWS's published price list with the user's credentials
(the Price List Query API's GetProducts: spotrun/planner/pricing.py) and write its dated snapshot, which every
command and, once the stage is redeployed, the stage's functions price runs in that region from.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ..contract.strict_json import dumps as strict_dumps
from ..planner.catalog import CATALOG_PATH, PRICES_DIR, load_catalog
from ..planner.pricing import PRICING_API_REGION, REGION_NAME, PricingError, region_prices, write_snapshot
from .arguments import as_typed
from .exits import Exit, fail


def update_command(args: argparse.Namespace, *, pricing_client: Any = None) -> int:
    """Read the region's prices and write the snapshot; the exit code (2: not a region name, before any request;
    1: AWS or the price list failed)."""
    import boto3  # NOTE: imported here: only this command and the remote ones talk to AWS

    if not REGION_NAME.fullmatch(args.region):
        return fail(args.format, Exit.INVALID, "InvalidArguments", f"--region={as_typed(args.region)} is invalid: "
                    "expected an AWS region name such as eu-west-1", "--region")
    try:
        client = pricing_client or boto3.client("pricing", region_name=PRICING_API_REGION)
        snapshot = region_prices(client, args.region, load_catalog(CATALOG_PATH, snapshots=False),
                                 today=time.strftime("%Y-%m-%d", time.gmtime()))
    except PricingError as exc:
        return fail(args.format, Exit.FAILED, "PricingFailed", str(exc), "--region")
    except (ClientError, BotoCoreError) as exc:
        return fail(args.format, Exit.FAILED, "AwsError", f"the price list could not be read ({exc}): it needs AWS "
                    "credentials allowed pricing:GetProducts", "--region")
    path = write_snapshot(snapshot, args.out)
    training = snapshot["on_demand_usd_per_hour"]
    if args.format == "json":
        print(strict_dumps({"region": args.region, "file": str(path), **snapshot}, indent=2))
    else:
        missing = sorted(set(load_catalog(CATALOG_PATH, snapshots=False)["instances"]) - set(training))
        print(f"{args.region}: {len(training)} training and {len(snapshot['processing_usd_per_hour'])} processing "
              f"instance prices as of {snapshot['as_of']} written to {path}"
              + (f"; not offered there: {', '.join(missing)}" if missing else ""))
        print("commit it and redeploy a stage in this region so its functions price runs with it")
    return int(Exit.OK)


def register(sub: Any) -> None:
    """Add the `catalog` command (`catalog update`) to the CLI's subparsers."""
    cat = sub.add_parser("catalog", help="the instance catalog's prices per region (update from AWS's price list)",
                         description="The instance catalog's prices per region.")
    actions = cat.add_subparsers(dest="action", required=True)
    update = actions.add_parser("update", help="price a region from AWS's price list (pricing:GetProducts)",
                                description="Read SageMaker AI training and processing on-demand prices of the "
                                "catalog's instance types in a region from the AWS Price List Query API (your AWS "
                                f"credentials; the API answers in {PRICING_API_REGION}) and write the region's dated "
                                "snapshot.")
    update.add_argument("--region", required=True, help="the region to price (e.g. eu-west-1)")
    update.add_argument("--out", type=Path, default=PRICES_DIR, help="where the snapshot <region>.json is written "
                        "(default: the catalog's prices/ beside spotrun/planner/catalog.json, which the stage's "
                        "functions carry)")
    update.add_argument("--format", choices=["text", "json"], default="text", help="text (default) or JSON")
    update.set_defaults(func=update_command)
