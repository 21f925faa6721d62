"""Every `OML_*` setting is declared once, in `oml_dagster.settings`: its default when unset or
empty, its refusal of a bad value (naming the variable and the value), the README's table of
them, and that no other module reads an `OML_*` variable itself."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from oml_dagster import cli, from_settings, settings
from oml_dagster.defs.resources import DeploymentSettings, WriterResource
from oml_dagster.lake import errors
from oml_dagster.lake.faults import EXIT_PERMANENT, classify
from oml_dagster.lake.write.writer import WriterConfig
from oml_dagster.settings import InvalidSetting

REPO = Path(__file__).resolve().parents[1]

# A value each setting refuses (the text settings take any string).
BAD = {
    "OML_LAKE_STORAGE_OPTIONS": '["not", "an", "object"]',
    "OML_MAX_BATCH": "1",
    "OML_MEMORY_BUDGET_MIB": "-1",
    "OML_TXN_LAG_LIMIT": "0",
    "OML_FOLD_TIMEOUT_SECONDS": "0",
    "OML_RUN_DRAIN_SECONDS": "-1",
    "OML_DRAIN_SHARDS": "-2",
    "OML_SHARD_RUN_SECONDS": "-1",
    "OML_SHARD_STANDING": "maybe",
    "OML_FRESHNESS_BOUND_SECONDS": "0",
    "OML_FRESHNESS_INTERVAL_SECONDS": "2.5",
    "OML_SENSOR_INTERVAL_SECONDS": "half a minute",
    "OML_DAGSTER_AUTOSTART": "sometimes",
    "OML_SCHEDULE_TIMEZONE": "Mars/Olympus_Mons",
    "OML_RECONCILE_CRON": "daily",
    "OML_ANALYTICS_CRON": "0 6 * *",
    "OML_COMPACT_CRON": "0 2 * * * *",
    "OML_ZORDER_CRON": "every sunday",
    "OML_VACUUM_CRON": "0 4 * * mon;rm",
    "OML_ERASURE_CADENCE_SECONDS": "1.5",
    "OML_PURGE_GRACE_SECONDS": "-1",
    "OML_EXPORTER_LAKE_REFRESH_SECONDS": "0",
    "OML_RETRY_ATTEMPTS": "0",
    "OML_RETRY_SECONDS": "-5",
    "OML_PG_CONNECT_SECONDS": "0",
    "OML_DEBUG": "verbose",
}
TEXT = {"OML_PG_DSN", "OML_WRITER_PASSWORD", "OML_LAKE_URI", "OML_TENANT_STORAGE_OPTIONS_DIR"}


def test_every_setting_has_a_refusal_case_unless_it_is_text():
    assert set(BAD) | TEXT == {s.name for s in settings.SETTINGS}


@pytest.mark.parametrize("setting", settings.SETTINGS, ids=lambda s: s.name)
def test_unset_and_empty_read_the_default(setting):
    assert setting.read({}) == setting.default
    assert setting.read({setting.name: ""}) == setting.default
    assert setting.read({setting.name: "  "}) == setting.default


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_is_refused_naming_the_variable_and_the_value(name):
    setting = next(s for s in settings.SETTINGS if s.name == name)
    with pytest.raises(InvalidSetting) as refused:
        setting.read({name: BAD[name]})
    assert f"{name}={BAD[name]!r}: expected {setting.expected}" in str(refused.value)
    # Callers that catch ValueError see it; the core names the same class and classifies it as
    # a person's to fix.
    assert isinstance(refused.value, ValueError) and errors.InvalidSetting is InvalidSetting
    assert classify(refused.value).exit_code == EXIT_PERMANENT


@pytest.mark.parametrize(
    ("name", "raw", "value"),
    [
        ("OML_MAX_BATCH", " 6 ", 6),
        ("OML_TXN_LAG_LIMIT", "3", 3),
        ("OML_FOLD_TIMEOUT_SECONDS", "2.5", 2.5),
        ("OML_RUN_DRAIN_SECONDS", "0", 0.0),
        ("OML_SENSOR_INTERVAL_SECONDS", "5", 5),
        ("OML_SCHEDULE_TIMEZONE", "Europe/Berlin", "Europe/Berlin"),
        ("OML_RECONCILE_CRON", "*/10  * * * *", "*/10 * * * *"),
        ("OML_ERASURE_CADENCE_SECONDS", "0", 0),
        (
            "OML_LAKE_STORAGE_OPTIONS",
            '{"AWS_ALLOW_HTTP": true, "timeout": 30, "AWS_REGION": "eu-west-1"}',
            {"AWS_ALLOW_HTTP": "true", "timeout": "30", "AWS_REGION": "eu-west-1"},
        ),
    ],
)
def test_good_values_are_read_in_the_setting_s_type(name, raw, value):
    setting = next(s for s in settings.SETTINGS if s.name == name)
    assert setting.read({name: raw}) == value


@pytest.mark.parametrize(("raw", "on"), [("1", True), ("TRUE", True), ("on", True), ("No", False)])
def test_autostart_is_parsed_one_way_for_the_sensor_and_every_schedule(raw, on):
    env = {"OML_DAGSTER_AUTOSTART": raw}
    assert DeploymentSettings.from_env(env).autostart is on


def test_the_earlier_timezone_name_is_read_and_a_disagreement_refused():
    earlier = {"OML_MAINTENANCE_TZ": "Asia/Tokyo"}
    assert DeploymentSettings.from_env(earlier).schedule_timezone == "Asia/Tokyo"
    both = {"OML_SCHEDULE_TIMEZONE": "Asia/Tokyo", "OML_MAINTENANCE_TZ": "Asia/Tokyo"}
    assert settings.SCHEDULE_TIMEZONE.read(both) == "Asia/Tokyo"
    with pytest.raises(InvalidSetting, match="OML_MAINTENANCE_TZ='UTC' disagree"):
        DeploymentSettings.from_env(
            {"OML_SCHEDULE_TIMEZONE": "Asia/Tokyo", "OML_MAINTENANCE_TZ": "UTC"}
        )


def test_the_cli_and_the_dagster_resource_derive_the_same_writer_config(monkeypatch):
    for env, expected in (
        ({}, (50_000, 200)),
        ({"OML_MAX_BATCH": "10000"}, (10_000, 200)),
        ({"OML_MAX_BATCH": "1000"}, (1_000, 200)),
        ({"OML_MAX_BATCH": "300"}, (300, 150)),
        ({"OML_MAX_BATCH": "1000", "OML_TXN_LAG_LIMIT": "10"}, (1_000, 10)),
    ):
        for name in ("OML_MAX_BATCH", "OML_TXN_LAG_LIMIT"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        resource, command_line = (
            WriterResource().resolve().config,
            from_settings.writer_config(None),
        )
        assert resource == command_line, env
        assert (resource.max_batch, resource.txn_lag_limit) == expected, env
    # A run's config or --max-batch overrides OML_MAX_BATCH in the same way.
    monkeypatch.delenv("OML_TXN_LAG_LIMIT")
    assert (
        WriterResource(max_batch=8).resolve().config
        == from_settings.writer_config(8)
        == WriterConfig.for_batch(8)
    )


def test_a_lag_limit_not_below_the_batch_is_refused_naming_both():
    with pytest.raises(InvalidSetting, match="OML_TXN_LAG_LIMIT=100 with OML_MAX_BATCH=100"):
        settings.writer_batch({"OML_MAX_BATCH": "100", "OML_TXN_LAG_LIMIT": "100"})


def test_the_fold_timeout_and_memory_budget_come_from_their_settings_at_the_edge(monkeypatch):
    monkeypatch.setenv("OML_FOLD_TIMEOUT_SECONDS", "12.5")
    monkeypatch.setenv("OML_MEMORY_BUDGET_MIB", "500")
    for config in (
        from_settings.writer_config(),
        from_settings.writer_config(None),
        WriterResource().resolve().config,
    ):
        assert (config.fold_timeout_seconds, config.memory_budget_mib) == (12.5, 500)
    # The core's own config reads no environment: its defaults are the settings' defaults.
    assert WriterConfig() == from_settings.writer_config(env={})
    assert WriterConfig().fold_timeout_seconds == settings.FOLD_TIMEOUT_SECONDS.default
    assert WriterConfig().memory_budget_mib == settings.MEMORY_BUDGET_MIB.default
    assert WriterConfig().max_batch == settings.MAX_BATCH.default
    monkeypatch.setenv("OML_FOLD_TIMEOUT_SECONDS", "soon")
    with pytest.raises(InvalidSetting, match="OML_FOLD_TIMEOUT_SECONDS='soon'"):
        from_settings.writer_config()


def test_storage_options_take_the_aws_variables_then_the_json_over_them(monkeypatch, tmp_path):
    env = {
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "OML_LAKE_STORAGE_OPTIONS": '{"AWS_REGION": "eu-west-1"}',
    }
    assert settings.lake_storage_options(env) == {
        "AWS_REGION": "eu-west-1",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
    }
    monkeypatch.setenv("OML_LAKE_URI", str(tmp_path / "lake"))
    monkeypatch.setenv("OML_LAKE_STORAGE_OPTIONS", "{not json")
    with pytest.raises(InvalidSetting, match="OML_LAKE_STORAGE_OPTIONS='{not json': expected"):
        from_settings.lake()


def test_the_command_line_names_a_bad_setting_and_exits_3(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("OML_LAKE_URI", str(tmp_path / "lake"))
    monkeypatch.setenv("OML_MAX_BATCH", "lots")
    assert cli.main(["drain"]) == 3  # a person must fix it
    err = capsys.readouterr().err
    assert "InvalidSetting: OML_MAX_BATCH='lots': expected an integer >= 2" in err
    assert "Traceback" not in err


def test_a_bad_drain_cap_in_the_run_config_is_refused_naming_the_field():
    with pytest.raises(InvalidSetting, match="run_drain_seconds='-2.0'"):
        WriterResource(run_drain_seconds=-2).resolve()


# --- one module reads them, and the README lists them ---------------------------------------------

_READS = re.compile(r"""(?:environ(?:\.get)?|env\.get|getenv)[\[(]\s*["'](OML_[A-Z0-9_]+)["']""")


def test_no_other_module_reads_an_oml_variable():
    readers = {
        str(path.relative_to(REPO)): _READS.findall(path.read_text())
        for path in (REPO / "oml_dagster").rglob("*.py")
        if path.name != "settings.py"
    }
    assert {path: names for path, names in readers.items() if names} == {}


def _readme_table() -> str:
    readme = (REPO / "README.md").read_text()
    match = re.search(
        r"<!-- settings: begin[^>]*-->\n(.*?)<!-- settings: end -->", readme, flags=re.S
    )
    assert match, "README.md has no settings table between its markers"
    return match[1]


def test_the_readme_lists_every_setting_as_the_module_declares_it():
    assert _readme_table() == settings.markdown_table(), (
        "README.md's settings table differs from oml_dagster/settings.py; regenerate it with "
        "`python -m oml_dagster.settings`"
    )


def test_every_oml_variable_the_readme_names_is_a_setting_or_a_test_or_demo_knob():
    names = set(re.findall(r"OML_[A-Z0-9_]+", (REPO / "README.md").read_text()))
    declared = {n for s in settings.SETTINGS for n in (s.name, *s.aliases)}
    declared.add(settings.TENANT_STORAGE_VARIABLE)  # + a tenant's UUID in hex
    knobs = {
        n
        for n in names
        if n.startswith(("OML_TEST_", "OML_DEMO_", "OML_BENCH_"))
        or n in {"OML_PROPERTY_EXAMPLES", "OML_UPDATE_UI_SCREENSHOT", "OML_VENV"}
    }
    assert names - knobs <= declared, sorted(names - knobs - declared)
