"""Transfer-tuning: the schedule library, Eq. 1, schedules adapted to other shapes, and the
transfer and warm start end to end."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from gradtune.cli import main
from gradtune.errors import GradtuneError
from gradtune.partition import DEFAULT_LOWERING, TuningTask, partition
from gradtune.symbolic.variables import TileVar
from gradtune.transfer.apply import (
    ADAPTED,
    APPLIED,
    DesignSpace,
    nearest_first,
    nearest_tiling,
    shape_distance,
    transfer_schedule,
)
from gradtune.transfer.library import (
    Library,
    Schedule,
    Source,
    load_library,
    transfer_class,
    write_task_table,
)
from gradtune.transfer.selection import class_shares, eq1_score, rank_sources
from tests.conftest import EXAMPLES, run_cli


def _task(name: str, kernel_class: str, untuned_us: float, weight: int = 1) -> TuningTask:
    return TuningTask(name, None, weight, kernel_class, flops=1.0, untuned_us=untuned_us)


def _source(name: str, classes: dict[str, int], target: str = "t") -> Source:
    schedules = [
        Schedule(name, target, c, f"{c}-{i}", f"{c}{i}", None, None, 1.0)
        for c, n in classes.items()
        for i in range(n)
    ]
    return Source(name, target, schedules)


# --------------------------------------------------------------------------- Eq. 1


def test_eq1_weighs_time_shares_squared_and_schedule_counts_by_square_root():
    shares = {"conv2d+add+relu": 0.8, "matmul+add": 0.2}
    # Σ P_c² √|W_T,c|: 0.64·√9 = 1.92; 0.64·√1 + 0.04·√16 = 0.80; a class M lacks adds nothing.
    assert eq1_score(shares, {"conv2d+add+relu": 9}) == pytest.approx(1.92)
    assert eq1_score(shares, {"conv2d+add+relu": 1, "matmul+add": 16}) == pytest.approx(0.80)
    assert eq1_score(shares, {"softmax": 100}) == 0.0
    # Squaring P_c: the class holding 80% of the time beats 16× as many schedules of the 20%.
    assert eq1_score(shares, {"conv2d+add+relu": 1}) > eq1_score(shares, {"matmul+add": 16})


def test_class_shares_are_untuned_time_per_class():
    tasks = [
        _task("a", "conv2d+relu", 30.0, weight=2),  # 60 µs of 100
        _task("b", "conv2d+relu", 10.0),
        _task("c", "matmul+add", 30.0),
    ]
    shares = class_shares(tasks)  # per transfer class: the compute kernels' operator family
    assert shares == pytest.approx({"conv2d": 0.7, "matmul": 0.3})
    # Without untuned timings (no device here) FLOPs stand in.
    unknown = [_task("a", "x", math.nan), _task("b", "y", math.nan)]
    assert class_shares(unknown) == pytest.approx({"x": 0.5, "y": 0.5})


def test_ranking_picks_the_eq1_maximum_not_the_largest_source():
    tasks = [_task("a", "conv2d+relu", 80.0), _task("b", "matmul+add", 20.0)]
    sources = [
        _source("many-dense", {"matmul+add": 49}),  # 0.04·7 = 0.28
        _source("few-conv", {"conv2d+relu": 2}),  # 0.64·√2 = 0.905
        _source("both", {"conv2d+relu": 1, "matmul+add": 4}),  # 0.64 + 0.08 = 0.72
        _source("unrelated", {"softmax": 5}),
    ]
    ranked = rank_sources(tasks, sources)
    assert [r.source.name for r in ranked] == ["few-conv", "both", "many-dense", "unrelated"]
    assert ranked[0].score == pytest.approx(0.64 * math.sqrt(2))
    assert ranked[-1].score == 0.0


def test_all_sources_together_offer_every_schedule_of_the_models_classes():
    """``--from all``: one source holding the schedules of every source that has any of the
    model's classes; Eq. 1's ranking is still printed, and a library without any is cold."""
    from gradtune.transfer.run import ALL, select_source

    # Classes whose loops no lowering option shapes (a convolution's schedule records its layout).
    tasks = [_task("a", "matmul+add", 80.0), _task("b", "softmax", 20.0)]
    sources = [
        _source("few-dense", {"matmul+add": 2}),
        _source("both", {"matmul+add": 1, "softmax": 4}),
        _source("unrelated", {"concatenate": 5}),
    ]
    chosen, lines = select_source(tasks, Library(sources), "t", ALL)
    assert chosen.name == ALL and len(chosen.schedules) == 2 + 5
    assert {s.source for s in chosen.schedules} == {"few-dense", "both"}
    assert "Eq. 1 ranking (Σ_c P_c² · √|W_T,c|):" in lines and lines[-1] == (
        "transferring from all 2: few-dense, both"
    )
    chosen, lines = select_source(tasks, Library(sources[2:]), "t", ALL)
    assert chosen is None and "nothing to transfer" in lines[-1]
    # Unasked, a warm start takes every source, a transfer Eq. 1's (the paper's method).
    from gradtune.job import TuneJob
    from gradtune.transfer.run import AUTO, source_choice

    assert source_choice(TuneJob(model="m.onnx", library="runs")) == ALL
    assert source_choice(TuneJob(model="m.onnx", library="runs", transfer_only=True)) == AUTO
    assert source_choice(TuneJob(model="m.onnx", library="runs", library_from="auto")) == AUTO
    assert source_choice(TuneJob(model="m.onnx", library="runs", library_from="a@b")) == AUTO


def test_transfer_classes_join_compute_kernels_across_epilogues_only():
    bn_conv = "conv2d+subtract+divide+multiply+add+relu"
    assert transfer_class(bn_conv) == transfer_class("conv2d+add+relu") == "conv2d"
    assert transfer_class("blocks:conv2d_nchw+T_add+compute") == "conv2d"
    # No compute family: only the same kernel class transfers.
    assert transfer_class("max+pool2d") == "max+pool2d"
    assert transfer_class("concatenate") != transfer_class("resize2d+concatenate")
    # A BatchNorm-conv source counts for a model whose convolutions add a bias instead.
    tasks = [_task("a", "conv2d+add+relu", 90.0), _task("b", "max+pool2d", 10.0)]
    ranked = rank_sources(tasks, [_source("bn", {bn_conv: 4}), _source("pool", {"max+pool2d": 9})])
    assert [r.source.name for r in ranked] == ["bn", "pool"]
    assert ranked[0].score == pytest.approx(0.81 * 2)


def test_schedules_of_another_lowering_of_their_loops_are_not_offered():
    from gradtune.transfer.run import select_source

    def schedule(kernel_class: str, **lowering) -> Schedule:
        return Schedule("s", "t", kernel_class, kernel_class, "", None, None, 1.0, lowering)

    subpixel = asdict(DEFAULT_LOWERING)
    assert subpixel["subpixel_conv_transpose"] and subpixel["conv_layout"] == "NCHW"
    topi_deconv = schedule("conv2d_transpose+relu", subpixel_conv_transpose=False)
    nchw_conv = schedule("conv2d+add+relu", conv_layout="NCHW")
    pool = schedule("max+pool2d", conv_layout="NCHW")
    dense = schedule("matmul+add")  # no option shapes a matmul's loops
    source = Source("s", "t", [topi_deconv, nchw_conv, pool, dense])
    # TOPI's zero-spread lowering of a transposed convolution fits no sub-pixel sketch.
    assert source.fitting(subpixel).schedules == [nchw_conv, pool, dense]
    assert topi_deconv.fits({**subpixel, "subpixel_conv_transpose": False})
    # A data layout reorders the convolutions and the kernels it spreads to, not a matmul;
    # prepacked weights, fast math and a folded BatchNorm reorder nothing.
    nhwc = {**subpixel, "conv_layout": "NHWC"}
    assert [s.kernel_class for s in source.fitting(nhwc).schedules] == ["matmul+add"]
    for option in ("weight_prepack", "fast_math", "fold_batchnorm"):
        assert nchw_conv.fits({**subpixel, option: not subpixel[option]})
    # What is left out is never ranked, and the ranking says how many were.
    tasks = [_task("a", "conv2d_transpose+relu", 90.0), _task("b", "matmul+add", 10.0)]
    library = Library([source])
    chosen, lines = select_source(tasks, library, "t", lowering=subpixel)
    assert chosen.schedules == [nchw_conv, pool, dense]
    assert lines[0].startswith("1 schedule(s) tuned under another lowering of their loops")


# --------------------------------------------------------------------------- the library


def _record_database(directory: Path, tasks, targets, seed: int = 1) -> None:
    """A JSONDatabase holding, for each target, one measured schedule per task (a sketch of
    the task with its sampled decisions, postprocessed), and the run's partition table."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from gradtune.symbolic.verify import design_space

    directory.mkdir(parents=True, exist_ok=True)
    db = ms.database.JSONDatabase(
        str(directory / "database_workload.json"),
        str(directory / "database_tuning_record.json"),
        allow_missing=True,
        module_equality="structural",
    )
    for target in targets:
        for task in tasks:
            _, spaces, postprocs = design_space(task.mod, target, seed=seed)
            sch = tvm.s_tir.Schedule(task.mod)
            spaces[0].trace.apply_to_schedule(sch, remove_postproc=False)
            sch.enter_postproc()
            assert all(p.apply(sch) for p in postprocs)
            db.commit_tuning_record(
                ms.database.TuningRecord(
                    sch.trace,
                    db.commit_workload(task.mod),
                    [1e-5, 1.1e-5, 1.2e-5],
                    target,
                    ms.arg_info.ArgInfo.from_prim_func(task.mod["main"]),
                )
            )
    write_task_table(directory, tasks, asdict(DEFAULT_LOWERING))


