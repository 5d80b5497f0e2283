"""Beam's DaskRunner with four upstream bugs worked around: what ``--runner=DaskRunner`` runs.

Beam 2.77's Dask evaluator (``apache_beam.runners.dask.transform_evaluator``):

1. drops every output a DoFn emits in ``finish_bundle``: ``apply_dofn_to_bundle``
   takes the partition's results before it calls ``finish_bundle``. Beam's own
   file sinks and snapfeed's shard writer report what they wrote there, so the
   job ran, wrote shards and committed none of them.
2. shares one output list (``OneReceiver``) between all partitions it runs in
   one process, so a threaded Dask scheduler mixes partitions' outputs.
3. puts every ``Create`` into partitions of 128 elements or more, so the few
   input pieces the job creates ran in one partition: one worker, one bundle.
4. computes a side input inside every task that reads it, each time from the
   source (``DaskBagWindowedIterator`` runs ``list(bag)``): the CSV decoder's
   column types re-read every CSV file once per partition of lines.

``_ParDoKeepingEveryOutput`` below runs each partition with its own receivers, collects the
outputs after ``finish_bundle`` and computes its side inputs once, in the driver, as it builds the graph
(they are small: counts, column types, the run); ``_CreateOnePartitionPerElement`` gives each element its own
partition unless ``--dask_npartitions``/``--dask_partition_size`` say
otherwise. Both replace Beam's translations only while this runner builds
its graph. Remove this module when Beam's evaluator is fixed (the Dask engine
tests in tests/beam_jobs/test_engines.py then pass on Beam's own runner).
"""

from __future__ import annotations

import contextlib

from apache_beam.runners.common import DoFnContext, DoFnInvoker, DoFnSignature, _OutputHandler
from apache_beam.runners.dask import dask_runner, transform_evaluator
from apache_beam.runners.dask.overrides import _Create
from apache_beam.transforms.core import DoFn, ParDo
from apache_beam.transforms.sideinputs import SideInputMap

#: The dotted path ``--runner`` names this runner by (``beam_jobs.flags``).
PATH = "beam_jobs.dask_runner.DaskRunner"


def _run_bundle(items, dofn, window_fn, invoker_kwargs: dict) -> list:
    """One Dask partition as one bundle, every output kept, ``finish_bundle``'s included."""
    receivers = transform_evaluator.OneReceiver()
    handler = _OutputHandler(
        window_fn=window_fn,
        main_receivers=receivers[None],
        tagged_receivers=receivers,
        per_element_output_counter=None,
        output_batch_converter=None,
        process_yields_batches=False,
        process_batch_yields_elements=False,
    )
    invoker = DoFnInvoker.create_invoker(DoFnSignature(dofn), handler, **invoker_kwargs)
    invoker.invoke_setup()
    invoker.invoke_start_bundle()
    for item in items:
        invoker.invoke_process(item)
    invoker.invoke_finish_bundle()
    invoker.invoke_teardown()
    return [value.value for value in receivers.values]


def _computed_once(side_inputs):
    """Each side input's values, computed now (once) instead of inside every partition that reads it."""
    return [SideInputMap(s._view_class, s._view_options, list(s._iterable)) for s in side_inputs or ()] or None


class _ParDoKeepingEveryOutput(transform_evaluator.ParDo):
    def apply(self, input_bag, side_inputs=None):
        side_inputs = _computed_once(side_inputs)
        transform = self.transform
        args, kwargs = transform.raw_side_inputs
        main_input = next(iter(self.applied.main_inputs.values()))
        window_fn = main_input.windowing.windowfn if hasattr(main_input, "windowing") else None
        invoker_kwargs = dict(
            context=DoFnContext(transform.label, state=None),
            side_inputs=side_inputs,
            input_args=list(args),
            input_kwargs=kwargs,
            user_state_context=None,
            bundle_finalizer_param=DoFn.BundleFinalizerParam(),
        )
        return input_bag.map(transform_evaluator.get_windowed_value, window_fn).map_partitions(
            _run_bundle, transform.fn, window_fn, invoker_kwargs
        )


class _CreateOnePartitionPerElement(transform_evaluator.Create):
    def apply(self, input_bag, side_inputs=None):
        if not self.bag_kwargs.get("npartitions") and not self.bag_kwargs.get("partition_size"):
            self.bag_kwargs = {**self.bag_kwargs, "partition_size": 1}
        return super().apply(input_bag, side_inputs)


@contextlib.contextmanager
def _fixed_translations():
    table = transform_evaluator.TRANSLATIONS
    saved = dict(table)
    table.update({ParDo: _ParDoKeepingEveryOutput, _Create: _CreateOnePartitionPerElement})
    try:
        yield
    finally:
        table.clear()
        table.update(saved)


class DaskRunner(dask_runner.DaskRunner):
    """Beam's DaskRunner, with ``finish_bundle`` outputs kept and one partition per created element."""

    def run_pipeline(self, pipeline, options):
        with _fixed_translations():
            return super().run_pipeline(pipeline, options)
