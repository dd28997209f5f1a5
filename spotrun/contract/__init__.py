"""The run JSON: its documented dataclasses (spec), the one decoder, value rules, the run file reader, strict JSON,
refusals and AWS text limits. Stdlib only; imports nothing from the planner, policy, pipeline or CLI."""
