"""The job's middle stage: the user's preprocessing, between the inputs and ``WriteSnapshot``.

``batch_fn``: an instance-level function applied to each RecordBatch
(``--preprocessing_fn``).
"""
