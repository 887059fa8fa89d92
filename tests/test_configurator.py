"""
configurator.configure on a fake script's globals: config files and --key=value overrides, typos and
types.
"""

import pytest

from configurator import ConfigError, configure


def script_globals():
    """What a script's module-level settings look like, plus things that are not settings."""
    import math
    return dict(out_dir="out", batch_size=64, learning_rate=3e-4, compile=False, betas=(0.9, 0.95),
                init_from=None, _private=1, math=math, GAMMA_GRID=[0.0, 0.1])


def write_config(tmp_path, text):
    path = tmp_path / "my_config.py"
    path.write_text(text)
    return str(path)


def test_file_then_command_line_and_the_resolved_config_is_returned(tmp_path):
    g = script_globals()
    path = write_config(tmp_path, "import os\nbatch_size = 8\nlearning_rate = 1e-3\n"
                                  "_helper = 'ignored'\n")
    config = configure(g, [path, "--batch_size=16", "--betas=(0.8, 0.9)"], print_config=False)
    # settings only: no modules, no private names, no CONSTANTS
    assert config == dict(out_dir="out", batch_size=16, learning_rate=1e-3, compile=False,
                          betas=(0.8, 0.9), init_from=None)
    assert g["batch_size"] == 16 and g["learning_rate"] == 1e-3  # the script's globals too


def test_misspelled_key_in_a_config_file(tmp_path):
    path = write_config(tmp_path, "learning_rat = 1e-3\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'learning_rat' in config file "
                                          r".*my_config\.py; did you mean 'learning_rate'\?"):
        configure(script_globals(), [path], print_config=False)


def test_misspelled_key_on_the_command_line():
    with pytest.raises(ConfigError, match=r"unknown config key 'batch_sise' in the command line; "
                                          r"did you mean 'batch_size'\?"):
        configure(script_globals(), ["--batch_sise=3"], print_config=False)


@pytest.mark.parametrize("arg, message", [
    ("--batch_size=abc", "config key 'batch_size' in the command line must be int, got str 'abc'"),
    ("--batch_size=2.5", "must be int, got float 2.5"),
    ("--compile=1", "config key 'compile' in the command line must be bool, got int 1"),
    ("--learning_rate=fast", "must be float, got str 'fast'"),
])
def test_wrong_type(arg, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        configure(script_globals(), [arg], print_config=False)


def test_wrong_type_in_a_config_file(tmp_path):
    path = write_config(tmp_path, "batch_size = '64'\n")
    with pytest.raises(ConfigError,
                       match="'batch_size' in config file .* must be int, got str '64'"):
        configure(script_globals(), [path], print_config=False)


def test_int_is_accepted_for_a_float():
    config = configure(script_globals(), ["--learning_rate=1"], print_config=False)
    assert config["learning_rate"] == 1.0 and type(config["learning_rate"]) is float


def test_values_are_python_literals_or_else_strings():
    config = configure(script_globals(),
                       ["--out_dir=out-sbd-small", "--compile=True", "--init_from=resume"],
                       print_config=False)
    assert config["out_dir"] == "out-sbd-small" and config["compile"] is True
    assert config["init_from"] == "resume"  # a None default takes any type
    config = configure(script_globals(), ["--out_dir=/tmp/a b"], print_config=False)
    assert config["out_dir"] == "/tmp/a b"


def test_unknown_config_file():
    with pytest.raises(ConfigError, match=r"cannot read config file 'config/nope\.py'"):
        configure(script_globals(), ["config/nope.py"], print_config=False)


def test_override_without_a_value():
    with pytest.raises(ConfigError, match="must look like --key=value"):
        configure(script_globals(), ["--batch_size"], print_config=False)


def test_prints_the_resolved_config(capsys):
    configure(script_globals(), ["--batch_size=2"])
    assert "batch_size=2" in capsys.readouterr().out
