"""What each CLI command asks of AWS: every API call the CLI's own clients make while a test runs the commands
against moto (tests/infra/test_cli_remote.py, test_user_day.py), with the command that made it; decided by
iam-simulate against the synthesized people policies (tests/infra/test_people_policies.py)."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field

import botocore.client
import botocore.session

import spotrun.cli.main as cli_main


@dataclass
class Call:
    command: str
    service: str
    operation: str
    params: dict


@dataclass
class Recorder:
    """Calls of the clients a command creates (in the main thread, while it runs; their calls may come from
    s3transfer's threads). moto's interpreter runs the Lambda handlers in its own threads with their own clients,
    and the test's own clients are made outside commands: neither is recorded."""

    calls: list[Call] = field(default_factory=list)
    command: str = ""

    def install(self, monkeypatch) -> None:
        recorder, build_parser = self, cli_main.build_parser
        create_client, make_api_call = botocore.session.Session.create_client, \
            botocore.client.BaseClient._make_api_call

        def parser():
            built = build_parser()
            parse = built.parse_args

            def parse_args(argv=None, namespace=None):
                args = parse(argv, namespace)
                func = args.func

                def run(a):
                    recorder.command = a.cmd
                    try:
                        return func(a)
                    finally:
                        recorder.command = ""
                args.func = run
                return args
            built.parse_args = parse_args
            return built

        def create(session, *args, **kwargs):
            client = create_client(session, *args, **kwargs)
            if recorder.command and threading.current_thread() is threading.main_thread():
                client._spotrun_command = recorder.command
            return client

        def call(client, operation, params):
            command = getattr(client, "_spotrun_command", "")
            if command:
                recorder.calls.append(Call(command, client.meta.service_model.service_name, operation,
                                           json.loads(json.dumps(params, default=str))))
            return make_api_call(client, operation, params)

        monkeypatch.setattr(cli_main, "build_parser", parser)
        monkeypatch.setattr(botocore.session.Session, "create_client", create)
        monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", call)
