"""The device-placement bench runs and checks its steps; here on the CPU (its figures come from a GPU host)."""

from bench import device_placement_bench


def test_the_bench_checks_every_step_and_reports_each_path(tmp_path):
    snapshot = device_placement_bench.write_snapshot(str(tmp_path), rows=3000, row_floats=16)
    figures = device_placement_bench.run(snapshot, "cpu", batch=256)
    assert figures["rows"] == 3000 and figures["device"] == "cpu"
    for path in ("torch_device", "torch_prefetch_to_device_2", "host_torch_then_to", "numpy", "jax_sharding"):
        assert figures[f"{path}_rows_s"] > 0, path