@pytest.fixture(scope="module")
def mlp_tasks(tiny_model, llvm_target):
    return partition(tiny_model.mod, tiny_model.params, llvm_target)[1]


@pytest.fixture(scope="module")
def other_target(llvm_target):
    """The same CPU with another core count: schedules tuned for it are another target's."""
    import tvm

    config = dict(llvm_target.export())
    config["num-cores"] = int(config["num-cores"]) + 2
    config.pop("keys", None)
    config.pop("tag", None)
    return tvm.target.Target(config)


def test_library_indexes_by_target_class_and_workload_and_never_mixes_targets(
    mlp_tasks, llvm_target, other_target, tmp_path
):
    from gradtune.transfer.library import target_key

    _record_database(tmp_path / "run", mlp_tasks, [llvm_target, other_target])
    library = load_library(str(tmp_path / "run"))
    mine, theirs = target_key(llvm_target), target_key(other_target)
    assert library.targets() == {mine, theirs}
    for key in (mine, theirs):
        (source,) = library.for_target(key)
        assert {s.target for s in source.schedules} == {key}
        assert sorted(source.by_class()) == sorted(t.kernel_class for t in mlp_tasks)
    for (target, kernel_class, workload), schedules in library.index().items():
        assert {s.target for s in schedules} == {target}
        assert {s.kernel_class for s in schedules} == {kernel_class}
        assert {s.workload for s in schedules} == {workload}
    assert len(library.index()) == 2 * len(mlp_tasks)
    # Only the other target's schedules: refused, naming both targets.
    _record_database(tmp_path / "elsewhere", mlp_tasks, [other_target])
    only_theirs = load_library(str(tmp_path / "elsewhere"))
    with pytest.raises(GradtuneError, match=r"cores.*not for this run's target.*cores"):
        only_theirs.check_target(mine)
    with pytest.raises(GradtuneError, match="empty"):
        Library().check_target(mine)


