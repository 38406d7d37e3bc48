"""基准报告的机器描述（``bench/helpers/machine.py``）。"""

from __future__ import annotations

import os
from pathlib import Path

from bench.helpers.machine import cpu_model, describe


def test_cpu_model_reads_the_first_model_name(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n\n"
                       "processor\t: 1\nmodel name\t: AMD EPYC 7B13\n", encoding="utf-8")
    assert cpu_model(cpuinfo) == "AMD EPYC 7B13"


def test_cpu_model_falls_back_when_cpuinfo_is_missing_or_has_no_model(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("processor\t: 0\n", encoding="utf-8")
    for path in (tmp_path / "missing", tmp_path / "empty"):
        assert cpu_model(path)


def test_describe_names_the_cores_and_the_cpu() -> None:
    assert f"{os.cpu_count()} 核，{cpu_model()}" in describe()
