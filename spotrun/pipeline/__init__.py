"""What the deployed state machine does, as Lambda-importable library code: the plan step (plan.py) and the checks
it runs (validate, preflight), the cost guard, segments, preparation, the registration gate, the report and the
AWS event readers. Stdlib only (plus boto3 where a handler calls AWS)."""