def test_the_library_reads_each_schedules_lowering_from_the_table_or_the_run(
    mlp_tasks, llvm_target, tmp_path
):
    _record_database(tmp_path / "run", mlp_tasks, [llvm_target])  # the default lowering
    rows = json.loads((tmp_path / "run" / "database_tasks.json").read_text())
    assert [row["lowering"] for row in rows] == [{} for _ in rows]  # an MLP: nothing shaped
    schedules = load_library(str(tmp_path / "run")).sources[0].schedules
    assert [s.lowering for s in schedules] == [{} for _ in schedules]
    # A table from before the lowering was recorded: the run's own record of it.
    for row in rows:
        row.pop("lowering")
        row["kernel_class"] = "conv2d+add"  # as if its kernels were convolutions
    (tmp_path / "run" / "database_tasks.json").write_text(json.dumps(rows))
    (tmp_path / "run" / "run.json").write_text(json.dumps({"lowering": {"conv_layout": "NHWC"}}))
    schedules = load_library(str(tmp_path / "run")).sources[0].schedules
    assert [s.lowering for s in schedules] == [{"conv_layout": "NHWC"} for _ in schedules]
    # Without a record of the run either: the lowering of that time, NCHW.
    (tmp_path / "run" / "run.json").unlink()
    schedules = load_library(str(tmp_path / "run")).sources[0].schedules
    assert [s.lowering for s in schedules] == [{"conv_layout": "NCHW"} for _ in schedules]


