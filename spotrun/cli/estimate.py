"""`spotrun validate` and `spotrun estimate`: the CLI half of the one set of rules (spotrun/pipeline/validate.py).

`check_file` applies, to one run file read by `spotrun.contract.runfile.load_run_file`, every layer the CLI can: the
contract with SageMaker's limits and the catalog's instance types; the stage's rules when the target is known
(`--stage`: its stack's outputs; offline `--bucket` and `--group`); with `plan`, the sources' config.json /
index.json (offline: a source it cannot read is said to be not checked) and the planner. It says plainly what it
checked and what it did not. Exit codes: spotrun/cli/exits.py (a refusal's code follows its status).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError

from ..contract.hub_id import is_hub_id
from ..contract.refusal import Refusal
from ..contract.runfile import load_run_file
from ..contract.spec import RunSpec, RunValidationError, deadline_hours_text, parse_run
from ..contract.strict_json import dumps as strict_dumps
from ..local.pipeline import (
    check_model_source_dir,
    check_raw_split,
    check_raw_text,
    local_prepared,
    prepare_if_raw,
    prepared_beside,
)
from ..pipeline.policy_stage import layout_ranker, over_budget_with_caps, with_spot_policy
from ..pipeline.validate import Target, check_catalog, check_target
from ..planner.catalog import usd
from ..planner.estimate import DEFAULT_PRICE_REGION, Estimate, estimate, format_text, load_catalog, regional_catalog
from ..planner.outputs import speed_margin_note
from ..planner.sources import check_local_split, read_sources, split_settings, unchecked_split, with_split
from ..policy.choose import cap_to_set_held_out_margin, held_out_margin, larger_cap_bills_less, policy_text
from ..policy.headroom import cap_to_set_headroom
from ..seams import DatasetIndex, StackOutput, stack_name
from .arguments import run_file
from .exits import HELP as EXIT_CODES_HELP
from .exits import Exit, combined, fail, for_status, split_excerpt
from .remote import aws_message, stage_max_usd, stage_region, unlisted_stage


@dataclass
class Checked:
    """What one run file came to: the estimate (or None), and plainly what was checked and what was not."""

    run: RunSpec
    estimate: Estimate | None
    checked: list[str] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)  # the run's own settings that could not be checked here
    warnings: list[str] = field(default_factory=list)  # the CLI's own (the estimate's are in `estimate`)


def check_file(path: Path, target: Target | None, *, plan: bool, s3_client: Any = None,
               region: str | None = None, prepared: Path | None = None, stage: str | None = None,
               headroom: bool = True) -> Checked:
    """Every layer the CLI can apply to one run file; a Refusal (RunValidationError, EstimateRefused) otherwise.
    `region`: whose on-demand prices the planner uses (DEFAULT_PRICE_REGION when None, and the output says so).
    `prepared`: where raw local text in data.source is tokenized to be planned (`prepared_text`). The estimate's
    policy stage chooses the spot policy (`spotrun simulate` prints its sentinel and cap to set beside its own
    study). `headroom`: search the cap to set's headroom (`spotrun/policy/headroom.py`: several simulations at
    and over the cap to set); `spotrun simulate`, which does not print it, passes False."""
    loaded = load_run_file(path)
    run, note = loaded.run, None
    if plan:
        _check_local_paths(run)  # as validate and local: model.source first (swapped sources are named as such)
        cache = prepared or prepared_beside(Path(path))
        run, note = prepared_text(loaded.raw, cache, also=local_prepared(Path(path)))
    catalog = load_catalog()
    check_catalog(run, catalog)
    out = Checked(run, None, checked=["the run contract and SageMaker's limits on it"])
    out.warnings.extend(_stage_cap(run, stage))
    if target is not None:
        check_target(run, target)
        out.checked.append(target.describe())
    else:
        out.not_checked.append("the stage's rules (sources under its bucket's datasets/ and models/, its model "
                               "package group): give --stage, or --bucket and --group")
    if note:
        out.checked.append(note)
    if not plan:
        _without_planner(run, out)
        out.not_checked.append("the sources' config.json / index.json and the planner: run `spotrun estimate`")
        return out
    sources = read_sources(run, s3_client, offline=True)
    run = with_split(run, sources)  # the validation split the prepared data holds, when the run names none
    out.unchecked.extend(sources.unchecked)
    for note in sources.notes:
        if note.startswith("not "):
            out.not_checked.append(note.removeprefix("not checked: "))  # printed under "not checked:" already
        else:
            out.checked.append(note)
    if run.model.init is None and target is None:
        out.not_checked.append('training: a model.config without model.source or model.init="random" is a shape '
                               "for estimates only; the pipeline refuses to train it")
    priced_in = region or DEFAULT_PRICE_REGION
    catalog = regional_catalog(catalog, priced_in)
    ranker = layout_ranker(catalog)  # a spot run with a deadline: its layout by the spot policy's simulated bill
    def replan(cap: float, layout_cost) -> Any:  # the estimate at another cap (the cap to set's layouts ranked)
        return estimate(replace(run, max_usd=cap), catalog=catalog, model_config=sources.model_config,
                        data_tokens=sources.tokens, validation_tokens=sources.validation_tokens,
                        layout_cost=layout_cost)

    try:
        out.estimate = replan(run.max_usd, ranker)
    except Refusal as exc:  # an OverBudget refusal names caps the estimate's simulation holds (issue #26)
        raise over_budget_with_caps(run, exc, replan, catalog, stage_limits=stage_max_usd(stage)) from None
    # the stage's max_usd_per_run (--stage), else every listed stage's: a cap to set over one is said
    out.estimate = with_spot_policy(run, out.estimate, catalog, ranker=ranker, stage_limits=stage_max_usd(stage),
                                    replan=replan)
    # the cap to set's headroom (spotrun/policy/headroom.py): the CLI's alone, the Lambda's section carries null
    section = out.estimate.spot_policy
    if headroom and section is not None and (found := cap_to_set_headroom(run, out.estimate, catalog)) is not None:
        out.estimate = replace(out.estimate, spot_policy=replace(section, cap_to_set_headroom=found))
    if out.warnings:  # printed with the estimate's own
        out.estimate = replace(out.estimate, warnings=[*out.warnings, *out.estimate.warnings])
    out.checked.append("the planner (fit, MaxRuntime/MaxWait, budget) and the hyperparameters' limits")
    out.checked.append(f"costs at on-demand list prices in {priced_in} (spotrun catalog as of "
                       f"{catalog['regions'][priced_in].get('as_of', 'unknown')})"
                       + ("" if region else "; --region prices another region"))
    return out


def _stage_cap(run: RunSpec, stage: str | None) -> list[str]:
    """A cap over the stage's max_usd_per_run (stacks/config.py) is refused as the estimate Lambda refuses it
    (spotrun/pipeline/validate.py `check_stage_limits`); with no --stage, a cap over every listed stage's is a
    warning (a new user's $5,000,000 cap was accepted without a word, and `start` would refuse it)."""
    limits = stage_max_usd(stage)
    if stage and stage in limits and run.max_usd > limits[stage]:
        raise RunValidationError("budget.max_usd", run.max_usd, f"at most {usd(limits[stage])} (max_usd_per_run, "
                                 f"stage {stage}'s limit in stacks/config.py)")
    if stage or not limits or run.max_usd <= max(limits.values()):
        return []
    listed = ", ".join(f"{name} {usd(cap)}" for name, cap in limits.items())
    return [f"budget.max_usd={usd(run.max_usd)} is over every stage's max_usd_per_run in stacks/config.py "
            f"({listed}): `spotrun start` refuses it; give --stage to check it against one"]


def _without_planner(run: RunSpec, out: Checked) -> None:
    """`validate`: the checks of the run against its data that need no planner, where data.source's index.json is
    here to read (a local prepared directory: with a local model.source, every check of the sources, the tokenizer
    included; raw local text is checked as `local` prepares it); a setting of the run that depends on what validate
    does not read is listed in `out.unchecked` (the output is then not "ok")."""
    _check_local_paths(run)
    source = run.data.source or ""
    local = bool(source) and not source.startswith("s3://") and Path(source).is_dir()
    raw_file = bool(source) and not source.startswith("s3://") and Path(source).is_file()
    if raw_file or (local and not (Path(source) / DatasetIndex.FILE).is_file()):
        check_raw_text(source)  # raw text: files to prepare
        check_raw_split(run)  # split when it is prepared
    elif local and not (run.model.source or "").startswith("s3://"):
        # Everything it names is here: the sources' own checks (the split, the tokenizer, seq_len), no network.
        out.checked.extend(n for n in read_sources(run, None, offline=True).notes if not n.startswith("not "))
    elif local:
        done = check_local_split(run)
        if done:
            out.checked.append(done)
    elif split_settings(run):
        why = "validate reads no S3 object" if source.startswith("s3://") else "not a directory here"
        out.unchecked.append(unchecked_split(run, why))
    if run.compute.deadline_s is not None:
        out.unchecked.append(f"compute.deadline_hours={deadline_hours_text(run.compute.deadline_s)} against the "
                             "run's length (the planner's hours; validate does not plan)")


def _check_local_paths(run: RunSpec) -> None:
    """Local sources exist, and a local model.source is a model directory, as `spotrun local` and `estimate`
    require (a run with local paths is for `spotrun local`; `start` needs s3:// sources)."""
    for field_path, source in (("model.source", run.model.source), ("data.source", run.data.source),
                               ("data.validation", run.data.validation)):
        if source and not source.startswith("s3://") and not is_hub_id(source) and not Path(source).exists():
            raise RunValidationError(field_path, source, "an existing local path or an s3:// URI (nothing is there)")
    if run.model.source and not run.model.source.startswith("s3://") and not is_hub_id(run.model.source):
        check_model_source_dir(Path(run.model.source), run.model.source)


def prepared_text(raw: dict, cache: Path, also: tuple[Path, ...] = ()) -> tuple[RunSpec, str | None]:
    """The run to plan, and what was done: raw local text in data.source is planned on its shards, tokenized as
    `spotrun local` does (spotrun.local.pipeline.prepare_if_raw: content-addressed under `cache`, reused when the
    same text and tokenizer were prepared there, e.g. by `spotrun demo` or `spotrun local --out DIR`, or in `also`:
    where `spotrun local` prepares with its default --out, `local_prepared`)."""
    source = (raw.get("data") or {}).get("source")
    # a raw file is raw text as much as a folder of them is (`spotrun local` trains on either)
    if not source or source.startswith("s3://") or not Path(source).exists() or \
            (Path(source) / DatasetIndex.FILE).is_file():
        return parse_run(raw), None
    check_raw_split(parse_run(raw))
    also = tuple(p for p in also if p.resolve() != Path(cache).resolve())
    done, how = prepare_if_raw(raw, cache, emit=lambda line: print(line, file=sys.stderr, flush=True), also=also)
    return parse_run(done), (f"raw data.source {how} as shards in {done['data']['source']} (what `spotrun local` "
                             "trains on)")


def stage_target(stage: str, region: str | None, cfn_client: Any = None) -> Target:
    """The stage's bucket and group from its CloudFormation stack's outputs (stacks/spotrun_stack.py)."""
    import boto3  # boto3 takes ~1 s to import: only commands that call AWS load it

    stack = stack_name(stage)
    try:
        client = cfn_client or boto3.client("cloudformation", region_name=region or stage_region(stage))
        outputs = client.describe_stacks(StackName=stack)["Stacks"][0].get("Outputs", [])
    except NoRegionError:  # no region given, stacks/config.py does not list the stage, no AWS configuration's
        raise RunValidationError("--stage", stage, unlisted_stage(stage)) from None
    except NoCredentialsError:
        raise  # an AWS failure (exit 1, as every command's), not an invalid stage: `run_command`
    except (ClientError, BotoCoreError) as exc:
        raise RunValidationError("--stage", stage, f"a deployed stage whose stack {stack} can be read "
                                 f"({type(exc).__name__}); offline, give --bucket and --group") from None
    values = {o["OutputKey"]: o["OutputValue"] for o in outputs}
    bucket, group = StackOutput.ARTIFACT_BUCKET.value, StackOutput.MODEL_PACKAGE_GROUP_NAME.value
    if bucket not in values or group not in values:
        raise RunValidationError("--stage", stage, f"a stack {stack} with {bucket} and {group} outputs")
    return Target(values[bucket], values[group])


def add_prepared_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prepared", type=Path, help="where raw local text in data.source is tokenized to be "
                        "planned (default: prepared/ beside the run file, where `spotrun demo` leaves it; `spotrun "
                        "local --out DIR` uses DIR/prepared and reuses what it finds beside the run file; shards "
                        "`spotrun local` prepared under ./runs/prepared, its default, are reused here); the same "
                        "text and tokenizer are never tokenized twice")


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stage", help="check against this deployed stage's rules (reads its stack's outputs)")
    parser.add_argument("--region", help="the stage's region (default: with --stage, stacks/config.py's; else your "
                        "AWS configuration's); `estimate` prices the run in it (default "
                        f"{DEFAULT_PRICE_REGION}; regions without prices in the catalog are refused)")
    parser.add_argument("--bucket", help="offline: the stage's artifact bucket (its ArtifactBucket output)")
    parser.add_argument("--group", help="offline: the stage's model package group (ModelPackageGroupName output)")


