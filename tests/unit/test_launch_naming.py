"""One output per rank: placeholders, the automatic ``.rank<N>`` infix, and each launcher's variables."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracekit.record.launch import Launch, output_path


def _launch(env: dict[str, str]) -> Launch:
    return Launch.from_env(env)


@pytest.mark.parametrize(("env", "want"), [
    ({"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}, (1, 1, 2, "RANK")),  # torchrun
    ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_SIZE": "8"},
     (5, 1, 8, "OMPI_COMM_WORLD_RANK")),  # Open MPI
    ({"PMI_RANK": "3", "PMI_SIZE": "4"}, (3, None, 4, "PMI_RANK")),  # MPICH, Intel MPI
    ({"LOCAL_RANK": "2"}, (None, 2, None, "LOCAL_RANK")),
    ({}, (None, None, None, None)),
])
def test_each_launcher_family_is_read(env: dict[str, str], want: tuple[object, ...]) -> None:
    got = _launch(env)
    assert (got.rank, got.local_rank, got.world_size, got.launcher) == want


def test_the_rank_goes_before_the_suffix_only_under_a_launcher() -> None:
    ranked = _launch({"RANK": "1", "WORLD_SIZE": "2"})
    assert output_path(Path("out/ddp.parquet"), ranked) == Path("out/ddp.rank1.parquet")
    assert output_path(Path("ddp"), ranked) == Path("ddp.rank1")
    assert output_path(Path("ddp.parquet"), _launch({})) == Path("ddp.parquet")
    assert output_path(Path("d.parquet"), _launch({"LOCAL_RANK": "3"})) == Path("d.local3.parquet")


def test_placeholders_are_filled_and_no_infix_is_added() -> None:
    launch = _launch({"RANK": "7", "LOCAL_RANK": "3", "WORLD_SIZE": "16"})
    got = output_path(Path("runs/{host}/r{rank}-l{local_rank}-of{world_size}-{pid}.parquet"), launch)
    assert got == Path(f"runs/{launch.host}/r7-l3-of16-{launch.pid}.parquet")
    # outside a launcher a process is rank 0 of 1; other braces are left alone
    assert output_path(Path("{rank}of{world_size}-{x}.parquet"), _launch({})) == Path("0of1-{x}.parquet")


def test_two_ranks_never_share_a_file() -> None:
    names = {output_path(Path("job.parquet"), _launch({"RANK": str(r), "WORLD_SIZE": "64"}))
             for r in range(64)}
    assert len(names) == 64


def test_launch_reads_back_from_the_metadata_it_wrote() -> None:
    launch = _launch({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"})
    assert Launch.from_meta(launch.to_dict(device=0)) == launch
    assert Launch.from_meta(None) == Launch() == Launch.from_meta({"rank": "3", "pid": True, "host": 7})
    assert Launch.from_meta({"rank": 2}).rank == 2 and not Launch.from_meta({}).launched