def test_corrupt_source_is_skipped_and_counted(mlp_tasks, llvm_target, tmp_path):
    _record_database(tmp_path / "runs" / "good", mlp_tasks, [llvm_target])
    bad = tmp_path / "runs" / "bad"
    bad.mkdir()
    (bad / "database_workload.json").write_text('["oops", "not base64"]\n')
    (bad / "database_tuning_record.json").write_text("[0, [[[], []], [1e-5]]]\n")
    library = load_library(str(tmp_path / "runs"))
    assert [s.name for s in library.sources] == [str(tmp_path / "runs" / "good")]
    assert list(library.skipped) == [str(bad)]
    assert any("skipped 1 unreadable" in line for line in _describe(library))


def _describe(library: Library) -> list[str]:
    from gradtune.transfer.library import describe

    return describe(library)


def test_library_ls_prints_each_kernel_class(mlp_tasks, llvm_target, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the registry is listed too if set
    _record_database(tmp_path / "run", mlp_tasks, [llvm_target])
    assert main(["library", "ls", "--from", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    for task in mlp_tasks:
        assert f"{task.kernel_class} " in out
    assert "1 source(s), 2 schedules" in out


# --------------------------------------------------------------------------- adapting


def test_nearest_tiling_keeps_inner_factors_where_the_extent_allows():
    var = TileVar(index=0, extent=24, n=4, max_innermost=64, primes=[2, 3], totals=[3, 1])
    assert nearest_tiling(var, [2, 1, 4, 2]) == [3, 1, 4, 2]  # inner kept, outer absorbs 16→24
    tiled = nearest_tiling(var, [1, 2, 1, 16])  # 16 does not divide 24: the nearest that does
    assert math.prod(tiled) == 24 and tiled[1:3] == [2, 1] and tiled[3] in (8, 12)
    capped = TileVar(index=0, extent=128, n=2, max_innermost=16, primes=[2], totals=[7])
    assert nearest_tiling(capped, [1, 64]) == [8, 16]  # max_innermost_factor respected


@pytest.fixture(scope="module")
def wide_tasks(llvm_target):
    """tiny_mlp's kernel classes at other shapes."""
    return partition(*_load("tiny_mlp_wide"), llvm_target)[1]


def test_adapted_schedule_is_a_valid_program_of_the_new_shape(mlp_tasks, wide_tasks, llvm_target):
    import tvm

    from gradtune.symbolic.verify import design_space

    statuses = set()
    for source_task in mlp_tasks:
        (task,) = [t for t in wide_tasks if t.kernel_class == source_task.kernel_class]
        space = DesignSpace.of(task, llvm_target)
        _, spaces, postprocs = design_space(source_task.mod, llvm_target, seed=7)
        for sketch in spaces:
            sch = tvm.s_tir.Schedule(source_task.mod)
            sketch.trace.apply_to_schedule(sch, remove_postproc=False)
            sch.enter_postproc()
            if not all(p.apply(sch) for p in postprocs):
                continue
            # As the database keeps a measured trace: unused block lookups dropped.
            trace = sch.trace.simplified(remove_postproc=False)
            origin = Schedule("src", "t", source_task.kernel_class, "w", source_task.name,
                              trace, source_task.mod, 1.0)  # fmt: skip
            candidate = transfer_schedule(space, origin)
            assert candidate.status in (APPLIED, ADAPTED), candidate.reason
            statuses.add(candidate.status)
            _assert_same_results(candidate.schedule.mod, task.mod, llvm_target)
    assert ADAPTED in statuses  # other extents: tiles had to be fitted


def _measured_trace(task, target, seed: int = 7):
    """A postprocessed program of ``task``'s first sketch, its trace as a database keeps it."""
    import tvm

    from gradtune.symbolic.verify import design_space

    _, spaces, postprocs = design_space(task.mod, target, seed=seed)
    sch = tvm.s_tir.Schedule(task.mod)
    spaces[0].trace.apply_to_schedule(sch, remove_postproc=False)
    sch.enter_postproc()
    assert all(p.apply(sch) for p in postprocs)
    return sch.trace.simplified(remove_postproc=False)


def test_a_schedule_transfers_across_an_elementwise_epilogue(mlp_tasks, wide_tasks, llvm_target):
    """matmul+add+relu's schedule on a matmul+add of other extents: MetaSchedule inlined the
    add into the relu, so the sketches differ only in that inlining."""
    (relu,) = [t for t in mlp_tasks if t.kernel_class == "matmul+add+relu"]
    (plain,) = [t for t in wide_tasks if t.kernel_class == "matmul+add"]
    origin = Schedule("src", "t", relu.kernel_class, "w", relu.name,
                      _measured_trace(relu, llvm_target), relu.mod, 1.0)  # fmt: skip
    candidate = transfer_schedule(DesignSpace.of(plain, llvm_target), origin)
    assert candidate.status == ADAPTED, candidate.reason
    assert candidate.changed[0] == "epilogue of matmul+add+relu"
    _assert_same_results(candidate.schedule.mod, plain.mod, llvm_target)


def test_schedules_of_the_nearest_shape_are_tried_first(mlp_tasks, wide_tasks, llvm_target):
    (task,) = [t for t in mlp_tasks if t.kernel_class == "matmul+add"]
    (wide,) = [t for t in wide_tasks if t.kernel_class == "matmul+add"]
    space = DesignSpace.of(task, llvm_target)
    own = Schedule("src", "t", task.kernel_class, "own", task.name,
                   _measured_trace(task, llvm_target), task.mod, 9.0)  # fmt: skip
    far = Schedule("src", "t", wide.kernel_class, "far", wide.name,
                   _measured_trace(wide, llvm_target), wide.mod, 1.0)  # fmt: skip
    sketch = space.sketches[0]
    assert shape_distance(sketch, own.trace) == 0.0
    assert shape_distance(sketch, far.trace) > 0.0
    # The faster source schedule comes second: it was tuned for other extents.
    assert [s.workload for s in nearest_first(space, [far, own])] == ["own", "far"]


def test_a_transferred_program_is_known_once_measured(mlp_tasks, wide_tasks, llvm_target, tmp_path):
    """What a resumed transfer relies on to measure nothing twice: the program committed to
    the database reads back as the same (workload, trace text)."""
    from tvm.s_tir import meta_schedule as ms

    from gradtune.transfer.run import Transfer, measured_programs, workload_key
    from gradtune.tune import run_database

    task = wide_tasks[0]
    # A source of the task's class alone: its one schedule is all there is to transfer.
    same = [t for t in mlp_tasks if t.kernel_class == task.kernel_class]
    _record_database(tmp_path / "source", same, [llvm_target])
    (source,) = load_library(str(tmp_path / "source")).sources
    (origin,) = source.matching(task)
    candidate = transfer_schedule(DesignSpace.of(task, llvm_target), origin)
    (tmp_path / "run").mkdir()
    database = run_database(tmp_path / "run")
    database.commit_tuning_record(
        ms.database.TuningRecord(
            candidate.schedule.trace,
            database.commit_workload(task.mod),
            [1e-5],
            llvm_target,
            ms.arg_info.ArgInfo.from_prim_func(task.mod["main"]),
        )
    )
    reopened = run_database(tmp_path / "run")
    assert (workload_key(task.mod), str(candidate.schedule.trace)) in measured_programs(reopened)
    # So a resumed transfer skips it: it is tried, and nothing is left to measure for it.
    transfer = Transfer([task], llvm_target, source)
    assert transfer(reopened, builder=None, runner=None, trials_left=10) == 0
    assert transfer.stats.candidates_tried == 1 and transfer.stats.measured == 0


def _assert_same_results(scheduled, default, target) -> None:
    """The scheduled program computes what the task's unscheduled one does."""
    import tvm
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    rng = np.random.default_rng(0)
    infos = ArgInfo.from_prim_func(default["main"])
    inputs = [rng.standard_normal([int(d) for d in i.shape]).astype(i.dtype) for i in infos]
    outputs = []
    for mod in (scheduled, default):
        args = [tvm.runtime.tensor(x.copy(), tvm.cpu(0)) for x in inputs]
        tvm.compile(mod, target=target)["main"](*args)
        outputs.append(args[-1].numpy())
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- bad input


def _transfer_fails(capsys, argv, out: Path) -> str:
    code = main(["transfer", str(EXAMPLES / "small_cnn.py"), "--entry", "tiny_mlp_wide",
                 "--out", str(out), *argv])  # fmt: skip
    err = capsys.readouterr()
    assert code != 0
    lines = [line for line in err.err.strip().splitlines() if line.startswith("gradtune: error:")]
    assert len(lines) == 1, err.err
    assert "RPC" not in err.out and not out.exists(), "refused before anything started"
    return lines[0]


def test_transfer_refuses_bad_libraries_in_one_line(
    capsys, mlp_tasks, other_target, tmp_path, monkeypatch
):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "out"
    line = _transfer_fails(capsys, ["--library", str(tmp_path / "missing")], out)
    assert "no such run directory" in line
    line = _transfer_fails(capsys, [], out)  # the default, the registry, needs one
    assert "--mlflow-uri" in line
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "database_workload.json").write_text("")
    (empty / "database_tuning_record.json").write_text("")
    assert "library is empty" in _transfer_fails(capsys, ["--library", str(empty)], out)
    _record_database(tmp_path / "other", mlp_tasks, [other_target])
    line = _transfer_fails(capsys, ["--library", str(tmp_path / "other")], out)
    assert "not for this run's target" in line
    store = tmp_path / "mlflow.db"
    import mlflow

    mlflow.MlflowClient(f"sqlite:///{store}").search_registered_models()  # creates the store
    line = _transfer_fails(
        capsys, ["--from", "nobody@champion", "--mlflow-uri", f"sqlite:///{store}"], out
    )
    assert "no registered model nobody@champion" in line


def _tune_fails(capsys, argv, out: Path) -> str:
    code = main(["tune", str(EXAMPLES / "small_cnn.py"), "--entry", "tiny_mlp_wide",
                 "--out", str(out), *argv])  # fmt: skip
    err = capsys.readouterr()
    assert code != 0
    lines = [line for line in err.err.strip().splitlines() if line.startswith("gradtune: error:")]
    assert len(lines) == 1, err.err
    assert "RPC" not in err.out and not out.exists(), "refused before anything started"
    return lines[0]


def test_warm_start_refuses_a_library_spec_naming_nothing_in_one_line(
    capsys, mlp_tasks, other_target, tmp_path, monkeypatch
):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "out"
    line = _tune_fails(capsys, ["--warm-start", str(tmp_path / "missing")], out)
    assert "no such run directory" in line
    assert "empty library SPEC" in _tune_fails(capsys, ["--warm-start", " , "], out)
    line = _tune_fails(capsys, ["--warm-start", "registry"], out)
    assert "--mlflow-uri" in line
    store = tmp_path / "mlflow.db"
    import mlflow

    mlflow.MlflowClient(f"sqlite:///{store}").search_registered_models()  # creates the store
    uri = ["--mlflow-uri", f"sqlite:///{store}"]
    line = _tune_fails(capsys, ["--warm-start", "nobody@champion", *uri], out)
    assert "no registered model nobody@champion" in line
    _record_database(tmp_path / "other", mlp_tasks, [other_target])
    line = _tune_fails(capsys, ["--warm-start", str(tmp_path / "other")], out)
    assert "not for this run's target" in line
    assert "--from all needs --warm-start" in _tune_fails(capsys, ["--from", "all"], out)


def test_warm_start_from_an_empty_library_tunes_cold_with_a_one_line_notice(
    capsys, mlp_tasks, llvm_target, tmp_path, monkeypatch
):
    """Nothing tuned yet (a fresh ``runs/``, an empty database, a registry without tuned
    models): the job is accepted and the flow's transfer says so once and measures nothing;
    a transfer, which would have nothing to do, is refused."""
    import mlflow

    from gradtune.pipeline import transfer_from_library
    from gradtune.preflight import checked_job

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    fresh = tmp_path / "runs"
    fresh.mkdir()
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "database_workload.json").write_text("")
    (empty / "database_tuning_record.json").write_text("")
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.MlflowClient(store).search_registered_models()  # a registry holding no model
    settings = dict(model=str(EXAMPLES / "small_cnn.py"), entry="tiny_mlp", mlflow_uri=store)
    for spec in (str(fresh), str(empty), "registry", f"{fresh},{empty}"):
        out = tmp_path / "out"
        job = checked_job(None, **settings, out=str(out), library=spec)
        assert not out.exists()
        capsys.readouterr()
        transfer = transfer_from_library(job, mlp_tasks, llvm_target)
        lines = capsys.readouterr().out.strip().splitlines()
        assert len(lines) == 1 and "library is empty" in lines[0], lines
        assert lines[0].startswith("warm start:") and lines[0].endswith("tuning cold")
        assert transfer.source is None
        assert transfer(None, None, None, 64) == 0  # nothing measured, the search starts cold
        with pytest.raises(GradtuneError, match="library is empty"):
            checked_job(None, **settings, out=str(out), library=spec, transfer_only=True)


# --------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_tune_then_transfer_to_other_shapes_then_warm_start(
    tiny_model, llvm_target, tmp_path, monkeypatch, fleet
):
    """A tiny model tuned briefly is the library; a model of the same kernel classes at other
    shapes is transferred to through the CLI (compiled, verified, registered), then tuned with
    a warm start whose transferred programs the gradient search takes up."""
    from gradtune.search import make_strategy
    from gradtune.search.gradient_search import GradientConfig
    from gradtune.search.scheduler import GradientTaskScheduler
    from gradtune.search.session import Session
    from gradtune.transfer.run import Transfer, select_source
    from gradtune.tune import run_database, tune

    source_dir = tmp_path / "source"
    _, tasks = partition(tiny_model.mod, tiny_model.params, llvm_target)
    source_dir.mkdir()
    write_task_table(source_dir, tasks, asdict(DEFAULT_LOWERING))
    tune(tasks, llvm_target, source_dir, fleet, max_trials=6, search="replay-trace",
         trials_per_round=2)  # fmt: skip

    # Transfer only, as a user runs it.
    out = tmp_path / "transferred"
    model = str(EXAMPLES / "small_cnn.py")
    done = run_cli("transfer", model, "--entry", "tiny_mlp_wide", "--library", str(source_dir),
                   "--out", str(out), "--name", "tt-wide")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Eq. 1 ranking" in done.stdout and f"transferring from {source_dir}" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["search"] == "transfer" and summary["source"] == str(source_dir)
    assert summary["candidates_tried"] >= 1
    assert summary["candidates_applied"] + summary["candidates_adapted"] >= 1
    assert summary["candidates_invalid"] >= summary["candidates_failed"]
    assert summary["transfer_seconds"] > 0
    assert summary["max_abs_err"] < 1e-2 and summary["registered"] == "tt-wide@champion"
    # Every task is either transferred or kept its default schedule; nothing was searched.
    assert sorted(summary["transferred_tasks"] + summary["default_schedule_tasks"]) == sorted(
        summary["best_task_us"]
    )
    # A record per default and per transferred program that ran (every task's default runs).
    records = (out / "database_tuning_record.json").read_text().splitlines()
    did_not_run = summary["candidates_invalid"] - summary["candidates_failed"]
    assert len(records) == summary["tasks"] + summary["candidates_tried"] - did_not_run

    # The registered model is itself a library source: its database comes from the registry.
    listed = run_cli("library", "ls", "--mlflow-uri", summary["mlflow_uri"])
    assert listed.returncode == 0, listed.stderr
    assert summary["candidates_tried"] > did_not_run, "a transferred program ran"
    assert "tt-wide@champion (" in listed.stdout

    # Warm start: transferred programs in the database before the search's first batch.
    wide = partition(*_load("tiny_mlp_wide"), llvm_target)[1]
    library = load_library(str(source_dir))
    source, _ = select_source(wide, library, llvm_target)
    warm = Transfer(wide, llvm_target, source)
    strategy = make_strategy("gradient", config=GradientConfig(seeds=4, steps=4))
    warm_dir = tmp_path / "warm"
    reported = []
    seeds: dict[int, float] = {}  # what the task scheduler is told when the search starts
    real_seed = GradientTaskScheduler._cls.seed  # TVM's derived_object wraps the class

    def seed(self, task_id: int, best_ms: float) -> None:
        seeds[task_id] = best_ms
        real_seed(self, task_id, best_ms)

    monkeypatch.setattr(GradientTaskScheduler._cls, "seed", seed)
    result = tune(wide, llvm_target, warm_dir, fleet, max_trials=8, search=strategy,
                  trials_per_round=2, warm_start=warm, on_round=reported.append,
                  warmup="skip")  # fmt: skip
    # A budget the defaults use up leaves no search, so no warm-up was skipped.
    spent = tune(wide, llvm_target, tmp_path / "spent", fleet, max_trials=len(wide),
                 search=make_strategy("gradient", config=GradientConfig(seeds=4, steps=4)),
                 warm_start=Transfer(wide, llvm_target, source), warmup="skip")  # fmt: skip
    assert spent.trials == len(wide) and spent.warmup_skipped == []
    # Unasked, a warm start's warm-up goes by latency at stake (a cold run's, the model's order).
    again = tune(wide, llvm_target, tmp_path / "spent", fleet, max_trials=len(wide),
                 warm_start=Transfer(wide, llvm_target, source))  # fmt: skip
    assert again.resumed_trials == len(wide) and again.warmup == "stake"
    assert result.trials == 8 and warm.stats.measured >= 1
    assert result.rounds[0].task == "transfer" and result.rounds[0].measured == warm.stats.measured
    assert reported[0] is result.rounds[0], "the transfer is reported as a batch, like the search's"
    # Every task has a measured program (its default's, a transferred one): told to, the task
    # scheduler skips its warm-up and picks by gradient, so the search's first batch goes to
    # the task with the most latency at stake.
    assert result.warmup_skipped == [t.name for t in wide]
    searched = [r.task for r in result.rounds[1:]]
    first = max(seeds, key=lambda i: float(wide[i].weight) * seeds[i])
    assert searched and searched[0] == wide[first].name, (searched, seeds)
    # A fresh gradient search over that database: the transferred programs are its elites
    # (first seeds) and its cost model's first online data.
    database = run_database(warm_dir)
    config = GradientConfig(seeds=4, steps=4, build_at_first_batch=False)  # set up in pre_tuning
    searcher = make_strategy("gradient", config=config)
    searcher.attach(Session())
    _, spaces, _ = _design_space(wide[1], llvm_target)
    searcher._initialize_with_tune_context(_context(wide[1], llvm_target, searcher))
    searcher.pre_tuning(8, 2, spaces, database, None)
    assert searcher.history, "the database's programs seed the search"
    assert searcher.cost_model.data.get(wide[1].name), "and are the cost model's first data"


def _load(entry: str):
    from gradtune.frontend import load_model

    model = load_model(EXAMPLES / "small_cnn.py", entry=entry)
    return model.mod, model.params


def _design_space(task, target):
    from gradtune.symbolic.verify import design_space

    return design_space(task.mod, target, seed=1)


def _context(task, target, strategy):
    from tvm.s_tir import meta_schedule as ms

    return ms.TuneContext(
        mod=task.mod,
        target=target,
        space_generator="post-order-apply",
        search_strategy=strategy,
        task_name=task.name,
    )