def target_from_args(args: argparse.Namespace, cfn_client: Any = None) -> Target | None:
    if bool(args.bucket) != bool(args.group):
        given, missing = ("--bucket", "--group") if args.bucket else ("--group", "--bucket")
        raise RunValidationError(given, args.bucket or args.group, f"{missing} too (offline flags go together)")
    if args.bucket:
        return Target(args.bucket, args.group)
    if args.stage:
        return stage_target(args.stage, args.region, cfn_client)
    return None


UNCHECKED = "unchecked"  # the status when a setting of the run itself could not be checked here


def _ok_doc(checked: Checked) -> dict:
    extra = {"unchecked": checked.unchecked} if checked.unchecked else {}
    if checked.estimate is None and checked.warnings:  # validate's (estimate's are in the estimate)
        extra["warnings"] = checked.warnings
    if checked.estimate is not None:  # the text's line under the policy table (`policy_text`), where there is one
        section = checked.estimate.spot_policy
        extra["held_out_margin"] = held_out_margin(section.policies) if section else None
        extra["cap_to_set_held_out_margin"] = cap_to_set_held_out_margin(section)
        extra["larger_cap_bills_less"] = larger_cap_bills_less(section)
        extra["cap_to_set_speed_margin"] = speed_margin_note(checked.estimate)
    return {"status": UNCHECKED if checked.unchecked else "ok",
            **(checked.estimate.to_json() if checked.estimate else {}),
            "checked": checked.checked, "not_checked": checked.not_checked, **extra}


