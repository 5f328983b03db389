"""The `headwater` command's argument parsing, without a server or a subprocess (unit tier):
what each command line turns into, and which parser reports a usage error."""

from __future__ import annotations

import pytest

from headwater.cli.main import _command_parser, _parser, main


def test_client_commands_parse_their_options_on_either_side() -> None:
    args = _parser().parse_args(
        ["--server", "127.0.0.1:1", "produce", "orders", "v", "--key", "k", "--partition", "2"]
    )
    assert (args.command, args.topic, args.key, args.partition) == ("produce", "orders", "k", 2)
    assert args.values == ["v"] and args.server == "127.0.0.1:1"
    after = _parser().parse_args(["topic", "list", "--format", "json"])
    assert (after.command, after.topic_command, after.format) == ("topic", "list", "json")


def test_the_parser_of_the_given_command_reports_its_errors() -> None:
    parser = _parser()
    args, extra = parser.parse_known_args(["topic", "list", "--subscription", "x"])
    assert extra == ["--subscription", "x"]
    assert _command_parser(parser, args).prog == "headwater topic list"
    args, _ = parser.parse_known_args(["consume", "t", "--subscription", "s"])
    assert _command_parser(parser, args).prog == "headwater consume"


def test_usage_errors_exit_2_with_the_commands_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["map", "get", "prices", "IBM", "--from", "earliest"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: headwater map get")
    assert "headwater map get: error: unrecognized arguments: --from earliest" in err
    with pytest.raises(SystemExit) as exited:
        main(["consume", "t"])  # --subscription is required
    assert exited.value.code == 2
    assert "--subscription" in capsys.readouterr().err


def test_produce_takes_values_on_both_sides_of_its_options() -> None:
    """argparse alone cannot: `main` gives produce's leftovers to its values (checked through
    the parser the way `main` uses it)."""
    parser = _parser()
    args, extra = parser.parse_known_args(["produce", "t", "--key", "k", "v1", "v2"])
    assert args.values + extra == ["v1", "v2"]


def test_an_unknown_option_without_a_command_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    """issue 41: `headwater --bogus-flag` said only that a command is required."""
    with pytest.raises(SystemExit) as exited:
        main(["--bogus-flag"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: headwater ")
    assert err.splitlines()[-1] == (
        "headwater: error: unrecognized arguments: --bogus-flag, and no command"
    )
    with pytest.raises(SystemExit) as exited:
        main(["--server", "127.0.0.1:1"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "headwater: error: the following arguments are required: command"
    )


def test_produce_isolation_takes_the_new_names_and_the_old_ones() -> None:
    """`--isolation appended|fsynced`; read-uncommitted and read-committed, the names before
    transactions, are the same values (deprecated). `--transactional-id` makes a transactional
    producer, which refuses at-most-once."""
    from headwater.cli.client_commands import _producer_config
    from headwater.client.producer_config import ProducerConfig
    from headwater.wire.messages import Isolation

    def config(*options: str) -> ProducerConfig:
        return _producer_config(_parser().parse_args(["produce", "t", "v", *options]))

    for name, value in (
        ("appended", Isolation.APPENDED),
        ("fsynced", Isolation.FSYNCED),
        ("read-uncommitted", Isolation.APPENDED),
        ("read-committed", Isolation.FSYNCED),
    ):
        assert config("--isolation", name).isolation is value
    assert Isolation.READ_COMMITTED is Isolation.FSYNCED and Isolation.FSYNCED == 1
    assert Isolation.READ_UNCOMMITTED is Isolation.APPENDED and Isolation.APPENDED == 0
    transactional = config("--transactional-id", "loader-1")
    assert transactional.transactional_id == "loader-1"
    assert transactional.idempotent
    with pytest.raises(ValueError, match="at-least-once"):
        config("--transactional-id", "loader-1", "--delivery", "at-most-once")
