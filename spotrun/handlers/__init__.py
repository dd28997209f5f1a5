"""The Lambda functions' entry points: each reads its event and environment (spotrun.seams), builds its clients and
calls the library (spotrun/pipeline/plan.py, guard.py, measured.py); nothing else imports these modules."""