MISSED = "THE DEADLINE WILL BE MISSED"  # spotrun/planner/estimate.py's warning for an accepted miss


def _print_ok(path: Path, checked: Checked) -> None:
    if checked.unchecked:
        who = f"`spotrun estimate {path}` must check these" if checked.estimate is None else \
            "these need what could not be read here; the pipeline's estimate step reads it and refuses a run that fails"
        print(f"== {path}: NOT CHECKED (nothing wrong found, but {who}): " + "; ".join(checked.unchecked))
    else:
        missed = checked.estimate is not None and any(w.startswith(MISSED) for w in checked.estimate.warnings)
        # the accepted miss is said first, not only among the warnings under the plan's lines
        print(f"== {path}: ok" + (f", but {MISSED} (accepted by compute.accept_missed_deadline; the warning below "
                                  "says by how much)" if missed else ""))
    if checked.estimate is not None:
        print(format_text(checked.estimate))
        print(policy_text(checked.estimate.spot_policy))
        if note := speed_margin_note(checked.estimate):  # under the cap to set, the policy text's last line
            print("  " + note["line"])
        if (section := checked.estimate.spot_policy) and section.cap_to_set_headroom:
            print("  " + section.cap_to_set_headroom["line"])
    else:
        for warning in checked.warnings:
            print(f"warning: {warning}")
    print("checked: " + "; ".join(checked.checked))
    if checked.not_checked:
        print("not checked: " + "; ".join(checked.not_checked))


