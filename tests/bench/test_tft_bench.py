"""``python -m bench.tft_bench`` at a tiny size: both paths run the same function over the same raw rows and
every figure is reported (the speed itself is measured by ``make bench``, not here)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_transform as tft

from bench import tft_bench


@pytest.mark.slow
def test_the_tf_transform_bench_runs_both_paths_and_reports_every_figure(tmp_path):
    figures = tft_bench.main(
        [
            "--rows=3000",
            "--files=2",
            "--repeats=1",
            "--read-seconds=0.5",
            f"--workdir={tmp_path}",
            f"--json={tmp_path / 'f.json'}",
        ]
    )
    assert json.loads((tmp_path / "f.json").read_text()) == figures
    assert set(figures["job_s"]) == set(figures["read_rows_per_s"]) == {"tfx", "snapfeed"}
    assert figures["job_ratio_snapfeed_over_tfx"] > 0 and figures["read_ratio_snapfeed_over_tfdata"] > 0


@pytest.mark.slow  # 25 s: TFX's whole path beside ours
def test_both_paths_hold_the_same_transformed_rows(tmp_path):
    """TFX's TFRecords and snapfeed's snapshot, from the same raw files and function: the same rows."""
    import reader

    pattern = tft_bench.make_input(tmp_path / "raw", rows=2000, files=2)
    schema = str(tmp_path / "raw" / "schema.pbtxt")
    tft_bench.tfx_job(pattern, schema, tmp_path / "tfx")
    tft_bench.snapfeed_job(pattern, schema, tmp_path / "snapfeed")
    spec = tft.TFTransformOutput(str(tmp_path / "tfx" / "transform")).transformed_feature_spec()
    files = sorted(str(p) for p in (tmp_path / "tfx" / "data").glob("*.tfrecord"))
    tfx_rows = next(iter(tf.data.TFRecordDataset(files).batch(2000).map(lambda r: tf.io.parse_example(r, spec))))
    (snapshot,) = [p for p in (tmp_path / "snapfeed").iterdir() if p.is_dir()]
    ours = next(iter(reader.distributed_dataset(str(snapshot), 2000, shuffle=False)))
    tfx_order, our_order = np.argsort(tfx_rows["id"].numpy()), np.argsort(ours["id"])
    assert set(spec) == set(ours)
    for name in spec:
        # float sums of the analyzers run in another batch order: equal to about 1e-6
        np.testing.assert_allclose(tfx_rows[name].numpy()[tfx_order], ours[name][our_order], atol=1e-5, err_msg=name)
