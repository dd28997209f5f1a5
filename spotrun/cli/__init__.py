"""The `spotrun` command: the parser (main.py), every subcommand module, the exit-code table (exits.py) and the
calls to a deployed stage (remote.py, deploy.py). Never imported by the library packages or the Lambda handlers."""