def run_command(args: argparse.Namespace, *, plan: bool, cfn_client: Any = None, s3_client: Any = None) -> int:
    """`spotrun validate` (plan=False) and `spotrun estimate` (plan=True) over args.runs; returns the exit code
    (exits.combined: 2 when any file is invalid, else the highest of the files')."""
    try:
        target = target_from_args(args, cfn_client)
    except Refusal as exc:
        return fail(args.format, Exit.INVALID, exc.status, exc.message, exc.field)
    except NoCredentialsError as exc:
        return fail(args.format, Exit.FAILED, "AWS", aws_message(exc))
    codes, docs = [Exit.OK], []
    region = args.region or stage_region(args.stage)  # with --stage, its prices
    if args.stage and not args.bucket and region is None:  # a stage stacks/config.py does not list: priced
        import boto3  # NOTE: imported here: only a --stage read loads it (stage_target has already)

        region = boto3.session.Session().region_name  # where stage_target found its stack, as `start` prices it
    if plan and s3_client is None and region:  # the sources in S3 read in the stage's region, not a default one
        import boto3  # NOTE: imported here: a run with local sources plans without boto3 loaded

        s3_client = boto3.client("s3", region_name=region)
    for path in args.runs:
        try:
            checked = check_file(path, target, plan=plan, s3_client=s3_client, region=region,
                                 prepared=getattr(args, "prepared", None), stage=args.stage)
        except Refusal as exc:
            result = exc.result()
            # a refusal naming caps says of them what the accepted estimate's JSON says (policy_stage.py
            # `over_budget_with_caps`)
            doc = split_excerpt({"error": result.pop("status"), **result, **getattr(exc, "notes", {})})
            codes.append(for_status(exc.status))
            if args.format != "json":
                print(f"{path}: {exc.line()}", file=sys.stderr)
        else:
            doc = _ok_doc(checked)
            if args.format != "json":
                _print_ok(path, checked)
        docs.append({"file": str(path), **doc})
    if args.format == "json":
        print(strict_dumps(docs[0] if len(docs) == 1 else docs, indent=2))
    return int(combined(codes))


def register(sub: Any) -> None:
    """Add the `validate` and `estimate` subcommands to the CLI's subparsers."""
    val = sub.add_parser("validate", help="check run file(s) without sources or planner (`estimate` checks the rest)",
                         description="Check run file(s): the contract, SageMaker's limits, the catalog's instance "
                         "types and, with --stage or --bucket/--group, the stage's rules.", epilog=EXIT_CODES_HELP,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    est = sub.add_parser("estimate", help="estimate instance, time limits, checkpoint cadence and cost of run(s)",
                         description="Validate run file(s) as `validate` does, read their sources and plan them.",
                         epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    for parser, plan in ((val, False), (est, True)):
        parser.add_argument("runs", nargs="+", type=run_file("runs"),
                            help="run JSON file(s); relative local sources are read relative to each file")
        parser.add_argument("--format", choices=["text", "json"], default="text", help="text (default) or JSON")
        if plan:
            add_prepared_argument(parser)
        add_target_arguments(parser)
        parser.set_defaults(func=lambda args, plan=plan: run_command(args, plan=plan))
